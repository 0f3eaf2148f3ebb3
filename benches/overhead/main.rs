//! Issue 3's benchmark: what crossbar adds on loopback, against the same upstream direct, beside
//! nginx and `bare` in the same interleaved rounds. Prints figures and asserts nothing; `make
//! bench` runs it.
//!
//! What it measures is what users run (issue 26, `gateway.rs`): the release `crossbar serve`
//! binary in a child process, at the default log level (one line per request on stderr, into a
//! file; `BENCH_LOG=0`: off), a client key configured and sent, a route over two hosts that gather
//! prompt families. The upstream is nginx answering fixed llama-server-shaped bodies
//! (`upstream.rs`), as fast as nginx; `BENCH_UPSTREAM=sim` uses the in-process sim instead (the
//! figures before issue 26). Streams always come from a sim with a per-token decode cost (SSE).
//! `BENCH_MUSL=1 make bench` builds both for musl, as `make static` builds the binary users run.
//!
//! Rows: `direct` = keep-alive straight to the upstream; `crossbar` = keep-alive through crossbar;
//! `nginx` (upstream keepalive) and `bare` = the same through them, interleaved with crossbar and
//! direct in every round; `fresh-conn` = straight to the upstream but a new connection per
//! request: what crossbar paid upstream before it pooled connections (issue 12). `bare`
//! (`bare.rs`) is a blocking thread-per-connection relay that does nothing but frame: the floor of
//! the design's shape, so what crossbar adds beyond it is crossbar's own work. The `cpu us` column
//! is a front end's own CPU per request, read from `/proc` (processes of their own only).
//!
//! Must not: bind anything but 127.0.0.1:0, or run longer than ~90 s on 2 cores (phases have
//! deadlines). The last line is machine-readable:
//! `overhead added_p50_ms=.. added_p99_ms=.. event_added_p50_ms=.. rps_ratio=.. over_nginx_p50=..
//! over_nginx_p50_c32=.. rps_ratio_c32=.. nginx_rps_ratio_c32=.. bare_rps_ratio_c32=..
//! cpu_us_c32=.. nginx_cpu_us_c32=.. bare_cpu_us_c32=.. c1_added_p50_ms=.. c1_added_p99_ms=..
//! c1_bare_added_p50_ms=.. c1_bare_added_p99_ms=..`
//! (added/rps at 32 clients unless `_c1`; `over_nginx_*` = crossbar's added p50 / nginx's added
//! p50, at 1 and 32 clients; `added_p50_ms`/`added_p99_ms` here are at 32 clients, `c1_*` at 1).
//! The line before it is the `leases` line (see `leases.rs`).

mod bare;
mod conn;
mod figures;
mod gateway;
mod keys;
mod leases;
mod load;
mod nginx;
mod slowbody;
mod sse;
mod upstream;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crossbar::sim::{Sim, SimConfig};
use parking_lot::Mutex;

use conn::Conn;
use figures::{print_row, Figures, Sample};
use gateway::Gateway;
use sse::stream_added;

/// Requests per client per phase, and the most time one phase may take.
const REQUESTS_1: usize = 3000;
const REQUESTS_32: usize = 1000;
const PHASE_DEADLINE: Duration = Duration::from_secs(8);
const WARMUP: usize = 200;
/// Each front end's phases run in this many interleaved rounds; figures are the rounds' medians.
const ROUNDS: usize = 5;
/// Streamed runs per side, tokens per stream, and the sim's decode cost per token.
const STREAM_RUNS: usize = 25;
const STREAM_TOKENS: u64 = 200;
const DECODE_US: u64 = 200;

const CHAT: &str = "/v1/chat/completions";
const CHAT_VIA: &str = "/projA/v1/chat/completions";
const STREAM_VIA: &str = "/projS/v1/chat/completions";

/// Where one front end's phases send their requests, and whose CPU they count.
#[derive(Clone, Copy)]
struct Target {
    addr: SocketAddr,
    path: &'static str,
    key: Option<&'static str>,
    pid: Option<u32>,
}

