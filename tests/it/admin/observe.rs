//! What the operator reads rather than changes: `/metrics` checked by a real Prometheus parser,
//! the self-contained status page with its prefill-saved headline and last-hour charts, and the
//! token-free `/livez` / `/readyz` probes.

use serde_json::{json, Value};

use super::{admin, get, post, turn};
use crate::support::{chat, host, wait_until, Harness};

#[test]
fn metrics_parse_as_prometheus_text_with_every_family() {
    let h = Harness::start(vec![host("titan", 1), host("mini", 1)], "");
    turn(&h, "count me", 0);
    turn(&h, "count me", 1);
    assert_eq!(
        h.post("/nope/v1/chat/completions", &chat("x", 0, false))
            .status,
        404
    );
    // Refused before it had a route, it is counted apart, with no row (issue 46).
    let refused = r#"crossbar_refused_total{listener="clients",reason="unknown_route"} 1"#;
    wait_until("the requests are counted", || {
        let text = get(&h, "/metrics").text();
        text.contains("crossbar_requests_total{") && text.contains(refused)
    });
    let answer = get(&h, "/metrics");
    assert_eq!(answer.status, 200);
    assert!(answer
        .header("Content-Type")
        .unwrap_or("")
        .starts_with("text/plain; version=0.0.4"));
    let text = answer.text();
    let lines = text.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("valid exposition text");

    let family = |name: &str, labels: &[&str]| {
        assert!(scrape.docs.contains_key(name), "no HELP for {name}\n{text}");
        let samples: Vec<_> = scrape.samples.iter().filter(|s| s.metric == name).collect();
        assert!(!samples.is_empty(), "no samples of {name}\n{text}");
        for s in &samples {
            for label in labels {
                assert!(s.labels.get(label).is_some(), "{name} lacks {label}: {s:?}");
            }
        }
        samples
    };
    use prometheus_parse::Value as V;
    let ok = family("crossbar_requests_total", &["route", "host", "status"]);
    let titan_ok = ok
        .iter()
        .find(|s| s.labels.get("host") == Some("titan") && s.labels.get("status") == Some("200"))
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(titan_ok.value, V::Counter(2.0));
    for name in ["prompt", "cached", "completion"] {
        family(&format!("crossbar_{name}_tokens_total"), &["route", "host"]);
    }
    let durations = family("crossbar_request_duration_seconds", &["route"]);
    assert!(
        durations.iter().any(|s| matches!(&s.value, V::Histogram(b)
        if b.iter().any(|b| b.less_than.is_infinite() && b.count == 2.0))),
        "{text}"
    );
    // Issue 13: the two latencies LLM users watch, per route and host.
    for name in ["crossbar_ttfb_seconds", "crossbar_queue_wait_seconds"] {
        let samples = family(name, &["route", "host"]);
        let titan = samples
            .iter()
            .find(|s| s.labels.get("host") == Some("titan"))
            .unwrap_or_else(|| panic!("no titan {name}\n{text}"));
        assert!(
            matches!(&titan.value, V::Histogram(b)
                if b.iter().any(|b| b.less_than.is_infinite() && b.count == 2.0)),
            "{name}: {titan:?}"
        );
        assert!(
            text.contains(&format!("{name}_count{{route=\"projA\",host=\"titan\"}} 2")),
            "{text}"
        );
        assert!(text.contains(&format!("{name}_sum{{route=\"projA\",host=\"titan\"}} ")));
    }
    for name in ["crossbar_in_flight", "crossbar_queued"] {
        let samples = family(name, &["host", "model"]);
        assert!(samples.iter().all(|s| matches!(s.value, V::Gauge(_))));
    }
    let up = family("crossbar_host_up", &["host"]);
    assert_eq!(up.len(), 2);
    let leases = family("crossbar_leases", &["host"]);
    let titan = leases
        .iter()
        .find(|s| s.labels.get("host") == Some("titan"))
        .unwrap();
    assert_eq!(titan.value, V::Gauge(1.0));
    family("crossbar_refused_total", &["listener", "reason"]);
    let events = family("crossbar_lease_events_total", &["reason"]);
    assert!(events.iter().any(|s| s.labels.get("reason") == Some("new")));
}

