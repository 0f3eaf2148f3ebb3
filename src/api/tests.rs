//! Which API a path speaks, and where each API keeps its counts.

use serde_json::json;

use super::*;

#[test]
fn paths_name_their_api_and_counts_are_metadata() {
    for (path, api, count) in [
        ("/v1/chat/completions", Api::Chat, false),
        ("/v1/chat/completions/input_tokens", Api::Chat, true),
        ("/v1/messages", Api::Messages, false),
        ("/v1/messages/count_tokens", Api::Messages, true),
        ("/v1/responses", Api::Responses, false),
        ("/v1/responses/input_tokens", Api::Responses, true),
        ("/completion", Api::Completion, false),
        ("/v1/completions", Api::Completion, false),
        ("/infill", Api::Completion, false),
        ("/v1/embeddings", Api::Stateless, false),
        ("/reranking", Api::Stateless, false),
        ("/tokenize", Api::Other, false),
        ("/v1/models", Api::Other, false),
    ] {
        assert_eq!((Api::of(path), is_count(path)), (api, count), "{path}");
    }
    assert_eq!(
        Api::Messages.count_path(),
        Some("/v1/messages/count_tokens")
    );
    assert_eq!(
        Api::Chat.count_fallback(),
        Some(("/apply-template", "/tokenize"))
    );
    assert_eq!(Api::Completion.count_path(), None);
    assert!(!Api::Stateless.takes_lease() && Api::Messages.takes_lease());
}

#[test]
fn each_api_reads_its_own_usage_fields_into_one_meaning() {
    // The same answer (70 prompt tokens, 53 of them cached, 6 generated) in each API's words.
    let want = Counts {
        prompt: Some(70),
        cached: Some(53),
        completion: Some(6),
    };
    let chat = json!({"prompt_tokens": 70, "completion_tokens": 6, "total_tokens": 76,
                      "prompt_tokens_details": {"cached_tokens": 53}});
    let messages = json!({"cache_read_input_tokens": 53, "input_tokens": 17, "output_tokens": 6});
    let responses = json!({"input_tokens": 70, "output_tokens": 6, "total_tokens": 76,
                           "input_tokens_details": {"cached_tokens": 53}});
    let counts = |api: Api, usage: &Value| {
        let text = usage.to_string();
        api.counts(&UsageFields::parse(&text).expect("an object"))
    };
    assert_eq!(counts(Api::Chat, &chat), want);
    assert_eq!(counts(Api::Messages, &messages), want);
    assert_eq!(counts(Api::Responses, &responses), want);
    // message_delta carries only the output count: the rest is unknown, not zero.
    assert_eq!(
        counts(Api::Messages, &json!({"output_tokens": 9})),
        Counts {
            completion: Some(9),
            ..Counts::default()
        }
    );
}

#[test]
fn stream_endings_are_per_api() {
    assert_eq!(Api::Messages.ending("message_stop"), Some(Ending::Done));
    assert_eq!(Api::Messages.ending("error"), Some(Ending::Failed));
    assert_eq!(Api::Messages.ending("message_delta"), None);
    assert_eq!(
        Api::Responses.ending("response.completed"),
        Some(Ending::Done)
    );
    for failed in ["response.failed", "response.incomplete", "error"] {
        assert_eq!(Api::Responses.ending(failed), Some(Ending::Failed));
    }
    assert_eq!(Api::Chat.ending("message_stop"), None);
}

/// Issue 46: what a request may generate, as llama-server reads its body — the field's own name
/// before its aliases, the last of a repeated key, escapes decoded, `-1` no bound — is what a
/// key's `tokens_per_day` reserves for its answer.
#[test]
fn each_api_reads_its_own_limit_field_as_the_host_does_issue_46() {
    let limit = |api: Api, body: &str| api.output_limit(body.as_bytes());
    assert_eq!(limit(Api::Chat, r#"{"max_tokens":40}"#), Some(40));
    assert_eq!(limit(Api::Chat, r#"{"max_completion_tokens":7}"#), Some(7));
    assert_eq!(
        limit(
            Api::Chat,
            r#"{"max_tokens":40,"n_predict":3,"max_tokens":9}"#
        ),
        Some(3),
        "n_predict first"
    );
    assert_eq!(
        limit(Api::Chat, r#"{"max_tokens":40,"max_tokens":9}"#),
        Some(9)
    );
    assert_eq!(limit(Api::Chat, r#"{"max\u005ftokens":12}"#), Some(12));
    assert_eq!(limit(Api::Chat, r#"{"max_tokens":-1}"#), None);
    assert_eq!(limit(Api::Chat, r#"{"messages":[]}"#), None);
    assert_eq!(
        limit(Api::Completion, r#"{"prompt":"x","n_predict":64}"#),
        Some(64)
    );
    assert_eq!(limit(Api::Messages, r#"{"max_tokens":100}"#), Some(100));
    assert_eq!(limit(Api::Messages, r#"{"messages":[]}"#), Some(4096));
    assert_eq!(limit(Api::Responses, r#"{"max_output_tokens":5}"#), Some(5));
    assert_eq!(limit(Api::Responses, r#"{"max_tokens":5}"#), None);
    assert_eq!(limit(Api::Stateless, r#"{"input":"x"}"#), Some(0));
}
