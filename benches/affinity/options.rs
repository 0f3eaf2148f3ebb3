//! The benchmark's flags (after `--`; `cargo bench` adds `--bench` itself), parsed once into
//! `Options` with every default filled in: which workload, how many hosts of what size, which
//! scenarios and seeds, the pauses between turns, real servers or sims, and how crossbar's config
//! is written (its hosts' form, extra lines for its hosts and its route).

use std::path::PathBuf;

use crate::crossbar_toml::HostForm;
use crate::hosts::Real;
use crate::workload::Api;
use crate::{DECODE_US, PREFILL_US, SLOTS, SLOT_CTX};

/// The agents workloads' hosts (`--slots`, `--ctx` change them): 2 slots of 16k, or of 8k.
const AGENT_SLOTS: usize = 2;
const AGENT_CTX: u64 = 32_768;
const AGENT_SMALL_CTX: u64 = 16_384;

/// The agents workloads' sims: prefill and decode µs a token. What the real test servers do
/// under the benchmark's load (three llama-server on two cores: 4–12k prefill tokens/s, against
/// 43k alone), so the sims' slots are as busy against the think times as the real ones: at the
/// chat workload's 40/1,000 the oracle's prefill was 20–37 % above the real servers' (its
/// siblings found idle slots to wipe far more often), at this 6.5–8.4 % (docs/BENCHMARKS.md,
/// "The sims' speed").
const AGENT_SPEED: (u64, u64) = (80, 4_000);

/// Whether the agents workloads' sims keep a reply in its slot for the next turn: no, as the
/// real test servers' tiny model did not (its replies tokenize back differently: 3 turns in 29
/// found theirs; docs/BENCHMARKS.md, "The sims' replies"). The chat workload's do, as its
/// committed figures were taken.
const AGENT_REPLIES_KEPT: bool = false;

/// `--pauses long`: an agent's tools and decoding between two turns, 2 s on average (uniform, so a
/// run's length stays bounded).
const LONG_PAUSE_MS: (u64, u64) = (1_000, 3_000);

/// The pause before each of a conversation's turns but its first (`--pauses`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pauses {
    /// The workload's own: 150–450 ms (agents), 200–600 ms (chat).
    Short,
    /// 1–3 s, uniform: [`LONG_PAUSE_MS`].
    Long,
    /// None at all: each turn is sent as soon as the previous answer is in (issue 47's harness).
    None,
}

impl Pauses {
    /// The range (ms) pauses are drawn from, given the workload's own `short` one. The draw is
    /// made whatever the range (0..=0 for `None`), so every mode sends the same texts.
    pub fn range(self, short: (u64, u64)) -> (u64, u64) {
        match self {
            Pauses::Short => short,
            Pauses::Long => LONG_PAUSE_MS,
            Pauses::None => (0, 0),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Pauses::Short => "short",
            Pauses::Long => "long",
            Pauses::None => "none",
        }
    }
}

/// Which workload `--workload` plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    Chat,
    Agents,
    AgentsSmall,
}

/// Every flag, defaults filled in.
#[derive(Debug)]
pub struct Options {
    pub workload: Workload,
    pub hosts: usize,
    /// Slots per host (`-np`) and total context (`-c`; each slot gets `ctx / slots`).
    pub slots: usize,
    pub ctx: u64,
    /// TOML lines appended to crossbar's `[routes.bench]` table (`--crossbar-route-extra`).
    pub route_extra: String,
    /// crossbar's hosts pin each request to a slot (`--pin-slots`, the hosts' `pin_slots`).
    pub pin_slots: bool,
    /// How crossbar's hosts are written (`--crossbar-hosts configured|url-only`).
    pub crossbar_hosts: HostForm,
    /// TOML lines added to every crossbar host's table (`--crossbar-host-extra`, repeatable).
    pub host_extra: Vec<String>,
    /// The pauses between a conversation's turns (`--pauses short|long|none`).
    pub pauses: Pauses,
    /// The sims' prefill and decode costs in µs a token (`--prefill-us`, `--decode-us`; the chat
    /// workload's 40 and 1,000 by default, the agents workloads' [`AGENT_SPEED`]): how busy their
    /// slots are against the workload's think times, which decides how often a sibling finds an
    /// idle slot to take.
    pub prefill_us: u64,
    pub decode_us: u64,
    /// The sims keep a reply in its slot for the next turn (`--sim-replies kept|retokenized`;
    /// kept for the chat workload, [`AGENT_REPLIES_KEPT`] for the agents workloads).
    pub replies_kept: bool,
    /// The sims' slots share one prefill budget as llama-server's do (`--sim-prefill
    /// shared|parallel`; parallel, each at full speed, by default).
    pub prefill_shared: bool,
    pub conversations: usize,
    pub turns: usize,
    /// Run only this scenario (docs are then left alone, as with `real`).
    pub only: Option<String>,
    pub random_starts: bool,
    pub seed: u64,
    pub seeds: u64,
    /// Real llama-server processes instead of sims (`--llama-server BIN --model GGUF`).
    pub real: Option<Real>,
    /// The API the agents speak (`--api chat|messages|responses`).
    pub api: Api,
    /// The API the agents workloads' sub-agents speak (`--sub-api`; `api` by default): traffic
    /// mixed as when two kinds of agent share the hosts.
    pub sub_api: Option<Api>,
    /// The front ends to run (`--fronts oracle,crossbar`); empty: all. The ratios need the
    /// oracle, which always runs.
    pub fronts: Vec<String>,
    /// Every scenario's RAM prompt cache in tokens (`--ram-tokens`; the scenario's own by
    /// default): the sims' budget, and the real servers' `--cache-ram` at the test model's size.
    pub ram_tokens: Option<u64>,
}

