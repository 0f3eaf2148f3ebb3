//! What a router-mode llama-server says about each of its models, from its `/v1/models` (or
//! `/models`) entries alone: the model's names, its state (`loaded`, `loading`, `unloaded`,
//! `sleeping`, `downloading`...) and its per-slot context, read from the child's command line in
//! `status.args` — known even while the model is unloaded. Never from `/props?model=NAME`, which
//! loads the model it asks about. Pure parsing: no I/O.

use super::answers::Entry;

/// Most names (the id, then aliases) kept per model: every request looks a model up by name.
pub const MAX_NAMES: usize = 32;

/// One model a router serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouterModel {
    /// The entry's `id`, then its aliases; at most [`MAX_NAMES`].
    pub names: Vec<String>,
    /// `status.value`; `unknown` when the entry has none crossbar can read.
    pub state: String,
    /// Per-slot context from `status.args`; `None` when unknown (no `-c`, or `-c 0`: the model's
    /// own training context, which crossbar cannot know without loading it).
    pub per_slot_ctx: Option<u64>,
    /// Slots from `status.args` (`-np`/`--parallel`); without one, llama-server's automatic
    /// four (issue 47).
    pub slots: u64,
}

impl RouterModel {
    /// From one `/v1/models` entry that carries a `status` (a router's); `None` for others.
    pub fn of(entry: &Entry) -> Option<RouterModel> {
        let status = entry.status.as_ref()?;
        let state = status.value.as_deref().unwrap_or("unknown");
        let args: Vec<&str> = status.args.iter().map(String::as_str).collect();
        Some(RouterModel {
            names: (entry.id.iter().chain(&entry.aliases))
                .take(MAX_NAMES)
                .cloned()
                .collect(),
            state: state.chars().take(32).collect(),
            per_slot_ctx: per_slot_ctx(&args),
            slots: slots(&args),
        })
    }

    pub fn is_named(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name)
    }
}

/// Slots a llama-server started with `args` runs: its `-np`/`--parallel`, else (absent, or the
/// automatic -1) llama-server's automatic four.
pub fn slots(args: &[&str]) -> u64 {
    let mut found = None;
    for (i, arg) in args.iter().enumerate() {
        if *arg == "-np" || *arg == "--parallel" {
            found = args.get(i + 1).copied();
        } else if let Some(v) = arg.strip_prefix("--parallel=") {
            found = Some(v);
        }
    }
    found
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|n| (1..=MAX_SLOTS).contains(n))
        .unwrap_or(AUTO_SLOTS)
}

/// llama-server's automatic `-np` (b11434): four slots sharing one unified KV cache.
pub const AUTO_SLOTS: u64 = 4;
/// Most slots believed of one model: a host's answer sizes nothing beyond this.
pub const MAX_SLOTS: u64 = 256;

/// The per-slot context a llama-server started with `args` gives one request: `--ctx-size`
/// divided over `--parallel` slots, or the whole of it when the KV cache is unified (`-kvu`, and
/// the default when `--parallel` is not given: 4 slots sharing one pool, each may use it all).
/// llama.cpp pads the context to a multiple of 256 first.
pub fn per_slot_ctx(args: &[&str]) -> Option<u64> {
    let value = |short: &str, long: &str| -> Option<&str> {
        let mut found = None;
        for (i, arg) in args.iter().enumerate() {
            if *arg == short || *arg == long {
                found = args.get(i + 1).copied();
            } else if let Some(v) = arg.strip_prefix(long).and_then(|v| v.strip_prefix('=')) {
                found = Some(v);
            }
        }
        found
    };
    let flag = |names: &[&str]| args.iter().rposition(|a| names.contains(a));
    let ctx: u64 = value("-c", "--ctx-size")?.parse().ok()?;
    if ctx == 0 {
        return None;
    }
    let ctx = ctx.div_ceil(256).saturating_mul(256);
    let parallel = value("-np", "--parallel").and_then(|v| v.parse::<i64>().ok());
    let unified = match (
        flag(&["-kvu", "--kv-unified"]),
        flag(&["-no-kvu", "--no-kv-unified"]),
    ) {
        (Some(on), Some(off)) => on > off,
        (on, _) => on.is_some(),
    };
    match parallel {
        Some(n) if n > 0 && !unified => Some(ctx / n as u64),
        _ => Some(ctx),
    }
}

#[cfg(test)]
mod tests {
    use super::super::answers::entry;
    use super::*;
    use serde_json::json;

    #[track_caller]
    fn check(args: &str, want: Option<u64>) {
        let args: Vec<&str> = args.split_whitespace().collect();
        assert_eq!(per_slot_ctx(&args), want, "{args:?}");
    }

    #[test]
    fn the_context_of_a_slot_comes_from_the_childs_command_line() {
        check(
            "llama-server -m a.gguf --ctx-size 4096 --parallel 2",
            Some(2048),
        );
        check("-c 8192 -np 4", Some(2048));
        check("--ctx-size=8192 --parallel=2", Some(4096));
        check("-c 4096", Some(4096));
        check("-c 8192 -np 2 -kvu", Some(8192));
        check("-c 8192 -np 2 --kv-unified --no-kv-unified", Some(4096));
        check("-c 4000 -np 2", Some(2048));
        check("-c 0 -np 2", None);
        check("-np 2", None);
        check("-c many -np 2", None);
        check("-c 4096 -np -1", Some(4096));
    }

    /// Review (issue 15): a router's aliases were kept however many it listed, and every request
    /// scans them under the health lock (`ctx_for`, `is_loaded`, `model_state`...), so one
    /// listing of 10 MB of aliases slowed every request to every host.
    #[test]
    fn a_model_keeps_its_id_and_a_bounded_number_of_aliases() {
        let aliases: Vec<String> = (0..10_000).map(|i| format!("a{i}")).collect();
        let listed = json!({"id": "coder", "aliases": aliases, "status": {"value": "loaded"}});
        let model = RouterModel::of(&entry(&listed.to_string())).unwrap();
        assert_eq!(model.names.len(), MAX_NAMES);
        assert_eq!(
            (model.names[0].as_str(), model.names[1].as_str()),
            ("coder", "a0")
        );
        assert!(model.is_named("a1") && !model.is_named("a9999"));
    }

    #[test]
    fn an_entry_gives_names_state_and_context() {
        let listed = json!({"id": "coder", "aliases": ["qc"], "status": {"value": "unloaded",
            "args": ["llama-server", "--ctx-size", "4096", "--parallel", "2"]}});
        let model = RouterModel::of(&entry(&listed.to_string())).unwrap();
        assert_eq!(model.names, ["coder", "qc"]);
        assert_eq!(model.state, "unloaded");
        assert_eq!(model.per_slot_ctx, Some(2048));
        assert!(model.is_named("qc") && !model.is_named("chat"));
        let bare =
            RouterModel::of(&entry(&json!({"id": "x", "status": "loading"}).to_string())).unwrap();
        assert_eq!((bare.state.as_str(), bare.per_slot_ctx), ("loading", None));
        assert_eq!(
            RouterModel::of(&entry(&json!({"id": "plain"}).to_string())),
            None
        );
    }
}
