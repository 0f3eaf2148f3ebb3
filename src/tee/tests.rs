//! The SSE scanner's stories; `json.rs` holds the other modes.

use super::*;

mod apis;
mod json;

/// Everything a tee reports, to compare runs.
#[derive(Debug, PartialEq)]
struct Outcome {
    usage: Usage,
    finished: bool,
    error: Option<String>,
    overflowed: bool,
}

fn outcome(tee: &Tee) -> Outcome {
    Outcome {
        usage: tee.usage(),
        finished: tee.finished(),
        error: tee.upstream_error(),
        overflowed: tee.overflowed(),
    }
}

fn sse() -> Tee {
    Tee::new("text/event-stream")
}

/// An SSE tee whose line limit is `max` bytes, so overflow stories stay small.
fn small_sse(max: usize) -> Tee {
    Tee {
        mode: Mode::Sse(Sse::new(max, Api::Chat)),
    }
}

fn run<'a>(make: &dyn Fn() -> Tee, chunks: impl IntoIterator<Item = &'a [u8]>) -> Outcome {
    let mut tee = make();
    for c in chunks {
        tee.feed(c);
    }
    outcome(&tee)
}

/// Feeds `stream` whole, split in two at every index, byte by byte and in uneven small chunks;
/// every way must report the same. Returns that outcome.
#[track_caller]
fn check_every_split(make: &dyn Fn() -> Tee, stream: &[u8]) -> Outcome {
    let whole = run(make, [stream]);
    for i in 0..=stream.len() {
        let (a, b) = stream.split_at(i);
        assert_eq!(run(make, [a, b]), whole, "split at byte {i}");
    }
    assert_eq!(run(make, stream.chunks(1)), whole, "byte by byte");
    let mut uneven = Vec::new();
    let (mut at, mut size) = (0, 1);
    while at < stream.len() {
        let end = (at + size).min(stream.len());
        uneven.push(&stream[at..end]);
        (at, size) = (end, size % 7 + 1);
    }
    assert_eq!(run(make, uneven), whole, "uneven chunks");
    whole
}

fn crlf(s: &str) -> String {
    s.replace('\n', "\r\n")
}

fn usage(prompt: i64, cached: i64, completion: i64) -> Usage {
    Usage {
        prompt_tokens: Some(prompt),
        cached_tokens: Some(cached),
        completion_tokens: Some(completion),
    }
}

/// Streamed chat as b11434 sends it without `include_usage`: role event, tokens, a keep-alive,
/// a stop string (so `timings` twice), the finish event, `[DONE]`. The token " stop" must not
/// confuse anything.
const CHAT_STREAM: &str = concat!(
    r#"data: {"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],"created":1,"id":"chatcmpl-1","model":"m","object":"chat.completion.chunk"}"#,
    "\n\n",
    r#"data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"Seven"}}],"created":1,"id":"chatcmpl-1","model":"m","object":"chat.completion.chunk"}"#,
    "\n\n",
    ":\n\n",
    r#"data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":" stop"}}],"created":1,"id":"chatcmpl-1","model":"m","object":"chat.completion.chunk"}"#,
    "\n\n",
    r#"data: {"choices":[{"finish_reason":null,"index":0,"delta":{}}],"created":1,"id":"chatcmpl-1","model":"m","object":"chat.completion.chunk","timings":{"cache_n":40,"prompt_n":30,"prompt_ms":12.5,"predicted_n":5,"predicted_ms":40.1}}"#,
    "\n\n",
    r#"data: {"choices":[{"finish_reason":"stop","index":0,"delta":{}}],"created":1,"id":"chatcmpl-1","model":"m","object":"chat.completion.chunk","timings":{"cache_n":53,"prompt_n":17,"prompt_ms":10.0,"prompt_per_token_ms":0.6,"prompt_per_second":1700.0,"predicted_n":6,"predicted_ms":48.0,"predicted_per_token_ms":8.0,"predicted_per_second":125.0}}"#,
    "\n\n",
    "data: [DONE]\n\n",
);

