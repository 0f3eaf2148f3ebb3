use super::*;

const MINIMAL: &str = r#"
[hosts.titan]
url = "http://10.0.0.1:8080/"
[hosts.titan.models.qwen]
parallel = 2

[routes.projA]
hosts = ["titan"]
model = "qwen"
"#;

#[track_caller]
fn problems(text: &str) -> Vec<String> {
    match Config::from_toml(text) {
        Ok(_) => panic!("config was accepted:\n{text}"),
        Err(err) => err.lines(),
    }
}

#[track_caller]
fn check_problem(text: &str, expected: &str) {
    let lines = problems(text);
    assert!(
        lines.iter().any(|l| l == expected),
        "expected {expected:?} among {lines:#?}"
    );
}

#[test]
fn minimal_config_gets_every_default() {
    let cfg = Config::from_toml(MINIMAL).unwrap();
    assert_eq!(cfg.listen, "0.0.0.0:8080".parse().unwrap());
    assert_eq!(cfg.admin_listen, "127.0.0.1:8081".parse().unwrap());
    assert_eq!(cfg.admin_token, None);
    assert_eq!(cfg.db, PathBuf::from("crossbar.db"));
    assert_eq!(cfg.workers, 64);
    assert_eq!(cfg.lease_idle, Duration::from_secs(7200));
    assert_eq!(cfg.health_interval, Duration::from_secs(5));
    assert_eq!(cfg.queue_max, 16);
    assert_eq!(cfg.queue_timeout, Duration::from_secs(600));
    assert_eq!(cfg.log_level, log::LevelFilter::Info);
    assert_eq!(cfg.front, crate::conn::Settings::default());
    assert_eq!(cfg.front.max_per_peer, 64);
    assert_eq!(cfg.front.max_bodies_per_peer, 8);
    let titan = &cfg.hosts["titan"];
    assert_eq!(
        titan.url, "http://10.0.0.1:8080",
        "trailing slash is trimmed"
    );
    assert_eq!(titan.weight, 1);
    assert_eq!(titan.models["qwen"], Some(2));
    assert_eq!(cfg.routes["projA"].hosts, vec!["titan".to_string()]);
    assert!(cfg.serves("titan", "qwen"));
    assert!(!cfg.serves("titan", "llama"));
    assert_eq!(cfg.parallel("titan", "qwen"), Some(2));
    assert_eq!(cfg.parallel("mini", "qwen"), None);
}

#[test]
fn a_per_peer_cap_of_zero_is_refused_by_its_key() {
    let text = format!("max_connections_per_peer = 0\n{MINIMAL}");
    check_problem(&text, "max_connections_per_peer: must be at least 1");
    let text = format!("max_connections_per_peer = 8\n{MINIMAL}");
    assert_eq!(Config::from_toml(&text).unwrap().front.max_per_peer, 8);
    let text = format!("max_body_readers_per_peer = 0\n{MINIMAL}");
    check_problem(&text, "max_body_readers_per_peer: must be at least 1");
    let text = format!("max_body_readers_per_peer = 3\n{MINIMAL}");
    assert_eq!(
        Config::from_toml(&text).unwrap().front.max_bodies_per_peer,
        3
    );
}

#[test]
fn the_example_config_is_valid() {
    let text = include_str!("../../crossbar.toml");
    let cfg = Config::from_toml(text).unwrap_or_else(|e| panic!("{:#?}", e.lines()));
    assert_eq!(cfg.routes["projA"].hosts, ["titan", "mini"]);
    assert_eq!(cfg.hosts["titan"].weight, 2);
}

#[test]
fn durations_take_every_unit() {
    let cases = [
        ("500ms", 500),
        ("30s", 30_000),
        ("5m", 300_000),
        ("2h", 7_200_000),
        ("1d", 86_400_000),
    ];
    for (text, ms) in cases {
        assert_eq!(
            parse_duration(text),
            Ok(Duration::from_millis(ms)),
            "{text}"
        );
    }
    for bad in [
        "",
        "5",
        "m",
        "5 minutes",
        "-1s",
        "1.5h",
        "99999999999999999999d",
    ] {
        assert!(parse_duration(bad).is_err(), "{bad:?} was accepted");
    }
}

