//! Issue 7's benchmark: how much prefill crossbar's stickiness saves, against what people run
//! instead, on one workload in one run. `make bench-affinity` installs nginx and gnuplot if missing
//! and runs `cargo bench --bench affinity`; docs/BENCHMARKS.md explains the method.
//!
//! Owns: N simulated llama-servers per run (in-process `crossbar::sim`, fresh caches every run), the
//! front end under test (see `frontend`), the agent clients (`workload`), and the report (`report`).
//! Must not: bind anything but loopback, set a logger (crossbar's log lines would drown the table),
//! or assert on figures — it prints them and writes docs/BENCHMARKS.md and docs/affinity.png.
//!
//! The last line is machine-readable:
//! `affinity crossbar_over_oracle=<prefilled ratio> rr_over_crossbar=<history re-prefilled ratio>`
//! (roomy RAM cache, no host killed). `--workload agents|agents-small` runs issue 23's coding-agent
//! sessions instead (`agents_run`), which print their own tables and last line.

mod agents;
mod agents_report;
mod agents_run;
mod crossbar_toml;
mod figures;
mod frontend;
mod hosts;
#[path = "../nginx_proc.rs"]
mod nginx_proc;
mod options;
mod report;
mod smg;
mod uipoll;
mod workload;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crossbar_toml::{Form, HostForm};
use figures::{Figures, TurnFacts};
use frontend::{Kind, Running};
use hosts::{Host, Setup, Work};
use options::{options, Options, Pauses, Workload};
use workload::{Api, Shape};

/// One way of running the hosts.
#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    pub name: &'static str,
    pub ram_cache_tokens: u64,
    /// llama-server's `--slot-prompt-similarity` on every host.
    pub similarity: f64,
    /// Kill the busiest host once half of all turns are done.
    pub kill: bool,
}

/// About llama-server's default `--cache-ram` (8 GiB) of a 7B model's KV cache (~56 KiB a token).
const ROOMY: u64 = 150_000;
/// Room for one or two of these conversations.
const SMALL: u64 = 8_192;
/// llama-server's default `--slot-prompt-similarity`.
const SPS: f64 = 0.10;
const SCENARIOS: [Scenario; 4] = [
    Scenario {
        name: "roomy",
        ram_cache_tokens: ROOMY,
        similarity: SPS,
        kill: false,
    },
    Scenario {
        name: "small",
        ram_cache_tokens: SMALL,
        similarity: SPS,
        kill: false,
    },
    Scenario {
        name: "killed",
        ram_cache_tokens: ROOMY,
        similarity: SPS,
        kill: true,
    },
    // The operator's fix for conversations that share a system prompt (docs/OPERATIONS.md).
    Scenario {
        name: "sps0",
        ram_cache_tokens: ROOMY,
        similarity: 0.0,
        kill: false,
    },
];

/// Per host: slots (`-np`), per-slot context, and the simulated costs. Prefill is scaled down from a
/// real GPU's (~1-3 ms/token for a big model on a homelab card) so a whole run takes about a minute;
/// token counts, not seconds, carry the result, and the ratios hold at any scale.
const SLOTS: usize = 4;
const SLOT_CTX: u64 = 16_384;
const PREFILL_US: u64 = 40;
const DECODE_US: u64 = 1_000;

/// One front end's result in one scenario.
#[derive(Debug, Clone)]
pub struct Row {
    pub scenario: &'static str,
    pub kind: Kind,
    pub figures: Figures,
    /// The host killed in each run of the scenario (one per seed), if any.
    pub killed: Vec<usize>,
    /// Completions each host ran (where the front end put the work).
    pub per_host: Vec<u64>,
}

