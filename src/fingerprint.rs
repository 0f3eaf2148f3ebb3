//! The request peek: model, `stream` flag and conversation fingerprint, from the body alone.
//!
//! Owns the fingerprint's precedence and byte format, which must never drift: leases stored in the
//! database are keyed by it, so a change would silently orphan every live conversation (the golden
//! vectors in the tests pin it). What a body's conversation *is* differs per API and lives in
//! `api/` ([`Api::conversation`]); this file stays generic. Precedence, first match wins:
//!
//! 1. the `X-Session-Id` / `X-Conversation-Id` header value (passed in by the caller, trimmed);
//! 2. the body's `prompt_cache_key` string (OpenAI's name for the same thing, Responses too);
//! 3. the API's conversation: Chat Completions — the model plus the messages up to and including
//!    the first `user` one; Messages — model, `system`, messages up to the first `user` one;
//!    Responses — model, `instructions`, `input` up to the first user item; completion-style —
//!    the prompt up to its first assistant-turn marker, else its first 4096 bytes;
//! 4. otherwise (no conversation, not JSON, not an object, or a stateless API): `""`.
//!
//! Both explicit keys share one domain (kind `key`), so a header and a body key with the same
//! value name the same conversation. Every fingerprint is 16 lowercase hex digits: the first 8
//! bytes of SHA-256 over `"crossbar-fp-v1\0" + kind + "\0"` followed by the parts, each terminated
//! by `\0`. The kind names the API (`chat`, `messages`, `responses`, `prompt`, `prompt-json`,
//! `key`), so the endpoint is part of the key: equal bodies sent to two APIs never share a
//! conversation. Parts are JSON texts (never a raw NUL) or a single prompt prefix, so the encoding
//! is unambiguous.
//!
//! Beside the fingerprint, the same parse gives the request's prompt [`Family`] (issue 23): the
//! model and the fixed preamble conversations of one agent or app share ([`Api::family`]), hashed
//! the same way under `"crossbar-family-v1\0"`. It names what a host may hold warm for a
//! conversation it has never seen; it never keys a lease.
//!
//! Pure: no I/O, no clock, no locks. The body is parsed once; turns after the first user one and
//! unknown fields are skipped without being built (`api/body.rs`).

use sha2::{Digest, Sha256};

use crate::api::body::Body;
use crate::api::Api;

#[cfg(test)]
use crate::api::json_prefix;
pub use crate::api::PROMPT_PREFIX;

/// What the proxy needs to know about a request before choosing a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peek {
    /// The body's `model` string, if any.
    pub model: Option<String>,
    /// Conversation fingerprint: 16 lowercase hex digits, or `""` when the request has none.
    pub fp: String,
    /// The body's `stream` is `true`.
    pub stream: bool,
    /// The prompt family, when the body has a preamble (stateless APIs never have one).
    pub family: Option<Family>,
    /// The body names a slot inside the host (`id_slot`): crossbar refuses it (issue 46).
    pub names_slot: bool,
}

/// A prompt family: the first 4 bytes of its hash, and the preamble's size in bytes (its size in
/// tokens is about a quarter of that, until a host's `cache_n` says better).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Family {
    pub id: u32,
    pub bytes: u64,
}

impl Family {
    /// 8 lowercase hex digits, as the row, the log line and the status show it.
    pub fn hex(self) -> String {
        Family::id_hex(self.id)
    }

    /// A family id as [`Family::hex`] shows it (where only the id is kept: the slot mirror).
    pub fn id_hex(id: u32) -> String {
        format!("{id:08x}")
    }

    /// [`Family::hex`] read back (from a row); `None` for anything else.
    pub fn parse_id(hex: &str) -> Option<u32> {
        (hex.len() == 8).then(|| u32::from_str_radix(hex, 16).ok())?
    }
}

/// [`peek_as`] for a Chat Completions body (and any path that is not another API's).
pub fn peek(body: &[u8], session: Option<&str>) -> Peek {
    peek_as(Api::Chat, body, session)
}

