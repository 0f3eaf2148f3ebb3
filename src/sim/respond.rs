//! Routing of one request: faults that apply before anything else, API-key check, the metadata
//! endpoints (`/health`, `/props`, `/v1/models`, `/models`, `/slots`, `/metrics`), the tokenizer
//! and token counts (`/tokenize`, `/apply-template`, `/v1/chat/completions/input_tokens`, as
//! [`Counts`] allows) and the error envelope. Completions are handed to `generate`; the other
//! APIs' counts, embeddings and rerank to `oneshot`.
//!
//! Must not: wait on slots or write streams (that is `generate`), or hold a lock while writing.

use std::net::TcpStream;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use super::http::{self, HttpRequest};
use super::{cache, generate, Counts, Fault, Received, Shared, SimEvent};

/// `build_info` reported by `/props` and as `system_fingerprint`.
pub(super) const BUILD: &str = "b11434-sim";

/// Answers one request. Returns whether the connection may carry another request.
pub(super) fn handle(sh: &Shared, sock: &TcpStream, req: &HttpRequest) -> bool {
    let path = req.path().to_string();
    sh.record_request(Received {
        method: req.method.clone(),
        path: req.target.clone(),
        headers: req.headers.clone(),
        body: req.body.clone(),
    });
    // Read the fault before telling observers about the request, so a test that changes the fault
    // once it sees the request knows which fault this request met.
    let fault = sh.fault();
    sh.emit(SimEvent::Request { path: path.clone() });
    match fault {
        Fault::Hang => {
            sh.hang();
            return false;
        }
        // Accepted just before the listener closed: a dead process answers nothing.
        Fault::Refuse => return false,
        Fault::Loading => return reply_error(sock, 503, "Loading model", req.keep_alive),
        _ => {}
    }
    // llama-server answers every OPTIONS before its key check, blank (its CORS middleware).
    if req.method == "OPTIONS" {
        return http::write_full(sock, 200, "text/html", b"", req.keep_alive).is_ok()
            && req.keep_alive;
    }
    if req.method == "POST" && counting(&path) {
        sh.count_gate();
    }
    let public = matches!(
        path.as_str(),
        "/health" | "/v1/health" | "/models" | "/v1/models"
    );
    if !public && !authorized(sh, req) {
        return reply_error(sock, 401, "Invalid API Key", req.keep_alive);
    }
    let inference = generate::Kind::of(&path);
    if let (Some(_), Fault::Status(code)) = (inference, fault) {
        let msg = format!("simulated failure (status {code})");
        return reply_error(sock, code, &msg, req.keep_alive);
    }
    let garbage = fault == Fault::Garbage;
    let counts = sh.cfg.counts;
    if let (Some(router), false) = (&sh.router, garbage) {
        let get = req.method == "GET" || req.method == "HEAD";
        let model = if get {
            req.query("model").map(str::to_string)
        } else {
            serde_json::from_slice::<Value>(&req.body)
                .ok()
                .and_then(|b| b.get("model").and_then(Value::as_str).map(String::from))
        };
        match (get, path.as_str(), model) {
            (true, "/props", None) => return reply(sock, 200, &router.lock().props(), req),
            (true, "/v1/models" | "/models", _) => {
                let listing = router
                    .lock()
                    .listing(sh.cfg.n_ctx, sh.cfg.slots, unix_now());
                return reply(sock, 200, &listing, req);
            }
            (false, _, None) if req.method == "POST" => {
                let msg = "model name is missing from the request";
                return reply_error(sock, 400, msg, req.keep_alive);
            }
            (_, "/props", Some(model)) | (false, _, Some(model))
                if req.method != "OPTIONS" && !sh.load_model(&model) =>
            {
                let msg = format!("model '{model}' not found");
                return reply_error(sock, 400, &msg, req.keep_alive);
            }
            _ => {}
        }
    }
    if counts == Counts::Failing && req.method == "POST" && counting(&path) {
        return reply_error(sock, 500, "simulated count failure", req.keep_alive);
    }
    if req.method == "POST" {
        if let Some(keep) = super::oneshot::answer(sh, sock, req) {
            return keep;
        }
    }
    let get = req.method == "GET" || req.method == "HEAD";
    match (get, path.as_str(), inference) {
        (_, _, Some(kind)) if req.method == "POST" => generate::run(sh, sock, req, kind, fault),
        (true, "/health" | "/v1/health", _) => reply(sock, 200, &json!({"status": "ok"}), req),
        (true, "/props" | "/v1/models" | "/models", _) if garbage => {
            let body = b"<html>502 whatever this is, it is not JSON";
            http::write_full(sock, 200, "text/html", body, req.keep_alive).is_ok()
        }
        (true, "/props", _) => reply(sock, 200, &props(sh), req),
        (true, "/v1/models" | "/models", _) => reply(sock, 200, &models(sh), req),
        (true, "/slots", _) => slots(sh, sock, req),
        (true, "/metrics", _) => {
            let msg = "This server does not support metrics endpoint. Start it with `--metrics`";
            reply_error(sock, 501, msg, req.keep_alive)
        }
        (false, "/tokenize", _) if req.method == "POST" && counts != Counts::None => {
            tokenize(sock, req)
        }
        (false, "/apply-template", _) if req.method == "POST" && counts != Counts::None => {
            count(sock, req, "prompt")
        }
        (false, "/v1/chat/completions/input_tokens", _)
            if req.method == "POST" && counts == Counts::Exact =>
        {
            count(sock, req, "input_tokens")
        }
        _ => reply_error(sock, 404, "File Not Found", req.keep_alive),
    }
}

