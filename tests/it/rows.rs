//! Seed 001's promise under load (issue 26): a client that has the whole answer finds its row in
//! the db — with one client, and with 64 at once, when the store commits rows together and waits
//! for rows on their way. Each client has its own key, so its rows are the ones naming it.

use std::sync::{Arc, Barrier};

use crossbar::store::Reader;

use crate::support::{chat, host, Conn, Harness};

const CHAT: &str = "/projA/v1/chat/completions";
const TURNS: usize = 3;

/// `clients` configured keys, `k0`..: (their lines for the config, the keys themselves).
fn keys(clients: usize) -> (String, Vec<String>) {
    let mut lines = String::new();
    let mut keys = Vec::new();
    for i in 0..clients {
        let (key, hash) = crossbar::keys::new_key().unwrap();
        lines.push_str(&format!("[keys.k{i}]\nhash = \"{hash}\"\n"));
        keys.push(key);
    }
    (lines, keys)
}

/// Client `i`: `TURNS` answers on one connection (streamed for odd `i`), and after the last byte
/// of each, its rows counted in the db through a connection of its own, as a `sqlite3` shell's.
fn client(h: &Harness, db: &Reader, i: usize, key: &str, start: &Barrier) {
    let name = format!("k{i}");
    let auth = format!("Bearer {key}");
    let mut conn = Conn::open(h.addr());
    start.wait();
    for turn in 1..=TURNS {
        let body = chat(&format!("client {i} says hello"), turn - 1, i % 2 == 1);
        let body = body.to_string();
        conn.send("POST", CHAT, &[("Authorization", &auth)], body.as_bytes());
        let answer = conn.read_answer();
        assert_eq!(
            answer.status,
            200,
            "client {i} turn {turn}: {}",
            answer.text()
        );
        let rows = db.requests_since(0, None).unwrap();
        let mine = rows.iter().filter(|r| r.key == name && r.status == 200);
        assert_eq!(
            mine.count(),
            turn,
            "client {i} had the whole answer of turn {turn} before its row was in the db"
        );
    }
}

#[track_caller]
fn check(clients: usize) {
    let (lines, keys) = keys(clients);
    // Every client is 127.0.0.1: the per-peer caps must hold them all.
    let extra = format!(
        "workers = {}\nmax_connections_per_peer = {}\nmax_body_readers_per_peer = {}\n{lines}",
        clients + 8,
        clients + 8,
        clients + 8
    );
    let h = Harness::start(vec![host("a", clients.max(2))], &extra);
    let start = Arc::new(Barrier::new(clients));
    std::thread::scope(|s| {
        for (i, key) in keys.iter().enumerate() {
            let (h, start) = (&h, start.clone());
            s.spawn(move || client(h, &h.db(), i, key, &start));
        }
    });
    assert_eq!(h.rows().len(), clients * TURNS);
}

#[test]
fn issue26_one_client_finds_its_row_when_it_has_the_last_byte() {
    check(1);
}

#[test]
fn issue26_sixty_four_clients_at_once_find_their_rows_when_they_have_the_last_byte() {
    check(64);
}
