//! Issue 27: where the db is and what `serve` leaves behind. A relative `db` is the config file's
//! neighbour whatever the working directory; an upgrade that would start on an empty db is refused
//! naming both files; db errors name absolute paths; a start that fails removes the db files it
//! created; `stopped` is logged once the store is closed and its lock released.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crossbar::config::Config;
use crossbar::server::{Server, StartError};
use crossbar::sim::{Sim, SimConfig};
use crossbar::store::DbLock;

use crate::support::{stderr_lines, temp_dir, wait_line};

/// A config in `dir/etc/crossbar.toml` with `db` as written, its host `url`; returns its path.
fn config_in(dir: &Path, db: &str, url: &str, listen: &str) -> PathBuf {
    let etc = dir.join("etc");
    std::fs::create_dir_all(&etc).unwrap();
    let path = etc.join("crossbar.toml");
    let text = format!(
        "listen = \"{listen}\"\nadmin_listen = \"127.0.0.1:0\"\ndb = {db:?}\n\
         [hosts.titan]\nurl = \"{url}\"\nslot_prompt_similarity = 0.1\nram_cache = false\n[hosts.titan.models.m]\nparallel = 1\n\
         [routes.projA]\nhosts = [\"titan\"]\nmodel = \"m\"\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// `crossbar ARGS` run in `cwd`: exit code and stderr.
fn crossbar(cwd: &Path, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_crossbar"))
        .current_dir(cwd)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn issue27_a_relative_db_is_next_to_the_config_from_any_directory() {
    let dir = temp_dir();
    let cwd = dir.join("cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    let sim = Sim::start(SimConfig::default());
    let config = config_in(&dir, "state.db", &sim.url(), "127.0.0.1:0");
    let want = dir.join("etc").join("state.db");

    // Before the db exists, `report` names where it looks, absolutely.
    let (code, stderr) = crossbar(&cwd, &["report", "-c", "../etc/crossbar.toml"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("no database at {}", want.display())),
        "{stderr}"
    );

    let loaded = Config::load(&config).unwrap();
    assert_eq!(loaded.db, want);
    let server = Server::start(loaded).unwrap();
    server.stop(Duration::from_secs(1));
    assert!(want.exists() && !cwd.join("state.db").exists());

    // `backup` names its copy absolutely too; `check`'s unwritable directory as well.
    std::fs::write(cwd.join("copy.db"), b"").unwrap();
    let (code, stderr) = crossbar(&cwd, &["backup", "-c", "../etc/crossbar.toml", "copy.db"]);
    assert_eq!(code, Some(1), "{stderr}");
    let copy = cwd.join("copy.db");
    assert!(
        stderr.contains(&format!("{} exists", copy.display())),
        "{stderr}"
    );
    config_in(&dir, "gone/state.db", &sim.url(), "127.0.0.1:0");
    let (code, stderr) = crossbar(&cwd, &["check", "-c", "../etc/crossbar.toml"]);
    assert_eq!(code, Some(1), "{stderr}");
    let gone = dir.join("etc").join("gone");
    assert!(
        stderr.contains(&format!("directory {} is not writable", gone.display())),
        "{stderr}"
    );
}

#[test]
fn issue27_an_upgrade_that_would_start_on_an_empty_db_is_refused_naming_both() {
    let dir = temp_dir();
    let cwd = dir.join("var");
    std::fs::create_dir_all(&cwd).unwrap();
    let config = config_in(&dir, "crossbar.db", "http://127.0.0.1:9", "127.0.0.1:0");
    // The db where a crossbar before issue 27 put it: the working directory (systemd's).
    std::fs::write(cwd.join("crossbar.db"), b"").unwrap();
    let (old, new) = (cwd.join("crossbar.db"), dir.join("etc").join("crossbar.db"));
    for command in ["check", "serve"] {
        let (code, stderr) = crossbar(&cwd, &[command, "-c", config.to_str().unwrap()]);
        assert_eq!(code, Some(1), "{command}: {stderr}");
        assert!(
            stderr.starts_with("db: \"crossbar.db\" is now read next to the config file"),
            "{stderr}"
        );
        for path in [&old, &new] {
            assert!(
                stderr.contains(&path.display().to_string()),
                "{command}: {stderr}"
            );
        }
        assert!(!new.exists(), "{command} created {}", new.display());
    }
    // From the config's own directory the two are one file: nothing to refuse.
    let (code, stderr) = crossbar(&dir.join("etc"), &["check", "-c", "crossbar.toml"]);
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn issue27_a_start_that_cannot_bind_leaves_no_db_or_lock_it_created() {
    let dir = temp_dir();
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let db = dir.join("etc").join("crossbar.db");
    let db_text = db.to_str().unwrap();
    let config = config_in(&dir, db_text, "http://127.0.0.1:9", &addr);
    let err = Server::start(Config::load(&config).unwrap()).unwrap_err();
    assert!(matches!(err, StartError::Bind { .. }), "{err}");
    let left: Vec<_> = std::fs::read_dir(dir.join("etc"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["crossbar.toml"]);

    // A db that was there stays, and so does its lock file.
    let free = config_in(&dir, db_text, "http://127.0.0.1:9", "127.0.0.1:0");
    Server::start(Config::load(&free).unwrap())
        .unwrap()
        .stop(Duration::from_secs(1));
    config_in(&dir, db_text, "http://127.0.0.1:9", &addr);
    assert!(Server::start(Config::load(&config).unwrap()).is_err());
    assert!(db.exists() && crossbar::store::lock_path(&db).exists());
}

#[test]
fn issue27_stopped_is_logged_once_the_store_is_closed_and_unlocked() {
    let dir = temp_dir();
    let sim = Sim::start(SimConfig::default());
    let db = dir.join("etc").join("crossbar.db");
    let config = config_in(&dir, db.to_str().unwrap(), &sim.url(), "127.0.0.1:0");
    let mut child = Command::new(env!("CARGO_BIN_EXE_crossbar"))
        .args(["serve", "-c", config.to_str().unwrap()])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = stderr_lines(&mut child);
    let mut seen = Vec::new();
    wait_line(&log, &mut seen, "crossbar listening");
    assert!(DbLock::holder(&db).is_some());
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    wait_line(&log, &mut seen, "stopped");
    // The line is out: the store is closed (no WAL left) and the lock is free.
    assert_eq!(DbLock::holder(&db), None, "{seen:#?}");
    let mut wal = db.clone().into_os_string();
    wal.push("-wal");
    assert!(!PathBuf::from(wal).exists(), "{seen:#?}");
    assert!(child.wait().unwrap().success());
}
