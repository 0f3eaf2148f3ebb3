//! `make soak` (issue 14): the real `crossbar serve` against three `crossbar-sim` processes on
//! loopback for `SOAK_S` seconds (default 600), with 64 clients and every fault crossbar handles
//! happening at random and at once (see `clients` and `chaos`), two hostile clients in windows of
//! their own (`hostile`: a body filler, a refused-key flood; issue 46), then one line per check
//! and the summary line; exit 0 only when every check passes. Every client sends a key.
//!
//! Seeded (`SOAK_SEED`, default 14): the same seed gives the same client plans and fault schedule;
//! the interleaving is the machine's. `SOAK_EXTRA_TOML` is appended to the top of crossbar's config
//! (e.g. `max_leases = 500`), and `SOAK_STALL_MS` (default 10000) is how long a stalled client reads
//! nothing (0.5× to 1.5× of it; `client_write_timeout` is 2 s, so some stalls are cut by crossbar
//! and some end with the client closing), so the soak can be pointed at newer behaviour without edits.
//! Ports are the OS's (`127.0.0.1:0`, read back from the processes); db, config and logs live in a
//! temp dir, removed when the soak passes and kept (and printed) when it fails.

mod chaos;
mod checks;
mod clients;
mod hostile;
mod http;
mod ledger;
mod moves;
mod procs;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::Digest;

use chaos::Chaos;
use clients::Client;
use ledger::Run;
use procs::{count_lines, idle_level, sample, Crossbar, SimProc};

const CLIENTS: u64 = 64;
const RSS_LIMIT_MIB: f64 = 64.0;
/// `store::WAL_LIMIT` (64 MiB) plus what 200 ms of commits may add before the checkpoint resets it.
const WAL_LIMIT_MIB: f64 = 72.0;
/// Idle threads and fds may differ by this much after the load.
const SLACK: usize = 4;

