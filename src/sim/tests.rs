//! The simulator seen from a client: llama-server's shapes, its prompt cache, its stream framing and
//! connection handling, lock-step, disconnects and every fault. Synchronised on `SimEvent`s, never
//! on sleeps (socket read timeouts are only a safety net against a hung test).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crossbeam_channel::Receiver;
use serde_json::{json, Value};

use super::{Fault, Sim, SimConfig, SimEvent};

const SAFETY: Duration = Duration::from_secs(10);

fn sim() -> Sim {
    Sim::start(SimConfig::default())
}

fn get(sim: &Sim, path: &str) -> Result<ureq::Response, ureq::Error> {
    ureq::get(&format!("{}{path}", sim.url())).call()
}

fn post(sim: &Sim, path: &str, body: &Value) -> Result<ureq::Response, ureq::Error> {
    send(ureq::post(&format!("{}{path}", sim.url())), body)
}

/// ureq is built without its `json` feature.
fn send(req: ureq::Request, body: &Value) -> Result<ureq::Response, ureq::Error> {
    req.set("Content-Type", "application/json")
        .send_string(&body.to_string())
}

/// The status and JSON body of an answer, whether 2xx or not.
#[track_caller]
fn json_of(res: Result<ureq::Response, ureq::Error>) -> (u16, Value) {
    let resp = match res {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("transport error: {e}"),
    };
    let status = resp.status();
    let body = resp.into_string().expect("body");
    let v = serde_json::from_str(&body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"));
    (status, v)
}

/// The `data:` payloads of a streamed answer.
#[track_caller]
fn events(resp: ureq::Response) -> Vec<String> {
    let body = resp.into_string().expect("body");
    body.split("\n\n")
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
    s.read_to_end(&mut out).expect("server closed the connection in time");
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn metadata_endpoints_look_like_llama_server() {
    let sim = Sim::start(SimConfig {
        alias: "qwen".into(),
        ..SimConfig::default()
    });
    assert_eq!(json_of(get(&sim, "/health")), (200, json!({"status": "ok"})));
    let (_, props) = json_of(get(&sim, "/props"));
    assert_eq!(props["default_generation_settings"]["n_ctx"], 4096);
    assert_eq!(props["total_slots"], 2);
    assert_eq!(props["model_alias"], "qwen");
    assert_eq!(props["is_sleeping"], false);
    assert!(props.get("n_ctx").is_none(), "no top-level n_ctx on modern builds");
    let (_, models) = json_of(get(&sim, "/v1/models"));
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "qwen");
    assert_eq!(models["data"][0]["owned_by"], "llamacpp");
    assert_eq!(models["data"][0]["meta"]["n_ctx"], 4096);
    let (_, slots) = json_of(get(&sim, "/slots"));
    assert_eq!(slots, json!([{"id": 0, "n_ctx": 4096, "is_processing": false, "speculative": false},
                             {"id": 1, "n_ctx": 4096, "is_processing": false, "speculative": false}]));
    let (status, err) = json_of(get(&sim, "/metrics"));
    assert_eq!((status, &err["error"]["type"]), (501, &json!("not_supported_error")));
    assert_eq!(json_of(get(&sim, "/nope")).0, 404);
    let (status, err) = json_of(post(&sim, "/v1/chat/completions", &json!("not an object")));
    assert_eq!((status, &err["error"]["code"]), (400, &json!(400)));
    assert_eq!(sim.requests().len(), 7);
    assert_eq!(sim.stats().requests, 7);
}

#[test]
fn the_same_conversation_twice_reuses_the_prompt_cache() {
    let sim = sim();
    let body = json!({"messages": convo("What is a slot?"), "max_tokens": 4});
    let (_, first) = json_of(post(&sim, "/v1/chat/completions", &body));
    let (_, second) = json_of(post(&sim, "/v1/chat/completions", &body));
    let prompt = first["usage"]["prompt_tokens"].as_u64().expect("prompt_tokens");
    assert_eq!(first["timings"]["cache_n"], 0);
    assert_eq!(second["timings"]["cache_n"], prompt - 1, "one token is always re-evaluated");
    assert_eq!(second["timings"]["prompt_n"], 1);
    assert_eq!(second["usage"]["prompt_tokens"], prompt);
    assert_eq!(second["usage"]["prompt_tokens_details"]["cached_tokens"], prompt - 1);
    assert_eq!(second["usage"]["completion_tokens"], 4);
    assert_eq!(second["choices"][0]["finish_reason"], "length");

    // Turn 2 (the answer sent back plus a new question) reuses the whole of turn 1.
    let answer = first["choices"][0]["message"]["content"].clone();
    let mut messages = convo("What is a slot?");
    let turn2 = messages.as_array_mut().expect("array");
    turn2.push(json!({"role": "assistant", "content": answer}));
    turn2.push(json!({"role": "user", "content": "And a prompt cache?"}));
    let (_, third) = json_of(post(&sim, "/v1/chat/completions", &json!({"messages": turn2})));
    assert!(third["timings"]["cache_n"].as_u64() > Some(prompt), "{third}");
    assert_eq!(third["choices"][0]["finish_reason"], "stop", "default length ends as a stop");
    let stats = sim.stats();
    assert_eq!(stats.predicted_n, 4 + 4 + 8);
    assert_eq!(stats.cache_n, prompt - 1 + third["timings"]["cache_n"].as_u64().unwrap_or(0));
}

#[test]
fn a_second_conversation_on_two_slots_does_not_evict_the_first() {
    let sim = sim();
    // No shared system prompt: with one, llama-server puts B into A's slot (see cache.rs tests).
    let a = json!({"messages": [{"role": "user", "content": "Tell me about Rome."}], "max_tokens": 2});
    let b = json!({"messages": [{"role": "system", "content": "Be a poet."},
                                {"role": "user", "content": "A haiku about rain."}], "max_tokens": 2});
    json_of(post(&sim, "/v1/chat/completions", &a));
    json_of(post(&sim, "/v1/chat/completions", &b));
    let (_, again) = json_of(post(&sim, "/v1/chat/completions", &a));
    let prompt = again["usage"]["prompt_tokens"].as_u64().expect("prompt_tokens");
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
    let resp = match post(&sim, "/v1/chat/completions", &body) {
        Err(ureq::Error::Status(400, r)) => r,
        other => panic!("expected 400, got {other:?}"),
    };
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
    let resp = post(&sim, "/v1/chat/completions", &body).expect("200");
    assert_eq!(resp.content_type(), "text/event-stream");
    assert_eq!(resp.header("x-accel-buffering"), Some("no"));
    assert_eq!(resp.header("transfer-encoding"), Some("chunked"));
    let ev = events(resp);
    assert_eq!(ev.len(), 1 + 3 + 1 + 1, "{ev:?}");
    let role = parse(&ev[0]);
    assert_eq!(role["choices"][0]["delta"], json!({"role": "assistant", "content": null}));
    for token in &ev[1..4] {
        let content = &parse(token)["choices"][0]["delta"]["content"];
        assert_eq!(content.as_str().map(str::len), Some(4), "one token per event");
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
    let ev = events(post(&sim, "/v1/chat/completions", &body).expect("200"));
    assert_eq!(ev.len(), 1 + 2 + 2 + 1, "{ev:?}");
    let finish = parse(&ev[3]);
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    assert!(finish.get("timings").is_none());
    let usage = parse(&ev[4]);
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 2);
    assert_eq!(
        usage["usage"]["prompt_tokens"],
        usage["timings"]["prompt_n"].as_u64().unwrap_or(0) + usage["timings"]["cache_n"].as_u64().unwrap_or(0)
    );
    assert_eq!(ev[5], "[DONE]");
}

#[test]
fn native_completion_streams_without_done_and_v1_completions_with_it() {
    let sim = sim();
    let body = json!({"prompt": "Once upon a time", "n_predict": 2, "stream": true});
    let ev = events(post(&sim, "/completion", &body).expect("200"));
    assert_eq!(ev.len(), 3, "{ev:?}");
    assert_eq!(parse(&ev[0])["stop"], false);
    let last = parse(&ev[2]);
    assert_eq!(last["stop"], true);
    assert_eq!(last["tokens_predicted"], 2);
    assert_eq!(last["tokens_evaluated"], 4);
    assert_eq!(last["timings"]["prompt_n"], 4);
    assert!(last.get("tokens_cached").is_some());

    let body = json!({"prompt": "Once upon a time", "max_tokens": 2, "stream": true});
    let ev = events(post(&sim, "/v1/completions", &body).expect("200"));
    assert_eq!(ev.len(), 4, "{ev:?}");
    let last = parse(&ev[2]);
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert_eq!(last["usage"]["prompt_tokens_details"]["cached_tokens"], 3);
    assert_eq!(last["timings"]["cache_n"], 3);
    assert_eq!(ev[3], "[DONE]");
}

#[test]
fn streams_close_the_connection_but_plain_answers_keep_it() {
    let sim = sim();
    let mut s = raw(&sim, "GET", "/health", "");
    let mut r = BufReader::new(s.try_clone().expect("clone"));
    let mut head = String::new();
    while head.is_empty() || !head.ends_with("\r\n\r\n") {
        assert!(r.read_line(&mut head).expect("head") > 0, "closed too early");
    }
    assert!(head.contains("Keep-Alive") && !head.contains("Connection: close"), "{head}");
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
    r.read_to_string(&mut rest).expect("closed after the stream");
    assert!(rest.starts_with("HTTP/1.1 200 OK\r\n"), "{rest}");
    assert!(!rest.contains("Connection: close"));
    assert!(rest.ends_with("data: [DONE]\n\n\r\n0\r\n\r\n"), "{rest}");
}

#[test]
fn lock_step_releases_events_one_by_one() {
    let sim = sim();
    let sim_events = sim.events();
    sim.set_lockstep(true);
    let body = json!({"messages": convo("hi"), "stream": true, "max_tokens": 2}).to_string();
    let s = raw(&sim, "POST", "/v1/chat/completions", &body);
    let (tx, got) = crossbeam_channel::unbounded();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(s).lines() {
            match line {
                Ok(l) if l.starts_with("data: ") => {
                    if tx.send(l).is_err() {
                        break;
                    }
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
    });
    for i in 0..5 {
        sim.release(1);
        wait_for(&sim_events, |e| *e == SimEvent::EventSent { index: i });
        let line = got.recv_timeout(SAFETY).expect("the released event");
        assert_eq!(i == 4, line == "data: [DONE]", "event {i}: {line}");
        assert!(got.try_recv().is_err(), "only released events reach the client");
    }
    assert!(reader.join().is_ok());
}

#[test]
fn a_client_leaving_mid_stream_frees_the_slot_at_once() {
    let sim = Sim::start(SimConfig {
        slots: 1,
        ..SimConfig::default()
    });
    let sim_events = sim.events();
    sim.set_lockstep(true);
    let body = json!({"messages": convo("hi"), "stream": true, "max_tokens": 1000}).to_string();
    let s = raw(&sim, "POST", "/v1/chat/completions", &body);
    sim.release(2);
    wait_for(&sim_events, |e| *e == SimEvent::EventSent { index: 1 });
    let (_, slots) = json_of(get(&sim, "/slots?fail_on_no_slot=0"));
    assert_eq!(slots[0]["is_processing"], true);
    assert_eq!(json_of(get(&sim, "/slots?fail_on_no_slot=1")).0, 503);
    drop(s);
    sim.set_lockstep(false);
    let gone = wait_for(&sim_events, |e| matches!(e, SimEvent::ClientGone { .. }));
    assert_eq!(gone, SimEvent::ClientGone { path: "/v1/chat/completions".into() });
    assert_eq!(sim.stats().cancelled, 1);
    assert!(sim.stats().predicted_n < 1000);
    assert_eq!(json_of(get(&sim, "/slots?fail_on_no_slot=1")).0, 200);
}

#[test]
fn a_request_beyond_the_slots_waits_instead_of_failing() {
    let sim = Sim::start(SimConfig {
        slots: 1,
        ..SimConfig::default()
    });
    let sim_events = sim.events();
    sim.set_lockstep(true);
    let body = json!({"messages": convo("hi"), "stream": true, "max_tokens": 1}).to_string();
    let mut first = raw(&sim, "POST", "/v1/chat/completions", &body);
    wait_for(&sim_events, |e| matches!(e, SimEvent::Request { .. }));
    let url = sim.url();
    let second = std::thread::spawn(move || {
        let body = json!({"messages": convo("other"), "max_tokens": 1});
        send(ureq::post(&format!("{url}/v1/chat/completions")), &body).map(|r| r.status())
    });
    wait_for(&sim_events, |e| matches!(e, SimEvent::Request { .. }));
    sim.release(4);
    assert!(read_to_close(&mut first).contains("[DONE]"));
    assert!(matches!(second.join().map(|r| r.ok()), Ok(Some(200))));
}

#[test]
fn api_key_guards_everything_but_health_and_models() {
    let sim = Sim::start(SimConfig {
        api_key: Some("sekrit".into()),
        ..SimConfig::default()
    });
    let chat = json!({"messages": convo("hi"), "max_tokens": 1});
    let (status, err) = json_of(post(&sim, "/v1/chat/completions", &chat));
    assert_eq!((status, &err["error"]["type"]), (401, &json!("authentication_error")));
    assert_eq!(json_of(get(&sim, "/props")).0, 401);
    assert_eq!(json_of(get(&sim, "/health")).0, 200);
    assert_eq!(json_of(get(&sim, "/v1/models")).0, 200);
    let url = format!("{}/v1/chat/completions", sim.url());
    let bearer = ureq::post(&url).set("Authorization", "Bearer sekrit");
    assert_eq!(json_of(send(bearer, &chat)).0, 200);
    let x_api_key = ureq::post(&url).set("X-Api-Key", "sekrit");
    assert_eq!(json_of(send(x_api_key, &chat)).0, 200);
    let wrong = ureq::post(&url).set("Authorization", "Bearer nope");
    assert_eq!(json_of(send(wrong, &chat)).0, 401);
}

#[test]
fn router_mode_lists_models_with_their_status() {
    let sim = Sim::start(SimConfig {
        router_models: Some(vec![("a".into(), "loaded".into()), ("b".into(), "unloaded".into())]),
        ..SimConfig::default()
    });
    let (_, models) = json_of(get(&sim, "/models"));
    assert_eq!(models["data"][0]["id"], "a");
    assert_eq!(models["data"][0]["status"]["value"], "loaded");
    assert_eq!(models["data"][1]["status"]["value"], "unloaded");
    assert_eq!(json_of(get(&sim, "/v1/models")).1, models);
}

#[test]
fn loading_garbage_and_status_faults() {
    let sim = sim();
    sim.set_fault(Fault::Loading);
    let (status, err) = json_of(get(&sim, "/health"));
    assert_eq!((status, &err["error"]["message"]), (503, &json!("Loading model")));
    assert_eq!(json_of(get(&sim, "/v1/models")).0, 503);

    sim.set_fault(Fault::Garbage);
    let props = get(&sim, "/props").expect("200");
    assert!(serde_json::from_str::<Value>(&props.into_string().expect("body")).is_err());
    assert_eq!(json_of(get(&sim, "/health")).0, 200);

    sim.set_fault(Fault::Status(500));
    let chat = json!({"messages": convo("hi"), "stream": true});
    let (status, err) = json_of(post(&sim, "/v1/chat/completions", &chat));
    assert_eq!((status, &err["error"]["type"]), (500, &json!("server_error")));
    assert_eq!(json_of(get(&sim, "/props")).0, 200);

    sim.set_fault(Fault::None);
    let chat = json!({"messages": convo("hi")});
    assert_eq!(json_of(post(&sim, "/v1/chat/completions", &chat)).0, 200);
}

#[test]
fn hang_reads_the_request_and_never_answers() {
    let sim = sim();
    let sim_events = sim.events();
    sim.set_fault(Fault::Hang);
    let mut s = raw(&sim, "GET", "/health", "");
    wait_for(&sim_events, |e| matches!(e, SimEvent::Request { .. }));
    sim.set_fault(Fault::None);
    assert_eq!(read_to_close(&mut s), "", "closed without an answer");
    // A hung request does not keep `stop` from joining its thread.
    sim.set_fault(Fault::Hang);
    let _s = raw(&sim, "GET", "/health", "");
    wait_for(&sim_events, |e| matches!(e, SimEvent::Request { .. }));
    sim.stop();
}

#[test]
fn refuse_closes_the_port_and_none_reopens_it() {
    let sim = sim();
    let mut idle = raw(&sim, "GET", "/health", "");
    let mut buf = [0u8; 1];
    idle.read_exact(&mut buf).expect("answer");
    sim.set_fault(Fault::Refuse);
    let refused = TcpStream::connect(sim.addr()).map_err(|e| e.kind());
    assert_eq!(refused.err(), Some(std::io::ErrorKind::ConnectionRefused));
    read_to_close(&mut idle); // the open keep-alive connection was reset too
    sim.set_fault(Fault::None);
    assert_eq!(json_of(get(&sim, "/health")).0, 200);
}

#[test]
fn die_mid_stream_cuts_the_connection_after_n_events() {
    let sim = sim();
    sim.set_fault(Fault::DieMidStream { after_events: 2 });
    let body = json!({"messages": convo("hi"), "stream": true, "max_tokens": 5}).to_string();
    let mut s = raw(&sim, "POST", "/v1/chat/completions", &body);
    let got = read_to_close(&mut s);
    assert_eq!(got.matches("data: ").count(), 2, "{got}");
    assert!(!got.ends_with("0\r\n\r\n"), "no clean end of the chunked body");
}
