//! The context guard and the health/lease background end to end (issue 4): conversations that
//! outgrow a host, prompts that fit nowhere, hosts whose context is unknown, dead and recovering
//! hosts, the health poller's reasons on the admin API, and the idle sweep.

use crossbar::config::Config;
use crossbar::health::Poll;
use crossbar::server::Server;
use crossbar::sim::{Fault, Sim, SimConfig};
use crossbar::store::{LeaseEvent, Reason};
use serde_json::{json, Value};

use crate::support::{self, chat, request, temp_dir, wait_until, Answer, Harness};

const CHAT: &str = "/projA/v1/chat/completions";

/// One simulated host: a sim with `n_ctx` total context over `slots` slots (so `n_ctx / slots`
/// per slot), served as model `m` with `parallel = slots`, started with `fault` in force.
struct SimHost {
    name: &'static str,
    n_ctx: u64,
    slots: usize,
    fault: Fault,
}

fn sim_host(name: &'static str, n_ctx: u64, slots: usize) -> SimHost {
    SimHost {
        name,
        n_ctx,
        slots,
        fault: Fault::None,
    }
}

/// Starts the sims (faults already in force, so the first poll sees them), then a crossbar with
/// route `projA` over the hosts in the given order and `extra` top-level config lines.
fn start(hosts: Vec<SimHost>, extra: &str) -> Harness {
    let dir = temp_dir();
    let mut text = format!(
        "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ndb = {:?}\nworkers = 8\n{extra}\n",
        dir.join("crossbar.db")
    );
    let mut sims = Vec::new();
    for spec in &hosts {
        let sim = Sim::start(SimConfig {
            n_ctx: spec.n_ctx,
            slots: spec.slots,
            ..SimConfig::default()
        });
        sim.set_fault(spec.fault);
        text.push_str(&format!(
            "[hosts.{name}]\nurl = \"{}\"\nslot_prompt_similarity = 0.1\nram_cache = false\n[hosts.{name}.models.m]\nparallel = {}\n",
            sim.url(),
            spec.slots,
            name = spec.name
        ));
        sims.push((spec.name.to_string(), sim));
    }
    let names: Vec<String> = hosts.iter().map(|h| format!("{:?}", h.name)).collect();
    text.push_str(&format!(
        "[routes.projA]\nhosts = [{}]\nmodel = \"m\"\n",
        names.join(", ")
    ));
    let config = Config::from_toml(&text).unwrap_or_else(|e| panic!("{:#?}\n{text}", e.lines()));
    Harness {
        server: Some(Server::start(config).unwrap()),
        sims,
        dir,
    }
}

/// Waits until every named host has been polled up: healthy, context known, model loaded.
#[track_caller]
fn wait_ready(h: &Harness, hosts: &[&str]) {
    let gw = h.server().gateway().clone();
    for host in hosts {
        wait_until(&format!("{host} polled up"), || {
            gw.health.healthy(host)
                && gw.health.per_slot_ctx(host).is_some()
                && gw.health.is_loaded(host, "m")
        });
    }
}

/// The guard's estimate of a body as crossbar receives it: bytes / 4 × 1.2 tokens.
fn estimate(body: &Value) -> u64 {
    (body.to_string().len() as f64 / 4.0 * 1.2) as u64
}

/// A later turn of the conversation that `chat(first, 1, false)` began, in which the user pastes
/// `paste` bytes of text.
fn turn(first: &str, paste: usize, follow_ups: usize) -> Value {
    let mut body = chat(first, 1, false);
    let text = "fn parse(input: &str) -> Result<Ast, Error> { todo!() }\n".repeat(paste / 56 + 1)
        [..paste]
        .to_string();
    let messages = body["messages"].as_array_mut().unwrap();
    messages.push(json!({"role": "assistant", "content": "Please paste the file."}));
    messages.push(json!({"role": "user", "content": text}));
    for i in 0..follow_ups {
        messages.push(json!({"role": "assistant", "content": format!("reading part {i}")}));
        messages.push(json!({"role": "user", "content": format!("and part {i}?")}));
    }
    body
}

