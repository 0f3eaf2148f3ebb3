//! Issue 10: the front door attacked over raw sockets. Each test sends the attack, checks the
//! answer (or the close), and that the next normal request is served. Refusals before a request
//! is routed leave no accounting row but count in `crossbar_refused_total`.

mod admin;
mod bodies;
mod clients;
mod crowd;
mod emfile;
mod limits;

use std::io::{Read, Write};
use std::net::SocketAddr;

use crate::support::{chat, check_error, request, Answer, Conn, Harness};

const CHAT: &str = "/projA/v1/chat/completions";

/// Writes `bytes` on a fresh connection and reads one answer.
fn send_raw(addr: SocketAddr, bytes: &[u8]) -> (Conn, Answer) {
    let mut conn = Conn::open(addr);
    // The peer may close once it has answered: a failed write is part of some attacks.
    let _ = conn.reader.get_mut().write_all(bytes);
    let answer = conn.read_answer();
    (conn, answer)
}

/// The connection ends (EOF or reset) after the answer.
#[track_caller]
fn check_closed(conn: &mut Conn) {
    let mut rest = Vec::new();
    match conn.reader.read_to_end(&mut rest) {
        Ok(_) => assert!(rest.is_empty(), "more after the answer: {rest:?}"),
        Err(err) => assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}"),
    }
}

/// A normal chat turn is served after the attack.
#[track_caller]
fn check_served(h: &Harness) {
    let answer = h.post(CHAT, &chat("still there?", 0, false));
    assert_eq!(answer.status, 200, "{}", answer.text());
}

/// The value of `crossbar_refused_total` for a listener and reason (0 when absent).
fn refused(h: &Harness, listener: &str, reason: &str) -> u64 {
    let metrics = request(h.server().admin_addr(), "GET", "/metrics", &[], b"").text();
    let series = format!("crossbar_refused_total{{listener=\"{listener}\",reason=\"{reason}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .map_or(0, |n| n.parse().unwrap())
}

/// A raw request head with a JSON body.
fn post_head(path: &str, extra: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}
