//! Issues 16 and 18: every API the agents speak is sticky and streamed intact — Anthropic Messages,
//! OpenAI Responses and Chat Completions, three turns each on one host with a warm cache and tokens
//! in the row — and stateless requests (embeddings, rerank) take no lease, while count endpoints
//! answer at once and a completion-style conversation stays on its host.

use serde_json::{json, Value};

use crossbar::sim::Fault;

use crate::broken::{read_broken_chunked, short_timeout};
use crate::support::{chat, hold_slot, host, wait_until, Harness};

/// A Claude Code-like body: system blocks, then `turns` more exchanges after the first question;
/// the cache marker moves to the newest turn, as Claude Code moves it.
pub fn messages(first: &str, turns: usize, stream: bool) -> Value {
    let marker = json!({"type": "ephemeral"});
    let mut msgs = vec![json!({"role": "user", "content": [{"type": "text", "text": first}]})];
    for i in 0..turns {
        msgs.push(
            json!({"role": "assistant", "content": format!("answer number {i} with some words")}),
        );
        msgs.push(json!({"role": "user", "content": [{"type": "text", "text": format!("follow-up {i}")}]}));
    }
    let last = msgs.len() - 1;
    msgs[last]["content"][0]["cache_control"] = marker.clone();
    json!({"model": "m", "max_tokens": 4, "stream": stream,
           "system": [{"type": "text", "text": "You are a careful coding assistant.", "cache_control": marker}],
           "messages": msgs})
}

/// A Codex-like body: a plain-string `input` on turn 1, the whole history as items afterwards.
pub fn responses(first: &str, turns: usize, stream: bool) -> Value {
    let input = if turns == 0 {
        json!(first)
    } else {
        let mut items = vec![json!({"type": "message", "role": "user",
                                    "content": [{"type": "input_text", "text": first}]})];
        for i in 0..turns {
            items.push(json!({"type": "message", "role": "assistant",
                              "content": [{"type": "output_text", "text": format!("answer number {i} with some words")}]}));
            items.push(json!({"role": "user", "content": format!("follow-up {i}")}));
        }
        Value::Array(items)
    };
    json!({"model": "m", "instructions": "You are a careful coding assistant.", "input": input,
           "max_output_tokens": 4, "stream": stream})
}

/// Three turns of one conversation in `api` over two hosts: one host, a new then reused lease, a
/// warm cache from turn 2, tokens in every row, and every stream ending with its own last event.
#[track_caller]
fn three_turns(api: &str, path: &str, body: fn(&str, usize, bool) -> Value, end: &str) {
    for stream in [true, false] {
        let h = Harness::start(vec![host("titan", 2), host("mini", 2)], "");
        let mut hosts = Vec::new();
        for turn in 0..3 {
            let answer = h.post(path, &body(&format!("the {api} story"), turn, stream));
            assert_eq!(answer.status, 200, "{api} turn {turn}: {}", answer.text());
            let lease = if turn == 0 { "new" } else { "reused" };
            assert_eq!(
                answer.header("X-Crossbar-Lease"),
                Some(lease),
                "{api} turn {turn}"
            );
            hosts.push(answer.header("X-Crossbar-Host").unwrap().to_string());
            if stream {
                assert!(answer.text().ends_with(end), "{api}: {}", answer.text());
                assert!(!answer.text().contains("crossbar"), "{}", answer.text());
            } else {
                assert!(answer.json()["usage"].is_object(), "{}", answer.text());
            }
        }
        assert!(hosts.iter().all(|h| *h == hosts[0]), "{api}: {hosts:?}");
        let rows = h.rows();
        assert_eq!(rows.len(), 3, "{api}");
        for (turn, row) in rows.iter().enumerate() {
            assert_eq!((row.api.as_str(), row.streamed), (api, stream), "{row:?}");
            assert!(row.err.is_empty(), "{row:?}");
            assert_eq!(row.fp, rows[0].fp, "{row:?}");
            let (prompt, cached) = (row.prompt_tokens.unwrap(), row.cached_tokens.unwrap());
            assert!(prompt > cached, "{row:?}");
            assert_eq!(row.completion_tokens, Some(4), "{row:?}");
            if turn == 0 {
                assert_eq!(cached, 0, "a cold host caches nothing: {row:?}");
            } else {
                assert!(cached > 0, "turn {turn} of {api} found no cache: {row:?}");
            }
        }
        assert_eq!(h.server().gateway().leases.snapshot().len(), 1, "{api}");
    }
}

#[test]
fn an_anthropic_messages_conversation_is_sticky_and_its_streams_end_clean() {
    let end = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    three_turns("messages", "/projA/v1/messages", messages, end);
}

#[test]
fn an_openai_responses_conversation_is_sticky_and_its_streams_end_clean() {
    three_turns("responses", "/projA/v1/responses", responses, "\n\n");
    // The last event of a Responses stream is response.completed.
    let h = Harness::start(vec![host("titan", 1)], "");
    let text = h
        .post("/projA/v1/responses", &responses("x", 0, true))
        .text();
    let last = text.trim_end().rsplit("\n\n").next().unwrap().to_string();
    assert!(last.starts_with("event: response.completed\n"), "{last}");
}

