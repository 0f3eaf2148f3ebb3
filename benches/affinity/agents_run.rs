//! `--workload agents|agents-small` (issue 23): the agent sessions of `agents` against crossbar, the
//! sticky round-robin oracle, nginx `least_conn`, the family-sticky oracle and smg (SGLang's
//! cache-aware router, issue 47), one scenario at a time,
//! while a UI polls `GET /v1/models` on the front end under test; the family floor is computed from
//! the sticky oracle's turns. The table is `agents_report`'s.
//!
//! Owns: the runs (fresh hosts and front end each), the UI poller, and the shared prompts' sizes as
//! the hosts count them (`/apply-template` and `/tokenize`, answered by sims and real servers alike).
//! Must not: bind anything but loopback, panic when a host or front end fails to start (its row says
//! so and the others run), or assert on figures.

use std::path::Path;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{json, Value};

use crate::agents::{self, AgentShape, AgentTurn, Conv, Target};
use crate::agents_report::{self as report, Row};
use crate::frontend::{Kind, Running};
use crate::hosts::{Host, Setup};
use crate::options::Options;
use crate::workload::words;
use crate::{Scenario, ROOMY, SPS};

/// llama-server's defaults, and the operator's fix for conversations sharing a system prompt.
pub const SCENARIOS: [Scenario; 2] = [
    Scenario {
        name: "defaults",
        ram_cache_tokens: ROOMY,
        similarity: SPS,
        kill: false,
    },
    Scenario {
        name: "sps0",
        ram_cache_tokens: ROOMY,
        similarity: 0.0,
        kill: false,
    },
];

/// How often the UI asks for the model list.
const POLL_EVERY: Duration = Duration::from_millis(500);

/// The front ends compared, in run order (the sticky oracle first: every row shows its ratio to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Front {
    Oracle,
    Crossbar,
    NginxLc,
    Family,
    Smg,
}

impl Front {
    pub const ALL: [Front; 5] = [
        Front::Oracle,
        Front::Crossbar,
        Front::NginxLc,
        Front::Family,
        Front::Smg,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Front::Oracle => "oracle",
            Front::Crossbar => "crossbar",
            Front::NginxLc => "nginx-lc",
            Front::Family => "family-oracle",
            Front::Smg => "smg",
        }
    }
}

/// What one front end's runs left behind, summed over seeds.
#[derive(Debug, Default)]
pub struct Sample {
    pub turns: Vec<AgentTurn>,
    pub wall_s: f64,
    pub per_host: Vec<u64>,
    /// Per host: conversations whose first answered turn it served, per family.
    pub placed: Vec<[u64; 2]>,
    pub listings: u64,
    pub floor: u64,
}

impl Sample {
    fn add(&mut self, o: Sample) {
        self.turns.extend(o.turns);
        self.wall_s += o.wall_s;
        let n = self.per_host.len().max(o.per_host.len());
        self.per_host.resize(n, 0);
        self.placed.resize(n, [0, 0]);
        for (i, c) in o.per_host.iter().enumerate() {
            self.per_host[i] += c;
        }
        for (i, p) in o.placed.iter().enumerate() {
            self.placed[i][0] += p[0];
            self.placed[i][1] += p[1];
        }
        self.listings += o.listings;
        self.floor += o.floor;
    }
}

