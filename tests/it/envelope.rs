//! Issue 27: crossbar's own refusals in the envelope of the API the client speaks, so the openai
//! and anthropic SDKs show crossbar's message (they read `error.message`).

use serde_json::json;

use crate::support::{chat, host, Harness};

/// A Messages body naming `model`.
fn message(model: &str) -> serde_json::Value {
    json!({"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
}

#[test]
fn issue27_messages_paths_get_anthropics_envelope_and_every_other_path_openais() {
    let h = Harness::start(vec![host("titan", 1)], "");
    for path in [
        "/projA/v1/messages",
        "/projA/v1/messages/count_tokens",
        // Decoded as routing decodes it.
        "/projA/v1/m%65ssages",
    ] {
        let answer = h.post(path, &message("made-up"));
        assert_eq!(answer.status, 404, "{path}: {}", answer.text());
        let error = answer.anthropic_error();
        assert_eq!(error["code"], "model_not_found", "{path}");
        assert_eq!(error["served"], json!(["m"]), "{path}");
        let message = error["message"].as_str().unwrap();
        assert!(
            message.starts_with("model_not_found: no host of this route serves \"made-up\""),
            "{message}"
        );
    }
    // No route named: the path still says which API the client speaks.
    let answer = h.post("/v1/messages", &message("m"));
    assert_eq!(answer.status, 400, "{}", answer.text());
    assert_eq!(answer.anthropic_error()["code"], "missing route");

    let mut body = chat("hi", 0, false);
    body["model"] = "made-up".into();
    for path in [
        "/projA/v1/chat/completions",
        "/projA/v1/responses",
        "/projA/completion",
        "/projA/v1/embeddings",
    ] {
        let answer = h.post(path, &body);
        assert_eq!(answer.status, 404, "{path}: {}", answer.text());
        let error = answer.error();
        assert_eq!(error["code"], "model_not_found", "{path}");
        assert_eq!(error["model"], "made-up", "{path}");
    }
    let answer = h.post("/chat/completions", &body);
    assert_eq!(answer.status, 400, "{}", answer.text());
    let error = answer.error();
    assert_eq!(
        error["message"],
        format!("missing route: {}", error["hint"].as_str().unwrap())
    );
}
