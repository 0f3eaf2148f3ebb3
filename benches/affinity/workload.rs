//! The workload: C agent conversations of T turns, played concurrently against one front end.
//!
//! Each conversation is a coding agent: a system prompt (every other one shares one long system
//! prompt, as agents built on the same tool do), a task, then turns of tool output, each answered by
//! a short streamed reply that goes back into the history. Text is generated from a fixed seed, so
//! every front end sees exactly the same requests in the same order per conversation.
//!
//! A turn that fails (refused, 5xx, a stream cut before its end) is retried after a pause, as agents
//! do; every failed attempt is counted.
//!
//! `--api` picks the API the agents speak: Chat Completions (`data: [DONE]`, `timings`), Anthropic
//! Messages (as Claude Code: `system` on top, `event: message_stop`, the cache figures in
//! `message_start`'s usage) or OpenAI Responses (as Codex: `instructions` and typed `input` items,
//! `event: response.completed` with `timings`). The conversation and its text are the same in all
//! three, so their figures compare.

use std::io::{BufRead, BufReader};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use fastrand::Rng;

use serde_json::{json, Value};

use crate::figures::TurnFacts;

/// Sizes and pacing of the workload.
#[derive(Debug, Clone)]
pub struct Shape {
    pub conversations: usize,
    pub turns: usize,
    /// Tokens of the system prompt shared by the even-numbered conversations.
    pub shared_system_tokens: usize,
    /// Tokens of each odd-numbered conversation's own system prompt.
    pub own_system_tokens: usize,
    /// Tokens of a turn's new user content (tool output): uniform in this range.
    pub user_tokens: (usize, usize),
    /// Tokens generated per turn.
    pub reply_tokens: u64,
    /// Pause between a reply and the next turn: uniform in this range (ms; `--pauses`).
    pub think_ms: (u64, u64),
    /// Conversations start one after another, in order, over this window (ms)...
    pub start_spread_ms: u64,
    /// ...or each at a random moment in it (then which conversations share a host varies by seed).
    pub random_starts: bool,
    /// Varies every text, pause and start time; the same seed replays the same workload.
    pub seed: u64,
    /// The API the agents speak.
    pub api: Api,
}

/// The conversation APIs a workload can speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Chat,
    Messages,
    Responses,
}

impl Api {
    pub fn parse(name: &str) -> Option<Api> {
        match name {
            "chat" => Some(Api::Chat),
            "messages" => Some(Api::Messages),
            "responses" => Some(Api::Responses),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Api::Chat => "chat",
            Api::Messages => "messages",
            Api::Responses => "responses",
        }
    }

    /// The path and body of a streamed turn whose history is `messages` (system first).
    pub fn request(self, messages: &[Value], reply_tokens: u64) -> (&'static str, String) {
        let system = &messages[0]["content"];
        let rest = &messages[1..];
        let body = match self {
            Api::Chat => json!({"model": MODEL, "messages": messages, "stream": true,
                                "max_tokens": reply_tokens}),
            Api::Messages => json!({"model": MODEL, "system": system, "messages": rest,
                                    "stream": true, "max_tokens": reply_tokens}),
            Api::Responses => {
                let items: Vec<Value> = rest
                    .iter()
                    .map(|m| {
                        let kind = if m["role"] == "user" {
                            "input_text"
                        } else {
                            "output_text"
                        };
                        json!({"type": "message", "role": m["role"],
                               "content": [{"type": kind, "text": m["content"]}]})
                    })
                    .collect();
                json!({"model": MODEL, "instructions": system, "input": items, "stream": true,
                       "max_output_tokens": reply_tokens})
            }
        };
        let path = match self {
            Api::Chat => "/v1/chat/completions",
            Api::Messages => "/v1/messages",
            Api::Responses => "/v1/responses",
        };
        (path, body.to_string())
    }
}

/// Where each conversation's requests go; the oracle also reacts to failures.
pub trait Target: Sync {
    /// Base URL for `conv` (the chat path is appended).
    fn base(&self, conv: usize) -> String;
    /// An attempt of `conv` failed.
    fn failed(&self, _conv: usize) {}
}

