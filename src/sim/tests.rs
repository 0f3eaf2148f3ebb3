//! The simulator seen from a client: llama-server's shapes, its prompt cache, its stream framing and
//! connection handling, lock-step, disconnects and every fault. Synchronised on `SimEvent`s, never
//! on sleeps (socket read timeouts are only a safety net against a hung test).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crossbeam_channel::Receiver;
use serde_json::{json, Value};

use super::{Fault, Sim, SimConfig, SimEvent};

mod control;
mod prefill;
mod replies;

const SAFETY: Duration = Duration::from_secs(10);

fn sim() -> Sim {
    Sim::start(SimConfig::default())
}

/// An answer read whole; every status is an answer, only a transport failure is an error.
#[derive(Debug)]
struct Reply {
    status: u16,
    headers: ureq::http::HeaderMap,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn content_type(&self) -> &str {
        self.header("content-type").unwrap_or("")
    }
}

type Answer = Result<Reply, ureq::Error>;

fn get(sim: &Sim, path: &str) -> Answer {
    let request = ureq::http::Request::get(format!("{}{path}", sim.url())).body(());
    run(request.expect("a request"))
}

fn post(sim: &Sim, path: &str, body: &Value) -> Answer {
    send(&format!("{}{path}", sim.url()), &[], body)
}

fn send(url: &str, headers: &[(&str, &str)], body: &Value) -> Answer {
    let mut request = ureq::http::Request::post(url).header("Content-Type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    run(request.body(body.to_string()).expect("a request"))
}

fn run(request: ureq::http::Request<impl ureq::AsSendBody>) -> Answer {
    let config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(SAFETY))
        .build();
    let (head, body) = ureq::Agent::new_with_config(config)
        .run(request)?
        .into_parts();
    let body = body.into_with_config().limit(1 << 20).read_to_string()?;
    Ok(Reply {
        status: head.status.as_u16(),
        headers: head.headers,
        body,
    })
}

/// A 200 answer.
#[track_caller]
fn ok(answer: Answer) -> Reply {
    let reply = answer.expect("an answer");
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply
}

/// The status and JSON body of an answer, whether 2xx or not.
#[track_caller]
fn json_of(res: Answer) -> (u16, Value) {
    let resp = res.unwrap_or_else(|e| panic!("transport error: {e}"));
    let v = serde_json::from_str(&resp.body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", resp.body));
    (resp.status, v)
}

/// The `data:` payloads of a streamed answer.
#[track_caller]
fn events(resp: Reply) -> Vec<String> {
    resp.body
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").expect("data: prefix").to_string())
        .collect()
}

#[track_caller]
fn parse(event: &str) -> Value {
    serde_json::from_str(event).unwrap_or_else(|e| panic!("not JSON ({e}): {event}"))
}

#[track_caller]
fn wait_for(rx: &Receiver<SimEvent>, want: impl Fn(&SimEvent) -> bool) -> SimEvent {
    loop {
        let ev = rx.recv_timeout(SAFETY).expect("sim event");
        if want(&ev) {
            return ev;
        }
    }
}

fn convo(first: &str) -> Value {
    json!([{"role": "system", "content": "You are a helpful assistant who answers briefly."},
           {"role": "user", "content": first}])
}

/// Sends a raw request on a fresh connection and returns it (read timeout as a safety net).
fn raw(sim: &Sim, method: &str, path: &str, body: &str) -> TcpStream {
    let mut s = TcpStream::connect(sim.addr()).expect("connect");
    s.set_read_timeout(Some(SAFETY)).expect("timeout");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: sim\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).expect("write");
    s
}

