//! Issue 27: `crossbar status --json | head -1` panicked (exit 101, "failed printing to stdout")
//! once `head` had gone. Every command ends quietly when whoever reads its output has left.

use std::process::Stdio;

use super::cli::{crossbar_to, write_config, Run};
use super::turn;
use crate::support::{host, Harness};

/// Runs `crossbar ARGS` in `dir` with its stdout a pipe whose reader is already gone, so its first
/// write fails with a broken pipe, as `| head -1`'s does once `head` has its line.
fn into_closed_pipe(dir: &std::path::Path, args: &[&str]) -> Run {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    crossbar_to(dir, args, Stdio::from(writer))
}

#[test]
fn issue27_every_command_ends_quietly_when_its_reader_has_left() {
    let h = Harness::start(vec![host("titan", 1)], "");
    turn(&h, "piped conversation", 0);
    let admin = format!("http://{}", h.server().admin_addr());
    let config = write_config(&h.dir, &h.dir.join("crossbar.db"), "http://127.0.0.1:1", "");
    let config = config.to_str().unwrap();
    let copy = h.dir.join("copy.db");
    let copy = copy.to_str().unwrap();
    let verbs: &[&[&str]] = &[
        &["status"],
        &["status", "--json"],
        &["leases"],
        &["leases", "--json"],
        &["drain", "titan"],
        &["drain", "titan", "--off"],
        &["pin", "projA", "titan"],
        &["unpin", "projA"],
        &["release", "projA"],
    ];
    let local: &[&[&str]] = &[
        &["--version"],
        &["--help"],
        &["status", "--help"],
        &["check", "-c", config],
        &["report", "-c", config],
        &["report", "-c", config, "--json"],
        &["backup", "-c", config, copy],
    ];
    let verbs = verbs
        .iter()
        .map(|args| [&["--admin", admin.as_str()], *args].concat());
    for args in verbs.chain(local.iter().map(|args| args.to_vec())) {
        let run = into_closed_pipe(&h.dir, &args);
        assert_eq!(
            (run.code, run.stderr.as_str()),
            (Some(0), ""),
            "{args:?}: {run:#?}"
        );
    }
    // The commands did their work all the same.
    assert!(std::path::Path::new(copy).exists());
    // A failure is still one line on stderr, exit 1.
    let run = into_closed_pipe(&h.dir, &["--admin", &admin, "drain", "nope"]);
    assert_eq!(run.code, Some(1), "{run:#?}");
    assert_eq!(run.stderr.lines().count(), 1, "{run:#?}");
}
