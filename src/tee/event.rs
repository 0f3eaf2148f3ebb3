//! What one JSON payload (an SSE event's data, or a whole non-streamed body) says about tokens,
//! completion and errors, and the running "last seen" record built from them.
//!
//! Only the top-level keys below are built; everything else (`choices`, `content`...) is skipped
//! unbuilt. A payload that is not a JSON object, or has the wrong shape, is ignored whole.

use serde::Deserialize;
use serde_json::Value;

use super::Usage;
use crate::api::{Api, Counts};

/// Longest error message kept, in bytes; the rest is cut at a character boundary.
const MAX_ERROR: usize = 1024;

/// The keys of a payload that matter here; `null` counts as absent.
#[derive(Deserialize)]
struct Payload {
    usage: Option<Value>,
    timings: Option<Value>,
    stop: Option<Value>,
    error: Option<Value>,
    tokens_evaluated: Option<Value>,
    tokens_predicted: Option<Value>,
    /// Anthropic `message_start`'s message, with its `usage` (any other type is no message: an
    /// error object's `message` string must not spoil the payload).
    message: Option<Value>,
    /// OpenAI Responses' `response.completed` response, with its `usage`.
    response: Option<Value>,
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
        let Ok(p) = serde_json::from_slice::<Payload>(json) else {
            return;
        };
        let nested = [&p.message, &p.response].map(|n| n.as_ref().and_then(|n| n.get("usage")));
        for u in [p.usage.as_ref()].into_iter().chain(nested).flatten() {
            if u.is_object() {
                let new = self.api.counts(u);
                let old = self.usage.unwrap_or_default();
                self.usage = Some(Counts {
                    prompt: new.prompt.or(old.prompt),
                    cached: new.cached.or(old.cached),
                    completion: new.completion.or(old.completion),
                });
            }
        }
        if let Some(t) = p.timings.as_ref().filter(|t| t.is_object()) {
            self.timings = Some(TimingsSeen {
                prompt_n: count(t.get("prompt_n")),
                prompt_us: t
                    .get("prompt_ms")
                    .and_then(Value::as_f64)
                    .filter(|ms| ms.is_finite() && *ms >= 0.0 && *ms < 1e12)
                    .map(|ms| (ms * 1000.0) as i64),
                cache_n: count(t.get("cache_n")),
                predicted_n: count(t.get("predicted_n")),
            });
        }
        if p.tokens_evaluated.is_some() || p.tokens_predicted.is_some() {
            self.native = Some(NativeSeen {
                evaluated: count(p.tokens_evaluated.as_ref()),
                predicted: count(p.tokens_predicted.as_ref()),
            });
        }
        if p.stop == Some(Value::Bool(true)) {
            self.stopped = true;
        }
        if let Some(e) = p.error {
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
            let mut cut = MAX_ERROR;
            while !msg.is_char_boundary(cut) {
                cut -= 1;
            }
            msg.truncate(cut);
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
fn count(v: Option<&Value>) -> Option<i64> {
    v.and_then(Value::as_i64).filter(|n| *n >= 0)
}
