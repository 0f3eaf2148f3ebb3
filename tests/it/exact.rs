//! Issue 11 end to end: the context guard asks the host for the exact count when the estimate
//! says a prompt does not fit, and judges on that; hosts that cannot count leave the estimate in
//! charge; metadata takes the route-level lease that new conversations inherit; a host's down
//! reason says what is wrong with it.

use crossbar::sim::{Counts, SimConfig, SimEvent};
use crossbar::upstream::side::PER_HOST as COUNTS_PER_HOST;
use serde_json::{json, Value};

use crate::guard::{chats, sim_count};
use crate::support::{chat, request, wait_event, wait_until, Harness, HostSpec};

const CHAT: &str = "/projA/v1/chat/completions";

/// A host with one slot of `ctx` tokens whose sim answers the count endpoints `counts` allows.
fn host(name: &'static str, ctx: u64, counts: Counts) -> HostSpec {
    HostSpec {
        name,
        sim: SimConfig {
            n_ctx: ctx,
            slots: 1,
            counts,
            ..SimConfig::default()
        },
        parallel: 1,
        weight: 1,
        config: "",
    }
}

/// A one-message chat whose prompt is exactly `tokens` tokens as the sim counts them (it renders
/// `user: <content>\nassistant:` and counts 4 bytes a token), and whose estimate is well above.
fn prompt_of(tokens: u64) -> Value {
    let rendered = (tokens * 4) as usize;
    let content = "a".repeat(rendered - "user: \nassistant:".len());
    json!({"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 1})
}

/// [`prompt_of`] with its first byte made `tag`'s, so each tag is its own conversation.
fn tagged_prompt(tokens: u64, tag: char) -> Value {
    let mut body = prompt_of(tokens);
    let content = body["messages"][0]["content"].as_str().unwrap();
    body["messages"][0]["content"] = json!(format!("{tag}{}", &content[1..]));
    body
}

fn estimate(body: &Value) -> u64 {
    (body.to_string().len() as f64 / 4.0 * 1.2) as u64
}

#[track_caller]
fn check(answer: &crate::support::Answer, status: u16, host: &str, ctx: Option<&str>) {
    let seen = format!("{:?} {}", answer.headers, answer.text());
    assert_eq!(answer.status, status, "{seen}");
    assert_eq!(answer.header("X-Crossbar-Host"), Some(host), "{seen}");
    assert_eq!(answer.header("X-Crossbar-Ctx"), ctx, "{seen}");
}

#[test]
fn a_prompt_the_estimate_refuses_but_the_host_counts_under_its_context_stays_put_issue_11() {
    let h = Harness::start(
        vec![
            host("small", 1024, Counts::Exact),
            host("big", 65536, Counts::Exact),
        ],
        "",
    );
    // llama-server refuses a prompt of n_ctx tokens or more: n_ctx − 1 is the largest that fits.
    let body = prompt_of(1023);
    assert_eq!(sim_count(h.sim("small"), &body), 1023);
    assert!(estimate(&body) > 1024, "{}", estimate(&body));
    let answer = h.post(CHAT, &body);
    check(&answer, 200, "small", None);
    assert_eq!(answer.header("X-Crossbar-Lease"), Some("new"));
    assert_eq!(chats(h.sim("big")), 0);
    let row = h.rows().pop().unwrap();
    assert_eq!(
        (row.ctx_est, row.ctx_exact, row.prompt_tokens),
        (Some(estimate(&body) as i64), Some(1023), Some(1023))
    );
    // The count took no slot and left no lease of its own.
    assert_eq!(h.server().gateway().leases.snapshot().len(), 1);
}

#[test]
fn a_prompt_the_host_counts_at_its_context_moves_or_is_refused_issue_11() {
    let h = Harness::start(
        vec![
            host("small", 1024, Counts::Exact),
            host("big", 65536, Counts::Exact),
        ],
        "",
    );
    let body = prompt_of(1024);
    check(&h.post(CHAT, &body), 200, "big", Some("moved:small>big"));
    assert_eq!(chats(h.sim("small")), 0, "the prompt never reached small");
    assert_eq!(h.rows().pop().unwrap().ctx_exact, Some(1024));

    let alone = Harness::start(vec![host("small", 1024, Counts::Exact)], "");
    let refused = alone.post(CHAT, &body);
    assert_eq!(refused.status, 400, "{}", refused.text());
    assert_eq!(
        refused.error_fields(),
        json!({"code": "prompt too large", "estimate": estimate(&body), "exact": 1024, "max": 1024})
    );
    assert_eq!(chats(alone.sim("small")), 0);
}

#[test]
fn an_older_build_is_counted_through_apply_template_and_tokenize_issue_11() {
    let h = Harness::start(
        vec![
            host("small", 1024, Counts::Template),
            host("big", 65536, Counts::Template),
        ],
        "",
    );
    let body = prompt_of(1023);
    check(&h.post(CHAT, &body), 200, "small", None);
    assert_eq!(h.rows().pop().unwrap().ctx_exact, Some(1023));
    let asked: Vec<String> = h
        .sim("small")
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST")
        .map(|r| r.path)
        .collect();
    assert_eq!(
        asked,
        [
            "/v1/chat/completions/input_tokens",
            "/apply-template",
            "/tokenize",
            "/v1/chat/completions"
        ]
    );
}

#[test]
fn a_host_that_cannot_count_leaves_the_estimate_in_charge_issue_11() {
    let h = Harness::start(
        vec![
            host("small", 1024, Counts::None),
            host("big", 65536, Counts::None),
        ],
        "",
    );
    // It would fit, but nobody can say so: the estimate moves it, as seed 002 does.
    let body = prompt_of(1023);
    check(&h.post(CHAT, &body), 200, "big", Some("moved:small>big"));
    let row = h.rows().pop().unwrap();
    assert_eq!(
        (row.ctx_est, row.ctx_exact),
        (Some(estimate(&body) as i64), None)
    );
}

/// A count endpoint that fails (500) is a host that cannot count this time: the estimate decides,
/// the request is served, and the host is not marked down for it (a count is not a forward).
#[test]
fn a_count_endpoint_answering_500_leaves_the_estimate_in_charge_and_the_host_up_issue_11() {
    let h = Harness::start(
        vec![
            host("small", 1024, Counts::Failing),
            host("big", 65536, Counts::Failing),
        ],
        "",
    );
    let body = prompt_of(1023);
    check(&h.post(CHAT, &body), 200, "big", Some("moved:small>big"));
    let counted = h.sim("small").requests();
    assert!(
        counted.iter().any(|r| r.path.ends_with("/input_tokens")),
        "small was asked to count: {:?}",
        counted.iter().map(|r| &r.path).collect::<Vec<_>>()
    );
    let row = h.rows().pop().unwrap();
    assert_eq!(row.ctx_exact, None);
    let gw = h.server().gateway();
    assert!(gw.health.healthy("small") && gw.health.healthy("big"));
}

#[test]
fn a_completion_prompt_is_counted_by_tokenizing_it_issue_11() {
    let h = Harness::start(
        vec![
            host("small", 1024, Counts::Exact),
            host("big", 65536, Counts::Exact),
        ],
        "",
    );
    let body = json!({"model": "m", "prompt": "b".repeat(1023 * 4), "n_predict": 1});
    assert!(estimate(&body) > 1024);
    let answer = h.post("/projA/completion", &body);
    check(&answer, 200, "small", None);
    assert_eq!(h.rows().pop().unwrap().ctx_exact, Some(1023));
}

/// Issue 11 had a listing take the route-level lease for new conversations to inherit; issue 23
/// overrides it: metadata (listings, counts) takes no lease and leaves none, so a UI polling its
/// model list steers nothing, and new conversations are placed by load, each then sticky.
#[test]
fn a_model_listing_or_a_count_leaves_no_lease_and_steers_no_new_conversation_issue_23() {
    let h = Harness::start(
        vec![
            host("a", 8192, Counts::Exact),
            host("b", 8192, Counts::Exact),
        ],
        "",
    );
    let models = h.get("/projA/v1/models");
    assert_eq!(models.status, 200, "{}", models.text());
    assert_eq!(models.header("X-Crossbar-Lease"), Some("none"));
    let mut placed = Vec::new();
    for topic in ["task one", "task two"] {
        let answer = h.post(CHAT, &chat(topic, 0, false));
        assert_eq!(answer.header("X-Crossbar-Lease"), Some("new"));
        placed.push(answer.header("X-Crossbar-Host").unwrap().to_string());
        let again = h.post(CHAT, &chat(topic, 1, false));
        assert_eq!(
            again.header("X-Crossbar-Host"),
            placed.last().map(String::as_str)
        );
        assert_eq!(again.header("X-Crossbar-Lease"), Some("reused"));
    }
    assert_ne!(placed[0], placed[1], "new conversations spread: {placed:?}");
    let count = request(
        h.addr(),
        "POST",
        "/projA/v1/chat/completions/input_tokens",
        &[],
        chat("task four", 0, false).to_string().as_bytes(),
    );
    assert_eq!(count.status, 200, "{}", count.text());
    assert_eq!(count.header("X-Crossbar-Lease"), Some("none"));
    let leases = h.server().gateway().leases.snapshot();
    assert!(leases.iter().all(|l| !l.key.fp.is_empty()), "{leases:?}");
}

#[test]
fn a_host_refusing_crossbars_key_is_down_with_a_reason_that_says_so_issue_11() {
    let mut keyed = host("titan", 8192, Counts::Exact);
    keyed.sim.api_key = Some("the-right-key".into());
    let h = Harness::start(vec![keyed], "");
    let gw = h.server().gateway().clone();
    wait_until("titan is down", || !gw.health.healthy("titan"));
    let want = "401 from /props: check api_key";
    let admin = h.server().admin_addr();
    let status = request(admin, "GET", "/admin/status", &[], b"").json();
    assert_eq!(status["hosts"][0]["reason"], want, "{status:#}");
    let page = request(admin, "GET", "/", &[], b"").text();
    assert!(page.contains(want), "{page}");
    // The client is told too (issue 24): its 503 names each host's reason.
    let refused = h.post(CHAT, &chat("hello", 0, false));
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(
        refused.error()["hosts"]["titan"],
        want,
        "{}",
        refused.text()
    );
}

/// A client flooding crossbar with large bodies cannot make each one a tokenizer call on a host:
/// at most `COUNTS_PER_HOST` requests count there at once; the others wait their turn (a count takes
/// milliseconds) instead of being refused on the estimate, so every prompt that fits is served.
#[test]
fn a_flood_of_oversized_prompts_asks_a_host_for_at_most_a_few_counts_at_once_issue_11() {
    const COUNT: &str = "/v1/chat/completions/input_tokens";
    // Seven clients, one address: each may wait its turn for the slot (issue 46's share).
    let extra = "queue_max_total = 7\nqueue_max_per_client = 7";
    let h = Harness::start(vec![host("small", 1024, Counts::Exact)], extra);
    let sim = h.sim("small");
    let events = sim.events();
    sim.hold_counts(true);
    let (addr, tags) = (h.addr(), ['b', 'c', 'd', 'e', 'f', 'g', 'h']);
    assert!(tags.len() > 2 * COUNTS_PER_HOST);
    let answers: Vec<_> = tags
        .iter()
        .map(|&tag| {
            let body = tagged_prompt(1000, tag).to_string();
            std::thread::spawn(move || request(addr, "POST", CHAT, &[], body.as_bytes()))
        })
        .collect();
    for n in 1..=COUNTS_PER_HOST {
        wait_event(
            &events,
            &format!("count call {n} is held"),
            |e| matches!(e, SimEvent::Request { path } if path == COUNT),
        );
    }
    let counter = h.server().gateway().upstream.side();
    let waiting = tags.len() - COUNTS_PER_HOST;
    wait_until("the others wait for a turn", || {
        counter.waiting() == waiting
    });
    let asked = |path: &str| sim.requests().iter().filter(|r| r.path == path).count();
    assert_eq!(
        asked(COUNT),
        COUNTS_PER_HOST,
        "only the held calls reached the host"
    );

    sim.hold_counts(false);
    for answer in answers {
        check(&answer.join().unwrap(), 200, "small", None);
    }
    assert_eq!(asked(COUNT), tags.len(), "each was counted in its turn");
    let exact: Vec<Option<i64>> = h.rows().iter().map(|r| r.ctx_exact).collect();
    assert!(exact.iter().all(|e| *e == Some(1000)), "{exact:?}");
}

/// Issue 11: the count is the host's count of the prompt it would render, so the whole body goes
/// to the count call: `tools`, `chat_template_kwargs` and any field crossbar does not know change
/// what the template renders.
#[test]
fn the_count_call_gets_the_whole_body_issue_11() {
    let h = Harness::start(vec![host("small", 1024, Counts::Exact)], "");
    let mut body = prompt_of(1000);
    body["tools"] = json!([{"type": "function", "function": {"name": "grep", "parameters": {}}}]);
    body["chat_template_kwargs"] = json!({"enable_thinking": false});
    body["x_unknown_field"] = json!([1, 2, 3]);
    assert!(estimate(&body) > 1024, "{}", estimate(&body));
    let answer = h.post(CHAT, &body);
    assert_eq!(answer.status, 200, "{}", answer.text());
    let counted: Vec<Value> = h
        .sim("small")
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/input_tokens"))
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect();
    assert_eq!(counted, [body], "the count call's body");
}
