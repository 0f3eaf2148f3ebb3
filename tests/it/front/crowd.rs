//! One stranger against everyone else: a client that dribbles request heads (slowloris), opens
//! hundreds of silent connections, or fills the accept queue must not stop service for the others.
//! The attacker connects from 127.0.0.2 (still loopback), the victim from 127.0.0.1, so the victim
//! is another peer as it would be on a LAN. Each test: the attack, then a normal request from the
//! victim served promptly.

use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::{check_error, post_head, refused, CHAT};
use crate::support::{chat, hold_slot, host, wait_until, Conn, Harness};

/// Where the attacker connects from.
const STRANGER: [u8; 4] = [127, 0, 0, 2];

/// A connection to `addr` from `STRANGER`.
fn stranger(addr: SocketAddr) -> Conn {
    connect_from(STRANGER, addr)
}

pub(super) use crate::support::connect_from;

/// A normal chat turn from 127.0.0.1 is answered 200 within a second.
#[track_caller]
pub(super) fn check_served_promptly(h: &Harness) {
    let started = Instant::now();
    let answer = h.post(CHAT, &chat("still there?", 0, false));
    let took = started.elapsed();
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert!(took < Duration::from_secs(1), "served after {took:?}");
}

/// Before: each partial head held a worker until `client_header_timeout`, so `workers` dribbling
/// connections stopped all service for that long, again and again.
#[test]
fn a_slowloris_dribbling_heads_holds_no_worker() {
    let extra = "workers = 2\nclient_header_timeout = \"8s\"";
    let h = Harness::start(vec![host("titan", 1)], extra);
    let mut slow: Vec<Conn> = (0..8).map(|_| stranger(h.addr())).collect();
    for conn in &mut slow {
        let stream = conn.reader.get_mut();
        stream
            .write_all(b"GET /projA/v1/models HTTP/1.1\r\nHost: x\r\n")
            .unwrap();
        stream.write_all(b"X").unwrap();
    }
    wait_until("every partial head is read off the workers", || {
        h.server().client_connections().reading_head == 8
    });
    // Another byte each, as a slowloris sends one a second: still no worker held.
    for conn in &mut slow {
        conn.reader.get_mut().write_all(b"-").unwrap();
    }
    check_served_promptly(&h);
    check_served_promptly(&h);
    // A head completed slowly is served like any other, from the bytes the poller collected.
    let done = &mut slow[3];
    done.reader.get_mut().write_all(b"A: 1\r\n\r\n").unwrap();
    let answer = done.read_answer();
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert!(answer.json()["data"].is_array(), "{}", answer.text());
    assert!(h.rows().iter().all(|r| r.status == 200));
    assert_eq!(refused(&h, "clients", "head_timeout"), 0);
}

/// Before: 2 workers held silent connections, 4 more filled the accept queue, and every other
/// connection — the victim's too — was refused `503 busy` while the stranger kept them open.
#[test]
fn hundreds_of_silent_connections_from_one_peer_are_capped_per_peer() {
    let extra = "workers = 2\naccept_queue = 4\nmax_connections_per_peer = 16";
    let h = Harness::start(vec![host("titan", 1)], extra);
    let mut crowd: Vec<Conn> = (0..150).map(|_| stranger(h.addr())).collect();
    wait_until("the connections over the cap are refused", || {
        refused(&h, "clients", "per_peer") == 134
    });
    assert_eq!(h.server().client_connections().open, 16);
    // The kernel hands connections over in the order they came: the first 16 are held.
    for conn in &mut crowd[16..] {
        let answer = conn.read_answer();
        check_error(&answer, 503, "busy");
        assert_eq!(answer.header("Retry-After"), Some("1"));
        assert_eq!(answer.header("Connection"), Some("close"));
    }
    check_served_promptly(&h);
    assert_eq!(refused(&h, "clients", "busy"), 0);
    // A connection given back makes room for the peer's next one, which is served.
    crowd.truncate(15);
    wait_until("the closed connections are given back", || {
        h.server().client_connections().open == 15
    });
    let mut next = stranger(h.addr());
    next.send("GET", "/projA/v1/models", &[], b"");
    assert_eq!(next.read_answer().status, 200);
    assert!(h.rows().iter().all(|r| r.status == 200));
}

