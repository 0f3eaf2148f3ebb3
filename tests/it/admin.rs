//! The operator surface end to end (spec §7-§9): the admin API with and without a token, its
//! answers to bad input, drains and pins as a client sees them, `/metrics` read by a real
//! Prometheus parser, and the status page. The CLI verbs are in `admin/cli.rs`.

mod cli;
mod race;

use serde_json::{json, Value};

use crate::support::{chat, host, request, wait_until, Answer, Harness};

const CHAT: &str = "/projA/v1/chat/completions";

/// One request to the admin listener.
fn admin(h: &Harness, method: &str, path: &str, headers: &[(&str, &str)], body: &Value) -> Answer {
    let body = if body.is_null() {
        Vec::new()
    } else {
        body.to_string().into_bytes()
    };
    request(h.server().admin_addr(), method, path, headers, &body)
}

fn get(h: &Harness, path: &str) -> Answer {
    admin(h, "GET", path, &[], &Value::Null)
}

fn post(h: &Harness, path: &str, body: Value) -> Answer {
    admin(h, "POST", path, &[], &body)
}

/// An admin error: its status, JSON, and an error message mentioning `mentions`.
#[track_caller]
fn check_error(answer: &Answer, status: u16, mentions: &str) {
    assert_eq!(answer.status, status, "{}", answer.text());
    assert_eq!(answer.header("Content-Type"), Some("application/json"));
    let error = answer.json()["error"].as_str().unwrap_or("").to_string();
    assert!(
        error.contains(mentions),
        "{error:?} should mention {mentions:?}"
    );
}

/// Sends one turn of a conversation and returns the host that answered and `new|reused`.
#[track_caller]
fn turn(h: &Harness, first: &str, turns: usize) -> (String, String) {
    let answer = h.post(CHAT, &chat(first, turns, false));
    assert_eq!(answer.status, 200, "{}", answer.text());
    let header = |name| answer.header(name).unwrap_or("").to_string();
    (header("X-Crossbar-Host"), header("X-Crossbar-Lease"))
}

/// Every admin path, with a body that succeeds on a two-host `projA`.
fn every_admin_call() -> Vec<(&'static str, &'static str, Value)> {
    vec![
        ("GET", "/", Value::Null),
        ("GET", "/metrics", Value::Null),
        ("GET", "/admin/status", Value::Null),
        ("GET", "/admin/leases", Value::Null),
        ("GET", "/admin/events?limit=5", Value::Null),
        (
            "POST",
            "/admin/pin",
            json!({"route": "projA", "host": "titan"}),
        ),
        ("POST", "/admin/unpin", json!({"route": "projA"})),
        ("POST", "/admin/release", json!({"route": "projA"})),
        ("POST", "/admin/drain", json!({"host": "mini", "on": false})),
    ]
}

#[test]
fn with_an_admin_token_every_admin_path_needs_it() {
    let token = "tok-s3cret-8f2e";
    let h = Harness::start(
        vec![host("titan", 1), host("mini", 1)],
        &format!("admin_token = {token:?}"),
    );
    let good = format!("Bearer {token}");
    for (method, path, body) in every_admin_call() {
        for headers in [
            vec![],
            vec![("Authorization", "Bearer wrong")],
            vec![("Authorization", token)],
        ] {
            let answer = admin(&h, method, path, &headers, &body);
            check_error(&answer, 401, "token");
            assert!(!answer.text().contains(token));
        }
        let answer = admin(&h, method, path, &[("Authorization", &good)], &body);
        assert_eq!(answer.status, 200, "{method} {path}: {}", answer.text());
        assert!(
            !answer.text().contains(token),
            "{method} {path} shows the token"
        );
    }
}

