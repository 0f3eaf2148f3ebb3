//! `crossbar check --hosts` (issue 47): what each host says against the config. `check` alone
//! asks no host (example configs name LAN boxes, and a check must work offline); with `--hosts`
//! it reads each host's `/props` for its slots and, when the host is idle, runs the probe
//! `serve` runs at first contact (`upstream::probe`) for its slot similarity and RAM cache. A
//! configured value the host contradicts is a warning; what could not be asked is said, not
//! guessed.

use std::time::{Duration, SystemTime};

use crate::config::{Config, Host};
use crate::health::parse_props;
use crate::learn::read_probe;
use crate::slots::parse_slots;
use crate::upstream::{probe, side, Side};

/// Longest one host's calls may take.
const TIMEOUT: Duration = Duration::from_secs(3);

/// One line per finding, `note:` or `warning:`, for every host of `config`.
pub fn check(config: &Config) -> String {
    let agent = side::poll_agent(TIMEOUT);
    let side = Side::new(agent.clone());
    let mut out = String::new();
    for host in config.hosts.values() {
        out.push_str(&check_host(&agent, &side, host));
    }
    out
}

fn check_host(agent: &ureq::Agent, side: &Side, host: &Host) -> String {
    let name = &host.name;
    let props = match side::get(agent, host, "/props", 1 << 20) {
        Ok(body) => body,
        Err(_) => {
            return format!(
                "note: host {name} did not answer /props: its slots, similarity and RAM cache \
                 were not checked (serve reads them once it answers)\n"
            )
        }
    };
    let mut out = String::new();
    let slots = parse_props(&props).ok().and_then(|(_, slots)| slots);
    for (model, configured) in &host.models {
        if let (Some(configured), Some(slots)) = (configured, slots) {
            if *configured as u64 > slots {
                out.push_str(&format!(
                    "warning: hosts.{name}.models.{model}.parallel is {configured} but the host \
                     runs {slots} slots; crossbar will send it {slots} at once\n"
                ));
            }
        }
    }
    let idle = (side::get(agent, host, "/slots", 1 << 20).ok())
        .and_then(|body| parse_slots(&body))
        .is_some_and(|seen| seen.busy.is_empty());
    let configured = host.slot_prompt_similarity.map(|s| s > 0.0);
    match (slots, idle) {
        (Some(slots), true) => {
            let nonce = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(7, |d| d.as_nanos() as u64);
            match probe::run(side, host, slots, nonce).map(|a| read_probe(&a)) {
                Ok((similarity, ram)) => {
                    out.push_str(&contradiction(name, "slot_prompt_similarity", configured, similarity));
                    out.push_str(&contradiction(name, "ram_cache", host.ram_cache, ram));
                    out.push_str(&format!(
                        "note: host {name}: similarity {}, RAM cache {} (probed)\n",
                        word(similarity, "on", "off"),
                        word(ram, "yes", "no")
                    ));
                }
                Err(err) => out.push_str(&format!(
                    "note: host {name} could not be probed ({err}): similarity and RAM cache not checked\n"
                )),
            }
        }
        _ => out.push_str(&format!(
            "note: host {name} is busy or hides /slots: similarity and RAM cache not checked \
             (serve probes it while it is idle)\n"
        )),
    }
    out
}

fn word(b: Option<bool>, on: &str, off: &str) -> String {
    match b {
        Some(true) => on.to_string(),
        Some(false) => off.to_string(),
        None => "unknown".to_string(),
    }
}

/// A warning when the config says one thing of `key` and the host shows the other.
fn contradiction(host: &str, key: &str, configured: Option<bool>, found: Option<bool>) -> String {
    match (configured, found) {
        (Some(said), Some(seen)) if said != seen => format!(
            "warning: hosts.{host}.{key} says {} but the host behaves as {}: check the host's \
             flags, or leave the key out and let crossbar read it\n",
            word(Some(said), "on", "off"),
            word(Some(seen), "on", "off"),
        ),
        _ => String::new(),
    }
}
