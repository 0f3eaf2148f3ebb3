//! The count calls' bounds: the deadline, turns per host, endpoints per API, `/tokenize` answers.

use super::*;

use std::net::TcpListener;
use std::time::Duration;

/// A host on a loopback listener that accepts (the kernel's backlog does) and never answers;
/// the listener must be kept for as long as the host is asked.
pub(super) fn silent_host(name: &str) -> (TcpListener, Host) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let host = Host {
        name: name.into(),
        url: format!("http://{}", listener.local_addr().unwrap()),
        weight: 1,
        api_key: None,
        ctx: None,
        kv_tokens: None,
        slot_prompt_similarity: Some(0.1),
        exclusive: false,
        ram_cache: None,
        implied: false,
        models: Default::default(),
        upstream: Default::default(),
    };
    (listener, host)
}

#[test]
fn a_host_that_does_not_answer_in_time_cannot_count() {
    let (listener, host) = silent_host("hung");
    // Accepts (the kernel's backlog does) and never answers.
    let side = Side::new(ureq::Agent::new_with_defaults());
    let started = Instant::now();
    let deadline = started + Duration::from_millis(200);
    let body = br#"{"messages":[{"role":"user","content":"hi"}]}"#;
    let counted = exact(&side, &host, "/v1/chat/completions", body, None, deadline);
    assert_eq!(counted, None);
    let took = started.elapsed();
    // It waited for the host until the deadline: ureq's timers count whole milliseconds from its
    // own start, so the wait may end a fraction of one early (199.4 ms seen on a busy machine).
    assert!(took >= Duration::from_millis(190), "{took:?}");
    assert!(
        took < Duration::from_secs(3),
        "the deadline bounds the wait: {took:?}"
    );
    drop(listener);
}

#[test]
fn each_api_names_its_count_endpoint() {
    let path = |rest| match count_call(rest) {
        Some(CountCall::Endpoint { path, .. }) => path,
        other => panic!("{rest}: {other:?}"),
    };
    assert_eq!(
        path("/v1/chat/completions"),
        "/v1/chat/completions/input_tokens"
    );
    assert_eq!(path("/v1/messages"), "/v1/messages/count_tokens");
    assert_eq!(path("/v1/responses"), "/v1/responses/input_tokens");
    assert_eq!(count_call("/completion"), Some(CountCall::Prompt));
    assert_eq!(count_call("/v1/completions"), Some(CountCall::Prompt));
    for uncounted in ["/v1/embeddings", "/infill", "/v1/models", "/tokenize"] {
        assert_eq!(count_call(uncounted), None, "{uncounted}");
    }
}

#[test]
fn token_lists_are_counted_at_every_split() {
    let answer = br#"{"tokens":[128000, 9906,1917 ,0]}"#;
    for split in 0..answer.len() {
        let (a, b) = answer.split_at(split);
        assert_eq!(count_tokens(a.chain(b)), Some(4), "split at {split}");
    }
    assert_eq!(count_tokens(&br#"{"tokens":[]}"#[..]), Some(0));
    assert_eq!(count_tokens(&br#"{"tokens":[1,2"#[..]), None, "cut short");
    let pieces = br#"{"tokens":[{"id":1,"piece":"a"}]}"#;
    assert_eq!(count_tokens(&pieces[..]), None);
    assert_eq!(count_tokens(&b"<html>"[..]), None);
}
