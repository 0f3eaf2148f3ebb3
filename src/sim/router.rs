//! Router mode as b11434 does it (llama-server started with `--models-dir`, no `-m`): several
//! models, each `loaded`, `unloaded` (or whatever status a test sets); the router's own `/props`
//! says `n_ctx` 0; `/v1/models` lists each model with `status.value` and the child's command line
//! in `status.args`; a POST names its model or is refused; a request for an unloaded model, or
//! `/props?model=NAME`, loads it first, evicting the least recently used loaded model beyond
//! `--models-max` — and with it that model's prompt cache.
//!
//! Each model has its own slots and prompt cache (`server::PoolState::models`), as each runs as its
//! own child process; an eviction empties the evicted model's. Pure bookkeeping under the caller's
//! lock: no I/O.

use serde_json::{json, Value};

/// The router's models: `(id, status)` in listing order, and the load order of loaded ones.
#[derive(Debug)]
pub(super) struct Router {
    models: Vec<(String, String)>,
    /// Loaded model ids, least recently used first.
    lru: Vec<String>,
    /// `--models-max`; 0 = no limit.
    max: usize,
}

/// What serving a request for a model took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Load {
    /// The model was loaded already.
    Ready,
    /// The model was loaded now; `evicted` were unloaded to make room (their caches are gone).
    Loaded { evicted: Vec<String> },
    /// No such model.
    Unknown,
}

impl Router {
    pub fn new(models: &[(String, String)], max: usize) -> Router {
        let lru = (models.iter())
            .filter(|(_, status)| status == "loaded")
            .map(|(id, _)| id.clone())
            .collect();
        Router {
            models: models.to_vec(),
            lru,
            max,
        }
    }

    /// Makes `model` loaded (autoload), evicting beyond `max`.
    pub fn load(&mut self, model: &str) -> Load {
        let Some(i) = self.models.iter().position(|(id, _)| id == model) else {
            return Load::Unknown;
        };
        self.lru.retain(|id| id != model);
        self.lru.push(model.to_string());
        if self.models[i].1 == "loaded" {
            return Load::Ready;
        }
        self.models[i].1 = "loaded".to_string();
        let mut evicted = Vec::new();
        while self.max > 0 && self.lru.len() > self.max {
            let gone = self.lru.remove(0);
            self.set(&gone, "unloaded");
            evicted.push(gone);
        }
        Load::Loaded { evicted }
    }

    /// Sets a model's status as a test wants it (`loading`, `sleeping`...).
    pub fn set(&mut self, model: &str, status: &str) {
        if let Some(entry) = self.models.iter_mut().find(|(id, _)| id == model) {
            entry.1 = status.to_string();
        }
        if status != "loaded" {
            self.lru.retain(|id| id != model);
        }
    }

    /// `/v1/models` (and `/models`): every model with its status and the child's command line.
    pub fn listing(&self, ctx: u64, slots: usize, created: u64) -> Value {
        let data: Vec<Value> = (self.models.iter())
            .map(|(id, status)| {
                let args = [
                    "llama-server",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    "0",
                    "--model",
                    &format!("/models/{id}.gguf"),
                    "--ctx-size",
                    &ctx.to_string(),
                    "--parallel",
                    &slots.to_string(),
                    "--alias",
                    id,
                ];
                json!({"id": id, "object": "model", "owned_by": "llamacpp", "created": created,
                       "in_cache": true, "path": format!("/models/{id}.gguf"),
                       "status": {"value": status, "args": args}})
            })
            .collect();
        json!({"object": "list", "data": data})
    }

    /// The router's own `/props`.
    pub fn props(&self) -> Value {
        json!({"role": "router", "max_instances": self.max, "models_autoload": true,
               "default_generation_settings": {"params": null, "n_ctx": 0},
               "build_info": super::respond::BUILD})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router(max: usize) -> Router {
        let models = [("a", "loaded"), ("b", "unloaded"), ("c", "unloaded")]
            .map(|(id, s)| (id.to_string(), s.to_string()));
        Router::new(&models, max)
    }

    fn statuses(r: &Router) -> Vec<&str> {
        r.models.iter().map(|(_, s)| s.as_str()).collect()
    }

    #[test]
    fn loading_beyond_models_max_evicts_the_least_recently_used() {
        let mut r = router(1);
        assert_eq!(r.load("a"), Load::Ready);
        let evicted = vec!["a".to_string()];
        assert_eq!(r.load("b"), Load::Loaded { evicted });
        assert_eq!(statuses(&r), ["unloaded", "loaded", "unloaded"]);
        assert_eq!(r.load("nope"), Load::Unknown);

        let mut roomy = router(2);
        assert_eq!(roomy.load("b"), Load::Loaded { evicted: vec![] });
        assert_eq!(roomy.load("a"), Load::Ready);
        let evicted = vec!["b".to_string()];
        assert_eq!(roomy.load("c"), Load::Loaded { evicted });
    }

    #[test]
    fn the_listing_carries_each_models_command_line() {
        let listing = router(0).listing(4096, 2, 0);
        let args = &listing["data"][1]["status"]["args"];
        let args: Vec<&str> = args
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let at = args.iter().position(|a| *a == "--ctx-size").unwrap();
        assert_eq!(args[at + 1], "4096");
        assert_eq!(listing["data"][1]["status"]["value"], "unloaded");
        assert_eq!(router(1).props()["default_generation_settings"]["n_ctx"], 0);
    }
}
