//! A client cannot mark a healthy host down (issue 46, finding 3). llama-server (cpp-httplib)
//! answers 400 and closes, its body unread, a head with a line over 8,192 bytes or more than 100
//! header lines, and closes without a word on a request line over 32,768 bytes: crossbar forwarded
//! such heads, and with a large body its write failed with a broken pipe counted against the
//! host (`health_fall` in a row take it down). The sims read heads as cpp-httplib does. Now such a
//! head is the client's 431 (or 414), a host's answer is read and relayed whatever happened to
//! the body's write, and a stream the host ended cleanly is whole.

use crossbar::sim::Fault;
use serde_json::Value;

use crate::support::{chat, host, request, Harness, HostSpec};

const CHAT: &str = "/projA/v1/chat/completions";

/// One host that takes prompts of any size (so a big body is not refused for its context).
fn one_host(extra: &str) -> Harness {
    let spec = HostSpec {
        config: "ctx = 100000000",
        ..host("titan", 1)
    };
    Harness::start(vec![spec], extra)
}

/// A chat turn of about `bytes`, padded in a field nobody reads.
fn big_body(bytes: usize) -> Vec<u8> {
    let mut body: Value = chat("a large upload", 0, false);
    body["pad"] = "x".repeat(bytes).into();
    body.to_string().into_bytes()
}

/// What `/metrics` says of forwards counted against hosts: none.
#[track_caller]
fn no_failure_counted(h: &Harness) {
    let gw = h.server().gateway();
    assert!(gw.health.healthy("titan"), "the host stays up");
    let metrics = request(h.server().admin_addr(), "GET", "/metrics", &[], b"").text();
    assert!(
        !metrics.contains(r#"crossbar_forward_failures_total{against="host""#),
        "{metrics}"
    );
}

#[test]
fn a_head_the_host_cannot_read_is_the_clients_431_and_never_the_hosts_failure_issue_46() {
    let h = one_host("");
    let body = big_body(4 << 20);
    // "X-Pad: <value>\r\n" of 8,193 bytes: one over what llama-server reads.
    let over = "a".repeat(8193 - 9);
    let at = "a".repeat(8192 - 9);
    for _ in 0..3 {
        let answer = request(h.addr(), "POST", CHAT, &[("X-Pad", &over)], &body);
        crate::support::check_error(&answer, 431, "headers too large");
    }
    // 96 of the client's own lines, with its Content-Type and the Host, Content-Length,
    // User-Agent and Accept lines of the upstream client, are more than the 100 llama-server
    // reads.
    let names: Vec<String> = (0..96).map(|i| format!("X-Line-{i}")).collect();
    let many: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "1")).collect();
    let answer = request(h.addr(), "POST", CHAT, &many, &body);
    crate::support::check_error(&answer, 431, "headers too large");
    let seen = h.sim("titan").requests();
    assert!(
        seen.iter().all(|r| r.method != "POST"),
        "nothing reached the host"
    );
    // A line of exactly 8,192 bytes, and 88 lines, are what it reads: forwarded and answered.
    let answer = request(h.addr(), "POST", CHAT, &[("X-Pad", &at)], &body);
    assert_eq!(answer.status, 200, "{}", answer.text());
    let answer = request(h.addr(), "POST", CHAT, &many[..88], &body);
    assert_eq!(answer.status, 200, "{}", answer.text());
    no_failure_counted(&h);
}

#[test]
fn a_request_line_the_host_would_close_on_is_the_clients_414_issue_46() {
    let h = one_host("");
    let long = format!("{CHAT}?q={}", "q".repeat(32_768));
    let answer = request(h.addr(), "POST", &long, &[], &big_body(1 << 10));
    crate::support::check_error(&answer, 414, "uri too long");
    no_failure_counted(&h);
}

/// A host that answers a head alone and closes without reading the body (llama-server's 400
/// for a head it cannot read, its 503 while a model loads, its 401 for a wrong key) resets the
/// connection under a large body's write. Before, that write's broken pipe was a 502 counted
/// against the host; its answer is there to read, and the client gets it.
#[test]
fn a_host_that_answers_before_reading_a_large_body_is_relayed_and_not_blamed_issue_46() {
    let h = one_host("");
    h.sim("titan").set_fault(Fault::Early { status: 400 });
    let body = big_body(14 << 20);
    for _ in 0..3 {
        let answer = request(h.addr(), "POST", CHAT, &[], &body);
        assert_eq!(answer.status, 400, "{}", answer.text());
        let message = answer.json()["error"]["message"].clone();
        assert_eq!(message, "simulated early answer (status 400)");
    }
    no_failure_counted(&h);
    let rows = h.rows();
    assert!(rows.iter().all(|r| r.status == 400), "{rows:?}");
}

/// llama-server ends a streamed `/completion` asked for `"response_fields": ["content"]` with
/// `{"content":""}` and its chunked end, no `"stop": true` (b11434). Before, crossbar spoiled the
/// client's end, recorded "upstream ended the stream before its last event" and counted a host
/// failure for each. A stream whose own framing ended cleanly is whole as the host sent it.
#[test]
fn a_stream_the_host_ended_cleanly_without_its_last_event_is_whole_and_not_its_failure_issue_46() {
    let h = one_host("");
    h.sim("titan")
        .set_fault(Fault::EndEarly { after_events: 2 });
    for (path, body) in [
        (
            "/projA/completion",
            serde_json::json!({"prompt": "once upon", "n_predict": 4, "stream": true,
                               "response_fields": ["content"]}),
        ),
        ("/projA/v1/chat/completions", chat("cut", 0, true)),
        ("/projA/v1/chat/completions", chat("cut", 1, true)),
    ] {
        // A clean chunked end: `read_answer` fails on anything else.
        let answer = request(h.addr(), "POST", path, &[], body.to_string().as_bytes());
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(
            answer.text().matches("data: ").count(),
            2,
            "{}",
            answer.text()
        );
    }
    no_failure_counted(&h);
    let rows = h.rows();
    assert!(rows.iter().all(|r| r.err.is_empty()), "{rows:?}");
}
