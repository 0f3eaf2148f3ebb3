//! `crossbar check`: the example passes, every mistake of a bad config is named by its key, a db
//! about to be migrated is said, and `--hosts` asks each host what it runs.

use std::path::Path;

use super::cli::{check_fails, check_ok, crossbar, write_config};
use crate::support::{host, temp_dir, Harness};

/// What `check` prints of a good config when no host was asked.
const NO_HOST_ASKED: &str = "note: no host was asked (check --hosts reads each one's slots and \
                             probes its similarity and RAM cache)\nok\n";

/// Issue 2's "Done when": `crossbar check` on the shipped example prints `ok`; a config with five
/// different mistakes prints five lines, each naming its key, and exits 1.
#[test]
fn check_passes_the_example_and_names_every_mistake_of_a_bad_config() {
    let dir = temp_dir();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("crossbar.toml");
    let run = crossbar(&dir, &["check", "-c", example.to_str().unwrap()]);
    // The example listens on the LAN without [keys]: check passes and says so (issue 25). It
    // asks none of its LAN hosts (issue 47: only `--hosts` does), and says that too.
    assert_eq!(
        (run.code, run.stdout.as_str()),
        (Some(0), NO_HOST_ASKED),
        "{run:#?}"
    );
    assert!(run.stderr.contains("no [keys] are set"), "{run:#?}");

    // Issue 10: an admin API reachable from the LAN without a token is worth a warning.
    let open = dir.join("open.toml");
    let text = std::fs::read_to_string(&example).unwrap();
    let text = text.replace(
        "admin_listen = \"127.0.0.1:8081\"",
        "admin_listen = \"0.0.0.0:8081\"",
    );
    assert!(
        text.contains("0.0.0.0:8081"),
        "the example still sets admin_listen"
    );
    std::fs::write(&open, text).unwrap();
    let run = crossbar(&dir, &["check", "-c", open.to_str().unwrap()]);
    assert_eq!(
        (run.code, run.stdout.as_str()),
        (Some(0), NO_HOST_ASKED),
        "{run:#?}"
    );
    assert!(
        run.stderr
            .contains("warning: admin_listen 0.0.0.0:8081 is not loopback"),
        "{run:#?}"
    );

    let bad = dir.join("bad.toml");
    std::fs::write(
        &bad,
        "colour = \"blue\"\nlease_idle = \"forever\"\n\
         [hosts.titan]\nurl = \"ftp://titan\"\n[hosts.titan.models.m]\nparallel = 0\n\
         [routes.projA]\nhosts = [\"titan\", \"ghost\"]\nmodel = \"m\"\n",
    )
    .unwrap();
    let run = crossbar(&dir, &["check", "-c", bad.to_str().unwrap()]);
    assert_eq!(run.code, Some(1), "{run:#?}");
    assert_eq!(run.stdout, "", "{run:#?}");
    let mut keys: Vec<&str> = run
        .stderr
        .lines()
        .map(|l| l.split_once(": ").map_or(l, |(key, _)| key))
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "colour",
            "hosts.titan.models.m.parallel",
            "hosts.titan.url",
            "lease_idle",
            "routes.projA.hosts",
        ],
        "{run:#?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 48: `check` printed `ok` on a db `serve` was about to migrate. It says so now, and
