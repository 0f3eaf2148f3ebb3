//! OpenAI Chat Completions (`/v1/chat/completions`), and the rules every other path falls back to.
//!
//! Conversation: the model plus every message up to and including the first `user` one (all of
//! them when none is), each as compact JSON with sorted keys, kind `chat`; a body without
//! `messages` is read as a completion-style prompt (the seed's rule, kept byte for byte: live
//! leases are keyed by it). Family: the leading system/developer messages and `tools`. Streams end with `data: [DONE]` (the tee knows that one). Usage:
//! `prompt_tokens` (cached included), `prompt_tokens_details.cached_tokens`, `completion_tokens`.

use super::body::Body;
use super::{
    canon, completion, is_preamble_role, model, preamble, Conversation, Counts, UsageFields,
};

pub(super) const PATHS: &[&str] = &[
    "/v1/chat/completions",
    "/chat/completions",
    COUNT,
    COUNT_UNVERSIONED,
];
pub(super) const COUNT: &str = "/v1/chat/completions/input_tokens";
pub(super) const COUNT_UNVERSIONED: &str = "/chat/completions/input_tokens";
pub(super) const COUNT_FALLBACK: (&str, &str) = ("/apply-template", "/tokenize");

/// llama-server keeps a body's `id_slot` here.
pub(super) const KEEPS_ID_SLOT: bool = true;

/// `n_predict`, else its aliases `max_completion_tokens` and `max_tokens`, as llama-server's
/// schema reads them; none is no bound (it generates until its context ends).
pub(super) fn output_limit(body: &[u8]) -> Option<u64> {
    super::limit_field(body, completion::LIMIT)
        .ok()
        .and_then(super::bound)
}

pub(super) fn conversation(body: &Body) -> Option<Conversation> {
    let Some(messages) = body.messages.as_ref().filter(|m| !m.is_empty()) else {
        return completion::whole_prefix(body);
    };
    let mut parts = Conversation::new("chat");
    parts.json(&model(body));
    // `Value`'s map is a BTreeMap (serde_json without `preserve_order`), so this text has sorted
    // keys and no insignificant whitespace; a fingerprint test guards that assumption.
    for m in messages {
        parts.json(m);
    }
    Some(parts)
}

/// Family (kind `chat-family`): the model, the leading `system`/`developer` messages (role and
/// content) and `tools`. A body without `messages` is a completion-style prompt's family.
pub(super) fn family(body: &Body) -> Option<Conversation> {
    let Some(messages) = body.messages.as_ref().filter(|m| !m.is_empty()) else {
        return completion::family(body);
    };
    let leading = (messages.iter()).take_while(|m| is_preamble_role(m));
    preamble("chat-family", body, |parts| {
        leading.for_each(|m| parts.json(&canon::Message(m)));
    })
}

pub(super) fn counts(usage: &UsageFields<'_>) -> Counts {
    Counts {
        prompt: usage.count("prompt_tokens"),
        cached: usage.nested_count("prompt_tokens_details", "cached_tokens"),
        completion: usage.count("completion_tokens"),
    }
}
