//! The operator's CLI verbs run as the real binary against a running crossbar, and the log of a
//! real `crossbar serve` process, which must never show the admin token.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crossbar::sim::{Sim, SimConfig};
use serde_json::Value;

use super::turn;
use crate::support::{host, request, temp_dir, wait_until, Harness};

/// What one run of the binary printed, and how it exited.
#[derive(Debug)]
pub(super) struct Run {
    pub(super) code: Option<i32>,
    pub(super) stdout: String,
    pub(super) stderr: String,
}

/// Runs `crossbar ARGS` in `dir` (which holds no `crossbar.toml`, so nothing is read by accident).
pub(super) fn crossbar(dir: &Path, args: &[&str]) -> Run {
    crossbar_to(dir, args, Stdio::piped())
}

/// [`crossbar`] with its stdout going to `stdout`.
pub(super) fn crossbar_to(dir: &Path, args: &[&str], stdout: Stdio) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_crossbar"))
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .output()
        .expect("the crossbar binary runs");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// An operator verb against the harness's admin listener.
pub(super) fn verb(h: &Harness, args: &[&str]) -> Run {
    let admin = format!("http://{}", h.server().admin_addr());
    let mut all = vec!["--admin", admin.as_str()];
    all.extend_from_slice(args);
    crossbar(&h.dir, &all)
}

/// Exit 0, nothing on stderr; returns stdout.
#[track_caller]
pub(super) fn check_ok(run: &Run) -> &str {
    assert_eq!(run.code, Some(0), "{run:#?}");
    assert_eq!(run.stderr, "", "{run:#?}");
    &run.stdout
}

/// Exit 1 with exactly one line on stderr that mentions `mentions`.
#[track_caller]
pub(super) fn check_fails(run: &Run, mentions: &str) {
    assert_eq!(run.code, Some(1), "{run:#?}");
    assert_eq!(run.stderr.lines().count(), 1, "{run:#?}");
    assert!(run.stderr.contains(mentions), "{run:#?}");
}

