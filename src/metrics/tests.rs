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
