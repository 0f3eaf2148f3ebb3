//! The APIs a client speaks to llama-server, and everything that differs between them: which
//! endpoints each owns, how a body names its conversation (the fingerprint's input), how a stream
//! ends, where the usage counts are, and which endpoint counts a body's tokens exactly.
//!
//! One file per API (`chat`, `messages`, `responses`, `completion`, `stateless`) behind the one
//! small [`Api`] enum; this file only dispatches. The fingerprint, the tee and the proxy stay
//! generic: they ask the request's `Api` and never name an endpoint themselves. Adding an API is
//! adding a file and a variant. Pure: no I/O, no clock, no locks.

pub(crate) mod body;
mod canon;
mod chat;
mod completion;
mod lenient;
mod messages;
mod responses;
mod stateless;
mod usage;

use serde_json::Value;

use body::Body;

#[cfg(test)]
pub(crate) use completion::json_prefix;
pub use completion::{PROMPT_PREFIX, TURN_MARKERS};
pub use lenient::{each_member, Count, Lenient, Number, Shape};
pub(crate) use responses::is_user_item;
pub use usage::UsageFields;

/// Which API a request speaks, from its path (the part after the route, without the query).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Api {
    /// OpenAI Chat Completions (`/v1/chat/completions`).
    Chat,
    /// Anthropic Messages (`/v1/messages`), what Claude Code speaks.
    Messages,
    /// OpenAI Responses (`/v1/responses`), what Codex speaks.
    Responses,
    /// Completion-style prompts (`/completion`, `/v1/completions`, `/infill`).
    Completion,
    /// Embeddings and rerank: no conversation, no prompt cache to keep, no lease.
    Stateless,
    /// Anything else (metadata, tokenizer): read with the Chat Completions rules, as before.
    Other,
}

/// How an SSE event ends a stream, by the event's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The stream's proper last event.
    Done,
    /// An upstream error event: the stream is over, and it failed.
    Failed,
}

/// Token counts read from one API's `usage` object; `None` where the object does not say.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Every prompt token, cached ones included.
    pub prompt: Option<i64>,
    /// Prompt tokens the host reused from its cache.
    pub cached: Option<i64>,
    /// Generated tokens.
    pub completion: Option<i64>,
}

/// A conversation's identity as the fingerprint hashes it: a kind (its own hash domain, so two
/// APIs' bodies never collide) and the parts, in order, each written straight into one buffer
/// and ended by a NUL (parts are JSON texts or a prompt prefix, never a raw NUL). One buffer, not
/// a string per part: a message was a string of its own, grown as it was written, twice a
/// request (issue 26).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conversation {
    pub kind: &'static str,
    text: Vec<u8>,
    parts: usize,
    /// Bytes in the parts after the first (the model's name, when it leads), NULs not counted.
    after_first: u64,
}

impl Conversation {
    fn new(kind: &'static str) -> Conversation {
        Conversation {
            kind,
            text: Vec::with_capacity(256),
            parts: 0,
            after_first: 0,
        }
    }

    /// Appends `v`'s compact JSON as a part (serialising a `Value` or a `canon` view cannot
    /// fail, and a `Vec` takes every byte).
    fn json(&mut self, v: &impl serde::Serialize) {
        let start = self.text.len();
        let _ = serde_json::to_writer(&mut self.text, v);
        self.end_part(start);
    }

    /// Appends `bytes` as they are as a part.
    fn bytes(&mut self, bytes: &[u8]) {
        let start = self.text.len();
        self.text.extend_from_slice(bytes);
        self.end_part(start);
    }

    fn end_part(&mut self, start: usize) {
        if self.parts > 0 {
            self.after_first += (self.text.len() - start) as u64;
        }
        self.text.push(0);
        self.parts += 1;
    }

    /// The parts, each followed by a NUL: what is hashed after the kind.
    pub fn text(&self) -> &[u8] {
        &self.text
    }

    /// Bytes in the parts after the first, NULs not counted: a family's preamble without its
    /// model's name.
    pub fn bytes_after_first(&self) -> u64 {
        self.after_first
    }
}

impl Api {
    /// Every API, for per-API tables.
    pub const ALL: [Api; 6] = [
        Api::Chat,
        Api::Messages,
        Api::Responses,
        Api::Completion,
        Api::Stateless,
        Api::Other,
    ];

