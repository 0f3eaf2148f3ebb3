//! Helpers for the tests that run the real `crossbar` binary as a child process: its stderr lines
//! on a channel, a wait for one of them, and free ports for its config.

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

/// Waits (up to 10 s) for a line of `log` containing `needle` and returns it; every line read
/// goes to `seen`, which a failure shows.
#[track_caller]
pub fn wait_line(
    log: &crossbeam_channel::Receiver<String>,
    seen: &mut Vec<String>,
    needle: &str,
) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match log.recv_deadline(deadline) {
            Ok(line) => {
                seen.push(line.clone());
                if line.contains(needle) {
                    return line;
                }
            }
            Err(_) => panic!(
                "no log line with {needle:?}; the log so far:\n{}",
                seen.join("\n")
            ),
        }
    }
}

/// A loopback port that was free a moment ago (for a child process, which needs fixed ones).
pub fn free_port() -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

/// A child's stderr lines on a channel, read by a thread that ends when the child closes stderr
/// (it exits or is killed) or the receiver is dropped.
pub fn stderr_lines(child: &mut std::process::Child) -> crossbeam_channel::Receiver<String> {
    let stderr = child.stderr.take().expect("the child's stderr is piped");
    let (tx, lines) = crossbeam_channel::unbounded();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    lines
}
