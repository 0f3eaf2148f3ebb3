//! Fingerprints of the APIs besides Chat Completions (issues 16 and 18): Anthropic Messages, OpenAI
//! Responses, completion-style turns and stateless requests.

use serde_json::json;

use super::*;

fn fp_as(api: Api, body: &serde_json::Value) -> String {
    peek_as(api, body.to_string().as_bytes(), None).fp
}

#[track_caller]
fn check_same(api: Api, a: &serde_json::Value, b: &serde_json::Value) {
    let (fa, fb) = (fp_as(api, a), fp_as(api, b));
    assert!(!fa.is_empty(), "no fingerprint for {a}");
    assert_eq!(fa, fb, "expected one conversation:\n  {a}\n  {b}");
}

#[track_caller]
fn check_differ(api: Api, a: &serde_json::Value, b: &serde_json::Value) {
    let (fa, fb) = (fp_as(api, a), fp_as(api, b));
    assert!(!fa.is_empty() && !fb.is_empty(), "missing fingerprint");
    assert_ne!(fa, fb, "expected two conversations:\n  {a}\n  {b}");
}

/// Claude Code's first turn: system blocks with a cache marker, a first user message of blocks.
fn claude(first: &str, later: usize) -> serde_json::Value {
    let mut messages = vec![json!({"role": "user", "content": [
        {"type": "text", "text": "<system-reminder>ctx</system-reminder>"},
        {"type": "text", "text": first, "cache_control": {"type": "ephemeral"}},
    ]})];
    for i in 0..later {
        messages.push(json!({"role": "assistant", "content": [{"type": "text", "text": format!("answer {i}")}]}));
        messages.push(json!({"role": "user", "content": format!("more {i}")}));
    }
    json!({"model": "claude-sonnet", "max_tokens": 64, "stream": true,
           "system": [{"type": "text", "text": "You are Claude Code."},
                      {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
           "messages": messages,
           "metadata": {"user_id": "user_ab12_account_0000_session_1111"}})
}

#[test]
fn messages_turns_share_a_fingerprint_whatever_the_cache_markers_do() {
    let turn1 = claude("fix the bug", 0);
    let mut turn3 = claude("fix the bug", 2);
    // Claude Code moves its cache markers to the newest turn.
    turn3["system"][1]
        .as_object_mut()
        .unwrap()
        .remove("cache_control");
    turn3["messages"][0]["content"][1]
        .as_object_mut()
        .unwrap()
        .remove("cache_control");
    turn3["messages"][4]["content"] =
        json!([{"type": "text", "text": "more 1", "cache_control": {"type": "ephemeral"}}]);
    check_same(Api::Messages, &turn1, &turn3);
    check_differ(Api::Messages, &turn1, &claude("write the docs", 0));
    // The system prompt is part of the conversation; so is the model.
    let mut other_system = turn1.clone();
    other_system["system"] = json!("You are someone else.");
    check_differ(Api::Messages, &turn1, &other_system);
    let mut other_model = turn1.clone();
    other_model["model"] = json!("claude-haiku");
    check_differ(Api::Messages, &turn1, &other_model);
}

#[test]
fn messages_string_content_is_one_text_block() {
    let blocks = json!({"model": "m", "system": [{"type": "text", "text": "S"}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]});
    let strings = json!({"model": "m", "system": "S",
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]});
    check_same(Api::Messages, &blocks, &strings);
}

#[test]
fn the_session_in_claude_codes_metadata_is_not_a_key() {
    let mut other_session = claude("fix the bug", 0);
    other_session["metadata"]["user_id"] = json!("user_ab12_account_0000_session_2222");
    check_same(Api::Messages, &claude("fix the bug", 0), &other_session);
    // Explicit keys still win.
    let keyed = peek_as(
        Api::Messages,
        claude("x", 0).to_string().as_bytes(),
        Some("s1"),
    );
    assert_eq!(keyed.fp, peek(b"{}", Some("s1")).fp);
}

fn codex(input: serde_json::Value) -> serde_json::Value {
    json!({"model": "gpt-5-codex", "instructions": "You are Codex.", "input": input,
           "max_output_tokens": 32, "stream": true})
}

#[test]
fn responses_turns_share_a_fingerprint_and_a_string_input_is_one_input_text() {
    let turn1 = codex(json!("list the files"));
    let turn2 = codex(json!([
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list the files"}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "a b c", "annotations": []}]},
        {"role": "user", "content": "and the dirs?"},
    ]));
    let turn3_easy = codex(json!([
        {"role": "user", "content": "list the files"},
        {"role": "assistant", "content": "a b c"},
        {"role": "user", "content": "and the dirs?"},
        {"role": "assistant", "content": "d"},
        {"role": "user", "content": [{"type": "input_text", "text": "thanks", "cache_control": {}}]},
    ]));
    check_same(Api::Responses, &turn1, &turn2);
    check_same(Api::Responses, &turn1, &turn3_easy);
    check_differ(Api::Responses, &turn1, &codex(json!("read the docs")));
    let mut other = turn1.clone();
    other["instructions"] = json!("You are someone else.");
    check_differ(Api::Responses, &turn1, &other);
    // prompt_cache_key (which Codex sends) wins, as for chat.
    let mut keyed = turn1.clone();
    keyed["prompt_cache_key"] = json!("conv-9");
    assert_eq!(
        fp_as(Api::Responses, &keyed),
        peek(br#"{"prompt_cache_key":"conv-9"}"#, None).fp
    );
}

#[test]
fn the_endpoint_is_part_of_the_key() {
    // One body, read by three APIs: three conversations.
    let body =
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "input": "hi"});
    let fps: Vec<String> = [Api::Chat, Api::Messages, Api::Responses]
        .iter()
        .map(|a| fp_as(*a, &body))
        .collect();
    assert!(fps.iter().all(|f| f.len() == 16), "{fps:?}");
    assert!(
        fps[0] != fps[1] && fps[1] != fps[2] && fps[0] != fps[2],
        "{fps:?}"
    );
}

