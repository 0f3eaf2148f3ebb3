//! The response tee: a push parser that watches upstream bytes for token counts, the end of a
//! stream and mid-stream errors. The proxy writes every byte to the client itself; the tee only
//! looks, never holds back or alters anything, and does no I/O, no clock, no locks. What differs
//! between the APIs (named end events, usage field names) it asks the request's [`Api`].
//!
//! Modes, by the response `Content-Type` (its media type, case-insensitively):
//! - `text/event-stream`: SSE. Lines end with `\n` or `\r\n` (a lone `\r` is not a terminator);
//!   `:` comments and fields other than `event`/`data`/`error` are ignored; values take one
//!   optional space. A single-line event is handled at its line end (llama-server sends one data
//!   line per event), an event of several data lines at its blank line, its data joined by `\n`.
//!   Only payloads that mention a quoted `"usage"`, `"timings"`, `"stop"` or `"error"` are parsed
//!   as JSON. The stream is finished by `data: [DONE]`, a native `/completion` chunk with
//!   `"stop": true`, or the API's named last event (`event: message_stop`, `event:
//!   response.completed`); `data: {"error":...}`, an `error:` field (older builds) or the API's
//!   named error event (`event: error`, `response.failed`, `response.incomplete`) is an upstream
//!   error. A line longer than [`MAX_LINE`] is dropped (and its event with it) rather than
//!   buffered; [`Tee::overflowed`] tells.
//! - `application/json`: the body is kept, up to [`MAX_BODY`], and parsed when asked
//!   ([`Tee::usage`], [`Tee::upstream_error`]), once. Past that bound only its first and last
//!   [`MAX_TAIL`] bytes are kept, and the whole `usage` and `timings` objects in them count
//!   (`tee/json.rs`: b11434 puts an embeddings batch's `usage` first, a key-sorting server last).
//!   Always finished.
//! - anything else: ignored; no tokens, always finished.
//!
//! Token rules. A `usage` object is read in the API's field names ([`Api::counts`]) wherever the
//! API puts it: top-level, in Messages' `message` (`message_start`) or Responses' `response`
//! (`response.completed`); each count is remembered from the LAST usage object that had it (a
//! Messages stream gives input counts on its first event and the output count on a later one).
//! `timings` and the native `tokens_*` counters are each remembered from the LAST payload that
//! carried them (replaced whole). Then:
//! - prompt     = usage's prompt (cached included), else `timings.prompt_n + timings.cache_n` (a
//!   missing `cache_n` counts 0), else native `tokens_evaluated`;
//! - cached     = `timings.cache_n`, else usage's cached;
//! - completion = usage's completion, else `timings.predicted_n`, else `tokens_predicted`.
//!
//! Anything missing, negative or not an integer is `None` (older llama-server builds lack some
//! fields). Feeding the same bytes split at any points gives the same result.

mod event;
mod json;

use std::fmt;

use event::Learnt;
use json::Json;

use crate::api::{Api, Ending};

/// Longest SSE event name kept, in bytes; a longer one is no name this tee knows.
const MAX_NAME: usize = 64;
/// Longest SSE line kept, in bytes (terminator excluded); longer lines are dropped.
pub const MAX_LINE: usize = 1 << 20;
/// Largest non-streamed JSON body parsed for tokens, in bytes.
pub const MAX_BODY: usize = 1 << 20;
/// The bytes at each end of a JSON body over [`MAX_BODY`] searched for `usage` and `timings`.
pub const MAX_TAIL: usize = 64 << 10;

/// Token counts of one response; `None` when the upstream did not say.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: Option<i64>,
    pub cached_tokens: Option<i64>,
    pub completion_tokens: Option<i64>,
}

/// Watches one upstream response body. See the module header for the rules.
pub struct Tee {
    mode: Mode,
}

enum Mode {
    Sse(Sse),
    Json(Json),
    Ignore,
}

impl Tee {
    /// A tee for a Chat Completions response with this `Content-Type` header value (`""` if none).
    pub fn new(content_type: &str) -> Tee {
        Tee::for_api(content_type, Api::Chat)
    }