#[test]
fn five_mistakes_give_five_lines_naming_their_keys() {
    let text = r#"
lease_idle = "forever"
colour = "blue"
[hosts.titan]
url = "ftp://10.0.0.1"
[hosts.titan.models.qwen]
parallel = 0
[routes.projA]
hosts = ["titan", "ghost"]
model = "qwen"
"#;
    let lines = problems(text);
    assert_eq!(
        lines,
        [
            "colour: unknown key",
            "lease_idle: \"forever\" is not a duration like 500ms, 30s, 5m, 2h or 1d",
            "hosts.titan.url: \"ftp://10.0.0.1\" is not an http:// URL",
            "hosts.titan.models.qwen.parallel: is 0; a host has at least 1 slot",
            "routes.projA.hosts: unknown host \"ghost\"",
        ]
    );
}

/// Issue 48: a misspelled host in a route gets the nearest configured one, as keys get theirs.
#[test]
fn a_misspelled_host_in_a_route_says_which_one_was_meant_issue_48() {
    let text = r#"
[hosts.mini]
url = "http://127.0.0.1:9"
[hosts.mini.models.qwen]
[routes.projA]
hosts = ["mni", "zzzzzz"]
model = "qwen"
"#;
    assert_eq!(
        problems(text),
        [
            "routes.projA.hosts: unknown host \"mni\"; did you mean \"mini\"?",
            "routes.projA.hosts: unknown host \"zzzzzz\"",
        ]
    );
}

#[test]
fn unknown_keys_are_named_with_their_path() {
    let text = MINIMAL.replace("parallel = 2", "parallel = 2\nslots = 4");
    check_problem(&text, "hosts.titan.models.qwen.slots: unknown key");
}

#[test]
fn route_default_model_must_be_served_by_a_candidate() {
    let text = MINIMAL.replace("model = \"qwen\"", "model = \"llama\"");
    check_problem(
        &text,
        "routes.projA.model: no host of the route serves \"llama\"",
    );
}

#[test]
fn reserved_and_malformed_route_names_are_refused() {
    for name in ["v1", "health", "props", "admin", "metrics"] {
        let text = MINIMAL.replace("[routes.projA]", &format!("[routes.{name}]"));
        check_problem(
            &text,
            &format!("routes.{name}: \"{name}\" is reserved; pick another route name"),
        );
    }
    let text = MINIMAL.replace("[routes.projA]", "[routes.\"proj A\"]");
    check_problem(
        &text,
        "routes.proj A: route names use only letters, digits, '-' and '_'",
    );
}

#[test]
fn duplicate_listen_addresses_are_refused() {
    let text = format!("listen = \"127.0.0.1:9000\"\nadmin_listen = \"127.0.0.1:9000\"\n{MINIMAL}");
    check_problem(
        &text,
        "admin_listen: is the same address as listen (127.0.0.1:9000)",
    );
}

/// Review finding: only identical addresses were refused, so `serve` failed to bind a config that
/// `check` passed.
#[test]
fn listen_addresses_sharing_a_port_with_an_unspecified_address_are_refused() {
    for (listen, admin) in [
        ("0.0.0.0:8080", "127.0.0.1:8080"),
        ("127.0.0.1:8080", "0.0.0.0:8080"),
        ("[::]:8080", "127.0.0.1:8080"),
        ("192.168.1.5:8080", "[::]:8080"),
    ] {
        let text = format!("listen = \"{listen}\"\nadmin_listen = \"{admin}\"\n{MINIMAL}");
        check_problem(
            &text,
            &format!(
                "admin_listen: overlaps listen ({listen}): same port, and an unspecified address \
                 takes every address"
            ),
        );
    }
    for (listen, admin) in [
        ("0.0.0.0:8080", "127.0.0.1:8081"),
        ("127.0.0.1:8080", "192.168.1.5:8080"),
        ("0.0.0.0:0", "127.0.0.1:0"),
    ] {
        let text = format!("listen = \"{listen}\"\nadmin_listen = \"{admin}\"\n{MINIMAL}");
        assert!(Config::from_toml(&text).is_ok(), "{listen} {admin}");
    }
}

