//! Hostile clients beside the faults (issue 46), each in a window of the run:
//! - a body filler from 127.0.0.20 under a key of its own (`filler`): whole bodies from
//!   eight connections at once to the junk route, one after another, as the attack that once
//!   held the body budget and had every other POST refused `503 busy` for minutes (512 KiB each:
//!   four waiting for a slot fill its share of `queue_body_mib`). Its requests are in the ledger
//!   (junk route), so their rows are checked with the rest;
//! - a refused-key flood from 127.0.0.21: four keep-alive connections sending wrong keys as fast
//!   as crossbar answers (401, then the guessing guard's 429), as the one that wrote 15–20k rows a
//!   second and filled a disk. Its answers must leave no row, only counts in `/metrics`.
//!
//! The figures: normal clients' latency (conversation turns answered whole) in each window and
//! outside both, and what each hostile client got.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::json;

use crate::http::{self, Body, Conn};
use crate::ledger::{Corr, Outcome, Run, Sent};

pub const FILLER_KEY: &str = "cb-filler-fedcba9876543210fedcba9876543210";
const FILLER_FROM: [u8; 4] = [127, 0, 0, 20];
const FLOOD_FROM: [u8; 4] = [127, 0, 0, 21];
const FILLERS: usize = 8;
const FLOODERS: usize = 4;
const FILLER_BODY: usize = 512 << 10;

/// When each hostile client runs: the filler over 10–35 % of the run, the flood over 65–90 %
/// (crossbar's SIGKILL comes between 40 and 60 %).
#[derive(Debug, Clone, Copy)]
pub struct Windows {
    pub filler: (Instant, Instant),
    pub flood: (Instant, Instant),
}

impl Windows {
    pub fn of(start: Instant, secs: u64) -> Windows {
        let at = |share: f64| start + Duration::from_secs_f64(secs as f64 * share);
        Windows {
            filler: (at(0.10), at(0.35)),
            flood: (at(0.65), at(0.90)),
        }
    }
}

/// What the hostile clients got, by status (0: no answer; the filler's with the bound a
/// refusal named).
#[derive(Debug, Default)]
pub struct Tally {
    pub filler: Mutex<BTreeMap<String, u64>>,
    pub flood: Mutex<BTreeMap<u16, u64>>,
    pub flood_sent: AtomicU64,
}

/// Starts the hostile clients; each waits for its window and stops at its end or the run's.
pub fn start(run: &Arc<Run>, windows: Windows, tally: &Arc<Tally>) -> Vec<JoinHandle<()>> {
    type Client = fn(&Run, (Instant, Instant), &Tally, usize);
    let kinds: [(&str, usize, (Instant, Instant), Client); 2] = [
        ("filler", FILLERS, windows.filler, filler),
        ("flood", FLOODERS, windows.flood, flood),
    ];
    let mut threads = Vec::new();
    for (kind, count, window, client) in kinds {
        for i in 0..count {
            let (run, tally) = (run.clone(), tally.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("{kind}-{i}"))
                .spawn(move || client(&run, window, &tally, i));
            threads.push(spawned.expect("spawn a hostile client"));
        }
    }
    threads
}

/// Sleeps until `at`, or until the run stops; false when it stopped.
fn until(run: &Run, at: Instant) -> bool {
    while Instant::now() < at {
        if run.stopping() {
            return false;
        }
        std::thread::sleep((at - Instant::now()).min(Duration::from_millis(200)));
    }
    !run.stopping()
}

