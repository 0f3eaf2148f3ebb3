//! The `slow-body` line of `make bench` (issue 24): what the poller path costs. A body not whole
//! within 50 ms of its head is read off the workers and its request queued again once whole; this
//! measures, against the same request sent whole, the time from the body's last byte to the
//! answer's status line (1 client, sequential), and the poller's CPU while it holds 72 silent
//! bodies (9 addresses × 8), read from its thread's `/proc` times.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::conn::Conn;
use crate::figures::percentile;

const RUNS: usize = 60;
const CHAT_BODY: &str =
    r#"{"model":"m","messages":[{"role":"user","content":"a body sent slowly"}],"max_tokens":4}"#;

/// Runs the measurement against crossbar at `gw` (route `projA`, process `pid`), every request
/// with the client `key`, and returns the `slow-body` line.
pub fn run(gw: SocketAddr, key: &str, pid: u32) -> String {
    let head = format!(
        "POST /projA/v1/chat/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n\
         Authorization: Bearer {key}\r\nContent-Length: {}\r\n\r\n",
        CHAT_BODY.len()
    );
    let (mut whole, mut polled) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        whole.push(last_byte_to_answer(gw, &head, None));
        polled.push(last_byte_to_answer(
            gw,
            &head,
            Some(Duration::from_millis(70)),
        ));
    }
    let cpu = poller_cpu_with_silent_bodies(gw, key, pid);
    format!(
        "slow-body whole_p50_ms={:.3} whole_p99_ms={:.3} poller_p50_ms={:.3} poller_p99_ms={:.3} \
         poller_cpu_pct_holding_72={cpu:.2} (last body byte -> status line; {RUNS} runs each)",
        percentile(&mut whole, 50.0),
        percentile(&mut whole, 99.0),
        percentile(&mut polled, 50.0),
        percentile(&mut polled, 99.0),
    )
}

/// Sends `head` and the body (its last 8 bytes after `pause`, when given) on a fresh connection;
/// milliseconds from the last byte sent to the status line.
fn last_byte_to_answer(gw: SocketAddr, head: &str, pause: Option<Duration>) -> f64 {
    let mut conn = Conn::open(gw);
    let body = CHAT_BODY.as_bytes();
    let (first, last) = body.split_at(body.len() - 8);
    let mut msg = head.as_bytes().to_vec();
    msg.extend_from_slice(first);
    if let Some(pause) = pause {
        conn.stream().write_all(&msg).expect("send");
        std::thread::sleep(pause);
        msg.clear();
    }
    msg.extend_from_slice(last);
    conn.stream().write_all(&msg).expect("send");
    let sent = Instant::now();
    let status = conn.head().status;
    assert_eq!(status, 200, "slow-body answer");
    sent.elapsed().as_secs_f64() * 1000.0
}

/// Percent of one core the client listener's poller used over 2 s holding 72 silent bodies.
fn poller_cpu_with_silent_bodies(gw: SocketAddr, key: &str, pid: u32) -> f64 {
    let mut silent = Vec::new();
    for peer in 2..=10u8 {
        for _ in 0..8 {
            let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                .expect("socket");
            sock.bind(&SocketAddr::from(([127, 0, 0, peer], 0)).into())
                .expect("bind");
            sock.connect(&gw.into()).expect("connect");
            let mut sock: TcpStream = sock.into();
            let head = format!(
                "POST /projA/v1/chat/completions HTTP/1.1\r\nHost: bench\r\n\
                 Content-Type: application/json\r\nAuthorization: Bearer {key}\r\n\
                 Content-Length: 16777216\r\n\r\n"
            );
            sock.write_all(head.as_bytes()).expect("send");
            silent.push(sock);
        }
    }
    // Every body past its worker's 50 ms, then measured for 2 s.
    std::thread::sleep(Duration::from_millis(300));
    let before = poller_ticks(pid);
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    let ticks = poller_ticks(pid).saturating_sub(before);
    drop(silent);
    // Clock ticks are 1/100 s on Linux.
    ticks as f64 * 10.0 / started.elapsed().as_millis() as f64 * 100.0
}

/// utime + stime of crossbar's (`pid`) client listener's poller thread (`clients-idle`), in clock
/// ticks.
fn poller_ticks(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    for task in tasks.flatten() {
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        if !stat.contains("(clients-idle)") {
            continue;
        }
        let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let fields: Vec<&str> = after.split_whitespace().collect();
        let num = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        };
        // Fields 14 and 15 of stat (utime, stime) are 11 and 12 after the command's `)`.
        return num(11) + num(12);
    }
    0
}