/// The flags from the command line.
pub fn options() -> Result<Options, lexopt::Error> {
    use lexopt::prelude::*;
    let mut o = Options {
        workload: Workload::Chat,
        hosts: 3,
        slots: 0,
        ctx: 0,
        route_extra: String::new(),
        pin_slots: false,
        crossbar_hosts: HostForm::Configured,
        host_extra: Vec::new(),
        pauses: Pauses::Short,
        prefill_us: 0,
        decode_us: 0,
        replies_kept: true,
        prefill_shared: false,
        conversations: 12,
        turns: 8,
        only: None,
        random_starts: false,
        seed: 1,
        seeds: 1,
        real: None,
        api: Api::Chat,
        sub_api: None,
        fronts: Vec::new(),
        ram_tokens: None,
    };
    let (mut binary, mut model, mut slots, mut ctx) = (None, None, None, None);
    let (mut prefill_us, mut decode_us, mut replies_kept) = (None, None, None);
    let mut parser = lexopt::Parser::from_env();
    while let Some(arg) = parser.next()? {
        match arg {
            Long("bench") => {}
            Long("workload") => {
                o.workload = match parser.value()?.string()?.as_str() {
                    "chat" => Workload::Chat,
                    "agents" => Workload::Agents,
                    "agents-small" => Workload::AgentsSmall,
                    other => {
                        return Err(
                            format!("--workload {other}: chat, agents or agents-small").into()
                        )
                    }
                }
            }
            Long("hosts") => o.hosts = parser.value()?.parse::<usize>()?.max(1),
            Long("slots") => slots = Some(parser.value()?.parse::<usize>()?.max(1)),
            Long("ctx") => ctx = Some(parser.value()?.parse::<u64>()?),
            Long("crossbar-route-extra") => o.route_extra = parser.value()?.string()?,
            Long("pin-slots") => o.pin_slots = true,
            Long("crossbar-hosts") => {
                let name = parser.value()?.string()?;
                o.crossbar_hosts = HostForm::parse(&name)
                    .ok_or(format!("--crossbar-hosts {name}: configured or url-only"))?;
            }
            Long("crossbar-host-extra") => o.host_extra.push(parser.value()?.string()?),
            Long("pauses") => {
                o.pauses = match parser.value()?.string()?.as_str() {
                    "short" => Pauses::Short,
                    "long" => Pauses::Long,
                    "none" => Pauses::None,
                    other => return Err(format!("--pauses {other}: short, long or none").into()),
                }
            }
            Long("prefill-us") => prefill_us = Some(parser.value()?.parse()?),
            Long("decode-us") => decode_us = Some(parser.value()?.parse()?),
            Long("sim-replies") => {
                replies_kept = match parser.value()?.string()?.as_str() {
                    "kept" => Some(true),
                    "retokenized" => Some(false),
                    other => {
                        return Err(format!("--sim-replies {other}: kept or retokenized").into())
                    }
                }
            }
            Long("sim-prefill") => {
                o.prefill_shared = match parser.value()?.string()?.as_str() {
                    "shared" => true,
                    "parallel" => false,
                    other => {
                        return Err(format!("--sim-prefill {other}: shared or parallel").into())
                    }
                }
            }
            Long("conversations") => o.conversations = parser.value()?.parse()?,
            Long("turns") => o.turns = parser.value()?.parse()?,
            // A scenario's name, or `ui-poll` for the polling UI's comparison alone.
            Long("only") => o.only = Some(parser.value()?.string()?),
            Long("random-starts") => o.random_starts = true,
            Long("seed") => o.seed = parser.value()?.parse()?,
            Long("seeds") => o.seeds = parser.value()?.parse::<u64>()?.max(1),
            Long("api") => {
                let name = parser.value()?.string()?;
                o.api = Api::parse(&name)
                    .ok_or(format!("--api {name}: chat, messages or responses"))?;
            }
            Long("sub-api") => {
                let name = parser.value()?.string()?;
                let api = Api::parse(&name)
                    .ok_or(format!("--sub-api {name}: chat, messages or responses"))?;
                o.sub_api = Some(api);
            }
            Long("fronts") => {
                let list = parser.value()?.string()?;
                o.fronts = list.split(',').map(|f| f.trim().to_string()).collect();
            }
            Long("ram-tokens") => o.ram_tokens = Some(parser.value()?.parse()?),
            Long("llama-server") => binary = Some(PathBuf::from(parser.value()?)),
            Long("model") => model = Some(PathBuf::from(parser.value()?)),
            _ => return Err(arg.unexpected()),
        }
    }
    o.real = match (binary, model) {
        (Some(binary), Some(model)) => Some(Real { binary, model }),
        (None, None) => None,
        _ => return Err("--llama-server and --model go together".into()),
    };
    let (default_slots, default_ctx, speed, kept) = match o.workload {
        Workload::Chat => (
            SLOTS,
            SLOT_CTX * SLOTS as u64,
            (PREFILL_US, DECODE_US),
            true,
        ),
        Workload::Agents => (AGENT_SLOTS, AGENT_CTX, AGENT_SPEED, AGENT_REPLIES_KEPT),
        Workload::AgentsSmall => (
            AGENT_SLOTS,
            AGENT_SMALL_CTX,
            AGENT_SPEED,
            AGENT_REPLIES_KEPT,
        ),
    };
    o.slots = slots.unwrap_or(default_slots);
    o.ctx = ctx.unwrap_or(default_ctx);
    o.prefill_us = prefill_us.unwrap_or(speed.0);
    o.decode_us = decode_us.unwrap_or(speed.1);
    o.replies_kept = replies_kept.unwrap_or(kept);
    Ok(o)
}
