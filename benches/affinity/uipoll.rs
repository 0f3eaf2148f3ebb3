//! Issue 11's question: a chat UI that polls `GET /v1/models` keeps the route-level lease alive,
//! and by seed 000's inherit rule every new conversation of the route then lands on that one host.
//! This runs the workload twice through crossbar while a UI polls, once with the default (inherit)
//! and once with the route's `spread_new = true`, and prints what each does to prefill and to the
//! time turns wait for a slot in crossbar's queue (from crossbar's own accounting rows).
//!
//! Simulated hosts only (the roomy scenario); prints, never asserts or writes docs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use crossbar::config::Config;
use crossbar::server::Server;
use crossbar::store::Store;

use crate::crossbar_toml::{Form, HostForm};
use crate::frontend::{crossbar_config, Running};
use crate::hosts::{Host, Setup};
use crate::workload::{self, Shape};

/// How often the UI asks for the model list.
const POLL_EVERY: Duration = Duration::from_millis(250);

/// One mode's result.
struct Outcome {
    prefilled: u64,
    cached: u64,
    queued: Vec<i64>,
    per_host: Vec<u64>,
    listings: u64,
}

/// Runs both modes and prints one line each.
pub fn run(setup: &Setup, hosts: usize, shape: &Shape, dir: &std::path::Path) {
    println!(
        "a UI polls GET /v1/models every {} ms while the agents work (crossbar, sims, roomy):",
        POLL_EVERY.as_millis()
    );
    println!(
        "{:<22} {:>10} {:>8} {:>26} {:>9}  completions per host",
        "route mode", "prefilled", "cached", "queue wait mean/p95/max", "listings"
    );
    for (name, spread) in [("inherit (default)", false), ("spread_new = true", true)] {
        let o = one(setup, hosts, shape, dir, spread);
        let mut q = o.queued.clone();
        q.sort_unstable();
        let mean = q.iter().sum::<i64>() as f64 / q.len().max(1) as f64;
        let p95 = q
            .get((q.len() * 95 / 100).min(q.len().saturating_sub(1)))
            .copied();
        let share = o.cached as f64 / (o.cached + o.prefilled).max(1) as f64;
        println!(
            "{name:<22} {:>10} {:>7.1}% {:>14.0} / {:>4} / {:>4} ms {:>9}  {:?}",
            o.prefilled,
            share * 100.0,
            mean,
            p95.unwrap_or(0),
            q.last().copied().unwrap_or(0),
            o.listings,
            o.per_host
        );
    }
    println!();
}

fn one(setup: &Setup, n: usize, shape: &Shape, dir: &std::path::Path, spread: bool) -> Outcome {
    let hosts: Vec<Host> = (0..n)
        .map(|_| Host::start(setup, None))
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("cannot start a host: {e}"));
    let form = Form {
        hosts: HostForm::Configured,
        host_extra: "",
        route_extra: "",
        slots: setup.slots,
        similarity: setup.similarity,
    };
    let mut text = crossbar_config(&hosts, dir, &form);
    if spread {
        // The route table is the config's last: this line belongs to it.
        text.push_str("spread_new = true\n");
    }
    let config = Config::from_toml(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let server = Server::start(config).unwrap_or_else(|e| panic!("crossbar: {e}"));
    crate::wait_for_first_polls(&server, n).unwrap_or_else(|e| panic!("{e}"));
    let base = format!("http://{}/bench", server.client_addr());
    let running = Running::Crossbar(Some(Box::new(server)), base.clone());
    let stop = AtomicBool::new(false);
    let listings = thread::scope(|s| {
        let poller = s.spawn(|| poll_models(&base, &stop));
        workload::play(shape, &running, &|| {});
        stop.store(true, Ordering::SeqCst);
        poller.join().expect("poller thread")
    });
    drop(running);
    let rows = Store::open(&dir.join("crossbar.db"))
        .and_then(|db| db.requests_since(0, Some("bench")))
        .unwrap_or_else(|e| panic!("crossbar's db: {e}"));
    let work: Vec<_> = hosts.iter().filter_map(Host::work).collect();
    Outcome {
        prefilled: work.iter().map(|w| w.prompt_n).sum(),
        cached: work.iter().map(|w| w.cache_n).sum(),
        // Rows with tokens are the agents' turns; the listings have none.
        queued: rows
            .iter()
            .filter(|r| r.prompt_tokens.is_some())
            .map(|r| r.queued_ms)
            .collect(),
        per_host: hosts.iter().map(Host::completions).collect(),
        listings,
    }
}

/// The UI: lists the models until told to stop; returns how many listings it got.
fn poll_models(base: &str, stop: &AtomicBool) -> u64 {
    let config = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(5)))
        .build();
    let agent = ureq::Agent::new_with_config(config);
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) {
        if agent.get(format!("{base}/v1/models")).call().is_ok() {
            n += 1;
        }
        thread::sleep(POLL_EVERY);
    }
    n
}
