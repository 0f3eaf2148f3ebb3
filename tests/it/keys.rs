//! Issue 25: client keys. One story per answer — 401, 403, 429 (in flight, the day's budget,
//! brute force) — in each header form; the key never goes upstream, into the row or the page; a
//! reload adds and removes keys.

use sha2::{Digest, Sha256};

use crate::support::{chat, host, request, wait_until, Conn, Harness};

const CHAT: &str = "/projA/v1/chat/completions";
const ALICE: &str = "cb-alice-0123456789abcdef";
const CI: &str = "cb-ci-fedcba9876543210";

pub(crate) fn hash(key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    format!(
        "sha256:{}",
        digest
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    )
}

/// alice may use every route, one request at a time; ci only projB, within 10 tokens a day.
fn keyed() -> Harness {
    let keys = format!(
        "[keys.alice]\nhash = \"{}\"\nmax_in_flight = 1\n\
         [keys.ci]\nhash = \"{}\"\nroutes = [\"projB\"]\ntokens_per_day = 10\n",
        hash(ALICE),
        hash(CI)
    );
    Harness::start_with(
        vec![host("titan", 1)],
        &keys,
        "[routes.projB]\nhosts = [\"titan\"]\nmodel = \"m\"\n",
    )
}

#[test]
fn no_key_or_a_wrong_one_is_401_and_every_header_form_works() {
    let h = keyed();
    let body = chat("hello", 0, false);
    let none = h.post(CHAT, &body);
    assert_eq!(none.status, 401, "{}", none.text());
    assert_eq!(
        none.header("WWW-Authenticate"),
        Some("Bearer realm=\"crossbar\"")
    );
    assert_eq!(none.error()["code"], "unauthorized");
    let text = none.text();
    assert!(
        !text.contains("alice") && !text.contains("projA"),
        "names nothing: {text}"
    );
    // The Anthropic SDK's own envelope on its path.
    let messages = h.post_with("/projA/v1/messages", &[("x-api-key", "wrong")], &body);
    assert_eq!(messages.status, 401);
    assert_eq!(messages.json()["type"], "error");
    let bearer = format!("Bearer {ALICE}");
    for header in [
        ("Authorization", bearer.as_str()),
        ("x-api-key", ALICE),
        ("api-key", ALICE),
    ] {
        let answer = h.post_with(CHAT, &[header], &chat("hello", 0, false));
        assert_eq!(answer.status, 200, "{header:?}: {}", answer.text());
    }
    // Two places that disagree, or one header twice: 401 even when one of them is right.
    let disagree = h.post_with(
        CHAT,
        &[("Authorization", bearer.as_str()), ("x-api-key", CI)],
        &body,
    );
    assert_eq!(disagree.status, 401, "{}", disagree.text());
    let twice = h.post_with(CHAT, &[("x-api-key", ALICE), ("x-api-key", ALICE)], &body);
    assert_eq!(twice.status, 401, "{}", twice.text());
    // A CORS preflight carries no credentials and is not refused for it (issue 46: any other
    // OPTIONS needs a key).
    let asks = [
        ("Origin", "http://page.example"),
        ("Access-Control-Request-Method", "POST"),
    ];
    let preflight = request(h.addr(), "OPTIONS", "/projA/v1/models", &asks, b"");
    assert_eq!(preflight.status, 200);
    let options = request(h.addr(), "OPTIONS", "/projA/v1/models", &[], b"");
    assert_eq!(options.status, 401);
}

#[test]
fn a_key_is_held_to_its_routes_in_flight_requests_and_days_tokens() {
    let h = keyed();
    let body = chat("hello", 0, false);
    let ci = [("x-api-key", CI)];
    let forbidden = h.post_with(CHAT, &ci, &body);
    assert_eq!(forbidden.status, 403, "{}", forbidden.text());
    assert_eq!(forbidden.error()["code"], "forbidden");
    let first = h.post_with("/projB/v1/chat/completions", &ci, &body);
    assert_eq!(first.status, 200, "{}", first.text());
    // Over ten tokens spent: refused until midnight UTC.
    let spent = h.post_with("/projB/v1/chat/completions", &ci, &body);
    assert_eq!(spent.status, 429, "{}", spent.text());
    let retry: u64 = spent.header("Retry-After").unwrap().parse().unwrap();
    assert!((1..=86_400).contains(&retry), "{retry}");
    // alice: one request at a time. A stream holds titan's slot (and alice's one request).
    let bearer = format!("Bearer {ALICE}");
    let gw = h.server().gateway().clone();
    h.sim("titan").set_lockstep(true);
    let mut held = h.open_chat_with(CHAT, &[("Authorization", &bearer)], &chat("long", 0, true));
    crate::support::wait_until("alice's stream is in flight", || {
        gw.limiter.in_flight("titan", "m") == 1
    });
    let busy = h.post_with(CHAT, &[("x-api-key", ALICE)], &body);
    assert_eq!(busy.status, 429, "{}", busy.text());
    assert_eq!(busy.header("Retry-After"), Some("1"));
    h.sim("titan").set_lockstep(false);
    assert_eq!(held.read_answer().status, 200);
    let again = h.post_with(CHAT, &[("x-api-key", ALICE)], &body);
    assert_eq!(again.status, 200, "{}", again.text());
}

