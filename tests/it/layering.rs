//! Issue 45: the layering rules docs/ARCHITECTURE.md states, read off the source's `crate::`
//! paths, so they stay true. A module is a top-level name under `src/` (`state` is `state.rs` and
//! everything under `state/`); it depends on every other module its code names as `crate::X`
//! (in `use` lines and in paths), comments left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The module graph of `src/` (the binaries under `src/bin` are not modules of the library).
fn graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph = Graph::new();
    for file in rust_files(&src) {
        let rel = file.strip_prefix(&src).unwrap();
        let first = rel.components().next().unwrap().as_os_str();
        let module = Path::new(first).with_extension("");
        let module = module.to_str().unwrap().to_string();
        if ["bin", "lib", "main"].contains(&module.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let deps = graph.entry(module.clone()).or_default();
        for name in crate_paths(&text) {
            if name != module {
                deps.insert(name);
            }
        }
    }
    graph
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// The modules a file names: `crate::X` and each name of `crate::{X, Y::..}`, outside comments.
fn crate_paths(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let code: String = (text.lines())
        .map(|line| line.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n");
    let ident = |s: &str| -> String {
        (s.chars())
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            for item in group.split(',') {
                let name = ident(item.trim());
                if !name.is_empty() && name != "self" {
                    names.insert(name);
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                names.insert(name);
            }
        }
    }
    names
}

/// Every module `from` reaches through its dependencies (itself only through a cycle).
fn reach(graph: &Graph, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo: Vec<&str> = graph
        .get(from)
        .into_iter()
        .flatten()
        .map(String::as_str)
        .collect();
    while let Some(next) = todo.pop() {
        if seen.insert(next.to_string()) {
            todo.extend(graph.get(next).into_iter().flatten().map(String::as_str));
        }
    }
    seen
}

#[track_caller]
fn never_imports(graph: &Graph, module: &str, forbidden: &[&str]) {
    let deps = &graph[module];
    for name in forbidden {
        assert!(!deps.contains(*name), "{module} imports {name}: {deps:?}");
    }
}

#[test]
fn the_shared_state_and_the_connection_layer_stay_below_the_request_path_issue_45() {
    let graph = graph();
    never_imports(
        &graph,
        "state",
        &["proxy", "admin", "page", "server", "cli"],
    );
    never_imports(&graph, "conn", &["proxy", "admin", "state"]);
    // The llama-server client and the sign-in sessions sit below the shared state.
    never_imports(
        &graph,
        "upstream",
        &["state", "proxy", "admin", "health", "lease"],
    );
    never_imports(&graph, "sessions", &["state", "proxy", "admin"]);
    // The pure cores do no I/O and know nothing of requests (the lease table names the store's
    // row types for its persister, never the store itself).
    for pure in [
        "choose",
        "lease",
        "limiter",
        "holdings",
        "api",
        "tee",
        "fingerprint",
    ] {
        never_imports(
            &graph,
            pure,
            &["state", "proxy", "upstream", "conn", "server"],
        );
    }
}

#[test]
fn no_import_circle_passes_through_the_shared_state_issue_45() {
    let graph = graph();
    assert!(
        !reach(&graph, "state").contains("state"),
        "a module state depends on depends on state: {:?}",
        (graph["state"].iter())
            .filter(|dep| reach(&graph, dep).contains("state"))
            .collect::<Vec<_>>()
    );
}

/// No module reaches itself through the modules it imports: the whole graph is layered, so each
/// module can be read knowing only what is below it (issue 45 ended the last circles: api and
/// fingerprint, cli and report).
#[test]
fn the_module_graph_has_no_circle_issue_45() {
    let graph = graph();
    let circular: Vec<&String> = (graph.keys())
        .filter(|module| reach(&graph, module).contains(*module))
        .collect();
    assert!(circular.is_empty(), "modules on a circle: {circular:?}");
}

#[test]
fn the_reader_sees_what_the_source_says() {
    let names = crate_paths(
        "use crate::config::Config;\nuse crate::{lease, store::Row};\n// crate::proxy\nlet x = crate::slots::now();",
    );
    let want: BTreeSet<String> = ["config", "lease", "store", "slots"]
        .map(String::from)
        .into();
    assert_eq!(names, want);
}
