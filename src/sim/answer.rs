//! The JSON shapes of a finished generation in each API: `timings`, `usage`, the non-streamed
//! answers and the native final chunk. Pure: numbers in, `serde_json::Value` out.

use serde_json::{json, Value};

use super::generate::Kind;
use super::respond::{unix_now, BUILD};

/// Numbers of a finished generation, rendered into each API's final shape.
#[derive(Debug)]
pub(super) struct Done {
    pub kind: Kind,
    pub finish: &'static str,
    pub slot: usize,
    pub n_prompt: u64,
    pub cache_n: u64,
    pub prompt_n: u64,
    pub predicted: u64,
    pub prefill_us: u64,
    pub decode_us: u64,
    pub alias: String,
}

impl Done {
    pub fn timings(&self) -> Value {
        let rate = |n: u64, per_us: u64| {
            let ms = (n * per_us) as f64 / 1000.0;
            let per_token = if n > 0 { ms / n as f64 } else { 0.0 };
            let per_second = if ms > 0.0 {
                n as f64 * 1000.0 / ms
            } else {
                0.0
            };
            (ms, per_token, per_second)
        };
        let (p_ms, p_tok, p_sec) = rate(self.prompt_n, self.prefill_us);
        let (g_ms, g_tok, g_sec) = rate(self.predicted, self.decode_us);
        json!({"cache_n": self.cache_n, "prompt_n": self.prompt_n, "prompt_ms": p_ms,
               "prompt_per_token_ms": p_tok, "prompt_per_second": p_sec,
               "predicted_n": self.predicted, "predicted_ms": g_ms,
               "predicted_per_token_ms": g_tok, "predicted_per_second": g_sec})
    }

    pub fn usage(&self) -> Value {
        json!({"completion_tokens": self.predicted, "prompt_tokens": self.n_prompt,
               "total_tokens": self.n_prompt + self.predicted,
               "prompt_tokens_details": {"cached_tokens": self.cache_n}})
    }

    /// The non-streamed answer (and, with `text` empty, the native final chunk).
    pub fn full(&self, text: &str) -> Value {
        let created = unix_now();
        match self.kind {
            Kind::Chat => json!({
                "choices": [{"finish_reason": self.finish, "index": 0,
                             "message": {"role": "assistant", "content": text}}],
                "created": created, "model": self.alias, "system_fingerprint": BUILD,
                "object": "chat.completion", "usage": self.usage(),
                "id": format!("chatcmpl-sim{created:x}"), "timings": self.timings()}),
            Kind::Completions => json!({
                "choices": [{"text": text, "index": 0, "logprobs": null,
                             "finish_reason": self.finish}],
                "created": created, "model": self.alias, "system_fingerprint": BUILD,
                "object": "text_completion", "usage": self.usage(),
                "id": format!("cmpl-sim{created:x}"), "timings": self.timings()}),
            Kind::Native => json!({
                "index": 0, "content": text, "tokens": [], "id_slot": self.slot, "stop": true,
                "model": self.alias, "tokens_predicted": self.predicted,
                "tokens_evaluated": self.n_prompt,
                "generation_settings": {"n_predict": self.predicted},
                "has_new_line": false, "truncated": false,
                "stop_type": if self.finish == "stop" { "eos" } else { "limit" },
                "stopping_word": "", "tokens_cached": self.n_prompt + self.predicted,
                "timings": self.timings()}),
        }
    }
}
