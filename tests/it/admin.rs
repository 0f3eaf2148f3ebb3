//! The operator surface end to end (spec §7-§9): the admin API with and without a token, its
//! answers to bad input, drains and pins as a client sees them. `/metrics`, the status page and
//! the probes are in `admin/observe.rs`, the CLI verbs in `admin/cli.rs`.

mod check;
mod cli;
mod hints;
mod observe;
mod pipe;
mod race;
mod signin;

use serde_json::{json, Value};

use crate::support::{chat, host, request, Answer, Harness};

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
    for (i, (method, path, body)) in every_admin_call().into_iter().enumerate() {
        for headers in [
            vec![],
            vec![("Authorization", "Bearer wrong")],
            vec![("Authorization", token)],
        ] {
            // Each path's wrong tokens from an address of its own: ten from one address in a
            // minute would have it refused for guessing (issue 46).
            let from = [127, 0, 0, 10 + i as u8];
            let mut conn = crate::support::connect_from(from, h.server().admin_addr());
            let bytes = if body.is_null() {
                Vec::new()
            } else {
                body.to_string().into_bytes()
            };
            conn.send(method, path, &headers, &bytes);
            let answer = conn.read_answer();
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
            answer.error()["code"].is_string(),
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
    // Undrained, it takes new conversations again: of the next two, one (whichever host holds
    // fewer tokens goes first).
    let next = [
        turn(&h, "third conversation", 0),
        turn(&h, "fourth conversation", 0),
    ];
    assert!(next.contains(&("titan".into(), "new".into())), "{next:?}");
}

#[test]
fn a_pin_moves_the_next_turn_and_drops_the_leases_elsewhere() {
    let h = Harness::start(vec![host("titan", 1), host("mini", 1)], "");
    assert_eq!(turn(&h, "a long refactoring", 0).0, "titan");
    // New conversations spread: the second goes to the host with fewer leases.
    // (Same-sized texts: the host holding fewer tokens breaks the tie, then fewer leases.)
    assert_eq!(turn(&h, "a second chat, too", 0).0, "mini");
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
