//! Exact prompt token counts, asked of a host when the context guard's estimate says a prompt does
//! not fit. One function ([`count_call`]) maps a request's endpoint to the call that counts it:
//! each conversation API's own count endpoint (the same body in, `{"input_tokens": N}` out), older
//! builds' `/apply-template` + `/tokenize` for chat, and `/tokenize` of a completion-style `prompt`.
//!
//! These calls take no slot (llama-server answers them while every slot generates) and one
//! deadline bounds them all. Every answer is read with a size bound; a host that cannot answer
//! (an old build, an error, the deadline) gives `None`, and the guard falls back to the estimate.
//! A [`Counter`] lets at most [`PER_HOST`] requests count on one host at once: a client sending
//! many large bodies cannot turn each into tokenizer work on a host. The others wait their turn
//! within the same deadline (a count takes milliseconds), and only a request whose deadline passes
//! while it waits is judged on the estimate. Nothing here marks a host
//! down or decides where a request goes.

use std::collections::HashMap;
use std::io::Read;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::api::Api;
use crate::config::Host;

use super::MAX_BODY;

mod prompt;

/// The longest all the count calls of one request may take together.
pub(super) const COUNT_TIMEOUT: Duration = Duration::from_secs(5);

/// Requests whose count calls may be in flight to one host at once. Counting is the rare path
/// (only prompts the estimate says do not fit); a request that finds its host at the bound waits
/// for a turn until its count deadline, then is judged on the estimate.
pub const PER_HOST: usize = 2;

/// The agent count calls go through and the count calls in flight per host.
#[derive(Debug)]
pub struct Counter {
    agent: ureq::Agent,
    /// Invariant: a host is here only while it has calls in flight, at most [`PER_HOST`]; its
    /// name is a configured host's (the guard looks it up in the config first).
    in_flight: Mutex<HashMap<String, usize>>,
    /// Requests waiting for a turn, over all hosts (at most one per worker); changed only with
    /// `in_flight` locked, read without.
    waiting: AtomicUsize,
    /// Signalled whenever a permit comes back.
    returned: Condvar,
}

/// One request's right to ask `host` for counts; gives it back on drop.
#[derive(Debug)]
pub(super) struct CountPermit<'a> {
    counter: &'a Counter,
    host: String,
}

impl Counter {
    pub fn new(agent: ureq::Agent) -> Counter {
        Counter {
            agent,
            in_flight: Mutex::new(HashMap::new()),
            waiting: AtomicUsize::new(0),
            returned: Condvar::new(),
        }
    }

    /// A permit to count on `host`, waiting for one until `deadline`; `None` when none came back
    /// in time.
    pub(super) fn start(&self, host: &str, deadline: Instant) -> Option<CountPermit<'_>> {
        let mut in_flight = self.in_flight.lock();
        let full = |in_flight: &HashMap<String, usize>| {
            in_flight.get(host).is_some_and(|n| *n >= PER_HOST)
        };
        if full(&in_flight) && Instant::now() < deadline {
            self.waiting.fetch_add(1, Ordering::Relaxed);
            while full(&in_flight) {
                if self
                    .returned
                    .wait_until(&mut in_flight, deadline)
                    .timed_out()
                {
                    break;
                }
            }
            self.waiting.fetch_sub(1, Ordering::Relaxed);
        }
        let n = in_flight.entry(host.to_string()).or_insert(0);
        if *n >= PER_HOST {
            return None;
        }
        *n += 1;
        Some(CountPermit {
            counter: self,
            host: host.to_string(),
        })
    }

    /// Requests waiting for a turn to count, on any host.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    pub(super) fn agent(&self) -> &ureq::Agent {
        &self.agent
    }
}

impl Drop for CountPermit<'_> {
    fn drop(&mut self) {
        let mut in_flight = self.counter.in_flight.lock();
        if let Some(n) = in_flight.get_mut(&self.host) {
            *n -= 1;
            if *n == 0 {
                in_flight.remove(&self.host);
            }
        }
        drop(in_flight);
        self.counter.returned.notify_all();
    }
}

/// How a host counts the prompt of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CountCall {
    /// The API's count endpoint takes the request body as it is. `template`: when the host does
    /// not know the endpoint (builds before it), `/apply-template` + `/tokenize` count the same.
    Endpoint { path: &'static str, template: bool },
    /// A completion-style body: `/tokenize` its `prompt`.
    Prompt,
}

/// The count call for a request to `rest`, or `None` when crossbar knows no way to count it. The
/// endpoint is the API's own (`Api::count_path`, with `Api::count_fallback` for older builds).
pub(super) fn count_call(rest: &str) -> Option<CountCall> {
    if crate::api::is_count(rest) {
        return None; // a count is not counted
    }
    let api = Api::of(rest);
    match api.count_path() {
        Some(path) => Some(CountCall::Endpoint {
            path,
            template: api.count_fallback().is_some(),
        }),
        // A fill-in-the-middle body is more than its `prompt`: not counted that way.
        None if api == Api::Completion && rest != "/infill" => Some(CountCall::Prompt),
        None => None,
    }
}

