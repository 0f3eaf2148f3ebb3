//! Polling stories: body shapes from llama-server.md, then real HTTP against fake hosts on
//! 127.0.0.1:0 that answer well, refuse, hang, load or talk garbage. The poller thread over
//! several such hosts is in `tests/poller.rs`.

mod fakes;
mod poller;

use super::*;
use fakes::{fake, hung, refusing_url, Answer, Hit};
use std::collections::BTreeMap;

const BOUND: Duration = Duration::from_secs(10);

// ---- body shapes -------------------------------------------------------------------------

/// `/props` as observed on b11434 with `-c 4096 -np 2`.
const PROPS: &str = r#"{"default_generation_settings":{"id":0,"n_ctx":2048,"speculative":false,
  "params":{"temperature":0.8}},"total_slots":2,"model_alias":"/m/tiny.gguf",
  "model_path":"/m/tiny.gguf","build_info":"b11434-0123abc","is_sleeping":false}"#;

/// `/v1/models` of a single-model server, b9076+ (with `meta`).
const MODELS: &str = r#"{"object":"list","data":[{"id":"qwen-coder","object":"model",
  "created":1760000000,"owned_by":"llamacpp","meta":{"n_ctx":2048,"n_ctx_train":32768}}],
  "models":[{"name":"qwen-coder","model":"qwen-coder","type":"model"}]}"#;

/// A router's `/models`: one entry per known model, each with a status.
const ROUTER_MODELS: &str = r#"{"object":"list","data":[
  {"id":"qwen-coder","aliases":["qc"],"object":"model","status":{"value":"loaded","args":["-c","8192"]}},
  {"id":"llama","object":"model","status":{"value":"unloaded"}},
  {"id":"mistral","object":"model","status":{"value":"loading"}},
  {"id":"phi","object":"model","status":{"value":"sleeping"}},
  {"id":"gemma","object":"model","status":{"failed":true}}]}"#;

/// The router models of [`ROUTER_MODELS`], as the poll reads them.
fn router_models() -> Vec<RouterModel> {
    let models = parse_model_list(ROUTER_MODELS).unwrap().models;
    assert_eq!(models.len(), 5);
    assert_eq!(models[0].per_slot_ctx, Some(8192));
    models
}

#[track_caller]
fn check_props(body: &str, want: (Option<u64>, Option<u64>)) {
    assert_eq!(parse_props(body).unwrap(), want, "{body}");
}

#[track_caller]
fn check_models(body: &str, want: &[&str]) {
    assert_eq!(parse_models(body).unwrap(), want, "{body}");
}

