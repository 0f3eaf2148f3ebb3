//! One db, one gateway; store failures that explain themselves (issue 17): a second `serve` on the
//! same db is refused, a full disk answers 503 and shows in status and `/metrics` until space
//! returns, readers never write, `backup` copies a live db, `check` looks at the db's directory.

use std::process::Command;
use std::time::Duration;

use crossbar::config::Config;
use crossbar::server::Server;
use crossbar::store::{self, Reader};
use serde_json::json;

use crate::support::{chat, host, request, temp_dir, Answer, Harness};

const CHAT: &str = "/projA/v1/chat/completions";

fn session(h: &Harness, id: &str) -> Answer {
    h.post_with(CHAT, &[("X-Session-Id", id)], &chat("hi", 0, false))
}

/// The harness's config text pointed at another db (and fresh ports).
fn config_on(h: &Harness, db: &std::path::Path) -> Config {
    let text = format!(
        "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ndb = {db:?}\n\
         [hosts.titan]\nurl = \"{}\"\nslot_prompt_similarity = 0.1\nram_cache = false\n[hosts.titan.models.m]\nparallel = 1\n\
         [routes.projA]\nhosts = [\"titan\"]\nmodel = \"m\"\n",
        h.sim("titan").url()
    );
    Config::from_toml(&text).unwrap()
}

#[test]
fn issue17_a_second_gateway_on_the_same_db_is_refused_with_the_holders_pid() {
    let h = Harness::start(vec![host("titan", 1)], "");
    let db = h.dir.join("crossbar.db");
    let err = Server::start(config_on(&h, &db)).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "database {} is in use by another crossbar (pid {})",
            db.display(),
            std::process::id()
        )
    );
    // Readers are not blocked.
    assert_eq!(Reader::open(&db).unwrap().list_leases().unwrap(), vec![]);
}

#[test]
fn issue17_a_full_disk_answers_503_store_unavailable_then_recovers() {
    let h = Harness::start(vec![host("titan", 1)], "");
    let gw = h.server().gateway().clone();
    assert_eq!(session(&h, "warm").status, 200);
    // SQLite's own size cap: the file may not grow past its current pages.
    let refused = h.fill_store();
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(refused.error_fields(), json!({"code": "store unavailable"}));
    assert_eq!(refused.header("Retry-After"), Some("5"));
    let status = crossbar::admin::status(&gw);
    assert_eq!(status["store"]["ok"], json!(false), "{status:#}");
    let cause = status["store"]["cause"].as_str().unwrap();
    assert!(cause.contains("database or disk is full"), "{cause}");
    let metrics = request(h.server().admin_addr(), "GET", "/metrics", &[], b"");
    assert!(metrics.text().contains("crossbar_store_up 0"));
    // The status page says it too, with the cause (escaped), first thing an operator sees.
    let page = request(h.server().admin_addr(), "GET", "/", &[], b"").text();
    assert!(page.contains("store failing"), "{page}");
    assert!(page.contains("database or disk is full"), "{page}");
    // A conversation that already has its lease is still served (its touch is written behind).
    assert_eq!(session(&h, "warm").status, 200);

    h.unfill_store();
    let answer = session(&h, "after");
    assert_eq!(answer.status, 200, "{}", answer.text());
    // Recovery is declared after a run of good writes (a nearly full disk flaps); every new
    // conversation is two (its lease, its row).
    for i in 0..5 {
        assert_eq!(session(&h, &format!("after{i}")).status, 200);
    }
    assert_eq!(crossbar::admin::status(&gw)["store"]["ok"], json!(true));
    let page = request(h.server().admin_addr(), "GET", "/", &[], b"").text();
    assert!(!page.contains("store failing"), "{page}");
    let metrics = request(h.server().admin_addr(), "GET", "/metrics", &[], b"");
    assert!(metrics.text().contains("crossbar_store_up 1"));
}

