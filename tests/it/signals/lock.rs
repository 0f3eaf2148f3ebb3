//! One db, one gateway (issue 17), with real `crossbar serve` processes: the second is refused
//! naming the first's pid, and a SIGKILLed first leaves no lock behind.

use std::process::Command;

use super::*;

/// Issue 17: two `serve`s on one db each kept their own lease table and wrote the same file. The
/// second is refused, naming the first's pid; a SIGKILLed first leaves no lock behind.
#[test]
fn issue17_a_second_serve_on_one_db_is_refused_and_a_killed_one_never_blocks_a_restart() {
    let titan = sim();
    let mut crossbar = Crossbar::start(|head| {
        format!(
            "{head}{}[routes.projA]\nhosts = [\"titan\"]\nmodel = \"m\"\n",
            host_text("titan", &titan)
        )
    });
    check_ok(&crossbar.post(CHAT, &chat("hi", 0, false)), "titan", "new");
    // The second: other ports, same db.
    let text = std::fs::read_to_string(&crossbar.config).unwrap();
    let other = crossbar.dir.join("other.toml");
    let rest: String = text.lines().skip(2).map(|l| format!("{l}\n")).collect();
    let head = format!(
        "listen = \"{}\"\nadmin_listen = \"{}\"\n",
        free_port(),
        free_port()
    );
    std::fs::write(&other, head + &rest).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_crossbar"))
        .args(["serve", "-c"])
        .arg(&other)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let want = format!(
        "database {} is in use by another crossbar (pid {})",
        crossbar.dir.join("crossbar.db").display(),
        crossbar.child.id()
    );
    assert!(stderr.contains(&want), "{stderr}");

    crossbar.signal("KILL");
    crossbar.wait_exit();
    crossbar.respawn();
    check_ok(
        &crossbar.post(CHAT, &chat("hi", 0, false)),
        "titan",
        "reused",
    );
}

/// A db that cannot be opened stops `serve` with one line that names it once, then SQLite's cause
/// (review finding: the store error was printed twice, as its own cause).
#[test]
fn a_db_that_cannot_be_opened_is_named_once_with_its_cause() {
    let dir = temp_dir();
    let db = dir.join("a-directory.db");
    std::fs::create_dir_all(&db).unwrap();
    let config = dir.join("crossbar.toml");
    let text = format!(
        "listen = \"{}\"\nadmin_listen = \"{}\"\ndb = {db:?}\n\
         [hosts.titan]\nurl = \"http://127.0.0.1:9\"\n[hosts.titan.models.m]\nparallel = 1\n\
         [routes.projA]\nhosts = [\"titan\"]\nmodel = \"m\"\n",
        free_port(),
        free_port(),
    );
    std::fs::write(&config, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_crossbar"))
        .args(["serve", "-c"])
        .arg(&config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.contains("unable to open database file"), "{stderr}");
    assert_eq!(
        last.matches("cannot open or write database").count(),
        1,
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
