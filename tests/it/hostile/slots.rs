//! A client's `id_slot` (issue 46, finding 2): llama-server, asked for a busy slot by id, loads a
//! state into it under the generation running there, and the other conversation's answer turns
//! to garbage. A byte search for `"id_slot"` missed `"id\u005fslot"`, crossbar added its own
//! first, and the host took the client's (the last). Now every body is read as the host reads
//! it, and one that names a slot is refused on every host, pinning or not.

use crate::pinning::{started, turn, CHAT};
use crate::support::{check_error, request, wait_until, Harness};

/// The same chat body naming slot 0 every way an attacker tried, and then some.
fn bodies_naming_a_slot() -> Vec<(&'static str, Vec<u8>)> {
    let head = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":4"#;
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    let with = |member: &str| format!("{head},{member}}}").into_bytes();
    let mut bom = b"\xEF\xBB\xBF".to_vec();
    bom.extend_from_slice(&with(r#""id_slot":0"#));
    vec![
        ("literal", with(r#""id_slot":0"#)),
        ("escaped", with(r#""id\u005fslot":0"#)),
        (
            "all escaped",
            with(r#""\u0069\u0064\u005f\u0073\u006c\u006f\u0074":0"#),
        ),
        ("twice", with(r#""id_slot":-1,"id_slot":0"#)),
        ("null", with(r#""id_slot":null"#)),
        (
            "after a value too deep to build",
            with(&format!(r#""tools":{deep},"id_slot":0"#)),
        ),
        ("behind a byte order mark", bom),
    ]
}

#[track_caller]
fn check_refused(h: &Harness, how: &str, body: &[u8]) {
    let answer = request(h.addr(), "POST", CHAT, &[], body);
    check_error(&answer, 400, "bad request");
    let message = answer.error()["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(message.contains("id_slot"), "{how}: {message}");
}

#[test]
fn a_body_naming_its_slot_is_refused_on_every_host_issue_46() {
    for pin in [true, false] {
        let h = started(pin);
        for (how, body) in bodies_naming_a_slot() {
            check_refused(&h, how, &body);
        }
        let forwarded = (h.sim("a").requests().iter())
            .filter(|r| r.path.ends_with("/chat/completions"))
            .count();
        assert_eq!(forwarded, 0, "pin_slots={pin}: nothing reached the host");
        // A body that names no slot is served as before, pinned by crossbar where it pins.
        let answer = h.post(CHAT, &turn("You are terse.", "hello", 0));
        assert_eq!(answer.status, 200, "{}", answer.text());
        let sent = h.sim("a").requests().pop().expect("forwarded");
        let sent: serde_json::Value = serde_json::from_slice(&sent.body).unwrap();
        assert_eq!(sent["id_slot"].is_u64(), pin, "{sent}");
    }
}

/// The attack as run against a real llama-server, on the sim: a victim streams pinned to slot 0
/// while an attacker's body names slot 0 escaped. Before, the attacker's request reached the busy
/// slot (the sim counts it in `pinned_busy`, where the real host corrupted the victim's answer).
#[test]
fn an_escaped_id_slot_never_reaches_a_slot_another_conversation_streams_in_issue_46() {
    let h = started(true);
    let sim = h.sim("a");
    sim.set_lockstep(true);
    let mut victim = h.open_chat(CHAT, &{
        let mut body = turn("You are the victim.", "write a long story", 0);
        body["stream"] = true.into();
        body
    });
    let gw = h.server().gateway().clone();
    wait_until("the victim streams", || gw.limiter.in_flight("a", "m") == 1);
    // Its slot is taken before its request reaches the host.
    let forwarded = |r: &crossbar::sim::Received| r.path.ends_with("/chat/completions");
    wait_until("the victim is forwarded", || {
        sim.requests().iter().any(forwarded)
    });
    let victim_slot = (sim.requests().iter())
        .find(|r| forwarded(r))
        .map(|r| serde_json::from_slice::<serde_json::Value>(&r.body).unwrap()["id_slot"].clone())
        .expect("the victim was forwarded");
    let attack = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"x"}}],"id\u005fslot":{victim_slot}}}"#
    );
    check_refused(&h, "escaped", attack.as_bytes());
    sim.set_lockstep(false);
    let (status, _) = victim.read_head();
    assert_eq!(status, 200);
    assert_eq!(
        sim.stats().pinned_busy,
        0,
        "no request was sent to a busy slot"
    );
}

/// The host reads the last of two `model`s, and a body behind a byte order mark: so does
/// crossbar now, for the model it serves, refuses or renames. Before, a body with a byte order
/// mark was no JSON to crossbar: it went to the route's model with the client's name inside.
#[test]
fn a_body_names_the_model_the_host_will_read_issue_46() {
    let h = started(false);
    let body = |model: &str| {
        format!(r#"{model},"messages":[{{"role":"user","content":"hi"}}],"max_tokens":4}}"#)
    };
    let ghost_last = format!("{{{}", body(r#""model":"m","model":"ghost""#));
    let answer = request(h.addr(), "POST", CHAT, &[], ghost_last.as_bytes());
    check_error(&answer, 404, "model_not_found");
    assert_eq!(answer.error()["model"], "ghost");
    let escaped_last = format!("{{{}", body(r#""model":"ghost","mod\u0065l":"m""#));
    let answer = request(h.addr(), "POST", CHAT, &[], escaped_last.as_bytes());
    assert_eq!(answer.status, 200, "{}", answer.text());
    let mut bom = b"\xEF\xBB\xBF".to_vec();
    bom.extend_from_slice(format!("{{{}", body(r#""model":"ghost""#)).as_bytes());
    let answer = request(h.addr(), "POST", CHAT, &[], &bom);
    check_error(&answer, 404, "model_not_found");
    assert_eq!(answer.error()["model"], "ghost");
}
