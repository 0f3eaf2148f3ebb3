//! The front ends under comparison, each started in front of the same simulated hosts:
//! crossbar (in-process, as `crossbar serve` runs it), nginx round-robin and nginx `least_conn`
//! (Debian's nginx as a child process, configured the way people proxy llama-server: HTTP/1.1,
//! buffering off, default passive health checks and retries), smg (SGLang's cache-aware router as a
//! child process, given only the hosts' URLs; see `smg`), and the oracle, which sends each
//! conversation straight to a fixed host and, when that host fails, moves it once to the next.
//! A front end that cannot start (not installed, a config crossbar rejects) is an error for its
//! row, never a panic.

use std::path::Path;
use std::time::Duration;

use crossbar::server::Server;
use parking_lot::Mutex;

use crate::crossbar_toml::{config_text, parse, Form};
use crate::hosts::Host;
use crate::nginx_proc::Nginx;
use crate::smg::Smg;
use crate::workload::{Target, MODEL};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Crossbar,
    RoundRobin,
    LeastConn,
    Oracle,
    Smg,
}

impl Kind {
    /// In run order: the oracle first, so every later row can show its ratio to it.
    pub const ALL: [Kind; 5] = [
        Kind::Oracle,
        Kind::Crossbar,
        Kind::RoundRobin,
        Kind::LeastConn,
        Kind::Smg,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Crossbar => "crossbar",
            Kind::RoundRobin => "nginx-rr",
            Kind::LeastConn => "nginx-lc",
            Kind::Oracle => "oracle",
            Kind::Smg => "smg",
        }
    }
}

/// A started front end; stops on drop.
pub enum Running {
    Crossbar(Option<Box<Server>>, String),
    /// nginx, stopped when dropped.
    Nginx(Nginx),
    Oracle(Mutex<Vec<usize>>, Vec<String>),
    /// smg, stopped (SIGTERM, then a wait) when dropped.
    Smg(Smg),
}

impl Running {
    /// `form`: how crossbar's config is written (the other front ends need only the hosts).
    pub fn start(kind: Kind, hosts: &[Host], dir: &Path, form: &Form) -> Result<Running, String> {
        match kind {
            Kind::Crossbar => {
                let text = crossbar_config(hosts, dir, form);
                // Hosts given only their URL, or lines this build does not know (`exclusive`),
                // may be refused: that is this row's result, not the run's end.
                let config = parse(&text, form)?;
                let server = Server::start(config).map_err(|e| format!("crossbar: {e}"))?;
                ready(&server);
                let base = format!("http://{}/bench", server.client_addr());
                Ok(Running::Crossbar(Some(Box::new(server)), base))
            }
            Kind::RoundRobin | Kind::LeastConn => start_nginx(kind, hosts, dir),
            Kind::Oracle => {
                let urls: Vec<String> = hosts.iter().map(Host::url).collect();
                Ok(Running::Oracle(Mutex::new(Vec::new()), urls))
            }
            Kind::Smg => {
                let urls: Vec<String> = hosts.iter().map(Host::url).collect();
                Ok(Running::Smg(Smg::start(&urls, &dir.join("smg"))?))
            }
        }
    }
}

impl Target for Running {
    fn base(&self, conv: usize) -> String {
        match self {
            Running::Crossbar(_, base) => base.clone(),
            Running::Nginx(nginx) => format!("http://{}", nginx.addr),
            Running::Smg(smg) => smg.url(),
            Running::Oracle(moved, urls) => {
                let shift = moved.lock().iter().filter(|&&c| c == conv).count();
                urls[(conv + shift) % urls.len()].clone()
            }
        }
    }

