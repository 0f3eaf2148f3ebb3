//! Issue 23's workload: coding-agent sessions whose conversations share long system prompts.
//!
//! S sessions arrive over time and at most `running` run at once: the next in arrival order starts
//! when one finishes. A session's main conversation has the agents' system prompt (instructions and
//! tool definitions, written into the system message's text), the same for every session: family 0.
//! Once, after a seeded number of main turns, the session runs a sub-agent conversation to its end,
//! with the sub-agents' own shared system prompt (family 1), and its last reply goes back to the main
//! conversation with the next tool output. Every turn appends tool output and streams a short reply
//! that joins the history, through `workload`'s `attempt` and `words` (so sims and real servers
//! count tokens alike).
//!
//! Texts, pauses and arrival times are fixed by the seed. A conversation's place in arrival order,
//! which the oracles place by, is taken when it sends its first turn.
//! Must not: panic on a failed request (it is counted and retried), or sleep but for pacing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use fastrand::Rng;
use parking_lot::{Condvar, Mutex};
use serde_json::{json, Value};

use crate::figures::TurnFacts;
use crate::workload::{self, words, Api, ATTEMPTS, RETRY_PAUSE};

/// Sizes and pacing of the agents workload.
#[derive(Debug, Clone)]
pub struct AgentShape {
    pub sessions: usize,
    /// Sessions running at once.
    pub running: usize,
    pub main_turns: usize,
    pub sub_turns: usize,
    /// Tokens of each family's shared system prompt.
    pub shared_tokens: [usize; 2],
    /// Tokens of a conversation's task (its first user message): uniform in this range.
    pub task_tokens: (usize, usize),
    /// Tokens of a turn's tool output: uniform in this range.
    pub tool_tokens: (usize, usize),
    pub reply_tokens: u64,
    /// Pause before every turn but a session's first (ms): uniform in this range (`--pauses`).
    pub think_ms: (u64, u64),
    /// Between one session's arrival and the next (ms).
    pub arrival_gap_ms: (u64, u64),
    pub seed: u64,
    pub api: Api,
    /// The sub-agents' API (family 1's).
    pub sub_api: Api,
    /// The hosts' tokens per token of `words` (1 on sims; ~1.5 with a Llama-3 vocabulary), measured
    /// once: every size above is divided by it, so sims and real servers see the same token counts.
    pub host_tokens_per_word_token: f64,
}

impl AgentShape {
    /// `--workload agents` (8,037- and 3,037-token prompts) or `agents-small` (3,028 and 1,522).
    pub fn new(small: bool, seed: u64, api: Api) -> AgentShape {
        AgentShape {
            sessions: 12,
            running: 4,
            main_turns: 10,
            sub_turns: 4,
            shared_tokens: if small {
                [3_028, 1_522]
            } else {
                [8_037, 3_037]
            },
            task_tokens: (60, 200),
            tool_tokens: (150, 400),
            reply_tokens: 32,
            think_ms: (150, 450),
            arrival_gap_ms: (300, 1_200),
            seed,
            api,
            sub_api: api,
            host_tokens_per_word_token: 1.0,
        }
    }

    pub fn requests(&self) -> usize {
        self.sessions * (self.main_turns + self.sub_turns)
    }

    /// `words`' size for `tokens` of the hosts' tokens.
    fn units(&self, tokens: usize) -> usize {
        (tokens as f64 / self.host_tokens_per_word_token).round() as usize
    }

    /// About a uniform `range` of the hosts' tokens of pseudo-words.
    fn draw(&self, rng: &mut Rng, range: (usize, usize)) -> String {
        let n = rng.usize(range.0..=range.1);
        words(rng, self.units(n))
    }
}

/// A conversation as a front end sees it: its place in arrival order and its family (0: a
/// session's main conversation, 1: a sub-agent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv {
    pub arrival: usize,
    pub family: usize,
}

/// Where a conversation's requests go; oracles also react to failures.
pub trait Target: Sync {
    /// Base URL for `conv` (the API's path is appended).
    fn base(&self, conv: Conv) -> String;
    /// An attempt of `conv` failed.
    fn failed(&self, conv: Conv);
}

/// What a client saw of one turn.
#[derive(Debug, Clone)]
pub struct AgentTurn {
    pub conv: Conv,
    pub facts: TurnFacts,
    /// Who answered (front end's header, else the URL asked); `None` for a turn given up.
    pub host: Option<String>,
}

