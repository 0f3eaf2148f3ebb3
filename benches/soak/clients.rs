//! The 64 clients: multi-turn conversations (Chat Completions, Anthropic Messages, OpenAI
//! Responses; streamed and not; some keyed by `X-Session-Id`) with
//! clients that leave mid-stream, leave while waiting, or stop reading; and broken requests
//! (garbage, oversized heads and bodies, bad framing, control bytes, dot segments). Every request
//! goes into the ledger with what the client saw.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::http::{self, Body, Conn};
use crate::ledger::{Corr, Outcome, Run, Sent};

/// How a turn behaves.
#[derive(Debug, Clone, Copy)]
enum Mode {
    Normal {
        stream: bool,
    },
    /// Reads the head and the first piece of a long stream, then closes.
    LeaveMid,
    /// Closes if the head has not come within this time (queued, or waiting for prefill).
    LeaveWaiting(Duration),
    /// Reads the head of a long stream through a tiny receive window, then reads nothing for
    /// this long, then closes.
    Stall(Duration),
}

/// The conversation APIs a turn may speak: (path after the route, what the sim and crossbar read).
const APIS: [&str; 3] = ["/v1/chat/completions", "/v1/messages", "/v1/responses"];

#[derive(Debug)]
struct Conversation {
    id: u64,
    route: &'static str,
    /// One of [`APIS`].
    api: &'static str,
    session: Option<String>,
    messages: Vec<Value>,
    turns: u32,
    max_turns: u32,
}

pub struct Client {
    run: Arc<Run>,
    rng: fastrand::Rng,
    idx: u64,
    convs: Vec<Conversation>,
    next_conv: u64,
    conn: Option<Conn>,
    stall: Duration,
}

impl Client {
    pub fn new(run: Arc<Run>, idx: u64, seed: u64, stall: Duration) -> Client {
        Client {
            run,
            rng: fastrand::Rng::with_seed(seed ^ (idx.wrapping_mul(0x9e37_79b9_7f4a_7c15))),
            idx,
            convs: Vec::new(),
            next_conv: 0,
            conn: None,
            stall,
        }
    }

    /// Sends requests until the run stops.
    pub fn run(mut self) {
        while !self.run.stopping() {
            self.run.wait_unpaused();
            if self.run.stopping() {
                break;
            }
            match self.rng.u32(0..100) {
                0..=1 => self.garbage(),
                2..=5 => self.junk(),
                _ => self.turn(),
            }
            let think = Duration::from_millis(self.rng.u64(30..400));
            std::thread::sleep(think);
        }
    }

    fn turn(&mut self) {
        if self.convs.len() < 3 && (self.convs.is_empty() || self.rng.u32(0..4) == 0) {
            let id = self.idx * 1_000_000 + self.next_conv;
            self.next_conv += 1;
            let pad: String = (0..self.rng.usize(50..600))
                .map(|_| self.rng.alphanumeric())
                .collect();
            self.convs.push(Conversation {
                id,
                route: if self.rng.u32(0..4) == 0 {
                    "beta"
                } else {
                    "alpha"
                },
                // Half Chat Completions, a quarter each Anthropic Messages and OpenAI Responses.
                api: APIS[[0, 0, 1, 2][self.rng.usize(0..4)]],
                session: (self.rng.u32(0..8) == 0).then(|| format!("soak-session-{id}")),
                messages: vec![
                    json!({"role": "user", "content": format!("conversation {id}: {pad}")}),
                ],
                turns: 0,
                max_turns: self.rng.u32(3..12),
            });
        }
        let i = self.rng.usize(0..self.convs.len());
        let mode = match self.rng.u32(0..100) {
            0..=3 => Mode::LeaveMid,
            4..=6 => Mode::LeaveWaiting(Duration::from_millis(self.rng.u64(10..300))),
            7 => Mode::Stall(self.stall.mul_f64(0.5 + self.rng.f64())),
            _ => Mode::Normal {
                stream: self.rng.bool(),
            },
        };
        let (stream, max_tokens) = match mode {
            Mode::Normal { stream } => (stream, self.rng.u32(4..24)),
            // Longer than any socket buffer holds, so crossbar is still writing when the client goes.
            Mode::LeaveMid | Mode::LeaveWaiting(_) | Mode::Stall(_) => (true, 40_000),
        };
        let conv = &self.convs[i];
        let system = "You are a soak test.";
        let body = match conv.api {
            "/v1/messages" => json!({"model": "qwen", "system": system, "messages": conv.messages,
                                     "stream": stream, "max_tokens": max_tokens}),
            "/v1/responses" => {
                json!({"model": "qwen", "instructions": system, "input": conv.messages,
                                      "stream": stream, "max_output_tokens": max_tokens})
            }
            _ => {
                let mut messages = vec![json!({"role": "system", "content": system})];
                messages.extend(conv.messages.iter().cloned());
                let mut body =
                    json!({"messages": messages, "stream": stream, "max_tokens": max_tokens});
                if stream {
                    body["stream_options"] = json!({"include_usage": true});
                }
                body
            }
        };
        let body = body.to_string().into_bytes();
        let session = conv.session.clone();
        let api = crossbar::api::Api::of(conv.api);
        // With keys on, a conversation is its key's own (issue 46): the lease is the scoped one.
        let fp = crossbar::fingerprint::peek_as(api, &body, session.as_deref()).fp;
        let fp = crossbar::fingerprint::scoped(&fp, "soak");
        let mut extra = Vec::new();
        if let Some(s) = &session {
            extra.push(("X-Session-Id", s.clone()));
        }
        let (route, conv_id, turn) = (conv.route, conv.id, conv.turns + 1);
        let path = format!("/{route}{}", conv.api);
        let request = http::post(&path, "soak", &extra, &body);
        let start = Instant::now();
        let outcome = self.exchange(&request, mode, Corr::Fp(fp.clone()), route, (conv_id, turn));
        self.run.record(Sent {
            corr: Corr::Fp(fp),
            turn: Some((conv_id, turn)),
            route,
            start,
            end: Instant::now(),
            outcome,
        });
        let conv = &mut self.convs[i];
        conv.turns += 1;
        conv.messages
            .push(json!({"role": "assistant", "content": format!("answer {turn}")}));
        conv.messages
            .push(json!({"role": "user", "content": format!("and then? ({turn})")}));
        if conv.turns >= conv.max_turns {
            self.convs.swap_remove(i);
        }
    }

