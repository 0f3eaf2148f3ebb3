//! The answer's end sent by the committer: whole when the socket takes it, the rest finished by
//! the worker, and never a committer held by a client that stops reading.

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::{State, Tail};

/// (the server's side of a connection, the client's). As the connection layer sets every
/// accepted socket up, a write timeout bounds each `send` (5 s unless a test sets its own).
fn pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (server, _) = listener.accept().unwrap();
    server
        .set_write_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    (server, client)
}

/// An end far larger than what two fresh loopback sockets buffer.
fn large() -> Vec<u8> {
    (0..16usize << 20).map(|i| (i % 251) as u8).collect()
}

/// A tail on `server`, whose write timeout becomes `write_timeout`.
fn tail(end: Vec<u8>, server: &TcpStream, write_timeout: Duration) -> Tail {
    server.set_write_timeout(Some(write_timeout)).unwrap();
    let second = Arc::new(server.try_clone().unwrap());
    Tail::new(end, Some(second), write_timeout)
}

/// An end (`end`) whose commit never comes: the worker stops waiting after `wait`.
fn stuck(server: &TcpStream, wait: Duration) -> Tail {
    let second = Arc::new(server.try_clone().unwrap());
    Tail::waiting(b"end".to_vec(), Some(second), Duration::from_secs(5), wait)
}

fn read_all(mut client: TcpStream, n: usize) -> thread::JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut got = vec![0; n];
        client.read_exact(&mut got).unwrap();
        got
    })
}

#[test]
fn issue26_the_end_waits_for_its_row_then_the_committer_sends_it_whole() {
    let (server, client) = pair();
    let tail = tail(b"0\r\n\r\n".to_vec(), &server, Duration::from_secs(5));
    assert_eq!(
        tail.try_settle(&server),
        None,
        "held until its row is committed"
    );
    tail.send();
    assert_eq!(tail.try_settle(&server), Some(true));
    assert_eq!(read_all(client, 5).join().unwrap(), b"0\r\n\r\n");
    // Sent once: a second send (or a late look) writes nothing more.
    tail.send();
    assert_eq!(tail.try_settle(&server), Some(true));
}

#[test]
fn issue26_a_client_that_stops_reading_never_holds_the_committer() {
    let (server, _client) = pair();
    let timeout = Duration::from_millis(200);
    let tail = tail(large(), &server, timeout);
    let started = Instant::now();
    tail.send();
    // The committer's thread took what the socket would and went back to committing.
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(matches!(*tail.state.lock(), State::Rest(_)));
    // The worker's write of the rest is bounded by the client's write timeout.
    let started = Instant::now();
    assert!(
        !tail.settle(&server),
        "a client that reads nothing cannot get the end"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn issue26_what_the_socket_could_not_take_at_once_the_worker_writes() {
    let (server, client) = pair();
    let end = large();
    let tail = tail(end.clone(), &server, Duration::from_secs(10));
    tail.send();
    assert!(matches!(*tail.state.lock(), State::Rest(_)));
    // The client reads from now on: the worker finishes the end, every byte once and in order.
    let reader = read_all(client, end.len());
    assert!(tail.settle(&server));
    assert!(reader.join().unwrap() == end);
}

#[test]
fn issue26_without_a_second_handle_on_the_socket_the_worker_sends_the_end() {
    let (server, client) = pair();
    let tail = Tail::new(b"end".to_vec(), None, Duration::from_secs(5));
    tail.send();
    assert_eq!(tail.try_settle(&server), Some(true));
    assert_eq!(read_all(client, 3).join().unwrap(), b"end");
}

#[test]
fn issue26_a_commit_that_never_comes_holds_the_end_no_longer_than_the_store_would() {
    let (server, client) = pair();
    let wait = Duration::from_millis(100);
    let tail = stuck(&server, wait);
    let started = Instant::now();
    assert!(tail.settle(&server), "the worker sends it itself");
    assert!(started.elapsed() >= wait);
    // The commit's late send finds nothing to send.
    tail.send();
    drop(server);
    drop(tail);
    let mut got = Vec::new();
    let mut client = client;
    client.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"end");
}

#[test]
fn issue26_a_client_gone_is_a_connection_that_goes_no_further() {
    let (server, client) = pair();
    drop(client);
    let tail = tail(vec![b'x'; 1 << 20], &server, Duration::from_secs(5));
    // The first send may land in the socket before the reset is known; the client's reset
    // fails a later one, or the worker's write of the rest.
    tail.send();
    let ok = tail.settle(&server);
    assert!(!ok, "an end to a closed client cannot go out whole");
}

#[test]
fn issue26_the_workers_look_past_the_wait_sends_an_end_whose_commit_is_stuck() {
    let (server, client) = pair();
    let tail = stuck(&server, Duration::from_millis(50));
    assert_eq!(tail.try_settle(&server), None, "the commit still has time");
    // The worker looks every 2 ms while a client waits for the end: once the wait is over, a
    // look sends it (a hung disk does not keep the client waiting past the store's bound).
    let mut settled = None;
    crate::testwait::until("the end goes out", || {
        settled = tail.try_settle(&server);
        settled.is_some()
    });
    assert_eq!(settled, Some(true));
    assert_eq!(read_all(client, 3).join().unwrap(), b"end");
    tail.send();
    assert_eq!(
        tail.try_settle(&server),
        Some(true),
        "the late commit sends nothing more"
    );
}
