//! Every example config under docs/examples/ loads: the operations guide must not show a config
//! that `crossbar check` would refuse.

use std::path::Path;

use crossbar::config::Config;

#[test]
fn every_docs_example_config_loads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/examples");
    let mut checked = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            if let Err(err) = Config::load(&path) {
                panic!(
                    "{} does not load:\n{}",
                    path.display(),
                    err.lines().join("\n")
                );
            }
            checked.push(path);
        }
    }
    assert!(
        checked.len() >= 2,
        "expected the example configs in {dir:?}, found {checked:?}"
    );
}

/// Issue 13: README.md said "every key is documented" and was not; now one table has a row for
/// every key the config accepts (docs/CONFIG.md since issue 45 kept the README short), and this
/// keeps it so when a key is added.
#[test]
fn the_config_reference_documents_every_config_key() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/CONFIG.md"))
            .unwrap();
    let keys = crossbar::config::all_keys();
    assert!(keys.len() > 20, "{keys:?}");
    let missing: Vec<&String> = keys
        .iter()
        .filter(|k| !readme.contains(&format!("\n| `{k}` |")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/CONFIG.md's key table lacks {missing:?}"
    );
}