/// The system prompt every conversation of `family` shares: instructions, then tool definitions,
/// about `shared_tokens[family]` of the hosts' tokens.
pub fn system_prompt(shape: &AgentShape, family: usize) -> String {
    let tokens = shape.units(shape.shared_tokens[family.min(1)]);
    let mut rng = Rng::with_seed(shape.seed ^ 0xfa31_1e00 ^ family as u64);
    let role = [
        "a coding agent",
        "a sub-agent that searches the repository and reports back",
    ];
    let mut s = format!(
        "You are {}. Follow these instructions.\n\n# Instructions\n{}\n\n# Tools\nCall a tool by \
         answering with one JSON object {{\"tool\": NAME, \"arguments\": {{...}}}}.\n",
        role[family.min(1)],
        words(&mut rng, tokens * 2 / 5).trim_end()
    );
    let mut i = 0;
    while s.len() < tokens * 4 {
        s.push_str(&format!(
            "\n{{\"name\": \"tool_{i}\", \"description\": \"{}\", \"parameters\": {{\"type\": \
             \"object\", \"properties\": {{\"path\": {{\"type\": \"string\", \"description\": \
             \"{}\"}}}}, \"required\": [\"path\"]}}}}",
            words(&mut rng, 60).trim_end(),
            words(&mut rng, 15).trim_end()
        ));
        i += 1;
    }
    s.truncate(tokens * 4);
    s
}

/// Plays every session against `target`. Returns the turns and the wall time.
pub fn play(shape: &AgentShape, target: &dyn Target) -> (Vec<AgentTurn>, Duration) {
    let prompts = [0, 1].map(|f| system_prompt(shape, f));
    let mut rng = Rng::with_seed(shape.seed ^ 0xa771_4a15);
    let mut at = 0;
    let arrivals: Vec<u64> = (0..shape.sessions)
        .map(|k| {
            if k > 0 {
                at += rng.u64(shape.arrival_gap_ms.0..=shape.arrival_gap_ms.1);
            }
            at
        })
        .collect();
    let next_arrival = AtomicUsize::new(0);
    let gate = Gate {
        running: shape.running.max(1),
        finished: Mutex::new(0),
        changed: Condvar::new(),
    };
    let start = Instant::now();
    let turns = thread::scope(|s| {
        let handles: Vec<_> = arrivals
            .iter()
            .enumerate()
            .map(|(k, &at)| {
                let (gate, prompts, next) = (&gate, &prompts, &next_arrival);
                s.spawn(move || {
                    // The workload's pacing: this session arrives `at` ms into the run.
                    let due = start + Duration::from_millis(at);
                    thread::sleep(due.saturating_duration_since(Instant::now()));
                    let _permit = gate.enter(k);
                    let mut session = Session {
                        shape,
                        prompts,
                        next,
                        target,
                        agent: workload::client(),
                        out: Vec::new(),
                    };
                    session.run(k);
                    session.out
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("agent session thread"))
            .collect()
    });
    (turns, start.elapsed())
}

/// The prefill floor: each family's shared prompt (`shared` tokens, as the hosts count them)
/// prefilled once in all, and every other token once — a conversation's first turn everything after
/// its shared prompt, each later turn what it appended since its previous one.
pub fn floor(turns: &[AgentTurn], shared: [u64; 2]) -> u64 {
    let mut last: HashMap<usize, u64> = HashMap::new();
    let mut families = [false; 2];
    let mut sum = 0;
    for t in turns.iter().filter(|t| t.facts.ok) {
        let family = t.conv.family.min(1);
        families[family] = true;
        let prev = last.entry(t.conv.arrival).or_insert(shared[family]);
        let prompt = t.facts.prompt_n + t.facts.cache_n;
        sum += prompt.saturating_sub(*prev);
        *prev = prompt.max(*prev);
    }
    sum + (0..2)
        .filter(|&f| families[f])
        .map(|f| shared[f])
        .sum::<u64>()
}

/// At most `running` sessions at once, started in arrival order.
struct Gate {
    running: usize,
    /// Sessions finished so far; session `k` may start once `k < finished + running`.
    finished: Mutex<usize>,
    changed: Condvar,
}

impl Gate {
    fn enter(&self, k: usize) -> Permit<'_> {
        let mut finished = self.finished.lock();
        while k >= *finished + self.running {
            self.changed.wait(&mut finished);
        }
        Permit(self)
    }
}

/// A running session's place; freed (and the next session woken) on drop, however it ends.
struct Permit<'a>(&'a Gate);

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        *self.0.finished.lock() += 1;
        self.0.changed.notify_all();
    }
}

