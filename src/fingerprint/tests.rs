use super::*;

fn fp(body: &str) -> String {
    peek(body.as_bytes(), None).fp
}

#[track_caller]
fn check_same(a: &str, b: &str) {
    let (fa, fb) = (fp(a), fp(b));
    assert!(!fa.is_empty(), "no fingerprint for {a}");
    assert_eq!(fa, fb, "expected one conversation:\n  {a}\n  {b}");
}

#[track_caller]
fn check_differ(a: &str, b: &str) {
    let (fa, fb) = (fp(a), fp(b));
    assert!(!fa.is_empty() && !fb.is_empty(), "missing fingerprint");
    assert_ne!(fa, fb, "expected two conversations:\n  {a}\n  {b}");
}

#[track_caller]
fn check_hex(fp: &str) {
    assert_eq!(fp.len(), 16, "{fp:?}");
    assert!(
        fp.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "{fp:?}"
    );
}

const TURN1: &str = r#"{"model":"qwen","messages":[
    {"role":"system","content":"You are terse."},
    {"role":"user","content":"Name a prime."}]}"#;

#[test]
fn later_turns_of_one_conversation_share_the_fingerprint() {
    // Turn 2 re-sends the history with the answer and a new question, from a client that
    // orders keys differently and pretty-prints.
    let turn2 = r#"{
      "stream": true,
      "messages": [
        {"content": "You are terse.", "role": "system"},
        { "content" : "Name a prime." , "role" : "user" },
        {"role": "assistant", "content": "7"},
        {"role": "user", "content": "Another?"}
      ],
      "model": "qwen"
    }"#;
    check_same(TURN1, turn2);
    check_hex(&fp(TURN1));
}

#[test]
fn a_different_first_user_message_is_a_different_conversation() {
    check_differ(TURN1, &TURN1.replace("Name a prime.", "Name a colour."));
}

