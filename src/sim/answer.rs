//! The JSON shapes of a generation in each API, copied from llama-server b11434
//! (`server-task.cpp`): `timings`, `usage`, the non-streamed answers, and the events of a stream —
//! Chat Completions and `/v1/completions` chunks ending in `[DONE]`, native `/completion` chunks
//! ending in `stop: true`, Anthropic Messages' named events ending in `message_stop`, OpenAI
//! Responses' named events ending in `response.completed`. Pure: numbers in, JSON text out.

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
    /// The whole prefill's time (slots sharing the compute make it longer than its tokens').
    pub prefill_us: u64,
    pub decode_us: u64,
    pub alias: String,
}

/// One SSE event: its `event:` name (Messages, Responses) and its data.
#[derive(Debug)]
pub(super) struct Ev {
    pub name: Option<&'static str>,
    pub data: String,
}

fn ev(name: &'static str, data: Value) -> Ev {
    Ev {
        name: Some(name),
        data: data.to_string(),
    }
}

fn plain(data: Value) -> Ev {
    Ev {
        name: None,
        data: data.to_string(),
    }
}

impl Done {
    pub fn timings(&self) -> Value {
        let rate = |n: u64, total_us: u64| {
            let ms = total_us as f64 / 1000.0;
            let per_token = if n > 0 { ms / n as f64 } else { 0.0 };
            let per_second = if ms > 0.0 {
                n as f64 * 1000.0 / ms
            } else {
                0.0
            };
            (ms, per_token, per_second)
        };
        let (p_ms, p_tok, p_sec) = rate(self.prompt_n, self.prefill_us);
        let (g_ms, g_tok, g_sec) = rate(self.predicted, self.predicted * self.decode_us);
        json!({"cache_n": self.cache_n, "prompt_n": self.prompt_n, "prompt_ms": p_ms,
               "prompt_per_token_ms": p_tok, "prompt_per_second": p_sec,
               "predicted_n": self.predicted, "predicted_ms": g_ms,
               "predicted_per_token_ms": g_tok, "predicted_per_second": g_sec})
    }

    /// The usage object in the API's own words (Messages' `input_tokens` excludes the cached part).
    pub fn usage(&self) -> Value {
        match self.kind {
            Kind::Messages => json!({"cache_read_input_tokens": self.cache_n,
                "input_tokens": self.n_prompt - self.cache_n, "output_tokens": self.predicted}),
            Kind::Responses => json!({"input_tokens": self.n_prompt,
                "output_tokens": self.predicted, "total_tokens": self.n_prompt + self.predicted,
                "input_tokens_details": {"cached_tokens": self.cache_n}}),
            _ => json!({"completion_tokens": self.predicted, "prompt_tokens": self.n_prompt,
                "total_tokens": self.n_prompt + self.predicted,
                "prompt_tokens_details": {"cached_tokens": self.cache_n}}),
        }
    }

    fn stop_reason(&self) -> &'static str {
        if self.finish == "stop" {
            "end_turn"
        } else {
            "max_tokens"
        }
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
            Kind::Messages => json!({
                "id": format!("chatcmpl-sim{created:x}"), "type": "message", "role": "assistant",
                "content": [{"type": "text", "text": text}], "model": self.alias,
                "stop_reason": self.stop_reason(), "stop_sequence": null, "usage": self.usage()}),
            Kind::Responses => json!({
                "completed_at": created, "created_at": created,
                "id": format!("resp_sim{created:x}"), "model": self.alias, "object": "response",
                "output": [output_item(text, "completed")], "status": "completed",
                "usage": self.usage()}),
        }
    }
}

fn output_item(text: &str, status: &str) -> Value {
    let content = if status == "completed" {
        json!([{"type": "output_text", "annotations": [], "logprobs": [], "text": text}])
    } else {
        json!([])
    };
    json!({"type": "message", "status": status, "id": "msg_sim", "content": content,
           "role": "assistant"})
}

/// The events of one stream, before, during and after the tokens.
#[derive(Debug)]
pub(super) struct Stream {
    pub kind: Kind,
    pub id: String,
    pub created: u64,
    pub alias: String,
    pub slot: usize,
    pub n_prompt: u64,
    pub cache_n: u64,
    pub include_usage: bool,
}

impl Stream {
    fn chunk(&self, choices: Value) -> Value {
        json!({"choices": choices, "created": self.created, "id": format!("chatcmpl-{}", self.id),
               "model": self.alias, "system_fingerprint": BUILD, "object": "chat.completion.chunk"})
    }

    fn text_chunk(&self, text: &str) -> Value {
        json!({"choices": [{"text": text, "index": 0, "logprobs": null, "finish_reason": null}],
               "created": self.created, "id": format!("cmpl-{}", self.id), "model": self.alias,
               "system_fingerprint": BUILD, "object": "text_completion"})
    }

    fn response(&self, status: &str, output: Value) -> Value {
        json!({"id": format!("resp_{}", self.id), "object": "response",
               "created_at": self.created, "status": status, "model": self.alias,
               "output": output})
    }

