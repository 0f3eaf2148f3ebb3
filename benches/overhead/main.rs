//! Issue 3's benchmark: what crossbar adds on loopback, measured against the in-process fake
//! llama-server in the same run. Prints figures and asserts nothing; `make bench` runs it.
//!
//! Owns: one zero-cost sim (latency/throughput), one sim with a per-token decode cost (SSE), a real
//! crossbar in front of both, and the raw-socket clients. Must not: bind anything but 127.0.0.1:0,
//! or run longer than ~60 s on 2 cores (phases have deadlines). No logger by default (logging cost
//! is what an operator pays at the level they choose); `BENCH_LOG=1` installs `serve`'s own
//! (info: one line per request on stderr), to measure with it, e.g. stderr on a pipe as under
//! systemd: `BENCH_LOG=1 make bench 2> >(cat > /dev/null)`. `BENCH_MUSL=1 make bench` builds it for
//! musl, as `make static` builds the binary users run.
//!
//! Rows: `direct` = keep-alive straight to the sim; `crossbar` = keep-alive through crossbar;
//! `nginx` (upstream keepalive) and `bare` = the same through them, interleaved with crossbar and
//! direct in every round; `fresh-conn` = straight to the sim but a new connection per request: what
//! crossbar paid upstream before it pooled connections (issue 12), kept to show what the pool saves.
//! `bare` (`bare.rs`) is a blocking thread-per-connection relay that does nothing but frame: the
//! floor of the design's shape, so what crossbar adds beyond it is crossbar's own work.
//!
//! The last line is machine-readable:
//! `overhead added_p50_ms=.. added_p99_ms=.. event_added_p50_ms=.. rps_ratio=.. over_nginx_p50=..
//! over_nginx_p50_c32=.. rps_ratio_c32=.. nginx_rps_ratio_c32=.. bare_rps_ratio_c32=..`
//! (added/rps at 32 clients; `over_nginx_*` = crossbar's added p50 / nginx's added p50, at 1 and
//! 32 clients). The line before it is the `leases` line (see `leases.rs`).

mod bare;
mod conn;
mod keys;
mod leases;
mod nginx;
mod slowbody;
mod sse;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crossbar::config::Config;
use crossbar::server::Server;
use crossbar::sim::{Sim, SimConfig};
use parking_lot::Mutex;

use conn::Conn;

use sse::stream_added;