    /// The API of a request path (`/v1/messages`, `/v1/messages/count_tokens`, `/rerank`...).
    pub fn of(path: &str) -> Api {
        let owns = |paths: &[&str]| paths.contains(&path);
        if owns(chat::PATHS) {
            Api::Chat
        } else if owns(messages::PATHS) {
            Api::Messages
        } else if owns(responses::PATHS) {
            Api::Responses
        } else if owns(completion::PATHS) {
            Api::Completion
        } else if owns(stateless::PATHS) {
            Api::Stateless
        } else {
            Api::Other
        }
    }

    /// The name in log lines, the `api` column and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            Api::Chat => "chat",
            Api::Messages => "messages",
            Api::Responses => "responses",
            Api::Completion => "completion",
            Api::Stateless => "stateless",
            Api::Other => "other",
        }
    }

    /// The endpoint that counts a body of this API exactly (same body, one call, no slot):
    /// `{"input_tokens": N}`. Chat Completions builds older than the count endpoints have the
    /// [`Api::count_fallback`] instead.
    pub fn count_path(self) -> Option<&'static str> {
        match self {
            Api::Chat => Some(chat::COUNT),
            Api::Messages => Some(messages::COUNT),
            Api::Responses => Some(responses::COUNT),
            Api::Completion | Api::Stateless | Api::Other => None,
        }
    }

    /// The two-call count for builds without [`Api::count_path`]: `POST /apply-template` with the
    /// body (→ `{"prompt"}`), then `POST /tokenize` with `{"content": prompt}` (→ `{"tokens"}`).
    pub fn count_fallback(self) -> Option<(&'static str, &'static str)> {
        match self {
            Api::Chat => Some(chat::COUNT_FALLBACK),
            _ => None,
        }
    }

    /// Whether llama-server keeps a body's `id_slot` on this API, so crossbar can pin the
    /// request to a slot inside the host (`exclusive` hosts). Its Messages conversion drops the field;
    /// stateless and other requests hold no conversation to pin.
    pub fn keeps_id_slot(self) -> bool {
        match self {
            Api::Chat => chat::KEEPS_ID_SLOT,
            Api::Messages => messages::KEEPS_ID_SLOT,
            Api::Responses => responses::KEEPS_ID_SLOT,
            Api::Completion => completion::KEEPS_ID_SLOT,
            Api::Stateless | Api::Other => false,
        }
    }

    /// Whether a body sent to `path` is counted by tokenizing its `prompt` alone (completion-style
    /// bodies with no count endpoint of their own; a fill-in-the-middle body is more than that).
    pub fn counts_by_prompt(self, path: &str) -> bool {
        self == Api::Completion && completion::counts_by_prompt(path)
    }

    /// The most tokens a request of this API may generate, as llama-server reads its body (issue
    /// 46: what a key's `tokens_per_day` reserves for the answer): the API's own limit field, or
    /// its default; `None` where the body sets no bound (llama-server's `-1`, or no field on an
    /// API without a default: the host generates until its context ends). Requests that generate
    /// nothing (stateless, metadata) may generate 0.
    pub fn output_limit(self, body: &[u8]) -> Option<u64> {
        match self {
            Api::Chat => chat::output_limit(body),
            Api::Messages => messages::output_limit(body),
            Api::Responses => responses::output_limit(body),
            Api::Completion => completion::output_limit(body),
            Api::Stateless | Api::Other => Some(0),
        }
    }

    /// Whether a request of this API holds a conversation lease. Stateless requests do not: each
    /// goes to the chooser's pick, with a slot.
    pub fn takes_lease(self) -> bool {
        self != Api::Stateless
    }

    /// The fingerprint input of a body, or `None` when it names no conversation.
    pub fn conversation(self, body: &Body) -> Option<Conversation> {
        match self {
            Api::Chat | Api::Other => chat::conversation(body),
            Api::Messages => messages::conversation(body),
            Api::Responses => responses::conversation(body),
            Api::Completion => completion::conversation(body),
            Api::Stateless => None,
        }
    }

    /// The body's prompt family: the model and the fixed preamble every conversation of the same
    /// agent or app starts with (system prompt, instructions, tool definitions), or `None` when
    /// the body has none. Hashed like a conversation, in a domain of its own (`fingerprint`).
    pub fn family(self, body: &Body) -> Option<Conversation> {
        match self {
            Api::Chat | Api::Other => chat::family(body),
            Api::Messages => messages::family(body),
            Api::Responses => responses::family(body),
            Api::Completion => completion::family(body),
            Api::Stateless => None,
        }
    }

    /// Whether the `input` field of this API's bodies is a conversation (Responses) rather than
    /// a completion-style prompt.
    pub fn input_is_conversation(self) -> bool {
        self == Api::Responses
    }

    /// What an SSE event of this name means for a stream of this API. `data: [DONE]` and a
    /// native `"stop": true` chunk end every stream; these are the named events.
    pub fn ending(self, event: &str) -> Option<Ending> {
        match self {
            Api::Messages => messages::ending(event),
            Api::Responses => responses::ending(event),
            Api::Chat | Api::Completion | Api::Stateless | Api::Other => None,
        }
    }

    /// Reads one `usage` object in this API's own field names.
    pub fn counts(self, usage: &UsageFields<'_>) -> Counts {
        match self {
            Api::Messages => messages::counts(usage),
            Api::Responses => responses::counts(usage),
            Api::Chat | Api::Completion | Api::Stateless | Api::Other => chat::counts(usage),
        }
    }
}