#[test]
fn issue17_report_reads_a_copy_without_writing_and_refuses_schemas_it_does_not_know() {
    let h = Harness::start(vec![host("titan", 1)], "");
    assert_eq!(session(&h, "a").status, 200);
    let copy = h.dir.join("copy.db");
    store::backup(&h.dir.join("crossbar.db"), &copy).unwrap();
    let before = std::fs::read(&copy).unwrap();
    let text = crossbar::report::run(&copy, Duration::from_secs(3600), None, true, false).unwrap();
    assert!(text.contains("\"requests\": 1"), "{text}");
    assert_eq!(std::fs::read(&copy).unwrap(), before, "the reader wrote");
    assert!(!h.dir.join("copy.db-wal").exists());

    let known = Reader::open(&copy).unwrap().schema_version().unwrap();
    set_version(&copy, known + 1);
    let err =
        crossbar::report::run(&copy, Duration::from_secs(60), None, false, false).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("schema version {}", known + 1)),
        "{msg}"
    );
    assert!(msg.contains("run a newer crossbar"), "{msg}");
    set_version(&copy, known - 1);
    let msg = crossbar::report::run(&copy, Duration::from_secs(60), None, false, false)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("readers never migrate"), "{msg}");
    assert_eq!(user_version(&copy), known - 1, "report migrated the file");
}

/// Sets `user_version` the way an older or newer crossbar would have left it.
fn set_version(path: &std::path::Path, v: i64) {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.pragma_update(None, "user_version", v).unwrap();
}

fn user_version(path: &std::path::Path) -> i64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn issue17_backup_during_traffic_restores_to_the_same_leases() {
    let h = Harness::start(vec![host("titan", 2)], "");
    for i in 0..20 {
        assert_eq!(session(&h, &format!("before{i}")).status, 200);
    }
    let before: Vec<_> = h.server().gateway().leases.snapshot();
    let copy = h.dir.join("backup.db");
    let report = std::thread::scope(|s| {
        let traffic = s.spawn(|| {
            (0..40)
                .map(|i| session(&h, &format!("during{i}")).status)
                .collect::<Vec<_>>()
        });
        let report = store::backup(&h.dir.join("crossbar.db"), &copy).unwrap();
        assert!(traffic.join().unwrap().iter().all(|s| *s == 200));
        report
    });
    assert_eq!(report.integrity, "ok");
    assert!(report.leases >= 20, "{report:?}");
    assert!(store::backup(&h.dir.join("crossbar.db"), &copy)
        .unwrap_err()
        .to_string()
        .contains("never overwrites"));

    // A gateway started on the copy has every lease the backup saw, on the same hosts.
    let restored = Server::start(config_on(&h, &copy)).unwrap();
    let leases = restored.gateway().leases.snapshot();
    assert_eq!(leases.len() as i64, report.leases);
    for lease in &before {
        assert!(leases.contains(lease), "{lease:?} missing after restore");
    }
    restored.stop(Duration::from_secs(5));
}

#[test]
fn issue17_check_refuses_an_unwritable_db_directory_and_notes_a_running_gateway() {
    let h = Harness::start(vec![host("titan", 1)], "");
    let check = |db: &std::path::Path| {
        let dir = temp_dir();
        let path = dir.join("crossbar.toml");
        let text = format!(
            "db = {db:?}\n[hosts.titan]\nurl = \"{}\"\nslot_prompt_similarity = 0.1\nram_cache = false\n[hosts.titan.models.m]\nparallel = 1\n\
             [routes.projA]\nhosts = [\"titan\"]\nmodel = \"m\"\n",
            h.sim("titan").url()
        );
        std::fs::write(&path, text).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_crossbar"))
            .args(["check", "-c"])
            .arg(&path)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    };
    // The running harness holds its db: a note, and still ok.
    let (ok, text) = check(&h.dir.join("crossbar.db"));
    assert!(ok, "{text}");
    let note = format!("in use by a running crossbar (pid {})", std::process::id());
    assert!(text.contains(&note), "{text}");
    assert!(text.contains("ok\n"), "{text}");
    // A "directory" that is a file: nothing can be created in it, not even by root.
    let file = h.dir.join("not-a-dir");
    std::fs::write(&file, "").unwrap();
    let (ok, text) = check(&file.join("crossbar.db"));
    assert!(!ok, "{text}");
    assert!(text.contains("is not writable"), "{text}");
}
