//! The Prometheus text exposition of [`Metrics`]: the counters and histograms kept since start,
//! then the gauges the caller read from live state (`Gauges`), each with its `# HELP` and `# TYPE`
//! lines and labels escaped as the format requires. It only formats: no I/O, and the counters' lock
//! is dropped before the gauges are written.

use std::fmt::Write;

use super::{Gauges, Metrics};

impl Metrics {
    /// The exposition text.
    pub fn render(&self, gauges: &Gauges) -> String {
        let inner = self.inner.lock();
        let mut out = String::with_capacity(4096);
        header(
            &mut out,
            "crossbar_requests_total",
            "counter",
            "Requests answered, by route, host and status.",
        );
        for (route, host, statuses) in inner.requests.iter() {
            for (status, n) in statuses {
                let labels = labels(&[
                    ("route", route),
                    ("host", host),
                    ("status", &status.to_string()),
                ]);
                let _ = writeln!(out, "crossbar_requests_total{labels} {n}");
            }
        }
        for (name, help, pick) in [
            (
                "crossbar_prompt_tokens_total",
                "Prompt tokens, by route and host.",
                0,
            ),
            (
                "crossbar_cached_tokens_total",
                "Prompt tokens served from the host's cache.",
                1,
            ),
            (
                "crossbar_completion_tokens_total",
                "Generated tokens, by route and host.",
                2,
            ),
        ] {
            header(&mut out, name, "counter", help);
            for (route, host, t) in inner.tokens.iter() {
                let n = [t.prompt, t.cached, t.completion][pick];
                let _ = writeln!(
                    out,
                    "{name}{} {n}",
                    labels(&[("route", route), ("host", host)])
                );
            }
        }
        let name = "crossbar_request_duration_seconds";
        header(
            &mut out,
            name,
            "histogram",
            "Time from request to the end of the answer.",
        );
        for (route, hist) in &inner.durations {
            hist.render(&mut out, name, inner_labels(&[("route", route)]).as_str());
        }
        for (name, help, map) in [
            (
                "crossbar_ttfb_seconds",
                "Time from request to the upstream's response head (queue wait and prefill included), by route and host.",
                &inner.ttfb,
            ),
            (
                "crossbar_queue_wait_seconds",
                "Time a request waited for a slot, by route and host.",
                &inner.queue_wait,
            ),
        ] {
            header(&mut out, name, "histogram", help);
            for (route, host, hist) in map.iter() {
                let labels = inner_labels(&[("route", route), ("host", host)]);
                hist.render(&mut out, name, &labels);
            }
        }
        header(
            &mut out,
            "crossbar_lease_events_total",
            "counter",
            "Lease events, by reason.",
        );
        for (reason, n) in &inner.lease_events {
            let _ = writeln!(
                out,
                "crossbar_lease_events_total{} {n}",
                labels(&[("reason", reason)])
            );
        }
        for (name, help, pick) in [
            (
                "crossbar_key_requests_total",
                "Requests per client key (its configured name).",
                0,
            ),
            (
                "crossbar_key_tokens_total",
                "Prompt plus completion tokens per client key (its configured name).",
                1,
            ),
        ] {
            header(&mut out, name, "counter", help);
            for (key, counts) in &inner.keys {
                let n = [counts.0, counts.1][pick];
                let _ = writeln!(out, "{name}{} {n}", labels(&[("key", key)]));
            }
        }
        header(
            &mut out,
            "crossbar_placements_total",
            "counter",
            "Where requests were placed and why (sticky, family, inherit, least-loaded, ctx, busy, unhealthy, pinned), by route and host.",
        );
        for (route, host, reasons) in inner.placements.iter() {
            for (reason, n) in reasons {
                let labels = labels(&[("route", route), ("host", host), ("reason", reason)]);
                let _ = writeln!(out, "crossbar_placements_total{labels} {n}");
            }
        }
        header(
            &mut out,
            "crossbar_forward_failures_total",
            "counter",
            "Forwards that failed, against the host (connect: refused or timed out; reached: it may have acted on it) or the client (request: it could not be sent as asked).",
        );
        for ((against, kind), n) in &inner.forward_failures {
            let labels = labels(&[("against", against), ("kind", kind)]);
            let _ = writeln!(out, "crossbar_forward_failures_total{labels} {n}");
        }
        header(
            &mut out,
            "crossbar_slot_pins_total",
            "counter",
            "Requests to an exclusive host sent with a slot crossbar chose (pinned=yes) or left to the host (a slot in doubt, none free, a request crossbar could not pin).",
        );
        for (host, counts) in &inner.slot_pins {
            let name = "crossbar_slot_pins_total";
            yes_no(
                &mut out,
                name,
                (host, "pinned"),
                [counts.pinned, counts.unpinned],
            );
        }
        header(
            &mut out,
            "crossbar_slot_saves_total",
            "counter",
            "Sibling's slots an exclusive host was asked to save to its RAM cache before a returning conversation was pinned there, so that it reloads its own state (saved=no: the save failed and the request went unpinned).",
        );
        for (host, counts) in &inner.slot_pins {
            let name = "crossbar_slot_saves_total";
            yes_no(
                &mut out,
                name,
                (host, "saved"),
                [counts.saved, counts.save_failed],
            );
        }
        header(
            &mut out,
            "crossbar_slot_stashes_total",
            "counter",
            "Short requests sent before a request to a host that picks slots by age, so that it copies its idle slots to its RAM cache first (stashed=no: it failed and the request went on without it).",
        );
        for (host, counts) in &inner.slot_pins {
            let name = "crossbar_slot_stashes_total";
            yes_no(
                &mut out,
                name,
                (host, "stashed"),
                [counts.stashed, counts.stash_failed],
            );
        }
        header(
            &mut out,
            "crossbar_slot_stash_tokens_total",
            "counter",
            "Prompt tokens hosts prefilled for stashes.",
        );
        for (host, counts) in &inner.slot_pins {
            let labels = labels(&[("host", host)]);
            let n = counts.stash_tokens;
            let _ = writeln!(out, "crossbar_slot_stash_tokens_total{labels} {n}");
        }
        header(
            &mut out,
            "crossbar_slot_settle_waits_total",
            "counter",
            "Requests crossbar could not pin held until the pinned ones sent before them to the same host had started (settled=yes), or sent at the wait's bound (settled=no).",
        );
        for (host, counts) in &inner.slot_pins {
            let name = "crossbar_slot_settle_waits_total";
            yes_no(
                &mut out,
                name,
                (host, "settled"),
                [counts.settled, counts.timed_out],
            );
        }
        header(
            &mut out,
            "crossbar_slot_settle_wait_seconds_total",
            "counter",
            "Time requests crossbar could not pin spent held for pinned ones to start.",
        );
        for (host, counts) in &inner.slot_pins {
            let labels = labels(&[("host", host)]);
            let seconds = counts.waited_us as f64 / 1e6;
            let _ = writeln!(
                out,
                "crossbar_slot_settle_wait_seconds_total{labels} {seconds}"
            );
        }
        header(
            &mut out,
            "crossbar_host_transitions_total",
            "counter",
            "Hosts going down or up, by why (a down reason's kind, request failures, polls).",
        );
        for ((host, to, why), n) in &gauges.transitions {
            let labels = labels(&[("host", host), ("to", to), ("why", why)]);
            let _ = writeln!(out, "crossbar_host_transitions_total{labels} {n}");
        }
        header(
            &mut out,
            "crossbar_store_rows_lost_total",
            "counter",
            "Accounting rows the store could not write.",
        );
        let _ = writeln!(out, "crossbar_store_rows_lost_total {}", inner.rows_lost);
        header(
            &mut out,
            "crossbar_refused_total",
            "counter",
            "Connections answered before their request was routed (no accounting row), by listener and reason.",
        );
        for ((listener, reason), n) in &inner.refused {
            let _ = writeln!(
                out,
                "crossbar_refused_total{} {n}",
                labels(&[("listener", listener), ("reason", reason)])
            );
        }
        header(
            &mut out,
            "crossbar_api_requests_total",
            "counter",
            "Requests answered, by the API they spoke.",
        );
        for (api, t) in &inner.apis {
            let _ = writeln!(
                out,
                "crossbar_api_requests_total{} {}",
                labels(&[("api", api)]),
                t.requests
            );
        }
        let name = "crossbar_api_tokens_total";
        let help = "Tokens by API and kind: prompt (cached included), cached, completion.";
        header(&mut out, name, "counter", help);
        for (api, t) in &inner.apis {
            for (kind, n) in [
                ("prompt", t.prompt),
                ("cached", t.cached),
                ("completion", t.completion),
            ] {
                let _ = writeln!(out, "{name}{} {n}", labels(&[("api", api), ("kind", kind)]));
            }
        }
        let name = "crossbar_config_reloads_total";
        header(
            &mut out,
            name,
            "counter",
            "Config reloads (SIGHUP) since start, applied or refused.",
        );
        for (result, n) in [
            ("applied", inner.reloads.applied),
            ("refused", inner.reloads.refused),
        ] {
            let _ = writeln!(out, "{name}{} {n}", labels(&[("result", result)]));
        }
        if let Some(last) = &inner.reloads.last {
            header(
                &mut out,
                "crossbar_config_last_reload_successful",
                "gauge",
                "1 when the last reload was applied; 0 when it was refused and the old config serves.",
            );
            let ok = u8::from(last.applied);
            let _ = writeln!(out, "crossbar_config_last_reload_successful {ok}");
            let name = "crossbar_config_last_reload_timestamp_seconds";
            header(
                &mut out,
                name,
                "gauge",
                "When the last reload was (unix seconds).",
            );
            let _ = writeln!(out, "{name} {:.3}", last.at as f64 / 1000.0);
        }
        drop(inner);
        header(
            &mut out,
            "crossbar_store_up",
            "gauge",
            "1 when the store's last commit succeeded; 0 while writes fail (disk full, read-only).",
        );
        let _ = writeln!(out, "crossbar_store_up {}", u8::from(gauges.store_ok));
        header(
            &mut out,
            "crossbar_store_write_errors_total",
            "counter",
            "Failed store commits since start.",
        );
        let _ = writeln!(
            out,
            "crossbar_store_write_errors_total {}",
            gauges.store_write_errors
        );
        header(
            &mut out,
            "crossbar_host_up",
            "gauge",
            "1 when the host is healthy.",
        );
        for (host, up) in &gauges.hosts {
            let _ = writeln!(
                out,
                "crossbar_host_up{} {}",
                labels(&[("host", host)]),
                u8::from(*up)
            );
        }
        header(
            &mut out,
            "crossbar_in_flight",
            "gauge",
            "Requests holding a slot, by host and model.",
        );
        for (host, model, in_flight, _) in &gauges.slots {
            let _ = writeln!(
                out,
                "crossbar_in_flight{} {in_flight}",
                labels(&[("host", host), ("model", model)])
            );
        }
        header(
            &mut out,
            "crossbar_queued",
            "gauge",
            "Requests waiting for a slot, by host and model.",
        );
        for (host, model, _, queued) in &gauges.slots {
            let _ = writeln!(
                out,
                "crossbar_queued{} {queued}",
                labels(&[("host", host), ("model", model)])
            );
        }
        header(
            &mut out,
            "crossbar_queued_body_bytes",
            "gauge",
            "Bytes of the bodies of requests waiting for a slot, all queues together.",
        );
        let _ = writeln!(
            out,
            "crossbar_queued_body_bytes {}",
            gauges.queued_body_bytes
        );
        header(
            &mut out,
            "crossbar_leases",
            "gauge",
            "Conversation leases, by host.",
        );
        for (host, n) in &gauges.leases {
            let _ = writeln!(out, "crossbar_leases{} {n}", labels(&[("host", host)]));
        }
        out
    }
}

/// A host's counter split by a yes/no label: `counts` is [yes, no].
fn yes_no(out: &mut String, name: &str, (host, label): (&str, &str), counts: [u64; 2]) {
    for (value, n) in ["yes", "no"].into_iter().zip(counts) {
        let labels = labels(&[("host", host), (label, value)]);
        let _ = writeln!(out, "{name}{labels} {n}");
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// `a="x",b="y"`: [`labels`] without the braces.
fn inner_labels(pairs: &[(&str, &str)]) -> String {
    let all = labels(pairs);
    all[1..all.len() - 1].to_string()
}

/// `{a="x",b="y"}` with values escaped as the format requires.
pub(super) fn labels(pairs: &[(&str, &str)]) -> String {
    let mut out = String::from("{");
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let escaped = v
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n");
        let _ = write!(out, "{k}=\"{escaped}\"");
    }
    out.push('}');
    out
}
