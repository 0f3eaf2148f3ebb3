//! Prometheus metrics: counters fed by the request path and the lease table, gauges read from live
//! state at scrape time, rendered in the text exposition format. No I/O here.

use std::collections::BTreeMap;
use std::fmt::Write;

use parking_lot::Mutex;

use crate::store::RequestRow;

/// Upper bounds (seconds) of the request-duration histogram buckets.
const BUCKETS: &[f64] = &[
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

/// Counters since start. Gauges are not kept here: they are read from live state when rendered.
#[derive(Debug, Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

/// Invariant: every histogram's `counts` has one entry per bucket in `BUCKETS` (cumulative at render).
#[derive(Debug, Default)]
struct Inner {
    requests: BTreeMap<(String, String, u16), u64>,
    tokens: BTreeMap<(String, String), Tokens>,
    durations: BTreeMap<String, Histogram>,
    lease_events: BTreeMap<String, u64>,
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

#[derive(Debug, Default)]
struct Histogram {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
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
        let hist = inner.durations.entry(route.to_string()).or_default();
        if hist.counts.is_empty() {
            hist.counts = vec![0; BUCKETS.len()];
        }
        let secs = row.total_ms.max(0) as f64 / 1000.0;
        if let Some(i) = BUCKETS.iter().position(|b| secs <= *b) {
            hist.counts[i] += 1;
        }
        hist.sum += secs;
        hist.count += 1;
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
            let mut cumulative = 0;
            for (bound, count) in BUCKETS.iter().zip(&hist.counts) {
                cumulative += count;
                let le = bound.to_string();
                let _ = writeln!(
                    out,
                    "{name}_bucket{} {cumulative}",
                    labels(&[("route", route), ("le", &le)])
                );
            }
            let _ = writeln!(
                out,
                "{name}_bucket{} {}",
                labels(&[("route", route), ("le", "+Inf")]),
                hist.count
            );
            let _ = writeln!(
                out,
                "{name}_sum{} {}",
                labels(&[("route", route)]),
                hist.sum
            );
            let _ = writeln!(
                out,
                "{name}_count{} {}",
                labels(&[("route", route)]),
                hist.count
            );
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
mod tests {
    use super::*;

    #[test]
    fn a_request_counts_everywhere_once() {
        let metrics = Metrics::default();
        let row = RequestRow {
            route: "projA".into(),
            host: "titan".into(),
            status: 200,
            total_ms: 700,
            prompt_tokens: Some(100),
            cached_tokens: Some(90),
            completion_tokens: Some(5),
            ..RequestRow::default()
        };
        metrics.observe_request(&row);
        metrics.observe_lease_event("new");
        let text = metrics.render(&Gauges::default());
        for line in [
            "crossbar_requests_total{route=\"projA\",host=\"titan\",status=\"200\"} 1",
            "crossbar_cached_tokens_total{route=\"projA\",host=\"titan\"} 90",
            "crossbar_request_duration_seconds_bucket{route=\"projA\",le=\"0.5\"} 0",
            "crossbar_request_duration_seconds_bucket{route=\"projA\",le=\"1\"} 1",
            "crossbar_request_duration_seconds_bucket{route=\"projA\",le=\"+Inf\"} 1",
            "crossbar_request_duration_seconds_count{route=\"projA\"} 1",
            "crossbar_lease_events_total{reason=\"new\"} 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }

    /// Review finding: upstream-reported counts were added unchecked (a panic in debug builds).
    #[test]
    fn huge_upstream_token_counts_saturate() {
        let metrics = Metrics::default();
        let row = RequestRow {
            route: "projA".into(),
            host: "titan".into(),
            status: 200,
            prompt_tokens: Some(i64::MAX),
            cached_tokens: Some(i64::MAX),
            completion_tokens: Some(i64::MAX),
            ..RequestRow::default()
        };
        for _ in 0..3 {
            metrics.observe_request(&row);
        }
        let text = metrics.render(&Gauges::default());
        let line = format!(
            "crossbar_prompt_tokens_total{{route=\"projA\",host=\"titan\"}} {}",
            u64::MAX
        );
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(labels(&[("a", "x\"y\\z\n")]), "{a=\"x\\\"y\\\\z\\n\"}");
    }
}