/// The prompt tokens a sim counts for a chat body, asked directly.
pub fn sim_count(sim: &Sim, body: &Value) -> u64 {
    let path = "/v1/chat/completions/input_tokens";
    let answer = request(sim.addr(), "POST", path, &[], body.to_string().as_bytes());
    assert_eq!(answer.status, 200, "{}", answer.text());
    answer.json()["input_tokens"].as_u64().unwrap()
}

fn events(h: &Harness, reason: Reason) -> Vec<LeaseEvent> {
    let all = h.db().recent_events(1000).unwrap();
    all.into_iter().filter(|e| e.reason == reason).collect()
}

/// Inference requests a sim received (health polls are GETs, token counts another path).
pub fn chats(sim: &Sim) -> usize {
    sim.requests()
        .iter()
        .filter(|r| r.path == "/v1/chat/completions")
        .count()
}

#[track_caller]
fn check_answer(answer: &Answer, host: &str, lease: &str, ctx: Option<&str>) {
    let seen = format!("{:?} {}", answer.headers, answer.text());
    assert_eq!(answer.status, 200, "{seen}");
    assert_eq!(answer.header("X-Crossbar-Host"), Some(host), "{seen}");
    assert_eq!(answer.header("X-Crossbar-Lease"), Some(lease), "{seen}");
    assert_eq!(answer.header("X-Crossbar-Ctx"), ctx, "{seen}");
}

#[test]
fn a_conversation_that_outgrows_the_small_host_moves_to_the_big_one_and_stays() {
    // Same slots, both loaded: the tie goes to `small`, first in the route.
    let h = start(
        vec![sim_host("small", 1024, 1), sim_host("big", 65536, 1)],
        "health_interval = \"1h\"",
    );
    wait_ready(&h, &["small", "big"]);
    let first = "help me write a parser";
    check_answer(&h.post(CHAT, &chat(first, 0, false)), "small", "new", None);
    check_answer(
        &h.post(CHAT, &chat(first, 1, false)),
        "small",
        "reused",
        None,
    );

    let long = turn(first, 5000, 0);
    assert!(
        (1024..65536).contains(&estimate(&long)),
        "{}",
        estimate(&long)
    );
    let moved = h.post(CHAT, &long);
    // The cache on `big` is cold: the move is a new lease there, not a reused one.
    check_answer(&moved, "big", "new", Some("moved:small>big"));
    let ctx = events(&h, Reason::Ctx);
    assert_eq!(ctx.len(), 1, "{ctx:#?}");
    assert_eq!(
        (ctx[0].from_host.as_str(), ctx[0].to_host.as_str()),
        ("small", "big")
    );
    assert_eq!(
        chats(h.sim("small")),
        2,
        "the long turn never reached small"
    );

    let next = turn(first, 5000, 1);
    check_answer(&h.post(CHAT, &next), "big", "reused", None);
    let leases = h.server().gateway().leases.snapshot();
    assert_eq!(leases.len(), 1, "{leases:#?}");
    assert_eq!(leases[0].host, "big");
    let hosts: Vec<String> = h.rows().into_iter().map(|r| r.host).collect();
    assert_eq!(hosts, ["small", "small", "big", "big"]);
}

