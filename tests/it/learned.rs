//! Issue 47: a host needs only its `url`. crossbar reads its slots from `/props`, learns what no
//! endpoint says (slot similarity, the RAM cache) by probing it at first contact, pins an
//! `exclusive` host's slots until it sees a task it did not start, forgets what a restarted host
//! held, and warns where a configured value and the host disagree.

use crossbar::sim::SimConfig;
use serde_json::Value;

use crate::support::{chat, request, wait_until, Conn, Harness, HostSpec, LEARNED};

const CHAT: &str = "/projA/v1/chat/completions";

/// Health polls `host` has answered.
fn polls(h: &Harness, host: &str) -> usize {
    (h.sim(host).requests().iter())
        .filter(|r| r.path == "/health")
        .count()
}

fn url_only(name: &'static str, sim: SimConfig, config: &'static str) -> HostSpec {
    HostSpec {
        name,
        sim,
        parallel: 0,
        weight: 1,
        config,
    }
}

#[test]
fn a_host_given_only_its_url_serves_with_the_slots_it_reports_issue_47() {
    let sim = SimConfig {
        slots: 3,
        ..SimConfig::default()
    };
    let h = Harness::start(vec![url_only("box", sim, "")], "");
    let gw = h.server().gateway().clone();
    wait_until("the host's three slots are its seats", || {
        gw.limiter.load("box", "m").parallel == 3
    });
    let answer = h.post(CHAT, &chat("hello", 0, false));
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("X-Crossbar-Host"), Some("box"));
}

/// llama-server's automatic `-np` (no `-np`, `-c 0`) runs four slots sharing one KV cache, each
/// reporting all of it; `/props` does not say so. crossbar counts the pool once where a host looks
/// like that, and says it guessed; `kv_tokens` overrides, and an explicit `-np 4` (each slot a
/// quarter) is counted as four slots.
#[test]
fn the_kv_cache_of_llama_servers_automatic_slots_is_a_guess_said_in_the_status_issue_47() {
    let sim = |unified_kv| SimConfig {
        slots: 4,
        n_ctx: 8192,
        unified_kv,
        ..SimConfig::default()
    };
    let h = Harness::start(
        vec![
            url_only("auto", sim(true), ""),
            url_only("set", sim(true), "kv_tokens = 4096"),
            url_only("four", sim(false), ""),
        ],
        "",
    );
    let gw = h.server().gateway().clone();
    wait_until("every host's slots read", || {
        ["auto", "set", "four"]
            .iter()
            .all(|host| gw.limiter.load(host, "m").parallel == 4)
    });
    assert_eq!(gw.held("auto", "m").1, 8192, "the pool once, not 4 x 8192");
    assert_eq!(gw.held("set", "m").1, 4096, "kv_tokens wins");
    assert_eq!(gw.held("four", "m").1, 8192, "4 slots of 2048");
    wait_until("the guess noted", || !gw.host_notes("auto").is_empty());
    let notes = gw.host_notes("auto").join(" ");
    assert!(notes.contains("kv cache guessed"), "{notes}");
    assert!(notes.contains("hosts.auto.kv_tokens"), "{notes}");
    let quiet = |host| !gw.host_notes(host).iter().any(|n| n.contains("kv cache"));
    assert!(quiet("set") && quiet("four"));
    let status = request(h.server().admin_addr(), "GET", "/admin/status", &[], b"");
    assert!(
        status.text().contains("kv cache guessed"),
        "{}",
        status.text()
    );
}

/// A crossbar restarted beside a warm host probes it again. With similarity off llama-server
/// saves nothing a slot asked for by id displaces, so the probe's pinned steps would lose the
/// last turn of a conversation not yet copied to RAM; its first step, left to the host, has every
/// idle slot copied as it starts, and the conversation's next turn gets its history back.
#[test]
fn the_probe_loses_no_conversations_last_turn_on_a_host_with_similarity_off_issue_47() {
    let sim = crossbar::sim::Sim::start(SimConfig {
        slots: 2,
        slot_prompt_similarity: 0.0,
        ram_cache_tokens: 100_000,
        ..SimConfig::default()
    });
    let agent = ureq::Agent::new_with_defaults();
    let complete = |prompt: &str| -> Value {
        let body = serde_json::json!({"prompt": prompt, "n_predict": 4, "cache_prompt": true});
        let mut answer = (agent.post(format!("{}/completion", sim.url())))
            .send(body.to_string())
            .expect("the sim answers");
        let text = answer.body_mut().read_to_string().expect("an answer");
        serde_json::from_str(&text).expect("a JSON answer")
    };
    let x = "x: a conversation the sim holds in a slot and in RAM. ".repeat(20);
    let y = "y: the last turn before the restart, in a slot alone. ".repeat(20);
    complete(&x);
    let first = complete(&y);
    // y's state is in a slot, not yet copied to RAM: the next start on the host copies it.
    let slot_of_y = first["id_slot"].as_u64();
    let config = crossbar::config::Config::from_toml(&format!(
        "[hosts.box]\nurl = \"{}\"\n[routes.projA]\nhosts = [\"box\"]\nmodel = \"m\"\n",
        sim.url()
    ))
    .expect("a valid config");
    let side = crossbar::upstream::Side::new(agent.clone());
    let answers =
        crossbar::upstream::probe::run(&side, &config.hosts["box"], 2, 7).expect("probed");
    assert_eq!(
        crossbar::learn::read_probe(&answers),
        (Some(false), Some(true)),
        "the probe still reads the host"
    );
    let next = complete(&format!("{y} and the next turn"));
    let history = first["timings"]["cache_n"].as_u64().unwrap()
        + first["timings"]["prompt_n"].as_u64().unwrap();
    assert!(
        next["timings"]["cache_n"].as_u64().unwrap() >= history,
        "y's history back (it was in slot {slot_of_y:?}): {next}"
    );
}