/// The whole `--workload agents|agents-small` benchmark.
pub fn main(opts: &Options, small: bool) -> Result<(), String> {
    let mut shape = AgentShape::new(small, opts.seed, opts.api);
    shape.sub_api = opts.sub_api.unwrap_or(opts.api);
    shape.think_ms = opts.pauses.range(shape.think_ms);
    let shared = measure(&setup(SCENARIOS[0], opts), opts, &mut shape)?;
    let hosts_are = match &opts.real {
        Some(real) => format!("real llama-server {}", real.binary.display()),
        None => format!(
            "simulated, prefill {} us/token{}, decode {} us/token, replies {}",
            opts.prefill_us,
            if opts.prefill_shared {
                " shared by the slots"
            } else {
                ""
            },
            opts.decode_us,
            if opts.replies_kept {
                "kept"
            } else {
                "retokenized"
            }
        ),
    };
    println!(
        "crossbar cache-affinity benchmark, workload {}: {} hosts x {} slots (ctx {}, {} per slot); \
         {} sessions ({} at once) x ({} main + {} sub-agent turns) = {} requests, api {}; shared \
         prompts {} + {} tokens ({} + {} as the hosts count them; they count {:.2} tokens per 4 \
         bytes of generated text); pauses between turns {} ({}-{} ms); a UI polls /v1/models every \
         {} ms; seeds {}..={}; crossbar's hosts {}; hosts {hosts_are}\n",
        if small { "agents-small" } else { "agents" },
        opts.hosts,
        opts.slots,
        opts.ctx,
        opts.ctx / opts.slots as u64,
        shape.sessions,
        shape.running,
        shape.main_turns,
        shape.sub_turns,
        shape.requests(),
        match shape.sub_api == shape.api {
            true => shape.api.name().to_string(),
            false => format!("{} (sub-agents {})", shape.api.name(), shape.sub_api.name()),
        },
        shape.shared_tokens[0],
        shape.shared_tokens[1],
        shared[0],
        shared[1],
        shape.host_tokens_per_word_token,
        opts.pauses.name(),
        shape.think_ms.0,
        shape.think_ms.1,
        POLL_EVERY.as_millis(),
        opts.seed,
        opts.seed + opts.seeds - 1,
        crate::crossbar_toml::describe(&crate::crossbar_form(opts, 0.0, &crate::host_extra(opts))),
    );
    let dir = crate::temp_dir();
    let mut rows: Vec<Row> = Vec::new();
    let chosen = SCENARIOS
        .iter()
        .filter(|s| opts.only.as_deref().is_none_or(|o| o == s.name));
    for &scenario in chosen {
        println!("{}", report::header());
        let mut floor = None;
        let wanted = |f: &Front| {
            *f == Front::Oracle
                || opts.fronts.is_empty()
                || opts.fronts.iter().any(|n| n == f.name())
        };
        'fronts: for front in Front::ALL.into_iter().filter(wanted) {
            let mut sum = Sample::default();
            for seed in opts.seed..opts.seed + opts.seeds {
                let shape = AgentShape {
                    seed,
                    ..shape.clone()
                };
                match run(scenario, front, opts, &shape, shared, &dir) {
                    Ok(s) => sum.add(s),
                    Err(e) => {
                        // That front end is left out of the table; the others still run.
                        println!("{:>8} {:>13} not run: {e}", scenario.name, front.name());
                        continue 'fronts;
                    }
                }
            }
            floor.get_or_insert(sum.floor);
            let row = Row::new(scenario.name, Some(front), &sum);
            println!("{}", report::line(&row, &rows));
            rows.push(row);
        }
        let row = Row::floor(scenario.name, floor.unwrap_or(0));
        println!("{}\n", report::line(&row, &rows));
        rows.push(row);
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!("{}", report::last_line(&rows, small));
    Ok(())
}

/// The hosts of every run of `scenario`: the chat workload's, replying 32 tokens a turn.
fn setup(scenario: Scenario, opts: &Options) -> Setup {
    crate::setup(scenario, 32, opts)
}

/// One run: fresh hosts, the front end, the UI poller, the whole workload once.
fn run(
    scenario: Scenario,
    front: Front,
    opts: &Options,
    shape: &AgentShape,
    shared: [u64; 2],
    dir: &Path,
) -> Result<Sample, String> {
    let setup = setup(scenario, opts);
    // The hosts first: smg retries a worker it found unhealthy only after 30 s.
    let hosts: Vec<Host> = (0..opts.hosts)
        .map(|_| Host::start(&setup, opts.real.as_ref()))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("cannot start a host: {e}"))?;
    let started = match front {
        Front::Family => Started::Family(FamilyOracle {
            urls: hosts.iter().map(Host::url).collect(),
            moved: Mutex::new(Vec::new()),
        }),
        Front::Oracle | Front::Crossbar | Front::NginxLc | Front::Smg => {
            let kind = match front {
                Front::Oracle => Kind::Oracle,
                Front::Crossbar => Kind::Crossbar,
                Front::Smg => Kind::Smg,
                _ => Kind::LeastConn,
            };
            Started::Running(crate::start_front(kind, &hosts, &setup, opts, dir)?)
        }
    };
    // The UI asks wherever the workload's first conversation goes: the front end's one address.
    let ui_base = started.base(Conv {
        arrival: 0,
        family: 0,
    });
    let (stop, stopped) = mpsc::channel::<()>();
    let (turns, wall, listings) = thread::scope(|s| {
        let ui = s.spawn(move || poll_models(&ui_base, &stopped));
        let (turns, wall) = agents::play(shape, &started);
        drop(stop);
        (turns, wall, ui.join().expect("UI poller thread"))
    });
    drop(started);
    let busy: Option<u64> = hosts.iter().map(Host::pinned_busy).sum();
    if let (Front::Crossbar, true, Some(busy)) = (front, opts.pin_slots, busy) {
        println!("#   crossbar: pinned requests that found their slot at work (sims): {busy}");
    }
    if std::env::var_os("AFFINITY_TRACE").is_some() {
        trace(front, &turns);
    }
    let mut placed = vec![[0u64; 2]; hosts.len()];
    for (conv, host) in first_hosts(&turns) {
        if let Some(i) = host_index(host, &hosts) {
            placed[i][conv.family.min(1)] += 1;
        }
    }
    Ok(Sample {
        floor: agents::floor(&turns, shared),
        wall_s: wall.as_secs_f64(),
        per_host: hosts.iter().map(Host::completions).collect(),
        placed,
        listings,
        turns,
    })
}

