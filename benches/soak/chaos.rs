//! The chaos thread: at seeded random moments it kills a host and revives it, hangs a host before
//! its first byte, breaks streams mid-way, reloads crossbar with a changed config (SIGHUP), drains
//! hosts and pins routes through the admin API, sends silent request bodies from nine addresses
//! (issue 24: they must cost sockets, not workers), and once SIGKILLs crossbar and restarts it —
//! faults overlap. It also samples crossbar's threads, fds, memory and WAL size twice a second.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::http;
use crate::ledger::{unix_ms, Run, Window};
use crate::procs::{count_lines, idle_level, sample, Crossbar, Sample, SimProc};

const HOSTS: [&str; 3] = ["a", "b", "c"];

/// What a fault needs undone, and when.
#[derive(Debug, Clone, Copy)]
enum Undo {
    Revive(usize),
    Clear(usize),
    Undrain(usize),
    Unpin,
}

/// What the chaos thread leaves behind for the checks.
#[derive(Debug, Default)]
pub struct Report {
    pub sighups: u32,
    pub host_kills: u32,
    pub hangs: u32,
    pub breaks: u32,
    pub drains: u32,
    pub pins: u32,
    pub releases: u32,
    /// Leases or pins not back (or not where their events say) after the restart.
    pub lease_losses: Vec<String>,
    pub leases_before_kill: usize,
    /// (unix ms of the SIGKILL) when it happened.
    pub kill_ms: Option<i64>,
    /// The current crossbar's idle threads and fds.
    pub idle: Sample,
    pub rss_max_kib: u64,
    /// The largest `crossbar.db-wal` seen.
    pub wal_max_bytes: u64,
    /// Rounds of silent bodies (9 addresses × 8 connections each).
    pub silent_rounds: u32,
    pub logs: Vec<PathBuf>,
    pub crashed: Option<String>,
}

pub struct Chaos {
    pub run: Arc<Run>,
    pub rng: fastrand::Rng,
    pub sims: Vec<SimProc>,
    pub crossbar: Crossbar,
    pub dir: PathBuf,
    pub write_config: Box<dyn Fn(u32) -> PathBuf + Send>,
    pub report: Report,
    pub kill_at: Option<Instant>,
    pub until: Instant,
    undo: Vec<(Instant, Undo, Option<usize>)>,
    faulted: [bool; 3],
    variant: u32,
    /// The threads holding silent bodies, joined before the checks.
    silent: Vec<std::thread::JoinHandle<()>>,
}

