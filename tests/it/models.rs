//! Requests for models the config does not list: refused before any state is kept for them; and
//! a host's own name for a configured model, which is that model (issue 27).

use crossbar::config::Config;
use crossbar::server::Server;
use crossbar::sim::{Sim, SimConfig};

use crate::support::{chat, host, request, temp_dir, wait_until, Harness};

const CHAT: &str = "/projA/v1/chat/completions";

/// What a client can make crossbar remember: limiter slots, leases (and pins), stored lease rows,
/// and the `/metrics` lines.
fn footprint(h: &Harness) -> (usize, usize, usize, usize) {
    let gw = h.server().gateway();
    let metrics = request(h.server().admin_addr(), "GET", "/metrics", &[], &[]).text();
    (
        gw.limiter.snapshot().len(),
        gw.leases.snapshot().len() + gw.leases.pins().len(),
        h.db().list_leases().unwrap().len(),
        metrics.lines().count(),
    )
}

/// Review finding: a pin returned its host without checking the model, so every made-up model
/// name got a limiter slot, a lease row and metric series, forever.
#[test]
fn cycling_model_names_on_a_pinned_route_keeps_nothing_and_answers_model_not_found() {
    let h = Harness::start(vec![host("titan", 1), host("mini", 1)], "");
    let gw = h.server().gateway().clone();
    gw.leases.pin("projA", "mini", 0).unwrap();
    // A good request and a refused one first, so the per-route series they add exist already.
    assert_eq!(h.post(CHAT, &chat("hello", 0, false)).status, 200);
    let mut body = chat("hello", 0, false);
    body["model"] = "made-up".into();
    assert_eq!(h.post(CHAT, &body).status, 404);
    let before = footprint(&h);
    let chats_before = h.sim("mini").requests().len();

    for i in 0..50 {
        let mut body = chat("hello", 0, false);
        body["model"] = format!("made-up-{i}").into();
        let answer = h.post(CHAT, &body);
        // Issue 13 (spec §2): 404 naming the model and what the route serves, not a 503.
        assert_eq!(answer.status, 404, "{}", answer.text());
        let json = answer.error();
        assert_eq!(json["code"], "model_not_found");
        assert_eq!(json["model"], format!("made-up-{i}"));
        assert_eq!(json["served"], serde_json::json!(["m"]), "{json}");
        assert!(answer.header("Retry-After").is_none());
    }

    assert_eq!(
        footprint(&h),
        before,
        "(slots, leases, lease rows, metric lines)"
    );
    let metrics = request(h.server().admin_addr(), "GET", "/metrics", &[], &[]).text();
    assert!(!metrics.contains("made-up"), "{metrics}");
    assert_eq!(
        h.sim("mini").requests().len(),
        chats_before,
        "nothing forwarded"
    );
    let refused = h
        .rows()
        .into_iter()
        .filter(|r| r.model.starts_with("made-up"))
        .collect::<Vec<_>>();
    assert_eq!(refused.len(), 51, "one accounting row each");
    assert!(refused.iter().all(|r| r.status == 404 && r.host.is_empty()));
}

/// Issue 13 (review): the model of a refused request went whole into the 404 (twice: `model` and
/// the hint), the accounting row and the log line, so one 16 MiB body named a 16 MiB model in the
/// db. What crossbar keeps or echoes of a name it refuses is bounded, and cut on a char boundary.
#[test]
fn a_megabyte_model_name_is_refused_without_being_stored_or_echoed_whole() {
    let h = Harness::start(vec![host("titan", 1)], "");
    let mut body = chat("hello", 0, false);
    body["model"] = "é".repeat(512 * 1024).into();
    let answer = h.post(CHAT, &body);
    assert_eq!(answer.status, 404, "{}", answer.text());
    assert!(answer.body.len() < 4096, "{} bytes", answer.body.len());
    let json = answer.error();
    assert_eq!(json["code"], "model_not_found");
    let shown = json["model"].as_str().unwrap();
    assert!(shown.starts_with("éé") && shown.len() < 1024, "{shown}");
    // An unpinned route names what its candidates serve, as a pinned one does.
    assert_eq!(json["served"], serde_json::json!(["m"]), "{json}");
    let rows = h.rows();
    let row = rows.last().unwrap();
    assert_eq!(row.status, 404);
    assert!(row.model.starts_with("éé") && row.model.len() < 1024);
}