#[test]
fn a_streamed_chat_reports_the_last_timings_at_every_split() {
    let got = check_every_split(&sse, CHAT_STREAM.as_bytes());
    let want = Outcome {
        usage: usage(70, 53, 6),
        finished: true,
        error: None,
        overflowed: false,
    };
    assert_eq!(got, want);
    assert_eq!(
        check_every_split(&sse, crlf(CHAT_STREAM).as_bytes()),
        want,
        "\\r\\n lines"
    );
}

#[test]
fn include_usage_puts_usage_and_timings_on_their_own_chunk() {
    let stream = concat!(
        r#"data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"Hi"}}],"object":"chat.completion.chunk"}"#,
        "\n\n",
        r#"data: {"choices":[{"finish_reason":"length","index":0,"delta":{}}],"object":"chat.completion.chunk"}"#,
        "\n\n",
        r#"data: {"choices":[],"object":"chat.completion.chunk","usage":{"completion_tokens":8,"prompt_tokens":70,"total_tokens":78,"prompt_tokens_details":{"cached_tokens":69}},"timings":{"cache_n":69,"prompt_n":1,"predicted_n":8}}"#,
        "\n\n",
        "data: [DONE]\n\n",
    );
    let got = check_every_split(&sse, stream.as_bytes());
    assert_eq!((got.usage, got.finished), (usage(70, 69, 8), true));
}

#[test]
fn usage_and_timings_on_different_events_each_count() {
    // usage first (without details), timings later: prompt and completion from usage, cached from
    // timings; an event without either changes nothing.
    let stream = concat!(
        "data: {\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":9}}\n\n",
        "data: {\"timings\":{\"cache_n\":64,\"prompt_n\":36,\"predicted_n\":99}}\n\n",
        "data: {\"choices\":[],\"error\":null,\"usage\":null}\n\n",
    );
    let got = check_every_split(&sse, stream.as_bytes());
    assert_eq!((got.usage, got.finished), (usage(100, 64, 9), false));
}

#[test]
fn a_streamed_completion_with_both_usage_and_timings_prefers_usage() {
    // Deliberately inconsistent numbers, to see which source wins.
    let stream = concat!(
        r#"data: {"choices":[{"text":"x","index":0,"finish_reason":null}],"object":"text_completion"}"#,
        "\n\n",
        r#"data: {"choices":[{"text":"","index":0,"finish_reason":"stop"}],"object":"text_completion","usage":{"completion_tokens":3,"prompt_tokens":20,"total_tokens":23,"prompt_tokens_details":{"cached_tokens":7}},"timings":{"cache_n":8,"prompt_n":99,"predicted_n":4}}"#,
        "\n\n",
        "data: [DONE]\n\n",
    );
    assert_eq!(
        check_every_split(&sse, stream.as_bytes()).usage,
        usage(20, 8, 3)
    );
}

#[test]
fn native_completion_finishes_on_stop_true_without_done() {
    let stream = concat!(
        r#"data: {"index":0,"content":"Once","tokens":[],"stop":false,"id_slot":-1,"tokens_predicted":1,"tokens_evaluated":12}"#,
        "\n\n",
        r#"data: {"index":0,"content":" upon","tokens":[],"stop":false,"id_slot":-1,"tokens_predicted":2,"tokens_evaluated":12}"#,
        "\n\n",
        r#"data: {"index":0,"content":"","tokens":[],"id_slot":0,"stop":true,"model":"m","tokens_predicted":8,"tokens_evaluated":12,"generation_settings":{"n_predict":8,"stop":[]},"prompt":"Once upon a time","has_new_line":false,"truncated":false,"stop_type":"limit","stopping_word":"","tokens_cached":19,"timings":{"cache_n":11,"prompt_n":1,"predicted_n":8}}"#,
        "\n\n",
    );
    let mut before_last = sse();
    before_last.feed(
        stream
            .rsplit_once("data: ")
            .map(|(a, _)| a)
            .unwrap_or("")
            .as_bytes(),
    );
    assert!(!before_last.finished(), "stop:false chunks do not finish");
    let got = check_every_split(&sse, stream.as_bytes());
    assert_eq!((got.usage, got.finished), (usage(12, 11, 8), true));
}