/// A valid config whose db is `db` and whose single host is `url`; for `report` and `serve`.
pub(super) fn write_config(dir: &Path, db: &Path, url: &str, extra: &str) -> PathBuf {
    let text = format!(
        "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ndb = {db:?}\n{extra}\n\
         [hosts.titan]\nurl = \"{url}\"\nslot_prompt_similarity = 0.1\nram_cache = false\n[hosts.titan.models.m]\nparallel = 1\n\
         [routes.projA]\nhosts = [\"titan\"]\nmodel = \"m\"\n"
    );
    let path = dir.join("ops.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn every_operator_verb_works_against_a_running_crossbar() {
    let h = Harness::start(vec![host("titan", 1), host("mini", 1)], "");
    assert_eq!(turn(&h, "cli conversation", 0).0, "titan");
    assert_eq!(turn(&h, "cli conversation", 1).0, "titan");

    let table = verb(&h, &["status"]);
    for shown in ["HOST", "titan", "mini", "projA", "served from cache: "] {
        assert!(check_ok(&table).contains(shown), "{table:#?}");
    }
    // What crossbar knows of each host that it does not report, and whence (issue 47): the
    // harness states both facts in the config.
    for shown in [
        "SIMILARITY",
        "RAM CACHE",
        "PINNING",
        "on (config)",
        "no (config)",
    ] {
        assert!(check_ok(&table).contains(shown), "{table:#?}");
    }
    let json: Value = serde_json::from_str(check_ok(&verb(&h, &["status", "--json"]))).unwrap();
    assert_eq!(json["hosts"].as_array().map(Vec::len), Some(2));
    let leases = verb(&h, &["leases"]);
    assert!(check_ok(&leases).contains("titan"), "{leases:#?}");
    let json: Value = serde_json::from_str(check_ok(&verb(&h, &["leases", "--json"]))).unwrap();
    assert_eq!(json["leases"].as_array().map(Vec::len), Some(1));

    let out = verb(&h, &["drain", "titan"]);
    assert!(check_ok(&out).contains("1 leases remain"), "{out:#?}");
    assert!(h.server().gateway().drains.contains("titan"));
    let out = verb(&h, &["drain", "titan", "--off"]);
    assert!(
        check_ok(&out).contains("takes new leases again"),
        "{out:#?}"
    );
    assert!(!h.server().gateway().drains.contains("titan"));

    let out = verb(&h, &["pin", "projA", "mini"]);
    assert!(check_ok(&out).contains("dropped 1 leases"), "{out:#?}");
    let out = verb(&h, &["leases"]);
    assert!(check_ok(&out).contains("pin: projA -> mini"), "{out:#?}");
    let out = verb(&h, &["unpin", "projA"]);
    assert!(check_ok(&out).starts_with("unpinned projA"), "{out:#?}");
    assert!(h.server().gateway().leases.pins().is_empty());
    turn(&h, "after the pin", 0);
    let out = verb(&h, &["release", "projA"]);
    assert!(check_ok(&out).contains("dropped 1 leases"), "{out:#?}");

    check_fails(&verb(&h, &["drain", "nope"]), "nope");
    check_fails(&verb(&h, &["pin", "projA", "nope"]), "nope");
    check_fails(&verb(&h, &["release", "projZ"]), "projZ");
    check_fails(&verb(&h, &["pin", "projA"]), "ROUTE HOST");
    check_fails(
        &crossbar(&h.dir, &["status"]),
        "tried ./crossbar.toml and /etc/crossbar/crossbar.toml",
    );
    let nowhere = crossbar(&h.dir, &["status", "--admin", "http://127.0.0.1:1"]);
    check_fails(&nowhere, "cannot reach");
}

#[test]
fn report_reads_the_db_and_its_figures_match_the_rows() {
    let h = Harness::start(vec![host("titan", 1)], "");
    for turns in 0..3 {
        turn(&h, "report conversation", turns);
    }
    // An unknown route's 404 keeps no row (issue 46): the report counts the three turns.
    assert_eq!(h.post("/nope/v1/models", &Value::Null).status, 404);
    wait_until("three rows", || h.rows().len() == 3);
    let rows = h.rows();
    let config = write_config(&h.dir, &h.dir.join("crossbar.db"), "http://127.0.0.1:1", "");
    let config = config.to_str().unwrap();

    let out = crossbar(&h.dir, &["report", "-c", config, "--since", "1h", "--json"]);
    let lines: Value = serde_json::from_str(check_ok(&out)).unwrap();
    let lines = lines.as_array().unwrap();
    let requests: u64 = lines.iter().map(|l| l["requests"].as_u64().unwrap()).sum();
    assert_eq!(requests, rows.len() as u64, "{lines:#?}");
    let titan = lines.iter().find(|l| l["host"] == "titan").unwrap();
    assert_eq!(
        (titan["route"].clone(), titan["requests"].clone()),
        ("projA".into(), 3.into())
    );
    let cached: i64 = rows.iter().filter_map(|r| r.cached_tokens).sum();
    assert!(cached > 0, "later turns hit the cache: {rows:#?}");
    assert_eq!(titan["cached_tokens"], cached);
    let prompt: i64 = rows.iter().filter_map(|r| r.prompt_tokens).sum();
    assert_eq!(titan["prompt_tokens"], prompt);

    let out = crossbar(&h.dir, &["report", "-c", config, "--since", "1h"]);
    let text = check_ok(&out);
    assert!(text.starts_with("requests in the last 1h"), "{text}");
    assert!(
        text.contains("projA") && text.contains(&cached.to_string()),
        "{text}"
    );

    let empty = temp_dir();
    let missing = write_config(&empty, &empty.join("none.db"), "http://127.0.0.1:1", "");
    let out = crossbar(&empty, &["report", "-c", missing.to_str().unwrap()]);
    check_fails(&out, "no database");
}

#[test]
fn the_cli_sends_the_token_and_fails_cleanly_without_it() {
    let token = "cli-t0ken-77";
    let h = Harness::start(vec![host("titan", 1)], &format!("admin_token = {token:?}"));
    check_fails(&verb(&h, &["status"]), "401");
    check_fails(&verb(&h, &["status", "--token", "wrong"]), "401");
    let out = verb(&h, &["status", "--token", token]);
    assert!(check_ok(&out).contains("titan"), "{out:#?}");
    let out = verb(&h, &["drain", "titan", "--token", token]);
    assert!(!check_ok(&out).contains(token));
}

#[test]
fn a_serving_crossbar_never_logs_its_admin_token() {
    let token = "never-log-me-5150";
    let dir = temp_dir();
    let sim = Sim::start(SimConfig::default());
    let extra = format!("admin_token = {token:?}\nlog_level = \"debug\"");
    let config = write_config(&dir, &dir.join("crossbar.db"), &sim.url(), &extra);
    let mut child = Command::new(env!("CARGO_BIN_EXE_crossbar"))
        .args(["serve", "-c", config.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut log = String::new();
    let admin = loop {
        let mut line = String::new();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "serve exited: {log}"
        );
        log.push_str(&line);
        if let Some(addr) = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("admin="))
        {
            break addr.parse().unwrap();
        }
    };
    let good = format!("Bearer {token}");
    let wrong = format!("Bearer {token}x");
    for header in [good.as_str(), wrong.as_str(), token] {
        request(
            admin,
            "GET",
            "/admin/status",
            &[("Authorization", header)],
            b"",
        );
        let body = br#"{"host":"titan","on":true}"#;
        request(
            admin,
            "POST",
            "/admin/drain",
            &[("Authorization", header)],
            body,
        );
    }
    // Issue 27: the sign-in form's token, right or wrong, and one put in a URL by mistake.
    let form = [("Content-Type", "application/x-www-form-urlencoded")];
    for body in [format!("token={token}"), format!("token={token}x")] {
        request(admin, "POST", "/signin", &form, body.as_bytes());
    }
    request(admin, "GET", &format!("/signin?token={token}"), &[], b"");
    let url = format!("http://{admin}");
    check_fails(
        &crossbar(&dir, &["status", "--admin", &url, "--token", "x"]),
        "401",
    );
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    stderr.read_to_string(&mut log).unwrap();
    assert!(child.wait().unwrap().success(), "{log}");
    assert!(log.contains("status=401"), "the log was captured: {log}");
    assert!(log.contains("drain host=titan"), "{log}");
    assert!(log.contains("admin signed in"), "{log}");
    assert!(
        !log.contains(token),
        "the token leaked into the log:\n{log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 13: `--version`, each command's own help, and `--admin` in the form `admin_listen` takes.
#[test]
fn version_per_command_help_and_a_bare_admin_address() {
    let h = Harness::start(vec![host("titan", 1)], "");
    let version = crossbar(&h.dir, &["--version"]);
    let version = check_ok(&version);
    assert_eq!(
        version,
        format!("crossbar {}\n", crossbar::version::describe())
    );
    // Issue 48: which build, not only which release: the commit git has for this checkout.
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output();
    match head {
        Ok(out) if out.status.success() => {
            let head = String::from_utf8_lossy(&out.stdout).trim().to_string();
            let want = format!("crossbar {} (commit {head}", env!("CARGO_PKG_VERSION"));
            assert!(version.starts_with(&want), "{version:?}, HEAD {head}");
        }
        _ => assert!(
            version.contains("(unknown commit: built without git)"),
            "{version:?}"
        ),
    }
    let global = crossbar(&h.dir, &["--help"]);
    let serve = crossbar(&h.dir, &["serve", "--help"]);
    assert!(
        check_ok(&serve).starts_with("crossbar serve — "),
        "{serve:#?}"
    );
    assert!(check_ok(&serve).contains("SIGHUP"), "{serve:#?}");
    assert_ne!(serve.stdout, global.stdout);
    let drain = crossbar(&h.dir, &["drain", "--help"]);
    assert!(check_ok(&drain).contains("--off"), "{drain:#?}");
    assert!(
        check_ok(&global).contains("report [--since DUR]"),
        "{global:#?}"
    );

    let bare = h.server().admin_addr().to_string();
    let status = crossbar(&h.dir, &["status", "--admin", &bare]);
    assert!(check_ok(&status).contains("titan"), "{status:#?}");
}

/// Issue 17: `crossbar status` says the store is failing, with its cause, while writes fail.
#[test]
fn status_says_the_store_is_failing_while_it_is() {
    let h = Harness::start(vec![host("titan", 1)], "");
    let failed = h.fill_store();
    assert_eq!(failed.status, 503, "{}", failed.text());
    let table = verb(&h, &["status"]);
    let out = check_ok(&table);
    assert!(out.contains("STORE FAILING since"), "{out}");
    assert!(out.contains("database or disk is full"), "{out}");
    h.unfill_store();
}
