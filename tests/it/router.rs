//! Issue 15: a router-mode llama-server behind crossbar — two models on one box, one route per
//! model, `--models-max 1`. Requests with and without `model` reach the right model, the guard
//! uses each model's own context (never asking an unloaded model anything), `upstream` renames a
//! model on the way out, and a loading model is a state, not a failure.

use crossbar::config::Config;
use crossbar::server::Server;
use crossbar::sim::{Fault, Sim, SimConfig, SimEvent};
use serde_json::{json, Value};

use crate::support::{chat, request, temp_dir, wait_until, Harness};

/// One router box `box` with models `coder` (loaded) and `chat` (unloaded), `--models-max 1`,
/// 2 slots of 4096; routes `code` → coder, `talk` → chat, `alias` → model `qwen`, which the box
/// knows as `coder`.
fn start() -> Harness {
    start_models(
        "[hosts.box.models.coder]\nparallel = 2\n[hosts.box.models.chat]\nparallel = 2\n\
         [hosts.box.models.qwen]\nparallel = 2\nupstream = \"coder\"\n\
         [routes.code]\nhosts = [\"box\"]\nmodel = \"coder\"\n\
         [routes.talk]\nhosts = [\"box\"]\nmodel = \"chat\"\n\
         [routes.alias]\nhosts = [\"box\"]\nmodel = \"qwen\"\n",
    )
}

/// The box of [`start`] with `models_and_routes` as the rest of the config.
fn start_models(models_and_routes: &str) -> Harness {
    start_config("health_interval = \"50ms\"", models_and_routes)
}

/// A router box: `coder` loaded, `chat` unloaded, `--models-max 1`, 2 slots of 4096.
fn router_box() -> Sim {
    Sim::start(SimConfig {
        n_ctx: 8192,
        slots: 2,
        router_models: Some(vec![
            ("coder".into(), "loaded".into()),
            ("chat".into(), "unloaded".into()),
        ]),
        models_max: 1,
        ..SimConfig::default()
    })
}

/// The box of [`start`] with `top` as the top-level settings.
fn start_config(top: &str, models_and_routes: &str) -> Harness {
    let dir = temp_dir();
    let sim = router_box();
    let text = format!(
        "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ndb = {:?}\nworkers = 8\n\
         {top}\n[hosts.box]\nurl = \"{}\"\n{models_and_routes}",
        dir.join("crossbar.db"),
        sim.url()
    );
    let config = Config::from_toml(&text).unwrap_or_else(|e| panic!("{:#?}\n{text}", e.lines()));
    let h = Harness {
        server: Some(Server::start(config).unwrap()),
        sims: vec![("box".into(), sim)],
        dir,
    };
    let gw = h.server().gateway().clone();
    wait_until("the box is polled", || {
        gw.health.model_state("box", "chat").is_some()
    });
    h
}

/// Two router boxes, each with `coder` loaded and `chat` unloaded, `--models-max 1`, 2 slots;
/// routes `code` and `talk` over both, `one` first.
fn start_two() -> Harness {
    let dir = temp_dir();
    let sims = vec![
        ("one".to_string(), router_box()),
        ("two".to_string(), router_box()),
    ];
    let mut text = format!(
        "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ndb = {:?}\nworkers = 8\n\
         health_interval = \"50ms\"\n",
        dir.join("crossbar.db")
    );
    for (name, sim) in &sims {
        text.push_str(&format!(
            "[hosts.{name}]\nurl = \"{}\"\n[hosts.{name}.models.coder]\nparallel = 2\n\
             [hosts.{name}.models.chat]\nparallel = 2\n",
            sim.url()
        ));
    }
    for (route, model) in [("code", "coder"), ("talk", "chat")] {
        text.push_str(&format!(
            "[routes.{route}]\nhosts = [\"one\", \"two\"]\nmodel = \"{model}\"\n"
        ));
    }
    let config = Config::from_toml(&text).unwrap_or_else(|e| panic!("{:#?}\n{text}", e.lines()));
    let h = Harness {
        server: Some(Server::start(config).unwrap()),
        sims,
        dir,
    };
    let gw = h.server().gateway().clone();
    wait_until("both boxes are polled", || {
        ["one", "two"]
            .iter()
            .all(|b| gw.health.get(b).is_some_and(|s| s.max_instances == Some(1)))
    });
    h
}

fn without_model(first: &str) -> Value {
    without_model_turns(first, 0)
}

fn without_model_turns(first: &str, turns: usize) -> Value {
    let mut body = chat(first, turns, false);
    body.as_object_mut().unwrap().remove("model");
    body
}

/// The models the sim was asked for, in order, on `path`.
fn asked(h: &Harness, path: &str) -> Vec<String> {
    (h.sim("box").requests().into_iter())
        .filter(|r| r.method == "POST" && r.path == path)
        .map(|r| {
            let body: Value = serde_json::from_slice(&r.body).unwrap();
            body["model"].as_str().unwrap_or("-").to_string()
        })
        .collect()
}