#[test]
fn the_same_question_to_another_model_is_a_different_conversation() {
    check_differ(TURN1, &TURN1.replace("qwen", "llama"));
    // A missing model hashes as "", which is still not "qwen".
    check_differ(TURN1, &TURN1.replace(r#""model":"qwen","#, ""));
}

#[test]
fn issue27_a_model_known_by_another_name_is_the_named_models_conversation_in_every_api() {
    let bodies = [
        (
            Api::Chat,
            r#"{"model":M,"messages":[{"role":"system","content":"s"},{"role":"user","content":"hi"}]}"#,
        ),
        (
            Api::Messages,
            r#"{"model":M,"system":"s","messages":[{"role":"user","content":"hi"}]}"#,
        ),
        (
            Api::Responses,
            r#"{"model":M,"instructions":"s","input":"hi"}"#,
        ),
        (
            Api::Completion,
            r#"{"model":M,"prompt":"<|im_start|>system\ns<|im_end|>hi"}"#,
        ),
    ];
    let alias = |name: &str| (name == "qwen").then(|| "qwen-coder".to_string());
    for (api, body) in bodies {
        let sent = body.replace('M', r#""qwen""#);
        let configured = body.replace('M', r#""qwen-coder""#);
        let renamed = peek_named(api, sent.as_bytes(), None, alias);
        assert_eq!(
            renamed,
            peek_as(api, configured.as_bytes(), None),
            "{api:?}"
        );
        assert_eq!(renamed.model.as_deref(), Some("qwen-coder"));
        assert_ne!(renamed, peek_as(api, sent.as_bytes(), None), "{api:?}");
        // A name `rename` keeps is read as it is.
        let other = body.replace('M', r#""llama""#);
        assert_eq!(
            peek_named(api, other.as_bytes(), None, alias),
            peek_as(api, other.as_bytes(), None)
        );
    }
}

#[test]
fn a_shared_long_system_prompt_does_not_merge_conversations() {
    let system = "You answer questions about the manual. ".repeat(500);
    let body = |q: &str| {
        serde_json::json!({"model": "m", "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": q},
        ]})
        .to_string()
    };
    check_differ(&body("How do I reset it?"), &body("How do I pair it?"));
}

#[test]
fn without_a_user_message_all_messages_count() {
    let one = r#"{"messages":[{"role":"system","content":"a"}]}"#;
    let two =
        r#"{"messages":[{"role":"system","content":"a"},{"role":"assistant","content":"b"}]}"#;
    check_differ(one, two);
}

#[test]
fn messages_after_the_first_user_one_are_not_even_looked_at() {
    // They may hold anything (images, tool calls, odd types): skipped, never built.
    let odd = TURN1.replace(
        r#"Name a prime."}]"#,
        r#"Name a prime."}, 42, null, [1, {"x": "y"}], {"role": "user", "content": [{"type": "image_url"}]}]"#,
    );
    check_same(TURN1, &odd);
}

#[test]
fn value_text_is_independent_of_key_order_and_whitespace() {
    // The chat rule leans on serde_json's default (sorted) map; `preserve_order` would break it.
    let a: serde_json::Value = serde_json::from_str(r#"{"b":1,"a":{"d":[1, 2],"c":"x"}}"#).unwrap();
    let b: serde_json::Value =
        serde_json::from_str("{ \"a\" : { \"c\" : \"x\",\n \"d\" : [ 1 ,2 ] }, \"b\" : 1 }")
            .unwrap();
    assert_eq!(a.to_string(), r#"{"a":{"c":"x","d":[1,2]},"b":1}"#);
    assert_eq!(a.to_string(), b.to_string());
}

#[test]
fn explicit_keys_win_header_over_body_key_over_messages() {
    let keyed = TURN1.replace(
        r#""model":"qwen","#,
        r#""model":"qwen","prompt_cache_key":"conv-9","#,
    );
    let by_body = peek(keyed.as_bytes(), None).fp;
    check_hex(&by_body);
    assert_ne!(by_body, fp(TURN1), "body key must win over messages");
    // The key alone names the conversation, whatever the messages say.
    let other_messages = keyed.replace("Name a prime.", "Something else");
    assert_eq!(peek(other_messages.as_bytes(), None).fp, by_body);

    let by_header = peek(keyed.as_bytes(), Some("sess-1")).fp;
    check_hex(&by_header);
    assert_ne!(by_header, by_body, "header must win over body key");
    assert_eq!(peek(b"{}", Some("sess-1")).fp, by_header);
    // One key space: the same value by header or by body field is the same conversation.
    assert_eq!(peek(keyed.as_bytes(), Some("conv-9")).fp, by_body);
}

#[test]
fn blank_or_non_string_explicit_keys_are_ignored() {
    assert_eq!(peek(TURN1.as_bytes(), Some("  ")).fp, fp(TURN1));
    let blank = TURN1.replace(r#""model""#, r#""prompt_cache_key":"","model""#);
    assert_eq!(fp(&blank), fp(TURN1));
    let number = TURN1.replace(r#""model""#, r#""prompt_cache_key":7,"model""#);
    assert_eq!(fp(&number), fp(TURN1));
    // Surrounding whitespace in a header value is not part of the key.
    assert_eq!(peek(b"", Some(" abc ")).fp, peek(b"", Some("abc")).fp);
}

#[test]
fn completion_prompts_are_identified_by_their_first_4096_bytes() {
    let body = |p: &str| serde_json::json!({"prompt": p, "n_predict": 8}).to_string();
    let head = "x".repeat(PROMPT_PREFIX);
    check_same(
        &body(&format!("{head} and then one way")),
        &body(&format!("{head} or another")),
    );
    check_differ(&body(&format!("a{head}")), &body(&format!("b{head}")));
    check_hex(&fp(&body("hello")));
    // A multi-byte character across the cut does not upset anything.
    let cut = format!("{}é tail", "x".repeat(PROMPT_PREFIX - 1));
    check_hex(&fp(&body(&cut)));
}

#[test]
fn the_first_present_prompt_field_wins() {
    check_same(
        r#"{"prompt":"p","input":"i"}"#,
        r#"{"input":"i","prompt":"p"}"#,
    );
    check_same(r#"{"input_prefix":"p","content":"c"}"#, r#"{"prompt":"p"}"#);
    check_same(r#"{"prompt":null,"content":"c"}"#, r#"{"content":"c"}"#);
    check_same(r#"{"input":"i"}"#, r#"{"prompt":"i"}"#);
    // Empty messages are no conversation: fall back to the prompt.
    check_same(r#"{"messages":[],"prompt":"p"}"#, r#"{"prompt":"p"}"#);
}

#[test]
fn non_string_prompts_hash_their_json_text_prefix() {
    let tokens: Vec<u32> = (0..10_000).collect();
    let long = serde_json::json!({ "prompt": tokens }).to_string();
    let mut changed_tail = tokens.clone();
    changed_tail[9_999] = 1;
    let tail = serde_json::json!({ "prompt": changed_tail }).to_string();
    check_same(&long, &tail);
    check_differ(r#"{"input":[1,2,3]}"#, r#"{"input":[1,2,4]}"#);
    // A string and its JSON text are different prompts.
    check_differ(r#"{"prompt":"[1]"}"#, r#"{"prompt":[1]}"#);
    assert_eq!(json_prefix(&serde_json::json!(["abc", 1]), 4), b"[\"ab");
}

#[test]
fn bodies_without_a_conversation_have_no_fingerprint() {
    for body in [
        "",
        "not json",
        "[1,2]",
        "\"str\"",
        "{\"model\":\"m\"",
        "{} trailing",
        "{\"model\":\"m\"}",
    ] {
        let p = peek(body.as_bytes(), None);
        assert_eq!(p.fp, "", "{body:?}");
        assert!(!p.stream);
    }
    assert_eq!(peek(b"\xff\xfe", None).fp, "");
    // A session header still names the conversation when the body is not JSON.
    check_hex(&peek(b"not json", Some("s")).fp);
}

#[test]
fn model_and_stream_are_read_leniently() {
    let p = peek(br#"{"model":"qwen","stream":true,"messages":"oops"}"#, None);
    assert_eq!(
        (p.model.as_deref(), p.stream, p.fp.as_str()),
        (Some("qwen"), true, "")
    );
    let p = peek(br#"{"model":7,"stream":"true"}"#, None);
    assert_eq!((p.model, p.stream), (None, false));
    let p = peek(br#"{"model":"a","model":"b","stream":false}"#, None);
    assert_eq!((p.model.as_deref(), p.stream), (Some("b"), false));
    assert_eq!(peek(b"[\"qwen\"]", None).model, None);
}

#[test]
fn short_shows_the_first_eight_characters() {
    assert_eq!(short("0123456789abcdef"), "01234567");
    assert_eq!(short("abc"), "abc");
    assert_eq!(short(""), "");
}

/// These values are the contract with every lease already stored: if one changes, the
/// fingerprint format changed and live conversations would lose their host. Don't "fix" the test.
#[test]
fn golden_fingerprints_never_change() {
    let cases: [(&str, Option<&str>, &str); 4] = [
        (TURN1, None, "403a331c5ff187ae"),
        (
            r#"{"prompt":"Once upon a time","n_predict":16}"#,
            None,
            "fc113713a41275b0",
        ),
        ("{}", Some("sess-42"), "4c970d52aa099faf"),
        (
            r#"{"prompt_cache_key":"sess-42","messages":[]}"#,
            None,
            "4c970d52aa099faf",
        ),
    ];
    for (body, session, want) in cases {
        assert_eq!(
            peek(body.as_bytes(), session).fp,
            want,
            "{body} {session:?}"
        );
    }
}

/// Issue 46: with client keys, a conversation is its key's own; the scoped value is as stable as
/// the fingerprint it scopes (a key's leases are keyed by it).
#[test]
fn a_keyed_conversation_is_its_keys_own_and_never_changes_issue_46() {
    let fp = peek(b"{}", Some("sess-42")).fp;
    let (alice, bob) = (scoped(&fp, "alice"), scoped(&fp, "bob"));
    check_hex(&alice);
    assert_ne!(alice, bob);
    assert_ne!(alice, fp);
    assert_eq!(alice, scoped(&fp, "alice"));
    assert_eq!(scoped("", "alice"), "", "no conversation stays none");
    assert_eq!(alice, "1edcd686577b3027", "the format of a keyed lease");
}

/// Review (issue 16): the peek built every value of the leading turns as a `Value` (32 bytes
/// each, more in maps), so a 16 MiB body of `"messages":[0,0,...]` took about 400 MiB to peek.
/// Past `MAX_VALUES` values a body names no conversation; its model, `stream` and explicit key
/// are still read.
#[test]
fn a_body_of_too_many_values_is_no_conversation_but_keeps_its_model() {
    let many = vec!["0"; crate::api::body::MAX_VALUES + 1].join(",");
    for field in ["messages", "prompt", "system"] {
        let text = format!(r#"{{"model":"m","stream":true,"{field}":[{many}]}}"#);
        let p = peek(text.as_bytes(), None);
        assert_eq!((p.model.as_deref(), p.stream), (Some("m"), true), "{field}");
        assert_eq!(p.fp, "", "{field}");
        let keyed = text.replacen('{', r#"{"prompt_cache_key":"k","#, 1);
        assert_eq!(
            peek(keyed.as_bytes(), None).fp,
            fp(r#"{"prompt_cache_key":"k"}"#)
        );
    }
    // Fewer values than that are a conversation as before.
    let few = vec!["0"; 1000].join(",");
    check_hex(&fp(&format!(r#"{{"model":"m","messages":[{few}]}}"#)));
    // Nesting past serde_json's depth limit is no JSON at all, never a stack overflow.
    let deep = format!(r#"{{"model":"m","messages":{}}}"#, "[".repeat(1 << 20));
    assert_eq!(
        peek(deep.as_bytes(), None),
        Peek {
            model: None,
            fp: String::new(),
            stream: false,
            family: None,
            names_slot: false,
        }
    );
}
