//! The simulator's control surface as tests use it: lock-step streams, client disconnects, waiting
//! for a slot, API keys, router mode and every `Fault`.

use super::*;

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
        assert!(
            got.try_recv().is_err(),
            "only released events reach the client"
        );
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
    assert_eq!(
        gone,
        SimEvent::ClientGone {
            path: "/v1/chat/completions".into()
        }
    );
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
        send(&format!("{url}/v1/chat/completions"), &[], &body)
            .map(|r| r.status)
            .map_err(|e| e.to_string())
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
    assert_eq!(
        (status, &err["error"]["type"]),
        (401, &json!("authentication_error"))
    );
    assert_eq!(json_of(get(&sim, "/props")).0, 401);
    assert_eq!(json_of(get(&sim, "/health")).0, 200);
    assert_eq!(json_of(get(&sim, "/v1/models")).0, 200);
    let url = format!("{}/v1/chat/completions", sim.url());
    let bearer = [("Authorization", "Bearer sekrit")];
    assert_eq!(json_of(send(&url, &bearer, &chat)).0, 200);
    let x_api_key = [("X-Api-Key", "sekrit")];
    assert_eq!(json_of(send(&url, &x_api_key, &chat)).0, 200);
    let wrong = [("Authorization", "Bearer nope")];
    assert_eq!(json_of(send(&url, &wrong, &chat)).0, 401);
}

#[test]
fn router_mode_lists_models_with_their_status() {
    let sim = Sim::start(SimConfig {
        router_models: Some(vec![
            ("a".into(), "loaded".into()),
            ("b".into(), "unloaded".into()),
        ]),
        ..SimConfig::default()
    });
    let (_, models) = json_of(get(&sim, "/models"));
    assert_eq!(models["data"][0]["id"], "a");
    assert_eq!(models["data"][0]["status"]["value"], "loaded");
    assert_eq!(models["data"][1]["status"]["value"], "unloaded");
    assert_eq!(json_of(get(&sim, "/v1/models")).1, models);
}

#[test]
fn router_mode_needs_a_model_and_loads_it_on_demand_evicting_beyond_models_max() {
    let sim = Sim::start(SimConfig {
        router_models: Some(vec![
            ("a".into(), "loaded".into()),
            ("b".into(), "unloaded".into()),
        ]),
        models_max: 1,
        ..SimConfig::default()
    });
    let events = sim.events();
    let (_, props) = json_of(get(&sim, "/props"));
    assert_eq!(props["role"], "router");
    assert_eq!(props["default_generation_settings"]["n_ctx"], 0);
    let chat = json!({"messages": convo("hi")});
    let (status, err) = json_of(post(&sim, "/v1/chat/completions", &chat));
    assert_eq!(status, 400);
    assert_eq!(
        err["error"]["message"],
        "model name is missing from the request"
    );
    // Asking a model's props loads it, as b11434 does: that is why crossbar never asks.
    let (_, props) = json_of(get(&sim, "/props?model=b"));
    assert_eq!(props["default_generation_settings"]["n_ctx"], 4096);
    let loaded = wait_for(&events, |e| matches!(e, SimEvent::Loaded { .. }));
    let evicted = vec!["a".to_string()];
    assert_eq!(
        loaded,
        SimEvent::Loaded {
            model: "b".into(),
            evicted
        }
    );
    let (_, models) = json_of(get(&sim, "/v1/models"));
    assert_eq!(models["data"][0]["status"]["value"], "unloaded");
    let chat = json!({"model": "a", "messages": convo("hi")});
    assert_eq!(json_of(post(&sim, "/v1/chat/completions", &chat)).0, 200);
    let (_, models) = json_of(get(&sim, "/v1/models"));
    assert_eq!(models["data"][0]["status"]["value"], "loaded");
}

#[test]
fn loading_garbage_and_status_faults() {
    let sim = sim();
    sim.set_fault(Fault::Loading);
    let (status, err) = json_of(get(&sim, "/health"));
    assert_eq!(
        (status, &err["error"]["message"]),
        (503, &json!("Loading model"))
    );
    assert_eq!(json_of(get(&sim, "/v1/models")).0, 503);

    sim.set_fault(Fault::Garbage);
    let props = ok(get(&sim, "/props"));
    assert!(serde_json::from_str::<Value>(&props.body).is_err());
    assert_eq!(json_of(get(&sim, "/health")).0, 200);

    sim.set_fault(Fault::Status(500));
    let chat = json!({"messages": convo("hi"), "stream": true});
    let (status, err) = json_of(post(&sim, "/v1/chat/completions", &chat));
    assert_eq!(
        (status, &err["error"]["type"]),
        (500, &json!("server_error"))
    );
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
    assert!(
        !got.ends_with("0\r\n\r\n"),
        "no clean end of the chunked body"
    );
}

#[test]
fn router_models_have_their_own_slots_and_caches() {
    let sim = Sim::start(SimConfig {
        slots: 1,
        router_models: Some(vec![
            ("a".into(), "loaded".into()),
            ("b".into(), "loaded".into()),
        ]),
        ..SimConfig::default()
    });
    let turn = |model: &str, text: &str| {
        let body = json!({"model": model, "messages": convo(text), "max_tokens": 2});
        let (status, answer) = json_of(post(&sim, "/v1/chat/completions", &body));
        assert_eq!(status, 200, "{answer}");
        let cached = answer["timings"]["cache_n"].as_u64().unwrap();
        (cached, answer["usage"]["prompt_tokens"].as_u64().unwrap())
    };
    assert_eq!(turn("a", "the first model's long conversation").0, 0);
    assert_eq!(turn("b", "another conversation on the other model").0, 0);
    // One slot each: b's turn did not take a's slot, so all of a's prompt is still cached (but
    // the one token always re-evaluated); a shared slot would give back only the system prompt.
    let (cached, prompt) = turn("a", "the first model's long conversation");
    assert_eq!(cached, prompt - 1);
}
