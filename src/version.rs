//! Which build this is (issue 48): the package version and the commit it was built from, with
//! whether its sources had changes not committed, as `build.rs` found them. One place, read by
//! `--version`, the start-up log line and `/admin/status`. Pure: no git at run time.

/// The package version (`Cargo.toml`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The commit (12 hex digits), or `None` for a build without git.
pub fn commit() -> Option<&'static str> {
    Some(env!("CROSSBAR_COMMIT")).filter(|c| !c.is_empty())
}

/// Whether the sources had changes not committed when it was built.
pub fn dirty() -> bool {
    env!("CROSSBAR_DIRTY") == "true"
}

/// `0.1.0 (commit 14fe3d2c9a1b)`, `… (commit 14fe3d2c9a1b, dirty)`, or `0.1.0 (unknown commit:
/// built without git)`.
pub fn describe() -> String {
    describe_with(commit(), dirty())
}

/// The commit as a log value: `14fe3d2c9a1b`, `14fe3d2c9a1b-dirty` or `unknown`.
pub fn commit_token() -> String {
    match (commit(), dirty()) {
        (Some(commit), false) => commit.to_string(),
        (Some(commit), true) => format!("{commit}-dirty"),
        (None, _) => "unknown".to_string(),
    }
}

fn describe_with(commit: Option<&str>, dirty: bool) -> String {
    match (commit, dirty) {
        (Some(commit), false) => format!("{VERSION} (commit {commit})"),
        (Some(commit), true) => format!("{VERSION} (commit {commit}, dirty)"),
        (None, _) => format!("{VERSION} (unknown commit: built without git)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_says_its_commit_or_that_it_has_none_issue_48() {
        let v = VERSION;
        assert_eq!(
            describe_with(Some("14fe3d2c9a1b"), false),
            format!("{v} (commit 14fe3d2c9a1b)")
        );
        assert_eq!(
            describe_with(Some("14fe3d2c9a1b"), true),
            format!("{v} (commit 14fe3d2c9a1b, dirty)")
        );
        assert_eq!(
            describe_with(None, false),
            format!("{v} (unknown commit: built without git)")
        );
        // This build's own, as build.rs found it: 12 hex digits when it had git.
        if let Some(commit) = commit() {
            assert!(
                commit.len() == 12 && commit.bytes().all(|b| b.is_ascii_hexdigit()),
                "{commit}"
            );
        }
    }
}
