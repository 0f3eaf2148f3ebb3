//! Sizes, framing and deadlines: what the connection layer refuses before a handler runs, and
//! the body limits it enforces for the handler.

use std::io::Write;
use std::time::{Duration, Instant};

use super::{check_closed, check_error, check_served, post_head, refused, send_raw, CHAT};
use crate::support::{chat, host, Conn, Harness};

/// Issue 10: this aborted the process (`memory allocation of 100000000000 bytes failed`).
#[test]
fn a_huge_declared_body_is_413_at_once_and_nothing_is_allocated_for_it_issue_10() {
    let h = Harness::start(vec![host("titan", 1)], "");
    let head = format!(
        "POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000000\r\n\r\n0123456789"
    );
    let (mut conn, answer) = send_raw(h.addr(), head.as_bytes());
    check_error(&answer, 413, "body too large");
    check_closed(&mut conn);
    let row = h.rows().pop().expect("a routed request has its row");
    assert_eq!(row.status, 413);
    let admin = h.server().admin_addr();
    let head = format!(
        "POST /admin/pin HTTP/1.1\r\nHost: {admin}\r\nContent-Type: application/json\r\n\
         Content-Length: 100000000000\r\n\r\n0123456789"
    );
    let (_, answer) = send_raw(admin, head.as_bytes());
    assert_eq!(answer.status, 413, "{}", answer.text());
    check_served(&h);
}

#[test]
fn a_head_over_64_kib_or_100_lines_is_431_with_no_row_issue_10() {
    let h = Harness::start(vec![host("titan", 1)], "");
    let long = format!(
        "GET /projA/v1/models HTTP/1.1\r\nX-Big: {}\r\n\r\n",
        "a".repeat(70_000)
    );
    let (mut conn, answer) = send_raw(h.addr(), long.as_bytes());
    check_error(&answer, 431, "headers too large");
    check_closed(&mut conn);
    let mut many = "GET /projA/v1/models HTTP/1.1\r\n".to_string();
    for i in 0..101 {
        many.push_str(&format!("X-{i}: v\r\n"));
    }
    many.push_str("\r\n");
    let (_, answer) = send_raw(h.addr(), many.as_bytes());
    check_error(&answer, 431, "headers too large");
    assert!(h.rows().is_empty(), "refused before routing: no row");
    assert_eq!(refused(&h, "clients", "headers_too_large"), 2);
    check_served(&h);
}

#[test]
fn bad_framing_is_400_and_the_connection_closes_issue_10() {
    let h = Harness::start(vec![host("titan", 1)], "");
    let body = chat("hi", 0, false).to_string();
    for extra in [
        "Content-Length: 3\r\n",
        "Transfer-Encoding: chunked\r\n",
        "Transfer-Encoding: gzip\r\nX-No-Length: 1\r\n",
        "X-Folded: a\r\n b\r\n",
        "X-Ctl: a\x01b\r\n",
        "Bad(Name): v\r\n",
    ] {
        let mut head = post_head(CHAT, extra, &body);
        if extra.starts_with("Transfer-Encoding: gzip") {
            head = head.replacen(&format!("Content-Length: {}\r\n", body.len()), "", 1);
        }
        let (mut conn, answer) = send_raw(h.addr(), head.as_bytes());
        check_error(&answer, 400, "bad request");
        assert!(answer.error()["detail"].is_string(), "{extra:?}");
        check_closed(&mut conn);
    }
    let plus = format!("POST {CHAT} HTTP/1.1\r\nContent-Length: +5\r\n\r\nhello");
    let (_, answer) = send_raw(h.addr(), plus.as_bytes());
    check_error(&answer, 400, "bad request");
    assert!(h.rows().is_empty(), "refused before routing: no row");
    assert_eq!(refused(&h, "clients", "bad_request"), 7);
    assert!(h.sim("titan").requests().iter().all(|r| r.method != "POST"));
    check_served(&h);
}

