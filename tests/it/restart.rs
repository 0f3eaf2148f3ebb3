//! A restart against a db written under an older config: what was stored for hosts the config
//! no longer has must not outlive them.

use std::time::Duration;

use crossbar::config::Config;
use crossbar::server::Server;
use crossbar::store::{LeaseRow, LeaseState, Reason};

use crate::support::{chat, host, Harness};

const CHAT: &str = "/projA/v1/chat/completions";

fn row(fp: &str, model: &str, state: LeaseState) -> LeaseRow {
    LeaseRow {
        route: "projA".into(),
        fp: fp.into(),
        model: model.into(),
        host: "gone".into(),
        state,
        created: 1,
        last_used: 1,
    }
}

/// Review finding: leases and pins were only dropped for removed hosts on SIGHUP, so a host edited
/// out of the config across a restart kept its pin and every request of the route got 503
/// `pinned host down`.
#[test]
fn a_restart_drops_the_pin_and_leases_of_a_host_no_longer_configured() {
    let mut harness = Harness::start(vec![host("titan", 1)], "");
    // The db as an older config with a host "gone" left it: a pin and two leases on it.
    let db = harness.server().gateway().store.clone();
    db.save_lease(&row("", "", LeaseState::Pinned)).unwrap();
    db.save_lease(&row("00aa", "m", LeaseState::Active))
        .unwrap();
    db.save_lease(&row("00bb", "m", LeaseState::Active))
        .unwrap();
    drop(db);
    harness.server.take().unwrap().stop(Duration::from_secs(5));

    let text = format!(
        "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ndb = {:?}\n\
         [hosts.titan]\nurl = \"{}\"\nslot_prompt_similarity = 0.1\nram_cache = false\n[hosts.titan.models.m]\nparallel = 1\n\
         [routes.projA]\nhosts = [\"titan\"]\nmodel = \"m\"\n",
        harness.dir.join("crossbar.db"),
        harness.sim("titan").url()
    );
    harness.server = Some(Server::start(Config::from_toml(&text).unwrap()).unwrap());

    let gw = harness.server().gateway().clone();
    assert_eq!(gw.leases.pins(), Vec::<(String, String)>::new());
    assert!(gw.leases.snapshot().is_empty());
    assert!(harness.db().list_leases().unwrap().is_empty());
    let removed: Vec<(String, String)> = harness
        .db()
        .recent_events(10)
        .unwrap()
        .into_iter()
        .filter(|e| e.reason == Reason::Removed && e.from_host == "gone")
        .map(|e| (e.fp, e.model))
        .collect();
    assert_eq!(removed.len(), 3, "{removed:?}");
    assert!(removed.contains(&(String::new(), String::new())));

    let answer = harness.post(CHAT, &chat("hi", 0, false));
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("X-Crossbar-Host"), Some("titan"));
}
