//! The `application/json` mode: the body kept whole up to [`super::MAX_BODY`] and parsed once
//! when asked. Past that bound only its ends are kept — the first and the last
//! [`super::MAX_TAIL`] bytes — and the `usage` and `timings` objects are read from them, so a big
//! batch of embeddings keeps its token counts though its body is too big to parse (issue 18).
//! Both ends, because servers differ: b11434 keeps keys in insertion order (`common_json`), so
//! an embeddings or rerank answer has `usage` near its start, before `data`/`results`; a
//! key-sorting server puts it last, and a big chat answer has `usage` and `timings` after
//! `choices`. Only objects that parse whole inside a window count; nothing is guessed. No I/O.

use std::cell::OnceCell;

use serde_json::value::RawValue;

use super::event::Learnt;
use crate::api::Api;

/// Non-streamed JSON body state. Invariant: `body.len() <= max_body`, and empty once
/// `overflowed`; from then on `head` holds the first bytes and `tail` the last.
pub(super) struct Json {
    api: Api,
    /// [`super::MAX_BODY`]; smaller in tests.
    max_body: usize,
    body: Vec<u8>,
    pub(super) overflowed: bool,
    /// The first [`super::MAX_TAIL`] bytes (smaller in tests), once the body overflowed.
    head: Vec<u8>,
    /// The last [`super::MAX_TAIL`] bytes (smaller in tests), fed once the body overflowed.
    tail: Tail,
    /// The parse of `body` (or of `tail`), made on first demand; reset by every feed.
    parsed: OnceCell<Learnt>,
}

impl Json {
    pub(super) fn new(max_body: usize, tail: usize, api: Api) -> Json {
        Json {
            api,
            max_body,
            body: Vec::new(),
            overflowed: false,
            head: Vec::new(),
            tail: Tail::new(tail),
            parsed: OnceCell::new(),
        }
    }

    pub(super) fn feed(&mut self, chunk: &[u8]) {
        if chunk.is_empty() {
            return;
        }
        self.parsed.take();
        if self.overflowed {
            self.tail.push(chunk);
        } else if self.body.len() + chunk.len() > self.max_body {
            self.overflowed = true;
            let body = std::mem::take(&mut self.body);
            let max = self.tail.max;
            self.head = body[..body.len().min(max)].to_vec();
            let more = max - self.head.len();
            self.head.extend_from_slice(&chunk[..chunk.len().min(more)]);
            self.tail.push(&body);
            self.tail.push(chunk);
        } else {
            self.body.extend_from_slice(chunk);
        }
    }

    /// What the body says; past [`super::MAX_BODY`], what its ends say of `usage` and `timings`.
    pub(super) fn seen(&self) -> &Learnt {
        self.parsed.get_or_init(|| {
            if self.overflowed {
                return seen(&self.head, self.tail.window(), self.api);
            }
            let mut seen = Learnt::new(self.api);
            seen.absorb(&self.body);
            seen
        })
    }
}

/// Candidate positions tried per key, from the end: a tail full of `"usage":{` costs a few
/// parses of the window, not one per occurrence.
const TRIES: usize = 4;

/// The last `max` bytes fed. Invariant: `buf.len() <= 2 * max`, and `buf` ends with the last
/// bytes fed (at least `max` of them once that many came).
#[derive(Debug)]
struct Tail {
    max: usize,
    buf: Vec<u8>,
}

impl Tail {
    fn new(max: usize) -> Tail {
        Tail {
            max,
            buf: Vec::new(),
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        let bytes = &bytes[bytes.len().saturating_sub(2 * self.max)..];
        if self.buf.len() + bytes.len() > 2 * self.max {
            // Keep the last `max - bytes.len()` (or none): the buffer never grows past 2 × max.
            let keep = self.max.saturating_sub(bytes.len()).min(self.buf.len());
            self.buf.drain(..self.buf.len() - keep);
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The last `max` bytes fed (fewer if fewer came): the same whatever the chunking.
    fn window(&self) -> &[u8] {
        &self.buf[self.buf.len().saturating_sub(self.max)..]
    }
}

/// What the ends of a body say of tokens: the first whole `"timings"` and `"usage"` objects in
/// `head`, then the last ones in `tail`, read by the same rules as a whole body
/// ([`Learnt::absorb`]: a later count wins, as a later key would).
fn seen(head: &[u8], tail: &[u8], api: Api) -> Learnt {
    let mut seen = Learnt::new(api);
    for (window, from_end) in [(head, false), (tail, true)] {
        let parts: Vec<String> = ["timings", "usage"]
            .into_iter()
            .filter_map(|key| {
                let raw = object(window, key, from_end)?;
                Some(format!("\"{key}\":{}", raw.get()))
            })
            .collect();
        if !parts.is_empty() {
            seen.absorb(format!("{{{}}}", parts.join(",")).as_bytes());
        }
    }
    seen
}

/// The first (or, `from_end`, the last) `"key": {...}` in `window` whose object is whole there.
fn object<'a>(window: &'a [u8], key: &str, from_end: bool) -> Option<&'a RawValue> {
    let quoted = format!("\"{key}\"");
    let (mut start, mut end) = (0, window.len());
    for _ in 0..TRIES {
        let mut hits = window[start..end].windows(quoted.len());
        let at = if from_end {
            hits.rposition(|w| w == quoted.as_bytes())? + start
        } else {
            hits.position(|w| w == quoted.as_bytes())? + start
        };
        (start, end) = if from_end { (start, at) } else { (at + 1, end) };
        let rest = window[at + quoted.len()..].trim_ascii_start();
        let Some(rest) = rest.strip_prefix(b":").map(<[u8]>::trim_ascii_start) else {
            continue;
        };
        if rest.first() != Some(&b'{') {
            continue;
        }
        let mut values = serde_json::Deserializer::from_slice(rest).into_iter::<&RawValue>();
        if let Some(Ok(raw)) = values.next() {
            return Some(raw);
        }
    }
    None
}