/// llama-server's automatic `-np` gives four slots; slots never used are the least recently used,
/// so the probe uses every slot before its choice step, or a host with similarity off would read
/// as unknown.
#[test]
fn a_host_with_four_slots_is_read_as_one_with_two_issue_47() {
    for (similarity, read) in [(0.0, Some(false)), (0.1, Some(true))] {
        let sim = crossbar::sim::Sim::start(SimConfig {
            slots: 4,
            slot_prompt_similarity: similarity,
            ram_cache_tokens: 100_000,
            ..SimConfig::default()
        });
        let config = crossbar::config::Config::from_toml(&format!(
            "[hosts.box]\nurl = \"{}\"\n[routes.projA]\nhosts = [\"box\"]\nmodel = \"m\"\n",
            sim.url()
        ))
        .expect("a valid config");
        let side = crossbar::upstream::Side::new(ureq::Agent::new_with_defaults());
        let answers = crossbar::upstream::probe::run(&side, &config.hosts["box"], 4, 9);
        let answers = answers.expect("probed");
        assert_eq!(crossbar::learn::read_probe(&answers), (read, Some(true)));
    }
}

#[test]
fn a_host_is_probed_at_first_contact_for_what_no_endpoint_says_issue_47() {
    let off = SimConfig {
        slots: 2,
        slot_prompt_similarity: 0.0,
        ram_cache_tokens: 100_000,
        ..SimConfig::default()
    };
    let defaults = SimConfig {
        slots: 2,
        ..SimConfig::default()
    };
    let h = Harness::start(
        vec![
            url_only("off", off, LEARNED),
            url_only("on", defaults, LEARNED),
        ],
        "",
    );
    let gw = h.server().gateway().clone();
    wait_until("both probed", || {
        ["off", "on"]
            .iter()
            .all(|host| gw.learned.get(host).is_some_and(|l| !l.probe_due))
    });
    assert_eq!(
        (gw.learned.similarity("off"), gw.learned.ram("off")),
        (Some(false), Some(true)),
        "-sps 0 with a RAM cache"
    );
    assert_eq!(
        (gw.learned.similarity("on"), gw.learned.ram("on")),
        (Some(true), Some(false)),
        "the sim's defaults: similarity 0.10, no RAM cache"
    );
    // The probe's requests went to the host, pinned where it pins, and left no lease or row.
    let probes = (h.sim("off").requests().iter())
        .filter(|r| r.path == "/completion")
        .count();
    assert_eq!(probes, 5, "W, Q, P, P+ and Q+");
    assert!(h.rows().is_empty(), "the probe is not a client's request");
    // A poll later, nothing is asked again.
    let before = polls(&h, "off");
    wait_until("another poll", || polls(&h, "off") > before + 1);
    let again = (h.sim("off").requests().iter())
        .filter(|r| r.path == "/completion")
        .count();
    assert_eq!(again, 5, "asked once per host and build");
}

#[test]
fn a_configured_parallel_above_the_hosts_slots_is_not_believed_issue_47() {
    let sim = SimConfig {
        slots: 2,
        ..SimConfig::default()
    };
    let spec = HostSpec {
        name: "box",
        sim,
        parallel: 4,
        weight: 1,
        config: "",
    };
    let h = Harness::start(vec![spec], "");
    let gw = h.server().gateway().clone();
    wait_until("the host's own two slots", || {
        gw.limiter.load("box", "m").parallel == 2
    });
    let notes = gw.host_notes("box");
    assert!(
        notes
            .iter()
            .any(|n| n.contains("parallel is 4") && n.contains("runs 2")),
        "{notes:?}"
    );
}

