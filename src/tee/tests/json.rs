//! The non-streamed modes: a JSON body read whole, everything else ignored.

use super::*;

/// A non-streamed `/v1/chat/completions` answer as b11434 sends it.
const CHAT_BODY: &str = r#"{"choices":[{"finish_reason":"stop","index":0,"message":{"role":"assistant","content":"7"}}],"created":1,"model":"m","system_fingerprint":"b11434","object":"chat.completion","usage":{"completion_tokens":2,"prompt_tokens":70,"total_tokens":72,"prompt_tokens_details":{"cached_tokens":53}},"id":"chatcmpl-2","timings":{"cache_n":53,"prompt_n":17,"prompt_ms":9.1,"predicted_n":2,"predicted_ms":16.0}}"#;

#[test]
fn a_json_body_is_read_whole_at_any_split() {
    let json = || Tee::new("application/json; charset=utf-8");
    let got = check_every_split(&json, CHAT_BODY.as_bytes());
    let want = Outcome {
        usage: usage(70, 53, 2),
        finished: true,
        error: None,
        overflowed: false,
    };
    assert_eq!(got, want);
    // Asking early, then feeding more, answers from the new bytes.
    let mut tee = json();
    tee.feed(&CHAT_BODY.as_bytes()[..100]);
    assert_eq!(tee.usage(), Usage::default());
    tee.feed(&CHAT_BODY.as_bytes()[100..]);
    assert_eq!(tee.usage(), usage(70, 53, 2));
}

#[test]
fn a_json_error_body_is_an_upstream_error() {
    let body = r#"{"error":{"code":400,"message":"request (5000 tokens) exceeds the available context size (2048 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5000,"n_ctx":2048}}"#;
    let mut tee = Tee::new("application/json");
    tee.feed(body.as_bytes());
    assert!(tee
        .upstream_error()
        .is_some_and(|e| e.starts_with("request (5000 tokens) exceeds")));
    assert_eq!(tee.usage(), Usage::default());
}

#[test]
fn a_json_body_over_the_limit_gives_no_tokens() {
    let mut at_limit = CHAT_BODY.as_bytes().to_vec();
    at_limit.resize(MAX_BODY, b' ');
    let got = run(&|| Tee::new("application/json"), at_limit.chunks(65536));
    assert_eq!((got.usage, got.overflowed), (usage(70, 53, 2), false));
    at_limit.push(b'\n');
    let got = run(&|| Tee::new("application/json"), at_limit.chunks(65536));
    assert_eq!((got.usage, got.overflowed), (Usage::default(), true));
}

#[test]
fn the_content_type_picks_the_mode() {
    let sse_bytes = "data: {\"stop\":true,\"tokens_evaluated\":3}\n\n";
    for (ct, prompt, finished) in [
        ("text/event-stream", Some(3), true),
        ("Text/Event-Stream; charset=utf-8", Some(3), true),
        (" text/event-stream ", Some(3), true),
        ("application/json", None, true), // not one JSON value: nothing
        ("text/plain", None, true),
        ("", None, true),
    ] {
        let mut tee = Tee::new(ct);
        tee.feed(sse_bytes.as_bytes());
        assert_eq!(
            (tee.usage().prompt_tokens, tee.finished()),
            (prompt, finished),
            "{ct:?}"
        );
    }
    let mut plain = Tee::new("text/plain");
    plain.feed(CHAT_BODY.as_bytes());
    assert_eq!(outcome(&plain).usage, Usage::default());
    let mut unfinished = sse();
    unfinished.feed(b"data: {\"choices\":[]}\n\n");
    assert!(!unfinished.finished());
}

#[test]
fn long_error_messages_are_cut_on_a_char_boundary() {
    let msg = "é".repeat(1000);
    let mut tee = sse();
    tee.feed(format!("data: {{\"error\":{{\"message\":\"{msg}\"}}}}\n\n").as_bytes());
    let got = tee.upstream_error().unwrap_or_default();
    assert!(got.len() <= 1024 && got.len() > 1000 && got.chars().all(|c| c == 'é'));
}