    /// What comes before the first token.
    pub fn opening(&self) -> Vec<Ev> {
        match self.kind {
            Kind::Chat => vec![plain(
                self.chunk(json!([{"finish_reason": null, "index": 0,
                "delta": {"role": "assistant", "content": null}}])),
            )],
            Kind::Completions | Kind::Native => Vec::new(),
            Kind::Messages => vec![
                ev(
                    "message_start",
                    json!({"type": "message_start", "message": {
                    "id": format!("chatcmpl-{}", self.id), "type": "message",
                    "role": "assistant", "content": [], "model": self.alias,
                    "stop_reason": null, "stop_sequence": null,
                    "usage": {"cache_read_input_tokens": self.cache_n,
                              "input_tokens": self.n_prompt - self.cache_n,
                              "output_tokens": 0}}}),
                ),
                ev(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": 0,
                    "content_block": {"type": "text", "text": ""}}),
                ),
            ],
            Kind::Responses => vec![
                ev(
                    "response.created",
                    json!({"type": "response.created",
                    "response": self.response("in_progress", json!([]))}),
                ),
                ev(
                    "response.in_progress",
                    json!({"type": "response.in_progress",
                    "response": self.response("in_progress", json!([]))}),
                ),
                ev(
                    "response.output_item.added",
                    json!({"type": "response.output_item.added",
                    "item": output_item("", "in_progress")}),
                ),
                ev(
                    "response.content_part.added",
                    json!({"type": "response.content_part.added",
                    "item_id": "msg_sim", "part": {"type": "output_text", "text": ""}}),
                ),
            ],
        }
    }

    /// The event of the `i`-th (0-based) generated token `w`.
    pub fn token(&self, w: &str, i: u64) -> Ev {
        match self.kind {
            Kind::Chat => plain(self.chunk(json!([{"finish_reason": null, "index": 0,
                                                   "delta": {"content": w}}]))),
            Kind::Completions => plain(self.text_chunk(w)),
            Kind::Native => plain(
                json!({"index": 0, "content": w, "tokens": [], "stop": false,
                                          "id_slot": self.slot, "tokens_predicted": i + 1,
                                          "tokens_evaluated": self.n_prompt}),
            ),
            Kind::Messages => ev(
                "content_block_delta",
                json!({"type": "content_block_delta",
                "index": 0, "delta": {"type": "text_delta", "text": w}}),
            ),
            Kind::Responses => ev(
                "response.output_text.delta",
                json!({
                "type": "response.output_text.delta", "item_id": "msg_sim",
                "output_index": 0, "content_index": 0, "delta": w}),
            ),
        }
    }

    /// What comes after the last token, the API's end marker included.
    pub fn closing(&self, d: &Done, text: &str) -> Vec<Ev> {
        let done = Ev {
            name: None,
            data: "[DONE]".to_string(),
        };
        match self.kind {
            Kind::Chat => {
                let mut fin = self.chunk(json!([{"finish_reason": d.finish, "index": 0,
                                                 "delta": {}}]));
                if self.include_usage {
                    let mut u = self.chunk(json!([]));
                    u["usage"] = d.usage();
                    u["timings"] = d.timings();
                    vec![plain(fin), plain(u), done]
                } else {
                    fin["timings"] = d.timings();
                    vec![plain(fin), done]
                }
            }
            Kind::Completions => {
                let mut fin = self.text_chunk("");
                fin["choices"][0]["finish_reason"] = json!(d.finish);
                fin["usage"] = d.usage();
                fin["timings"] = d.timings();
                vec![plain(fin), done]
            }
            Kind::Native => vec![plain(d.full(""))],
            Kind::Messages => vec![
                ev(
                    "content_block_stop",
                    json!({"type": "content_block_stop", "index": 0}),
                ),
                ev(
                    "message_delta",
                    json!({"type": "message_delta",
                    "delta": {"stop_reason": d.stop_reason(), "stop_sequence": null},
                    "usage": {"output_tokens": d.predicted}}),
                ),
                ev("message_stop", json!({"type": "message_stop"})),
            ],
            Kind::Responses => {
                let item = output_item(text, "completed");
                let mut response = self.response("completed", json!([item]));
                response["usage"] = d.usage();
                vec![
                    ev(
                        "response.output_text.done",
                        json!({"type": "response.output_text.done",
                        "item_id": "msg_sim", "text": text}),
                    ),
                    ev(
                        "response.content_part.done",
                        json!({"type": "response.content_part.done",
                        "item_id": "msg_sim", "part": item["content"][0]}),
                    ),
                    ev(
                        "response.output_item.done",
                        json!({"type": "response.output_item.done",
                        "item": item}),
                    ),
                    ev(
                        "response.completed",
                        json!({"type": "response.completed",
                        "response": response, "timings": d.timings()}),
                    ),
                ]
            }
        }
    }
}
