//! OpenAI Responses (`/v1/responses`), what Codex and newer OpenAI SDK agents speak.
//!
//! Conversation (kind `responses`): the model, `instructions`, and the `input` items up to and
//! including the first `user` one. A plain-string `input` is one user message holding one
//! `input_text`; a message item is its role and content (`type` defaults to `message`; ids and
//! statuses clients echo back are not part of it); text blocks (`input_text`, `output_text`,
//! `text`) read as one kind, a string content as one such block, `cache_control` is dropped.
//! llama-server refuses `previous_response_id`, so every turn re-sends the history.
//!
//! Streams end with `event: response.completed` (its `response.usage` and a top-level `timings`
//! carry the figures); `response.failed`, `response.incomplete` and `error` are upstream error
//! events. Usage: prompt = `input_tokens` (cached included), cached =
//! `input_tokens_details.cached_tokens`, completion = `output_tokens`.

use serde_json::Value;

use super::body::{Body, Input};
use super::{
    is_preamble_role, model, normalise_content, preamble, Conversation, Counts, Ending, UsageFields,
};

pub(super) const PATHS: &[&str] = &["/v1/responses", "/responses", COUNT, COUNT_UNVERSIONED];
pub(super) const COUNT: &str = "/v1/responses/input_tokens";
pub(super) const COUNT_UNVERSIONED: &str = "/responses/input_tokens";

/// llama-server keeps a body's `id_slot` here: it converts the body to Chat Completions'
/// and carries the field over.
pub(super) const KEEPS_ID_SLOT: bool = true;

/// `max_output_tokens`, which llama-server's conversion makes the body's `max_tokens`; none is
/// no bound.
pub(super) fn output_limit(body: &[u8]) -> Option<u64> {
    super::limit_field(body, &["max_output_tokens"])
        .ok()
        .and_then(super::bound)
}

pub(super) fn conversation(body: &Body) -> Option<Conversation> {
    let items: Vec<Value> = match body.input.as_ref()? {
        Input::Text(text) => vec![message("user", &Value::from(text.as_str()))],
        Input::Items(items) if !items.is_empty() => items.iter().map(normalise_item).collect(),
        Input::Items(_) => return None,
    };
    let mut parts = Conversation::new("responses");
    parts.json(&model(body));
    parts.json(body.instructions.as_ref().unwrap_or(&Value::Null));
    items.iter().for_each(|i| parts.json(i));
    Some(parts)
}

/// Family (kind `responses-family`): the model, `instructions`, the leading system/developer
/// message items of `input`, and `tools`.
pub(super) fn family(body: &Body) -> Option<Conversation> {
    let leading: Vec<Value> = match body.input.as_ref() {
        Some(Input::Items(items)) => (items.iter())
            .take_while(|i| is_preamble_role(i))
            .map(normalise_item)
            .collect(),
        _ => Vec::new(),
    };
    let instructions = body.instructions.as_ref().filter(|i| !i.is_null());
    preamble("responses-family", body, |parts| {
        (instructions.into_iter())
            .chain(leading.iter().filter(|v| !v.is_null()))
            .for_each(|v| parts.json(v));
    })
}

/// Whether an `input` item is the user's message (the last item the fingerprint reads).
pub(crate) fn is_user_item(item: &Value) -> bool {
    item.get("role").and_then(Value::as_str) == Some("user")
        && matches!(
            item.get("type").and_then(Value::as_str),
            None | Some("message")
        )
}

fn normalise_item(item: &Value) -> Value {
    match (item.get("role"), item.get("type").and_then(Value::as_str)) {
        (Some(Value::String(role)), None | Some("message")) => {
            message(role, item.get("content").unwrap_or(&Value::Null))
        }
        _ => {
            let mut item = item.clone();
            if let Some(map) = item.as_object_mut() {
                map.remove("cache_control");
            }
            item
        }
    }
}

fn message(role: &str, content: &Value) -> Value {
    serde_json::json!({"type": "message", "role": role, "content": normalise_content(content)})
}

pub(super) fn ending(event: &str) -> Option<Ending> {
    match event {
        "response.completed" => Some(Ending::Done),
        "response.failed" | "response.incomplete" | "error" => Some(Ending::Failed),
        _ => None,
    }
}

pub(super) fn counts(usage: &UsageFields<'_>) -> Counts {
    Counts {
        prompt: usage.count("input_tokens"),
        cached: usage.nested_count("input_tokens_details", "cached_tokens"),
        completion: usage.count("output_tokens"),
    }
}