/// Before: with the only worker busy, two silent connections filled the accept queue and the
/// victim's request was refused `503 busy`. Now a connection waits for its whole head off the queue
/// while others wait, so the queue holds only requests a worker can serve.
#[test]
fn a_peer_cannot_fill_the_accept_queue_with_silent_connections() {
    let h = Harness::start(vec![host("titan", 1)], "workers = 1\naccept_queue = 2");
    let sim = h.sim("titan");
    let mut streaming = hold_slot(&h, "titan");
    let silent: Vec<Conn> = (0..8).map(|_| stranger(h.addr())).collect();
    wait_until("the silent connections wait off the queue", || {
        h.server().client_connections().idle == 7
    });
    let mut victim = h.open_chat(CHAT, &chat("victim", 0, false));
    wait_until("the victim is accepted", || {
        h.server().client_connections().open == 10
    });
    sim.set_lockstep(false);
    assert_eq!(streaming.read_answer().status, 200);
    let answer = victim.read_answer();
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(refused(&h, "clients", "busy"), 0);
    drop(silent);
    check_served_promptly(&h);
}

/// Before: a head sent whole and its body trickled held a worker until the body's deadline
/// (`client_body_timeout` plus its size at `client_body_min_rate`), so `workers` such requests from
/// one address stopped service for that long, again and again ("R-U-Dead-Yet"). Now one address
/// has at most `max_body_readers_per_peer` workers waiting for its bodies; a body sent with its
/// head is never counted.
#[test]
fn a_peer_trickling_request_bodies_holds_no_more_than_its_share_of_workers() {
    let extra = "workers = 4\nclient_body_timeout = \"8s\"\nmax_body_readers_per_peer = 2";
    let h = Harness::start(vec![host("titan", 1)], extra);
    let whole = post_head(CHAT, "", &chat("slow", 0, false).to_string());
    let (part, rest) = whole
        .as_bytes()
        .split_at(whole.find("\r\n\r\n").unwrap() + 4 + 10);
    let trickle = |n: usize| -> Vec<Conn> {
        (0..n)
            .map(|_| {
                let mut conn = stranger(h.addr());
                conn.reader.get_mut().write_all(part).unwrap();
                conn
            })
            .collect()
    };
    let mut slow = trickle(8);
    wait_until("the bodies over the cap are refused", || {
        refused(&h, "clients", "per_peer_bodies") == 6
    });
    assert_eq!(h.server().client_connections().reading_body, 2);
    check_served_promptly(&h);
    // The same address sending a body with its head is served: only waiting for one counts.
    let mut quick = stranger(h.addr());
    quick.reader.get_mut().write_all(whole.as_bytes()).unwrap();
    assert_eq!(quick.read_answer().status, 200);
    // The rest of every body: the two read are served, the six refused were told to retry.
    let mut statuses = Vec::new();
    for conn in &mut slow {
        let _ = conn.reader.get_mut().write_all(rest);
        let answer = conn.read_answer();
        if answer.status == 503 {
            check_error(&answer, 503, "busy");
            assert_eq!(answer.header("Retry-After"), Some("1"));
            assert_eq!(answer.header("Connection"), Some("close"));
        }
        statuses.push(answer.status);
    }
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 200, 503, 503, 503, 503, 503, 503]);
    // A client that leaves in the middle of its body gives its place back.
    let mut again = trickle(2);
    wait_until("two bodies are being read", || {
        h.server().client_connections().reading_body == 2
    });
    again.pop();
    wait_until("the gone client's place is given back", || {
        h.server().client_connections().reading_body == 1
    });
    let mut next = trickle(1).pop().unwrap();
    wait_until("the next body is read", || {
        h.server().client_connections().reading_body == 2
    });
    next.reader.get_mut().write_all(rest).unwrap();
    assert_eq!(next.read_answer().status, 200);
    assert_eq!(refused(&h, "clients", "per_peer_bodies"), 6);
}
