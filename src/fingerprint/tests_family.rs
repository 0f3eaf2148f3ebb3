//! Prompt families (issue 23): what each API's preamble is, that sibling conversations share one
//! family and their turns keep it, and the family ids themselves as goldens (rows and the status
//! page show them, and a restart rebuilds what hosts hold from the rows: they must not drift).

use serde_json::{json, Value};

use super::*;

fn family_of(api: Api, body: &Value) -> Option<Family> {
    peek_as(api, body.to_string().as_bytes(), None).family
}

fn hex(api: Api, body: &Value) -> String {
    family_of(api, body).map_or_else(|| "none".to_string(), Family::hex)
}

const TOOLS: &str =
    r#"[{"type":"function","function":{"name":"read_file","parameters":{"type":"object"}}}]"#;

fn chat(system: &str, user: &str, later: usize) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": system}),
        json!({"role": "user", "content": user}),
    ];
    for i in 0..later {
        messages.push(json!({"role": "assistant", "content": format!("answer {i}")}));
        messages.push(json!({"role": "user", "content": format!("more {i}")}));
    }
    json!({"model": "qwen", "messages": messages, "tools": serde_json::from_str::<Value>(TOOLS).unwrap()})
}

#[test]
fn chat_siblings_share_a_family_and_their_turns_keep_it() {
    let a = chat("You are a coding agent.", "fix the bug", 0);
    let a3 = chat("You are a coding agent.", "fix the bug", 2);
    let b = chat("You are a coding agent.", "write the docs", 0);
    let fa = family_of(Api::Chat, &a).expect("a system prompt is a family");
    assert_eq!(family_of(Api::Chat, &a3), Some(fa));
    assert_eq!(family_of(Api::Chat, &b), Some(fa));
    // Different conversations, one family: the fingerprint still tells them apart.
    assert_ne!(
        peek(a.to_string().as_bytes(), None).fp,
        peek(b.to_string().as_bytes(), None).fp
    );
    // Another system prompt, other tools or another model is another family.
    let other = chat("You are a reviewer.", "fix the bug", 0);
    assert_ne!(family_of(Api::Chat, &other), Some(fa));
    let mut no_tools = a.clone();
    no_tools.as_object_mut().unwrap().remove("tools");
    assert_ne!(family_of(Api::Chat, &no_tools), Some(fa));
    let mut model = a.clone();
    model["model"] = json!("llama");
    assert_ne!(family_of(Api::Chat, &model), Some(fa));
    // Its size is the preamble's bytes, never the conversation's: the system message as its
    // family writes it, "tools" and the tools, and not the model's name.
    let system =
        r#"{"content":[{"text":"You are a coding agent.","type":"text"}],"role":"system"}"#;
    let tools = serde_json::from_str::<Value>(TOOLS).unwrap().to_string();
    assert_eq!(
        fa.bytes,
        (system.len() + "tools".len() + tools.len()) as u64
    );
    let mut long_model = a.clone();
    long_model["model"] = json!("a much longer model name than qwen");
    assert_eq!(family_of(Api::Chat, &long_model).unwrap().bytes, fa.bytes);
}

#[test]
fn a_developer_message_leads_like_a_system_one_and_a_bare_chat_has_no_family() {
    let dev = json!({"model": "m", "messages": [
        {"role": "developer", "content": "Be terse."},
        {"role": "system", "content": [{"type": "text", "text": "Rules."}]},
        {"role": "user", "content": "hi"},
    ]});
    let string = json!({"model": "m", "messages": [
        {"role": "developer", "content": [{"type": "text", "text": "Be terse."}]},
        {"role": "system", "content": "Rules."},
        {"role": "user", "content": "other"},
    ]});
    assert!(family_of(Api::Chat, &dev).is_some());
    assert_eq!(family_of(Api::Chat, &dev), family_of(Api::Chat, &string));
    let bare = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(family_of(Api::Chat, &bare), None);
    // A system message after the first user one is not preamble.
    let late = json!({"model": "m", "messages": [
        {"role": "user", "content": "hi"}, {"role": "system", "content": "late"}]});
    assert_eq!(family_of(Api::Chat, &late), None);
    // Tools alone are a preamble.
    let tools = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                       "tools": [{"type": "function", "function": {"name": "f"}}]});
    assert!(family_of(Api::Chat, &tools).is_some());
}