#[test]
fn the_status_page_is_one_self_contained_page_that_refreshes() {
    let h = Harness::start(vec![host("titan", 1), host("mini", 1)], "");
    turn(&h, "page story", 0);
    turn(&h, "page story", 1);
    assert_eq!(
        post(&h, "/admin/pin", json!({"route": "projA", "host": "mini"})).status,
        200
    );
    turn(&h, "pinned story", 0);
    wait_until("three rows", || h.rows().len() >= 3);
    let rows = h.rows();
    let cached = rows.iter().find_map(|r| r.cached_tokens.filter(|c| *c > 0));
    let answer = get(&h, "/");
    assert_eq!(answer.status, 200);
    assert!(answer
        .header("Content-Type")
        .unwrap_or("")
        .starts_with("text/html"));
    let page = answer.text();
    for external in ["src=", "href=", "@import", "url("] {
        assert!(!page.contains(external), "page loads something: {external}");
    }
    assert!(page.contains("http-equiv=refresh"), "{page}");
    for shown in [
        "titan",
        "mini",
        "projA",
        "pinned to",
        "Leases",
        "Recent requests",
        "cached share",
    ] {
        assert!(page.contains(shown), "page lacks {shown:?}");
    }
    let cached = cached.expect("the second turn hit the cache");
    assert!(
        page.contains(&format!("<td class=n>{cached}</td>")),
        "{page}"
    );
    assert!(page.contains('%'), "a cached share is shown");
}

/// Issue 13: the gateway's own liveness and readiness, without the token, for systemd and
/// uptime checks; readiness follows the hosts.
#[test]
fn liveness_and_readiness_answer_without_the_token() {
    let h = Harness::start(
        vec![host("titan", 1)],
        "admin_token = \"s3cret\"\nhealth_interval = \"1h\"",
    );
    assert_eq!(get(&h, "/admin/status").status, 401);
    let live = get(&h, "/livez");
    assert_eq!(live.status, 200, "{}", live.text());
    assert_eq!(live.json()["status"], "live");
    let ready = get(&h, "/readyz");
    assert_eq!(ready.status, 200, "{}", ready.text());
    assert_eq!(
        ready.json(),
        json!({ "status": "ready", "hosts_up": 1, "hosts": 1 })
    );
    let gw = h.server().gateway();
    let reason = crossbar::health::DownReason::ForwardFailed {
        path: "/v1/chat/completions".into(),
        error: "Network Error: reset".into(),
    };
    gw.health.mark_down("titan", reason, 1);
    let ready = get(&h, "/readyz");
    assert_eq!(ready.status, 503, "{}", ready.text());
    assert_eq!(ready.json()["status"], "not ready");
    assert_eq!(get(&h, "/health/live").status, 200);
    // Only reads are open: anything else still needs the token.
    assert_eq!(admin(&h, "POST", "/livez", &[], &Value::Null).status, 401);
}

/// Issue 13: the status page leads with the prefill saved (tokens, and minutes at the host's
/// prefill rate measured from `timings`) and draws the last hour per host as inline SVG.
#[test]
fn the_status_page_shows_prefill_saved_and_charts_of_the_last_hour() {
    let mut titan = host("titan", 1);
    titan.sim.prefill_us_per_token = 200; // 5000 tokens/s
    let h = Harness::start(vec![titan], "");
    for turns in 0..3 {
        turn(
            &h,
            "a conversation long enough to measure the host's prefill rate by",
            turns,
        );
    }
    wait_until("three rows", || h.rows().len() >= 3);
    let cached: i64 = h.rows().iter().filter_map(|r| r.cached_tokens).sum();
    assert!(cached > 0, "later turns hit the cache");
    let page = get(&h, "/").text();
    let headline = format!("served from cache: <b>{cached} prompt tokens</b>");
    let headline = if cached >= 1000 {
        headline.replace(
            &cached.to_string(),
            &format!("{},{:03}", cached / 1000, cached % 1000),
        )
    } else {
        headline
    };
    assert!(page.contains(&headline), "no {headline:?} in\n{page}");
    let seconds = cached as f64 / 5000.0;
    assert!(
        page.contains(&format!("≈ <b>{seconds:.1} seconds</b>")),
        "{seconds:.1} seconds at 5000 tokens/s\n{page}"
    );
    assert!(page.contains("prefill 5000 tokens/s"), "{page}");
    assert_eq!(
        page.matches("<svg").count(),
        3,
        "requests, cached share, TTFB"
    );
    for chart in ["requests / min", "cached share", "TTFB", "p50", "p95"] {
        assert!(page.contains(chart), "no {chart:?}");
    }
    assert!(
        page.matches("<rect").count() > 3,
        "three chart frames and a bar for this minute's requests"
    );
    assert!(!page.contains("<script"), "no script");
}

/// Issue 27: before any prefill was measured, the status page (and `crossbar status`, which reads
/// the admin JSON) said "prefill saved: 0 tokens (≈ -0.0 seconds)".
#[test]
fn issue27_a_fresh_gateway_saved_zero_seconds_not_minus_zero() {
    let h = Harness::start(vec![host("titan", 1)], "");
    let page = get(&h, "/").text();
    assert!(page.contains("(≈ <b>0.0 seconds</b>"), "{page}");
    assert!(!page.contains("-0.0"), "{page}");
    let status = get(&h, "/admin/status").json();
    assert_eq!(status["served_from_cache"]["seconds"].to_string(), "0.0");
}