/// A one-message chat of about `tokens` tokens as the sim counts them, naming no model.
fn long(tokens: usize) -> Value {
    let content = "word ".repeat(tokens * 4 / 5);
    json!({"messages": [{"role": "user", "content": content}], "max_tokens": 1})
}

#[test]
fn both_routes_answer_with_and_without_a_model_in_the_body_issue_15() {
    let h = start();
    let mut named = chat("fix the lexer", 1, false);
    named["model"] = json!("coder");
    for (route, body) in [
        ("code", without_model("fix the lexer")),
        ("talk", without_model("tell me a story")),
        ("code", named),
        ("alias", without_model("rename the module")),
    ] {
        let answer = h.post(&format!("/{route}/v1/chat/completions"), &body);
        assert_eq!(answer.status, 200, "{route}: {}", answer.text());
    }
    // The route's model was put in; the alias route's model went out by the box's name for it.
    assert_eq!(
        asked(&h, "/v1/chat/completions"),
        ["coder", "chat", "coder", "coder"]
    );
    let rows = h.rows();
    let models: Vec<&str> = rows.iter().map(|r| r.model.as_str()).collect();
    assert_eq!(models, ["coder", "chat", "coder", "qwen"]);
}

#[test]
fn a_model_listing_shows_the_configured_names_issue_15() {
    let h = start_models(
        "[hosts.box.models.qwen]\nparallel = 2\nupstream = \"coder\"\n\
         [hosts.box.models.chat]\nparallel = 2\n\
         [routes.alias]\nhosts = [\"box\"]\nmodel = \"qwen\"\n",
    );
    let gw = h.server().gateway().clone();
    assert!(
        gw.health.is_loaded("box", "qwen"),
        "matched by its upstream name"
    );
    let listing = h.get("/alias/v1/models");
    assert_eq!(listing.status, 200, "{}", listing.text());
    let ids: Vec<String> = (listing.json()["data"].as_array().unwrap().iter())
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, ["qwen", "chat"]);
    let answer = h.post("/alias/v1/chat/completions", &without_model("hello"));
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(asked(&h, "/v1/chat/completions"), ["coder"]);
}

#[test]
fn a_load_slower_than_first_byte_timeout_does_not_mark_the_router_down_issue_15() {
    let h = start_config(
        // One failure in a row is a streak here (issue 24's `health_fall`).
        "health_interval = \"1h\"\nfirst_byte_timeout = \"200ms\"\nhealth_fall = 1",
        "[hosts.box.models.coder]\nparallel = 2\n[hosts.box.models.chat]\nparallel = 2\n\
         [routes.code]\nhosts = [\"box\"]\nmodel = \"coder\"\n\
         [routes.talk]\nhosts = [\"box\"]\nmodel = \"chat\"\n",
    );
    let gw = h.server().gateway().clone();
    // Nothing answers in time; `chat` was not loaded, so that is a load, not a dead host.
    h.sim("box").set_fault(Fault::Hang);
    let slow = h.post("/talk/v1/chat/completions", &without_model("a poem"));
    assert_eq!(slow.status, 502, "{}", slow.text());
    assert!(gw.health.healthy("box"));
    // The same silence from the loaded model is the host's failure.
    let dead = h.post("/code/v1/chat/completions", &without_model("a lexer"));
    assert_eq!(dead.status, 502, "{}", dead.text());
    assert!(!gw.health.healthy("box"));
    h.sim("box").set_fault(Fault::None);
}