#[test]
fn a_head_that_never_ends_is_408_at_its_deadline_issue_10() {
    let h = Harness::start(vec![host("titan", 1)], "client_header_timeout = \"300ms\"");
    let started = Instant::now();
    // Dribbling keeps no per-read timer alive: the deadline is for the whole head.
    let mut conn = Conn::open(h.addr());
    conn.reader
        .get_mut()
        .write_all(b"GET /projA/v1/models HTTP/1.1\r\n")
        .unwrap();
    let answer = conn.read_answer();
    check_error(&answer, 408, "request timeout");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(refused(&h, "clients", "head_timeout"), 1);
    assert!(h.rows().is_empty());
    check_served(&h);
}

/// Issue 10: a declared 2000-byte body with 10 bytes sent held a worker with no time limit.
#[test]
fn a_stalled_body_is_408_at_its_deadline_and_frees_the_worker_issue_10() {
    let extra = "workers = 2\nclient_body_timeout = \"300ms\"\nclient_body_min_rate = 1000000";
    let h = Harness::start(vec![host("titan", 1)], extra);
    let stalled: Vec<Conn> = (0..4)
        .map(|_| {
            let mut conn = Conn::open(h.addr());
            let head = format!(
                "POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Length: 2000\r\n\r\n0123456789"
            );
            conn.reader.get_mut().write_all(head.as_bytes()).unwrap();
            conn
        })
        .collect();
    for mut conn in stalled {
        let answer = conn.read_answer();
        check_error(&answer, 408, "request timeout");
    }
    let rows = h.rows();
    assert_eq!(rows.len(), 4, "routed requests keep their rows: {rows:#?}");
    assert!(rows.iter().all(|r| r.status == 408));
    check_served(&h);
}

#[test]
fn expect_100_continue_is_answered_before_the_body_issue_10() {
    let h = Harness::start(vec![host("titan", 1)], "");
    let body = chat("hi", 0, false).to_string();
    let head = post_head(CHAT, "Expect: 100-continue\r\n", "");
    let head = head.replace(
        "Content-Length: 0",
        &format!("Content-Length: {}", body.len()),
    );
    let mut conn = Conn::open(h.addr());
    conn.reader.get_mut().write_all(head.as_bytes()).unwrap();
    let (status, _) = conn.read_head();
    assert_eq!(status, 100);
    conn.reader.get_mut().write_all(body.as_bytes()).unwrap();
    let answer = conn.read_answer();
    assert_eq!(answer.status, 200, "{}", answer.text());
}

#[test]
fn pipelined_requests_are_answered_in_order_on_a_kept_connection_issue_10() {
    let h = Harness::start(vec![host("titan", 1)], "");
    let body = chat("pipelined", 0, false).to_string();
    let two = format!(
        "{}GET /projA/v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
        post_head(CHAT, "", &body)
    );
    let mut conn = Conn::open(h.addr());
    conn.reader.get_mut().write_all(two.as_bytes()).unwrap();
    let first = conn.read_answer();
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.header("Keep-Alive"), Some("timeout=15"));
    assert!(first.json()["choices"].is_array(), "{}", first.text());
    let second = conn.read_answer();
    assert_eq!(second.status, 200, "{}", second.text());
    assert!(second.json()["data"].is_array(), "{}", second.text());
}