/// Whether `path` is a tokenizer or count endpoint (what `Sim::hold_counts` holds).
fn counting(path: &str) -> bool {
    matches!(path, "/tokenize" | "/apply-template")
        || path.ends_with("/input_tokens")
        || path.ends_with("/count_tokens")
}

/// Writes a JSON answer; true when the connection may be reused.
pub(super) fn reply(sock: &TcpStream, status: u16, body: &Value, req: &HttpRequest) -> bool {
    let bytes = body.to_string().into_bytes();
    let ct = "application/json; charset=utf-8";
    http::write_full(sock, status, ct, &bytes, req.keep_alive).is_ok() && req.keep_alive
}

/// llama-server's error envelope for `status`.
pub(super) fn envelope(status: u16, message: &str) -> Value {
    let kind = match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        404 => "not_found_error",
        501 => "not_supported_error",
        503 => "unavailable_error",
        _ => "server_error",
    };
    json!({"error": {"code": status, "message": message, "type": kind}})
}

/// Writes an error envelope; true when the connection may be reused.
pub(super) fn reply_error(sock: &TcpStream, status: u16, message: &str, keep: bool) -> bool {
    let bytes = envelope(status, message).to_string().into_bytes();
    let ct = "application/json; charset=utf-8";
    http::write_full(sock, status, ct, &bytes, keep).is_ok() && keep
}

pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The answer to a request on its head alone, before its body is read (`Fault::Early`): an
/// inference POST gets the fault's status and the connection closes, its body unread, as
/// llama-server answers a model still loading or a wrong key (issue 46).
pub(super) fn early(sh: &Shared, method: &str, path: &str) -> Option<(u16, String)> {
    match sh.fault() {
        Fault::Early { status } if method == "POST" && generate::Kind::of(path).is_some() => {
            Some((status, format!("simulated early answer (status {status})")))
        }
        _ => None,
    }
}

fn authorized(sh: &Shared, req: &HttpRequest) -> bool {
    let Some(key) = &sh.cfg.api_key else {
        return true;
    };
    let bearer = req
        .header("authorization")
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    bearer == Some(key.as_str()) || req.header("x-api-key") == Some(key.as_str())
}

fn props(sh: &Shared) -> Value {
    let cfg = &sh.cfg;
    json!({
        "default_generation_settings": {
            "id": 0,
            "n_ctx": sh.per_slot_ctx(),
            "is_processing": false,
            "params": {"n_predict": -1, "temperature": 0.8, "cache_prompt": true},
        },
        "total_slots": cfg.slots,
        "model_alias": cfg.alias,
        "model_path": format!("/models/{}.gguf", cfg.alias),
        "modalities": {"vision": false, "audio": false},
        "chat_template": "{{ role }}: {{ content }}\n",
        "build_info": BUILD,
        "is_sleeping": false,
    })
}