    /// A tee for a response to a request of `api`, with this `Content-Type` (`""` if none).
    pub fn for_api(content_type: &str, api: Api) -> Tee {
        let essence = content_type.split(';').next().unwrap_or("").trim();
        let mode = if essence.eq_ignore_ascii_case("text/event-stream") {
            Mode::Sse(Sse::new(MAX_LINE, api))
        } else if essence.eq_ignore_ascii_case("application/json") {
            Mode::Json(Json::new(MAX_BODY, MAX_TAIL, api))
        } else {
            Mode::Ignore
        };
        Tee { mode }
    }

    /// Looks at the next bytes of the body, exactly as they came from the upstream.
    pub fn feed(&mut self, chunk: &[u8]) {
        match &mut self.mode {
            Mode::Sse(s) => s.feed(chunk),
            Mode::Json(j) => j.feed(chunk),
            Mode::Ignore => {}
        }
    }

    /// Token counts from what was fed so far.
    pub fn usage(&self) -> Usage {
        match &self.mode {
            Mode::Sse(s) => s.seen.usage(),
            Mode::Json(j) => j.seen().usage(),
            Mode::Ignore => Usage::default(),
        }
    }

    /// llama-server's prefill of this answer from `timings`: (`prompt_n` tokens, `prompt_ms` in
    /// microseconds), when both were given.
    pub fn prefill(&self) -> Option<(u64, u64)> {
        match &self.mode {
            Mode::Sse(s) => s.seen.prefill(),
            Mode::Json(j) => j.seen().prefill(),
            Mode::Ignore => None,
        }
    }

    /// SSE: the events with data seen, `[DONE]` aside: one per generated token in llama-server's
    /// streams, and a few of their own (a first role-only event, a last one). What a stream the
    /// client left counts when the host's counts never came (issue 46). Other modes: 0.
    pub fn events(&self) -> u64 {
        match &self.mode {
            Mode::Sse(s) => s.events,
            Mode::Json(_) | Mode::Ignore => 0,
        }
    }

    /// SSE: `data: [DONE]`, a native `"stop": true` chunk or the API's named last event was seen.
    /// Other modes: always true.
    pub fn finished(&self) -> bool {
        match &self.mode {
            Mode::Sse(s) => s.done || s.seen.stopped,
            Mode::Json(_) | Mode::Ignore => true,
        }
    }

    /// The message of the first upstream error payload seen (SSE error event, or a JSON error
    /// body such as llama-server's `{"error":{"message":...}}`).
    pub fn upstream_error(&self) -> Option<String> {
        match &self.mode {
            Mode::Sse(s) => s.seen.error.clone(),
            Mode::Json(j) => j.seen().error.clone(),
            Mode::Ignore => None,
        }
    }

    /// Some input was too large to look at: an SSE line over [`MAX_LINE`] or a JSON body over
    /// [`MAX_BODY`]. Worth a log line; the counts may then be missing.
    pub fn overflowed(&self) -> bool {
        match &self.mode {
            Mode::Sse(s) => s.dropped > 0,
            Mode::Json(j) => j.overflowed,
            Mode::Ignore => false,
        }
    }
}

impl fmt::Debug for Tee {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let mode = match &self.mode {
            Mode::Sse(_) => "sse",
            Mode::Json(_) => "json",
            Mode::Ignore => "ignore",
        };
        f.debug_struct("Tee")
            .field("mode", &mode)
            .field("usage", &self.usage())
            .field("finished", &self.finished())
            .field("overflowed", &self.overflowed())
            .finish()
    }
}

/// SSE scanner state. Invariants: `line.len() <= max_line`; `line` is empty while `skipping`;
/// `event` holds the current event's data only while `event_lines > 0` and not `event_broken`.
struct Sse {
    /// [`MAX_LINE`]; smaller in tests.
    max_line: usize,
    /// The unterminated tail of the last chunk.
    line: Vec<u8>,
    /// The current line grew past `max_line`: discard bytes up to its `\n`.
    skipping: bool,
    /// Lines and events dropped for size.
    dropped: u64,
    /// Data lines of the current event, joined by `\n`.
    event: Vec<u8>,
    event_lines: u32,
    /// A line of the current event was dropped or the event grew past `max_line`: skip it.
    event_broken: bool,
    /// The current event's `event:` name (empty when none, or longer than [`MAX_NAME`]).
    name: Vec<u8>,
    /// The current event's name has been acted on (its ending noted).
    name_seen: bool,
    done: bool,
    /// Events with data, `[DONE]` aside.
    events: u64,
    seen: Learnt,
}

