//! Admin answers while reloads swap the config underneath them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crossbar::config::Config;
use serde_json::json;

use super::post;
use crate::support::{host, Harness};

/// Review finding: `/admin/pin` checked the route in one config snapshot and indexed another, so
/// a reload removing the route in between panicked the worker (a 500). Every answer must be a
/// 200 or a 404 `unknown route`, however reloads interleave.
#[test]
fn pins_racing_reloads_that_add_and_remove_the_route_never_fail() {
    let h = Harness::start(vec![host("titan", 1)], "health_interval = \"1h\"");
    let config = |with_b: bool| {
        let mut text = format!(
            "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ndb = {:?}\n\
             health_interval = \"1h\"\n[hosts.titan]\nurl = \"{}\"\nslot_prompt_similarity = 0.1\nram_cache = false\n\
             [hosts.titan.models.m]\nparallel = 1\n\
             [routes.projA]\nhosts = [\"titan\"]\nmodel = \"m\"\n",
            h.dir.join("crossbar.db"),
            h.sim("titan").url()
        );
        if with_b {
            text.push_str("[routes.projB]\nhosts = [\"titan\"]\nmodel = \"m\"\n");
        }
        Config::from_toml(&text).unwrap()
    };
    let (with_b, without_b) = (config(true), config(false));
    let gw = h.server().gateway().clone();
    let done = Arc::new(AtomicBool::new(false));
    let flipper = {
        let (gw, done) = (gw.clone(), done.clone());
        std::thread::spawn(move || {
            let mut on = false;
            while !done.load(Ordering::Relaxed) {
                on = !on;
                gw.apply_config(
                    if on {
                        with_b.clone()
                    } else {
                        without_b.clone()
                    },
                    0,
                );
            }
        })
    };
    for _ in 0..300 {
        let answer = post(&h, "/admin/pin", json!({"route": "projB", "host": "titan"}));
        match answer.status {
            200 => {}
            404 => {
                let error = answer.json()["error"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                assert!(error.starts_with("unknown route \"projB\""), "{error}");
            }
            _ => panic!("{} {}", answer.status, answer.text()),
        }
    }
    done.store(true, Ordering::Relaxed);
    flipper.join().unwrap();
}
