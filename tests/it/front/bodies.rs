//! Issue 24: request bodies are read off the workers. A body not whole within 50 ms of its head is
//! read by the poller, and the request goes back to a worker once its body is whole (or has
//! failed), so silent bodies from many addresses cost sockets, not workers. The body's deadline is
//! its progress (bytes per `client_body_timeout`), never its declared size, and the bytes of all
//! bodies being received are bounded by `client_body_buffer_mib`.

use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

use super::crowd::{check_served_promptly, connect_from};
use super::{check_error, post_head, CHAT};
use crate::support::{chat, host, wait_until, Conn, Harness};

/// A head declaring a 16 MiB body, optionally waiting for `100 Continue`.
fn silent_head(expect: bool) -> String {
    let expect = if expect {
        "Expect: 100-continue\r\n"
    } else {
        ""
    };
    format!(
        "POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{expect}Content-Length: 16777216\r\n\r\n"
    )
}

/// Before: 72 connections from 9 addresses, each a head with `Content-Length: 16777216` and then
/// nothing, held every worker for up to 10 s + 16 MiB ÷ 64 KiB/s ≈ 266 s; the per-address cap did
/// not help across addresses, and a normal client timed out.
#[test]
fn nine_addresses_with_eight_silent_bodies_each_leave_a_normal_client_served_issue_24() {
    let h = Harness::start(vec![host("titan", 1)], "workers = 4");
    let mut silent = Vec::new();
    for peer in 2..=10u8 {
        for i in 0..8 {
            let mut conn = connect_from([127, 0, 0, peer], h.addr());
            let expect = i % 2 == 1;
            conn.reader
                .get_mut()
                .write_all(silent_head(expect).as_bytes())
                .unwrap();
            silent.push((conn, expect));
        }
    }
    wait_until("all 72 bodies are awaited off the workers", || {
        h.server().client_connections().bodies_off_workers == 72
    });
    assert_eq!(h.server().client_connections().reading_body, 72);
    check_served_promptly(&h);
    check_served_promptly(&h);
    // Those that asked were told to send their bodies.
    for (conn, expect) in &mut silent {
        if *expect {
            let mut line = String::new();
            conn.reader.read_line(&mut line).unwrap();
            assert_eq!(line, "HTTP/1.1 100 Continue\r\n");
        }
    }
    assert!(h.rows().iter().all(|r| r.status == 200));
}

/// Before: the deadline was `client_body_timeout` plus the declared size at
/// `client_body_min_rate`, so a silent 16 MiB declaration held on for minutes. Now a window without
/// its share of the body is 408, whatever was declared.
#[test]
fn a_silent_body_is_408_one_window_later_whatever_it_declared_issue_24() {
    let extra = "client_body_timeout = \"300ms\"\nclient_body_min_rate = 1000";
    let h = Harness::start(vec![host("titan", 1)], extra);
    let mut conn = Conn::open(h.addr());
    let started = Instant::now();
    conn.reader
        .get_mut()
        .write_all(silent_head(false).as_bytes())
        .unwrap();
    let answer = conn.read_answer();
    let took = started.elapsed();
    check_error(&answer, 408, "request timeout");
    assert!(took >= Duration::from_millis(300), "after {took:?}");
    assert!(
        took < Duration::from_secs(5),
        "after {took:?}: not by the declared size"
    );
    let rows = h.rows();
    assert_eq!(
        rows.len(),
        1,
        "a body refused off the workers is still recorded"
    );
    assert_eq!(rows[0].status, 408);
    check_served_promptly(&h);
}

