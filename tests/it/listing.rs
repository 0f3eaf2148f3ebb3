//! Issue 15 (review): a model listing crossbar renames (a host knowing a model by its `upstream`
//! name) is read whole before it is sent, so a host that trickles it must not hold the worker
//! for longer than one deadline for the whole listing.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::Duration;

use crossbar::config::Config;
use crossbar::server::Server;
use crossbeam_channel::{Receiver, RecvTimeoutError};

use crate::support::{request, temp_dir, Harness};

/// A host that answers polls well and trickles the listing a client asks for (marked by an
/// `X-Trickle` header) one byte per `pace`, under any per-read timeout, until `stop` is dropped.
fn trickling_host(stop: Receiver<()>, pace: Duration) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            let stop = stop.clone();
            thread::spawn(move || answer(conn, &stop, pace));
        }
    });
    addr
}

fn answer(conn: TcpStream, stop: &Receiver<()>, pace: Duration) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let (mut first, mut trickle) = (String::new(), false);
    reader.read_line(&mut first).unwrap_or(0);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        trickle |= line.to_ascii_lowercase().starts_with("x-trickle:");
    }
    let mut conn = conn;
    if trickle {
        let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{\"data\":[";
        if conn.write_all(head.as_bytes()).is_err() {
            return;
        }
        // The attack: a byte now and then, forever. Ends when the reader leaves or the test ends.
        while let Err(RecvTimeoutError::Timeout) = stop.recv_timeout(pace) {
            if conn.write_all(b" ").is_err() {
                return;
            }
        }
        return;
    }
    let body = match first.split(' ').nth(1).unwrap_or("") {
        "/health" => r#"{"status":"ok"}"#,
        "/props" => r#"{"default_generation_settings":{"n_ctx":4096},"total_slots":2}"#,
        "/v1/models" | "/models" => r#"{"object":"list","data":[{"id":"coder"}]}"#,
        _ => "{}",
    };
    let _ = write!(
        conn,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

#[test]
fn a_trickled_listing_ends_in_a_502_within_one_deadline_issue_15() {
    let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(0);
    // Each byte well inside the per-read timeout; the whole listing far outside it.
    let host = trickling_host(stop_rx, Duration::from_millis(40));
    let dir = temp_dir();
    let text = format!(
        "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ndb = {:?}\nworkers = 4\n\
         first_byte_timeout = \"400ms\"\n\
         [hosts.box]\nurl = \"http://{host}\"\n\
         [hosts.box.models.qwen]\nparallel = 1\nupstream = \"coder\"\n\
         [routes.projA]\nhosts = [\"box\"]\nmodel = \"qwen\"\n",
        dir.join("crossbar.db"),
    );
    let config = Config::from_toml(&text).unwrap_or_else(|e| panic!("{:#?}\n{text}", e.lines()));
    let h = Harness {
        server: Some(Server::start(config).unwrap()),
        sims: Vec::new(),
        dir,
    };
    // The conn helper gives up after 20 s: without a deadline the listing never ends.
    let answer = request(
        h.addr(),
        "GET",
        "/projA/v1/models",
        &[("X-Trickle", "1")],
        &[],
    );
    assert_eq!(answer.status, 502, "{}", answer.text());
    let row = h.rows().pop().unwrap();
    assert_eq!(row.status, 502);
    assert!(row.err.contains("model listing"), "{}", row.err);
    // One listing deadline (the first byte timeout here, 400 ms), not the 11 hours the trickle
    // would last; the bound is loose for a loaded machine.
    assert!(row.total_ms < 10_000, "{}", row.total_ms);
    drop(stop_tx);
}

/// Issue 48: through a route, a host's listing names models as the config does. A host started
/// with an alias of its own (or none: its model file's path) lists the route's model, and a chat
/// UI reading the list shows what a 404 would tell it to send.
#[test]
fn a_listing_through_a_route_shows_the_configured_names_issue_48() {
    let sim = crossbar::sim::SimConfig {
        alias: "upstream-qwen".into(),
        ..crossbar::sim::SimConfig::default()
    };
    let spec = crate::support::HostSpec {
        name: "titan",
        sim,
        parallel: 1,
        weight: 1,
        config: "",
    };
    let h = crate::support::Harness::start(vec![spec], "");
    let listing = h.get("/projA/v1/models");
    assert_eq!(listing.status, 200, "{}", listing.text());
    let ids: Vec<String> = (listing.json()["data"].as_array().unwrap().iter())
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, ["m"], "the route's model, not the host's own name");
    // And the name the listing shows is served.
    let answer = h.post(
        "/projA/v1/chat/completions",
        &crate::support::chat("hello", 0, false),
    );
    assert_eq!(answer.status, 200);
}