#[test]
fn stateless_requests_have_no_fingerprint_even_with_a_key() {
    for path in [
        "/v1/embeddings",
        "/embedding",
        "/embeddings",
        "/rerank",
        "/v1/rerank",
        "/v1/reranking",
    ] {
        let api = Api::of(path);
        assert_eq!(api, Api::Stateless, "{path}");
        let body = json!({"model": "m", "input": "chunk 1", "query": "q", "documents": ["a"],
                          "prompt_cache_key": "k"});
        assert_eq!(
            peek_as(api, body.to_string().as_bytes(), Some("s")).fp,
            "",
            "{path}"
        );
    }
}

/// A completion-style conversation as a client renders it in a chat template, `turns` turns long.
fn rendered(template: (&str, &str, &str), first: &str, turns: usize) -> serde_json::Value {
    let (user, assistant, end) = template;
    let mut prompt = format!("{user}You are terse.\n{first}{end}{assistant}");
    for i in 1..turns {
        prompt.push_str(&format!(
            " answer {i}{end}{user}question {i}{end}{assistant}"
        ));
    }
    json!({"prompt": prompt, "n_predict": 8, "cache_prompt": true})
}

#[test]
fn a_short_completion_style_conversation_keeps_its_fingerprint_for_five_turns() {
    // Issue 18: under the seed's rule each turn of a short prompt was a new conversation.
    let templates = [
        (
            "<|im_start|>user\n",
            "<|im_start|>assistant\n",
            "<|im_end|>\n",
        ),
        (
            "<|start_header_id|>user<|end_header_id|>\n\n",
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
            "<|eot_id|>",
        ),
        ("[INST] ", "", " [/INST]"),
        ("User: ", "\nAssistant:", "\n"),
    ];
    for t in templates {
        let turn1 = rendered(t, "Name a prime.", 1);
        for n in 2..=5 {
            check_same(Api::Completion, &turn1, &rendered(t, "Name a prime.", n));
        }
        check_differ(Api::Completion, &turn1, &rendered(t, "Name a colour.", 1));
        // Turn 1 is exactly the seed's fingerprint: leases made before the rule keep their keys.
        assert_eq!(
            fp_as(Api::Completion, &turn1),
            fp_as(Api::Chat, &turn1),
            "{t:?}"
        );
    }
}

