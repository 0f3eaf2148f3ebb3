//! What one JSON payload (an SSE event's data, or a whole non-streamed body) says about tokens,
//! completion and errors, and the running "last seen" record built from them.
//!
//! Only the keys below are read, borrowed raw and parsed one by one (a `usage` object's members
//! too, `api::UsageFields`); everything else (`choices`, `content`...) is skipped unbuilt. A payload that is not a
//! JSON object is ignored whole; a field of the wrong shape reads as absent.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::Usage;
use crate::api::{Api, Counts, UsageFields};

/// Longest error message kept, in bytes; the rest is cut at a character boundary.
const MAX_ERROR: usize = 1024;

/// The keys of a payload that matter here, borrowed unparsed; `null` counts as absent. Every other
/// key (`choices`, a Responses answer's whole `output`...) is skipped by the parser, never built.
#[derive(Deserialize)]
struct Payload<'a> {
    #[serde(borrow)]
    usage: Option<&'a RawValue>,
    #[serde(borrow)]
    timings: Option<&'a RawValue>,
    #[serde(borrow)]
    stop: Option<&'a RawValue>,
    #[serde(borrow)]
    error: Option<&'a RawValue>,
    #[serde(borrow)]
    tokens_evaluated: Option<&'a RawValue>,
    #[serde(borrow)]
    tokens_predicted: Option<&'a RawValue>,
    /// Anthropic `message_start`'s message, with its `usage` (any other type is no message: an
    /// error object's `message` string must not spoil the payload).
    #[serde(borrow)]
    message: Option<&'a RawValue>,
    /// OpenAI Responses' `response.completed` response, with its `usage`.
    #[serde(borrow)]
    response: Option<&'a RawValue>,
}

/// An object that carries a `usage` (a Messages `message`, a Responses `response`).
#[derive(Deserialize)]
struct Carrier<'a> {
    #[serde(borrow)]
    usage: Option<&'a RawValue>,
}

/// llama-server's `timings`, each counter read alone (a mistyped one is unknown, not fatal).
#[derive(Deserialize)]
struct Timings<'a> {
    #[serde(borrow)]
    prompt_n: Option<&'a RawValue>,
    #[serde(borrow)]
    prompt_ms: Option<&'a RawValue>,
    #[serde(borrow)]
    cache_n: Option<&'a RawValue>,
    #[serde(borrow)]
    predicted_n: Option<&'a RawValue>,
}

/// The counters of the last `timings` object seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TimingsSeen {
    prompt_n: Option<i64>,
    /// `prompt_ms` in whole microseconds.
    prompt_us: Option<i64>,
    cache_n: Option<i64>,
    predicted_n: Option<i64>,
}

/// Native `/completion` top-level counters (`tokens_evaluated`, `tokens_predicted`), last seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct NativeSeen {
    evaluated: Option<i64>,
    predicted: Option<i64>,
}

/// Everything learnt so far; each source is replaced whole by its next occurrence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Seen {
    /// Whose field names `usage` objects use.
    pub api: Api,
    /// Each count from the last `usage` object that had it.
    usage: Option<Counts>,
    timings: Option<TimingsSeen>,
    native: Option<NativeSeen>,
    /// The first error message seen.
    pub error: Option<String>,
    /// A payload said `"stop": true` (native `/completion`'s last chunk).
    pub stopped: bool,
}

impl Seen {
    pub fn new(api: Api) -> Seen {
        Seen {
            api,
            usage: None,
            timings: None,
            native: None,
            error: None,
            stopped: false,
        }
    }

