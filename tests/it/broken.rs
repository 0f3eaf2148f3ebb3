//! Issue 3 §8: an upstream failing mid-answer ends the client's answer visibly broken — never as a
//! clean end, never as a hang — its row has the error, and the slot is free for the next request.

use std::io::{BufRead, Read, Write};
use std::time::Duration;

use crossbar::sim::Fault;

use crate::support::{chat, host, wait_until, Conn, Harness};

const CHAT: &str = "/projA/v1/chat/completions";

/// Reads a chunked body until it proves broken: a chunk line that is not hex, or the connection
/// closing before the last chunk. Fails on the last chunk (a clean end) or a read timeout (a hang).
/// Returns the body bytes received before the break.
#[track_caller]
pub fn read_broken_chunked(conn: &mut Conn) -> String {
    let mut body = Vec::new();
    loop {
        let mut line = String::new();
        let n = conn.reader.read_line(&mut line).expect("no hang");
        if n == 0 || !line.ends_with("\r\n") {
            return String::from_utf8_lossy(&body).into_owned(); // closed mid-body
        }
        let Ok(size) = usize::from_str_radix(line.trim_end(), 16) else {
            return String::from_utf8_lossy(&body).into_owned(); // malformed chunk line
        };
        assert_ne!(size, 0, "clean end: {:?}", String::from_utf8_lossy(&body));
        let mut data = vec![0; size + 2];
        match conn.reader.read_exact(&mut data) {
            Ok(()) => body.extend_from_slice(&data[..size]),
            Err(err) => {
                assert_ne!(err.kind(), std::io::ErrorKind::WouldBlock, "hang");
                return String::from_utf8_lossy(&body).into_owned();
            }
        }
    }
}

/// Sends `body` to the chat path with `fault` on the only host, and checks the answer: a 200 head
/// announcing a chunked body, then a broken body. Returns what arrived.
#[track_caller]
fn broken_answer(h: &Harness, fault: Fault, stream: bool) -> String {
    h.sim("titan").set_fault(fault);
    let mut conn = h.open_chat(CHAT, &chat("fragile", 0, stream));
    short_timeout(&conn);
    let (status, headers) = conn.read_head();
    assert_eq!(status, 200);
    let find = |n: &str| crossbar::wire::header(&headers, n);
    assert_eq!(find("Transfer-Encoding"), Some("chunked"), "{headers:?}");
    assert_eq!(find("Content-Length"), None, "{headers:?}");
    read_broken_chunked(&mut conn)
}

/// Every read on the raw socket gives up quickly: a hang fails the test instead of stalling it.
pub fn short_timeout(conn: &Conn) {
    conn.reader
        .get_ref()
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
}

/// The row of the broken answer has the error, the slot is free, and the host serves the next turn.
#[track_caller]
fn check_recovered(h: &Harness, status: u16) {
    let rows = h.rows();
    let row = rows.last().expect("a row");
    assert_eq!(row.status, status, "{row:?}");
    assert!(row.err.contains("upstream failed mid-body"), "{row:?}");
    let gw = h.server().gateway().clone();
    wait_until("the slot is free", || {
        gw.limiter.in_flight("titan", "m") == 0
    });
    h.sim("titan").set_fault(Fault::None);
    let next = h.post(CHAT, &chat("next", 0, false));
    assert_eq!(next.status, 200, "{}", next.text());
}

#[test]
fn a_plain_answer_cut_short_of_its_content_length_ends_broken() {
    let h = Harness::start(vec![host("titan", 1)], "");
    let got = broken_answer(&h, Fault::CutBody { after_bytes: 40 }, false);
    assert_eq!(got.len(), 40, "upstream's bytes go out unchanged: {got:?}");
    check_recovered(&h, 200);
}

#[test]
fn a_stream_cut_inside_a_chunk_ends_broken() {
    // ureq reads an EOF inside a chunk as a clean end; the missing `[DONE]` gives it away.
    let h = Harness::start(vec![host("titan", 1)], "");
    let got = broken_answer(&h, Fault::CutMidChunk { after_events: 2 }, true);
    // Two whole events, then the half event upstream managed to send, relayed as it came.
    assert_eq!(got.matches("\n\n").count(), 2, "{got:?}");
    assert!(!got.ends_with("\n\n"), "{got:?}");
    check_recovered(&h, 200);
}

/// Sends an HTTP/1.0 chat request on a fresh connection.
fn send_http10(h: &Harness, keep_alive: bool, stream: bool) -> Conn {
    let conn = Conn::open(h.addr());
    short_timeout(&conn);
    resend_http10(&conn, keep_alive, stream);
    conn
}

fn resend_http10(conn: &Conn, keep_alive: bool, stream: bool) {
    let body = chat("old client", 0, stream).to_string();
    let keep = if keep_alive {
        "Connection: keep-alive\r\n"
    } else {
        ""
    };
    let head = format!(
        "POST {CHAT} HTTP/1.0\r\nHost: crossbar\r\n{keep}Content-Length: {}\r\n\r\n",
        body.len()
    );
    let mut stream = conn.reader.get_ref();
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body.as_bytes()).unwrap();
}

/// An HTTP/1.0 request's 200 answer, `Connection: close`, read to the close.
fn http10_answer(h: &Harness, keep_alive: bool, stream: bool) -> String {
    let mut conn = send_http10(h, keep_alive, stream);
    let (status, headers) = conn.read_head();
    assert_eq!(status, 200);
    assert_eq!(
        crossbar::wire::header(&headers, "Connection"),
        Some("close")
    );
    let mut body = String::new();
    conn.reader
        .read_to_string(&mut body)
        .expect("closed, no hang");
    body
}

#[test]
fn an_http10_client_sees_the_connection_close_where_upstream_broke() {
    let h = Harness::start(vec![host("titan", 1)], "");
    h.sim("titan")
        .set_fault(Fault::CutMidChunk { after_events: 2 });
    let body = http10_answer(&h, false, true);
    assert!(!body.contains("[DONE]"), "{body:?}");
    check_recovered(&h, 200);
}

/// Issue 10: an HTTP/1.0 client asking for keep-alive gets its stream as it is made, ended by the
/// close (tiny_http kept such connections open, so crossbar used to hold the answer whole).
#[test]
fn an_http10_keep_alive_client_gets_its_stream_ended_by_the_close_issue_10() {
    let h = Harness::start(vec![host("titan", 1)], "");
    let body = http10_answer(&h, true, true);
    assert!(body.ends_with("data: [DONE]\n\n"), "{body:?}");
    h.sim("titan").set_fault(Fault::CutBody { after_bytes: 40 });
    let body = http10_answer(&h, true, false);
    assert!(
        serde_json::from_str::<serde_json::Value>(&body).is_err(),
        "cut: {body:?}"
    );
    check_recovered(&h, 200);
}
