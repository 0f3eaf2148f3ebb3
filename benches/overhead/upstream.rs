//! The overhead benchmark's fast upstream (issue 26): nginx answering every request with fixed,
//! llama-server-shaped bodies — `/health`, `/props`, `/v1/models` for crossbar's polls, and one
//! small non-streamed chat completion with `usage` and `timings` for everything else — so the
//! upstream costs what nginx costs, not what the in-process sim costs (the sim shares the bench's
//! process and allocator, and at 32 clients it was half of `direct`'s CPU). `BENCH_UPSTREAM=sim`
//! measures against the sim instead, as the figures before issue 26 were taken.

use std::path::Path;

use crate::nginx::Nginx;

const PROPS: &str = r#"{"build_info":"b11434-bench","default_generation_settings":{"id":0,"is_processing":false,"n_ctx":4096,"params":{"cache_prompt":true,"n_predict":-1}},"model_alias":"m","model_path":"/models/m.gguf","total_slots":64}"#;
const MODELS: &str = r#"{"data":[{"id":"m","object":"model","owned_by":"llamacpp","meta":{"n_ctx_train":131072}}],"object":"list"}"#;
/// What the sim answers a 4-token chat sent again, byte for byte the same shape: every bench
/// client repeats its request, so its prompt is cached but the one token a host always
/// evaluates again (`cache_n` 4 of 5). With a first turn's `cache_n` 0 on every answer, crossbar
/// warned of a cold cache on each request: a second log line that users see only when
/// stickiness fails.
const CHAT: &str = r#"{"choices":[{"finish_reason":"length","index":0,"message":{"content":" low and our was","role":"assistant"}}],"created":1796169279,"id":"chatcmpl-bench","model":"m","object":"chat.completion","system_fingerprint":"b11434-bench","timings":{"cache_n":4,"predicted_ms":0.0,"predicted_n":4,"predicted_per_second":0.0,"predicted_per_token_ms":0.0,"prompt_ms":0.0,"prompt_n":1,"prompt_per_second":0.0,"prompt_per_token_ms":0.0},"usage":{"completion_tokens":4,"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":4},"total_tokens":9}}"#;

/// Starts the fixed-answer nginx in `dir` (Debian's `worker_processes auto`: one per core).
pub fn start(dir: &Path) -> Result<Nginx, String> {
    Nginx::start(dir.join("upstream"), "auto", |port| {
        format!(
            "    server {{\n        listen 127.0.0.1:{port};\n        keepalive_requests 1000000;\n\
                 default_type \"application/json; charset=utf-8\";\n\
                 location = /health {{ return 200 '{{\"status\":\"ok\"}}'; }}\n\
                 location = /props {{ return 200 '{PROPS}'; }}\n\
                 location = /v1/models {{ return 200 '{MODELS}'; }}\n\
                 location = /models {{ return 200 '{MODELS}'; }}\n\
                 location / {{ return 200 '{CHAT}'; }}\n    }}\n"
        )
    })
}
