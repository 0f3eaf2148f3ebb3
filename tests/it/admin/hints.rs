//! Issue 27: refusals that say how to fix them — a foreign `Host` on the admin port names the
//! address to use, the CLI's 401 names `--token` and `admin_token`, a mistyped host or route gets
//! "did you mean", the client port points `/admin/...` at `admin_listen`, and a pin onto a host
//! that is down is answered with a warning.

use std::io::Write;

use crossbar::sim::Fault;
use serde_json::json;

use super::cli::{check_fails, check_ok, verb};
use super::{check_error, post};
use crate::support::{host, wait_until, Conn, Harness};

#[test]
fn issue27_a_foreign_host_on_the_admin_port_is_told_the_address_to_use() {
    let h = Harness::start(vec![host("titan", 1)], "");
    let admin = h.server().admin_addr();
    let mut conn = Conn::open(admin);
    let head = "GET /admin/status HTTP/1.1\r\nHost: gateway.lan:8081\r\n\r\n";
    conn.reader.get_mut().write_all(head.as_bytes()).unwrap();
    let answer = conn.read_answer();
    let port = admin.port();
    for says in [
        "\"gateway.lan:8081\" is not this admin listener",
        &format!("http://{admin}/"),
        &format!("http://localhost:{port}/"),
        "admin_token",
    ] {
        check_error(&answer, 403, says);
    }
}

#[test]
fn issue27_a_mistyped_host_or_route_gets_did_you_mean() {
    let h = Harness::start(vec![host("titan", 1), host("mini", 1)], "");
    let answer = post(&h, "/admin/drain", json!({"host": "tital", "on": true}));
    check_error(
        &answer,
        404,
        "unknown host \"tital\"; did you mean \"titan\"? (hosts: mini, titan)",
    );
    let answer = post(&h, "/admin/release", json!({"route": "proja"}));
    check_error(&answer, 404, "did you mean \"projA\"?");
    let answer = post(&h, "/admin/drain", json!({"host": "zzzzzz", "on": true}));
    check_error(&answer, 404, "unknown host \"zzzzzz\" (hosts: mini, titan)");
    check_fails(&verb(&h, &["drain", "tital"]), "did you mean \"titan\"?");

    // The client port: a route's typo, and the admin API asked of the wrong port.
    let answer = h.post(
        "/proja/v1/chat/completions",
        &crate::support::chat("hi", 0, false),
    );
    assert_eq!(answer.status, 404, "{}", answer.text());
    let message = answer.error()["message"].as_str().unwrap().to_string();
    assert!(message.contains("(did you mean \"projA\"?)"), "{message}");
    for path in ["/admin/status", "/metrics"] {
        let answer = h.get(path);
        assert_eq!(answer.status, 404, "{}", answer.text());
        let message = answer.error()["message"].as_str().unwrap().to_string();
        assert!(
            message.contains("admin listener") && message.contains("admin_listen"),
            "{message}"
        );
    }
}

#[test]
fn issue27_the_clis_401_names_token_and_admin_token() {
    let h = Harness::start(vec![host("titan", 1)], "admin_token = \"hint-t0ken\"");
    check_fails(
        &verb(&h, &["status"]),
        "pass --token TOKEN, or -c the config that sets it",
    );
    check_fails(
        &verb(&h, &["status", "--token", "nope"]),
        "the token sent (from --token) is not the running crossbar's admin_token",
    );
}

#[test]
fn issue27_a_pin_onto_a_down_host_is_done_with_a_warning() {
    let h = Harness::start(vec![host("titan", 1), host("mini", 1)], "");
    h.sim("titan").set_fault(Fault::Refuse);
    let gw = h.server().gateway().clone();
    wait_until("titan is down", || !gw.health.healthy("titan"));
    let answer = post(&h, "/admin/pin", json!({"route": "projA", "host": "titan"}));
    assert_eq!(answer.status, 200, "{}", answer.text());
    let warning = answer.json()["warning"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(warning.starts_with("host titan is down ("), "{warning}");
    assert!(warning.contains("crossbar unpin projA"), "{warning}");
    assert_eq!(
        gw.leases.pins(),
        [("projA".to_string(), "titan".to_string())]
    );

    let run = verb(&h, &["pin", "projA", "titan"]);
    assert_eq!(run.code, Some(0), "{run:#?}");
    assert!(run.stdout.starts_with("pinned projA to titan"), "{run:#?}");
    assert!(
        run.stderr.starts_with("warning: host titan is down ("),
        "{run:#?}"
    );
    // An up host: no warning.
    let run = verb(&h, &["pin", "projA", "mini"]);
    check_ok(&run);
    assert!(
        post(&h, "/admin/pin", json!({"route": "projA", "host": "mini"})).json()["warning"]
            .is_null()
    );
}