    fn failed(&self, conv: usize) {
        if let Running::Oracle(moved, _) = self {
            moved.lock().push(conv);
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        match self {
            Running::Crossbar(server, _) => {
                if let Some(s) = server.take() {
                    println!("{}", placements(&s));
                    s.stop(Duration::from_secs(5));
                }
            }
            Running::Smg(smg) => println!("{}", smg.branches()),
            Running::Nginx(..) | Running::Oracle(..) => {}
        }
    }
}

/// Until every host is up, crossbar knows its similarity and RAM cache (a URL-only host's probe
/// has run: a second or so on a real server, its seats held) and a poll has shown an exclusive
/// host's slots idle since, as smg is used only once its `/readiness` counts every worker
/// healthy: a gateway starts well before its traffic. Gives up after 20 s with a line saying so;
/// the run goes on.
fn ready(server: &Server) {
    let gw = server.gateway();
    let hosts: Vec<String> = gw.config().hosts.keys().cloned().collect();
    // An exclusive host's slots are in doubt after the probe until a poll shows them idle: a
    // request sent before that goes unpinned.
    let known = |h: &String| {
        gw.health.healthy(h)
            && gw.learned.similarity(h).is_some()
            && gw.learned.ram(h).is_some()
            && !gw.slots.doubtful(h)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !hosts.iter().all(known) {
        if std::time::Instant::now() > deadline {
            println!("#   crossbar: not every host probed within 20 s; the run starts anyway");
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What placed crossbar's requests, from its rows, and each host's measured prefill speed: the
/// figures that explain where new conversations went (`#` lines, beside the table).
fn placements(server: &Server) -> String {
    let gateway = server.gateway();
    let config = gateway.config();
    let speeds: Vec<String> = (config.hosts.keys())
        .map(|h| {
            let tps = gateway.holdings.prefill_tps(h);
            format!("{h} {}", tps.map_or("-".into(), |t| format!("{t:.0}")))
        })
        .collect();
    // What the probe (or the config) told crossbar of each host: placement leans on it.
    let word = |v: Option<bool>| v.map_or("?", |on| if on { "on" } else { "off" });
    let learned: Vec<String> = (config.hosts.keys())
        .map(|h| {
            let (sim, ram) = (gateway.learned.similarity(h), gateway.learned.ram(h));
            // A restart read during the run (none happens in the bench: one would be a false
            // reading, and placement would forget what the host holds).
            let restarts = (gateway.learned.get(h)).map_or(0, |l| l.restarts);
            let restarts = match restarts {
                0 => String::new(),
                n => format!(" RESTARTS READ {n}"),
            };
            format!("{h} similarity {} ram {}{restarts}", word(sim), word(ram))
        })
        .collect();
    let reasons = rusqlite::Connection::open(&config.db)
        .and_then(|db| {
            let mut q = db.prepare(
                "SELECT placed, COUNT(*) FROM requests WHERE placed != 'sticky' GROUP BY placed",
            )?;
            let rows = q.query_map([], |r| {
                Ok(format!(
                    "{} {}",
                    r.get::<_, String>(0)?,
                    r.get::<_, i64>(1)?
                ))
            })?;
            rows.collect::<Result<Vec<_>, _>>()
        })
        .map_or_else(|e| e.to_string(), |r| r.join(", "));
    // Requests crossbar could not pin, held for the pins before them to start (`pin_slots`).
    let (mut held, mut bound, mut waited) = (0, 0, Duration::ZERO);
    for h in config.hosts.keys() {
        let (settled, timed_out, time) = gateway.metrics.settle_waits(h);
        (held, bound, waited) = (held + settled + timed_out, bound + timed_out, waited + time);
    }
    // A per-host counter, summed over the hosts.
    fn summed<const N: usize>(hosts: Vec<&String>, count: impl Fn(&str) -> [u64; N]) -> [u64; N] {
        let mut sums = [0u64; N];
        for h in hosts {
            sums.iter_mut().zip(count(h)).for_each(|(sum, n)| *sum += n);
        }
        sums
    }
    let pins = summed(config.hosts.keys().collect(), |h| {
        gateway.metrics.slot_pins(h)
    });
    let mut pinned = if pins[0] + pins[1] > 0 {
        let [yes, no, saved, failed] = pins;
        format!("; pinned {yes}, unpinned {no}, slots saved first {saved} ({failed} failed)")
    } else {
        String::new()
    };
    let stashes = summed(config.hosts.keys().collect(), |h| {
        gateway.metrics.stashes(h)
    });
    if stashes[0] + stashes[1] > 0 {
        let [sent, failed, tokens] = stashes;
        pinned.push_str(&format!(
            "; stashes {sent} ({failed} failed, {tokens} tokens prefilled, not in the table)"
        ));
    }
    let holds = if held > 0 {
        let mean = waited.as_secs_f64() * 1e3 / held as f64;
        format!("; unpinned held {held} (mean {mean:.1} ms, {bound} at the bound)")
    } else {
        String::new()
    };
    format!(
        "#   crossbar: placed (not sticky) {reasons}; prefill tokens/s {}{holds}{pinned}; {}",
        speeds.join(", "),
        learned.join(", ")
    )
}

/// crossbar's config for these hosts (`crossbar_toml`), on a fresh database in `dir`. The route's
/// table is the config's last: callers may append lines to it.
pub fn crossbar_config(hosts: &[Host], dir: &Path, form: &Form) -> String {
    let db = dir.join("crossbar.db");
    let _ = std::fs::remove_file(&db);
    let urls: Vec<String> = hosts.iter().map(Host::url).collect();
    config_text(&urls, MODEL, &db, form)
}

fn start_nginx(kind: Kind, hosts: &[Host], dir: &Path) -> Result<Running, String> {
    let nginx = Nginx::start(dir.join(kind.name()), "1", |port| {
        nginx_blocks(kind, hosts, port)
    })?;
    Ok(Running::Nginx(nginx))
}

/// What a homelab puts in front of llama-server: streaming-safe proxying, long reads, and nginx's
/// defaults for failures (`max_fails=1 fail_timeout=10s`, retry the next server on errors).
fn nginx_blocks(kind: Kind, hosts: &[Host], port: u16) -> String {
    let balance = if kind == Kind::LeastConn {
        "least_conn;"
    } else {
        ""
    };
    let servers: String = hosts
        .iter()
        .map(|h| format!("        server {};\n", h.addr()))
        .collect();
    format!(
        "    upstream llama {{\n        {balance}\n{servers}    }}\n\
         server {{\n        listen 127.0.0.1:{port};\n\
             location / {{\n            proxy_pass http://llama;\n\
                 proxy_http_version 1.1;\n            proxy_set_header Connection \"\";\n\
                 proxy_buffering off;\n            proxy_read_timeout 1h;\n\
                 add_header X-Upstream $upstream_addr;\n        }}\n    }}\n"
    )
}
