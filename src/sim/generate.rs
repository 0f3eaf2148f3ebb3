//! Completions: render the prompt, check the per-slot context, take a slot (waiting like
//! llama-server), simulate prefill and decode, and answer in the exact shapes (`answer.rs`) of
//! `/v1/chat/completions`, `/v1/completions`, native `/completion`, Anthropic `/v1/messages` and
//! OpenAI `/v1/responses`, streamed or not.
//!
//! Streams honour lock-step permits, the mid-answer faults (`Fault::DieMidStream`, `CutMidChunk`,
//! `EndEarly`; `CutBody` for plain answers) and client disconnects (checked before
//! every event: the slot is freed at once). The slot is given back before the last event is written,
//! so a client that has read a whole answer always finds the slot idle again.

use std::net::{Shutdown, TcpStream};

use serde_json::{json, Value};

use super::answer::{Done, Stream};
use super::http::{self, EventStream, HttpRequest};
use super::respond::{envelope, reply, reply_error, unix_now};
use super::{cache, Fault, Shared, SimEvent};

/// Which completion API a path speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Chat,
    Completions,
    Native,
    Messages,
    Responses,
}

impl Kind {
    pub fn of(path: &str) -> Option<Kind> {
        match path {
            "/v1/chat/completions" | "/chat/completions" => Some(Kind::Chat),
            "/v1/completions" | "/completions" => Some(Kind::Completions),
            "/completion" => Some(Kind::Native),
            "/v1/messages" => Some(Kind::Messages),
            "/v1/responses" | "/responses" => Some(Kind::Responses),
            _ => None,
        }
    }
}

/// Generated tokens: 4 bytes each, so the text re-tokenizes to the same count.
const WORDS: [&str; 16] = [
    " the", " sun", " was", " red", " and", " sky", " old", " map", " fox", " ran", " far", " our",
    " sea", " low", " hum", " end",
];

