//! Anthropic Messages (`/v1/messages`), what Claude Code speaks.
//!
//! Conversation (kind `messages`): the model, the top-level `system` and the messages up to and
//! including the first `user` one, each message as its role and content. A string content or
//! system is one text block, and `cache_control` markers are dropped: Claude Code moves them
//! every turn without changing the conversation. `metadata.user_id` is not used although Claude
//! Code puts its session id there: one session holds the main conversation, its side requests
//! and parallel sub-agents, which a session key would pile onto one host (see OPERATIONS.md).
//!
//! Streams end with `event: message_stop`; `event: error` is an upstream error (its data is the
//! error object itself). Usage: `input_tokens` EXCLUDES the cached part, so prompt =
//! `input_tokens + cache_read_input_tokens (+ cache_creation_input_tokens)`, cached =
//! `cache_read_input_tokens`, completion = `output_tokens`. A stream carries them on two events:
//! `message_start`'s `message.usage` (input and cached) and `message_delta`'s `usage` (output).

use serde_json::Value;

use super::body::Body;
use super::{canon, model, normalise_content, preamble, Conversation, Counts, Ending, UsageFields};

pub(super) const PATHS: &[&str] = &["/v1/messages", COUNT];
pub(super) const COUNT: &str = "/v1/messages/count_tokens";

/// llama-server's conversion of a Messages body to Chat Completions' drops `id_slot`: such a
/// request cannot be pinned to a slot.
pub(super) const KEEPS_ID_SLOT: bool = false;

/// What llama-server's conversion gives a Messages body without `max_tokens` (b11434
/// `server-chat.cpp`: Anthropic's API requires the field; llama-server is permissive).
const DEFAULT_MAX_TOKENS: u64 = 4096;

/// `max_tokens`, else llama-server's default for this API; a negative one is no bound.
pub(super) fn output_limit(body: &[u8]) -> Option<u64> {
    match super::limit_field(body, &["max_tokens"]) {
        Ok(n) => super::bound(n),
        Err(true) => Some(DEFAULT_MAX_TOKENS),
        Err(false) => None,
    }
}

pub(super) fn conversation(body: &Body) -> Option<Conversation> {
    let messages = body.messages.as_ref().filter(|m| !m.is_empty())?;
    let system = body.system.as_ref().map_or(Value::Null, normalise_content);
    let mut parts = Conversation::new("messages");
    parts.json(&model(body));
    parts.json(&system);
    for m in messages {
        let one = serde_json::json!({
            "role": m.get("role").cloned().unwrap_or(Value::Null),
            "content": m.get("content").map_or(Value::Null, normalise_content),
        });
        parts.json(&one);
    }
    Some(parts)
}

/// Family (kind `messages-family`): the model, `system` (normalised as above) and `tools`.
pub(super) fn family(body: &Body) -> Option<Conversation> {
    let system = (body.system.as_ref()).filter(|s| !s.is_null());
    preamble("messages-family", body, |parts| {
        system.inspect(|s| parts.json(&canon::Content(s)));
    })
}

pub(super) fn ending(event: &str) -> Option<Ending> {
    match event {
        "message_stop" => Some(Ending::Done),
        "error" => Some(Ending::Failed),
        _ => None,
    }
}

pub(super) fn counts(usage: &UsageFields<'_>) -> Counts {
    let input = usage.count("input_tokens");
    let cached = usage.count("cache_read_input_tokens");
    let created = usage.count("cache_creation_input_tokens");
    Counts {
        prompt: input.map(|n| {
            n.saturating_add(cached.unwrap_or(0))
                .saturating_add(created.unwrap_or(0))
        }),
        cached,
        completion: usage.count("output_tokens"),
    }
}