impl Target {
    fn plain(addr: SocketAddr, pid: Option<u32>) -> Target {
        Target {
            addr,
            path: CHAT,
            key: None,
            pid,
        }
    }
}

fn main() {
    // `cargo test --all-targets` (the gate) also runs this target, without `--bench`: skip there,
    // so the gate stays fast and the integration tests do not share the 2 cores with a load test.
    if !std::env::args().any(|a| a == "--bench") {
        println!("overhead: skipped (run `make bench`)");
        return;
    }
    // `cargo bench --bench overhead -- --keys-only`: the client-key line alone.
    if std::env::args().any(|a| a == "--keys-only") {
        println!("{}", keys::run());
        return;
    }
    if let Some(upstream) = std::env::args().skip_while(|a| a != "--bare-relay").nth(1) {
        bare::serve(&upstream);
    }
    let args: Vec<String> = std::env::args().skip_while(|a| a != "--load").collect();
    if let (Some(clients), Some(secs)) = (args.get(1), args.get(2)) {
        load::run(
            clients.parse().expect("CLIENTS"),
            secs.parse().expect("SECS"),
            args.get(3).map_or("crossbar", String::as_str),
        );
        return;
    }
    if let Some(db) = std::env::args().skip_while(|a| a != "--leases-only").nth(1) {
        println!("{}", leases::run(std::path::Path::new(&db)));
        return;
    }
    let dir = temp_dir();
    let on_sim = std::env::var("BENCH_UPSTREAM").is_ok_and(|v| v == "sim");
    let sim = on_sim.then(|| {
        Sim::start(SimConfig {
            slots: 64,
            ..SimConfig::default()
        })
    });
    let fixed = match &sim {
        Some(_) => None,
        None => Some(upstream::start(&dir).expect("the fixed-answer nginx upstream starts")),
    };
    let slow = Sim::start(SimConfig {
        slots: 4,
        decode_us_per_token: DECODE_US,
        ..SimConfig::default()
    });
    let up = match (&sim, &fixed) {
        (Some(sim), _) => sim.addr(),
        (_, Some(fixed)) => fixed.addr,
        _ => unreachable!("one upstream or the other"),
    };
    let gw = gateway::start(&dir, up, slow.addr());
    // `cargo bench --bench overhead -- --slow-body-only`: the poller path's line alone.
    if std::env::args().any(|a| a == "--slow-body-only") {
        println!("{}", slowbody::run(gw.proc.client, gw.key, gw.proc.pid));
        return;
    }
    println!(
        "crossbar overhead benchmark (release `crossbar serve`, loopback, {}, client key, {})",
        if gw.logged {
            "log at info into a file"
        } else {
            "log off"
        },
        if cfg!(target_env = "musl") {
            "musl"
        } else {
            "glibc"
        }
    );
    println!(
        "direct = {} at {up}; crossbar = {} -> same upstream, two hosts, host parallel 64\n",
        if on_sim {
            "in-process sim"
        } else {
            "fixed-answer nginx"
        },
        gw.proc.client
    );
    let direct = Target::plain(up, fixed.as_ref().map(|n| n.pid()));
    let via = Target {
        addr: gw.proc.client,
        path: CHAT_VIA,
        key: Some(gw.key),
        pid: Some(gw.proc.pid),
    };
    // Warm both paths (thread stacks, SQLite page cache, lease row for each client's conversation).
    run_phase(direct, 32, WARMUP / 32 + 1);
    run_phase(via, 32, WARMUP / 32 + 1);

    let nginx = match nginx::start(up, &dir) {
        Ok(nginx) => Some(nginx),
        Err(err) => {
            println!("nginx: not measured: {err}");
            None
        }
    };
    let proxy = nginx.as_ref().map(|n| Target::plain(n.addr, Some(n.pid())));
    if let Some(proxy) = proxy {
        run_phase(proxy, 32, WARMUP / 32 + 1);
    }
    let relay = bare::spawn(up);
    let bare = Target::plain(relay.addr, Some(relay.pid()));
    run_phase(bare, 32, WARMUP / 32 + 1);
    println!(
        "{:<10} {:>8} {:>9} {:>9} {:>10} {:>9}   (medians of {ROUNDS} interleaved rounds; cpu: all rounds)",
        "path", "clients", "p50 ms", "p99 ms", "req/s", "cpu us"
    );
    let mut rows = Vec::new();
    for (clients, per) in [(1, REQUESTS_1), (32, REQUESTS_32)] {
        let (mut d, mut v, mut n, mut b) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            d.push(run_phase(direct, clients, per / ROUNDS));
            v.push(run_phase(via, clients, per / ROUNDS));
            if let Some(proxy) = proxy {
                n.push(run_phase(proxy, clients, per / ROUNDS));
            }
            b.push(run_phase(bare, clients, per / ROUNDS));
        }
        // What an unpooled upstream costs: a fresh upstream connection per request.
        let fresh = Figures::of(&[run_phase_with(direct, clients, per / ROUNDS, true)]);
        let (d, v, b) = (Figures::of(&d), Figures::of(&v), Figures::of(&b));
        let n = (!n.is_empty()).then(|| Figures::of(&n));
        print_row("direct", clients, &d);
        print_row("crossbar", clients, &v);
        if let Some(n) = &n {
            print_row("nginx", clients, n);
        }
        print_row("bare", clients, &b);
        print_row("fresh-conn", clients, &fresh);
        rows.push((clients, d, v, n, b));
    }
    println!();
    for (clients, direct, via, proxy, floor) in &rows {
        let line = |name: &str, f: &Figures| {
            format!(
                "{clients:>2} clients: {name:<8} added p50 {:.3} ms, added p99 {:.3} ms, throughput ratio {:.3}, \
                 cpu/request worked out {:.1} us",
                f.p50 - direct.p50,
                f.p99 - direct.p99,
                f.rps / direct.rps,
                f.worked_out_us(direct),
            )
        };
        println!("{}", line("crossbar", via));
        if let Some(proxy) = proxy {
            println!(
                "{}; crossbar/nginx added p50 {:.2}x",
                line("nginx", proxy),
                (via.p50 - direct.p50) / (proxy.p50 - direct.p50)
            );
        }
        println!("{}", line("bare", floor));
    }

    let events = stream_added(&slow, gw.proc.client, gw.key);
    println!(
        "\nSSE ({STREAM_RUNS} streams per side, {STREAM_TOKENS} tokens, decode {DECODE_US} us/token): \
         per-event delay sim-write -> client, direct p50 {:.3} ms, crossbar p50 {:.3} ms",
        events.direct_p50, events.via_p50
    );
    println!(
        "  added per event (matched k with k): p50 {:.3} ms, p99 {:.3} ms over {} events",
        events.added.p(50.0),
        events.added.p(99.0),
        events.added.ms.len()
    );

    println!("{}", slowbody::run(gw.proc.client, gw.key, gw.proc.pid));
    let Gateway { mut proc, .. } = gw;
    proc.stop();
    drop((nginx, fixed));
    println!("{}", leases_apart(&dir.join("leases.db")));
    println!("{}", keys::run());
    drop((sim, slow));
    let _ = std::fs::remove_dir_all(&dir);
    let (_, d1, v1, n1, b1) = &rows[0];
    let (_, direct, via, n32, bare32) = &rows[1];
    let over = |v: &Figures, d: &Figures, n: &Option<Figures>| {
        n.as_ref()
            .map_or(f64::NAN, |n| (v.p50 - d.p50) / (n.p50 - d.p50))
    };
    println!(
        "overhead added_p50_ms={:.3} added_p99_ms={:.3} event_added_p50_ms={:.3} rps_ratio={:.3} \
         over_nginx_p50={:.2} over_nginx_p50_c32={:.2} rps_ratio_c32={:.3} nginx_rps_ratio_c32={:.3} \
         bare_rps_ratio_c32={:.3} cpu_us_c32={:.1} nginx_cpu_us_c32={:.1} bare_cpu_us_c32={:.1} \
         c1_added_p50_ms={:.3} c1_added_p99_ms={:.3} c1_bare_added_p50_ms={:.3} c1_bare_added_p99_ms={:.3}",
        via.p50 - direct.p50,
        via.p99 - direct.p99,
        events.added.p(50.0),
        via.rps / direct.rps,
        over(v1, d1, n1),
        over(via, direct, n32),
        via.rps / direct.rps,
        n32.as_ref().map_or(f64::NAN, |n| n.rps / direct.rps),
        bare32.rps / direct.rps,
        via.cpu_us,
        n32.as_ref().map_or(f64::NAN, |n| n.cpu_us),
        bare32.cpu_us,
        v1.p50 - d1.p50,
        v1.p99 - d1.p99,
        b1.p50 - d1.p50,
        b1.p99 - d1.p99,
    );
}