#[test]
fn a_swap_between_turns_is_seen_and_the_next_turn_is_cold_issue_15() {
    let h = start();
    let gw = h.server().gateway().clone();
    for turns in 0..2 {
        let answer = h.post(
            "/code/v1/chat/completions",
            &without_model_turns("lexer", turns),
        );
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    // The other route loads `chat`; with --models-max 1 that evicts `coder` and its cache.
    let answer = h.post("/talk/v1/chat/completions", &without_model("a poem"));
    assert_eq!(answer.status, 200, "{}", answer.text());
    wait_until("the poll sees coder unloaded", || {
        gw.health.unloads("box", "coder") == 1
    });
    let answer = h.post(
        "/code/v1/chat/completions",
        &without_model_turns("lexer", 2),
    );
    assert_eq!(answer.header("X-Crossbar-Lease"), Some("reused"));
    let row = h.rows().pop().unwrap();
    assert_eq!(row.cached_tokens, Some(0), "{row:?}");
}

#[test]
fn a_new_conversation_of_an_unloaded_model_goes_where_loading_it_evicts_nothing_busy_issue_15() {
    let h = start_two();
    let gw = h.server().gateway().clone();
    // `one` is busy with a coder stream; loading chat there would evict it.
    h.sim("one").set_lockstep(true);
    let mut body = without_model("stream me a parser");
    body["stream"] = json!(true);
    let mut stream = h.open_chat("/code/v1/chat/completions", &body);
    wait_until("the coder stream holds a slot on one", || {
        gw.limiter.in_flight("one", "coder") == 1
    });
    let talk = h.post("/talk/v1/chat/completions", &without_model("a poem"));
    assert_eq!(talk.status, 200, "{}", talk.text());
    assert_eq!(talk.header("X-Crossbar-Host"), Some("two"));
    h.sim("one").set_lockstep(false);
    assert_eq!(stream.read_answer().status, 200);
}

#[test]
fn two_routes_alternating_turns_settle_on_a_box_each_instead_of_swapping_issue_15() {
    let h = start_two();
    let loads: Vec<_> = h.sims.iter().map(|(_, sim)| sim.events()).collect();
    for turn in 0..3 {
        let code = h.post(
            "/code/v1/chat/completions",
            &without_model_turns("lexer", turn),
        );
        let talk = h.post(
            "/talk/v1/chat/completions",
            &without_model_turns("poem", turn),
        );
        assert_eq!(
            code.header("X-Crossbar-Host"),
            Some("one"),
            "{}",
            code.text()
        );
        // `one` holds the coder conversation: loading chat there would wipe its cache.
        assert_eq!(
            talk.header("X-Crossbar-Host"),
            Some("two"),
            "{}",
            talk.text()
        );
    }
    let loaded: Vec<Vec<_>> = (loads.iter())
        .map(|events| {
            events
                .try_iter()
                .filter(|e| matches!(e, SimEvent::Loaded { .. }))
                .collect()
        })
        .collect();
    assert_eq!(loaded[0].len(), 0, "one never swapped: {loaded:?}");
    assert_eq!(loaded[1].len(), 1, "two loaded chat once: {loaded:?}");
    // Every later turn found its cache.
    let cold: Vec<_> = (h.rows().into_iter().skip(2))
        .filter(|r| r.cached_tokens == Some(0))
        .collect();
    assert!(cold.is_empty(), "{cold:#?}");
}

#[test]
fn the_guard_uses_each_models_context_and_never_asks_an_unloaded_model_issue_15() {
    let h = start();
    let gw = h.server().gateway().clone();
    // The router's own /props says n_ctx 0; each model's context comes from its command line.
    assert_eq!(gw.health.per_slot_ctx("box"), None);
    assert_eq!(gw.health.ctx_for("box", "chat"), Some(4096));
    assert_eq!(gw.health.ctx_for("box", "qwen"), Some(4096));

    // Over the estimate, under the real count: `chat` is unloaded, so crossbar does not ask (that
    // would load it) and judges on the estimate: refused, without an exact count.
    let body = long(4000);
    let refused = h.post("/talk/v1/chat/completions", &body);
    assert_eq!(refused.status, 400, "{}", refused.text());
    assert!(refused.json().get("exact").is_none(), "{}", refused.text());
    assert!(asked(&h, "/v1/chat/completions/input_tokens").is_empty());
    assert_eq!(
        gw.health.model_state("box", "chat").as_deref(),
        Some("unloaded")
    );

    // `coder` is loaded: crossbar asks, naming the model, and the prompt goes through.
    let answer = h.post("/code/v1/chat/completions", &body);
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(asked(&h, "/v1/chat/completions/input_tokens"), ["coder"]);
    let row = h.rows().pop().unwrap();
    assert!(row.ctx_exact.is_some_and(|n| n < 4096), "{row:?}");

    // Too big for the model's slot even counted exactly.
    let answer = h.post("/code/v1/chat/completions", &long(5000));
    assert_eq!(answer.status, 400, "{}", answer.text());
    assert_eq!(answer.error()["max"], 4096);
}

#[test]
fn a_loading_model_is_a_state_on_the_admin_api_not_a_host_down_issue_15() {
    let h = start();
    let gw = h.server().gateway().clone();
    h.sim("box").set_model_status("chat", "loading");
    wait_until("the poll sees chat loading", || {
        gw.health.model_state("box", "chat").as_deref() == Some("loading")
    });
    assert!(gw.health.healthy("box"));
    let admin = h.server().admin_addr();
    let status = request(admin, "GET", "/admin/status", &[], b"").json();
    let models = status["hosts"][0]["models"].as_array().unwrap().clone();
    let chat = models.iter().find(|m| m["model"] == "chat").unwrap();
    assert_eq!(
        (&chat["state"], &chat["per_slot_ctx"]),
        (&json!("loading"), &json!(4096)),
        "{status:#}"
    );
    let page = request(admin, "GET", "/", &[], b"").text();
    assert!(page.contains("chat loading (ctx 4096)"), "{page}");
}

#[test]
fn crossbar_status_shows_a_routers_models_and_their_context_issue_15() {
    let h = start();
    let admin = format!("http://{}", h.server().admin_addr());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_crossbar"))
        .current_dir(&h.dir)
        .args(["--admin", admin.as_str(), "status"])
        .output()
        .expect("the crossbar binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout} {out:?}");
    let line = stdout.lines().find(|l| l.starts_with("box")).unwrap();
    for shown in ["4096", "chat:unloaded", "coder:loaded", "qwen:loaded"] {
        assert!(line.contains(shown), "{shown}: {stdout}");
    }
}