#[test]
fn a_prompt_bigger_than_every_host_is_refused_with_the_estimate_and_the_largest_slot() {
    let h = start(
        vec![sim_host("small", 1024, 1), sim_host("mid", 8192, 2)],
        "health_interval = \"1h\"",
    );
    wait_ready(&h, &["small", "mid"]);
    let body = turn("summarise this log", 20_000, 0);
    let want = estimate(&body);
    assert!(want > 4096, "{want}");
    let answer = h.post(CHAT, &body);
    assert_eq!(answer.status, 400, "{}", answer.text());
    // The host's own count, as the sim counts a prompt (issue 11).
    let exact = sim_count(h.sim("small"), &body);
    assert!((4096..want).contains(&exact), "{exact} {want}");
    assert_eq!(
        answer.error_fields(),
        json!({"code": "prompt too large", "estimate": want, "exact": exact, "max": 4096})
    );
    assert!(answer.header("X-Crossbar-Ctx").is_none());
    let rows = h.rows();
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert_eq!(rows[0].status, 400);
    assert_eq!(rows[0].err, "prompt too large");
    assert_eq!(
        (rows[0].ctx_est, rows[0].ctx_exact),
        (Some(want as i64), Some(exact as i64))
    );
    for (name, sim) in &h.sims {
        assert_eq!(chats(sim), 0, "{name} saw the prompt");
    }
    let gw = h.server().gateway();
    assert!(gw.health.healthy("small") && gw.health.healthy("mid"));
}

#[test]
fn a_host_whose_context_is_unknown_lets_every_prompt_through() {
    // The sim always reports `n_ctx`, and the poller polls at once when crossbar starts, so "never
    // learned" cannot be timed honestly. What an older llama-server without `n_ctx` in `/props`
    // yields is a good poll with `per_slot_ctx: None` (parse_props' tests cover that parsing): with
    // polls an hour apart, the test applies exactly that poll after the first real one.
    let h = start(
        vec![sim_host("mystery", 65536, 1), sim_host("small", 1024, 1)],
        "health_interval = \"1h\"",
    );
    wait_ready(&h, &["mystery", "small"]);
    let gw = h.server().gateway().clone();
    let polled = gw.health.get("mystery").unwrap();
    let old_build = Poll::Up {
        per_slot_ctx: None,
        total_slots: polled.total_slots,
        loaded: polled.loaded.clone(),
        router: false,
        models: Vec::new(),
        max_instances: None,
        build: None,
        ctx_train: None,
    };
    gw.health.apply("mystery", old_build, polled.last_poll);
    assert_eq!(gw.health.per_slot_ctx("mystery"), None);

    // Bigger than the known `small` slot, so the guard would act had it a number to act on.
    let body = turn("review this module", 8000, 0);
    assert!(estimate(&body) > 1024, "{}", estimate(&body));
    let answer = h.post(CHAT, &body);
    check_answer(&answer, "mystery", "new", None);
    assert_eq!(chats(h.sim("mystery")), 1);
    assert!(events(&h, Reason::Ctx).is_empty());
    assert_eq!(h.rows()[0].status, 200);
}

#[test]
fn a_lease_leaves_a_dead_host_and_does_not_come_back_when_it_recovers() {
    let h = start(
        vec![sim_host("titan", 8192, 1), sim_host("mini", 8192, 1)],
        "health_interval = \"300ms\"",
    );
    wait_ready(&h, &["titan", "mini"]);
    let gw = h.server().gateway().clone();
    let first = "port the tokenizer";
    check_answer(&h.post(CHAT, &chat(first, 0, false)), "titan", "new", None);

    h.sim("titan").set_fault(Fault::Refuse);
    wait_until("titan is down", || !gw.health.healthy("titan"));
    check_answer(&h.post(CHAT, &chat(first, 1, false)), "mini", "new", None);
    let moved = events(&h, Reason::Unhealthy);
    assert_eq!(moved.len(), 1, "{moved:#?}");
    assert_eq!(
        (moved[0].from_host.as_str(), moved[0].to_host.as_str()),
        ("titan", "mini")
    );

    h.sim("titan").set_fault(Fault::None);
    wait_until("titan is up again", || gw.health.healthy("titan"));
    check_answer(
        &h.post(CHAT, &chat(first, 2, false)),
        "mini",
        "reused",
        None,
    );
    assert_eq!(events(&h, Reason::Unhealthy).len(), 1);
    assert_eq!(chats(h.sim("titan")), 1);
}

