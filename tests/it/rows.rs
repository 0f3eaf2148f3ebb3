//! Seed 001's promise under load (issue 26): a client that has the whole answer finds its row in
//! the db — with one client, and with 64 at once, when the store commits rows together and waits
//! for rows on their way. Each client has its own key, so its rows are the ones naming it.
//! Under load an answer's end is sent by the thread that commits its row (`conn::Tail`): clients
//! that pipeline get every answer whole and in order all the same, and refusals keep the promise.

use std::sync::{Arc, Barrier};

use crossbar::store::Reader;

use crate::support::{chat, host, Answer, Conn, Harness};

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

/// Client `i`'s key name, its `Authorization` value and its connection, opened before the start
/// that all clients wait for together.
fn open(h: &Harness, i: usize, key: &str, start: &Barrier) -> (String, String, Conn) {
    let conn = Conn::open(h.addr());
    start.wait();
    (format!("k{i}"), format!("Bearer {key}"), conn)
}

/// Client `i`: `TURNS` answers on one connection (streamed for odd `i`), and after the last byte
/// of each, its rows counted in the db through a connection of its own, as a `sqlite3` shell's.
fn client(h: &Harness, db: &Reader, i: usize, key: &str, start: &Barrier) {
    let (name, auth, mut conn) = open(h, i, key, start);
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
        let what = format!("client {i} had the whole answer of turn {turn} before its row");
        assert_eq!(answered(db, &name), turn, "{what} was in the db");
    }
}

/// The answered rows of the client whose key is named `name`.
fn answered(db: &Reader, name: &str) -> usize {
    rows_of(db, name, 200)
}

/// The rows with `status` of the client whose key is named `name`.
fn rows_of(db: &Reader, name: &str, status: u16) -> usize {
    let rows = db.requests_since(0, None).unwrap();
    rows.iter()
        .filter(|r| r.key == name && r.status == status)
        .count()
}

/// Client `i`: `TURNS` bodies that are not JSON on one kept connection, each refused with a 400
/// whose row is in the db when the refusal has arrived (refusals, too, are sent by whoever
/// commits their row). A refusal sent a few microseconds before its commit would still pass
/// here, as the client's look at the db comes later: that order is the writer's, shown by
/// `store::writer::tests` (what follows a commit finds its row in the db); this shows every
/// refusal recorded, at once and under load, on a connection kept between them.
fn refused(h: &Harness, db: &Reader, i: usize, key: &str, start: &Barrier) {
    let (name, auth, mut conn) = open(h, i, key, start);
    for turn in 1..=TURNS {
        conn.send("POST", CHAT, &[("Authorization", &auth)], b"{not json");
        let answer = conn.read_answer();
        assert_eq!(
            answer.status,
            400,
            "client {i} turn {turn}: {}",
            answer.text()
        );
        let what = format!("client {i} had refusal {turn} before its row");
        assert_eq!(rows_of(db, &name, 400), turn, "{what} was in the db");
    }
}

/// Client `i`, pipelining: a whole answer, a streamed one and a listing sent in one go, then
/// read back in order, the three rows in the db once the last byte is in.
fn pipelining(h: &Harness, db: &Reader, i: usize, key: &str, start: &Barrier) {
    let (name, auth, mut conn) = open(h, i, key, start);
    let whole = chat(&format!("client {i} pipelines"), 0, false).to_string();
    let streamed = chat(&format!("client {i} pipelines"), 1, true).to_string();
    let auth = [("Authorization", auth.as_str())];
    conn.send("POST", CHAT, &auth, whole.as_bytes());
    conn.send("POST", CHAT, &auth, streamed.as_bytes());
    conn.send("GET", "/projA/v1/models", &auth, b"");
    // In the order sent, each whole: a chat completion, a stream to its end, the listing.
    let looks: [fn(&Answer) -> bool; 3] = [
        |a| a.json()["choices"].is_array(),
        |a| a.text().contains("data: [DONE]"),
        |a| a.json()["data"].is_array(),
    ];
    for (n, looks) in looks.iter().enumerate() {
        let answer = conn.read_answer();
        let ok = answer.status == 200 && looks(&answer);
        assert!(ok, "client {i} answer {n}: {}", answer.text());
    }
    let what = format!("client {i}: every row in before the last byte");
    assert_eq!(answered(db, &name), 3, "{what}");
}

#[track_caller]
fn check(clients: usize) {
    check_with(clients, client, TURNS);
}

#[track_caller]
fn check_with(
    clients: usize,
    each: fn(&Harness, &Reader, usize, &str, &Barrier),
    rows_each: usize,
) {
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
            s.spawn(move || each(h, &h.db(), i, key, &start));
        }
    });
    assert_eq!(h.rows().len(), clients * rows_each);
}

#[test]
fn issue26_one_client_finds_its_row_when_it_has_the_last_byte() {
    check(1);
}

#[test]
fn issue26_sixty_four_clients_at_once_find_their_rows_when_they_have_the_last_byte() {
    check(64);
}

#[test]
fn issue26_thirty_two_clients_refused_at_once_find_each_refusals_row_when_they_have_it() {
    check_with(32, refused, TURNS);
}

#[test]
fn issue26_thirty_two_clients_pipelining_get_every_answer_whole_and_in_order() {
    check_with(32, pipelining, 3);
}