#[test]
fn urls_are_checked() {
    assert_eq!(check_url("http://h:80/").as_deref(), Ok("http://h:80"));
    assert_eq!(
        check_url("http://[::1]:8080").as_deref(),
        Ok("http://[::1]:8080")
    );
    assert_eq!(check_url("http://box.lan").as_deref(), Ok("http://box.lan"));
    for bad in [
        "https://h",
        "h:80",
        "http://",
        "http://h:0",
        "http://h:99999",
        "http://h/?q=1",
    ] {
        assert!(check_url(bad).is_err(), "{bad:?} was accepted");
    }
}

#[test]
fn wrong_types_are_each_a_problem_naming_the_key_and_hide_nothing() {
    let text = format!(
        "workers = \"many\"\nlease_idle = 5\nbogus = 1\n{MINIMAL}\n\
         [hosts.extra]\nurl = \"http://10.0.0.9:8080\"\nweight = \"heavy\"\n\
         [hosts.extra.models.m]\nparallel = \"two\"\n"
    );
    let lines = problems(&text);
    assert_eq!(
        lines,
        [
            "hosts.extra.models.m.parallel: invalid type: string \"two\", expected i64",
            "hosts.extra.weight: invalid type: string \"heavy\", expected u32",
            "lease_idle: invalid type: integer `5`, expected a string",
            "workers: invalid type: string \"many\", expected usize",
            "bogus: unknown key",
        ]
    );
}

#[test]
fn toml_that_does_not_parse_is_one_error_with_its_line() {
    let err = Config::from_toml("workers = [1,\n")
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("config is not valid TOML"), "{err}");
    assert!(err.contains("line"), "{err}");
}

/// Issue 13: one problem line, then the source line indented and a caret under the column.
#[test]
fn a_syntax_error_shows_its_source_line_and_a_caret() {
    let lines = Config::from_toml("workers = 4\nlease_idle = 2h\n")
        .unwrap_err()
        .lines();
    assert_eq!(lines.len(), 3, "{lines:#?}");
    assert!(
        lines[0].starts_with("config is not valid TOML at line 2, column 15: "),
        "{lines:#?}"
    );
    assert_eq!(lines[1], "    lease_idle = 2h");
    assert_eq!(lines[2], "                  ^");
}

/// Issue 13: a typo'd key names the key it probably meant.
#[test]
fn unknown_keys_suggest_the_nearest_one() {
    let text = MINIMAL.replace("parallel = 2", "pararell = 2");
    check_problem(
        &text,
        "hosts.titan.models.qwen.pararell: unknown key; did you mean `parallel`?",
    );
}

/// Issue 13: `5min` has a unit, just not one crossbar knows.
#[test]
fn an_unknown_duration_unit_is_not_a_missing_one() {
    let text = format!("queue_timeout = \"5min\"\n{MINIMAL}");
    check_problem(
        &text,
        "queue_timeout: \"5min\" has an unknown unit \"min\"; use ms, s, m, h or d",
    );
    check_problem(
        &format!("queue_timeout = \"5\"\n{MINIMAL}"),
        "queue_timeout: \"5\" has no unit; use ms, s, m, h or d",
    );
}

/// Issue 13: a host URL ending in /v1 passed `check` and failed at runtime.
#[test]
fn a_host_url_ending_in_v1_is_refused() {
    for url in ["http://10.0.0.1:8080/v1", "http://10.0.0.1:8080/v1/"] {
        let text = MINIMAL.replace("http://10.0.0.1:8080/", url);
        check_problem(
            &text,
            "hosts.titan.url: \"http://10.0.0.1:8080/v1\" ends in /v1; crossbar adds the /v1/... \
             of each request itself: use \"http://10.0.0.1:8080\"",
        );
    }
}

