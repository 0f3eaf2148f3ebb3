//! What a client's model name means on a route. A host may list a configured model under names of
//! its own — the id or alias it was started with (`-a qwen`), a router's aliases, the config's
//! `upstream` — and a client that read a host's listing sends one of those. Such a request is the
//! configured model's (issue 27): its fingerprint, lease, slot and row use the configured name, so
//! one conversation never becomes two leases whichever name a turn sends. A name two configured
//! models answer to means neither, and is refused like an unknown one (404 `model_not_found`).
//!
//! Pure: the hosts' names come from the health table's last poll, handed in; the table is read
//! only for a name that is not a configured model (the refused path before issue 27).

use crate::config::{Config, Host};
use crate::health::HostStatus;

/// The configured model `name` stands for on `hosts`: `None` when `name` is a configured model
/// of one of them already, when no host answers to it, or when it names two configured models.
/// `status` gives a host's last polled status.
pub(super) fn configured(
    config: &Config,
    hosts: &[String],
    name: &str,
    status: impl Fn(&str) -> Option<HostStatus>,
) -> Option<String> {
    if hosts.iter().any(|h| config.serves(h, name)) {
        return None;
    }
    let mut found: Option<&str> = None;
    for host in hosts.iter().filter_map(|h| config.hosts.get(h)) {
        let status = status(&host.name);
        for model in host.models.keys() {
            if !answers_to(host, status.as_ref(), model, name) {
                continue;
            }
            match found {
                Some(other) if other != model => return None,
                _ => found = Some(model),
            }
        }
    }
    found.map(str::to_string)
}

/// Whether `host` knows its configured `model` as `name`: its `upstream` in the config, or a name
/// the host lists for it — a router's names of that model's entry, or any name a single-model
/// host lists (it serves one model under all of them) when that is the model it has.
pub(super) fn answers_to(
    host: &Host,
    status: Option<&HostStatus>,
    model: &str,
    name: &str,
) -> bool {
    let known = host.upstream_name(model);
    if known == name {
        return true;
    }
    let Some(status) = status else {
        return false;
    };
    if status.router {
        return (status.models.iter()).any(|m| m.is_named(name) && m.is_named(known));
    }
    let lists = |n: &str| status.loaded.iter().any(|l| l == n);
    lists(name) && (host.models.len() == 1 || lists(known))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::health::RouterModel;

    fn config() -> Config {
        Config::from_toml(
            r#"
            [hosts.titan]
            url = "http://127.0.0.1:1"
            [hosts.titan.models.qwen-coder]
            [hosts.mini]
            url = "http://127.0.0.1:2"
            [hosts.mini.models.qwen-coder]
            upstream = "Qwen/Qwen2.5-Coder-7B"
            [hosts.box]
            url = "http://127.0.0.1:3"
            [hosts.box.models.llama]
            [hosts.box.models.gemma]
            [routes.projA]
            hosts = ["titan", "mini"]
            model = "qwen-coder"
            [routes.projB]
            hosts = ["titan", "box"]
            model = "qwen-coder"
            "#,
        )
        .unwrap()
    }

    fn up(loaded: &[&str], router: Vec<RouterModel>) -> HostStatus {
        HostStatus {
            healthy: true,
            reason: None,
            since: 0,
            per_slot_ctx: None,
            total_slots: None,
            loaded: loaded.iter().map(|s| s.to_string()).collect(),
            router: !router.is_empty(),
            models: router,
            max_instances: None,
            build: None,
            ctx_train: None,
            ups: 0,
            last_poll: 1,
        }
    }

    fn model(names: &[&str], state: &str) -> RouterModel {
        RouterModel {
            names: names.iter().map(|s| s.to_string()).collect(),
            state: state.into(),
            per_slot_ctx: None,
            slots: 1,
        }
    }

    #[track_caller]
    fn check(route: &str, hosts: &HashMap<&str, HostStatus>, name: &str, want: Option<&str>) {
        let config = config();
        let route = &config.routes[route].hosts;
        let got = configured(&config, route, name, |h| hosts.get(h).cloned());
        assert_eq!(got.as_deref(), want, "{name}");
    }

    #[test]
    fn issue27_a_hosts_own_name_for_a_configured_model_is_that_model() {
        let hosts = HashMap::from([
            ("titan", up(&["qwen", "/models/qwen.gguf"], vec![])),
            ("mini", up(&["Qwen/Qwen2.5-Coder-7B"], vec![])),
        ]);
        check("projA", &hosts, "qwen", Some("qwen-coder"));
        check("projA", &hosts, "/models/qwen.gguf", Some("qwen-coder"));
        // The config's `upstream`, whether or not the host is polled yet.
        check("projA", &hosts, "Qwen/Qwen2.5-Coder-7B", Some("qwen-coder"));
        check(
            "projA",
            &HashMap::new(),
            "Qwen/Qwen2.5-Coder-7B",
            Some("qwen-coder"),
        );
        // Configured names need no mapping; unknown names have none; a down host lists nothing.
        check("projA", &hosts, "qwen-coder", None);
        check("projA", &hosts, "made-up", None);
        check("projA", &HashMap::new(), "qwen", None);
        // Only the route's own hosts count.
        check("projB", &hosts, "Qwen/Qwen2.5-Coder-7B", None);
    }

    #[test]
    fn issue27_a_routers_aliases_name_the_model_whose_entry_lists_them() {
        let hosts = HashMap::from([
            ("titan", up(&["qwen"], vec![])),
            (
                "box",
                up(
                    &["llama-3", "ll"],
                    vec![
                        model(&["llama", "llama-3", "ll"], "loaded"),
                        model(&["gemma", "g"], "unloaded"),
                    ],
                ),
            ),
        ]);
        check("projB", &hosts, "ll", Some("llama"));
        // An entry the router lists but not loaded counts too: asking loads it.
        check("projB", &hosts, "g", Some("gemma"));
        check("projB", &hosts, "qwen", Some("qwen-coder"));
        check("projB", &hosts, "nope", None);
    }

    #[test]
    fn issue27_a_name_two_configured_models_answer_to_names_neither() {
        let hosts = HashMap::from([
            ("titan", up(&["qwen"], vec![])),
            (
                "box",
                up(&["qwen"], vec![model(&["llama", "qwen"], "loaded")]),
            ),
        ]);
        check("projB", &hosts, "qwen", None);
    }
}
