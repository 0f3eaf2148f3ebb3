//! Counters, histograms and label escaping as the exposition text shows them.

use super::render::labels;
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

/// Issue 12: the counters are found by `&str` (no key allocated per request); they still add up
/// per (route, host, status) and come out in the order of their labels.
#[test]
fn requests_add_up_per_route_host_and_status_in_label_order() {
    let metrics = Metrics::default();
    let row = |route: &str, host: &str, status: u16| RequestRow {
        route: route.into(),
        host: host.into(),
        status,
        completion_tokens: Some(2),
        ..RequestRow::default()
    };
    for (route, host, status, times) in [
        ("projB", "titan", 200, 1),
        ("projA", "titan", 200, 3),
        ("projA", "titan", 503, 1),
        ("projA", "mini", 200, 2),
    ] {
        for _ in 0..times {
            metrics.observe_request(&row(route, host, status));
            metrics.observe_queue_wait(route, host, 0);
        }
    }
    let text = metrics.render(&Gauges::default());
    let counted: Vec<&str> = (text.lines())
        .filter(|l| {
            l.starts_with("crossbar_requests_total{")
                || l.starts_with("crossbar_completion_tokens_total{")
                || l.starts_with("crossbar_queue_wait_seconds_count{")
        })
        .collect();
    assert_eq!(
        counted,
        [
            r#"crossbar_requests_total{route="projA",host="mini",status="200"} 2"#,
            r#"crossbar_requests_total{route="projA",host="titan",status="200"} 3"#,
            r#"crossbar_requests_total{route="projA",host="titan",status="503"} 1"#,
            r#"crossbar_requests_total{route="projB",host="titan",status="200"} 1"#,
            r#"crossbar_completion_tokens_total{route="projA",host="mini"} 4"#,
            r#"crossbar_completion_tokens_total{route="projA",host="titan"} 8"#,
            r#"crossbar_completion_tokens_total{route="projB",host="titan"} 2"#,
            r#"crossbar_queue_wait_seconds_count{route="projA",host="mini"} 2"#,
            r#"crossbar_queue_wait_seconds_count{route="projA",host="titan"} 4"#,
            r#"crossbar_queue_wait_seconds_count{route="projB",host="titan"} 1"#,
        ]
    );
}
