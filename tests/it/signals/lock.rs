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