fn models(sh: &Shared) -> Value {
    let cfg = &sh.cfg;
    let created = unix_now();
    // A model trained for more than the sim runs, unless the sim plays `-c 0` (the whole of it).
    let train = if cfg.unified_kv {
        cfg.n_ctx
    } else {
        cfg.n_ctx.max(131072)
    };
    json!({
        "object": "list",
        "data": [{
            "id": cfg.alias, "object": "model", "owned_by": "llamacpp", "created": created,
            "meta": {"n_ctx": sh.per_slot_ctx(), "n_ctx_train": train,
                     "vocab_type": 2, "n_vocab": 32000, "n_embd": 64, "n_params": 1000000,
                     "size": 4000000},
        }],
        "models": [{
            "name": cfg.alias, "model": cfg.alias, "modified_at": "", "size": "", "digest": "",
            "type": "model", "description": "", "tags": [""], "capabilities": ["completion"],
            "parameters": "",
            "details": {"parent_model": "", "format": "gguf", "family": "", "families": [""],
                        "parameter_size": "", "quantization_level": ""},
        }],
    })
}

fn slots(sh: &Shared, sock: &TcpStream, req: &HttpRequest) -> bool {
    let busy = sh.slots_busy();
    let fail = matches!(req.query("fail_on_no_slot"), Some(v) if v != "0" && v != "false");
    if fail && busy.iter().all(|b| *b) {
        return reply_error(sock, 503, "no slot available", req.keep_alive);
    }
    let n_ctx = sh.per_slot_ctx();
    let tasks = sh.slot_tasks();
    let list: Vec<Value> = busy
        .iter()
        .enumerate()
        .map(|(id, b)| {
            let mut slot =
                json!({"id": id, "n_ctx": n_ctx, "is_processing": b, "speculative": false});
            if let Some(task) = tasks.get(id).copied().flatten() {
                slot["id_task"] = json!(task);
            }
            slot
        })
        .collect();
    reply(sock, 200, &Value::Array(list), req)
}

/// `POST /tokenize {"content": "..."}` → `{"tokens": [...]}`, one id per simulated token.
fn tokenize(sock: &TcpStream, req: &HttpRequest) -> bool {
    let body: Value = match serde_json::from_slice(&req.body) {
        Ok(v) => v,
        Err(e) => return reply_error(sock, 400, &format!("invalid JSON: {e}"), req.keep_alive),
    };
    let Some(content) = body.get("content").and_then(Value::as_str) else {
        return reply_error(sock, 400, "\"content\" must be provided", req.keep_alive);
    };
    let tokens: Vec<u64> = content
        .as_bytes()
        .chunks(cache::TOKEN_BYTES)
        .map(|c| {
            c.iter()
                .fold(0u64, |h, b| (h * 131 + u64::from(*b)) % 32000)
        })
        .collect();
    reply(sock, 200, &json!({ "tokens": tokens }), req)
}

/// A chat body rendered the way a completion renders it: `/apply-template` answers the text
/// (`{"prompt": ...}`), `/v1/chat/completions/input_tokens` its token count — the count a
/// completion of the same body reports as its prompt tokens.
fn count(sock: &TcpStream, req: &HttpRequest, field: &str) -> bool {
    let rendered = serde_json::from_slice(&req.body)
        .map_err(|e| format!("invalid JSON: {e}"))
        .and_then(|body: Value| {
            super::render::render(generate::Kind::Chat, &body).map_err(String::from)
        });
    match rendered {
        Ok(text) if field == "prompt" => {
            let prompt = String::from_utf8_lossy(&text);
            reply(sock, 200, &json!({ "prompt": prompt }), req)
        }
        Ok(text) => {
            let n = cache::tokens(text.len());
            let answer = json!({"input_tokens": n, "object": "response.input_tokens"});
            reply(sock, 200, &answer, req)
        }
        Err(msg) => reply_error(sock, 400, &msg, req.keep_alive),
    }
}