/// `AFFINITY_TRACE=1`: every first turn, in the order they finished, with where it went and
/// what it prefilled (which host prefilled a family again, and when).
fn trace(front: Front, turns: &[AgentTurn]) {
    for t in turns
        .iter()
        .filter(|t| t.facts.ok && t.facts.prev_prompt == 0)
    {
        println!(
            "# trace {} conv={} family={} host={} prompt_n={} cache_n={} ttfb_ms={:.0}",
            front.name(),
            t.conv.arrival,
            t.conv.family,
            t.host.as_deref().unwrap_or("-"),
            t.facts.prompt_n,
            t.facts.cache_n,
            t.facts.ttfb_ms,
        );
    }
}

/// Each conversation and the host of its first answered turn.
fn first_hosts(turns: &[AgentTurn]) -> Vec<(Conv, &str)> {
    let mut seen = Vec::<(Conv, &str)>::new();
    for t in turns {
        if let Some(h) = &t.host {
            if !seen.iter().any(|(c, _)| *c == t.conv) {
                seen.push((t.conv, h));
            }
        }
    }
    seen
}

/// `h<i>` (crossbar's `X-Crossbar-Host`), or an address (the oracles' URL, smg's
/// `x-smg-routed-worker-id`, nginx's `X-Upstream`, which lists every upstream it tried: the last
/// one answered).
fn host_index(served: &str, hosts: &[Host]) -> Option<usize> {
    if let Some(i) = served.strip_prefix('h').and_then(|n| n.parse().ok()) {
        return Some(i);
    }
    let last = served.rsplit(", ").next()?;
    hosts
        .iter()
        .position(|h| last.ends_with(&h.addr().to_string()))
}

/// A started front end: one of the chat benchmark's, or the family-sticky oracle.
enum Started {
    Running(Running),
    Family(FamilyOracle),
}

/// Family `f` on host `f mod N`; when an attempt fails the family moves to the next host for good.
struct FamilyOracle {
    urls: Vec<String>,
    moved: Mutex<Vec<usize>>,
}

impl Target for Started {
    fn base(&self, conv: Conv) -> String {
        match self {
            Started::Running(r) => crate::workload::Target::base(r, conv.arrival),
            Started::Family(o) => {
                let shift = o.moved.lock().iter().filter(|&&f| f == conv.family).count();
                o.urls[(conv.family + shift) % o.urls.len()].clone()
            }
        }
    }

    fn failed(&self, conv: Conv) {
        match self {
            Started::Running(r) => crate::workload::Target::failed(r, conv.arrival),
            Started::Family(o) => o.moved.lock().push(conv.family),
        }
    }
}

/// The UI: lists the models every `POLL_EVERY` until `stop` closes; returns the listings it got.
fn poll_models(base: &str, stop: &Receiver<()>) -> u64 {
    let config = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(5)))
        .build();
    let agent = ureq::Agent::new_with_config(config);
    let mut n = 0;
    loop {
        if agent.get(format!("{base}/v1/models")).call().is_ok() {
            n += 1;
        }
        match stop.recv_timeout(POLL_EVERY) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return n,
        }
    }
}

/// Asks one host how it counts `words`' text (sets `host_tokens_per_word_token`), then each
/// family's shared prefix in its tokens: two first turns of the family, rendered by the host's chat
/// template and tokenized by it, have this many tokens in common.
fn measure(setup: &Setup, opts: &Options, shape: &mut AgentShape) -> Result<[u64; 2], String> {
    let host = Host::start(setup, opts.real.as_ref())?;
    let agent = ureq::agent();
    let post = |path: &str, body: Value| -> Result<Value, String> {
        let url = format!("{}{path}", host.url());
        let text = agent
            .post(&url)
            .header("Content-Type", "application/json")
            .send(body.to_string())
            .and_then(|r| r.into_body().read_to_string())
            .map_err(|e| format!("{url}: {e}"))?;
        serde_json::from_str(&text).map_err(|e| format!("{url}: {e}"))
    };
    let count = |ids: &Value| ids["tokens"].as_array().map_or(0, Vec::len);
    const SAMPLE: usize = 4_000;
    let sample = words(&mut fastrand::Rng::with_seed(shape.seed), SAMPLE);
    let n = count(&post("/tokenize", json!({ "content": sample }))?);
    // Two decimals: a sim's 4 bytes a token stay exactly 1.
    shape.host_tokens_per_word_token =
        ((n as f64 / SAMPLE as f64) * 100.0).round().max(1.0) / 100.0;
    let mut out = [0; 2];
    for (f, n) in out.iter_mut().enumerate() {
        let system = agents::system_prompt(shape, f);
        let mut tokens = Vec::new();
        for task in ["first task: read the code", "second task: fix the bug"] {
            let messages = json!([{"role": "system", "content": system},
                                  {"role": "user", "content": task}]);
            let prompt = post("/apply-template", json!({ "messages": messages }))?;
            let ids = post("/tokenize", json!({ "content": prompt["prompt"] }))?;
            tokens.push(ids["tokens"].as_array().cloned().unwrap_or_default());
        }
        *n = tokens[0]
            .iter()
            .zip(&tokens[1])
            .take_while(|(a, b)| a == b)
            .count() as u64;
    }
    Ok(out)
}