#[test]
fn empty_config_says_what_is_missing() {
    let lines = problems("");
    assert_eq!(
        lines,
        [
            "hosts: no host is configured",
            "routes: no route is configured"
        ]
    );
}

/// Issue 23's keys: `kv_tokens` and `move_when_busy` are checked and default sensibly;
/// `spread_new` is retired — accepted, ignored, and warned about — so old configs keep loading.
#[test]
fn placement_keys_are_checked_and_spread_new_is_a_warning() {
    let cfg = Config::from_toml(MINIMAL).unwrap();
    assert_eq!(cfg.hosts["titan"].kv_tokens, None);
    assert!(!cfg.routes["projA"].move_when_busy);
    // Issue 25: the default listen (0.0.0.0) without [keys] is open to the network: said once.
    assert_eq!(cfg.warnings.len(), 1, "{:?}", cfg.warnings);
    assert!(
        cfg.warnings[0].contains("no [keys] are set"),
        "{:?}",
        cfg.warnings
    );
    let local = format!("listen = \"127.0.0.1:8080\"\n{MINIMAL}");
    assert!(Config::from_toml(&local).unwrap().warnings.is_empty());
    let set = format!("listen = \"127.0.0.1:8080\"\n{MINIMAL}").replace(
        "url = \"http://10.0.0.1:8080/\"",
        "url = \"http://10.0.0.1:8080/\"\nkv_tokens = 131072",
    ) + "move_when_busy = true\nspread_new = true\n";
    let cfg = Config::from_toml(&set).unwrap();
    assert_eq!(cfg.hosts["titan"].kv_tokens, Some(131072));
    assert!(cfg.routes["projA"].move_when_busy);
    assert_eq!(cfg.warnings.len(), 1, "{:?}", cfg.warnings);
    assert!(cfg.warnings[0].starts_with("routes.projA.spread_new is ignored"));
    let zero = MINIMAL.replace(
        "url = \"http://10.0.0.1:8080/\"",
        "url = \"http://10.0.0.1:8080/\"\nkv_tokens = 0",
    );
    check_problem(
        &zero,
        "hosts.titan.kv_tokens: must be at least 1 token; leave it out to use slots x per-slot context",
    );
    // Issue 23: the similarity the host runs with, llama-server's own default unless said.
    assert_eq!(
        cfg.hosts["titan"].slot_prompt_similarity, None,
        "learned from the host"
    );
    let odd = MINIMAL.replace(
        "[hosts.titan.models",
        "slot_prompt_similarity = 1.5\n[hosts.titan.models",
    );
    check_problem(
        &odd,
        "hosts.titan.slot_prompt_similarity: must be from 0 to 1, as llama-server's --slot-prompt-similarity",
    );
    let typo = MINIMAL.to_string() + "move_when_bussy = true\n";
    check_problem(
        &typo,
        "routes.projA.move_when_bussy: unknown key; did you mean `move_when_busy`?",
    );
    let long = MINIMAL.replace(
        "http://10.0.0.1:8080/",
        &format!("http://10.0.0.1:8080/{}", "a".repeat(1100)),
    );
    assert!(problems(&long)
        .iter()
        .any(|l| l.starts_with("hosts.titan.url: is longer than 1024 bytes")));
}

/// Issue 24: `check` refuses a `health_fall` or `health_rise` below 1; the defaults are 3 and 2.
#[test]
fn health_thresholds_are_at_least_one() {
    let cfg = Config::from_toml(MINIMAL).unwrap();
    assert_eq!((cfg.health_fall, cfg.health_rise), (3, 2));
    for key in ["health_fall", "health_rise"] {
        let text = format!("{key} = 0\n{MINIMAL}");
        check_problem(&text, &format!("{key}: must be at least 1"));
        let text = format!("{key} = -1\n{MINIMAL}");
        assert!(
            problems(&text).iter().any(|l| l.starts_with(key)),
            "{key} = -1"
        );
    }
}

mod hosts;
mod shares;