    /// Learns from one JSON payload; anything that is not a well-formed object is ignored.
    pub fn absorb(&mut self, json: &[u8]) {
        // Guard: serde would also read a JSON array positionally into `Payload`.
        if json.trim_ascii_start().first() != Some(&b'{') {
            return;
        }
        let Ok(p) = serde_json::from_slice::<Payload<'_>>(json) else {
            return;
        };
        let nested = [p.message, p.response].map(|n| object::<Carrier<'_>>(n)?.usage);
        for u in [p.usage].into_iter().chain(nested).flatten() {
            // Read in place, for the API's own field names.
            if let Some(u) = UsageFields::parse(u.get()) {
                let new = self.api.counts(&u);
                let old = self.usage.unwrap_or_default();
                self.usage = Some(Counts {
                    prompt: new.prompt.or(old.prompt),
                    cached: new.cached.or(old.cached),
                    completion: new.completion.or(old.completion),
                });
            }
        }
        if let Some(t) = object::<Timings<'_>>(p.timings) {
            self.timings = Some(TimingsSeen {
                prompt_n: count(t.prompt_n),
                prompt_us: t
                    .prompt_ms
                    .and_then(|ms| serde_json::from_str::<f64>(ms.get()).ok())
                    .filter(|ms| ms.is_finite() && *ms >= 0.0 && *ms < 1e12)
                    .map(|ms| (ms * 1000.0) as i64),
                cache_n: count(t.cache_n),
                predicted_n: count(t.predicted_n),
            });
        }
        if p.tokens_evaluated.is_some() || p.tokens_predicted.is_some() {
            self.native = Some(NativeSeen {
                evaluated: count(p.tokens_evaluated),
                predicted: count(p.tokens_predicted),
            });
        }
        if p.stop.is_some_and(|s| s.get() == "true") {
            self.stopped = true;
        }
        if let Some(e) = p
            .error
            .and_then(|e| serde_json::from_str::<Value>(e.get()).ok())
        {
            self.note_error(&e);
        }
    }

    /// Learns from an SSE `error:` field (older llama-server builds): the error object itself,
    /// or an `{"error": ...}` envelope. Text that is not JSON is the message.
    pub fn absorb_error_field(&mut self, data: &[u8]) {
        match serde_json::from_slice::<Value>(data) {
            Ok(Value::Object(mut m)) if m.contains_key("error") => {
                self.note_error(&m.remove("error").unwrap_or(Value::Null))
            }
            Ok(v) => self.note_error(&v),
            Err(_) => self.note_error(&Value::from(String::from_utf8_lossy(data.trim_ascii()))),
        }
    }

    /// Learns from the API's named error event (`event: error`, `response.failed`...): the message
    /// wherever the API puts it, else the event's name.
    pub fn absorb_failure(&mut self, name: &str, data: &[u8]) {
        let v = serde_json::from_slice::<Value>(data).unwrap_or(Value::Null);
        let found = ["/error/message", "/message", "/response/error/message"]
            .iter()
            .find_map(|p| v.pointer(p).and_then(Value::as_str))
            .map(str::to_owned)
            .or_else(|| {
                v.pointer("/response/incomplete_details/reason")
                    .and_then(Value::as_str)
                    .map(|r| format!("{name}: {r}"))
            });
        self.note_error(&Value::from(found.unwrap_or_else(|| name.to_string())));
    }

    fn note_error(&mut self, e: &Value) {
        if self.error.is_some() || e.is_null() {
            return;
        }
        let mut msg = match e.get("message").and_then(Value::as_str).or(e.as_str()) {
            Some(s) => s.to_owned(),
            None => e.to_string(),
        };
        if msg.len() > MAX_ERROR {
            msg.truncate(crate::logfmt::cut(&msg, MAX_ERROR).len());
        }
        self.error = Some(msg);
    }

    /// The last `timings`' (`prompt_n`, `prompt_ms` in µs), when both are there.
    pub fn prefill(&self) -> Option<(u64, u64)> {
        let t = self.timings?;
        Some((t.prompt_n? as u64, t.prompt_us? as u64))
    }

    /// The token counts by the rules in the module header of `tee.rs`.
    pub fn usage(&self) -> Usage {
        let (u, t, n) = (self.usage, self.timings, self.native);
        let timed_prompt =
            t.and_then(|t| t.prompt_n.map(|p| p.saturating_add(t.cache_n.unwrap_or(0))));
        Usage {
            prompt_tokens: u
                .and_then(|u| u.prompt)
                .or(timed_prompt)
                .or(n.and_then(|n| n.evaluated)),
            cached_tokens: t.and_then(|t| t.cache_n).or(u.and_then(|u| u.cached)),
            completion_tokens: u
                .and_then(|u| u.completion)
                .or(t.and_then(|t| t.predicted_n))
                .or(n.and_then(|n| n.predicted)),
        }
    }
}

/// A token count: a non-negative integer, anything else is unknown.
fn count(v: Option<&RawValue>) -> Option<i64> {
    v.and_then(|v| serde_json::from_str::<i64>(v.get()).ok())
        .filter(|n| *n >= 0)
}

/// `raw` read as `T` when it is a JSON object; anything else (or a wrong shape) is absent.
fn object<'a, T: Deserialize<'a>>(raw: Option<&'a RawValue>) -> Option<T> {
    let raw = raw?.get();
    if !raw.starts_with('{') {
        return None;
    }
    serde_json::from_str(raw).ok()
}