#[test]
fn bad_admin_input_is_answered_naming_what_is_wrong() {
    let h = Harness::start(vec![host("titan", 1), host("mini", 1)], "");
    check_error(
        &post(&h, "/admin/pin", json!({"route": "projA"})),
        400,
        "host",
    );
    check_error(
        &post(&h, "/admin/drain", json!({"host": "titan"})),
        400,
        "on",
    );
    check_error(&post(&h, "/admin/unpin", json!({})), 400, "route");
    let wrong_type = post(&h, "/admin/drain", json!({"host": "titan", "on": "yes"}));
    check_error(&wrong_type, 400, "on");
    let wrong_type = post(&h, "/admin/pin", json!({"route": 7, "host": "titan"}));
    check_error(&wrong_type, 400, "route");
    // Not an object at all: the answer says what it expected.
    check_error(
        &post(&h, "/admin/release", json!("projA")),
        400,
        "bad body: invalid type",
    );
    check_error(
        &admin(
            &h,
            "POST",
            "/admin/pin",
            &[("Content-Type", "application/json")],
            &Value::Null,
        ),
        400,
        "bad body",
    );
    let unknown_host = post(&h, "/admin/drain", json!({"host": "nope", "on": true}));
    check_error(&unknown_host, 404, "nope");
    let unknown_host = post(&h, "/admin/pin", json!({"route": "projA", "host": "nope"}));
    check_error(&unknown_host, 404, "nope");
    check_error(
        &post(&h, "/admin/release", json!({"route": "projZ"})),
        404,
        "projZ",
    );
    check_error(&get(&h, "/admin/nope"), 404, "not found");
    check_error(&get(&h, "/admin/events?limit=0"), 400, "limit");
    check_error(&get(&h, "/admin/pin"), 405, "method");
    // None of it changed anything.
    let status = get(&h, "/admin/status").json();
    assert!(status["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .all(|h| h["draining"] == false));
    assert!(status["routes"][0]["pinned"].is_null(), "{status:#}");
}

#[test]
fn the_client_listener_never_serves_the_admin_api() {
    let h = Harness::start(vec![host("titan", 1)], "");
    for path in ["/admin/status", "/admin/leases", "/metrics", "/"] {
        let answer = h.get(path);
        assert!(
            matches!(answer.status, 400 | 404),
            "{path}: {} {}",
            answer.status,
            answer.text()
        );
        assert!(
            answer.json()["error"].is_string(),
            "{path}: {}",
            answer.text()
        );
        assert!(answer.json().get("hosts").is_none());
    }
    let answer = h.post("/admin/pin", &json!({"route": "projA", "host": "titan"}));
    assert!(matches!(answer.status, 400 | 404), "{}", answer.text());
    assert!(h.server().gateway().leases.pins().is_empty());
}

#[test]
fn a_drained_host_keeps_its_conversations_but_gets_no_new_ones_until_undrained() {
    let h = Harness::start(vec![host("titan", 1), host("mini", 1)], "");
    assert_eq!(
        turn(&h, "first conversation", 0),
        ("titan".into(), "new".into())
    );
    let answer = post(&h, "/admin/drain", json!({"host": "titan", "on": true}));
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.json()["leases"], 1, "{}", answer.text());
    assert_eq!(answer.json()["changed"], true);

    assert_eq!(
        turn(&h, "second conversation", 0),
        ("mini".into(), "new".into())
    );
    assert_eq!(
        turn(&h, "first conversation", 1),
        ("titan".into(), "reused".into())
    );
    let status = get(&h, "/admin/status").json();
    let titan = &status["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["name"] == "titan")
        .unwrap();
    assert_eq!(
        (titan["draining"].clone(), titan["leases"].clone()),
        (json!(true), json!(1))
    );

    let answer = post(&h, "/admin/drain", json!({"host": "titan", "on": false}));
    assert_eq!(answer.json()["changed"], true, "{}", answer.text());
    assert_eq!(
        turn(&h, "third conversation", 0),
        ("titan".into(), "new".into())
    );
}

#[test]
fn a_pin_moves_the_next_turn_and_drops_the_leases_elsewhere() {
    let h = Harness::start(vec![host("titan", 1), host("mini", 1)], "");
    assert_eq!(turn(&h, "a long refactoring", 0).0, "titan");
    // New conversations spread: the second goes to the host with fewer leases.
    assert_eq!(turn(&h, "a second chat", 0).0, "mini");
    assert_eq!(turn(&h, "a third chat", 0).0, "titan");
    let answer = post(&h, "/admin/pin", json!({"route": "projA", "host": "mini"}));
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.json()["dropped"], 2, "{}", answer.text());

    let leases = get(&h, "/admin/leases").json();
    assert_eq!(leases["pins"], json!([{"route": "projA", "host": "mini"}]));
    assert!(
        leases["leases"]
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l["host"] != "titan"),
        "{leases:#}"
    );
    assert_eq!(turn(&h, "a long refactoring", 1).0, "mini");
    assert_eq!(turn(&h, "something new", 0).0, "mini");

    let events = get(&h, "/admin/events?limit=50").json();
    let moved = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reason"] == "pin" && e["from"] == "titan" && e["to"] == "mini")
        .count();
    assert_eq!(moved, 2, "{events:#}");
}

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
    wait_until("the requests are counted", || {
        get(&h, "/metrics")
            .text()
            .matches("crossbar_requests_total{")
            .count()
            >= 2
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
    let headline = format!("prefill saved: <b>{cached} tokens</b>");
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