/// The `leases` line, measured in a process of its own, so that its RSS is the lease table's and
/// the store's, not what the phases before it left in this one (sims, a stopped crossbar, client
/// threads). In this process if that cannot be started.
fn leases_apart(db: &std::path::Path) -> String {
    let child = std::env::current_exe().and_then(|exe| {
        std::process::Command::new(exe)
            .args(["--bench", "--leases-only"])
            .arg(db)
            .output()
    });
    match child {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).trim().to_string(),
        _ => leases::run(db),
    }
}

fn temp_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("crossbar-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// `clients` threads, each with its own keep-alive connection, `per` small non-streamed chats
/// each (or until the phase deadline). Every client has its own conversation.
fn run_phase(target: Target, clients: usize, per: usize) -> Sample {
    run_phase_with(target, clients, per, false)
}

/// As [`run_phase`]; with `fresh`, every request opens (and times) its own connection.
fn run_phase_with(target: Target, clients: usize, per: usize, fresh: bool) -> Sample {
    let Target {
        addr,
        path,
        key,
        pid,
    } = target;
    let all = Arc::new(Mutex::new(Vec::with_capacity(clients * per)));
    let ticks = pid.map_or(0, gateway::cpu_ticks);
    let start = Instant::now();
    let deadline = start + PHASE_DEADLINE;
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let all = all.clone();
            thread::spawn(move || {
                let body = chat_body(c, false, 4);
                let open = || Conn::open(addr).with_key(key);
                let mut conn = open();
                let mut mine = Vec::with_capacity(per);
                for _ in 0..per {
                    if Instant::now() > deadline {
                        break;
                    }
                    let t = Instant::now();
                    if fresh {
                        conn = open();
                    }
                    let (status, close) = conn.round_trip(path, &body);
                    mine.push(t.elapsed().as_secs_f64() * 1e3);
                    assert_eq!(status, 200, "{path}: request failed");
                    if close {
                        conn = open();
                    }
                }
                all.lock().extend(mine);
            })
        })
        .collect();
    for t in threads {
        t.join().expect("client thread");
    }
    let wall = start.elapsed();
    let ticks = pid.map_or(0, gateway::cpu_ticks).saturating_sub(ticks);
    let ms = std::mem::take(&mut *all.lock());
    Sample { ms, wall, ticks }
}

fn chat_body(client: usize, stream: bool, max_tokens: u64) -> Vec<u8> {
    serde_json::json!({
        "model": "m",
        "messages": [
            {"role": "system", "content": "You are a careful coding assistant."},
            {"role": "user", "content": format!("client {client}: say something short")}
        ],
        "stream": stream,
        "max_tokens": max_tokens,
    })
    .to_string()
    .into_bytes()
}
