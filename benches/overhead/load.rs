//! `cargo bench --bench overhead -- --load CLIENTS SECS [crossbar|nginx|bare]`: one front end as
//! `make bench` runs it (crossbar: the binary, its log, the key; all: the fixed-answer upstream)
//! under a steady load and nothing else, for profilers to attach to (issue 26). nginx and `bare`
//! under the same load show what the same profile costs a front end that does only the relay.
//! Prints `pid=..` at once, starts the load 2 s later, and at the end the requests it answered
//! and what it spent on the CPU per request (its whole life over the requests of the load: for
//! crossbar the process exits first, so `strace -p` and `perf record -p` see its whole life and
//! end with it).

use std::io::Write;
use std::time::{Duration, Instant};

use crate::{bare, gateway, nginx, run_phase, temp_dir, upstream, Target, CHAT_VIA};

pub fn run(clients: usize, secs: u64, front: &str) {
    let dir = temp_dir();
    let fixed = upstream::start(&dir).expect("the fixed-answer nginx upstream starts");
    let (mut gw, mut proxy, mut relay) = (None, None, None);
    let (via, pid) = match front {
        "crossbar" => {
            let g = gw.insert(gateway::start(&dir, fixed.addr, fixed.addr));
            let via = Target {
                key: Some(g.key),
                path: CHAT_VIA,
                ..Target::plain(g.proc.client, None)
            };
            (via, g.proc.pid)
        }
        "nginx" => {
            let n = proxy.insert(nginx::start(fixed.addr, &dir).expect("nginx starts"));
            (Target::plain(n.addr, None), n.pid())
        }
        "bare" => {
            let b = relay.insert(bare::spawn(fixed.addr));
            (Target::plain(b.addr, None), b.pid())
        }
        other => panic!("--load CLIENTS SECS [crossbar|nginx|bare], not {other:?}"),
    };
    println!("pid={pid}");
    let _ = std::io::stdout().flush();
    std::thread::sleep(Duration::from_secs(2));
    let start = Instant::now();
    let mut requests = 0;
    while start.elapsed() < Duration::from_secs(secs) {
        requests += run_phase(via, clients, 2000 / clients.max(1) + 1).ms.len();
    }
    let ticks = gateway::cpu_ticks(pid);
    if let Some(gateway::Gateway { mut proc, .. }) = gw {
        proc.stop();
    }
    println!(
        "load front={front} clients={clients} requests={requests} req_per_s={:.0} \
         cpu_us_per_request={:.1}",
        requests as f64 / start.elapsed().as_secs_f64(),
        ticks as f64 * gateway::TICK_US / requests as f64
    );
    drop((proxy, relay, fixed));
    let _ = std::fs::remove_dir_all(&dir);
}