#[test]
fn a_chat_completions_conversation_is_sticky_and_its_streams_end_clean() {
    three_turns(
        "chat",
        "/projA/v1/chat/completions",
        chat,
        "data: [DONE]\n\n",
    );
}

#[test]
fn a_messages_stream_that_breaks_off_still_ends_visibly_broken() {
    let h = Harness::start(vec![host("titan", 1)], "");
    h.sim("titan")
        .set_fault(Fault::CutMidChunk { after_events: 3 });
    let mut conn = h.open_chat("/projA/v1/messages", &messages("fragile", 0, true));
    short_timeout(&conn);
    assert_eq!(conn.read_head().0, 200);
    let got = read_broken_chunked(&mut conn);
    assert!(
        got.contains("event: content_block_delta") && !got.contains("message_stop"),
        "{got}"
    );
    wait_until("the row is written", || !h.rows().is_empty());
    let row = &h.rows()[0];
    assert!(row.err.starts_with("upstream failed mid-body"), "{row:?}");
    assert_eq!(
        (row.prompt_tokens.is_some(), row.api.as_str()),
        (true, "messages")
    );
}

/// Issue 16: a Responses stream that stops before `response.completed` is the client's broken
/// answer and an `upstream failed mid-body` row, as for the other APIs.
#[test]
fn a_responses_stream_that_breaks_off_still_ends_visibly_broken() {
    let h = Harness::start(vec![host("titan", 1)], "");
    h.sim("titan")
        .set_fault(Fault::CutMidChunk { after_events: 3 });
    let mut conn = h.open_chat("/projA/v1/responses", &responses("fragile", 0, true));
    short_timeout(&conn);
    assert_eq!(conn.read_head().0, 200);
    let got = read_broken_chunked(&mut conn);
    assert!(
        got.contains("event: response.") && !got.contains("response.completed"),
        "{got}"
    );
    wait_until("the row is written", || !h.rows().is_empty());
    let row = &h.rows()[0];
    assert!(row.err.starts_with("upstream failed mid-body"), "{row:?}");
    assert_eq!(row.api, "responses");
}

/// Issue 18: twenty distinct embeddings made twenty leases.
#[test]
fn stateless_requests_make_no_lease_and_spread_over_the_hosts() {
    let h = Harness::start(vec![host("titan", 2), host("mini", 2)], "");
    let gw = h.server().gateway().clone();
    for i in 0..10 {
        let path = [
            "/projA/v1/embeddings",
            "/projA/v1/rerank",
            "/projA/embedding",
            "/projA/reranking",
        ][i % 4];
        let body = json!({"model": "m", "input": format!("chunk {i}"), "content": format!("chunk {i}"),
                          "query": "which?", "documents": [format!("doc {i}"), "other"]});
        let answer = h.post(path, &body);
        assert_eq!(answer.status, 200, "{path}: {}", answer.text());
        assert_eq!(answer.header("X-Crossbar-Lease"), Some("none"));
    }
    assert!(
        gw.leases.snapshot().is_empty(),
        "{:?}",
        gw.leases.snapshot()
    );
    assert!(h.db().list_leases().unwrap().is_empty());
    let rows = h.rows();
    assert!(
        rows.iter()
            .all(|r| r.api == "stateless" && r.fp.is_empty() && r.status == 200),
        "{rows:?}"
    );
    assert!(rows.iter().all(|r| r.prompt_tokens.is_some()), "{rows:?}");
    // Held in flight, four requests fill both hosts' slots: the chooser spreads them.
    for sim in ["titan", "mini"] {
        h.sim(sim).set_lockstep(true);
    }
    let addr = h.addr();
    let clients: Vec<_> = (0..4)
        .map(|i| {
            std::thread::spawn(move || {
                let body = json!({"model": "m", "input": format!("held {i}")});
                crate::support::request(
                    addr,
                    "POST",
                    "/projA/v1/embeddings",
                    &[],
                    body.to_string().as_bytes(),
                )
            })
        })
        .collect();
    wait_until("four in flight", || {
        gw.limiter.in_flight("titan", "m") + gw.limiter.in_flight("mini", "m") == 4
    });
    assert_eq!(
        (
            gw.limiter.in_flight("titan", "m"),
            gw.limiter.in_flight("mini", "m")
        ),
        (2, 2)
    );
    assert!(gw.leases.snapshot().is_empty());
    for sim in ["titan", "mini"] {
        h.sim(sim).set_lockstep(false);
    }
    for c in clients {
        assert_eq!(c.join().unwrap().status, 200);
    }
}