/// Reads `body` (any bytes, up to the proxy's 16 MiB limit) once, as `api` reads it. `session` is
/// the `X-Session-Id` (or `X-Conversation-Id`) header value if the client sent one. A stateless
/// API's body has no fingerprint whatever it carries.
pub fn peek_as(api: Api, body: &[u8], session: Option<&str>) -> Peek {
    peek_named(api, body, session, |_| None)
}

/// [`peek_as`], the body's model known by the name `rename` gives it (a host's own name for a
/// configured model is that model, issue 27): `model`, the fingerprint and the family use that
/// name, exactly as for a body that names it, so a conversation stays one whichever of its
/// model's names a turn sends. `rename` is asked at most once, about the body's model string;
/// `None` keeps it.
pub fn peek_named(
    api: Api,
    body: &[u8],
    session: Option<&str>,
    rename: impl FnOnce(&str) -> Option<String>,
) -> Peek {
    let mut parsed = Body::parse(body, api);
    if let Some(b) = parsed.as_mut() {
        let renamed = (b.model.as_ref()).and_then(|m| m.as_str()).and_then(rename);
        if let Some(name) = renamed {
            b.model = Some(name.into());
        }
    }
    let model = parsed
        .as_ref()
        .and_then(|b| b.model.as_ref())
        .and_then(|m| m.as_str())
        .map(str::to_owned);
    let stream = parsed
        .as_ref()
        .is_some_and(|b| b.stream.as_ref().and_then(|s| s.as_bool()) == Some(true));
    // A body the peek could not build (too deep where it builds values) is still one the host
    // may read: its keys alone are looked at again.
    let names_slot = match &parsed {
        Some(b) => b.names_slot,
        None => crate::members::has(body, "id_slot") == Some(true),
    };
    let session = session.map(str::trim).filter(|s| !s.is_empty());
    let family = (parsed.as_ref())
        .filter(|_| api.takes_lease())
        .and_then(|b| family(api, b));
    let fp = match (session, parsed) {
        _ if !api.takes_lease() => String::new(),
        (Some(key), _) => explicit(key),
        (None, Some(b)) => body_fp(api, &b),
        (None, None) => String::new(),
    };
    Peek {
        model,
        fp,
        stream,
        family,
        names_slot,
    }
}

fn family(api: Api, b: &Body) -> Option<Family> {
    let parts = api.family(b)?;
    let mut h = Sha256::new();
    h.update(b"crossbar-family-v1\0");
    h.update(parts.kind.as_bytes());
    h.update(b"\0");
    h.update(parts.text());
    let digest = h.finalize();
    Some(Family {
        id: u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]),
        // The model's name is not preamble.
        bytes: parts.bytes_after_first(),
    })
}

/// `fp` as the conversation of client key `key` (issue 46): with keys on, a conversation is its
/// key's own, so a key sending another's `X-Session-Id` or prompt neither rides nor moves the
/// other's lease, nor learns from `X-Crossbar-Lease` that the other sent it. 16 hex digits of
/// kind `keyed` over the key's name and `fp`; `""` stays `""` (no conversation).
pub fn scoped(fp: &str, key: &str) -> String {
    if fp.is_empty() {
        return String::new();
    }
    let mut h = Hasher::new("keyed");
    h.part(key.as_bytes());
    h.part(fp.as_bytes());
    h.finish()
}

/// The first 8 characters of a fingerprint, for log lines (`""` stays `""`).
pub fn short(fp: &str) -> &str {
    fp.get(..8).unwrap_or(fp)
}

fn body_fp(api: Api, b: &Body) -> String {
    if let Some(key) = b.prompt_cache_key.as_ref().and_then(|k| k.as_str()) {
        if !key.trim().is_empty() {
            return explicit(key.trim());
        }
    }
    match api.conversation(b) {
        Some(parts) => {
            let mut h = Hasher::new(parts.kind);
            h.parts(parts.text());
            h.finish()
        }
        None => String::new(),
    }
}

fn explicit(key: &str) -> String {
    let mut h = Hasher::new("key");
    h.part(key.as_bytes());
    h.finish()
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

    /// Parts already NUL-terminated, as a [`crate::api::Conversation`] holds them.
    fn parts(&mut self, text: &[u8]) {
        self.0.update(text);
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
#[cfg(test)]
mod tests_api;
#[cfg(test)]
mod tests_family;
