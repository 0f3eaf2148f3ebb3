//! Hosts given only their `url` (issue 47): the models of their routes, overrides where written.

use super::*;

/// Issue 47: a host needs only its `url`. It may serve the model of every route naming it (what it
/// lists decides, checked against the host); `parallel`, the similarity and the RAM cache are the
/// host's to say, and overrides when written.
#[test]
fn a_host_needs_only_its_url_and_serves_the_models_of_its_routes() {
    let cfg = Config::from_toml(
        r#"
[hosts.titan]
url = "http://10.0.0.1:8080"
[hosts.mini]
url = "http://10.0.0.2:8080"
[hosts.mini.models.qwen]
[hosts.spare]
url = "http://10.0.0.3:8080"

[routes.projA]
hosts = ["titan", "mini"]
model = "qwen"
[routes.chat]
hosts = ["titan"]
model = "llama"
"#,
    )
    .unwrap();
    let titan = &cfg.hosts["titan"];
    assert!(titan.implied);
    let models: Vec<(&str, Option<usize>)> = (titan.models.iter())
        .map(|(m, p)| (m.as_str(), *p))
        .collect();
    assert_eq!(models, [("llama", None), ("qwen", None)]);
    assert_eq!(
        (
            titan.slot_prompt_similarity,
            titan.ram_cache,
            titan.exclusive
        ),
        (None, None, false),
        "learned from the host"
    );
    // A models table without `parallel`: the host's own slots.
    assert!(!cfg.hosts["mini"].implied);
    assert_eq!(cfg.parallel("mini", "qwen"), None);
    // A host no route names serves nothing: said, not refused.
    assert!(
        cfg.warnings
            .iter()
            .any(|w| w.contains("hosts.spare is in no route")),
        "{:?}",
        cfg.warnings
    );
}

#[test]
fn a_route_model_no_listed_host_serves_is_still_refused() {
    check_problem(
        r#"
[hosts.mini]
url = "http://10.0.0.2:8080"
[hosts.mini.models.qwen]
[routes.r]
hosts = ["mini"]
model = "llama"
"#,
        "routes.r.model: no host of the route serves \"llama\"",
    );
}