/// Requests per client per phase, and the most time one phase may take.
const REQUESTS_1: usize = 3000;
const REQUESTS_32: usize = 300;
const PHASE_DEADLINE: Duration = Duration::from_secs(8);
const WARMUP: usize = 200;
/// Each front end's phases run in this many interleaved rounds; figures are the rounds' medians.
const ROUNDS: usize = 5;
/// Streamed runs per side, tokens per stream, and the sim's decode cost per token.
const STREAM_RUNS: usize = 25;
const STREAM_TOKENS: u64 = 200;
const DECODE_US: u64 = 200;

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
    if let Some(db) = std::env::args().skip_while(|a| a != "--leases-only").nth(1) {
        println!("{}", leases::run(std::path::Path::new(&db)));
        return;
    }
    let logged = std::env::var_os("BENCH_LOG").is_some();
    if logged {
        crossbar::cli::init_logging(log::LevelFilter::Info);
    }
    let dir = temp_dir();
    let fast = Sim::start(SimConfig {
        slots: 64,
        ..SimConfig::default()
    });
    let slow = Sim::start(SimConfig {
        slots: 4,
        decode_us_per_token: DECODE_US,
        ..SimConfig::default()
    });
    let text = config_text(&dir, &fast, &slow);
    let config = Config::from_toml(&text).unwrap_or_else(|e| panic!("bad config: {e}\n{text}"));
    let server = Server::start(config).expect("crossbar starts");
    let gw = server.client_addr();
    // `cargo bench --bench overhead -- --slow-body-only`: the poller path's line alone.
    if std::env::args().any(|a| a == "--slow-body-only") {
        println!("{}", slowbody::run(gw));
        return;
    }
    let sim = fast.addr();
    println!(
        "crossbar overhead benchmark (release, loopback, {}, {})",
        if logged {
            "serve's logger at info on stderr"
        } else {
            "no logger"
        },
        if cfg!(target_env = "musl") {
            "musl"
        } else {
            "glibc"
        }
    );
    println!("direct = sim at {sim}; crossbar = {gw} -> same sim; host parallel 64, workers 64\n");

    // Warm both paths (thread stacks, SQLite page cache, lease row for each client's conversation).
    run_phase(sim, "/v1/chat/completions", 32, WARMUP / 32 + 1);
    run_phase(gw, CHAT_VIA, 32, WARMUP / 32 + 1);

    let nginx = match nginx::start(sim, &dir) {
        Ok(nginx) => Some(nginx),
        Err(err) => {
            println!("nginx: not measured: {err}");
            None
        }
    };
    if let Some(nginx) = &nginx {
        run_phase(nginx.addr, "/v1/chat/completions", 32, WARMUP / 32 + 1);
    }
    let bare = bare::start(sim);
    run_phase(bare.addr, "/v1/chat/completions", 32, WARMUP / 32 + 1);
    println!(
        "{:<10} {:>8} {:>9} {:>9} {:>10}   (medians of {ROUNDS} interleaved rounds)",
        "path", "clients", "p50 ms", "p99 ms", "req/s"
    );
    let mut rows = Vec::new();
    for (clients, per) in [(1, REQUESTS_1), (32, REQUESTS_32)] {
        let (mut direct, mut via, mut proxy, mut floor) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            direct.push(run_phase(
                sim,
                "/v1/chat/completions",
                clients,
                per / ROUNDS,
            ));
            via.push(run_phase(gw, CHAT_VIA, clients, per / ROUNDS));
            if let Some(nginx) = &nginx {
                proxy.push(run_phase(
                    nginx.addr,
                    "/v1/chat/completions",
                    clients,
                    per / ROUNDS,
                ));
            }
            floor.push(run_phase(
                bare.addr,
                "/v1/chat/completions",
                clients,
                per / ROUNDS,
            ));
        }
        // What an unpooled upstream costs: a fresh sim connection per request.
        let fresh = Figures::of(&[run_phase_with(
            sim,
            "/v1/chat/completions",
            clients,
            per / ROUNDS,
            true,
        )]);
        let (direct, via) = (Figures::of(&direct), Figures::of(&via));
        let proxy = (!proxy.is_empty()).then(|| Figures::of(&proxy));
        let floor = Figures::of(&floor);
        print_row("direct", clients, &direct);
        print_row("crossbar", clients, &via);
        if let Some(proxy) = &proxy {
            print_row("nginx", clients, proxy);
        }
        print_row("bare", clients, &floor);
        print_row("fresh-conn", clients, &fresh);
        rows.push((clients, direct, via, proxy, floor));
    }
    println!();
    for (clients, direct, via, proxy, floor) in &rows {
        println!(
            "{clients:>2} clients: crossbar added p50 {:.3} ms, added p99 {:.3} ms, throughput ratio {:.3}",
            via.p50 - direct.p50,
            via.p99 - direct.p99,
            via.rps / direct.rps,
        );
        if let Some(proxy) = proxy {
            println!(
                "{clients:>2} clients: nginx    added p50 {:.3} ms, added p99 {:.3} ms, throughput ratio {:.3}; \
                 crossbar/nginx added p50 {:.2}x",
                proxy.p50 - direct.p50,
                proxy.p99 - direct.p99,
                proxy.rps / direct.rps,
                (via.p50 - direct.p50) / (proxy.p50 - direct.p50),
            );
        }
        println!(
            "{clients:>2} clients: bare     added p50 {:.3} ms, added p99 {:.3} ms, throughput ratio {:.3}",
            floor.p50 - direct.p50,
            floor.p99 - direct.p99,
            floor.rps / direct.rps,
        );
    }

    let events = stream_added(&slow, gw);
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

    println!("{}", slowbody::run(gw));
    server.stop(Duration::from_secs(5));
    drop(nginx);
    println!("{}", leases_apart(&dir.join("leases.db")));
    println!("{}", keys::run());
    drop((fast, slow));
    let _ = std::fs::remove_dir_all(&dir);
    let (_, d1, v1, n1, _) = &rows[0];
    let (_, direct, via, n32, bare32) = &rows[1];
    let over = |v: &Figures, d: &Figures, n: &Option<Figures>| {
        n.as_ref()
            .map_or(f64::NAN, |n| (v.p50 - d.p50) / (n.p50 - d.p50))
    };
    println!(
        "overhead added_p50_ms={:.3} added_p99_ms={:.3} event_added_p50_ms={:.3} rps_ratio={:.3} \
         over_nginx_p50={:.2} over_nginx_p50_c32={:.2} rps_ratio_c32={:.3} nginx_rps_ratio_c32={:.3} \
         bare_rps_ratio_c32={:.3}",
        via.p50 - direct.p50,
        via.p99 - direct.p99,
        events.added.p(50.0),
        via.rps / direct.rps,
        over(v1, d1, n1),
        over(via, direct, n32),
        via.rps / direct.rps,
        n32.as_ref().map_or(f64::NAN, |n| n.rps / direct.rps),
        bare32.rps / direct.rps,
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

/// One front end's figures at one client count: medians over the interleaved rounds.
struct Figures {
    p50: f64,
    p99: f64,
    rps: f64,
}

impl Figures {
    fn of(rounds: &[Sample]) -> Figures {
        let median = |f: &dyn Fn(&Sample) -> f64| {
            let mut v: Vec<f64> = rounds.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        Figures {
            p50: median(&|s| s.p(50.0)),
            p99: median(&|s| s.p(99.0)),
            rps: median(&|s| s.rps()),
        }
    }
}

const CHAT_VIA: &str = "/projA/v1/chat/completions";
const STREAM_VIA: &str = "/projS/v1/chat/completions";

fn config_text(dir: &std::path::Path, fast: &Sim, slow: &Sim) -> String {
    format!(
        "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ndb = {db:?}\nworkers = 64\n\
         queue_max = 100000\nhealth_interval = \"5s\"\n\
         [hosts.fast]\nurl = \"{fast}\"\n[hosts.fast.models.m]\nparallel = 64\n\
         [hosts.slow]\nurl = \"{slow}\"\n[hosts.slow.models.m]\nparallel = 4\n\
         [routes.projA]\nhosts = [\"fast\"]\nmodel = \"m\"\n\
         [routes.projS]\nhosts = [\"slow\"]\nmodel = \"m\"\n",
        db = dir.join("crossbar.db"),
        fast = fast.url(),
        slow = slow.url(),
    )
}

fn temp_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("crossbar-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Latencies (ms) of one phase and its wall time.
struct Sample {
    ms: Vec<f64>,
    wall: Duration,
}

impl Sample {
    /// Nearest-rank percentile.
    fn p(&self, pct: f64) -> f64 {
        percentile(&mut self.ms.clone(), pct)
    }

    fn rps(&self) -> f64 {
        self.ms.len() as f64 / self.wall.as_secs_f64()
    }
}

/// Nearest-rank percentile of `v` (sorted in place); NaN when empty.
fn percentile(v: &mut [f64], pct: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((pct / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

fn print_row(path: &str, clients: usize, f: &Figures) {
    println!(
        "{path:<10} {clients:>8} {:>9.3} {:>9.3} {:>10.0}",
        f.p50, f.p99, f.rps
    );
}

/// `clients` threads, each with its own keep-alive connection, `per` small non-streamed chats
/// each (or until the phase deadline). Every client has its own conversation.
fn run_phase(addr: SocketAddr, path: &'static str, clients: usize, per: usize) -> Sample {
    run_phase_with(addr, path, clients, per, false)
}

/// As [`run_phase`]; with `fresh`, every request opens (and times) its own connection.
fn run_phase_with(
    addr: SocketAddr,
    path: &'static str,
    clients: usize,
    per: usize,
    fresh: bool,
) -> Sample {
    let all = Arc::new(Mutex::new(Vec::with_capacity(clients * per)));
    let start = Instant::now();
    let deadline = start + PHASE_DEADLINE;
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let all = all.clone();
            thread::spawn(move || {
                let body = chat_body(c, false, 4);
                let mut conn = Conn::open(addr);
                let mut mine = Vec::with_capacity(per);
                for _ in 0..per {
                    if Instant::now() > deadline {
                        break;
                    }
                    let t = Instant::now();
                    if fresh {
                        conn = Conn::open(addr);
                    }
                    let (status, close) = conn.round_trip(path, &body);
                    mine.push(t.elapsed().as_secs_f64() * 1e3);
                    assert_eq!(status, 200, "{path}: request failed");
                    if close {
                        conn = Conn::open(addr);
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
    let ms = std::mem::take(&mut *all.lock());
    Sample { ms, wall }
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