#[test]
fn a_count_request_answers_at_once_while_every_slot_is_busy() {
    let h = Harness::start(vec![host("titan", 1)], "queue_timeout = \"30s\"");
    let sim = h.sim("titan");
    let gw = h.server().gateway().clone();
    let mut busy = hold_slot(&h, "titan");
    for (path, body) in [
        (
            "/projA/v1/messages/count_tokens",
            messages("count me", 2, false),
        ),
        (
            "/projA/v1/responses/input_tokens",
            responses("count me", 2, false),
        ),
        (
            "/projA/v1/chat/completions/input_tokens",
            chat("count me", 2, false),
        ),
    ] {
        let answer = h.post(path, &body);
        assert_eq!(answer.status, 200, "{path}: {}", answer.text());
        assert!(
            answer.json()["input_tokens"].as_u64().unwrap() > 10,
            "{}",
            answer.text()
        );
        // Metadata: no slot (the only one is still the busy stream's), no conversation of its
        // own (it holds the route-level lease, fingerprint "").
        assert_eq!(gw.limiter.in_flight("titan", "m"), 1, "{path}");
    }
    let counts: Vec<_> = h.rows().into_iter().filter(|r| r.status == 200).collect();
    assert_eq!(counts.len(), 3, "{counts:?}");
    assert!(
        counts.iter().all(|r| r.fp.is_empty() && r.queued_ms == 0),
        "{counts:?}"
    );
    let apis: Vec<&str> = counts.iter().map(|r| r.api.as_str()).collect();
    assert_eq!(apis, ["messages", "responses", "chat"]);
    sim.set_lockstep(false);
    assert_eq!(busy.read_answer().status, 200);
}

/// Issue 18: the seed's rule gave each turn of a short completion-style prompt a new fingerprint.
#[test]
fn a_five_turn_completion_style_conversation_stays_on_one_host() {
    let h = Harness::start(vec![host("titan", 2), host("mini", 2)], "");
    let mut prompt = "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nName a prime.<|im_end|>\n<|im_start|>assistant\n".to_string();
    let mut hosts = Vec::new();
    for turn in 0..5 {
        let answer = h.post(
            "/projA/completion",
            &json!({"prompt": prompt, "n_predict": 4, "stream": turn % 2 == 0}),
        );
        assert_eq!(answer.status, 200, "{}", answer.text());
        let lease = if turn == 0 { "new" } else { "reused" };
        assert_eq!(
            answer.header("X-Crossbar-Lease"),
            Some(lease),
            "turn {turn}"
        );
        hosts.push(answer.header("X-Crossbar-Host").unwrap().to_string());
        // The client appends the answer (whatever it was) and the next question.
        prompt.push_str(&format!(" answer {turn}<|im_end|>\n<|im_start|>user\nAnd {turn}?<|im_end|>\n<|im_start|>assistant\n"));
    }
    assert!(hosts.iter().all(|h| *h == hosts[0]), "{hosts:?}");
    let rows = h.rows();
    assert!(
        rows.iter()
            .all(|r| r.api == "completion" && r.fp == rows[0].fp),
        "{rows:?}"
    );
    assert!(
        rows[1..].iter().all(|r| r.cached_tokens.unwrap() > 0),
        "{rows:?}"
    );
}

#[test]
fn metrics_the_status_page_and_report_rows_show_each_api() {
    let h = Harness::start(vec![host("titan", 2)], "");
    h.post("/projA/v1/messages", &messages("count me", 0, true));
    h.post("/projA/v1/messages", &messages("count me", 1, false));
    h.post("/projA/v1/responses", &responses("me too", 0, true));
    h.post("/projA/v1/embeddings", &json!({"input": "chunk"}));
    let admin = h.server().admin_addr();
    let metrics = crate::support::request(admin, "GET", "/metrics", &[], b"").text();
    for line in [
        "crossbar_api_requests_total{api=\"messages\"} 2",
        "crossbar_api_requests_total{api=\"responses\"} 1",
        "crossbar_api_requests_total{api=\"stateless\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    let rows = h.rows();
    let cached: i64 = rows
        .iter()
        .filter(|r| r.api == "messages")
        .filter_map(|r| r.cached_tokens)
        .sum();
    assert!(cached > 0, "{rows:?}");
    let want = format!("crossbar_api_tokens_total{{api=\"messages\",kind=\"cached\"}} {cached}");
    assert!(metrics.contains(&want), "{want} in\n{metrics}");
    let page = crate::support::request(admin, "GET", "/", &[], b"").text();
    assert!(
        page.contains("<h2>APIs</h2>") && page.contains("<td>responses</td>"),
        "{page}"
    );
}

/// Issue 18 (review): an embeddings answer over the tee's 1 MiB bound lost its token counts.
#[test]
fn a_batch_of_embeddings_over_a_mebibyte_keeps_its_prompt_tokens_in_the_row_issue_18() {
    let h = Harness::start(vec![host("titan", 2)], "");
    let one = h.post("/projA/v1/embeddings", &json!({"input": ["chunk"]}));
    assert_eq!(one.status, 200, "{}", one.text());
    let each = h
        .rows()
        .pop()
        .unwrap()
        .prompt_tokens
        .expect("a small batch is counted");
    let batch = vec!["chunk"; 20_000];
    let answer = h.post("/projA/v1/embeddings", &json!({ "input": batch }));
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert!(answer.body.len() > 2 << 20, "{}", answer.body.len());
    let row = h.rows().pop().unwrap();
    assert_eq!(row.prompt_tokens, Some(20_000 * each), "{row:?}");
}
