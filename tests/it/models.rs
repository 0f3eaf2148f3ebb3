//! Requests for models the config does not list: refused before any state is kept for them.

use crate::support::{chat, host, request, Harness};

const CHAT: &str = "/projA/v1/chat/completions";

/// What a client can make crossbar remember: limiter slots, leases (and pins), stored lease rows,
/// and the `/metrics` lines.
fn footprint(h: &Harness) -> (usize, usize, usize, usize) {
    let gw = h.server().gateway();
    let metrics = request(h.server().admin_addr(), "GET", "/metrics", &[], &[]).text();
    (
        gw.limiter.snapshot().len(),
        gw.leases.snapshot().len() + gw.leases.pins().len(),
        h.db().list_leases().unwrap().len(),
        metrics.lines().count(),
    )
}

/// Review finding: a pin returned its host without checking the model, so every made-up model
/// name got a limiter slot, a lease row and metric series, forever.
#[test]
fn cycling_model_names_on_a_pinned_route_keeps_nothing_and_answers_model_not_found() {
    let h = Harness::start(vec![host("titan", 1), host("mini", 1)], "");
    let gw = h.server().gateway().clone();
    gw.leases.pin("projA", "mini", 0).unwrap();
    // A good request and a refused one first, so the per-route series they add exist already.
    assert_eq!(h.post(CHAT, &chat("hello", 0, false)).status, 200);
    let mut body = chat("hello", 0, false);
    body["model"] = "made-up".into();
    assert_eq!(h.post(CHAT, &body).status, 404);
    let before = footprint(&h);
    let chats_before = h.sim("mini").requests().len();

    for i in 0..50 {
        let mut body = chat("hello", 0, false);
        body["model"] = format!("made-up-{i}").into();
        let answer = h.post(CHAT, &body);
        // Issue 13 (spec §2): 404 naming the model and what the route serves, not a 503.
        assert_eq!(answer.status, 404, "{}", answer.text());
        let json = answer.error();
        assert_eq!(json["code"], "model_not_found");
        assert_eq!(json["model"], format!("made-up-{i}"));
        assert_eq!(json["served"], serde_json::json!(["m"]), "{json}");
        assert!(answer.header("Retry-After").is_none());
    }

    assert_eq!(
        footprint(&h),
        before,
        "(slots, leases, lease rows, metric lines)"
    );
    let metrics = request(h.server().admin_addr(), "GET", "/metrics", &[], &[]).text();
    assert!(!metrics.contains("made-up"), "{metrics}");
    assert_eq!(
        h.sim("mini").requests().len(),
        chats_before,
        "nothing forwarded"
    );
    let refused = h
        .rows()
        .into_iter()
        .filter(|r| r.model.starts_with("made-up"))
        .collect::<Vec<_>>();
    assert_eq!(refused.len(), 51, "one accounting row each");
    assert!(refused.iter().all(|r| r.status == 404 && r.host.is_empty()));
}

/// Issue 13 (review): the model of a refused request went whole into the 404 (twice: `model` and
/// the hint), the accounting row and the log line, so one 16 MiB body named a 16 MiB model in the
/// db. What crossbar keeps or echoes of a name it refuses is bounded, and cut on a char boundary.
#[test]
fn a_megabyte_model_name_is_refused_without_being_stored_or_echoed_whole() {
    let h = Harness::start(vec![host("titan", 1)], "");
    let mut body = chat("hello", 0, false);
    body["model"] = "é".repeat(512 * 1024).into();
    let answer = h.post(CHAT, &body);
    assert_eq!(answer.status, 404, "{}", answer.text());
    assert!(answer.body.len() < 4096, "{} bytes", answer.body.len());
    let json = answer.error();
    assert_eq!(json["code"], "model_not_found");
    let shown = json["model"].as_str().unwrap();
    assert!(shown.starts_with("éé") && shown.len() < 1024, "{shown}");
    // An unpinned route names what its candidates serve, as a pinned one does.
    assert_eq!(json["served"], serde_json::json!(["m"]), "{json}");
    let rows = h.rows();
    let row = rows.last().unwrap();
    assert_eq!(row.status, 404);
    assert!(row.model.starts_with("éé") && row.model.len() < 1024);
}