/// Sims `titan` and `mini`, both started with `-a qwen`; `models_and_routes` is the rest of the
/// config (models per host and the routes). Starts once both are polled.
fn start_aliased(models_and_routes: &str) -> Harness {
    let dir = temp_dir();
    let sim = || {
        Sim::start(SimConfig {
            alias: "qwen".into(),
            ..SimConfig::default()
        })
    };
    let sims = vec![("titan".to_string(), sim()), ("mini".to_string(), sim())];
    let text = format!(
        "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ndb = {:?}\nworkers = 8\n\
         health_interval = \"1s\"\n[hosts.titan]\nurl = \"{}\"\nslot_prompt_similarity = 0.1\nram_cache = false\n[hosts.mini]\nurl = \"{}\"\nslot_prompt_similarity = 0.1\nram_cache = false\n\
         {models_and_routes}",
        dir.join("crossbar.db"),
        sims[0].1.url(),
        sims[1].1.url()
    );
    let config = Config::from_toml(&text).unwrap_or_else(|e| panic!("{:#?}\n{text}", e.lines()));
    let h = Harness {
        server: Some(Server::start(config).unwrap()),
        sims,
        dir,
    };
    let gw = h.server().gateway().clone();
    wait_until("both hosts are polled", || {
        ["titan", "mini"]
            .iter()
            .all(|name| gw.health.get(name).is_some_and(|s| !s.loaded.is_empty()))
    });
    h
}

/// One turn of the conversation `first` naming `model`: its host and `new|reused`.
#[track_caller]
fn turn_as(h: &Harness, model: &str, first: &str, turns: usize) -> (String, String) {
    let mut body = chat(first, turns, false);
    body["model"] = model.into();
    let answer = h.post(CHAT, &body);
    assert_eq!(answer.status, 200, "{model}: {}", answer.text());
    let header = |name| answer.header(name).unwrap_or("").to_string();
    (header("X-Crossbar-Host"), header("X-Crossbar-Lease"))
}

/// The `model` of every chat body `name` was sent.
fn models_sent(h: &Harness, name: &str) -> Vec<String> {
    (h.sim(name).requests().iter())
        .filter(|r| r.method == "POST" && r.path == "/v1/chat/completions")
        .filter_map(|r| serde_json::from_slice::<serde_json::Value>(&r.body).ok())
        .map(|body| body["model"].as_str().unwrap_or("-").to_string())
        .collect()
}

/// Issue 27: a box started with `-a qwen` lists `qwen`, the route's model is `qwen-coder`. A
/// client that named what the listing showed got 404, and one whose turns mixed the names would
/// have been two conversations: the host's name is the configured model, one lease throughout.
#[test]
fn issue27_a_hosts_own_name_for_the_model_is_the_configured_model_one_conversation() {
    let h = start_aliased(
        "[hosts.titan.models.qwen-coder]\n[hosts.mini.models.qwen-coder]\n\
         upstream = \"Qwen/Qwen2.5-Coder-7B\"\n\
         [routes.projA]\nhosts = [\"titan\", \"mini\"]\nmodel = \"qwen-coder\"\n",
    );
    let (host, lease) = turn_as(&h, "qwen", "which name?", 0);
    assert_eq!(lease, "new");
    for (i, model) in ["qwen-coder", "qwen", "Qwen/Qwen2.5-Coder-7B"]
        .iter()
        .enumerate()
    {
        assert_eq!(
            turn_as(&h, model, "which name?", i + 1),
            (host.clone(), "reused".to_string()),
            "turn {} naming {model}",
            i + 2
        );
    }
    let leases = h.server().gateway().leases.snapshot();
    assert_eq!(leases.len(), 1, "{leases:#?}");
    assert_eq!(leases[0].key.model, "qwen-coder");
    let rows = h.rows();
    assert_eq!(rows.len(), 4, "{rows:#?}");
    assert!(
        rows.iter()
            .all(|r| r.model == "qwen-coder" && r.status == 200),
        "{rows:#?}"
    );
    // The host gets its own name for the model, as for a body naming the configured one.
    let want = if host == "mini" {
        "Qwen/Qwen2.5-Coder-7B"
    } else {
        "qwen-coder"
    };
    assert_eq!(models_sent(&h, &host), [want; 4]);
}

/// Issue 27: a name the hosts of a route give two configured models names neither: 404
/// model_not_found with what the route serves, and nothing kept for it.
#[test]
fn issue27_a_name_two_configured_models_answer_to_is_model_not_found() {
    let h = start_aliased(
        "[hosts.titan.models.a]\n[hosts.mini.models.b]\n\
         [routes.projA]\nhosts = [\"titan\", \"mini\"]\nmodel = \"a\"\n\
         [routes.onlyb]\nhosts = [\"mini\"]\nmodel = \"b\"\n",
    );
    let mut body = chat("hello", 0, false);
    body["model"] = "qwen".into();
    let answer = h.post(CHAT, &body);
    assert_eq!(answer.status, 404, "{}", answer.text());
    let error = answer.error();
    assert_eq!(error["code"], "model_not_found");
    assert_eq!(error["served"], serde_json::json!(["a", "b"]), "{error}");
    assert!(h.server().gateway().leases.snapshot().is_empty());
    // On a route with one of them, the name is that one.
    let answer = h.post("/onlyb/v1/chat/completions", &body);
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(h.rows().pop().unwrap().model, "b");
}