/// A client that talks to the host itself, not through crossbar: a stream held open there.
fn foreign_stream(h: &Harness, host: &str) -> Conn {
    let sim = h.sim(host);
    sim.set_lockstep(true);
    let mut conn = Conn::open(sim.addr());
    let body = chat("someone else's work", 0, true).to_string();
    conn.send(
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "application/json")],
        body.as_bytes(),
    );
    assert_eq!(conn.read_head().0, 200);
    conn
}

#[test]
fn an_exclusive_host_running_a_task_crossbar_did_not_send_is_not_pinned_issue_47() {
    let sim = SimConfig {
        slots: 2,
        ram_cache_tokens: 100_000,
        ..SimConfig::default()
    };
    let spec = HostSpec {
        name: "box",
        sim,
        parallel: 2,
        weight: 1,
        config: "exclusive = true",
    };
    let h = Harness::start(vec![spec], "health_interval = \"200ms\"");
    let gw = h.server().gateway().clone();
    let host = gw.config().hosts["box"].clone();
    wait_until("the first /slots poll", || !gw.slots.doubtful("box"));
    assert!(
        gw.pinning(&host),
        "exclusive, slots known, nothing foreign seen"
    );
    let pinned = h.post(CHAT, &chat("mine", 0, false));
    assert_eq!(pinned.status, 200);
    let id_slot = |h: &Harness| {
        let last = h.sim("box").requests().pop().expect("a request");
        serde_json::from_slice::<Value>(&last.body).expect("json")["id_slot"].as_i64()
    };
    assert!(id_slot(&h).is_some(), "pinned while crossbar is alone");

    let foreign = foreign_stream(&h, "box");
    wait_until("the foreign task seen", || !gw.pinning(&host));
    h.sim("box").set_lockstep(false);
    let unpinned = h.post(CHAT, &chat("mine again", 0, false));
    assert_eq!(unpinned.status, 200);
    assert_eq!(
        id_slot(&h),
        None,
        "left to the host while someone else uses it"
    );
    let admin = h.server().admin_addr();
    let status = request(admin, "GET", "/admin/status", &[], b"").json();
    let shown = &status["hosts"][0]["learned"]["pinning"];
    assert!(
        shown.as_str().is_some_and(|s| s.contains("paused")),
        "{status}"
    );
    drop(foreign);
}

#[test]
fn a_restarted_host_has_what_it_held_forgotten_issue_47() {
    let spec = HostSpec {
        name: "box",
        sim: SimConfig {
            slots: 1,
            ..SimConfig::default()
        },
        parallel: 1,
        weight: 1,
        config: "",
    };
    let h = Harness::start(vec![spec], "health_interval = \"200ms\"");
    let gw = h.server().gateway().clone();
    let body = chat("a conversation that warms its family", 0, false);
    assert_eq!(h.post(CHAT, &body).status, 200);
    let warm = gw.holdings.warm_on("box", "m");
    assert_eq!(warm.len(), 1, "its family is warm there");
    // Its second turn, after a few polls (each a task of the host's too), and a poll that sees
    // the task it ran.
    let before = polls(&h, "box");
    wait_until("polls after the first turn", || {
        polls(&h, "box") > before + 2
    });
    assert_eq!(h.post(CHAT, &body).status, 200);
    let before = polls(&h, "box");
    wait_until("a poll after the second", || polls(&h, "box") > before + 1);

    h.sim("box").restart();
    // Its first task after the restart (another family's) has a smaller id than the last one
    // crossbar saw.
    let poet = serde_json::json!({"model": "m", "max_tokens": 4, "messages": [
        {"role": "system", "content": "You are a poet."}, {"role": "user", "content": "rain"}]});
    assert_eq!(h.post(CHAT, &poet).status, 200);
    wait_until("the restart seen and what it held forgotten", || {
        (gw.learned.get("box")).is_some_and(|l| l.restarts == 1)
    });
    let family = warm[0].0;
    assert!(
        !(gw.holdings.warm_on("box", "m").iter()).any(|(f, _)| *f == family),
        "the first family is no longer believed warm there"
    );
}

