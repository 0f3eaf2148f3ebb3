//! Prometheus metrics: counters and histograms fed by the request path and the lease table, gauges
//! read from live state at scrape time, rendered in the text exposition format; and the last hour
//! per host for the status page (`recent`). No I/O here.

mod histogram;
pub mod recent;

use std::collections::BTreeMap;
use std::fmt::Write;

use parking_lot::Mutex;

use crate::store::RequestRow;
use histogram::Histogram;
pub use recent::HourView;

/// Upper bounds (seconds) of the request-duration and time-to-first-byte histogram buckets.
const BUCKETS: &[f64] = &[
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];
/// Upper bounds (seconds) of the queue-wait histogram buckets: most waits are none at all.
const WAIT_BUCKETS: &[f64] = &[
    0.001, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0,
];

/// Counters since start. Gauges are not kept here: they are read from live state when rendered.
#[derive(Debug, Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

/// Keys are configured route and host names (or `-`), never client text: the request path
/// refuses unknown routes and models before anything is observed, so every map stays small.
#[derive(Debug, Default)]
struct Inner {
    requests: BTreeMap<(String, String, u16), u64>,
    tokens: BTreeMap<(String, String), Tokens>,
    durations: BTreeMap<String, Histogram>,
    /// Request start to the upstream's response head, by (route, host).
    ttfb: BTreeMap<(String, String), Histogram>,
    /// Time waiting for a slot, by (route, host).
    queue_wait: BTreeMap<(String, String), Histogram>,
    lease_events: BTreeMap<String, u64>,
    /// Accounting rows the store could not write.
    rows_lost: u64,
    /// (listener, reason) → connections answered before a request was routed (no accounting row).
    refused: BTreeMap<(&'static str, &'static str), u64>,
    /// The last hour, per host.
    recent: BTreeMap<String, recent::Window>,
    /// Per API (`crate::api::Api::name`, `-` before the API is known): requests and tokens.
    apis: BTreeMap<String, ApiTotals>,
}

/// One API's requests and tokens since start (prompt includes cached, in every API).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ApiTotals {
    pub requests: u64,
    pub prompt: u64,
    pub cached: u64,
    pub completion: u64,
}

#[derive(Debug, Default, Clone, Copy)]
struct Tokens {
    prompt: u64,
    cached: u64,
    completion: u64,
}

/// Live values the renderer needs besides the counters.
#[derive(Debug, Default)]
pub struct Gauges {
    /// (host, up)
    pub hosts: Vec<(String, bool)>,
    /// (host, model, in_flight, queued)
    pub slots: Vec<(String, String, usize, usize)>,
    /// (host, leases)
    pub leases: Vec<(String, usize)>,
    /// Whether the store's last commit succeeded, and its failed commits since start.
    pub store_ok: bool,
    pub store_write_errors: u64,
}

impl Metrics {
    pub fn observe_request(&self, row: &RequestRow) {
        let mut inner = self.inner.lock();
        let host = if row.host.is_empty() { "-" } else { &row.host };
        let route = if row.route.is_empty() {
            "-"
        } else {
            &row.route
        };
        *inner
            .requests
            .entry((route.to_string(), host.to_string(), row.status))
            .or_default() += 1;
        let tokens = inner
            .tokens
            .entry((route.to_string(), host.to_string()))
            .or_default();
        // Upstream numbers: any size may arrive, and a counter must not panic on them.
        let add = |total: &mut u64, n: Option<i64>| {
            *total = total.saturating_add(n.unwrap_or(0).max(0) as u64);
        };
        add(&mut tokens.prompt, row.prompt_tokens);
        add(&mut tokens.cached, row.cached_tokens);
        add(&mut tokens.completion, row.completion_tokens);
        let api = if row.api.is_empty() { "-" } else { &row.api };
        let totals = inner.apis.entry(api.to_string()).or_default();
        totals.requests += 1;
        add(&mut totals.prompt, row.prompt_tokens);
        add(&mut totals.cached, row.cached_tokens);
        add(&mut totals.completion, row.completion_tokens);
        inner
            .durations
            .entry(route.to_string())
            .or_insert_with(|| Histogram::new(BUCKETS))
            .observe(row.total_ms.max(0) as f64 / 1000.0);
        if !row.host.is_empty() {
            let positive = |n: Option<i64>| n.unwrap_or(0).max(0) as u64;
            inner.recent.entry(row.host.clone()).or_default().request(
                row.started,
                positive(row.prompt_tokens),
                positive(row.cached_tokens),
            );
        }
    }

    /// The upstream's response head arrived `ms` after the request (started at `started`, unix
    /// ms) reached crossbar.
    pub fn observe_ttfb(&self, route: &str, host: &str, started: i64, ms: i64) {
        let mut inner = self.inner.lock();
        inner
            .ttfb
            .entry((route.to_string(), host.to_string()))
            .or_insert_with(|| Histogram::new(BUCKETS))
            .observe(ms.max(0) as f64 / 1000.0);
        inner
            .recent
            .entry(host.to_string())
            .or_default()
            .ttfb(started, ms.max(0) as f64);
    }

    /// A request waited `ms` for a slot on `host` (0 when one was free).
    pub fn observe_queue_wait(&self, route: &str, host: &str, ms: i64) {
        self.inner
            .lock()
            .queue_wait
            .entry((route.to_string(), host.to_string()))
            .or_insert_with(|| Histogram::new(WAIT_BUCKETS))
            .observe(ms.max(0) as f64 / 1000.0);
    }

    /// llama-server's `timings` said it prefilled `tokens` in `us` microseconds on `host`.
    pub fn observe_prefill(&self, host: &str, tokens: u64, us: u64) {
        self.inner
            .lock()
            .recent
            .entry(host.to_string())
            .or_default()
            .prefill(tokens, us);
    }

    /// The last hour of `host` up to `now` (unix ms); empty when it served nothing yet.
    pub fn hour(&self, host: &str, now: i64) -> HourView {
        let inner = self.inner.lock();
        inner
            .recent
            .get(host)
            .map_or_else(|| recent::Window::default().hour(now), |w| w.hour(now))
    }

    /// A connection refused by the connection layer before any handler saw a request (busy, a
    /// head too large, bad framing, a head timeout). Both labels are crossbar's own constants.
    pub fn observe_refused(&self, listener: &'static str, reason: &'static str) {
        *self
            .inner
            .lock()
            .refused
            .entry((listener, reason))
            .or_default() += 1;
    }

    /// Requests and tokens per API since start, by API name.
    pub fn api_totals(&self) -> Vec<(String, ApiTotals)> {
        let inner = self.inner.lock();
        inner.apis.iter().map(|(a, t)| (a.clone(), *t)).collect()
    }

    pub fn observe_lease_event(&self, reason: &str) {
        *self
            .inner
            .lock()
            .lease_events
            .entry(reason.to_string())
            .or_default() += 1;
    }

    pub fn observe_row_lost(&self) {
        self.inner.lock().rows_lost += 1;
    }

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
        for ((route, host, status), n) in &inner.requests {
            let labels = labels(&[
                ("route", route),
                ("host", host),
                ("status", &status.to_string()),
            ]);
            let _ = writeln!(out, "crossbar_requests_total{labels} {n}");
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
            for ((route, host), t) in &inner.tokens {
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
            for ((route, host), hist) in map {
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
fn labels(pairs: &[(&str, &str)]) -> String {
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

#[cfg(test)]
mod tests;