/// One session's client: its main conversation and, once, a sub-agent's.
struct Session<'a> {
    shape: &'a AgentShape,
    prompts: &'a [String; 2],
    next: &'a AtomicUsize,
    target: &'a dyn Target,
    agent: ureq::Agent,
    out: Vec<AgentTurn>,
}

impl Session<'_> {
    fn run(&mut self, k: usize) {
        let shape = self.shape;
        let mut rng = Rng::with_seed(shape.seed.rotate_left(32) ^ 0xa9e7 ^ k as u64);
        let sub_at = rng.usize(2..=shape.main_turns.saturating_sub(2).max(2));
        let mut main = self.open(0);
        for turn in 0..shape.main_turns {
            let mut text = if turn == 0 {
                format!(
                    "session {k} task: {}",
                    shape.draw(&mut rng, shape.task_tokens)
                )
            } else {
                self.think(&mut rng);
                format!(
                    "session {k} turn {turn} tool output: {}",
                    shape.draw(&mut rng, shape.tool_tokens)
                )
            };
            if turn == sub_at {
                let result = self.sub_agent(k, &mut rng);
                text = format!("sub-agent result: {result}\n{text}");
            }
            self.turn(&mut main, text);
        }
    }

    /// The sub-agent's whole conversation; its last reply.
    fn sub_agent(&mut self, k: usize, rng: &mut Rng) -> String {
        let shape = self.shape;
        let mut sub = self.open(1);
        for turn in 0..shape.sub_turns {
            self.think(rng);
            let text = if turn == 0 {
                format!(
                    "session {k} sub-agent task: {}",
                    shape.draw(rng, shape.task_tokens)
                )
            } else {
                format!(
                    "session {k} sub-agent turn {turn} tool output: {}",
                    shape.draw(rng, shape.tool_tokens)
                )
            };
            self.turn(&mut sub, text);
        }
        sub.reply
    }

    fn open(&self, family: usize) -> Conversation {
        Conversation {
            conv: Conv {
                arrival: self.next.fetch_add(1, Ordering::SeqCst),
                family,
            },
            messages: vec![json!({"role": "system", "content": self.prompts[family]})],
            prev_prompt: 0,
            prev_host: None,
            reply: String::new(),
        }
    }

    /// Drawn even when the range is 0..=0 (`--pauses none`), so every mode sends the same texts.
    fn think(&self, rng: &mut Rng) {
        let (lo, hi) = self.shape.think_ms;
        let ms = rng.u64(lo..=hi);
        if ms > 0 {
            thread::sleep(Duration::from_millis(ms));
        }
    }

    /// One turn with retries, as `workload` plays them; a turn given up leaves the history as it was.
    fn turn(&mut self, c: &mut Conversation, text: String) {
        c.messages.push(json!({"role": "user", "content": text}));
        let api = match c.conv.family {
            0 => self.shape.api,
            _ => self.shape.sub_api,
        };
        let (path, body) = api.request(&c.messages, self.shape.reply_tokens);
        let mut record = AgentTurn {
            conv: c.conv,
            facts: TurnFacts {
                prev_prompt: c.prev_prompt,
                ..TurnFacts::default()
            },
            host: None,
        };
        for _ in 0..ATTEMPTS {
            let base = self.target.base(c.conv);
            match workload::attempt(&self.agent, api, &format!("{base}{path}"), &body) {
                Ok(a) => {
                    let host = a.served_by.unwrap_or(base);
                    let f = &mut record.facts;
                    f.moved = c.prev_host.as_ref().is_some_and(|p| *p != host);
                    f.ok = true;
                    f.ttfb_ms = a.ttfb_ms;
                    f.prompt_n = a.prompt_n;
                    f.cache_n = a.cache_n;
                    c.prev_prompt = a.prompt_n + a.cache_n;
                    c.prev_host = Some(host.clone());
                    record.host = Some(host);
                    c.messages
                        .push(json!({"role": "assistant", "content": a.reply}));
                    c.reply = a.reply;
                    break;
                }
                Err(_) => {
                    record.facts.failed_attempts += 1;
                    self.target.failed(c.conv);
                    thread::sleep(RETRY_PAUSE);
                }
            }
        }
        if !record.facts.ok {
            c.messages.pop();
        }
        self.out.push(record);
    }
}

struct Conversation {
    conv: Conv,
    messages: Vec<Value>,
    prev_prompt: u64,
    prev_host: Option<String>,
    /// The last reply (a sub-agent's result).
    reply: String,
}
