//! crossbar's own calls to a host, beside the requests it forwards: exact token counts for the
//! context guard, slot saves for pinning, and the health polls' GETs. Each is bounded as a whole
//! (connect, every read, and the answer's size), none is watched for a client, none is pooled.
//!
//! Counts are the one side call a client can cause at will (a large body), so [`Side`] lets at
//! most [`PER_HOST`] requests count on one host at once; the others wait for a turn within their
//! own deadline. What to count and how to read the answer is the request path's
//! (`proxy/count.rs`); what a poll's answer means is `health`'s. This module only asks.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::config::Host;

/// Requests whose count calls may be in flight to one host at once. Counting is the rare path
/// (only prompts the estimate says do not fit); a request that finds its host at the bound waits
/// for a turn until its count deadline, then is judged on the estimate.
pub const PER_HOST: usize = 2;

/// A host's answer to a call crossbar makes on its own.
pub type Answer = ureq::http::Response<ureq::Body>;

/// The agent side calls go through and the count calls in flight per host.
#[derive(Debug)]
pub struct Side {
    agent: ureq::Agent,
    /// Invariant: a host is here only while it has calls in flight, at most [`PER_HOST`]; its
    /// name is a configured host's (the guard looks it up in the config first).
    in_flight: Mutex<HashMap<String, usize>>,
    /// Requests waiting for a turn, over all hosts (at most one per worker); changed only with
    /// `in_flight` locked, read without.
    waiting: AtomicUsize,
    /// Signalled whenever a turn comes back.
    returned: Condvar,
}

/// One request's turn to ask `host` for counts; given back on drop.
#[derive(Debug)]
pub struct Turn<'a> {
    side: &'a Side,
    host: String,
}

impl Side {
    pub fn new(agent: ureq::Agent) -> Side {
        Side {
            agent,
            in_flight: Mutex::new(HashMap::new()),
            waiting: AtomicUsize::new(0),
            returned: Condvar::new(),
        }
    }

    /// A turn to count on `host`, waiting for one until `deadline`; `None` when none came back
    /// in time.
    pub fn turn(&self, host: &str, deadline: Instant) -> Option<Turn<'_>> {
        let mut in_flight = self.in_flight.lock();
        let full = |in_flight: &HashMap<String, usize>| {
            in_flight.get(host).is_some_and(|n| *n >= PER_HOST)
        };
        if full(&in_flight) && Instant::now() < deadline {
            self.waiting.fetch_add(1, Ordering::Relaxed);
            while full(&in_flight) {
                if self
                    .returned
                    .wait_until(&mut in_flight, deadline)
                    .timed_out()
                {
                    break;
                }
            }
            self.waiting.fetch_sub(1, Ordering::Relaxed);
        }
        let n = in_flight.entry(host.to_string()).or_insert(0);
        if *n >= PER_HOST {
            return None;
        }
        *n += 1;
        Some(Turn {
            side: self,
            host: host.to_string(),
        })
    }

    /// Requests waiting for a turn to count, on any host.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// POSTs the JSON `body` to `path` on `host` with the host's key, the whole exchange (answer
    /// body included) bounded by `timeout`.
    pub fn post_json(
        &self,
        host: &Host,
        path: &str,
        body: &[u8],
        timeout: Duration,
    ) -> Result<Answer, ureq::Error> {
        let mut request = (self.agent)
            .post([host.url.as_str(), path].concat())
            .config()
            .timeout_global(Some(timeout))
            .build()
            .header("Content-Type", "application/json");
        if let Some(key) = &host.api_key {
            request = request.header("Authorization", format!("Bearer {key}"));
        }
        request.send(body)
    }

    /// Has `host` save slot `index` to its RAM cache: a one-newline `/completion` pinned there
    /// (`id_slot`), so llama-server saves what the slot held before it takes the newline (see
    /// `slots::Claim::saves_first` for why that is a save). Its whole answer read means the host
    /// has freed the slot (it does so before it takes the next task). At most [`SAVE_TIMEOUT`].
    pub fn save_slot(&self, host: &Host, index: usize) -> Result<(), String> {
        let body =
            format!(r#"{{"prompt":"\n","n_predict":1,"id_slot":{index},"cache_prompt":true}}"#);
        self.complete(host, body.as_bytes()).map(drop)
    }

    /// Has `host` copy its idle slots to its RAM cache: a short `/completion` left to the host's
    /// choice of slot, which with similarity off is its least recently used idle one, saved first;
    /// as the task starts, every other idle slot is copied too (`--cache-idle-slots`, on by
    /// default). See `proxy/stash.rs` for when and why. Returns the tokens the host prefilled for
    /// it (`timings.prompt_n`). At most [`SAVE_TIMEOUT`].
    pub fn stash(&self, host: &Host) -> Result<u64, String> {
        let body =
            serde_json::json!({"prompt": STASH_PROMPT, "n_predict": 0, "cache_prompt": true});
        let read = self.complete(host, body.to_string().as_bytes())?;
        let answer: serde_json::Value = serde_json::from_slice(&read).map_err(|e| e.to_string())?;
        Ok(answer["timings"]["prompt_n"].as_u64().unwrap_or(0))
    }

    /// One of crossbar's own short `/completion` requests to `host` (a slot save, a stash): its
    /// whole 200 answer, at most [`SAVE_ANSWER`] bytes, the exchange bounded by [`SAVE_TIMEOUT`].
    /// Reading the whole answer means the host has freed the slot it used.
    fn complete(&self, host: &Host, body: &[u8]) -> Result<Vec<u8>, String> {
        let answer =
            (self.post_json(host, "/completion", body, SAVE_TIMEOUT)).map_err(|e| e.to_string())?;
        let status = answer.status().as_u16();
        if status != 200 {
            return Err(format!("status {status}"));
        }
        (answer.into_body().into_with_config())
            .limit(SAVE_ANSWER)
            .read_to_vec()
            .map_err(|e| e.to_string())
    }
}

