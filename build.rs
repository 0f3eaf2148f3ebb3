//! Build identity (issue 48): the commit a binary was built from and whether its sources had
//! changes not committed, for `--version`, the start-up log line and `/admin/status`
//! (`src/version.rs`). Asks git when the sources are a git checkout and git is installed; a build
//! without either says so ("unknown commit").
//!
//! It must not make cargo rebuild for nothing: `.ci/run` checks that `cargo build --release
//! --bins` compiles nothing after the demo's build. So it reruns only when what it reports can
//! have changed: HEAD moved (HEAD, its reflog, the branch's ref) or a source changed (the files
//! below, which are also all that "dirty" looks at). Not on the index: a `git status` rewrites
//! it without changing anything, and every rerun relinks the binaries. git runs with
//! `--no-optional-locks`, so this script never writes the index either.

use std::path::Path;
use std::process::Command;

/// What goes into the binary: a change here (committed or not) is what "dirty" means.
const SOURCES: &[&str] = &["src", "build.rs", "Cargo.toml", "Cargo.lock"];

fn main() {
    for path in SOURCES {
        println!("cargo:rerun-if-changed={path}");
    }
    let commit = git(&["rev-parse", "--short=12", "HEAD"]);
    let mut dirty = false;
    if commit.is_some() {
        let mut status = vec!["status", "--porcelain", "--"];
        status.extend(SOURCES);
        dirty = git(&status).is_some_and(|changes| !changes.is_empty());
        let mut watched = vec!["HEAD".to_string(), "logs/HEAD".to_string()];
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watched.push(branch);
        }
        for name in watched {
            let path = git(&["rev-parse", "--path-format=absolute", "--git-path", &name]);
            // A path that does not exist would make cargo rerun this on every build.
            if let Some(path) = path.filter(|p| Path::new(p).exists()) {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
    println!(
        "cargo:rustc-env=CROSSBAR_COMMIT={}",
        commit.unwrap_or_default()
    );
    println!("cargo:rustc-env=CROSSBAR_DIRTY={dirty}");
}

/// git's answer, trimmed, or `None` when there is no git, no repository, or it failed.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("--no-optional-locks")
        .args(args)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    Some(String::from_utf8(out.stdout).ok()?.trim().to_string())
}