fn filler(run: &Run, (from, to): (Instant, Instant), tally: &Tally, i: usize) {
    if !until(run, from) {
        return;
    }
    while Instant::now() < to && !run.stopping() {
        run.wait_unpaused();
        let pad = "f".repeat(FILLER_BODY);
        // One conversation per connection: the bodies are the attack, not new leases (those
        // are bounded per client on their own, `max_leases_per_client`).
        let body = json!({"messages": [{"role": "user", "content": format!("filler {i}")}],
                          "max_tokens": 4, "pad": pad});
        let key = ("Authorization", format!("Bearer {FILLER_KEY}"));
        let request = http::post(
            "/junk/v1/chat/completions",
            "soak",
            &[key],
            body.to_string().as_bytes(),
        );
        let start = Instant::now();
        let mut bound = String::new();
        let outcome = match Conn::open_from(run.client(), None, Some(IpAddr::from(FILLER_FROM))) {
            Err(_) => Outcome::NoConnection,
            Ok(mut conn) => {
                // An answer before the whole body went (a refusal) still counts.
                let _ = conn.send(&request);
                match conn.head() {
                    Ok(Some(head)) => {
                        let (complete, bytes) = match conn.body(&head, None) {
                            Body::Complete(b) => (true, b),
                            _ => (false, Vec::new()),
                        };
                        let host = head.header("X-Crossbar-Host").map(str::to_string);
                        // A refusal for what waits names the bound it met.
                        let answer = serde_json::from_slice::<serde_json::Value>(&bytes);
                        if let Some(b) = answer
                            .ok()
                            .and_then(|v| v["error"]["bound"].as_str().map(str::to_string))
                        {
                            bound = format!(" {b}");
                        }
                        crate::clients::answered(head.status, host, None, complete, &bytes)
                    }
                    _ => Outcome::Unanswered,
                }
            }
        };
        let status = match &outcome {
            Outcome::Answered { status, .. } => *status,
            _ => 0,
        };
        *tally
            .filler
            .lock()
            .entry(format!("{status}{bound}"))
            .or_default() += 1;
        run.record(Sent {
            corr: Corr::Route("junk"),
            turn: None,
            route: "hostile:filler",
            start,
            end: Instant::now(),
            outcome,
        });
    }
}

fn flood(run: &Run, (from, to): (Instant, Instant), tally: &Tally, i: usize) {
    if !until(run, from) {
        return;
    }
    let mut conn: Option<Conn> = None;
    let mut n = 0u64;
    while Instant::now() < to && !run.stopping() {
        run.wait_unpaused();
        let mut c = match conn.take() {
            Some(c) => c,
            None => match Conn::open_from(run.client(), None, Some(IpAddr::from(FLOOD_FROM))) {
                Ok(c) => c,
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            },
        };
        n += 1;
        let path = ["/alpha/v1/models", "/nope/v1/chat/completions"][(n % 2) as usize];
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: soak\r\nAuthorization: Bearer cb-guess-{i}-{n}\r\n\r\n"
        );
        tally.flood_sent.fetch_add(1, Ordering::Relaxed);
        let status = match c.send(request.as_bytes()).and_then(|()| c.head()) {
            Ok(Some(head)) => {
                let complete = matches!(c.body(&head, None), Body::Complete(_));
                if complete && c.reusable(&head) {
                    conn = Some(c);
                }
                head.status
            }
            _ => 0,
        };
        *tally.flood.lock().entry(status).or_default() += 1;
    }
}

/// Normal clients' latency — conversation turns answered 200 and whole, from send to last byte
/// — by when they started: in the filler's window, in the flood's, and outside both; all of them,
/// and those whose host had no fault meanwhile (the chaos's kills and hangs dominate the tail).
pub fn latency(ledger: &[Sent], windows: &Windows, run: &Run) -> Vec<String> {
    let mut phases: BTreeMap<(&str, bool), Vec<u128>> = BTreeMap::new();
    for s in ledger {
        let Outcome::Answered {
            status: 200,
            complete: true,
            host,
            ..
        } = &s.outcome
        else {
            continue;
        };
        if !matches!(s.corr, Corr::Fp(_)) {
            continue;
        }
        let within = |(from, to): (Instant, Instant)| s.start >= from && s.start < to;
        let phase = if within(windows.filler) {
            "during the body filler"
        } else if within(windows.flood) {
            "during the refused-key flood"
        } else {
            "without them"
        };
        let ms = s.end.duration_since(s.start).as_millis();
        let (to, from) = (crate::ledger::unix_ms(), s.end.elapsed().as_millis() as i64);
        let end_ms = to - from;
        let start_ms = end_ms - ms as i64;
        let faulted = host
            .as_deref()
            .is_some_and(|h| run.host_faulted(h, start_ms, end_ms));
        phases.entry((phase, false)).or_default().push(ms);
        if !faulted {
            phases.entry((phase, true)).or_default().push(ms);
        }
    }
    (phases.into_iter())
        .map(|((phase, healthy), mut ms)| {
            ms.sort_unstable();
            let at = |q: f64| ms[((ms.len() - 1) as f64 * q) as usize];
            let which = if healthy {
                ", hosts without faults"
            } else {
                ""
            };
            format!(
                "latency {phase}{which}: turns={} p50={}ms p90={}ms p95={}ms p99={}ms max={}ms",
                ms.len(),
                at(0.5),
                at(0.9),
                at(0.95),
                at(0.99),
                ms[ms.len() - 1]
            )
        })
        .collect()
}