impl Sse {
    fn new(max_line: usize, api: Api) -> Sse {
        Sse {
            max_line,
            line: Vec::new(),
            skipping: false,
            dropped: 0,
            event: Vec::new(),
            event_lines: 0,
            event_broken: false,
            name: Vec::new(),
            name_seen: false,
            done: false,
            events: 0,
            seen: Learnt::new(api),
        }
    }

    fn feed(&mut self, mut rest: &[u8]) {
        while !rest.is_empty() {
            let Some(nl) = rest.iter().position(|&b| b == b'\n') else {
                if !self.skipping {
                    if self.line.len() + rest.len() > self.max_line {
                        self.drop_line();
                        self.skipping = true;
                    } else {
                        self.line.extend_from_slice(rest);
                    }
                }
                return;
            };
            let piece = &rest[..nl];
            rest = &rest[nl + 1..];
            if self.skipping {
                self.skipping = false;
            } else if self.line.len() + piece.len() > self.max_line {
                self.drop_line();
            } else if self.line.is_empty() {
                self.on_line(piece);
            } else {
                let mut line = std::mem::take(&mut self.line);
                line.extend_from_slice(piece);
                self.on_line(&line);
                line.clear();
                self.line = line; // keep the capacity
            }
        }
    }

    fn drop_line(&mut self) {
        self.line.clear();
        self.dropped += 1;
        self.event_broken = true;
    }

    /// One complete line, terminator excluded.
    fn on_line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            return self.end_event();
        }
        if line[0] == b':' {
            return; // comment or keep-alive
        }
        let (name, value) = match line.iter().position(|&b| b == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match name {
            b"data" => self.on_data(value),
            b"error" => self.seen.absorb_error_field(value),
            b"event" => {
                self.name.clear();
                if value.len() <= MAX_NAME {
                    self.name.extend_from_slice(value);
                }
            }
            _ => {} // event:, id:, retry: carry nothing we need
        }
    }

    fn on_data(&mut self, value: &[u8]) {
        if self.event_broken {
            return;
        }
        self.event_lines += 1;
        if self.event_lines == 1 && value.trim_ascii() != b"[DONE]" {
            self.events += 1;
        }
        if self.event_lines == 1 {
            self.event.clear();
            self.event.extend_from_slice(value);
            self.handle_data(value);
        } else if self.event.len() + 1 + value.len() > self.max_line {
            self.event_broken = true;
            self.event.clear();
            self.dropped += 1;
        } else {
            self.event.push(b'\n');
            self.event.extend_from_slice(value);
        }
    }

    fn end_event(&mut self) {
        if self.event_lines > 1 && !self.event_broken {
            let event = std::mem::take(&mut self.event);
            self.handle_data(&event);
            self.event = event;
        } else if self.event_lines == 0 {
            self.on_name(b""); // a named event without data still ends a stream
        }
        self.event.clear();
        self.event_lines = 0;
        self.event_broken = false;
        self.name.clear();
        self.name_seen = false;
    }

    fn handle_data(&mut self, data: &[u8]) {
        if data.trim_ascii() == b"[DONE]" {
            self.done = true;
            return;
        }
        if mentions_key(data) {
            self.seen.absorb(data);
        }
        self.on_name(data);
    }

    /// Acts once per event on its name: the API's last event finishes the stream, its error
    /// events are upstream errors (`data` says which, if it can).
    fn on_name(&mut self, data: &[u8]) {
        if self.name.is_empty() || self.name_seen {
            return;
        }
        self.name_seen = true;
        let Ok(name) = std::str::from_utf8(&self.name) else {
            return;
        };
        match self.seen.api.ending(name) {
            Some(Ending::Done) => self.done = true,
            Some(Ending::Failed) => self.seen.absorb_failure(name, data),
            None => {}
        }
    }
}

/// Cheap prefilter: does `data` contain `"usage"`, `"timings"`, `"stop"` or `"error"`?
fn mentions_key(data: &[u8]) -> bool {
    const KEYS: [&[u8]; 4] = [b"usage\"", b"timings\"", b"stop\"", b"error\""];
    let mut rest = data;
    while let Some(q) = rest.iter().position(|&b| b == b'"') {
        rest = &rest[q + 1..];
        if KEYS.iter().any(|k| rest.starts_with(k)) {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests;