impl Chaos {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        run: Arc<Run>,
        seed: u64,
        sims: Vec<SimProc>,
        crossbar: Crossbar,
        dir: PathBuf,
        write_config: Box<dyn Fn(u32) -> PathBuf + Send>,
        idle: Sample,
        until: Instant,
        kill_at: Option<Instant>,
    ) -> Chaos {
        let report = Report {
            idle,
            logs: vec![dir.join("crossbar-1.log")],
            ..Report::default()
        };
        Chaos {
            run,
            rng: fastrand::Rng::with_seed(seed.wrapping_add(1)),
            sims,
            crossbar,
            dir,
            write_config,
            report,
            kill_at,
            until,
            undo: Vec::new(),
            faulted: [false; 3],
            variant: 0,
            silent: Vec::new(),
        }
    }

    /// Runs until `until`, then undoes every fault still in place.
    pub fn run(mut self) -> (Vec<SimProc>, Crossbar, Report) {
        let mut next = Instant::now() + Duration::from_secs(1);
        let mut next_sample = Instant::now();
        while Instant::now() < self.until {
            let now = Instant::now();
            if now >= next_sample {
                self.sample();
                next_sample = now + Duration::from_millis(500);
            }
            if let Some(why) = self.report.crashed.clone() {
                eprintln!("soak: crossbar died on its own: {why}");
                break;
            }
            self.undo_due(now);
            if self.kill_at.is_some_and(|k| now >= k) {
                self.kill_at = None;
                self.restart();
            } else if now >= next {
                self.act();
                next = now + Duration::from_millis(self.rng.u64(700..3000));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.undo_due(Instant::now() + Duration::from_secs(3600));
        for silent in self.silent.drain(..) {
            let _ = silent.join();
        }
        self.sample();
        (self.sims, self.crossbar, self.report)
    }

    fn sample(&mut self) {
        if self.crossbar.exited() {
            self.report.crashed = Some("the process exited".to_string());
            return;
        }
        if let Some(s) = sample(self.crossbar.pid) {
            self.report.rss_max_kib = self.report.rss_max_kib.max(s.hwm_kib).max(s.rss_kib);
            self.run
                .rss_kib
                .store(s.rss_kib, std::sync::atomic::Ordering::Relaxed);
        }
        if let Ok(wal) = std::fs::metadata(self.dir.join("crossbar.db-wal")) {
            self.report.wal_max_bytes = self.report.wal_max_bytes.max(wal.len());
        }
    }

    fn act(&mut self) {
        let free: Vec<usize> = (0..3).filter(|i| !self.faulted[*i]).collect();
        let busy = 3 - free.len();
        let host = free.get(self.rng.usize(0..free.len().max(1))).copied();
        let later = |rng: &mut fastrand::Rng, lo: u64, hi: u64| {
            Instant::now() + Duration::from_millis(rng.u64(lo..hi))
        };
        match (self.rng.u32(0..100), host) {
            (0..=14, Some(i)) if busy < 2 => {
                self.sims[i].kill();
                let w = self.open_window(i);
                self.faulted[i] = true;
                self.report.host_kills += 1;
                self.undo
                    .push((later(&mut self.rng, 2000, 6000), Undo::Revive(i), Some(w)));
            }
            (15..=29, Some(i)) if busy < 2 => {
                self.fault(i, "hang");
                let w = self.open_window(i);
                self.faulted[i] = true;
                self.report.hangs += 1;
                self.undo
                    .push((later(&mut self.rng, 1500, 6000), Undo::Clear(i), Some(w)));
            }
            (30..=44, Some(i)) if busy < 2 => {
                let kind = [
                    "die-mid-stream 2",
                    "cut-mid-chunk 3",
                    "end-early 2",
                    "cut-body 40",
                ];
                let kind = kind[self.rng.usize(0..kind.len())];
                self.fault(i, kind);
                let w = self.open_window(i);
                self.faulted[i] = true;
                self.report.breaks += 1;
                self.undo
                    .push((later(&mut self.rng, 500, 3000), Undo::Clear(i), Some(w)));
            }
            (45..=59, _) => {
                self.variant += 1;
                (self.write_config)(self.variant);
                self.crossbar.signal("-HUP");
                self.report.sighups += 1;
            }
            (60..=74, _) if !self.undo.iter().any(|u| matches!(u.1, Undo::Undrain(_))) => {
                let i = self.rng.usize(0..3);
                self.admin(
                    "/admin/drain",
                    &format!(r#"{{"host":"{}","on":true}}"#, HOSTS[i]),
                );
                self.report.drains += 1;
                self.undo
                    .push((later(&mut self.rng, 2000, 8000), Undo::Undrain(i), None));
            }
            (75..=89, _) if !self.undo.iter().any(|u| matches!(u.1, Undo::Unpin)) => {
                let i = self.rng.usize(0..3);
                self.admin(
                    "/admin/pin",
                    &format!(r#"{{"route":"beta","host":"{}"}}"#, HOSTS[i]),
                );
                self.report.pins += 1;
                self.undo
                    .push((later(&mut self.rng, 2000, 8000), Undo::Unpin, None));
            }
            (90..=94, _) => {
                self.admin("/admin/release", r#"{"route":"beta"}"#);
                self.report.releases += 1;
            }
            (95..=99, _) if self.silent.iter().all(|t| t.is_finished()) => {
                let (run, hold) = (self.run.clone(), self.rng.u64(500..3000));
                self.silent.retain(|t| !t.is_finished());
                self.silent
                    .push(std::thread::spawn(move || silent_bodies(&run, hold)));
                self.report.silent_rounds += 1;
            }
            _ => {}
        }
    }

    fn undo_due(&mut self, now: Instant) {
        let (due, rest): (Vec<_>, Vec<_>) = self.undo.drain(..).partition(|u| u.0 <= now);
        self.undo = rest;
        for (_, undo, window) in due {
            match undo {
                Undo::Revive(i) => {
                    if let Err(e) = self.sims[i].revive() {
                        eprintln!("soak: cannot revive host {}: {e}", HOSTS[i]);
                    }
                    self.faulted[i] = false;
                }
                Undo::Clear(i) => {
                    self.fault(i, "none");
                    self.faulted[i] = false;
                }
                Undo::Undrain(i) => {
                    self.admin(
                        "/admin/drain",
                        &format!(r#"{{"host":"{}","on":false}}"#, HOSTS[i]),
                    );
                }
                Undo::Unpin => self.admin("/admin/unpin", r#"{"route":"beta"}"#),
            }
            if let Some(w) = window {
                self.run.host_faults.lock()[w].end_ms = Some(unix_ms());
            }
        }
    }

    fn open_window(&self, i: usize) -> usize {
        let mut w = self.run.host_faults.lock();
        w.push(Window {
            host: HOSTS[i].to_string(),
            start_ms: unix_ms(),
            end_ms: None,
        });
        w.len() - 1
    }

    fn fault(&mut self, i: usize, what: &str) {
        if let Err(e) = self.sims[i].fault(what) {
            eprintln!("soak: fault {what} on host {}: {e}", HOSTS[i]);
        }
    }

    fn admin(&self, path: &str, body: &str) {
        match http::admin(self.run.admin(), "POST", path, Some(body)) {
            Ok((200, _)) => {}
            Ok((status, v)) => eprintln!("soak: admin {path} {body} -> {status} {v}"),
            Err(e) => eprintln!("soak: admin {path} {body}: {e}"),
        }
    }

    /// SIGKILL with requests in flight, then a restart on the same db: every lease and pin must
    /// come back, where the lease events written since the snapshot say (same host if none).
    fn restart(&mut self) {
        self.run.set_paused(true);
        // A reload still under way would die with the process and its log line with it: wait
        // (up to 5 s) until every SIGHUP sent so far is logged as done.
        let deadline = Instant::now() + Duration::from_secs(5);
        let reloaded = |logs: &[PathBuf]| {
            logs.iter()
                .map(|l| count_lines(l, "config reloaded"))
                .sum::<u64>()
        };
        while reloaded(&self.report.logs) < u64::from(self.report.sighups)
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        let last_event = http::admin(self.run.admin(), "GET", "/admin/events?limit=1", None)
            .ok()
            .and_then(|(_, v)| v["events"][0]["id"].as_i64())
            .unwrap_or(0);
        let before = leases(&self.run);
        self.sample();
        // The kill takes a moment (signal, exit, reap): a request that broke during it counts.
        let killing = Instant::now();
        self.crossbar.kill();
        let killed = Instant::now();
        self.report.kill_ms = Some(unix_ms());
        let log = self.dir.join("crossbar-2.log");
        self.report.logs.push(log.clone());
        let config = (self.write_config)(self.variant);
        self.crossbar = match Crossbar::start(&config, &log) {
            Ok(c) => c,
            Err(e) => {
                self.report.crashed = Some(format!("restart failed: {e}"));
                self.run.set_paused(false);
                return;
            }
        };
        *self.run.addrs.write() = (self.crossbar.client, self.crossbar.admin);
        let after = leases(&self.run);
        let moved = events_since(&self.run, last_event);
        match (before, after) {
            (Some((leases_b, pins_b)), Some((leases_a, pins_a))) => {
                self.report.leases_before_kill = leases_b.len();
                for (key, host) in &leases_b {
                    let want = moved.get(key).unwrap_or(host);
                    let got = leases_a.get(key).map_or("", String::as_str);
                    if got != want {
                        self.report
                            .lease_losses
                            .push(format!("lease {key:?}: {want:?} before, {got:?} after"));
                    }
                }
                if pins_a != pins_b {
                    self.report
                        .lease_losses
                        .push(format!("pins {pins_b:?} before, {pins_a:?} after"));
                }
            }
            _ => self
                .report
                .lease_losses
                .push("cannot read /admin/leases around the restart".into()),
        }
        self.report.idle = idle_level(self.crossbar.pid);
        *self.run.killed.lock() = Some((killing, killed));
        self.run.set_paused(false);
    }
}

type Leases = (
    BTreeMap<(String, String, String), String>,
    BTreeMap<String, String>,
);

/// `/admin/leases` as key → host, and the pins as route → host.
/// 72 requests from 127.0.0.2–10 (8 each) declaring a 1 MiB body on the `junk` route and sending
/// none of it (half of them wait for `100 Continue`), held `hold_ms` and then closed: each is a
/// client that left (499), unless crossbar refused it before routing.
fn silent_bodies(run: &Run, hold_ms: u64) {
    let start = Instant::now();
    let mut conns = Vec::new();
    for peer in 2..=10u8 {
        for i in 0..8 {
            let from = std::net::IpAddr::from([127, 0, 0, peer]);
            let Ok(mut conn) = http::Conn::open_from(run.client(), None, Some(from)) else {
                continue;
            };
            let expect = if i % 2 == 1 {
                "Expect: 100-continue\r\n"
            } else {
                ""
            };
            let head = format!(
                "POST /junk/v1/chat/completions HTTP/1.1\r\nHost: soak\r\n\
                 Content-Type: application/json\r\n{expect}{}Content-Length: 1048576\r\n\r\n",
                http::KEY_LINE
            );
            if conn.send(head.as_bytes()).is_ok() {
                conns.push(conn);
            }
        }
    }
    std::thread::sleep(Duration::from_millis(hold_ms));
    for mut conn in conns {
        // What came back meanwhile, if anything (`head` skips a `100 Continue`).
        conn.set_read_timeout(Duration::from_millis(20));
        let outcome = match conn.head() {
            Ok(Some(head)) => {
                let body = match conn.body(&head, None) {
                    http::Body::Complete(b) => b,
                    _ => Vec::new(),
                };
                let host = head.header("X-Crossbar-Host").map(str::to_string);
                crate::clients::answered(head.status, host, None, true, &body)
            }
            _ => crate::ledger::Outcome::Left,
        };
        drop(conn);
        run.record(crate::ledger::Sent {
            corr: crate::ledger::Corr::Route("junk"),
            turn: None,
            route: "junk:silent-body",
            start,
            end: Instant::now(),
            outcome,
        });
    }
}

fn leases(run: &Run) -> Option<Leases> {
    let (status, v) = http::admin(run.admin(), "GET", "/admin/leases", None).ok()?;
    if status != 200 {
        return None;
    }
    let s = |v: &serde_json::Value, k: &str| v[k].as_str().unwrap_or("").to_string();
    let leases = v["leases"].as_array()?.iter();
    let leases = leases.map(|l| ((s(l, "route"), s(l, "fp"), s(l, "model")), s(l, "host")));
    let pins = v["pins"]
        .as_array()?
        .iter()
        .map(|p| (s(p, "route"), s(p, "host")));
    Some((leases.collect(), pins.collect()))
}

/// Where each key's events after `last` put it (`""`: dropped).
fn events_since(run: &Run, last: i64) -> BTreeMap<(String, String, String), String> {
    let mut out = BTreeMap::new();
    let Ok((200, v)) = http::admin(run.admin(), "GET", "/admin/events?limit=10000", None) else {
        return out;
    };
    let mut list: Vec<&serde_json::Value> = v["events"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    list.retain(|e| e["id"].as_i64().unwrap_or(0) > last);
    list.sort_by_key(|e| e["id"].as_i64().unwrap_or(0));
    for e in list {
        let s = |k: &str| e[k].as_str().unwrap_or("").to_string();
        out.insert((s("route"), s("fp"), s("model")), s("to"));
    }
    out
}