#[test]
fn props_give_the_per_slot_context_and_slot_count() {
    check_props(PROPS, (Some(2048), Some(2)));
    // Older builds and a router's own /props lack the fields: unknown, not an error.
    check_props(
        r#"{"default_generation_settings":{"temperature":0.8}}"#,
        (None, None),
    );
    check_props(r#"{"role":"router","max_instances":4}"#, (None, None));
    // A router says n_ctx 0 for itself (issue 11): unknown, so the guard leaves it alone.
    check_props(
        r#"{"role":"router","default_generation_settings":{"params":null,"n_ctx":0}}"#,
        (None, None),
    );
    check_props(
        r#"{"default_generation_settings":{"n_ctx":"big"},"total_slots":-1}"#,
        (None, None),
    );
    assert!(matches!(
        parse_props("<html>oops</html>"),
        Err(ParseError::Json(_))
    ));
    assert!(matches!(parse_props("[1,2]"), Err(ParseError::Shape(_))));
}

#[test]
fn models_list_ids_and_aliases_and_routers_only_loaded_ones() {
    check_models(MODELS, &["qwen-coder"]);
    // An old build: no meta, no aliases, no status.
    check_models(
        r#"{"object":"list","data":[{"id":"/m/tiny.gguf","object":"model"}]}"#,
        &["/m/tiny.gguf"],
    );
    check_models(
        r#"{"data":[{"id":"a","aliases":["b","a"]},{"object":"model"}]}"#,
        &["a", "b"],
    );
    check_models(ROUTER_MODELS, &["qwen-coder", "qc"]);
    check_models(r#"{"data":[]}"#, &[]);
    assert!(matches!(parse_models("not json"), Err(ParseError::Json(_))));
    assert!(matches!(
        parse_models(r#"{"object":"list"}"#),
        Err(ParseError::Shape(_))
    ));
    assert!(parse_model_list(ROUTER_MODELS).unwrap().router);
    assert!(!parse_model_list(MODELS).unwrap().router);
}

/// Issue 15/11 (review): a listing of hundreds of thousands of names made every poll quadratic
/// and every `is_loaded` scan (and the "host up" log line) as long as the listing.
#[test]
fn a_huge_listing_keeps_each_name_once_and_at_most_max_loaded_issue_15() {
    // Every entry repeats the configured name as an alias: kept once, whatever the count.
    let entries: Vec<String> = (0..5 * MAX_LOADED)
        .map(|i| format!(r#"{{"id":"junk-{i}","aliases":["qwen","junk-{i}"]}}"#))
        .collect();
    let body = format!(r#"{{"data":[{}]}}"#, entries.join(","));
    let loaded = parse_models(&body).unwrap();
    assert_eq!(loaded.len(), MAX_LOADED);
    assert_eq!(loaded[..3], ["junk-0", "qwen", "junk-1"]);
    let distinct: std::collections::BTreeSet<&String> = loaded.iter().collect();
    assert_eq!(distinct.len(), loaded.len(), "a name kept twice");
    // The router flag and its models are still read past the cap.
    let mut routed = entries.clone();
    routed.push(r#"{"id":"late","status":{"value":"loaded"}}"#.to_string());
    let list = parse_model_list(&format!(r#"{{"data":[{}]}}"#, routed.join(","))).unwrap();
    assert!(list.router);
    assert_eq!(list.loaded.len(), MAX_LOADED);
}

// ---- fake hosts ----------------------------------------------------------------------------

fn good(path: &str) -> (u16, &'static str) {
    match path {
        "/health" => (200, r#"{"status":"ok"}"#),
        "/props" => (200, PROPS),
        "/v1/models" => (200, MODELS),
        _ => (
            404,
            r#"{"error":{"code":404,"message":"File Not Found","type":"not_found_error"}}"#,
        ),
    }
}

fn loading(_: &str) -> (u16, &'static str) {
    (
        503,
        r#"{"error":{"message":"Loading model","type":"unavailable_error","code":503}}"#,
    )
}

fn host(name: &str, url: &str) -> config::Host {
    config::Host {
        name: name.into(),
        url: url.into(),
        weight: 1,
        api_key: None,
        ctx: None,
        kv_tokens: None,
        slot_prompt_similarity: Some(0.1),
        exclusive: false,
        ram_cache: None,
        implied: false,
        models: BTreeMap::from([("qwen-coder".to_string(), Some(2))]),
        upstream: BTreeMap::new(),
    }
}

#[track_caller]
fn check_poll(url: &str, want: Poll) {
    assert_eq!(
        poll_host(&side::poll_agent(Duration::from_secs(5)), &host("h", url)),
        want,
        "{url}"
    );
}

// ---- polling one host ----------------------------------------------------------------------

#[test]
fn a_good_host_is_up_with_its_context_slots_and_models_and_gets_the_key() {
    let server = fake(good);
    let mut with_key = host("titan", &server.url);
    with_key.api_key = Some("sekrit".into());
    let poll = poll_host(&side::poll_agent(Duration::from_secs(5)), &with_key);
    let want = Poll::Up {
        per_slot_ctx: Some(2048),
        total_slots: Some(2),
        loaded: vec!["qwen-coder".into()],
        router: false,
        models: Vec::new(),
        max_instances: None,
        build: Some("b11434-0123abc".into()),
        ctx_train: Some(32768),
    };
    assert_eq!(poll, want);
    let hits: Vec<Hit> = server.hits.try_iter().collect();
    let paths: Vec<&str> = hits.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(paths, ["/health", "/props", "/v1/models", "/models"]);
    for (path, auth) in &hits {
        assert_eq!(auth.as_deref(), Some("Bearer sekrit"), "{path}");
    }
}

#[test]
fn a_router_tells_on_models_which_are_loaded() {
    let server = fake(|path| match path {
        "/models" => (200, ROUTER_MODELS),
        other => good(other),
    });
    check_poll(
        &server.url,
        Poll::Up {
            per_slot_ctx: Some(2048),
            total_slots: Some(2),
            loaded: vec!["qwen-coder".into(), "qc".into()],
            router: true,
            models: router_models(),
            max_instances: None,
            build: Some("b11434-0123abc".into()),
            ctx_train: None,
        },
    );
    // When /v1/models already carries statuses, /models is not asked.
    let server = fake(|path| match path {
        "/v1/models" => (200, ROUTER_MODELS),
        "/props" => (200, r#"{"role":"router"}"#),
        other => good(other),
    });
    check_poll(
        &server.url,
        Poll::Up {
            per_slot_ctx: None,
            total_slots: None,
            loaded: vec!["qwen-coder".into(), "qc".into()],
            router: true,
            models: router_models(),
            max_instances: None,
            build: None,
            ctx_train: None,
        },
    );
    let paths: Vec<String> = server.hits.try_iter().map(|(p, _)| p).collect();
    assert_eq!(paths, ["/health", "/props", "/v1/models"]);
}

/// The reason a poll of a host answering `answer` ends with.
#[track_caller]
fn reason_of(answer: Answer) -> String {
    let server = fake(answer);
    match poll_host(
        &side::poll_agent(Duration::from_secs(5)),
        &host("h", &server.url),
    ) {
        Poll::Down(reason) => reason.to_string(),
        up => panic!("expected the host down, got {up:?}"),
    }
}

#[test]
fn each_failure_names_its_path_and_what_came_back_issue_11() {
    let refused = poll_host(
        &side::poll_agent(Duration::from_secs(5)),
        &host("h", &refusing_url()),
    );
    let Poll::Down(reason @ DownReason::Unreachable { .. }) = refused else {
        panic!("{refused:?}");
    };
    assert!(
        reason.to_string().starts_with("no answer from /health: "),
        "{reason}"
    );
    assert_eq!(reason_of(loading), "503 from /health: loading");
    assert_eq!(
        reason_of(|p| if p == "/health" { (404, "") } else { good(p) }),
        "404 from /health"
    );
    assert_eq!(
        reason_of(|p| if p == "/health" { (500, "{}") } else { good(p) }),
        "500 from /health"
    );
    assert_eq!(
        reason_of(|p| if p == "/props" {
            (200, "<html>oops")
        } else {
            good(p)
        }),
        "bad answer from /props: invalid JSON"
    );
    assert_eq!(
        reason_of(|p| if p == "/props" { (401, "{}") } else { good(p) }),
        "401 from /props: check api_key"
    );
    assert_eq!(
        reason_of(|p| if p == "/props" { (403, "{}") } else { good(p) }),
        "403 from /props: check api_key"
    );
    assert_eq!(
        reason_of(|p| if p == "/v1/models" {
            (500, "{}")
        } else {
            good(p)
        }),
        "500 from /v1/models"
    );
    assert_eq!(
        reason_of(|p| if p == "/v1/models" {
            (200, r#"{"x":1}"#)
        } else {
            good(p)
        }),
        "bad answer from /v1/models: unexpected JSON: expected an object with a `data` array"
    );
}

#[test]
fn a_host_without_props_is_up_with_its_context_unknown_issue_11() {
    let missing: [(u16, Answer); 2] = [
        (404, |p| if p == "/props" { (404, "{}") } else { good(p) }),
        (501, |p| if p == "/props" { (501, "{}") } else { good(p) }),
    ];
    for (status, answer) in missing {
        let server = fake(answer);
        let poll = poll_host(
            &side::poll_agent(Duration::from_secs(5)),
            &host("h", &server.url),
        );
        let Poll::Up {
            per_slot_ctx,
            total_slots,
            ..
        } = poll
        else {
            panic!("{status}: {poll:?}");
        };
        assert_eq!((per_slot_ctx, total_slots), (None, None), "{status}");
    }
}

#[test]
fn a_host_that_never_answers_is_unreachable_after_the_timeout() {
    let server = hung();
    let timeout = Duration::from_millis(200);
    let started = Instant::now();
    let poll = poll_host(&side::poll_agent(timeout), &host("h", &server.url));
    assert!(
        matches!(&poll, Poll::Down(DownReason::Unreachable { path, .. }) if path == "/health"),
        "{poll:?}"
    );
    // (ureq's timers count whole milliseconds from its own start: a fraction of one early.)
    assert!(started.elapsed() >= timeout - Duration::from_millis(10));
    assert!(
        server.accepted.try_recv().is_ok(),
        "the request reached the hung host"
    );
}