#[test]
fn messages_family_is_system_and_tools_whatever_the_cache_markers_do() {
    let body = |user: &str, marker: bool| {
        let mut system = json!({"type": "text", "text": "You are Claude Code."});
        let mut tool = json!({"name": "Bash", "input_schema": {"type": "object"}});
        if marker {
            system["cache_control"] = json!({"type": "ephemeral"});
            tool["cache_control"] = json!({"type": "ephemeral"});
        }
        json!({"model": "claude", "system": [system], "tools": [tool],
               "messages": [{"role": "user", "content": user}]})
    };
    let f = family_of(Api::Messages, &body("one", true)).unwrap();
    assert_eq!(family_of(Api::Messages, &body("two", false)), Some(f));
    let plain = json!({"model": "claude", "messages": [{"role": "user", "content": "x"}]});
    assert_eq!(family_of(Api::Messages, &plain), None);
}

#[test]
fn responses_family_is_instructions_leading_system_items_and_tools() {
    let body = |user: &str| {
        json!({"model": "gpt", "instructions": "You are Codex.",
               "input": [{"role": "developer", "content": "sandbox: on"},
                         {"role": "user", "content": user}]})
    };
    let f = family_of(Api::Responses, &body("a")).unwrap();
    assert_eq!(family_of(Api::Responses, &body("b")), Some(f));
    let text = json!({"model": "gpt", "input": "hello"});
    assert_eq!(family_of(Api::Responses, &text), None);
}

#[test]
fn a_completion_prompt_family_is_its_text_before_the_first_user_turn() {
    let prompt = |user: &str| {
        json!({"prompt": format!(
            "<|im_start|>system\nYou are a helpful coding assistant.<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
        )})
    };
    let f = family_of(Api::Completion, &prompt("a")).unwrap();
    assert_eq!(family_of(Api::Completion, &prompt("b")), Some(f));
    // A prompt that starts with its user turn (a BOS at most before it) has none.
    let bare = json!({"prompt": "<s>[INST] hi [/INST]"});
    assert_eq!(family_of(Api::Completion, &bare), None);
    assert_eq!(
        family_of(Api::Completion, &json!({"prompt": [1, 2, 3]})),
        None
    );
    // Stateless requests have no family, whatever they carry.
    let embed = json!({"model": "m", "input": "x", "tools": [{"name": "f"}]});
    assert_eq!(family_of(Api::Stateless, &embed), None);
}

/// Goldens: a change here orphans what a restart rebuilds from the rows (bump the domain instead).
#[test]
fn family_ids_are_stable() {
    let cases = [
        (
            Api::Chat,
            chat("You are a coding agent.", "fix the bug", 0),
            "42c563a0",
        ),
        (
            Api::Messages,
            json!({"model": "claude", "system": "You are Claude Code.",
                   "messages": [{"role": "user", "content": "hi"}]}),
            "b00e972b",
        ),
        (
            Api::Responses,
            json!({"model": "gpt", "instructions": "You are Codex.", "input": "hi"}),
            "b92e2a14",
        ),
        (
            Api::Completion,
            json!({"prompt": "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi"}),
            "80eb3633",
        ),
    ];
    for (api, body, want) in cases {
        assert_eq!(hex(api, &body), want, "{api:?}");
    }
    assert_eq!(Family::parse_id("0000002a"), Some(42));
    assert_eq!(Family::parse_id("2a"), None);
    assert_eq!(Family::parse_id("zzzzzzzz"), None);
}
