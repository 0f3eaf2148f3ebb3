//! Exact prompt token counts, asked of a host when the context guard's estimate says a prompt does
//! not fit. One function ([`count_call`]) maps a request's endpoint to the call that counts it:
//! each conversation API's own count endpoint (the same body in, `{"input_tokens": N}` out), older
//! builds' `/apply-template` + `/tokenize` for chat, and `/tokenize` of a completion-style `prompt`.
//!
//! These calls take no slot (llama-server answers them while every slot generates) and one
//! deadline bounds them all. Every answer is read with a size bound; a host that cannot answer
//! (an old build, an error, the deadline) gives `None`, and the guard falls back to the estimate.
//! The calls go through the side client (`upstream::Side`), which lets at most
//! `upstream::side::PER_HOST` requests count on one host at once: a client sending many large
//! bodies cannot turn each into tokenizer work on a host. Nothing here marks a host down or decides
//! where a request goes.

use std::io::Read;
use std::time::{Duration, Instant};

use serde_json::value::RawValue;
use serde_json::Value;

use crate::api::Api;
use crate::config::Host;
use crate::upstream::{Answer, Side};

use super::plan::MAX_BODY;

mod prompt;

/// The longest all the count calls of one request may take together.
pub(super) const COUNT_TIMEOUT: Duration = Duration::from_secs(5);

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
        None if api.counts_by_prompt(rest) => Some(CountCall::Prompt),
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
    side: &Side,
    host: &Host,
    rest: &str,
    body: &[u8],
    model: Option<&str>,
    deadline: Instant,
) -> Option<u64> {
    let call = count_call(rest)?;
    let ask = Ask {
        side,
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
    side: &'a Side,
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
        match self.side.post_json(self.host, path, body, left) {
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