#[test]
fn more_than_ten_wrong_keys_a_minute_shut_the_address_out_even_with_the_right_one() {
    let h = keyed();
    let body = chat("hello", 0, false);
    for i in 0..11 {
        let wrong = format!("guess-{i}");
        let answer = h.post_with(CHAT, &[("x-api-key", wrong.as_str())], &body);
        assert_eq!(answer.status, 401);
    }
    let right = h.post_with(CHAT, &[("x-api-key", ALICE)], &body);
    assert_eq!(right.status, 429, "{}", right.text());
    assert_eq!(right.header("Retry-After"), Some("60"));
}

#[test]
fn the_key_is_never_forwarded_nor_recorded_and_a_reload_adds_and_removes_keys() {
    let h = keyed();
    let bearer = format!("Bearer {ALICE}");
    let sent = [
        ("Authorization", bearer.as_str()),
        ("x-api-key", ALICE),
        ("api-key", ALICE),
    ];
    let answer = h.post_with(CHAT, &sent, &chat("secret", 0, false));
    assert_eq!(answer.status, 200, "{}", answer.text());
    for seen in h.sim("titan").requests() {
        let all = format!("{:?}", seen.headers);
        assert!(!all.contains(ALICE), "forwarded: {all}");
    }
    let rows = h.rows();
    let row = rows.last().unwrap();
    assert_eq!(row.key, "alice");
    assert!(!format!("{row:?}").contains(ALICE));
    let admin = h.server().admin_addr();
    let page = request(admin, "GET", "/", &[], b"").text();
    assert!(
        page.contains("alice") && !page.contains(ALICE),
        "usage by name, never the key"
    );
    let metrics = request(admin, "GET", "/metrics", &[], b"").text();
    assert!(
        metrics.contains(r#"crossbar_key_requests_total{key="alice"} 1"#),
        "{metrics}"
    );
    // A reload removes alice and adds bob, without dropping anything in flight.
    let gw = h.server().gateway().clone();
    let mut config = (*gw.config()).clone();
    let alice = config.keys.remove("alice").unwrap();
    let bob = crossbar::config::ClientKey {
        name: "bob".into(),
        hash: Sha256::digest(b"cb-bob").into(),
        ..alice
    };
    config.keys.insert("bob".into(), bob);
    h.server().reload(config);
    let old = h.post_with(CHAT, &[("x-api-key", ALICE)], &chat("after", 0, false));
    assert_eq!(old.status, 401, "{}", old.text());
    let new = h.post_with(CHAT, &[("x-api-key", "cb-bob")], &chat("after", 0, false));
    assert_eq!(new.status, 200, "{}", new.text());
    assert_eq!(h.rows().last().unwrap().key, "bob");
}

/// A body that comes after its head is read off the workers and the handler called again
/// (issue 24): the key the head carried still counts then.
#[test]
fn a_key_holds_for_a_body_that_comes_after_its_head() {
    use std::io::Write;
    let h = keyed();
    let body = chat("sent after a pause", 0, false).to_string();
    let head = format!(
        "POST {CHAT} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let mut conn = Conn::open(h.addr());
    conn.reader.get_mut().write_all(head.as_bytes()).unwrap();
    wait_until("the body is awaited off the workers", || {
        h.server().client_connections().bodies_off_workers == 1
    });
    conn.reader.get_mut().write_all(body.as_bytes()).unwrap();
    let answer = conn.read_answer();
    assert_eq!(answer.status, 200, "{}", answer.text());
}
