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
fn a_json_body_over_the_limit_is_read_at_its_ends_only() {
    let mut at_limit = CHAT_BODY.as_bytes().to_vec();
    at_limit.resize(MAX_BODY, b' ');
    let got = run(&|| Tee::new("application/json"), at_limit.chunks(65536));
    assert_eq!((got.usage, got.overflowed), (usage(70, 53, 2), false));
    // One byte more: the usage is still in the first MAX_TAIL bytes.
    at_limit.push(b'\n');
    let got = run(&|| Tee::new("application/json"), at_limit.chunks(65536));
    assert_eq!((got.usage, got.overflowed), (usage(70, 53, 2), true));
    // Further in than either end: not read, no tokens.
    let pad = " ".repeat(MAX_TAIL);
    let middle = format!(
        "{{\"a\":\"{pad}\",\"b\":{CHAT_BODY},\"c\":\"{}\"}}",
        pad.repeat(16)
    );
    let got = run(
        &|| Tee::new("application/json"),
        middle.as_bytes().chunks(65536),
    );
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

/// A JSON tee that keeps `max_body` bytes whole and a tail of `tail` bytes past that, so overflow
/// stories stay small enough to split everywhere.
fn small_json(max_body: usize, tail: usize, api: Api) -> Tee {
    Tee {
        mode: Mode::Json(Json::new(max_body, tail, api)),
    }
}

/// An `/v1/embeddings` answer as b11434 sends it, `n` vectors: its objects keep their keys in
/// insertion order (`common_json`), so `usage` comes before `data`, near the start.
fn embeddings(n: usize, tokens: i64) -> String {
    format!(
        r#"{{"model":"m","object":"list","usage":{{"prompt_tokens":{tokens},"total_tokens":{tokens}}},"data":[{}]}}"#,
        vectors(n)
    )
}

/// The same answer from a server that sorts its keys: `usage` last.
fn sorted_embeddings(n: usize, tokens: i64) -> String {
    format!(
        r#"{{"data":[{}],"model":"m","object":"list","usage":{{"prompt_tokens":{tokens},"total_tokens":{tokens}}}}}"#,
        vectors(n)
    )
}

fn vectors(n: usize) -> String {
    let vector = vec!["-0.0123"; 64].join(",");
    let data: Vec<String> = (0..n)
        .map(|i| format!(r#"{{"embedding":[{vector}],"index":{i},"object":"embedding"}}"#))
        .collect();
    data.join(",")
}

/// Issue 18 (review): a batch of embeddings is often over [`MAX_BODY`], and the tee dropped such
/// a body whole: stateless rows lost their token counts. b11434 puts `usage` near the start, a
/// key-sorting server and big chat answers near the end: both ends are kept and read.
#[test]
fn a_json_body_over_the_limit_keeps_the_usage_at_either_end_at_any_split_issue_18() {
    let want = Usage {
        prompt_tokens: Some(17),
        ..Usage::default()
    };
    for body in [embeddings(2, 17), sorted_embeddings(2, 17)] {
        let tee = || small_json(96, 80, Api::Stateless);
        let got = check_every_split(&tee, body.as_bytes());
        assert_eq!((got.usage, got.overflowed), (want, true), "{body}");
        // A usage object longer than the window, or cut by its edge: no counts, no guess.
        let tee = || small_json(96, 40, Api::Stateless);
        assert_eq!(
            check_every_split(&tee, body.as_bytes()).usage,
            Usage::default()
        );
    }
    // A chat answer over the bound: `timings` and `usage` both near its end.
    let content = "x".repeat(300);
    let chat = CHAT_BODY.replace(r#""content":"7""#, &format!(r#""content":"{content}""#));
    let tee = || small_json(96, 240, Api::Chat);
    assert_eq!(
        check_every_split(&tee, chat.as_bytes()).usage,
        usage(70, 53, 2)
    );
}

#[test]
fn a_real_batch_of_embeddings_over_a_mebibyte_keeps_its_prompt_tokens_issue_18() {
    for (body, tokens) in [
        (embeddings(4000, 123), 123),
        (sorted_embeddings(4000, 456), 456),
    ] {
        assert!(body.len() > 2 * MAX_BODY, "{}", body.len());
        let mut tee = Tee::for_api("application/json", Api::Stateless);
        for chunk in body.as_bytes().chunks(16 * 1024) {
            tee.feed(chunk);
        }
        assert!(tee.overflowed());
        assert_eq!(tee.usage().prompt_tokens, Some(tokens));
    }
    // Both ends name a usage: the later one counts, as in a whole body.
    let both = format!(
        r#"{{"usage":{{"prompt_tokens":1}},"data":[{}],"usage":{{"prompt_tokens":5}}}}"#,
        vectors(4000)
    );
    let mut tee = Tee::for_api("application/json", Api::Stateless);
    tee.feed(both.as_bytes());
    assert_eq!(tee.usage().prompt_tokens, Some(5));
}

#[test]
fn a_hostile_hosts_answer_costs_only_itself_issue_26() {
    // Nested a hundred thousand deep, in a skipped field and inside `usage`: skipped values are
    // walked without recursion, so the stack holds and the counts beside them are still read.
    let deep = |inner: &str| format!("{}{inner}{}", "[".repeat(100_000), "]".repeat(100_000));
    for body in [
        format!(
            r#"{{"choices":{},"usage":{{"prompt_tokens":5}}}}"#,
            deep("1")
        ),
        format!(
            r#"{{"usage":{{"prompt_tokens":5,"prompt_tokens_details":{}}}}}"#,
            deep("{}")
        ),
    ] {
        let mut tee = Tee::new("application/json");
        tee.feed(body.as_bytes());
        let prompt_only = Usage {
            prompt_tokens: Some(5),
            ..Usage::default()
        };
        assert_eq!(tee.usage(), prompt_only);
    }
    // A usage of forty thousand members, each an object, keeps the first 32 and reads on past
    // the rest; the counts among them are read.
    let members: Vec<String> = (0..40_000)
        .map(|i| format!(r#""k{i}":{{"n":{i}}}"#))
        .collect();
    let body = format!(
        r#"{{"usage":{{"prompt_tokens":70,"completion_tokens":2,{}}},"timings":{{"cache_n":53}}}}"#,
        members.join(",")
    );
    assert!(body.len() < MAX_BODY, "read whole, not at its ends");
    let mut tee = Tee::new("application/json");
    tee.feed(body.as_bytes());
    assert_eq!(tee.usage(), usage(70, 53, 2));
}
