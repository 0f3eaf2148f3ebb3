//! What one JSON payload (an SSE event's data, or a whole non-streamed body) says about tokens,
//! completion and errors, and the running "last seen" record built from them.
//!
//! Only the keys below are read, in the payload's one pass (`api::Lenient`; a `usage` object's
//! members too, `api::UsageFields`); everything else (`choices`, `content`...) is skipped unbuilt.
//! A payload that is not a JSON object is ignored whole; a field of the wrong shape reads as
//! absent.

use serde::de::MapAccess;
use serde_json::value::RawValue;
use serde_json::Value;

use super::Usage;
use crate::api::{each_member, Api, Count, Counts, Lenient, Number, Shape, UsageFields};

/// Longest error message kept, in bytes; the rest is cut at a character boundary.
const MAX_ERROR: usize = 1024;

/// The keys of a payload that matter here, read in the payload's one pass ([`Lenient`]): a
/// value of the wrong shape reads as absent, and `null` too. Every other key (`choices`, a
/// Responses answer's whole `output`...) is skipped by the parser, never built. Of two equal keys
/// the last wins.
#[derive(Default)]
struct Payload<'a> {
    usage: Option<UsageFields<'a>>,
    timings: Option<Timings>,
    /// `"stop": true`.
    stop: bool,
    /// Borrowed raw: read only when there is one.
    error: Option<&'a RawValue>,
    /// Native `/completion`'s counters; `Some` when the key is there and not `null`.
    tokens_evaluated: Option<Count>,
    tokens_predicted: Option<Count>,
    /// The `usage` of an Anthropic `message_start`'s message, or of an OpenAI Responses
    /// `response.completed`'s response. Any other type is no carrier: an error object's
    /// `message` string must not spoil the payload.
    message: Option<UsageFields<'a>>,
    response: Option<UsageFields<'a>>,
}

impl<'de> Shape<'de> for Option<Payload<'de>> {
    fn from_map<A: MapAccess<'de>>(map: A) -> Result<Self, A::Error> {
        let mut p = Payload::default();
        each_member(map, |key, map| {
            match key {
                "usage" => p.usage = map.next_value::<Lenient<_>>()?.0,
                "timings" => p.timings = map.next_value::<Lenient<_>>()?.0,
                "stop" => p.stop = map.next_value::<Lenient<_>>()?.0,
                "error" => p.error = map.next_value()?,
                "tokens_evaluated" => p.tokens_evaluated = present(map.next_value()?),
                "tokens_predicted" => p.tokens_predicted = present(map.next_value()?),
                "message" => p.message = map.next_value::<Lenient<Carrier>>()?.0 .0,
                "response" => p.response = map.next_value::<Lenient<Carrier>>()?.0 .0,
                _ => return Ok(false),
            }
            Ok(true)
        })?;
        Ok(Some(p))
    }
}

/// A value read as `T` when it is not `null`.
fn present<T>(value: Option<Lenient<T>>) -> Option<T> {
    value.map(|v| v.0)
}

/// An object that carries a `usage` (a Messages `message`, a Responses `response`): that usage.
#[derive(Default)]
struct Carrier<'a>(Option<UsageFields<'a>>);

impl<'de> Shape<'de> for Carrier<'de> {
    fn from_map<A: MapAccess<'de>>(map: A) -> Result<Self, A::Error> {
        let mut usage = None;
        each_member(map, |key, map| {
            if key != "usage" {
                return Ok(false);
            }
            usage = map.next_value::<Lenient<_>>()?.0;
            Ok(true)
        })?;
        Ok(Carrier(usage))
    }
}

/// llama-server's `timings`, each counter read alone (a mistyped one is unknown, not fatal).
#[derive(Default)]
struct Timings {
    prompt_n: Count,
    prompt_ms: Number,
    cache_n: Count,
    predicted_n: Count,
}

impl<'de> Shape<'de> for Option<Timings> {
    fn from_map<A: MapAccess<'de>>(map: A) -> Result<Self, A::Error> {
        let mut t = Timings::default();
        each_member(map, |key, map| {
            match key {
                "prompt_n" => t.prompt_n = map.next_value::<Lenient<_>>()?.0,
                "prompt_ms" => t.prompt_ms = map.next_value::<Lenient<_>>()?.0,
                "cache_n" => t.cache_n = map.next_value::<Lenient<_>>()?.0,
                "predicted_n" => t.predicted_n = map.next_value::<Lenient<_>>()?.0,
                _ => return Ok(false),
            }
            Ok(true)
        })?;
        Ok(Some(t))
    }
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
pub(super) struct Learnt {
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

impl Learnt {
    pub fn new(api: Api) -> Learnt {
        Learnt {
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
        // Only an object is a payload: anything else is not even scanned.
        if json.trim_ascii_start().first() != Some(&b'{') {
            return;
        }
        let Ok(Lenient(Some(p))) = serde_json::from_slice::<Lenient<Option<Payload>>>(json) else {
            return;
        };
        for u in [p.usage, p.message, p.response].into_iter().flatten() {
            let new = self.api.counts(&u);
            let old = self.usage.unwrap_or_default();
            self.usage = Some(Counts {
                prompt: new.prompt.or(old.prompt),
                cached: new.cached.or(old.cached),
                completion: new.completion.or(old.completion),
            });
        }
        if let Some(t) = p.timings {
            self.timings = Some(TimingsSeen {
                prompt_n: t.prompt_n.0,
                prompt_us: (t.prompt_ms.0)
                    .filter(|ms| ms.is_finite() && *ms >= 0.0 && *ms < 1e12)
                    .map(|ms| (ms * 1000.0) as i64),
                cache_n: t.cache_n.0,
                predicted_n: t.predicted_n.0,
            });
        }
        if p.tokens_evaluated.is_some() || p.tokens_predicted.is_some() {
            self.native = Some(NativeSeen {
                evaluated: p.tokens_evaluated.and_then(|c| c.0),
                predicted: p.tokens_predicted.and_then(|c| c.0),
            });
        }
        if p.stop {
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
