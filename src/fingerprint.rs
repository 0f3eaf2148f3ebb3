//! The request peek: model, `stream` flag and conversation fingerprint, from the body alone.
//!
//! Owns the fingerprint rule of spec §3 and its byte format, which must never drift: leases stored
//! in the database are keyed by it, so a change would silently orphan every live conversation (the
//! golden vectors in the tests pin it). Precedence, first match wins:
//!
//! 1. the `X-Session-Id` / `X-Conversation-Id` header value (passed in by the caller, trimmed);
//! 2. the body's `prompt_cache_key` string (OpenAI's name for the same thing);
//! 3. chat bodies: the model plus every message up to and including the first `user` one (all of
//!    them when none has role `user`), each normalised as compact JSON with sorted keys, so key
//!    order and whitespace do not matter;
//! 4. completion-style bodies: the first non-null of `prompt`, `input_prefix`, `content`, `input`:
//!    its first 4096 bytes if a string (kind `prompt`), else the first 4096 bytes of its JSON text
//!    (kind `prompt-json`: a token list never equals a string);
//! 5. otherwise (no such field, not JSON, not an object): `""`, the route-level lease.
//!
//! Both explicit keys share one domain (kind `key`), so a header and a body key with the same
//! value name the same conversation. Every fingerprint is 16 lowercase hex digits: the first 8
//! bytes of SHA-256 over `"crossbar-fp-v1\0" + kind + "\0"` (kind: `key`, `chat`, `prompt` or
//! `prompt-json`) followed by the parts, each terminated by `\0`. Chat parts are the model as a
//! JSON string, then each message's JSON text; JSON text never holds a raw NUL, and the other
//! kinds have a single part, so the encoding is unambiguous.
//!
//! Pure: no I/O, no clock, no locks. The body is parsed once; messages after the first `user` one
//! and unknown fields are skipped without being built (see `body.rs`).

mod body;

use sha2::{Digest, Sha256};

use body::Body;

/// What the proxy needs to know about a request before choosing a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peek {
    /// The body's `model` string, if any.
    pub model: Option<String>,
    /// Conversation fingerprint: 16 lowercase hex digits, or `""` when the request has none.
    pub fp: String,
    /// The body's `stream` is `true`.
    pub stream: bool,
}

/// How many bytes of a completion-style prompt identify the conversation.
pub const PROMPT_PREFIX: usize = 4096;

/// Reads `body` (any bytes, up to the proxy's 16 MiB limit) once. `session` is the
/// `X-Session-Id` (or `X-Conversation-Id`) header value if the client sent one.
pub fn peek(body: &[u8], session: Option<&str>) -> Peek {
    let parsed = Body::parse(body);
    let model = parsed
        .as_ref()
        .and_then(|b| b.model.as_ref())
        .and_then(|m| m.as_str())
        .map(str::to_owned);
    let stream = parsed
        .as_ref()
        .is_some_and(|b| b.stream.as_ref().and_then(|s| s.as_bool()) == Some(true));
    let session = session.map(str::trim).filter(|s| !s.is_empty());
    let fp = match (session, parsed) {
        (Some(key), _) => explicit(key),
        (None, Some(b)) => body_fp(&b),
        (None, None) => String::new(),
    };
    Peek { model, fp, stream }
}

/// The first 8 characters of a fingerprint, for log lines (`""` stays `""`).
pub fn short(fp: &str) -> &str {
    fp.get(..8).unwrap_or(fp)
}

fn body_fp(b: &Body) -> String {
    if let Some(key) = b.prompt_cache_key.as_ref().and_then(|k| k.as_str()) {
        if !key.trim().is_empty() {
            return explicit(key.trim());
        }
    }
    if let Some(messages) = b.messages.as_ref().filter(|m| !m.is_empty()) {
        let model = b.model.as_ref().and_then(|m| m.as_str()).unwrap_or("");
        let mut h = Hasher::new("chat");
        h.part(serde_json::Value::from(model).to_string().as_bytes());
        for m in messages {
            // `Value`'s map is a BTreeMap (serde_json without `preserve_order`), so this text
            // has sorted keys and no insignificant whitespace; a test guards that assumption.
            h.part(m.to_string().as_bytes());
        }
        return h.finish();
    }
    // `prompts` follows PROMPT_FIELDS' order, so the first present one wins.
    if let Some(v) = b.prompts.iter().flatten().next() {
        // Separate kinds, so the string "[1]" and the token list [1] stay apart.
        return match v.as_str() {
            Some(s) => {
                let mut h = Hasher::new("prompt");
                h.part(&s.as_bytes()[..s.len().min(PROMPT_PREFIX)]);
                h.finish()
            }
            None => {
                let mut h = Hasher::new("prompt-json");
                h.part(&json_prefix(v, PROMPT_PREFIX));
                h.finish()
            }
        };
    }
    String::new()
}

fn explicit(key: &str) -> String {
    let mut h = Hasher::new("key");
    h.part(key.as_bytes());
    h.finish()
}

/// The first `max` bytes of `v`'s compact JSON text, without serialising the rest.
fn json_prefix(v: &serde_json::Value, max: usize) -> Vec<u8> {
    struct Capped {
        buf: Vec<u8>,
        max: usize,
    }
    impl std::fmt::Write for Capped {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            let room = self.max - self.buf.len();
            let take = s.len().min(room);
            self.buf.extend_from_slice(&s.as_bytes()[..take]);
            if take < s.len() {
                Err(std::fmt::Error) // full: stop the serialiser early
            } else {
                Ok(())
            }
        }
    }
    let mut out = Capped {
        buf: Vec::with_capacity(max.min(1024)),
        max,
    };
    // An Err here only means "capped": what was written is exactly the prefix we want.
    let _ = std::fmt::write(&mut out, format_args!("{v}"));
    out.buf
}

/// SHA-256 over the domain-separated, NUL-terminated parts; the first 8 bytes in hex.
struct Hasher(Sha256);

impl Hasher {
    fn new(kind: &str) -> Hasher {
        let mut h = Sha256::new();
        h.update(b"crossbar-fp-v1\0");
        h.update(kind.as_bytes());
        h.update(b"\0");
        Hasher(h)
    }

    fn part(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
        self.0.update(b"\0");
    }

    fn finish(self) -> String {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let digest = self.0.finalize();
        let mut out = String::with_capacity(16);
        for b in &digest[..8] {
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 0xf)] as char);
        }
        out
    }
}

#[cfg(test)]
mod tests;