#[test]
fn older_builds_without_usage_or_cache_n_give_what_they_can() {
    let timings_only = "data: {\"stop\":true,\"timings\":{\"prompt_n\":30,\"predicted_n\":4}}\n\n";
    let got = check_every_split(&sse, timings_only.as_bytes()).usage;
    let want = Usage {
        prompt_tokens: Some(30),
        cached_tokens: None,
        completion_tokens: Some(4),
    };
    assert_eq!(got, want);
    let native_only = "data: {\"stop\":true,\"tokens_evaluated\":15,\"tokens_predicted\":2}\n\n";
    let got = check_every_split(&sse, native_only.as_bytes()).usage;
    let want = Usage {
        prompt_tokens: Some(15),
        cached_tokens: None,
        completion_tokens: Some(2),
    };
    assert_eq!(got, want);
    let nothing = "data: {\"stop\":true,\"content\":\"\"}\n\ndata: {\"usage\":{}}\n\n";
    let got = check_every_split(&sse, nothing.as_bytes());
    assert_eq!((got.usage, got.finished), (Usage::default(), true));
}

#[test]
fn a_mid_stream_error_is_reported_and_does_not_finish() {
    let stream = concat!(
        r#"data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"Hi"}}]}"#,
        "\n\n",
        r#"data: {"error":{"code":500,"message":"Context size has been exceeded.","type":"server_error"}}"#,
        "\n\n",
    );
    let got = check_every_split(&sse, crlf(stream).as_bytes());
    assert_eq!(
        got.error.as_deref(),
        Some("Context size has been exceeded.")
    );
    assert!(!got.finished);
    // Older builds send it as an `error:` field carrying the error object itself.
    let old = "data: {\"content\":\"a\",\"stop\":false}\n\nerror: {\"code\":400,\"message\":\"too long\",\"type\":\"invalid_request_error\"}\n\n";
    let got = check_every_split(&sse, old.as_bytes());
    assert_eq!(
        (got.error.as_deref(), got.finished),
        (Some("too long"), false)
    );
    // The first error is the cause; what follows is fallout.
    let two = "data: {\"error\":{\"message\":\"first\"}}\n\ndata: {\"error\":\"second\"}\n\n";
    assert_eq!(
        check_every_split(&sse, two.as_bytes()).error.as_deref(),
        Some("first")
    );
}

#[test]
fn comments_other_fields_and_spacing_variants_are_handled() {
    let stream = concat!(
        ": this is a comment\n",
        "event: message\nid: 7\nretry: 1000\n",
        "data:{\"timings\":{\"cache_n\":1,\"prompt_n\":2,\"predicted_n\":3}}\n\n",
        "\n\n:\n\n",
        "data:  [DONE] \n\n",
    );
    let got = check_every_split(&sse, stream.as_bytes());
    assert_eq!((got.usage, got.finished), (usage(3, 1, 3), true));
}

#[test]
fn an_event_of_several_data_lines_is_joined_and_read_at_its_end() {
    let stream =
        "data: {\"choices\":[],\ndata: \"usage\":{\"prompt_tokens\":5,\n\ndata: [DONE]\n\n";
    let got = check_every_split(&sse, stream.as_bytes());
    assert_eq!(
        (got.usage.prompt_tokens, got.finished),
        (None, true),
        "incomplete JSON ignored"
    );
    let stream = "data: {\"choices\":[],\ndata: \"usage\":{\"prompt_tokens\":5,\ndata: \"completion_tokens\":1}}\n\n";
    let got = check_every_split(&sse, crlf(stream).as_bytes());
    assert_eq!(got.usage.prompt_tokens, Some(5));
    assert_eq!(got.usage.completion_tokens, Some(1));
}