/// Reads until the server closes the connection.
#[track_caller]
fn read_to_close(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    s.read_to_end(&mut out)
        .expect("server closed the connection in time");
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn metadata_endpoints_look_like_llama_server() {
    let sim = Sim::start(SimConfig {
        alias: "qwen".into(),
        ..SimConfig::default()
    });
    assert_eq!(
        json_of(get(&sim, "/health")),
        (200, json!({"status": "ok"}))
    );
    let (_, props) = json_of(get(&sim, "/props"));
    assert_eq!(props["default_generation_settings"]["n_ctx"], 4096);
    assert_eq!(props["total_slots"], 2);
    assert_eq!(props["model_alias"], "qwen");
    assert_eq!(props["is_sleeping"], false);
    assert!(
        props.get("n_ctx").is_none(),
        "no top-level n_ctx on modern builds"
    );
    let (_, models) = json_of(get(&sim, "/v1/models"));
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "qwen");
    assert_eq!(models["data"][0]["owned_by"], "llamacpp");
    assert_eq!(models["data"][0]["meta"]["n_ctx"], 4096);
    let (_, slots) = json_of(get(&sim, "/slots"));
    assert_eq!(
        slots,
        json!([{"id": 0, "n_ctx": 4096, "is_processing": false, "speculative": false},
                             {"id": 1, "n_ctx": 4096, "is_processing": false, "speculative": false}])
    );
    let (status, err) = json_of(get(&sim, "/metrics"));
    assert_eq!(
        (status, &err["error"]["type"]),
        (501, &json!("not_supported_error"))
    );
    assert_eq!(json_of(get(&sim, "/nope")).0, 404);
    let (status, err) = json_of(post(&sim, "/v1/chat/completions", &json!("not an object")));
    assert_eq!((status, &err["error"]["code"]), (400, &json!(400)));
    assert_eq!(sim.requests().len(), 7);
    assert_eq!(sim.stats().requests, 7);
}

/// Issue 48: a client that takes "length" for an error (Claude Code's `max_tokens`) needs an
/// answer that ends by itself.
#[test]
fn an_end_of_text_ends_an_answer_before_the_requests_limit() {
    let sim = Sim::start(SimConfig {
        eos_after: Some(3),
        ..SimConfig::default()
    });
    let body = json!({"messages": convo("hi"), "max_tokens": 32000});
    let (_, answer) = json_of(post(&sim, "/v1/chat/completions", &body));
    assert_eq!(answer["usage"]["completion_tokens"], 3);
    assert_eq!(answer["choices"][0]["finish_reason"], "stop");
    let short = json!({"messages": convo("hi"), "max_tokens": 2});
    let (_, answer) = json_of(post(&sim, "/v1/chat/completions", &short));
    assert_eq!(answer["choices"][0]["finish_reason"], "length");
}

#[test]
fn the_same_conversation_twice_reuses_the_prompt_cache() {
    let sim = sim();
    let body = json!({"messages": convo("What is a slot?"), "max_tokens": 4});
    let (_, first) = json_of(post(&sim, "/v1/chat/completions", &body));
    let (_, second) = json_of(post(&sim, "/v1/chat/completions", &body));
    let prompt = first["usage"]["prompt_tokens"]
        .as_u64()
        .expect("prompt_tokens");
    assert_eq!(first["timings"]["cache_n"], 0);
    assert_eq!(
        second["timings"]["cache_n"],
        prompt - 1,
        "one token is always re-evaluated"
    );
    assert_eq!(second["timings"]["prompt_n"], 1);
    assert_eq!(second["usage"]["prompt_tokens"], prompt);
    assert_eq!(
        second["usage"]["prompt_tokens_details"]["cached_tokens"],
        prompt - 1
    );
    assert_eq!(second["usage"]["completion_tokens"], 4);
    assert_eq!(second["choices"][0]["finish_reason"], "length");

    // Turn 2 (the answer sent back plus a new question) reuses the whole of turn 1.
    let answer = first["choices"][0]["message"]["content"].clone();
    let mut messages = convo("What is a slot?");
    let turn2 = messages.as_array_mut().expect("array");
    turn2.push(json!({"role": "assistant", "content": answer}));
    turn2.push(json!({"role": "user", "content": "And a prompt cache?"}));
    let (_, third) = json_of(post(
        &sim,
        "/v1/chat/completions",
        &json!({"messages": turn2}),
    ));
    assert!(
        third["timings"]["cache_n"].as_u64() > Some(prompt),
        "{third}"
    );
    assert_eq!(
        third["choices"][0]["finish_reason"], "stop",
        "default length ends as a stop"
    );
    let stats = sim.stats();
    assert_eq!(stats.predicted_n, 4 + 4 + 8);
    assert_eq!(
        stats.cache_n,
        prompt - 1 + third["timings"]["cache_n"].as_u64().unwrap_or(0)
    );
}