pub const ATTEMPTS: u32 = 6;
pub const RETRY_PAUSE: Duration = Duration::from_millis(250);
/// The model name the clients ask for (every host serves it under this alias).
pub const MODEL: &str = "qwen-coder";

/// Plays every conversation against `target`; `at_half` runs once, in the client thread whose turn
/// completes the first half of all turns. Returns the turns and the wall time.
pub fn play(
    shape: &Shape,
    target: &dyn Target,
    at_half: &(dyn Fn() + Sync),
) -> (Vec<TurnFacts>, Duration) {
    let done = AtomicUsize::new(0);
    let half = shape.conversations * shape.turns / 2;
    let start = Instant::now();
    let turns = thread::scope(|s| {
        let handles: Vec<_> = (0..shape.conversations)
            .map(|conv| {
                let done = &done;
                s.spawn(move || {
                    let mut rng = Rng::with_seed(shape.seed.rotate_left(32) ^ 0x5eed ^ conv as u64);
                    let stagger = if shape.random_starts {
                        rng.u64(0..=shape.start_spread_ms)
                    } else {
                        shape.start_spread_ms * conv as u64 / shape.conversations as u64
                    };
                    thread::sleep(Duration::from_millis(stagger));
                    converse(shape, conv, &mut rng, target, &|| {
                        if done.fetch_add(1, Ordering::SeqCst) + 1 == half {
                            at_half();
                        }
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("client thread"))
            .collect()
    });
    (turns, start.elapsed())
}

fn converse(
    shape: &Shape,
    conv: usize,
    rng: &mut Rng,
    target: &dyn Target,
    turn_done: &dyn Fn(),
) -> Vec<TurnFacts> {
    let agent = client();
    let system = if conv.is_multiple_of(2) {
        words(&mut Rng::with_seed(shape.seed), shape.shared_system_tokens)
    } else {
        words(rng, shape.own_system_tokens)
    };
    let mut messages = vec![json!({"role": "system", "content": system})];
    let mut prev_prompt = 0;
    let mut prev_host: Option<String> = None;
    let mut out = Vec::with_capacity(shape.turns);
    for turn in 0..shape.turns {
        if turn > 0 {
            // Drawn even when the range is 0..=0 (`--pauses none`): every mode sends the same texts.
            let (lo, hi) = shape.think_ms;
            let ms = rng.u64(lo..=hi);
            if ms > 0 {
                thread::sleep(Duration::from_millis(ms));
            }
        }
        let (lo, hi) = shape.user_tokens;
        let n = rng.usize(lo..=hi);
        let text = format!("conversation {conv} turn {turn}: {}", words(rng, n));
        messages.push(json!({"role": "user", "content": text}));
        let (path, body) = shape.api.request(&messages, shape.reply_tokens);
        let mut record = TurnFacts {
            prev_prompt,
            shared_system: conv.is_multiple_of(2),
            ..TurnFacts::default()
        };
        for _ in 0..ATTEMPTS {
            let base = target.base(conv);
            match attempt(&agent, shape.api, &format!("{base}{path}"), &body) {
                Ok(a) => {
                    let host = a.served_by.unwrap_or(base);
                    record.moved = prev_host.as_ref().is_some_and(|p| *p != host);
                    prev_host = Some(host);
                    record.ok = true;
                    record.ttfb_ms = a.ttfb_ms;
                    record.prompt_n = a.prompt_n;
                    record.cache_n = a.cache_n;
                    prev_prompt = a.prompt_n + a.cache_n;
                    messages.push(json!({"role": "assistant", "content": a.reply}));
                    break;
                }
                Err(_) => {
                    record.failed_attempts += 1;
                    target.failed(conv);
                    thread::sleep(RETRY_PAUSE);
                }
            }
        }
        if !record.ok {
            // The agent gives up on this turn; its next turn carries on from the same history.
            messages.pop();
        }
        out.push(record);
        turn_done();
    }
    out
}

/// An agent's HTTP client: a fresh connection per request (llama-server closes streamed ones),
/// short connects, long reads (a turn may queue behind others), no overall timeout on streams.
pub fn client() -> ureq::Agent {
    let config = ureq::Agent::config_builder()
        .max_idle_connections(0)
        .max_idle_connections_per_host(0)
        .timeout_connect(Some(Duration::from_secs(2)))
        .timeout_per_read(Some(Duration::from_secs(120)))
        .build();
    ureq::Agent::new_with_config(config)
}

pub struct Answer {
    /// The host that answered, when the front end says (crossbar's `X-Crossbar-Host`, smg's
    /// `x-smg-routed-worker-id`, the benchmark's nginx `X-Upstream`); otherwise the URL asked is
    /// the host.
    pub served_by: Option<String>,
    /// Request sent → the first byte of the response's body (a streamed answer's first event).
    pub ttfb_ms: f64,
    pub reply: String,
    pub prompt_n: u64,
    pub cache_n: u64,
}

/// One streamed request. Succeeds only when the stream ends with its API's last event and the
/// prompt figures (`timings`, or Messages' usage) were in it.
pub fn attempt(agent: &ureq::Agent, api: Api, url: &str, body: &str) -> Result<Answer, String> {
    let sent = Instant::now();
    let resp = agent
        .post(url)
        .header("Content-Type", "application/json")
        .send(body)
        .map_err(|e| e.to_string())?;
    let served_by = ["X-Crossbar-Host", "X-Smg-Routed-Worker-Id", "X-Upstream"]
        .iter()
        .find_map(|h| resp.headers().get(*h)?.to_str().ok())
        .map(str::to_string);
    let mut reader = BufReader::new(resp.into_body().into_reader());
    // The first byte of the body, not of the headers: llama-server b11434 sends a streamed
    // answer's headers before its prefill (20-40 ms against 270-500 ms to the first event,
    // measured on 3k-token prompts), so only the body's first byte waits for the host's work.
    reader.fill_buf().map_err(|e| e.to_string())?;
    let ttfb_ms = sent.elapsed().as_secs_f64() * 1e3;
    let (mut reply, mut timings) = (String::new(), None);
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
            return Err("stream ended before its last event".into());
        }
        let Some(data) = line.trim_end().strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let event: Value = serde_json::from_str(data).map_err(|e| e.to_string())?;
        let n = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
        let delta = match api {
            Api::Chat => event.pointer("/choices/0/delta/content"),
            Api::Messages => event.pointer("/delta/text"),
            Api::Responses if event["type"] == "response.output_text.delta" => event.get("delta"),
            Api::Responses => None,
        };
        if let Some(text) = delta.and_then(Value::as_str) {
            reply.push_str(text);
        }
        if let Some(t) = event.get("timings") {
            timings = Some((n(t, "prompt_n"), n(t, "cache_n")));
        }
        if let Some(u) = event.pointer("/message/usage") {
            // Messages' input_tokens are the prompt tokens evaluated now, as timings.prompt_n.
            timings = Some((n(u, "input_tokens"), n(u, "cache_read_input_tokens")));
        }
        if event["type"] == "message_stop" || event["type"] == "response.completed" {
            break;
        }
    }
    let (prompt_n, cache_n) = timings.ok_or("no timings in the stream")?;
    Ok(Answer {
        served_by,
        ttfb_ms,
        reply,
        prompt_n,
        cache_n,
    })
}

/// About `tokens` tokens (4 bytes each) of pseudo-words.
pub fn words(rng: &mut Rng, tokens: usize) -> String {
    const SYLLABLES: [&str; 16] = [
        "ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "po", "du", "fi", "go", "he", "ja",
        "qu",
    ];
    let mut s = String::with_capacity(tokens * 4 + 8);
    while s.len() < tokens * 4 {
        for _ in 0..rng.usize(1..=3) {
            s.push_str(SYLLABLES[rng.usize(..SYLLABLES.len())]);
        }
        s.push(' ');
    }
    s
}