#[test]
fn garbage_is_ignored_and_earlier_counts_survive_it() {
    let stream = concat!(
        "data: {\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":2}}\n\n",
        "data: {\"usage\": oops}\n\n",
        "data: [\"usage\", {\"prompt_tokens\": 99}]\n\n",
        "data: {\"usage\":7,\"timings\":\"soon\"}\n\n",
        "data: \u{1}\u{2}\"usage\"\u{3}\n\n",
        "what: {\"usage\":{\"prompt_tokens\":3}}\n\n",
        "data: {\"timings\":{\"cache_n\":-1,\"prompt_n\":1.5,\"predicted_n\":\"4\"}}\n\n",
    );
    let got = check_every_split(&sse, stream.as_bytes());
    // The last well-formed timings has no usable number: cached falls back to (absent) usage.
    let want = Usage {
        prompt_tokens: Some(10),
        cached_tokens: None,
        completion_tokens: Some(2),
    };
    assert_eq!((got.usage, got.finished, got.error), (want, false, None));
}

#[test]
fn a_key_given_twice_reads_as_its_last_one_as_everywhere_else() {
    // A body's fields and a `usage` object's members already read so; the payload's own keys
    // did not (a derived reader refused the payload) until its one-pass reader (issue 26).
    let stream = concat!(
        "data: {\"usage\":{\"prompt_tokens\":1},\"usage\":{\"prompt_tokens\":2}}\n\n",
        "data: {\"timings\":{\"cache_n\":3,\"cache_n\":4}}\n\n",
    );
    let got = check_every_split(&sse, stream.as_bytes());
    assert_eq!(
        (got.usage.prompt_tokens, got.usage.cached_tokens),
        (Some(2), Some(4))
    );
}