#[test]
fn a_second_conversation_on_two_slots_does_not_evict_the_first() {
    let sim = sim();
    // No shared system prompt: with one, llama-server puts B into A's slot (see cache.rs tests).
    let a =
        json!({"messages": [{"role": "user", "content": "Tell me about Rome."}], "max_tokens": 2});
    let b = json!({"messages": [{"role": "system", "content": "Be a poet."},
                                {"role": "user", "content": "A haiku about rain."}], "max_tokens": 2});
    json_of(post(&sim, "/v1/chat/completions", &a));
    json_of(post(&sim, "/v1/chat/completions", &b));
    let (_, again) = json_of(post(&sim, "/v1/chat/completions", &a));
    let prompt = again["usage"]["prompt_tokens"]
        .as_u64()
        .expect("prompt_tokens");
    assert_eq!(again["timings"]["cache_n"], prompt - 1);
}

#[test]
fn a_prompt_over_the_per_slot_context_is_a_plain_400_even_when_streamed() {
    let sim = Sim::start(SimConfig {
        n_ctx: 64,
        ..SimConfig::default()
    });
    let long = "word ".repeat(40);
    let body = json!({"messages": [{"role": "user", "content": long}], "stream": true});
    let resp = post(&sim, "/v1/chat/completions", &body).expect("an answer");
    assert_eq!(resp.status, 400, "{}", resp.body);
    assert!(resp.content_type().starts_with("application/json"));
    let (_, err) = json_of(Ok(resp));
    assert_eq!(err["error"]["type"], "exceed_context_size_error");
    assert_eq!(err["error"]["n_ctx"], 32);
    assert!(err["error"]["n_prompt_tokens"].as_u64() >= Some(32));
}

#[test]
fn streamed_chat_has_role_first_timings_on_finish_and_done_last() {
    let sim = sim();
    let body = json!({"messages": convo("hi"), "stream": true, "max_tokens": 3});
    let resp = ok(post(&sim, "/v1/chat/completions", &body));
    assert_eq!(resp.content_type(), "text/event-stream");
    assert_eq!(resp.header("x-accel-buffering"), Some("no"));
    assert_eq!(resp.header("transfer-encoding"), Some("chunked"));
    let ev = events(resp);
    assert_eq!(ev.len(), 1 + 3 + 1 + 1, "{ev:?}");
    let role = parse(&ev[0]);
    assert_eq!(
        role["choices"][0]["delta"],
        json!({"role": "assistant", "content": null})
    );
    for token in &ev[1..4] {
        let content = &parse(token)["choices"][0]["delta"]["content"];
        assert_eq!(
            content.as_str().map(str::len),
            Some(4),
            "one token per event"
        );
    }
    let finish = parse(&ev[4]);
    assert_eq!(finish["choices"][0]["delta"], json!({}));
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    assert_eq!(finish["timings"]["predicted_n"], 3);
    assert!(finish.get("usage").is_none());
    assert_eq!(ev[5], "[DONE]");
}