#[test]
fn the_poller_marks_loading_and_garbage_hosts_down_and_traffic_avoids_them() {
    let mut loading = sim_host("loading", 8192, 4);
    loading.fault = Fault::Loading;
    let mut garbage = sim_host("garbage", 8192, 4);
    garbage.fault = Fault::Garbage;
    // The bad hosts come first and have more slots: only health keeps traffic off them.
    let h = start(
        vec![loading, garbage, sim_host("good", 8192, 1)],
        "health_interval = \"300ms\"",
    );
    let gw = h.server().gateway().clone();
    wait_ready(&h, &["good"]);
    let down = |host: &str, kind| {
        gw.health
            .get(host)
            .and_then(|s| s.reason)
            .is_some_and(|r| r.kind() == kind)
    };
    wait_until("loading is down", || down("loading", "loading"));
    wait_until("garbage is down", || down("garbage", "bad answer"));

    let admin = h.server().admin_addr();
    let status = request(admin, "GET", "/admin/status", &[], b"");
    assert_eq!(status.status, 200, "{}", status.text());
    let status = status.json();
    let host = |name: &str| -> Value {
        let hosts = status["hosts"].as_array().unwrap();
        hosts.iter().find(|h| h["name"] == name).unwrap().clone()
    };
    let seen = |name: &str| (host(name)["healthy"].clone(), host(name)["reason"].clone());
    assert_eq!(
        seen("loading"),
        (json!(false), json!("503 from /health: loading")),
        "{status:#}"
    );
    assert_eq!(
        seen("garbage"),
        (json!(false), json!("bad answer from /props: invalid JSON")),
        "{status:#}"
    );
    assert_eq!(seen("good"), (json!(true), Value::Null), "{status:#}");
    assert_eq!(host("good")["per_slot_ctx"], 8192);

    for topic in ["lexer", "parser", "checker"] {
        check_answer(&h.post(CHAT, &chat(topic, 0, false)), "good", "new", None);
    }
    assert_eq!(chats(h.sim("loading")) + chats(h.sim("garbage")), 0);
}

#[test]
fn an_idle_lease_is_swept_and_the_next_turn_gets_a_new_one() {
    let h = start(
        vec![sim_host("titan", 8192, 1)],
        "health_interval = \"1h\"\nlease_idle = \"300ms\"",
    );
    let gw = h.server().gateway().clone();
    let first = "explain the borrow checker";
    check_answer(&h.post(CHAT, &chat(first, 0, false)), "titan", "new", None);
    assert_eq!(gw.leases.snapshot().len(), 1);
    wait_until("the lease is swept", || gw.leases.snapshot().is_empty());
    let idle = events(&h, Reason::Idle);
    assert_eq!(idle.len(), 1, "{idle:#?}");
    assert_eq!(
        (idle[0].from_host.as_str(), idle[0].to_host.as_str()),
        ("titan", "")
    );
    check_answer(&h.post(CHAT, &chat(first, 1, false)), "titan", "new", None);
}

#[test]
fn a_pinned_host_that_is_down_answers_503_pinned_host_down() {
    let h = Harness::start(
        vec![support::host("titan", 1), support::host("mini", 1)],
        "",
    );
    let gw = h.server().gateway().clone();
    gw.leases.pin("projA", "mini", 0).unwrap();
    // The box dies; the health poller notices it (no request has to fail first).
    h.sim("mini").set_fault(Fault::Refuse);
    wait_until("mini is polled down", || !gw.health.healthy("mini"));
    let refused = h.post(CHAT, &chat("hello", 0, false));
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(refused.error()["code"], "pinned host down");
    assert!(refused.header("Retry-After").is_some());
    assert_eq!(refused.error()["host"], "mini");
    // Back up: the pin holds and the route is served by mini again, never by titan.
    h.sim("mini").set_fault(Fault::None);
    wait_until("mini is polled up", || gw.health.healthy("mini"));
    assert_eq!(
        h.post(CHAT, &chat("hello", 0, false))
            .header("X-Crossbar-Host"),
        Some("mini")
    );
}