/// A reused lease whose answer finds its cache lost keeps nothing worth staying for: the turn
/// after it is placed again as if new (placement `cold`). Here the host's one slot went to
/// another conversation between two turns, and it has no RAM cache to give it back. Placed again
/// on the only host, the lease stays: a `cold` lease event is written only when it moves.
#[test]
fn a_reused_lease_that_came_back_cold_is_placed_again_issue_47() {
    let h = Harness::start(vec![crate::support::host("a", 1)], "");
    // Over 64 tokens: shorter turns are never judged cold.
    let task = "my long task, with plenty to read. ".repeat(20);
    let mine = |turns| h.post(CHAT, &chat(&task, turns, false));
    assert_eq!(mine(0).header("X-Crossbar-Lease"), Some("new"));
    assert_eq!(mine(1).header("X-Crossbar-Placement"), Some("sticky"));
    // Another conversation takes the one slot; this one's next answer finds its history gone.
    let other = h.post(CHAT, &chat("somebody else's business entirely", 0, false));
    assert_eq!(other.status, 200, "{}", other.text());
    assert_eq!(mine(2).header("X-Crossbar-Placement"), Some("sticky"));
    let again = mine(3);
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(again.header("X-Crossbar-Placement"), Some("cold"));
    assert_eq!(again.header("X-Crossbar-Lease"), Some("reused"));
    // Placed once: the turn after is its lease's again.
    assert_eq!(mine(4).header("X-Crossbar-Placement"), Some("sticky"));
    let events = h.db().recent_events(100).unwrap();
    assert!(
        (events.iter()).all(|e| e.reason == crossbar::store::Reason::New),
        "{events:#?}"
    );
}

/// The same, where another host is better now: the conversation moves there, with lease event
/// `cold` from the host that lost its cache.
#[test]
fn a_cold_lease_placed_again_moves_where_it_is_answered_sooner_issue_47() {
    use crate::support::{drain, host};
    // Turns that hold a slot 200 ms (4 tokens at 50 ms): a wait there is worth avoiding.
    let slow = |name| HostSpec {
        sim: SimConfig {
            slots: 1,
            decode_us_per_token: 50_000,
            ..SimConfig::default()
        },
        ..host(name, 1)
    };
    let h = Harness::start(vec![slow("a"), slow("b")], "");
    drain(&h, "b", true);
    let task = "my long task, with plenty to read. ".repeat(20);
    let mine = |turns| h.post(CHAT, &chat(&task, turns, false));
    let theirs = "somebody else's business entirely";
    assert_eq!(mine(0).header("X-Crossbar-Host"), Some("a"));
    assert_eq!(mine(1).header("X-Crossbar-Host"), Some("a"));
    assert_eq!(h.post(CHAT, &chat(theirs, 0, false)).status, 200);
    assert_eq!(
        mine(2).header("X-Crossbar-Host"),
        Some("a"),
        "came back cold"
    );
    drain(&h, "b", false);
    // The other conversation's next turn holds a's one slot: b answers sooner.
    h.sim("a").set_lockstep(true);
    let held = h.open_chat(CHAT, &chat(theirs, 1, true));
    let gw = h.server().gateway().clone();
    wait_until("a's slot held", || gw.limiter.in_flight("a", "m") == 1);
    let moved = mine(3);
    assert_eq!(moved.status, 200, "{}", moved.text());
    assert_eq!(moved.header("X-Crossbar-Placement"), Some("cold"));
    assert_eq!(moved.header("X-Crossbar-Host"), Some("b"));
    h.sim("a").set_lockstep(false);
    drop(held);
    let events = h.db().recent_events(100).unwrap();
    let cold: Vec<_> = (events.iter())
        .filter(|e| e.reason == crossbar::store::Reason::Cold)
        .map(|e| (e.from_host.as_str(), e.to_host.as_str()))
        .collect();
    assert_eq!(cold, [("a", "b")], "{events:#?}");
}

/// A host that restarted between two polls (here no poll comes for a minute) is seen by its
/// answers: three conversations whose slots nothing else took come back cold one after another,
/// none warm between. crossbar forgets what it believed the host held, as for a restart it saw.
#[test]
fn conversations_cold_with_their_slots_untouched_forget_a_host_restarted_unseen_issue_47() {
    let spec = crate::support::host("box", 3);
    let h = Harness::start(vec![spec], "health_interval = \"60s\"");
    let gw = h.server().gateway().clone();
    let tasks: Vec<String> = (0..3)
        .map(|i| format!("task {i}: a long piece of work, with plenty to read. ").repeat(8))
        .collect();
    for turns in 0..2 {
        for task in &tasks {
            assert_eq!(h.post(CHAT, &chat(task, turns, false)).status, 200);
        }
    }
    assert!(!gw.holdings.warm_on("box", "m").is_empty());
    h.sim("box").restart();
    for task in &tasks {
        let answer = h.post(CHAT, &chat(task, 2, false));
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    wait_until("the restart read from the answers", || {
        (gw.learned.get("box")).is_some_and(|l| l.restarts == 1)
    });
    assert!(
        gw.holdings.warm_on("box", "m").is_empty(),
        "nothing believed warm"
    );
    assert!(gw.learned.get("box").is_some_and(|l| l.probe_due));
}