/// A count endpoint (`/v1/messages/count_tokens`...): metadata like `/tokenize`, no slot.
pub fn is_count(path: &str) -> bool {
    Api::ALL
        .iter()
        .filter_map(|a| a.count_path())
        .chain([chat::COUNT_UNVERSIONED, responses::COUNT_UNVERSIONED])
        .any(|p| p == path)
}

/// Text blocks as one API family spells them (`text`, `input_text`, `output_text`) read as one:
/// a string content is one such block, and `cache_control` markers (which Claude Code moves
/// every turn) are not part of the conversation.
fn normalise_content(content: &Value) -> Value {
    match content {
        Value::String(s) => Value::Array(vec![text_block(s)]),
        Value::Array(blocks) => Value::Array(blocks.iter().map(normalise_block).collect()),
        other => other.clone(),
    }
}

/// A family's parts: the model, then each piece of preamble (as JSON, `null`s left out by the
/// caller), then the tools (their `cache_control` markers dropped); `None` when there is no
/// preamble at all.
fn preamble(
    kind: &'static str,
    body: &Body,
    pieces: impl FnOnce(&mut Conversation),
) -> Option<Conversation> {
    let mut parts = Conversation::new(kind);
    parts.json(&model(body));
    pieces(&mut parts);
    if let Some(Value::Array(tools)) = &body.tools {
        if !tools.is_empty() {
            parts.bytes(b"tools");
            parts.json(&canon::Blocks(tools));
        }
    }
    (parts.parts > 1).then_some(parts)
}

/// The body's model name, `""` when it names none: the first part of every conversation.
fn model(body: &Body) -> &str {
    body.model.as_ref().and_then(Value::as_str).unwrap_or("")
}

/// Roles that make up a preamble when they lead a conversation.
fn is_preamble_role(message: &Value) -> bool {
    matches!(
        message.get("role").and_then(Value::as_str),
        Some("system" | "developer")
    )
}

fn text_block(text: &str) -> Value {
    serde_json::json!({"type": "text", "text": text})
}

fn normalise_block(block: &Value) -> Value {
    let Value::Object(map) = block else {
        return block.clone();
    };
    let kind = map.get("type").and_then(Value::as_str);
    if let (Some("text" | "input_text" | "output_text"), Some(Value::String(text))) =
        (kind, map.get("text"))
    {
        return text_block(text);
    }
    let mut map = map.clone();
    map.remove("cache_control");
    Value::Object(map)
}

#[cfg(test)]
mod tests;

/// The number the first of `names` in `body` holds, read as llama-server reads the field (its
/// own name, then its aliases; of a key given twice, the last): `Ok(n)` for a whole number,
/// `Err(true)` when none of them is there, `Err(false)` when it is there but not a whole number.
fn limit_field(body: &[u8], names: &[&str]) -> Result<i64, bool> {
    let raw = crate::members::first_named(body, names)
        .flatten()
        .ok_or(true)?;
    raw.get().parse::<i64>().map_err(|_| false)
}

/// A limit field's number as a bound: llama-server's `-1` (or any negative number) is none.
fn bound(n: i64) -> Option<u64> {
    u64::try_from(n).ok()
}