/// that the backup taken before the upgrade is the way back; a db a newer crossbar wrote, which
/// `serve` would refuse, fails the check.
#[test]
fn check_says_when_serve_will_migrate_the_db_and_the_way_back_issue_48() {
    let h = Harness::start(vec![host("titan", 1)], "");
    let copy = h.dir.join("week-old.db");
    crossbar::store::backup(&h.dir.join("crossbar.db"), &copy).unwrap();
    let known = crossbar::store::Reader::open(&copy)
        .unwrap()
        .schema_version()
        .unwrap();
    let set_version = |v: i64| {
        let conn = rusqlite::Connection::open(&copy).unwrap();
        conn.pragma_update(None, "user_version", v).unwrap();
    };
    let config = write_config(&h.dir, &copy, "http://127.0.0.1:9", "");
    let config = config.to_str().unwrap();
    let current = crossbar(&h.dir, &["check", "-c", config]);
    assert_eq!(check_ok(&current), NO_HOST_ASKED);
    set_version(known - 3);
    let old = crossbar(&h.dir, &["check", "-c", config]);
    let out = check_ok(&old);
    let want = format!(
        "has schema version {}; `serve` will migrate it to version {known} when it starts",
        known - 3
    );
    assert!(out.contains(&want), "{out}");
    assert!(
        out.contains("the way back is the backup taken before the upgrade"),
        "{out}"
    );
    assert!(out.ends_with("ok\n"), "{out}");
    set_version(known + 1);
    let newer = crossbar(&h.dir, &["check", "-c", config]);
    check_fails(&newer, "run a newer crossbar");
}

/// Issue 13: `check` names a typo'd key's likely meaning, shows where TOML broke, and says a
/// host URL must not end in /v1.
#[test]
fn check_explains_typos_syntax_errors_and_a_v1_url() {
    let dir = temp_dir();
    let path = dir.join("typo.toml");
    let db = dir.join("x.db");
    let good = write_config(&dir, &db, "http://127.0.0.1:9/v1", "");
    let text = std::fs::read_to_string(&good)
        .unwrap()
        .replace("parallel", "pararell");
    std::fs::write(&path, text).unwrap();
    let run = crossbar(&dir, &["check", "-c", path.to_str().unwrap()]);
    assert_eq!(run.code, Some(1), "{run:#?}");
    assert!(
        run.stderr
            .contains("hosts.titan.models.m.pararell: unknown key; did you mean `parallel`?"),
        "{run:#?}"
    );
    assert!(
        run.stderr
            .contains("hosts.titan.url: \"http://127.0.0.1:9/v1\" ends in /v1"),
        "{run:#?}"
    );

    std::fs::write(&path, "workers = 4\nqueue_timeout = 5min\n").unwrap();
    let run = crossbar(&dir, &["check", "-c", path.to_str().unwrap()]);
    assert_eq!(run.code, Some(1), "{run:#?}");
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(lines.len(), 3, "{run:#?}");
    assert!(lines[0].contains("at line 2, column"), "{run:#?}");
    assert_eq!(lines[1], "    queue_timeout = 5min");
    assert_eq!(lines[2].trim(), "^");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 47: `check --hosts` asks each host what it runs and warns where the config says
/// otherwise: a `parallel` above its slots, a similarity its slot choice contradicts. A host that
/// does not answer is said not checked.
#[test]
fn check_hosts_warns_where_a_host_contradicts_its_config_issue_47() {
    let sim = crossbar::sim::Sim::start(crossbar::sim::SimConfig {
        slots: 2,
        ..crossbar::sim::SimConfig::default()
    });
    let dir = temp_dir();
    let config = dir.join("crossbar.toml");
    let text = format!(
        "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ndb = {:?}\n\
         [hosts.box]\nurl = \"{}\"\nslot_prompt_similarity = 0\n[hosts.box.models.m]\nparallel = 4\n\
         [hosts.gone]\nurl = \"http://127.0.0.1:9\"\n\
         [routes.r]\nhosts = [\"box\", \"gone\"]\nmodel = \"m\"\n",
        dir.join("crossbar.db"),
        sim.url()
    );
    std::fs::write(&config, text).unwrap();
    let run = crossbar(&dir, &["check", "--hosts", "-c", config.to_str().unwrap()]);
    assert_eq!(run.code, Some(0), "{run:#?}");
    for warned in [
        "hosts.box.models.m.parallel is 4 but the host runs 2 slots",
        "hosts.box.slot_prompt_similarity says off but the host behaves as on",
    ] {
        assert!(run.stderr.contains(warned), "{run:#?}");
    }
    assert!(run.stdout.contains("host gone did not answer"), "{run:#?}");
    assert!(run.stdout.ends_with("ok\n"), "{run:#?}");
}