    /// One request on the kept connection (or a fresh one) and its answer, as the mode says.
    fn exchange(
        &mut self,
        request: &[u8],
        mode: Mode,
        corr: Corr,
        route: &'static str,
        turn: (u64, u32),
    ) -> Outcome {
        let normal = matches!(mode, Mode::Normal { .. });
        let kept = self
            .conn
            .take()
            .filter(|c| normal && c.idle_since.elapsed() < Duration::from_secs(1) && !c.stale());
        let reused = kept.is_some();
        let rcvbuf = matches!(mode, Mode::Stall(_)).then_some(4096);
        let mut conn = match kept.map_or_else(|| Conn::open(self.run.client(), rcvbuf), Ok) {
            Ok(c) => c,
            Err(_) => return Outcome::NoConnection,
        };
        if let Mode::LeaveWaiting(d) = mode {
            conn.set_read_timeout(d);
        }
        let start = Instant::now();
        let head = conn.send(request).and_then(|()| conn.head());
        let head = match head {
            Ok(Some(h)) => h,
            Err(e) if matches!(mode, Mode::LeaveWaiting(_)) && is_timeout(&e) => {
                return Outcome::Left
            }
            Ok(None) | Err(_) if reused => {
                // The server closed the idle connection as we used it: count it, then retry fresh.
                self.run.record(Sent {
                    corr: corr.clone(),
                    turn: Some(turn),
                    route,
                    start,
                    end: Instant::now(),
                    outcome: Outcome::Dropped,
                });
                return self.exchange(request, mode, corr, route, turn);
            }
            Ok(None) | Err(_) => return Outcome::Unanswered,
        };
        conn.set_read_timeout(http::READ_TIMEOUT);
        let header = |name| head.header(name).map(str::to_string);
        let (host, lease) = (header("X-Crossbar-Host"), header("X-Crossbar-Lease"));
        if head.status == 200 {
            match mode {
                Mode::LeaveMid | Mode::LeaveWaiting(_) => {
                    if let Body::Complete(_) = conn.body(&head, Some(1)) {
                        // The whole stream came in one piece: nothing left to leave.
                        return answered(head.status, host, lease, true, &[]);
                    }
                    return Outcome::Left;
                }
                Mode::Stall(d) => {
                    std::thread::sleep(d);
                    return Outcome::Left;
                }
                Mode::Normal { .. } => {}
            }
        }
        let body = conn.body(&head, None);
        let (complete, bytes) = match &body {
            Body::Complete(b) => (true, b.as_slice()),
            _ => (false, &[][..]),
        };
        if complete && normal && conn.reusable(&head) {
            conn.idle_since = Instant::now();
            self.conn = Some(conn);
        }
        answered(head.status, host, lease, complete, bytes)
    }

