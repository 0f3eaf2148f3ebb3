//! crossbar's own error answers as the openai and anthropic SDKs read them (issue 27): the error
//! object inside OpenAI's `{"error": {...}}`, or Anthropic's `{"type": "error", "error": {...}}`
//! for Messages paths, with `message`, `type` and `code` and crossbar's fields beside them.

use serde_json::Value;

use super::Answer;

/// The error kind an SDK gets for a status (issue 27's table).
fn kind(status: u16) -> &'static str {
    match status {
        400 | 408 | 414 | 431 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 => "overloaded_error",
        500 | 502 => "api_error",
        other => panic!("crossbar answers no {other} itself"),
    }
}

impl Answer {
    /// The error object of crossbar's own answer in OpenAI's envelope: nothing beside `error` at
    /// the top, its `type` the status's kind, `code` a string and `message` a sentence that
    /// starts with the code.
    #[track_caller]
    pub fn error(&self) -> Value {
        let body = self.json();
        assert_eq!(body.as_object().map(|o| o.len()), Some(1), "{body}");
        self.error_object(&body)
    }

    /// [`Answer::error`] without the `message` and `type` it checked: `code` and crossbar's
    /// fields, for a test to compare whole.
    #[track_caller]
    pub fn error_fields(&self) -> Value {
        let mut error = self.error();
        let fields = error.as_object_mut().expect("an error object");
        fields.remove("message");
        fields.remove("type");
        error
    }

    /// The same in Anthropic's envelope: `type` `error` beside it at the top.
    #[track_caller]
    pub fn anthropic_error(&self) -> Value {
        let body = self.json();
        assert_eq!(body.as_object().map(|o| o.len()), Some(2), "{body}");
        assert_eq!(body["type"], "error", "{body}");
        self.error_object(&body)
    }

    #[track_caller]
    fn error_object(&self, body: &Value) -> Value {
        assert_eq!(self.header("Content-Type"), Some("application/json"));
        let error = &body["error"];
        assert_eq!(error["type"], kind(self.status), "{body}");
        let code = error["code"]
            .as_str()
            .unwrap_or_else(|| panic!("no code: {body}"));
        let message = error["message"].as_str().unwrap_or_default();
        assert!(message.starts_with(&format!("{code}: ")), "{body}");
        assert!(
            message.len() > code.len() + 10,
            "a message says more: {body}"
        );
        error.clone()
    }
}

/// crossbar's own refusal, in OpenAI's envelope: its status and its `code`.
#[track_caller]
pub fn check_error(answer: &Answer, status: u16, code: &str) {
    assert_eq!(answer.status, status, "{}", answer.text());
    assert_eq!(answer.error()["code"], code, "{}", answer.text());
}