#[test]
fn completion_prompts_without_a_turn_marker_keep_the_seeds_rule() {
    let plain = json!({"prompt": "Once upon a time", "n_predict": 16});
    assert_eq!(fp_as(Api::Completion, &plain), fp_as(Api::Chat, &plain));
    let long = "x".repeat(PROMPT_PREFIX);
    check_same(
        Api::Completion,
        &json!({"prompt": format!("{long} one")}),
        &json!({"prompt": format!("{long} two")}),
    );
    // A marker that starts past the first 4096 bytes does not count.
    let late = format!("{long}\nAssistant: hi");
    check_same(
        Api::Completion,
        &json!({"prompt": late}),
        &json!({"prompt": format!("{long} zzz")}),
    );
    // One that starts inside but ends past the window does, and cuts after itself.
    let across = format!("{}\nAssistant:", "y".repeat(PROMPT_PREFIX - 3));
    check_same(
        Api::Completion,
        &json!({"prompt": format!("{across} turn one")}),
        &json!({"prompt": format!("{across} turn two")}),
    );
    check_differ(
        Api::Completion,
        &json!({"prompt": format!("{across} turn one")}),
        &json!({"prompt": format!("{}", "y".repeat(PROMPT_PREFIX + 12))}),
    );
    // Token lists and FIM keep theirs too.
    let tokens = json!({"prompt": [1, 2, 3]});
    assert_eq!(fp_as(Api::Completion, &tokens), fp_as(Api::Chat, &tokens));
    let fim = json!({"input_prefix": "fn main() {", "input_suffix": "}"});
    assert_eq!(fp_as(Api::Completion, &fim), fp_as(Api::Chat, &fim));
}

#[test]
fn api_bodies_without_a_conversation_have_no_fingerprint() {
    for (api, body) in [
        (Api::Messages, json!({"model": "m"})),
        (Api::Messages, json!({"model": "m", "messages": []})),
        (Api::Responses, json!({"model": "m"})),
        (Api::Responses, json!({"model": "m", "input": []})),
        (Api::Responses, json!({"model": "m", "input": 7})),
    ] {
        assert_eq!(fp_as(api, &body), "", "{api:?} {body}");
    }
    assert_eq!(peek_as(Api::Responses, b"not json", None).fp, "");
}

/// The contract with every lease made by these APIs: see `golden_fingerprints_never_change`.
#[test]
fn golden_api_fingerprints_never_change() {
    let cases = [
        (Api::Messages, claude("fix the bug", 0), "e201f39a8136e6c2"),
        (
            Api::Responses,
            codex(json!("list the files")),
            "b0fd7a29e32fbd3e",
        ),
        (
            Api::Completion,
            rendered(("User: ", "\nAssistant:", "\n"), "Name a prime.", 3),
            "e4b69c6defd88805",
        ),
    ];
    for (api, body, want) in cases {
        assert_eq!(fp_as(api, &body), want, "{api:?} {body}");
    }
}

/// A stranger's bodies: odd types where the APIs expect text, blocks or items. Never a panic; the
/// same bytes always give the same answer; a conversation still needs its user turn to be read.
#[test]
fn hostile_api_bodies_are_read_without_surprises() {
    let odd = [
        json!({"model": 7, "system": 42, "messages": [{"role": "user", "content": {"x": 1}}]}),
        json!({"system": [null, 1, "s", {"cache_control": 1}], "messages": [7, null, {"role": "user"}]}),
        json!({"messages": [{"role": ["user"], "content": "a"}, {"role": "user", "content": [[], {}]}]}),
        json!({"instructions": {"a": 1}, "input": [1, null, "x", {"type": "message", "role": "user", "content": 9}]}),
        json!({"input": {"role": "user"}, "messages": "nope", "system": null}),
    ];
    for body in &odd {
        for api in [Api::Messages, Api::Responses, Api::Completion, Api::Chat] {
            let (a, b) = (fp_as(api, body), fp_as(api, body));
            assert_eq!(a, b, "{api:?} {body}");
            assert!(a.is_empty() || a.len() == 16, "{api:?} {body}: {a}");
        }
    }
    // A Responses input of a thousand items before the first user item is read up to it, no further.
    let mut items: Vec<serde_json::Value> = (0..1000)
        .map(|i| json!({"type": "reasoning", "id": i}))
        .collect();
    items.push(json!({"role": "user", "content": "go"}));
    let tail: Vec<serde_json::Value> = (0..10_000)
        .map(|i| json!({"role": "assistant", "content": i}))
        .collect();
    let mut long = items.clone();
    long.extend(tail);
    check_same(Api::Responses, &codex(json!(items)), &codex(json!(long)));
    // cache_control on a tool result or an image is ignored too.
    let marked = json!({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": "ok", "cache_control": {"type": "ephemeral"}}]}]});
    let plain = json!({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}]});
    check_same(Api::Messages, &marked, &plain);
}
