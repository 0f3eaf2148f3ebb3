//! Issue 48: what a user connecting their first clients trips over. The Anthropic SDK given an
//! OpenAI-style base URL, a wrong key, a spent budget: each answer says what to change, in the
//! words of the client's own API, and nothing of it reaches a host or takes a lease.

use sha2::{Digest, Sha256};

use crate::support::{chat, host, Harness};

/// A Messages body, as the Anthropic SDK sends it.
fn message() -> serde_json::Value {
    serde_json::json!({"model": "m", "max_tokens": 8,
                       "messages": [{"role": "user", "content": "hi"}]})
}

/// Requests that reached `name` beyond its health polls (all GETs; every request here is a POST).
fn forwarded(h: &Harness, name: &str) -> Vec<String> {
    (h.sim(name).requests().iter())
        .filter(|r| r.method != "GET")
        .map(|r| r.path.clone())
        .collect()
}

#[test]
fn a_base_url_that_carries_v1_twice_gets_a_hint_in_its_own_api_and_no_lease_issue_48() {
    let h = Harness::start(vec![host("titan", 1)], "");
    // The Anthropic SDK given `…/projA/v1`: it adds `/v1/messages` itself.
    let answer = h.post("/projA/v1/v1/messages", &message());
    assert_eq!(answer.status, 404, "{}", answer.text());
    let error = answer.anthropic_error();
    assert_eq!(error["code"], "not found");
    let hint = error["hint"].as_str().unwrap();
    assert!(
        hint.contains("/v1 twice") && hint.contains("http://<gateway>/projA as the base URL"),
        "{hint}"
    );
    // The like, for the OpenAI SDKs: the route after `/v1`, a whole endpoint as the base URL, a
    // route named twice. Each names the OpenAI base URL.
    for path in [
        "/v1/projA/v1/chat/completions",
        "/projA/v1/chat/completions/chat/completions",
        "/projA/projA/v1/chat/completions",
        "/projA/v1/v1/chat/completions",
    ] {
        let answer = h.post(path, &chat("hi", 0, false));
        assert_eq!(answer.status, 404, "{path}: {}", answer.text());
        let hint = answer.error()["hint"].as_str().unwrap().to_string();
        assert!(
            hint.contains("http://<gateway>/projA/v1 as the base URL"),
            "{path}: {hint}"
        );
    }
    assert!(
        forwarded(&h, "titan").is_empty(),
        "{:?}",
        forwarded(&h, "titan")
    );
    let leases = h.server().gateway().leases.snapshot();
    assert!(leases.is_empty(), "a refused path took a lease: {leases:?}");
    // Each still has its row, as every routed refusal does.
    assert!(h
        .rows()
        .iter()
        .all(|r| r.status == 404 && r.host.is_empty()));
    // And the right base URLs are served.
    assert_eq!(h.post("/projA/v1/messages", &message()).status, 200);
}

#[test]
fn the_route_hints_give_each_api_its_own_base_url_issue_48() {
    let h = Harness::start(vec![host("titan", 1)], "");
    // An Anthropic SDK user told to add `/v1` would send `/v1/v1/messages` next.
    for path in ["/v1/messages", "/nope/v1/messages"] {
        let answer = h.post(path, &message());
        let hint = answer.anthropic_error()["hint"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            hint.contains("use http://<gateway>/<route> as the base URL") && !hint.contains("/v1"),
            "{path}: {hint}"
        );
    }
    let hint = h
        .post("/v1/chat/completions", &chat("hi", 0, false))
        .error()["hint"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        hint.contains("use http://<gateway>/<route>/v1 as the base URL"),
        "{hint}"
    );
}

const KEY: &str = "cb-first-week-0123456789";