    /// Broken requests on the `junk` route: rows are checked per status on that route.
    fn junk(&mut self) {
        let session = format!("soak-junk-{}-{}", self.idx, self.rng.u64(..));
        let body = json!({"messages": [{"role": "user", "content": format!("junk {session}")}],
                          "max_tokens": 4});
        let body = body.to_string().into_bytes();
        let sid = ("X-Session-Id", session.clone());
        let path = "/junk/v1/chat/completions";
        let kind = self.rng.u32(0..7);
        let bytes = match kind {
            // A head over 64 KiB in one header line.
            0 => http::post(path, "soak", &[sid, ("X-Pad", "a".repeat(80 << 10))], &body),
            // 150 header lines.
            1 => {
                let many: Vec<(&str, String)> =
                    (0..150).map(|i| ("X-Many", format!("{i}"))).collect();
                http::post(path, "soak", &many, &body)
            }
            // A body declared over 16 MiB; 64 KiB of it sent.
            2 => {
                let head = format!(
                    "POST {path} HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\n\
                     {}Content-Length: {}\r\n\r\n",
                    http::KEY_LINE,
                    (16 << 20) + 4096
                );
                let mut b = head.into_bytes();
                b.extend_from_slice(&[b' '; 64 << 10]);
                b
            }
            // Content-Length and chunked together.
            3 => {
                let head = format!(
                    "POST {path} HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\n\
                     X-Session-Id: {session}\r\n{}Content-Length: {}\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n",
                    http::KEY_LINE,
                    body.len(),
                    body.len()
                );
                let mut b = head.into_bytes();
                b.extend_from_slice(&body);
                b.extend_from_slice(b"\r\n0\r\n\r\n");
                b
            }
            // A control byte in a header value.
            4 => http::post(
                path,
                "soak",
                &[sid, ("X-Foo", "a\u{1}b".to_string())],
                &body,
            ),
            // A dot segment aimed at the host's /slots.
            5 => http::post("/junk/v1/%2e%2e/slots", "soak", &[sid], &body),
            // Not JSON: the host's own 400, forwarded.
            _ => http::post(path, "soak", &[sid], b"{\"messages\": [nope"),
        };
        let what = [
            "junk:big-head",
            "junk:many-headers",
            "junk:big-body",
            "junk:cl-and-chunked",
            "junk:control-byte",
            "junk:dot-segment",
            "junk:not-json",
        ];
        self.one_shot(&bytes, Corr::Route("junk"), what[kind as usize]);
    }

    /// Bytes that are not HTTP at all: no route, so no row.
    fn garbage(&mut self) {
        let n = self.rng.usize(1..2048);
        let mut bytes: Vec<u8> = (0..n).map(|_| self.rng.u8(..)).collect();
        if self.rng.bool() {
            bytes.extend_from_slice(b"\r\n\r\n");
        }
        self.one_shot(&bytes, Corr::Nothing, "garbage");
    }

    /// Sends `bytes` on a fresh connection and reads what comes back. `what` names the kind of
    /// request in the ledger's route field (the route itself is in `corr`).
    fn one_shot(&mut self, bytes: &[u8], corr: Corr, what: &'static str) {
        let start = Instant::now();
        let outcome = match Conn::open(self.run.client(), None) {
            Err(_) => Outcome::NoConnection,
            Ok(mut conn) => {
                conn.set_read_timeout(Duration::from_secs(10));
                // The server may answer and close before taking it all; the answer still counts.
                let _ = conn.send(bytes);
                match conn.head() {
                    Ok(Some(head)) => {
                        let body = conn.body(&head, None);
                        let (complete, b) = match &body {
                            Body::Complete(b) => (true, b.as_slice()),
                            _ => (false, &[][..]),
                        };
                        let host = head.header("X-Crossbar-Host").map(str::to_string);
                        answered(head.status, host, None, complete, b)
                    }
                    _ => Outcome::Unanswered,
                }
            }
        };
        self.run.record(Sent {
            corr,
            turn: None,
            route: what,
            start,
            end: Instant::now(),
            outcome,
        });
    }
}

/// An answer, classified by what crossbar's answer itself says.
pub fn answered(
    status: u16,
    host: Option<String>,
    lease: Option<String>,
    complete: bool,
    body: &[u8],
) -> Outcome {
    // crossbar's own words: the error envelope's `code` (issue 27), or the admin API's string.
    let error = serde_json::from_slice::<Value>(body).ok().and_then(|v| {
        let e = v.get("error")?;
        (e.get("code").and_then(Value::as_str).or(e.as_str())).map(str::to_string)
    });
    // An answer naming a host was routed (a host's own 431 passes through, for one).
    let pre_route = host.is_none()
        && match status {
            431 | 408 => true,
            503 => error.as_deref() == Some("busy"),
            // Not crossbar's JSON: the connection layer refused the bytes before any route.
            400 => error.is_none(),
            _ => false,
        };
    let own_400 = status == 400 && host.is_none() && error.is_some();
    Outcome::Answered {
        status,
        host,
        lease,
        complete,
        pre_route,
        own_400,
    }
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}