/// Answers one completion request. Returns whether the connection may carry another request.
pub(super) fn run(
    sh: &Shared,
    sock: &TcpStream,
    req: &HttpRequest,
    kind: Kind,
    fault: Fault,
) -> bool {
    let keep = req.keep_alive;
    let body: Value = match serde_json::from_slice(&req.body) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => return reply_error(sock, 400, "request body must be a JSON object", keep),
        Err(e) => return reply_error(sock, 400, &format!("invalid JSON: {e}"), keep),
    };
    let prompt = match super::render::render(kind, &body) {
        Ok(p) => p,
        Err(msg) => return reply_error(sock, 400, msg, keep),
    };
    let n_prompt = cache::tokens(prompt.len());
    let n_ctx = sh.per_slot_ctx();
    if n_prompt >= n_ctx {
        let msg = format!(
            "request ({n_prompt} tokens) exceeds the available context size ({n_ctx} tokens), \
             try increasing it"
        );
        let mut err = envelope(400, &msg);
        err["error"]["type"] = json!("exceed_context_size_error");
        err["error"]["n_prompt_tokens"] = json!(n_prompt);
        err["error"]["n_ctx"] = json!(n_ctx);
        return reply(sock, 400, &err, req);
    }
    let asked = [
        "max_tokens",
        "max_completion_tokens",
        "n_predict",
        "max_output_tokens",
    ]
    .iter()
    .find_map(|k| body.get(*k).and_then(Value::as_i64))
    .filter(|n| *n >= 0)
    .map(|n| n as u64);
    let limit = asked.unwrap_or(sh.cfg.default_max_tokens);
    let mut n_predict = limit.min(n_ctx - n_prompt);
    // No EOS in a simulation unless `eos_after` gives one: a default-length answer "stops", an
    // explicit or context limit is "length".
    let mut finish = if asked.is_some() || n_predict < limit {
        "length"
    } else {
        "stop"
    };
    if let Some(eos) = sh.cfg.eos_after.filter(|eos| *eos < n_predict) {
        (n_predict, finish) = (eos, "stop");
    }
    let use_cache = body
        .get("cache_prompt")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    let model = body.get("model").and_then(Value::as_str);
    // `id_slot` asks for one slot (llama-server: -1 or absent lets it choose).
    let pinned =
        (body.get("id_slot").and_then(Value::as_i64)).and_then(|id| usize::try_from(id).ok());
    if pinned.is_some() {
        sh.pinned_gate();
    }
    let Some(mut lease) = sh.take_slot(&prompt, use_cache, model, pinned) else {
        return reply_error(sock, 503, "server is shutting down", false);
    };
    let path = req.path();
    let streamed = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    // llama-server sends a stream's head as its slot starts on the prompt (b11434: the partial
    // response at SLOT_STATE_STARTED), before the prefill; its first event comes after.
    let head = if streamed {
        match EventStream::start(sock) {
            Ok(stream) => Some(stream),
            Err(_) => {
                sh.record_gone(path);
                return false;
            }
        }
    } else {
        None
    };
    let cache_n = lease.cache_n;
    let prompt_n = n_prompt - cache_n;
    let Some(prefill) = sh.prefill(prompt_n) else {
        return false;
    };
    let seed = prompt
        .iter()
        .fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(*b)));
    let word = |i: u64| WORDS[((seed.wrapping_add(i * 7)) % WORDS.len() as u64) as usize];
    let slot = lease.slot;
    let done = |predicted: u64| Done {
        kind,
        finish,
        slot,
        n_prompt,
        cache_n,
        prompt_n,
        predicted,
        prefill_us: u64::try_from(prefill.as_micros()).unwrap_or(u64::MAX),
        decode_us: sh.cfg.decode_us_per_token,
        alias: sh.cfg.alias.clone(),
    };

    let Some(stream) = head else {
        if matches!(fault, Fault::DieMidStream { .. }) {
            let _ = sock.shutdown(Shutdown::Both);
            return false;
        }
        let mut text = String::new();
        for i in 0..n_predict {
            if !sh.decode_token() {
                return false;
            }
            if http::peer_gone(sock) {
                lease.finish();
                sh.record_work(prompt_n, cache_n, i);
                sh.record_gone(path);
                return false;
            }
            text.push_str(word(i));
            lease.generated(word(i));
        }
        lease.finish();
        sh.record_work(prompt_n, cache_n, n_predict);
        let answer = done(n_predict).full(&text);
        if let Fault::CutBody { after_bytes } = fault {
            let bytes = answer.to_string().into_bytes();
            let ct = "application/json; charset=utf-8";
            let _ = http::write_part(sock, 200, ct, &bytes, after_bytes, keep);
            let _ = sock.shutdown(Shutdown::Both);
            return false;
        }
        let ok = reply(sock, 200, &answer, req);
        sh.emit(finished(path, prompt_n, cache_n));
        return ok;
    };

    let include_usage = body
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let mut out = Out {
        sh,
        sock,
        stream,
        sent: 0,
        fault,
    };
    let mut predicted = 0;
    let shapes = Stream {
        kind,
        id: format!("sim{seed:x}"),
        created: unix_now(),
        alias: sh.cfg.alias.clone(),
        slot,
        n_prompt,
        cache_n,
        include_usage,
    };
    let result = (|| {
        for ev in shapes.opening() {
            out.send(ev.name, &ev.data)?;
        }
        let mut text = String::new();
        for i in 0..n_predict {
            if !sh.decode_token() {
                return Err(End::Stopped);
            }
            let w = word(i);
            lease.generated(w);
            text.push_str(w);
            predicted = i + 1;
            let ev = shapes.token(w, i);
            out.send(ev.name, &ev.data)?;
        }
        lease.finish();
        sh.record_work(prompt_n, cache_n, n_predict);
        for ev in shapes.closing(&done(n_predict), &text) {
            out.send(ev.name, &ev.data)?;
        }
        Ok(())
    })();
    match result {
        Ok(()) => {
            if out.stream.finish().is_ok() {
                sh.emit(finished(path, prompt_n, cache_n));
            }
        }
        Err(End::Gone) => {
            if !lease.done {
                lease.finish();
                sh.record_work(prompt_n, cache_n, predicted);
            }
            sh.record_gone(path);
        }
        Err(End::Died | End::Stopped) => {}
    }
    // llama-server closes the connection after every stream (without saying so).
    false
}

fn finished(path: &str, prompt_n: u64, cache_n: u64) -> SimEvent {
    SimEvent::Finished {
        path: path.to_string(),
        prompt_n,
        cache_n,
    }
}

/// Why a stream ended early.
#[derive(Debug)]
enum End {
    Gone,
    Died,
    Stopped,
}

/// The event writer of one stream, applying lock-step, the stream faults and disconnect checks.
#[derive(Debug)]
struct Out<'a> {
    sh: &'a Shared,
    sock: &'a TcpStream,
    stream: EventStream<'a>,
    sent: usize,
    fault: Fault,
}

impl Out<'_> {
    /// Sends one event (`name`d for Messages and Responses).
    fn send(&mut self, name: Option<&str>, payload: &str) -> Result<(), End> {
        if !self.sh.permit() {
            return Err(End::Stopped);
        }
        match self.fault {
            Fault::DieMidStream { after_events } if self.sent >= after_events => {
                let _ = self.sock.shutdown(Shutdown::Both);
                return Err(End::Died);
            }
            Fault::CutMidChunk { after_events } if self.sent >= after_events => {
                let _ = self.stream.half_event(payload);
                let _ = self.sock.shutdown(Shutdown::Both);
                return Err(End::Died);
            }
            Fault::EndEarly { after_events } if self.sent >= after_events => {
                let _ = self.stream.finish();
                return Err(End::Died);
            }
            _ => {}
        }
        let sent = match name {
            Some(name) => self.stream.named(name, payload),
            None => self.stream.event(payload),
        };
        if http::peer_gone(self.sock) || sent.is_err() {
            return Err(End::Gone);
        }
        self.sh.emit(SimEvent::EventSent { index: self.sent });
        self.sent += 1;
        Ok(())
    }
}
