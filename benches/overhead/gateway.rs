//! crossbar as users run it (issue 26): the release `crossbar serve` binary in a child process,
//! its config written to a file, its log at the default level (`info`: one line per request) on
//! stderr into a file, a client key configured and sent, and a route over two hosts that gather
//! prompt families (`slot_prompt_similarity = 0`, as crossbar.toml's example). `BENCH_LOG=0` turns
//! the log off (`log_level = "off"`), to see what the line costs.
//!
//! Also what a process tree spent on the CPU (`/proc/PID/stat`), so the bench reports crossbar's
//! CPU per request as measured, not only as worked out from the req/s ratios.

use std::net::SocketAddr;
use std::path::Path;

#[allow(dead_code)]
#[path = "../soak/procs.rs"]
mod procs;

pub use procs::Crossbar;

/// The key every benchmark request to crossbar carries (`Authorization: Bearer`).
pub struct Gateway {
    pub proc: Crossbar,
    pub key: &'static str,
    pub logged: bool,
}

/// Starts crossbar with `fast` (non-streamed phases, two hosts) and `slow` (the SSE sim) as
/// upstreams.
pub fn start(dir: &Path, fast: SocketAddr, slow: SocketAddr) -> Gateway {
    let logged = std::env::var("BENCH_LOG").map_or(true, |v| v != "0");
    let (key, hash) = crossbar::keys::new_key().expect("randomness for the bench key");
    let text = format!(
        "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ndb = {db:?}\n{log}\
         [hosts.fast]\nurl = \"http://{fast}\"\nslot_prompt_similarity = 0\n\
         [hosts.fast.models.m]\nparallel = 64\n\
         [hosts.fast2]\nurl = \"http://{fast}\"\nslot_prompt_similarity = 0\n\
         [hosts.fast2.models.m]\nparallel = 64\n\
         [hosts.slow]\nurl = \"http://{slow}\"\n[hosts.slow.models.m]\nparallel = 4\n\
         [routes.projA]\nhosts = [\"fast\", \"fast2\"]\nmodel = \"m\"\n\
         [routes.projS]\nhosts = [\"slow\"]\nmodel = \"m\"\n\
         [keys.bench]\nhash = \"{hash}\"\n",
        db = dir.join("crossbar.db"),
        log = if logged { "" } else { "log_level = \"off\"\n" },
    );
    let config = dir.join("crossbar.toml");
    std::fs::write(&config, &text).expect("write the bench config");
    let proc = Crossbar::start(&config, &dir.join("crossbar.log")).expect("crossbar starts");
    Gateway {
        proc,
        key: Box::leak(key.into_boxed_str()),
        logged,
    }
}

/// Clock ticks (USER_HZ, 100 a second on Linux) `pid` and its children (nginx's workers) have
/// spent in user and kernel mode so far; 0 for a process that is gone.
pub fn cpu_ticks(pid: u32) -> u64 {
    let own = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(0, |stat| {
        // Fields after the command's closing parenthesis: state is the 1st, utime the 12th.
        let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
        field(11).unwrap_or(0) + field(12).unwrap_or(0)
    });
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    own + (children.split_whitespace())
        .filter_map(|c| c.parse().ok())
        .map(cpu_ticks)
        .sum::<u64>()
}

/// Microseconds of CPU per clock tick.
pub const TICK_US: f64 = 10_000.0;