/// A body that keeps coming is assembled off the workers and served like any other, for a length
/// and for chunks, however long it takes at its pace; a pipelined request after it is served next.
#[test]
fn a_body_that_keeps_coming_is_served_from_the_poller_issue_24() {
    let extra = "workers = 1\nclient_body_timeout = \"400ms\"\nclient_body_min_rate = 100";
    let h = Harness::start(vec![host("titan", 1)], extra);
    let body = chat("sent slowly, piece by piece", 0, false).to_string();
    let pipelined = post_head(CHAT, "", &chat("next", 0, false).to_string());
    let length = post_head(CHAT, "", &body);
    let mut chunked = format!(
        "POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    for piece in body.as_bytes().chunks(16) {
        chunked.push_str(&format!(
            "{:x}\r\n{}\r\n",
            piece.len(),
            String::from_utf8_lossy(piece)
        ));
    }
    chunked.push_str("0\r\n\r\n");
    for whole in [length, chunked] {
        let mut conn = Conn::open(h.addr());
        let head_end = whole.find("\r\n\r\n").unwrap() + 4;
        let (head, rest) = whole.as_bytes().split_at(head_end);
        conn.reader.get_mut().write_all(head).unwrap();
        wait_until("the body is awaited off the workers", || {
            h.server().client_connections().bodies_off_workers == 1
        });
        // The one worker is free meanwhile.
        check_served_promptly(&h);
        // 40 bytes a piece, faster than 100 B/s, for longer than one window.
        let pieces: Vec<&[u8]> = rest.chunks(40).collect();
        for (i, piece) in pieces.iter().enumerate() {
            conn.reader.get_mut().write_all(piece).unwrap();
            if i < 4 {
                std::thread::sleep(Duration::from_millis(150));
            }
        }
        conn.reader
            .get_mut()
            .write_all(pipelined.as_bytes())
            .unwrap();
        let answer = conn.read_answer();
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(conn.read_answer().status, 200, "the pipelined one");
    }
    let rows = h.rows();
    assert_eq!(rows.len(), 6);
    assert!(rows.iter().all(|r| r.status == 200));
}

/// The bytes of bodies being received are charged as they arrive, all bodies together: one that
/// would take them over `client_body_buffer_mib` is 503 busy, and what a body held is given back
/// when its request ends.
#[test]
fn bodies_over_the_buffer_budget_are_503_busy_issue_24() {
    let h = Harness::start(vec![host("titan", 1)], "client_body_buffer_mib = 1");
    let head = |n: usize| {
        format!("POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {n}\r\n\r\n")
    };
    let part = vec![b' '; 600_000];
    let mut first = Conn::open(h.addr());
    first
        .reader
        .get_mut()
        .write_all(head(900_000).as_bytes())
        .unwrap();
    first.reader.get_mut().write_all(&part).unwrap();
    wait_until("the first body holds its bytes", || {
        h.server().client_connections().body_bytes >= 600_000
    });
    let mut second = Conn::open(h.addr());
    second
        .reader
        .get_mut()
        .write_all(head(900_000).as_bytes())
        .unwrap();
    let _ = second.reader.get_mut().write_all(&part);
    let answer = second.read_answer();
    check_error(&answer, 503, "busy");
    assert_eq!(answer.header("Retry-After"), Some("1"));
    assert!(answer.error()["message"]
        .as_str()
        .unwrap()
        .contains("client_body_buffer_mib"));
    // The first one finishes (a valid body: spaces, then the chat) and gives its bytes back.
    let tail = chat("after the spaces", 0, false).to_string();
    let pad = vec![b' '; 900_000 - 600_000 - tail.len()];
    first.reader.get_mut().write_all(&pad).unwrap();
    first.reader.get_mut().write_all(tail.as_bytes()).unwrap();
    assert_eq!(first.read_answer().status, 200);
    wait_until("every byte is given back", || {
        h.server().client_connections().body_bytes == 0
    });
    check_served_promptly(&h);
}

/// A client that closes its connection inside its body left: its row says 499, as for a client
/// that leaves while queued, not a 400 for a body it never finished.
#[test]
fn a_client_that_leaves_inside_its_body_is_a_499_issue_24() {
    let h = Harness::start(vec![host("titan", 1)], "");
    let mut conn = Conn::open(h.addr());
    let whole = post_head(CHAT, "", &chat("never finished", 0, false).to_string());
    conn.reader
        .get_mut()
        .write_all(&whole.as_bytes()[..whole.len() - 10])
        .unwrap();
    wait_until("the body is awaited off the workers", || {
        h.server().client_connections().bodies_off_workers == 1
    });
    drop(conn);
    wait_until("the request is recorded", || h.rows().len() == 1);
    let row = &h.rows()[0];
    assert_eq!(row.status, 499, "{row:?}");
    assert!(row.err.contains("client gone"), "{}", row.err);
    assert_eq!(h.server().client_connections().reading_body, 0);
    let forwarded = h.sim("titan").requests();
    assert!(
        forwarded.iter().all(|r| r.method != "POST"),
        "nothing was forwarded"
    );
}