fn main() {
    // `cargo test --all-targets` (the gate) runs this target without `--bench`: skip there.
    if !std::env::args().any(|a| a == "--bench") {
        println!("soak: skipped (run `make soak`)");
        return;
    }
    let secs: u64 = env_num("SOAK_S", 600);
    let seed: u64 = env_num("SOAK_SEED", 14);
    let stall = Duration::from_millis(env_num("SOAK_STALL_MS", 10000));
    let extra = std::env::var("SOAK_EXTRA_TOML").unwrap_or_default();
    let dir = procs::temp_dir(seed);
    println!(
        "soak: {secs} s, seed {seed}, {CLIENTS} clients, 3 crossbar-sim hosts, dir {}",
        dir.display()
    );

    let sims: Vec<SimProc> = ["a", "b", "c"]
        .iter()
        .map(|n| SimProc::start(n).unwrap_or_else(|e| fail(&dir, &format!("sim {n}: {e}"))))
        .collect();
    let urls: Vec<String> = sims.iter().map(SimProc::url).collect();
    let config_dir = dir.clone();
    let write_config = move |variant: u32| config(&config_dir, &urls, variant, &extra);
    let config_path = write_config(0);
    let crossbar = Crossbar::start(&config_path, &dir.join("crossbar-1.log"))
        .unwrap_or_else(|e| fail(&dir, &format!("crossbar: {e}")));
    let run = Arc::new(Run::new(crossbar.client, crossbar.admin));
    wait_healthy(&run);
    let idle = idle_level(crossbar.pid);
    println!(
        "crossbar pid {} clients={} admin={} idle threads={} fds={}",
        crossbar.pid, crossbar.client, crossbar.admin, idle.threads, idle.fds
    );

    let start = Instant::now();
    let until = start + Duration::from_secs(secs);
    let mut rng = fastrand::Rng::with_seed(seed);
    let kill_at = (secs >= 20)
        .then(|| start + Duration::from_secs_f64(secs as f64 * (0.4 + 0.2 * rng.f64())));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let client = Client::new(run.clone(), i, seed, stall);
            std::thread::Builder::new()
                .name(format!("client-{i}"))
                .spawn(move || client.run())
                .expect("spawn a client")
        })
        .collect();
    let windows = hostile::Windows::of(start, secs);
    let tally = Arc::new(hostile::Tally::default());
    let hostile = match env_num("SOAK_HOSTILE", 1) {
        0 => Vec::new(),
        _ => hostile::start(&run, windows, &tally),
    };
    let chaos = Chaos::new(
        run.clone(),
        seed,
        sims,
        crossbar,
        dir.clone(),
        Box::new(write_config),
        idle,
        until,
        kill_at,
    );
    let chaos = std::thread::spawn(move || chaos.run());
    let mut next_progress = start + Duration::from_secs(30);
    while !chaos.is_finished() {
        std::thread::sleep(Duration::from_millis(200));
        if Instant::now() >= next_progress {
            next_progress += Duration::from_secs(30);
            let killed = run.killed.lock().is_some();
            println!(
                "t={}s requests={} killed_once={killed} rss_mib={:.1}",
                start.elapsed().as_secs(),
                run.sent.load(Ordering::Relaxed),
                run.rss_kib.load(Ordering::Relaxed) as f64 / 1024.0
            );
        }
    }
    let (_sims, mut crossbar, report) = chaos.join().expect("the chaos thread");
    run.stop.store(true, Ordering::SeqCst);
    run.set_paused(false);
    for c in clients.into_iter().chain(hostile) {
        let _ = c.join();
    }
    let load_stopped = Instant::now();
    let seconds = start.elapsed().as_secs();
    println!(
        "load stopped after {seconds} s: sighups={} host_kills={} hangs={} breaks={} drains={} pins={} releases={} crossbar_sigkills={}",
        report.sighups, report.host_kills, report.hangs, report.breaks, report.drains, report.pins, report.releases,
        u8::from(report.kill_ms.is_some())
    );
    let mut failed = false;
    if let Some(why) = &report.crashed {
        println!("check alive: crossbar {why} -> FAIL");
        failed = true;
    }

    // No slot leaks: every host+model idle within 5 s.
    let mut leaked_slots = u64::MAX;
    while leaked_slots > 0 && load_stopped.elapsed() < Duration::from_secs(5) {
        if let Ok((200, status)) = http::admin(run.admin(), "GET", "/admin/status", None) {
            leaked_slots = checks::slots(&status);
        }
        if leaked_slots > 0 {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    println!(
        "check slots: in_flight+queued={leaked_slots} 5 s after the load -> {}",
        verdict(leaked_slots == 0)
    );

    // Threads and fds back to the idle level (within SLACK) within 10 s.
    let idle = report.idle;
    let mut now = sample(crossbar.pid).unwrap_or_default();
    while load_stopped.elapsed() < Duration::from_secs(10)
        && (now.threads > idle.threads + SLACK || now.fds > idle.fds + SLACK)
    {
        std::thread::sleep(Duration::from_millis(200));
        now = sample(crossbar.pid).unwrap_or_default();
    }
    let leaked_threads = now.threads.saturating_sub(idle.threads + SLACK);
    let leaked_fds = now.fds.saturating_sub(idle.fds + SLACK);
    println!(
        "check threads: idle={} now={} -> {}",
        idle.threads,
        now.threads,
        verdict(leaked_threads == 0)
    );
    println!(
        "check fds: idle={} now={} -> {}",
        idle.fds,
        now.fds,
        verdict(leaked_fds == 0)
    );

    let rss_max_kib = report.rss_max_kib.max(now.hwm_kib).max(now.rss_kib);
    let rss_max_mib = rss_max_kib as f64 / 1024.0;
    println!(
        "check rss: max={rss_max_mib:.1} MiB (VmHWM, both processes) limit={RSS_LIMIT_MIB} -> {}",
        verdict(rss_max_mib < RSS_LIMIT_MIB)
    );

    // Issue 24: the WAL stays under the store's bound (plus what 200 ms of commits add).
    let wal_mib = report.wal_max_bytes as f64 / (1 << 20) as f64;
    let wal_ok = wal_mib <= WAL_LIMIT_MIB;
    println!(
        "check wal: max={wal_mib:.1} MiB limit={WAL_LIMIT_MIB} -> {}",
        verdict(wal_ok)
    );
    failed |= !wal_ok;
    println!(
        "check silent bodies: rounds={} of 72 from 9 addresses (their rows are checked with the rest)",
        report.silent_rounds
    );

    let metrics = http::metrics(run.admin()).unwrap_or_default();
    let (rows, events) = checks::load(&dir.join("crossbar.db"))
        .unwrap_or_else(|e| fail(&dir, &format!("read the db: {e}")));
    let ledger = run.ledger.lock().clone();
    let (mut rows_missing, mut rows_extra, line) = checks::rows(&ledger, &rows, &run);
    println!(
        "{line} -> {}",
        verdict(rows_missing == 0 && rows_extra == 0)
    );
    let (over, under, line) = checks::metrics(&metrics, &rows, report.kill_ms.unwrap_or(0));
    println!("{line}");
    rows_missing += over;
    rows_extra += under;

    for line in hostile::latency(&ledger, &windows, &run) {
        println!("{line}");
    }
    // The flood's answers keep no row, and (when it ran after the restart) each one counts in
    // `/metrics`; no well-behaved client is ever refused for its key.
    let keyed_rows = rows
        .iter()
        .filter(|r| matches!(r.status, 401 | 429))
        .count() as u64;
    let flood = tally.flood.lock().clone();
    let answered: u64 = (flood.iter())
        .filter(|(s, _)| matches!(s, 401 | 429))
        .map(|(_, n)| n)
        .sum();
    let refused = |reason: &str| {
        let line = format!("crossbar_refused_total{{listener=\"clients\",reason=\"{reason}\"}} ");
        (metrics.lines())
            .find_map(|l| l.strip_prefix(&line))
            .and_then(|n| n.parse::<f64>().ok())
            .unwrap_or(0.0) as u64
    };
    let counted = refused("unauthorized") + refused("failed_keys");
    let after_kill = kill_at.is_none_or(|k| k < windows.flood.0);
    let flood_ok = keyed_rows == 0 && (!after_kill || counted == answered);
    println!(
        "check flood: sent={} answers={flood:?} rows_401_429={keyed_rows} counted_in_metrics={counted}{} -> {}",
        tally.flood_sent.load(Ordering::Relaxed),
        if after_kill { "" } else { " (crossbar restarted during it: not compared)" },
        verdict(flood_ok)
    );
    failed |= !flood_ok;
    println!(
        "check filler: answers={:?} (its rows are checked with the rest)",
        tally.filler.lock()
    );
    let (mut unexplained_moves, lines) = moves::moves(&ledger, &rows, &events, &run);
    for l in lines {
        println!("{l}");
    }
    let losses = report.lease_losses.len() as u64;
    println!(
        "check restart: sigkill={} leases_before={} not_back={losses} -> {}",
        u8::from(report.kill_ms.is_some()),
        report.leases_before_kill,
        verdict(losses == 0)
    );
    for l in report.lease_losses.iter().take(5) {
        println!("    {l}");
    }
    unexplained_moves += losses;

    let reloads = report
        .logs
        .iter()
        .map(|l| count_lines(l, "config reloaded"))
        .sum::<u64>();
    let reload_ok = reloads == u64::from(report.sighups);
    println!(
        "check reloads: sighups={} logged={reloads} -> {}",
        report.sighups,
        verdict(reload_ok)
    );
    failed |= !reload_ok;

    let clean_stop = crossbar.stop();
    println!(
        "check stop: SIGTERM exit within 10 s -> {}",
        verdict(clean_stop)
    );
    failed |= !clean_stop;
    let (panics, lines) = checks::panics(&report.logs);
    println!("check panics: {panics} lines -> {}", verdict(panics == 0));
    for l in lines {
        println!("    {l}");
    }

    let requests = run.sent.load(Ordering::Relaxed);
    let pass = !failed
        && rows_missing == 0
        && rows_extra == 0
        && leaked_slots == 0
        && leaked_threads == 0
        && leaked_fds == 0
        && rss_max_mib < RSS_LIMIT_MIB
        && unexplained_moves == 0
        && panics == 0;
    if pass {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        println!(
            "soak: FAILED; db, config and logs kept in {}",
            dir.display()
        );
    }
    println!(
        "soak seconds={seconds} requests={requests} rows_missing={rows_missing} rows_extra={rows_extra} leaked_slots={leaked_slots} leaked_threads={leaked_threads} leaked_fds={leaked_fds} rss_max_mib={rss_max_mib:.1} unexplained_moves={unexplained_moves} panics={panics}"
    );
    std::process::exit(if pass { 0 } else { 1 });
}

/// crossbar's config: three hosts with 2 slots each, two conversation routes and one for broken
/// requests. `variant` changes weights and the queue length (what a SIGHUP reload puts in force).
fn config(dir: &Path, urls: &[String], variant: u32, extra: &str) -> PathBuf {
    let w = |i: u32| 1 + (variant + i) % 3;
    let mut text = format!(
        r#"listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
db = "{db}"
workers = 32
lease_idle = "1h"
health_interval = "500ms"
queue_max = {queue}
queue_timeout = "10s"
connect_timeout = "1s"
first_byte_timeout = "5s"
client_write_timeout = "2s"
# Every soak client connects from 127.0.0.1: one peer, well over the default 64 connections
# and 8 bodies being read at once.
max_connections_per_peer = 1024
max_body_readers_per_peer = 1024
# One key (and one address) is every well-behaved client: its share of the requests waiting
# for a slot is all of them (issue 46; half of workers wait at most, the rest serve what needs
# no wait).
queue_max_per_client = 16
shutdown_grace = "5s"
log_level = "info"
# Whole bodies waiting for a slot: the body filler's share is half of this, four of its
# bodies (issue 46).
queue_body_mib = 4
{extra}
"#,
        db = dir.join("crossbar.db").display(),
        queue = 16 + 8 * (variant % 2),
    );
    for (i, (name, url)) in ["a", "b", "c"].iter().zip(urls).enumerate() {
        text.push_str(&format!(
            "\n[hosts.{name}]\nurl = \"{url}\"\nweight = {}\n[hosts.{name}.models.qwen]\nparallel = 2\n",
            w(i as u32)
        ));
    }
    // Every well-behaved client is `soak`; the body filler has a key of its own, so its share
    // of what waits is its own (issue 46).
    for (name, key) in [("soak", http::KEY), ("filler", hostile::FILLER_KEY)] {
        let digest: String = (sha2::Sha256::digest(key.as_bytes()).iter())
            .map(|b| format!("{b:02x}"))
            .collect();
        text.push_str(&format!("\n[keys.{name}]\nhash = \"sha256:{digest}\"\n"));
    }
    text.push_str(
        r#"
[routes.alpha]
hosts = ["a", "b", "c"]
model = "qwen"

[routes.beta]
hosts = ["b", "c", "a"]
model = "qwen"

[routes.junk]
hosts = ["c", "a", "b"]
model = "qwen"
"#,
    );
    let path = dir.join("crossbar.toml");
    std::fs::write(&path, text).expect("write the config");
    path
}

/// Waits (up to 10 s) until `/admin/status` shows every host healthy.
fn wait_healthy(run: &Run) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok((200, s)) = http::admin(run.admin(), "GET", "/admin/status", None) {
            let hosts = s["hosts"].as_array().cloned().unwrap_or_default();
            if !hosts.is_empty() && hosts.iter().all(|h| h["healthy"] == true) {
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("soak: hosts not all healthy after 10 s; going on");
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "ok"
    } else {
        "FAIL"
    }
}

fn env_num<T: std::str::FromStr>(key: &str, default: T) -> T {
    match std::env::var(key) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{key} must be a whole number, got {v:?}")),
        Err(_) => default,
    }
}

fn fail(dir: &Path, msg: &str) -> ! {
    println!("soak: cannot run: {msg} (files in {})", dir.display());
    std::process::exit(2);
}
