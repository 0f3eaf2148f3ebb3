//! Issue 16: Anthropic Messages and OpenAI Responses answers, streamed (at every split point) and
//! not, in the shapes llama-server b11434 sends (`server-task.cpp`, `server-common.cpp`).

use super::*;

fn tee_for(api: Api) -> impl Fn() -> Tee {
    move || Tee::for_api("text/event-stream", api)
}

/// A streamed `/v1/messages` answer: usage split over `message_start` (input, cached) and
/// `message_delta` (output), then `message_stop` and no `[DONE]`. A delta whose text spells an
/// end event must not end anything.
const MESSAGES_STREAM: &str = concat!(
    "event: message_start\n",
    r#"data: {"type":"message_start","message":{"id":"chatcmpl-1","type":"message","role":"assistant","content":[],"model":"qwen","stop_reason":null,"stop_sequence":null,"usage":{"cache_read_input_tokens":53,"input_tokens":17,"output_tokens":0}}}"#,
    "\n\n",
    "event: content_block_start\n",
    r#"data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
    "\n\n",
    "event: content_block_delta\n",
    r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"event: message_stop \"error\" [DONE]"}}"#,
    "\n\n",
    ":\n\n",
    "event: content_block_stop\n",
    r#"data: {"type":"content_block_stop","index":0}"#,
    "\n\n",
    "event: message_delta\n",
    r#"data: {"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null},"usage":{"output_tokens":6}}"#,
    "\n\n",
    "event: message_stop\n",
    r#"data: {"type":"message_stop"}"#,
    "\n\n",
);

/// A streamed `/v1/responses` answer: `response.completed` carries `response.usage` and a
/// top-level `timings`; no `[DONE]`.
const RESPONSES_STREAM: &str = concat!(
    "event: response.created\n",
    r#"data: {"type":"response.created","response":{"id":"resp_1","object":"response","status":"in_progress","output":[]}}"#,
    "\n\n",
    "event: response.output_text.delta\n",
    r#"data: {"type":"response.output_text.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":"response.completed"}"#,
    "\n\n",
    "event: response.output_text.done\n",
    r#"data: {"type":"response.output_text.done","item_id":"msg_1","text":"response.completed"}"#,
    "\n\n",
    "event: response.completed\n",
    r#"data: {"type":"response.completed","response":{"id":"resp_1","object":"response","created_at":1,"status":"completed","model":"qwen","output":[{"type":"message","status":"completed","id":"msg_1","content":[{"type":"output_text","annotations":[],"logprobs":[],"text":"x"}],"role":"assistant"}],"usage":{"input_tokens":70,"output_tokens":6,"total_tokens":76,"input_tokens_details":{"cached_tokens":52}}},"timings":{"cache_n":53,"prompt_n":17,"predicted_n":6}}"#,
    "\n\n",
);

#[test]
fn a_streamed_messages_answer_ends_at_message_stop_with_its_tokens() {
    let want = Outcome {
        usage: usage(70, 53, 6),
        finished: true,
        error: None,
        overflowed: false,
    };
    assert_eq!(
        check_every_split(&tee_for(Api::Messages), MESSAGES_STREAM.as_bytes()),
        want
    );
    assert_eq!(
        check_every_split(&tee_for(Api::Messages), crlf(MESSAGES_STREAM).as_bytes()),
        want
    );
}

#[test]
fn a_streamed_responses_answer_ends_at_response_completed_with_its_tokens() {
    // cached from timings (53), as for chat: timings.cache_n wins over the usage's detail.
    let want = Outcome {
        usage: usage(70, 53, 6),
        finished: true,
        error: None,
        overflowed: false,
    };
    assert_eq!(
        check_every_split(&tee_for(Api::Responses), RESPONSES_STREAM.as_bytes()),
        want
    );
}

#[test]
fn a_stream_cut_before_its_last_event_is_not_finished() {
    for (api, stream, last) in [
        (Api::Messages, MESSAGES_STREAM, "event: message_stop"),
        (
            Api::Responses,
            RESPONSES_STREAM,
            "event: response.completed",
        ),
    ] {
        let cut = &stream[..stream.rfind(last).unwrap()];
        let got = check_every_split(&tee_for(api), cut.as_bytes());
        assert!(!got.finished && got.error.is_none(), "{api:?}: {got:?}");
        // The same bytes read as Chat Completions never finish: the ending is the API's.
        assert!(
            !check_every_split(&sse, stream.as_bytes()).finished,
            "{api:?}"
        );
    }
}

