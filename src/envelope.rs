//! The envelope of crossbar's own error answers: the one of the API the client speaks, so an SDK
//! shows crossbar's message where it shows a host's (issue 27, over seed 001's
//! `{"error": "<text>", "hint": ...}`, which the openai and anthropic SDKs showed as nothing).
//!
//! - Anthropic Messages paths (`.../v1/messages`, `.../v1/messages/count_tokens`):
//!   `{"type": "error", "error": {...}}`;
//! - every other answer of the client listener — OpenAI's APIs, native `/completion`, a path no
//!   route was found for, and the connection layer's refusals (no API is known before routing):
//!   OpenAI's `{"error": {...}}`.
//!
//! The error object is the same in both: `message` (a sentence a person can act on), `type` (the
//! error kind for the status, [`kind`]), `code` (crossbar's short words, as before: `unknown
//! route`, `queue full`...) and crossbar's own fields beside them (`hint`, `served`, `estimate`...).
//! Must not: know why a request was refused (`proxy::ProxyError` and `conn` say that), or touch
//! the admin API's `{"error": "..."}` or an answer relayed from a host. Pure.

use serde_json::{Map, Value};

/// Which API's envelope an error answer wears.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `{"error": {"message", "type", "code", ...}}`.
    OpenAi,
    /// `{"type": "error", "error": {"type", "message", "code", ...}}`.
    Anthropic,
}

impl Shape {
    /// The envelope for an answer to `path` (without its query; checked and decoded where the
    /// caller has that form): Anthropic's for a Messages path, whatever route it names or lacks.
    pub fn of(path: &str) -> Shape {
        if path.ends_with("/v1/messages") || path.ends_with("/v1/messages/count_tokens") {
            Shape::Anthropic
        } else {
            Shape::OpenAi
        }
    }
}

/// The error kind for a status, in the words both APIs' SDKs know (Anthropic's list; OpenAI's
/// SDKs read `message` and `code` and show `type` as it comes).
pub fn kind(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 => "overloaded_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

/// An error answer's body: `code` and `message` with `fields` beside them in the error object
/// (a field may not take the place of `message`, `type` or `code`).
pub fn body(
    shape: Shape,
    status: u16,
    code: &str,
    message: &str,
    fields: impl IntoIterator<Item = (&'static str, Value)>,
) -> Value {
    let mut error: Map<String, Value> = (fields.into_iter())
        .map(|(name, value)| (name.to_string(), value))
        .collect();
    error.insert("message".into(), message.into());
    error.insert("type".into(), kind(status).into());
    error.insert("code".into(), code.into());
    match shape {
        Shape::OpenAi => serde_json::json!({ "error": error }),
        Shape::Anthropic => serde_json::json!({ "type": "error", "error": error }),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn issue27_each_status_has_its_kind_in_both_envelopes() {
        let table = [
            (400, "invalid_request_error"),
            (401, "authentication_error"),
            (403, "permission_error"),
            (404, "not_found_error"),
            (408, "invalid_request_error"),
            (413, "request_too_large"),
            (429, "rate_limit_error"),
            (431, "invalid_request_error"),
            (500, "api_error"),
            (502, "api_error"),
            (503, "overloaded_error"),
        ];
        for (status, kind) in table {
            let fields = [("hint", json!("do this"))];
            assert_eq!(
                body(
                    Shape::OpenAi,
                    status,
                    "some words",
                    "some words: do this",
                    fields.clone()
                ),
                json!({"error": {"message": "some words: do this", "type": kind,
                                 "code": "some words", "hint": "do this"}}),
                "{status}"
            );
            assert_eq!(
                body(
                    Shape::Anthropic,
                    status,
                    "some words",
                    "some words: do this",
                    fields
                ),
                json!({"type": "error", "error": {"message": "some words: do this", "type": kind,
                                                  "code": "some words", "hint": "do this"}}),
                "{status}"
            );
        }
    }

    #[test]
    fn issue27_a_field_never_replaces_message_type_or_code() {
        let fields = [
            ("message", json!("x")),
            ("type", json!("y")),
            ("code", json!("z")),
        ];
        let error = &body(
            Shape::OpenAi,
            400,
            "bad request",
            "bad request: why",
            fields,
        )["error"];
        assert_eq!(
            error,
            &json!({"message": "bad request: why", "type": "invalid_request_error",
                    "code": "bad request"})
        );
    }

    #[test]
    fn issue27_messages_paths_get_anthropics_envelope_and_every_other_path_openais() {
        for path in [
            "/projA/v1/messages",
            "/v1/messages",
            "/nope/v1/messages/count_tokens",
        ] {
            assert_eq!(Shape::of(path), Shape::Anthropic, "{path}");
        }
        for path in [
            "/projA/v1/chat/completions",
            "/projA/v1/responses",
            "/projA/completion",
            "/v1/messages/batches",
            "/projA/v1/messagesx",
            "/",
            "",
        ] {
            assert_eq!(Shape::of(path), Shape::OpenAi, "{path}");
        }
    }
}