#[test]
fn include_usage_moves_timings_to_an_extra_usage_event() {
    let sim = sim();
    let body = json!({"messages": convo("hi"), "stream": true, "max_tokens": 2,
                      "stream_options": {"include_usage": true}});
    let ev = events(ok(post(&sim, "/v1/chat/completions", &body)));
    assert_eq!(ev.len(), 1 + 2 + 2 + 1, "{ev:?}");
    let finish = parse(&ev[3]);
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    assert!(finish.get("timings").is_none());
    let usage = parse(&ev[4]);
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 2);
    assert_eq!(
        usage["usage"]["prompt_tokens"],
        usage["timings"]["prompt_n"].as_u64().unwrap_or(0)
            + usage["timings"]["cache_n"].as_u64().unwrap_or(0)
    );
    assert_eq!(ev[5], "[DONE]");
}

#[test]
fn native_completion_streams_without_done_and_v1_completions_with_it() {
    let sim = sim();
    let body = json!({"prompt": "Once upon a time", "n_predict": 2, "stream": true});
    let ev = events(ok(post(&sim, "/completion", &body)));
    assert_eq!(ev.len(), 3, "{ev:?}");
    assert_eq!(parse(&ev[0])["stop"], false);
    let last = parse(&ev[2]);
    assert_eq!(last["stop"], true);
    assert_eq!(last["tokens_predicted"], 2);
    assert_eq!(last["tokens_evaluated"], 4);
    assert_eq!(last["timings"]["prompt_n"], 4);
    assert!(last.get("tokens_cached").is_some());

    let body = json!({"prompt": "Once upon a time", "max_tokens": 2, "stream": true});
    let ev = events(ok(post(&sim, "/v1/completions", &body)));
    assert_eq!(ev.len(), 4, "{ev:?}");
    let last = parse(&ev[2]);
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert_eq!(last["usage"]["prompt_tokens_details"]["cached_tokens"], 3);
    assert_eq!(last["timings"]["cache_n"], 3);
    assert_eq!(ev[3], "[DONE]");
}

#[test]
fn a_client_expecting_100_continue_gets_it() {
    let sim = sim();
    let body = json!({"messages": convo(&"long ".repeat(300)), "max_tokens": 1}).to_string();
    let mut s = TcpStream::connect(sim.addr()).expect("connect");
    s.set_read_timeout(Some(SAFETY)).expect("timeout");
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: sim\r\nExpect: 100-continue\r\n\
         Connection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).expect("write head");
    let mut interim = [0u8; 25];
    s.read_exact(&mut interim)
        .expect("interim answer before the body");
    assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    s.write_all(body.as_bytes()).expect("write body");
    assert!(read_to_close(&mut s).starts_with("HTTP/1.1 200 OK"));
}

#[test]
fn streams_close_the_connection_but_plain_answers_keep_it() {
    let sim = sim();
    let mut s = raw(&sim, "GET", "/health", "");
    let mut r = BufReader::new(s.try_clone().expect("clone"));
    let mut head = String::new();
    while head.is_empty() || !head.ends_with("\r\n\r\n") {
        assert!(
            r.read_line(&mut head).expect("head") > 0,
            "closed too early"
        );
    }
    assert!(
        head.contains("Keep-Alive") && !head.contains("Connection: close"),
        "{head}"
    );
    let mut body = [0u8; 15];
    r.read_exact(&mut body).expect("body");
    // The same connection serves a stream, then is closed without a `Connection: close`.
    let chat = json!({"messages": convo("hi"), "stream": true, "max_tokens": 1}).to_string();
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: sim\r\nContent-Length: {}\r\n\r\n{chat}",
        chat.len()
    );
    s.write_all(req.as_bytes()).expect("write");
    let mut rest = String::new();
    r.read_to_string(&mut rest)
        .expect("closed after the stream");
    assert!(rest.starts_with("HTTP/1.1 200 OK\r\n"), "{rest}");
    assert!(!rest.contains("Connection: close"));
    assert!(rest.ends_with("data: [DONE]\n\n\r\n0\r\n\r\n"), "{rest}");
}