/// Sends `bytes` on `conn` one at a time, 20 ms apart, from a thread, and reads the answer that
/// comes meanwhile: the answer and how long it took. The dripping stops with the answer (or when
/// the server closes).
fn answer_to_a_drip(conn: &mut Conn, bytes: Vec<u8>) -> (crate::support::Answer, Duration) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let done = std::sync::Arc::new(AtomicBool::new(false));
    let mut sock = conn.reader.get_ref().try_clone().unwrap();
    let flag = done.clone();
    let writer = std::thread::spawn(move || {
        for b in bytes {
            if flag.load(Ordering::Relaxed) || sock.write_all(&[b]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let started = Instant::now();
    let answer = conn.read_answer();
    let took = started.elapsed();
    done.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    (answer, took)
}

/// Issue 10: a head that keeps arriving, a byte every 20 ms, never makes its own deadline longer.
#[test]
fn a_head_dripped_a_byte_at_a_time_is_408_at_its_deadline_issue_10() {
    let h = Harness::start(vec![host("titan", 1)], "client_header_timeout = \"300ms\"");
    let mut conn = Conn::open(h.addr());
    let mut head = b"GET /projA/v1/models HTTP/1.1\r\nX-Drip: ".to_vec();
    head.extend(std::iter::repeat_n(b'a', 2000));
    let (answer, took) = answer_to_a_drip(&mut conn, head);
    check_error(&answer, 408, "request timeout");
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert_eq!(refused(&h, "clients", "head_timeout"), 1);
    check_served(&h);
}

/// Issue 10: a body that keeps arriving far below `client_body_min_rate` is 408 at the deadline
/// its size allows, however steadily it trickles.
#[test]
fn a_body_dripped_below_the_minimum_rate_is_408_at_its_deadline_issue_10() {
    let extra = "client_body_timeout = \"300ms\"\nclient_body_min_rate = 1000000";
    let h = Harness::start(vec![host("titan", 1)], extra);
    let mut conn = Conn::open(h.addr());
    let head = format!("POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Length: 2000\r\n\r\n");
    conn.reader.get_mut().write_all(head.as_bytes()).unwrap();
    let (answer, took) = answer_to_a_drip(&mut conn, vec![b' '; 2000]);
    check_error(&answer, 408, "request timeout");
    // 300 ms plus 2,000 bytes at 1 MB/s; the whole body would have taken 40 s.
    assert!(took < Duration::from_secs(3), "{took:?}");
    check_served(&h);
}

/// Issue 10: a kept-alive connection with nothing more to ask is closed at `keepalive_idle`.
#[test]
fn an_idle_kept_alive_connection_is_closed_at_keepalive_idle_issue_10() {
    let h = Harness::start(vec![host("titan", 1)], "keepalive_idle = \"300ms\"");
    let mut conn = Conn::open(h.addr());
    let body = chat("idle", 0, false).to_string();
    let head = post_head(CHAT, "", &body);
    conn.reader.get_mut().write_all(head.as_bytes()).unwrap();
    let answer = conn.read_answer();
    assert_eq!(answer.status, 200, "{}", answer.text());
    let idle = Instant::now();
    check_closed(&mut conn);
    let took = idle.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(3),
        "closed after {took:?}"
    );
}

/// Issue 24's small findings: an HTTP/1.1 request with no Host or two is 400 before routing (as
/// nginx answers), and a header value that cannot be forwarded is 400 before a host is chosen —
/// no lease, no slot, no forward.
#[test]
fn host_headers_and_unforwardable_bytes_are_refused_before_a_host_is_chosen_issue_24() {
    let h = Harness::start(vec![host("titan", 1)], "");
    let body = chat("hi", 0, false).to_string();
    let bare = post_head(CHAT, "", &body).replacen("Host: x\r\n", "", 1);
    let twice = post_head(CHAT, "Host: y\r\n", &body);
    for head in [bare, twice] {
        let (_, answer) = send_raw(h.addr(), head.as_bytes());
        check_error(&answer, 400, "bad request");
    }
    let mut raw = post_head(CHAT, "X-Name: caf\u{e9}\r\n", &body).into_bytes();
    // The same head with a Latin-1 byte where the UTF-8 é was: not visible ASCII either way.
    let at = raw.windows(2).position(|w| w == "é".as_bytes()).unwrap();
    raw.splice(at..at + 2, [0xe9]);
    let (_, answer) = send_raw(h.addr(), &raw);
    check_error(&answer, 400, "bad request");
    assert!(h.server().gateway().leases.is_empty(), "no lease was taken");
    assert!(h.sim("titan").requests().iter().all(|r| r.method != "POST"));
    check_served(&h);
}