/// What a stash asks the host to read: shares nothing with a chat template but the first token,
/// and is long enough (about 16 tokens) that a new conversation given its slot later still loads
/// a sibling's state from RAM (llama-server loads one only if it keeps a larger share of itself
/// than the slot's own state keeps: 1 of 16 here, 1 of 2 for a one-word prompt).
const STASH_PROMPT: &str =
    "crossbar: keep every idle slot in the RAM prompt cache, then answer nothing.";

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut in_flight = self.side.in_flight.lock();
        if let Some(n) = in_flight.get_mut(&self.host) {
            *n -= 1;
            if *n == 0 {
                in_flight.remove(&self.host);
            }
        }
        drop(in_flight);
        self.side.returned.notify_all();
    }
}

/// Longest saving a slot may take (a three-token request): past it the slot is in doubt.
pub const SAVE_TIMEOUT: Duration = Duration::from_secs(4);
/// Most bytes of a save's answer read.
const SAVE_ANSWER: u64 = 64 * 1024;

/// The agent polls use: `timeout` bounds the connect, each read and each whole request; no
/// redirects; no pooled connections (a poll every few seconds gains nothing from reuse, and a
/// connection the host closed meanwhile must not read as "unreachable"); statuses are answers.
pub fn poll_agent(timeout: Duration) -> ureq::Agent {
    let config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .timeout_connect(Some(timeout))
        .timeout_per_read(Some(timeout))
        .timeout_per_write(Some(timeout))
        .timeout_global(Some(timeout))
        .max_idle_connections(0)
        .max_idle_connections_per_host(0)
        .user_agent(concat!("crossbar/", env!("CARGO_PKG_VERSION")))
        .build();
    ureq::Agent::new_with_config(config)
}

/// Why a GET brought no body.
#[derive(Debug)]
pub enum GetError {
    /// No answer: the connection, a timeout, or something that is not HTTP.
    Unreachable(ureq::Error),
    /// An answer other than 200.
    Status(u16),
    /// A 200 whose body could not be read whole within `limit` bytes.
    Body(ureq::Error),
}

/// GETs `path` on `host` with the host's key and returns the body of a 200 answer, at most
/// `limit` bytes of text; the agent's timeouts bound the whole call.
pub fn get(agent: &ureq::Agent, host: &Host, path: &str, limit: u64) -> Result<String, GetError> {
    let mut request = agent.get([host.url.as_str(), path].concat());
    if let Some(key) = &host.api_key {
        request = request.header("Authorization", format!("Bearer {key}"));
    }
    let answer = request.call().map_err(GetError::Unreachable)?;
    match answer.status().as_u16() {
        200 => (answer.into_body().into_with_config())
            .limit(limit)
            .read_to_string()
            .map_err(GetError::Body),
        status => Err(GetError::Status(status)),
    }
}

#[cfg(test)]
mod tests;