#[test]
fn data_without_a_quoted_key_is_not_parsed() {
    // The prefilter: native counters alone, with no "stop"/"usage"/"timings" key, are skipped.
    let got = check_every_split(
        &sse,
        b"data: {\"tokens_evaluated\":5,\"tokens_predicted\":3}\n\n",
    );
    assert_eq!(got.usage, Usage::default());
    assert!(!mentions_key(
        br#"{"content":"usage stop \"error\" timings"}"#
    ));
    assert!(mentions_key(br#"{"a":1, "timings" :{}}"#));
}

#[test]
fn lines_over_the_limit_are_dropped_with_their_event_not_buffered() {
    let make = || small_sse(64);
    let long_usage = format!(
        "data: {{\"usage\":{{\"prompt_tokens\":999}},\"pad\":\"{}\"}}",
        "x".repeat(60)
    );
    let stream = format!(
        "{long_usage}\n\n: {}\n\ndata: {{\"timings\":{{\"cache_n\":1,\"prompt_n\":2,\"predicted_n\":3}}}}\n\ndata: [DONE]\n\n",
        "c".repeat(100)
    );
    let got = check_every_split(&make, stream.as_bytes());
    let want = Outcome {
        usage: usage(3, 1, 3),
        finished: true,
        error: None,
        overflowed: true,
    };
    assert_eq!(got, want);
    // A line of exactly the limit is kept.
    let exact = format!(
        "data: {{\"stop\":true,\"pad\":\"{}\"}}",
        "y".repeat(64 - 28)
    );
    assert_eq!(exact.len(), 64);
    let got = check_every_split(&make, format!("{exact}\n\n").as_bytes());
    assert_eq!((got.finished, got.overflowed), (true, false));
    // An event whose joined data lines outgrow the limit is dropped too (each line fits).
    let event = format!(
        "data: {{\"stop\":true,\ndata: \"pad\":\"{}\"}}\n\n",
        "z".repeat(50)
    );
    let got = check_every_split(&make, event.as_bytes());
    assert_eq!((got.finished, got.overflowed), (false, true));
    let got = check_every_split(&|| small_sse(128), event.as_bytes());
    assert_eq!((got.finished, got.overflowed), (true, false));
}

#[test]
fn a_real_size_overlong_line_is_skipped_without_growing() {
    let mut stream = b"data: {\"usage\":{\"prompt_tokens\":1},\"x\":\"".to_vec();
    stream.resize(MAX_LINE + 10, b'x');
    stream.extend_from_slice(b"\"}\n\ndata: {\"stop\":true,\"tokens_evaluated\":4}\n\n");
    let whole = run(&sse, [&stream[..]]);
    assert_eq!(whole.usage.prompt_tokens, Some(4));
    assert!(whole.finished && whole.overflowed);
    for i in [
        1,
        40,
        MAX_LINE - 1,
        MAX_LINE,
        MAX_LINE + 1,
        MAX_LINE + 9,
        stream.len() - 3,
    ] {
        let (a, b) = stream.split_at(i);
        assert_eq!(run(&sse, [a, b]), whole, "split at {i}");
    }
    assert_eq!(run(&sse, stream.chunks(8192)), whole);
    let mut tee = sse();
    tee.feed(&stream[..MAX_LINE + 5]);
    match &tee.mode {
        Mode::Sse(s) => assert!(s.line.is_empty() && s.skipping, "the long line is not kept"),
        _ => unreachable!(),
    }
}

#[test]
fn fields_are_read_one_by_one_whatever_the_spacing() {
    let mut seen = event::Learnt::new(Api::Completion);
    seen.absorb(
        br#"{ "content":"x", "stop" :  true , "tokens_evaluated" : 12 , "tokens_predicted":"3",
             "timings" : { "prompt_n" : 5 , "prompt_ms" : 12.5 , "cache_n" : 7 } }"#,
    );
    assert!(seen.stopped);
    assert_eq!(seen.prefill(), Some((5, 12_500)));
    let want = Usage {
        prompt_tokens: Some(12),
        cached_tokens: Some(7),
        completion_tokens: None,
    };
    assert_eq!(
        seen.usage(),
        want,
        "a mistyped count is unknown, its neighbours still read"
    );
    seen.absorb(br#"{"error": {"message": "boom"}, "message": "not a carrier"}"#);
    assert_eq!(seen.error.as_deref(), Some("boom"));
    let mut fresh = event::Learnt::new(Api::Completion);
    fresh.absorb(br#"{"stop": "true"}"#);
    assert!(!fresh.stopped, "a string is not true");
}

/// Issue 46: a stream the client leaves has no counts from the host; what it carried is counted
/// by its events (one per token in llama-server's streams, and its first and last), the same at
/// every split, `[DONE]`, comments and the lines of one event not counted twice.
#[test]
fn the_events_a_stream_carried_are_counted_at_every_split_issue_46() {
    let events = |chunks: &[&[u8]]| {
        let mut tee = sse();
        chunks.iter().for_each(|c| tee.feed(c));
        tee.events()
    };
    let stream = CHAT_STREAM.as_bytes();
    for i in 0..=stream.len() {
        let (a, b) = stream.split_at(i);
        assert_eq!(events(&[a, b]), 5, "split at byte {i}");
    }
    let cut = CHAT_STREAM.match_indices("\n\n").nth(1).unwrap().0 + 2;
    assert_eq!(events(&[&stream[..cut]]), 2, "two events before the cut");
    assert_eq!(
        events(&[b"data: {\"a\":\ndata: 1}\n\n:\n\ndata: [DONE]\n\n"]),
        1
    );
    assert_eq!(Tee::new("application/json").events(), 0);
}
