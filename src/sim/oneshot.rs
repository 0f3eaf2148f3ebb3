//! Answers that need no generation, in llama-server b11434's shapes: the Messages and Responses
//! exact-count endpoints (`/v1/messages/count_tokens`, `/v1/responses/input_tokens`, when
//! [`Counts::Exact`]; no slot, answered while every slot is busy, like the real server; chat's is
//! `respond`'s), embeddings (`/v1/embeddings`, `/embeddings`, `/embedding`) and rerank (`/rerank`,
//! `/reranking`, `/v1/rerank`, `/v1/reranking`). Embeddings and rerank take no simulated slot
//! time, but in lock-step mode each waits for a permit ([`super::Sim::release`]), so a test can
//! hold them in flight.

use std::net::TcpStream;

use serde_json::{json, Value};

use super::generate::Kind;
use super::http::HttpRequest;
use super::respond::{reply, reply_error};
use super::{cache, Counts, Shared};

/// Answers `req` if its path is one of these; `None` for any other path.
pub(super) fn answer(sh: &Shared, sock: &TcpStream, req: &HttpRequest) -> Option<bool> {
    let count = match req.path() {
        _ if sh.cfg.counts != Counts::Exact => None,
        "/v1/messages/count_tokens" => Some(Kind::Messages),
        "/v1/responses/input_tokens" | "/responses/input_tokens" => Some(Kind::Responses),
        _ => None,
    };
    let stateless = matches!(
        req.path(),
        "/v1/embeddings"
            | "/embeddings"
            | "/embedding"
            | "/rerank"
            | "/reranking"
            | "/v1/rerank"
            | "/v1/reranking"
    );
    if count.is_none() && !stateless {
        return None;
    }
    let body: Value = match serde_json::from_slice(&req.body) {
        Ok(v @ Value::Object(_)) => v,
        _ => return Some(reply_error(sock, 400, "invalid JSON body", req.keep_alive)),
    };
    if let Some(kind) = count {
        return Some(match super::render::render(kind, &body) {
            Ok(prompt) => {
                let n = cache::tokens(prompt.len());
                let mut out = json!({ "input_tokens": n });
                if kind == Kind::Responses {
                    out["object"] = json!("response.input_tokens");
                }
                reply(sock, 200, &out, req)
            }
            Err(msg) => reply_error(sock, 400, msg, req.keep_alive),
        });
    }
    if !sh.permit() {
        return Some(false); // stopping
    }
    let model = sh.cfg.alias.clone();
    let texts = |v: Option<&Value>| -> Vec<String> {
        match v {
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(a)) => a.iter().map(|x| x.to_string()).collect(),
            _ => Vec::new(),
        }
    };
    let vector = |t: &str| -> Vec<f64> {
        (0..8u64)
            .map(|i| ((t.len() as u64 * 31 + i * 7) % 97) as f64 / 97.0)
            .collect()
    };
    Some(if req.path().contains("rerank") {
        let query = texts(body.get("query")).concat();
        let documents = texts(body.get("documents"));
        let n: u64 = documents
            .iter()
            .map(|d| cache::tokens(query.len() + d.len()))
            .sum();
        let results: Vec<Value> = documents
            .iter()
            .enumerate()
            .map(|(i, d)| json!({"index": i, "relevance_score": vector(d)[0]}))
            .collect();
        let out = json!({"model": model, "object": "list",
                         "usage": {"prompt_tokens": n, "total_tokens": n}, "results": results});
        reply(sock, 200, &out, req)
    } else {
        let inputs = texts(body.get("input").or(body.get("content")));
        let n: u64 = inputs.iter().map(|t| cache::tokens(t.len())).sum();
        let data: Vec<Value> = inputs
            .iter()
            .enumerate()
            .map(|(i, t)| json!({"embedding": vector(t), "index": i, "object": "embedding"}))
            .collect();
        let out = json!({"model": model, "object": "list",
                         "usage": {"prompt_tokens": n, "total_tokens": n}, "data": data});
        reply(sock, 200, &out, req)
    })
}