fn main() {
    // `cargo test --all-targets` (the gate) runs this target without `--bench`: skip there.
    if !std::env::args().any(|a| a == "--bench") {
        println!("affinity: skipped (run `make bench-affinity`)");
        return;
    }
    let opts = options().unwrap_or_else(|e| {
        eprintln!("affinity: {e} (flags: --workload chat|agents|agents-small --hosts N --slots N --ctx TOTAL --conversations C --turns T --only SCENARIO|ui-poll --random-starts --seed S --seeds N --api chat|messages|responses --sub-api API --llama-server BIN --model GGUF --crossbar-route-extra TOML --crossbar-hosts configured|url-only --crossbar-host-extra TOML --pin-slots --pauses short|long|none --prefill-us N --decode-us N --sim-replies kept|retokenized --sim-prefill shared|parallel)");
        std::process::exit(2)
    });
    if opts.workload != Workload::Chat {
        if let Err(e) = agents_run::main(&opts, opts.workload == Workload::AgentsSmall) {
            eprintln!("affinity: {e}");
            std::process::exit(1)
        }
        return;
    }
    let hosts = opts.hosts;
    let shape = Shape {
        conversations: opts.conversations.max(1),
        turns: opts.turns.max(1),
        shared_system_tokens: 2_000,
        own_system_tokens: 400,
        user_tokens: (100, 500),
        reply_tokens: 32,
        think_ms: opts.pauses.range((200, 600)),
        start_spread_ms: 1_000,
        random_starts: opts.random_starts,
        seed: opts.seed,
        api: opts.api,
    };
    let dir = temp_dir();
    let kind_of_host = match &opts.real {
        Some(real) => format!("real llama-server {}", real.binary.display()),
        None => format!(
            "simulated, prefill {} us/token, decode {} us/token",
            opts.prefill_us, opts.decode_us
        ),
    };
    println!(
        "crossbar cache-affinity benchmark: {hosts} hosts x {} slots, {} conversations x {} \
         turns, api {}, pauses {} ({}-{} ms); crossbar's hosts {}; hosts {kind_of_host}\n",
        opts.slots,
        shape.conversations,
        shape.turns,
        shape.api.name(),
        opts.pauses.name(),
        shape.think_ms.0,
        shape.think_ms.1,
        crossbar_toml::describe(&crossbar_form(&opts, 0.0, &host_extra(&opts))),
    );
    if opts.only.as_deref() == Some("ui-poll") {
        uipoll::run(
            &setup(SCENARIOS[0], shape.reply_tokens, &opts),
            hosts,
            &shape,
            &dir,
        );
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    println!("{}", report::header());
    let mut rows = Vec::new();
    let chosen = SCENARIOS
        .iter()
        .filter(|s| opts.only.as_deref().is_none_or(|o| o == s.name));
    for &scenario in chosen {
        let wanted = |k: &Kind| {
            *k == Kind::Oracle
                || opts.fronts.is_empty()
                || opts.fronts.iter().any(|n| n == k.name())
        };
        'kinds: for kind in Kind::ALL.into_iter().filter(wanted) {
            let mut sum = Sample::default();
            for seed in opts.seed..opts.seed + opts.seeds {
                let shape = Shape {
                    seed,
                    ..shape.clone()
                };
                match run(scenario, kind, &opts, &shape, &dir) {
                    Ok(s) => sum.add(s),
                    Err(e) => {
                        // That front end is left out of the table; the others still run.
                        println!("{:>8} {:>9} not run: {e}", scenario.name, kind.name());
                        continue 'kinds;
                    }
                }
            }
            let row = sum.row(scenario, kind);
            println!("{}", report::line(&row, &rows));
            rows.push(row);
        }
        println!();
    }
    if opts.only.is_none() && opts.real.is_none() {
        uipoll::run(
            &setup(SCENARIOS[0], shape.reply_tokens, &opts),
            hosts,
            &shape,
            &dir,
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    for line in report::ratios(&rows) {
        println!("{line}");
    }
    // The committed figures are the simulated chat ones on stock hosts; other runs only print.
    let stock = opts.slots == SLOTS
        && opts.ctx == SLOT_CTX * SLOTS as u64
        && opts.route_extra.is_empty()
        && opts.host_extra.is_empty()
        && opts.crossbar_hosts == HostForm::Configured
        && opts.pauses == Pauses::Short
        && !opts.pin_slots;
    let whole = opts.only.is_none() && opts.fronts.is_empty();
    if whole && opts.real.is_none() && opts.api == Api::Chat && stock {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let seeds = opts.seed..opts.seed + opts.seeds;
        match report::write_docs(&root, &rows, hosts, &shape, seeds) {
            Ok(written) => println!("\nwrote {written}"),
            Err(e) => println!("\ndocs not written: {e}"),
        }
    }
    println!("{}", report::last_line(&rows));
}

/// What runs left behind, summed over seeds; figures are computed once over the sum.
#[derive(Debug, Default)]
struct Sample {
    turns: Vec<TurnFacts>,
    prompt_n: u64,
    cache_n: u64,
    wall_s: f64,
    per_host: Vec<u64>,
    killed: Vec<usize>,
}

impl Sample {
    fn add(&mut self, other: Sample) {
        self.turns.extend(other.turns);
        self.prompt_n += other.prompt_n;
        self.cache_n += other.cache_n;
        self.wall_s += other.wall_s;
        self.per_host
            .resize(other.per_host.len().max(self.per_host.len()), 0);
        for (sum, n) in self.per_host.iter_mut().zip(other.per_host) {
            *sum += n;
        }
        self.killed.extend(other.killed);
    }

    fn row(self, scenario: Scenario, kind: Kind) -> Row {
        Row {
            scenario: scenario.name,
            kind,
            figures: figures::figures(&self.turns, self.prompt_n, self.cache_n, self.wall_s),
            killed: self.killed,
            per_host: self.per_host,
        }
    }
}

/// One run: fresh hosts, the front end, the whole workload once; an error when a host or the
/// front end could not start.
fn run(
    scenario: Scenario,
    kind: Kind,
    opts: &Options,
    shape: &Shape,
    dir: &Path,
) -> Result<Sample, String> {
    let setup = setup(scenario, shape.reply_tokens, opts);
    let hosts: Vec<Host> = (0..opts.hosts)
        .map(|_| Host::start(&setup, opts.real.as_ref()))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("cannot start a host: {e}"))?;
    let running = start_front(kind, &hosts, &setup, opts, dir)?;
    let killed = Mutex::new(None);
    let at_half = || {
        if scenario.kill {
            // The busiest host so far: where a front end put most of its work, it loses most.
            let busiest = (0..hosts.len()).max_by_key(|&i| hosts[i].completions());
            if let Some(i) = busiest {
                hosts[i].kill();
                *killed.lock() = Some(i);
            }
        }
    };
    let (turns, wall) = workload::play(shape, &running, &at_half);
    drop(running);
    let work: Option<Vec<Work>> = hosts.iter().map(Host::work).collect();
    // A real server's own counts are not at hand: the clients' `timings` stand in.
    let (prompt_n, cache_n) = match &work {
        Some(w) => (
            w.iter().map(|s| s.prompt_n).sum(),
            w.iter().map(|s| s.cache_n).sum(),
        ),
        None => (
            turns.iter().filter(|t| t.ok).map(|t| t.prompt_n).sum(),
            turns.iter().filter(|t| t.ok).map(|t| t.cache_n).sum(),
        ),
    };
    let killed = killed.lock().take();
    Ok(Sample {
        turns,
        prompt_n,
        cache_n,
        wall_s: wall.as_secs_f64(),
        per_host: hosts.iter().map(Host::completions).collect(),
        killed: killed.into_iter().collect(),
    })
}

/// The hosts of every run of `scenario`, replying `reply_tokens` a turn (the agents workload's too).
pub fn setup(scenario: Scenario, reply_tokens: u64, opts: &Options) -> Setup {
    Setup {
        slots: opts.slots,
        slot_ctx: opts.ctx / opts.slots as u64,
        prefill_us: opts.prefill_us,
        decode_us: opts.decode_us,
        replies_kept: opts.replies_kept,
        prefill_shared: opts.prefill_shared,
        ram_cache_tokens: opts.ram_tokens.unwrap_or(scenario.ram_cache_tokens),
        similarity: scenario.similarity,
        reply_tokens,
    }
}

/// The front end `kind` in front of `hosts` (crossbar told how they run), ready for the workload:
/// crossbar once it has polled every host.
fn start_front(
    kind: Kind,
    hosts: &[Host],
    setup: &Setup,
    opts: &Options,
    dir: &Path,
) -> Result<Running, String> {
    let extra = host_extra(opts);
    let running = Running::start(
        kind,
        hosts,
        dir,
        &crossbar_form(opts, setup.similarity, &extra),
    )?;
    if let Running::Crossbar(Some(server), _) = &running {
        wait_for_first_polls(server, opts.hosts)?;
    }
    Ok(running)
}

/// How the flags write crossbar's config, for hosts run with `similarity`.
fn crossbar_form<'a>(opts: &'a Options, similarity: f64, host_extra: &'a str) -> Form<'a> {
    Form {
        hosts: opts.crossbar_hosts,
        host_extra,
        route_extra: &opts.route_extra,
        slots: opts.slots,
        similarity,
    }
}

/// Every crossbar host's extra lines (`--crossbar-host-extra`, `--pin-slots`).
fn host_extra(opts: &Options) -> String {
    crossbar_toml::host_lines(&opts.host_extra, opts.pin_slots)
}

/// Until crossbar has polled a host it cannot know the host serves the model.
fn wait_for_first_polls(server: &crossbar::server::Server, n: usize) -> Result<(), String> {
    let gw = server.gateway();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(0..n).all(|i| {
        gw.health
            .get(&format!("h{i}"))
            .is_some_and(|s| s.last_poll > 0)
    }) {
        if Instant::now() > deadline {
            return Err("crossbar never polled its hosts within 10 s".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

fn temp_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("crossbar-affinity-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}
