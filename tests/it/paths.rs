//! Issue 10's two faults in crossbar's own request handling, attacked over raw sockets: paths that
//! decode to somewhere the allow-list never saw, and headers upstream would refuse. Neither may
//! reach a host, and neither may cost a host its health.

use crate::support::{chat, host, Conn, Harness};

const CHAT: &str = "/projA/v1/chat/completions";

/// Sends `raw` bytes as the whole request on a fresh connection and reads the answer.
fn raw(h: &Harness, bytes: &[u8]) -> crate::support::Answer {
    use std::io::Write;
    let mut conn = Conn::open(h.addr());
    conn.reader.get_mut().write_all(bytes).unwrap();
    conn.read_answer()
}

#[track_caller]
fn check_bad_request(answer: &crate::support::Answer) {
    assert_eq!(answer.status, 400, "{}", answer.text());
    assert_eq!(answer.error()["code"], "bad request", "{}", answer.text());
    assert!(answer.error()["detail"].is_string(), "{}", answer.text());
}

/// Issue 10: each of these reached the host (`/slots`, `/`, `/slots` and an erased slot 0).
#[test]
fn dot_segments_and_backslashes_never_reach_the_host_issue_10() {
    let h = Harness::start(vec![host("titan", 1)], "");
    let before = h.sim("titan").requests().len();
    for (method, path) in [
        ("GET", "/projA/v1/%2e%2e/slots"),
        ("GET", "/projA/v1/.."),
        ("GET", "/projA/v1/..\\slots"),
        ("POST", "/projA/v1/%2e%2e/slots/0?action=erase"),
        ("GET", "/projA/v1%2fslots"),
        ("GET", "/projA/v1/models%00"),
    ] {
        let request = format!("{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
        check_bad_request(&raw(&h, request.as_bytes()));
    }
    let seen = &h.sim("titan").requests()[before..];
    let forwarded: Vec<_> = (seen.iter())
        .filter(|r| {
            !matches!(
                r.path.as_str(),
                "/health" | "/props" | "/v1/models" | "/models" | "/slots"
            )
        })
        .cloned()
        .collect();
    assert!(forwarded.is_empty(), "reached the host: {forwarded:#?}");
    // Every poll asks `/slots` once (issue 47): one more than the polls is a client's that got
    // through (a poll under way as the count began may add one of its own).
    let count = |path: &str| seen.iter().filter(|r| r.path == path).count();
    assert!(
        count("/slots") <= count("/health") + 1,
        "a client's /slots reached the host"
    );
    // Refused before a route is known, they are counted, not stored (issue 46).
    assert!(h.rows().is_empty(), "{:#?}", h.rows());
    // And the next normal request is served.
    let answer = h.post(CHAT, &chat("hi", 0, false));
    assert_eq!(answer.status, 200, "{}", answer.text());
}

#[test]
fn the_host_gets_exactly_the_checked_path_issue_10() {
    let h = Harness::start(vec![host("titan", 1)], "");
    // A path the health poller never asks for, so only the forwarded request can account for it.
    let answer = h.post("/projA/v1/chat/%63ompletions", &chat("hi", 0, false));
    assert_eq!(answer.status, 200, "{}", answer.text());
    let seen = h.sim("titan").requests();
    let chats: Vec<&str> = seen
        .iter()
        .filter(|r| r.path.contains("chat"))
        .map(|r| r.path.as_str())
        .collect();
    assert_eq!(chats, ["/v1/chat/completions"], "{seen:#?}");
}

/// Issue 10: ureq refused to build these requests, and crossbar marked the host down for it.
#[test]
fn a_header_upstream_would_refuse_is_the_clients_400_and_the_host_stays_up_issue_10() {
    let h = Harness::start(vec![host("titan", 1)], "");
    let gw = h.server().gateway().clone();
    let body = chat("hi", 0, false).to_string();
    for header in ["X-Foo: a\x01b", "Bad(Name): v", "X-Foo: caf\u{e9}"] {
        let request = format!(
            "POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n{header}\r\n\r\n{body}",
            body.len()
        );
        let answer = raw(&h, request.as_bytes());
        assert_eq!(answer.status, 400, "{header:?}: {}", answer.text());
        assert!(
            gw.health.healthy("titan"),
            "{header:?} marked the host down"
        );
    }
    let answer = h.post(CHAT, &chat("hi", 0, false));
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert!(gw.health.healthy("titan"));
    assert!(
        h.sim("titan")
            .requests()
            .iter()
            .filter(|r| r.method == "POST")
            .count()
            == 1,
        "only the good request was forwarded"
    );
}