/// A count answer is a small JSON object.
const SMALL_ANSWER: u64 = 64 * 1024;
/// `/apply-template` answers the rendered prompt: about the body's size, JSON-escaped.
const TEMPLATE_ANSWER: u64 = 2 * MAX_BODY as u64 + SMALL_ANSWER;
/// `/tokenize` answers a number per token; it is counted as it streams, never held.
const TOKENS_ANSWER: u64 = 8 * MAX_BODY as u64;

/// Asks `host` for the exact prompt token count of `body` (sent to `rest`), every call done by
/// `deadline` ([`COUNT_TIMEOUT`] from now, for the guard). `model`, when given, is the name the
/// body must carry (a router needs one). `None` when the host cannot say in time.
pub(super) fn exact(
    agent: &ureq::Agent,
    host: &Host,
    rest: &str,
    body: &[u8],
    model: Option<&str>,
    deadline: Instant,
) -> Option<u64> {
    let call = count_call(rest)?;
    let ask = Ask {
        agent,
        host,
        deadline,
    };
    match call {
        CountCall::Endpoint { path, template } => {
            let body = match model {
                Some(model) => super::model::named(body, model),
                None => body.into(),
            };
            match ask.post(path, &body) {
                Ok(answer) => input_tokens(answer),
                // Builds before the count endpoints answer 404 for it.
                Err(Failed::Status(404 | 405 | 501)) if template => {
                    let prompt = ask.post("/apply-template", &body).ok()?;
                    let prompt = read_json(prompt, TEMPLATE_ANSWER)?;
                    let prompt = prompt.get("prompt").filter(|p| p.is_string())?;
                    ask.tokenize(&serde_json::value::to_raw_value(prompt).ok()?)
                }
                Err(_) => None,
            }
        }
        // Only `prompt` is read, never the whole body (see `prompt.rs`); the model is not needed.
        CountCall::Prompt => match prompt::read(body)? {
            prompt::Prompt::Text(text) => ask.tokenize(text),
            prompt::Prompt::Tokens(n) => Some(n),
        },
    }
}

/// One request's count calls: the host and what is left of their common deadline.
struct Ask<'a> {
    agent: &'a ureq::Agent,
    host: &'a Host,
    deadline: Instant,
}

#[derive(Debug)]
enum Failed {
    Status(u16),
    Transport,
}

impl Ask<'_> {
    fn post(&self, path: &str, body: &[u8]) -> Result<Answer, Failed> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Failed::Transport);
        }
        // The whole exchange, answer body included, ends by the common deadline.
        match post_json(self.agent, self.host, path, body, left) {
            Ok(answer) if answer.status() == 200 => Ok(answer),
            Ok(answer) => Err(Failed::Status(answer.status().as_u16())),
            Err(_) => Err(Failed::Transport),
        }
    }

    /// `/tokenize` with the special tokens the server adds to a prompt, counted as it streams.
    /// `prompt` is a JSON string as raw text, sent as written (no unescaping and re-escaping).
    fn tokenize(&self, prompt: &RawValue) -> Option<u64> {
        let body = format!(r#"{{"content":{},"add_special":true}}"#, prompt.get());
        let answer = self.post("/tokenize", body.as_bytes()).ok()?;
        count_tokens(answer.into_body().into_reader().take(TOKENS_ANSWER))
    }
}

/// A host's answer to a call crossbar makes on its own.
pub(super) type Answer = ureq::http::Response<ureq::Body>;

/// POSTs the JSON `body` to `path` on `host` with the host's key, the whole exchange (answer body
/// included) bounded by `timeout`: crossbar's own calls to a host (counts, slot saves).
pub(super) fn post_json(
    agent: &ureq::Agent,
    host: &Host,
    path: &str,
    body: &[u8],
    timeout: Duration,
) -> Result<Answer, ureq::Error> {
    let mut request = agent
        .post(format!("{}{}", host.url, path))
        .config()
        .timeout_global(Some(timeout))
        .build()
        .header("Content-Type", "application/json");
    if let Some(key) = &host.api_key {
        request = request.header("Authorization", format!("Bearer {key}"));
    }
    request.send(body)
}

/// `{"input_tokens": N, ...}`.
fn input_tokens(answer: Answer) -> Option<u64> {
    read_json(answer, SMALL_ANSWER)?
        .get("input_tokens")?
        .as_u64()
}

/// The answer's JSON, or `None` when it is not JSON or longer than `limit` bytes.
fn read_json(answer: Answer, limit: u64) -> Option<Value> {
    let bytes = answer
        .into_body()
        .into_with_config()
        .limit(limit)
        .read_to_vec()
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The number of entries in `/tokenize`'s `{"tokens":[1,2,...]}`, read piece by piece without
/// keeping the answer. `None` for anything but a flat array of numbers ending in `]`.
fn count_tokens(mut answer: impl Read) -> Option<u64> {
    let mut buf = [0u8; 16 * 1024];
    let mut in_array = false;
    let (mut commas, mut digits) = (0u64, false);
    loop {
        let n = answer.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        for &b in &buf[..n] {
            if !in_array {
                in_array = b == b'[';
                continue;
            }
            match b {
                b'0'..=b'9' => digits = true,
                b',' => commas += 1,
                b' ' | b'\n' | b'\r' | b'\t' => {}
                b']' => return Some(if digits { commas + 1 } else { 0 }),
                _ => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests;