#[test]
fn named_error_events_are_upstream_errors() {
    // llama-server's Messages stream error: `event: error` whose data is the error object itself.
    let messages = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5}}}\n\n",
        "event: error\ndata: {\"code\":500,\"message\":\"Context size has been exceeded.\",\"type\":\"server_error\"}\n\n",
    );
    let got = check_every_split(&tee_for(Api::Messages), messages.as_bytes());
    assert_eq!(
        got.error.as_deref(),
        Some("Context size has been exceeded.")
    );
    assert!(!got.finished);
    assert_eq!(got.usage.prompt_tokens, Some(5));
    // Anthropic's own envelope.
    let envelope = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
    let got = check_every_split(&tee_for(Api::Messages), envelope.as_bytes());
    assert_eq!(got.error.as_deref(), Some("Overloaded"));
    for (event, data, want) in [
        (
            "response.failed",
            r#"{"type":"response.failed","response":{"status":"failed","error":{"code":"server_error","message":"boom"}}}"#,
            "boom",
        ),
        (
            "response.incomplete",
            r#"{"type":"response.incomplete","response":{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"}}}"#,
            "response.incomplete: max_output_tokens",
        ),
        ("error", "not json", "error"),
    ] {
        let stream = format!("event: {event}\ndata: {data}\n\n");
        let got = check_every_split(&tee_for(Api::Responses), stream.as_bytes());
        assert_eq!(
            (got.error.as_deref(), got.finished),
            (Some(want), false),
            "{event}"
        );
    }
    // llama-server's Responses stream error is chat's `data: {"error":...}`.
    let plain = "data: {\"error\":{\"code\":500,\"message\":\"oops\"}}\n\n";
    let got = check_every_split(&tee_for(Api::Responses), plain.as_bytes());
    assert_eq!(got.error.as_deref(), Some("oops"));
}

#[test]
fn an_end_event_without_data_or_with_an_overlong_name_is_handled() {
    let got = check_every_split(&tee_for(Api::Messages), b"event: message_stop\n\n");
    assert!(got.finished);
    let long = format!("event: message_stop{}\ndata: {{}}\n\n", "x".repeat(100));
    assert!(!check_every_split(&tee_for(Api::Messages), long.as_bytes()).finished);
    // The name belongs to its event only.
    let stale = "event: message_stop\n\ndata: {\"usage\":{\"output_tokens\":1}}\n\n";
    let mut tee = Tee::for_api("text/event-stream", Api::Messages);
    tee.feed(b"event: ping\n\ndata: {}\n\n");
    assert!(!tee.finished());
    assert!(check_every_split(&tee_for(Api::Messages), stale.as_bytes()).finished);
}

#[test]
fn non_streamed_answers_read_each_apis_usage() {
    let messages = r#"{"id":"chatcmpl-1","type":"message","role":"assistant","content":[{"type":"text","text":"7"}],"model":"qwen","stop_reason":"max_tokens","stop_sequence":null,"usage":{"cache_read_input_tokens":53,"input_tokens":17,"output_tokens":6}}"#;
    let responses = r#"{"completed_at":1,"created_at":1,"id":"resp_1","model":"qwen","object":"response","output":[],"status":"completed","usage":{"input_tokens":70,"output_tokens":6,"total_tokens":76,"input_tokens_details":{"cached_tokens":53}}}"#;
    for (api, body) in [(Api::Messages, messages), (Api::Responses, responses)] {
        let json = || Tee::for_api("application/json", api);
        let got = check_every_split(&json, body.as_bytes());
        assert_eq!(
            (got.usage, got.finished),
            (usage(70, 53, 6), true),
            "{api:?}"
        );
    }
}

#[test]
fn a_top_level_message_string_does_not_hide_usage_or_errors() {
    // An error object at the top level carries `message` as a string, not Messages' message.
    let stream = "data: {\"usage\":{\"prompt_tokens\":9},\"message\":\"hi\",\"error\":{\"message\":\"bad\"}}\n\n";
    let got = check_every_split(&sse, stream.as_bytes());
    assert_eq!(
        (got.usage.prompt_tokens, got.error.as_deref()),
        (Some(9), Some("bad"))
    );
}
