//! `cargo bench --bench overhead -- --load CLIENTS SECS`: crossbar as `make bench` runs it (the
//! binary, its log, the key, the fixed-answer upstream) under a steady load and nothing else, for
//! profilers to attach to (issue 26). Prints `pid=..` at once, starts the load 2 s later, and at
//! the end the requests crossbar answered (its whole life, warm-up included) and what it spent on
//! the CPU per request; crossbar exits before the line, so `strace -p` and `perf record -p` see its
//! whole life and end with it.

use std::io::Write;
use std::time::{Duration, Instant};

use crate::{gateway, run_phase, temp_dir, upstream, Target, CHAT_VIA};

pub fn run(clients: usize, secs: u64) {
    let dir = temp_dir();
    let fixed = upstream::start(&dir).expect("the fixed-answer nginx upstream starts");
    let gw = gateway::start(&dir, fixed.addr, fixed.addr);
    println!("pid={}", gw.proc.pid);
    let _ = std::io::stdout().flush();
    std::thread::sleep(Duration::from_secs(2));
    let via = Target {
        addr: gw.proc.client,
        path: CHAT_VIA,
        key: Some(gw.key),
        pid: None,
    };
    let start = Instant::now();
    let mut requests = 0;
    while start.elapsed() < Duration::from_secs(secs) {
        requests += run_phase(via, clients, 2000 / clients.max(1) + 1).ms.len();
    }
    let ticks = gateway::cpu_ticks(gw.proc.pid);
    let gateway::Gateway { mut proc, .. } = gw;
    proc.stop();
    println!(
        "load clients={clients} requests={requests} req_per_s={:.0} cpu_us_per_request={:.1}",
        requests as f64 / start.elapsed().as_secs_f64(),
        ticks as f64 * gateway::TICK_US / requests as f64
    );
    drop(fixed);
    let _ = std::fs::remove_dir_all(&dir);
}