fn keyed(extra: &str) -> Harness {
    let hash: String = Sha256::digest(KEY.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Harness::start(
        vec![host("titan", 1)],
        &format!("[keys.laptop]\nhash = \"sha256:{hash}\"\n{extra}"),
    )
}

#[test]
fn a_wrong_key_is_told_apart_from_a_missing_one_and_reveals_nothing_issue_48() {
    let h = keyed("");
    let path = "/projA/v1/chat/completions";
    let none = h.post(path, &chat("hi", 0, false));
    let wrong = h.post_with(
        path,
        &[("Authorization", "Bearer cb-first-week-0123456788")],
        &chat("hi", 0, false),
    );
    let (none, wrong) = (none.error(), wrong.error());
    assert_eq!(
        (&none["code"], &wrong["code"]),
        (&"unauthorized".into(), &"unauthorized".into())
    );
    let none = none["message"].as_str().unwrap();
    let wrong = wrong["message"].as_str().unwrap();
    assert!(none.contains("needs a client key"), "{none}");
    assert!(wrong.contains("not one this gateway knows"), "{wrong}");
    assert!(
        !wrong.contains("send it as"),
        "told to send a key it sent: {wrong}"
    );
    for secret in ["laptop", "cb-first", "sha256", "projA"] {
        assert!(!wrong.contains(secret), "{secret} in {wrong}");
    }
    // The same in Anthropic's envelope, for Claude Code's x-api-key.
    let messages = h.post_with("/projA/v1/messages", &[("x-api-key", "nope")], &message());
    let message = messages.anthropic_error()["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(message.contains("not one this gateway knows"), "{message}");
}

#[test]
fn a_spent_budget_names_when_it_starts_again_issue_48() {
    let h = keyed("tokens_per_day = 1\n");
    let bearer = format!("Bearer {KEY}");
    let path = "/projA/v1/chat/completions";
    let first = h.post_with(path, &[("Authorization", &bearer)], &chat("hi", 0, false));
    assert_eq!(first.status, 200, "{}", first.text());
    let spent = h.post_with(path, &[("Authorization", &bearer)], &chat("hi", 0, false));
    assert_eq!(spent.status, 429, "{}", spent.text());
    let retry = spent.header("Retry-After").unwrap().to_string();
    let message = spent.error()["message"].as_str().unwrap().to_string();
    // An SDK shows the message, never the headers.
    assert!(message.contains("00:00 UTC"), "{message}");
    assert!(
        message.contains(&format!("retry in {retry} s")),
        "{message}"
    );
    // The admin API says what each key spent, as the page and `/metrics` did.
    let admin = h.server().admin_addr();
    let status = crate::support::request(admin, "GET", "/admin/status", &[], b"").json();
    let key = &status["keys"][0];
    assert_eq!(
        (&key["name"], &key["tokens_per_day"]),
        (&"laptop".into(), &1.into()),
        "{status}"
    );
    assert!(key["tokens_today"].as_u64().unwrap() > 1, "{status}");
    assert!(!status.to_string().contains(KEY), "never the key itself");
}

#[test]
fn the_page_shows_each_requests_conversation_placement_and_key_issue_48() {
    let h = keyed("");
    let bearer = format!("Bearer {KEY}");
    let path = "/projA/v1/chat/completions";
    for turns in 0..2 {
        let answer = h.post_with(
            path,
            &[("Authorization", &bearer)],
            &chat("hi", turns, false),
        );
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    // Refused before the route (and so the API) was known.
    assert_eq!(h.post(path, &chat("hi", 0, false)).status, 401);
    let admin = h.server().admin_addr();
    let page = crate::support::request(admin, "GET", "/", &[], b"").text();
    let recent = &page[page.find("<h2>Recent requests</h2>").unwrap()..];
    for shown in [
        "<th>key</th>",
        "<th>conversation</th>",
        "<th>placed</th>",
        "<td>laptop</td>",
        "<td>sticky</td>",
    ] {
        assert!(recent.contains(shown), "no {shown} in\n{recent}");
    }
    // The same conversation's two turns: one fingerprint, shown twice.
    let fp = crossbar::fingerprint::short(&h.rows()[1].fp).to_string();
    assert_eq!(
        recent.matches(&format!("<code>{fp}</code>")).count(),
        2,
        "{recent}"
    );
    let apis = &page[page.find("<h2>APIs</h2>").unwrap()..];
    let apis = &apis[..apis.find("</table>").unwrap()];
    // The 401 keeps no row (issue 46): the table counts only what was routed, and labels no row
    // with a bare dash.
    assert!(apis.contains("<td>chat</td><td class=n>2</td>"), "{apis}");
    assert!(!apis.contains("<td>-</td>"), "{apis}");
    // The headline says what it counts: every cache hit, not what crossbar alone saved.
    assert!(page.contains("served from cache: <b>"), "{page}");
    assert!(page.contains("also those a host would have had without crossbar"));
    let db = h.dir.join("crossbar.db");
    let report = crossbar::report::run(
        &db,
        std::time::Duration::from_secs(3600),
        None,
        false,
        false,
    )
    .unwrap();
    // The 401 left no row (issue 46), so no line is labelled `(no route)`: that label is for
    // rows an older crossbar wrote.
    assert!(report.lines().any(|l| l.starts_with("projA")), "{report}");
    assert!(!report.contains("(no route)"), "{report}");
}
