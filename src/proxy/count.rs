//! Exact prompt token counts, asked of a host when the context guard's estimate says a prompt does
//! not fit. One function ([`count_call`]) maps a request's endpoint to the call that counts it:
//! each conversation API's own count endpoint (the same body in, `{"input_tokens": N}` out), older
//! builds' `/apply-template` + `/tokenize` for chat, and `/tokenize` of a completion-style `prompt`.
//!
//! These calls take no slot (llama-server answers them while every slot generates) and one
//! deadline bounds them all. Every answer is read with a size bound; a host that cannot answer
//! (an old build, an error, the deadline) gives `None`, and the guard falls back to the estimate.
//! A [`Counter`] lets at most [`PER_HOST`] requests count on one host at once: a client sending
//! many large bodies cannot turn each into tokenizer work on a host. The others wait their turn
//! within the same deadline (a count takes milliseconds), and only a request whose deadline passes
//! while it waits is judged on the estimate. Nothing here marks a host
//! down or decides where a request goes.

use std::collections::HashMap;
use std::io::Read;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use serde_json::Value;

use crate::api::Api;
use crate::config::Host;

use super::MAX_BODY;

/// The longest all the count calls of one request may take together.
pub(super) const COUNT_TIMEOUT: Duration = Duration::from_secs(5);

/// Requests whose count calls may be in flight to one host at once. Counting is the rare path
/// (only prompts the estimate says do not fit); a request that finds its host at the bound waits
/// for a turn until its count deadline, then is judged on the estimate.
pub const PER_HOST: usize = 2;

/// The agent count calls go through and the count calls in flight per host.
#[derive(Debug)]
pub struct Counter {
    agent: ureq::Agent,
    /// Invariant: a host is here only while it has calls in flight, at most [`PER_HOST`]; its
    /// name is a configured host's (the guard looks it up in the config first).
    in_flight: Mutex<HashMap<String, usize>>,
    /// Requests waiting for a turn, over all hosts (at most one per worker).
    waiting: Mutex<usize>,
    /// Signalled whenever a permit comes back.
    returned: Condvar,
}

/// One request's right to ask `host` for counts; gives it back on drop.
#[derive(Debug)]
pub(super) struct CountPermit<'a> {
    counter: &'a Counter,
    host: String,
}

impl Counter {
    pub fn new(agent: ureq::Agent) -> Counter {
        Counter {
            agent,
            in_flight: Mutex::new(HashMap::new()),
            waiting: Mutex::new(0),
            returned: Condvar::new(),
        }
    }

    /// A permit to count on `host`, waiting for one until `deadline`; `None` when none came back
    /// in time.
    pub(super) fn start(&self, host: &str, deadline: Instant) -> Option<CountPermit<'_>> {
        let mut in_flight = self.in_flight.lock();
        let full = |in_flight: &HashMap<String, usize>| {
            in_flight.get(host).is_some_and(|n| *n >= PER_HOST)
        };
        if full(&in_flight) && Instant::now() < deadline {
            // Lock order: `in_flight`, then `waiting` (nothing takes them the other way).
            *self.waiting.lock() += 1;
            while full(&in_flight) {
                if self
                    .returned
                    .wait_until(&mut in_flight, deadline)
                    .timed_out()
                {
                    break;
                }
            }
            *self.waiting.lock() -= 1;
        }
        let n = in_flight.entry(host.to_string()).or_insert(0);
        if *n >= PER_HOST {
            return None;
        }
        *n += 1;
        Some(CountPermit {
            counter: self,
            host: host.to_string(),
        })
    }

    /// Requests waiting for a turn to count, on any host.
    pub fn waiting(&self) -> usize {
        *self.waiting.lock()
    }

    pub(super) fn agent(&self) -> &ureq::Agent {
        &self.agent
    }
}

impl Drop for CountPermit<'_> {
    fn drop(&mut self) {
        let mut in_flight = self.counter.in_flight.lock();
        if let Some(n) = in_flight.get_mut(&self.host) {
            *n -= 1;
            if *n == 0 {
                in_flight.remove(&self.host);
            }
        }
        drop(in_flight);
        self.counter.returned.notify_all();
    }
}

/// How a host counts the prompt of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CountCall {
    /// The API's count endpoint takes the request body as it is. `template`: when the host does
    /// not know the endpoint (builds before it), `/apply-template` + `/tokenize` count the same.
    Endpoint { path: &'static str, template: bool },
    /// A completion-style body: `/tokenize` its `prompt`.
    Prompt,
}

/// The count call for a request to `rest`, or `None` when crossbar knows no way to count it. The
/// endpoint is the API's own (`Api::count_path`, with `Api::count_fallback` for older builds).
pub(super) fn count_call(rest: &str) -> Option<CountCall> {
    if crate::api::is_count(rest) {
        return None; // a count is not counted
    }
    let api = Api::of(rest);
    match api.count_path() {
        Some(path) => Some(CountCall::Endpoint {
            path,
            template: api.count_fallback().is_some(),
        }),
        // A fill-in-the-middle body is more than its `prompt`: not counted that way.
        None if api == Api::Completion && rest != "/infill" => Some(CountCall::Prompt),
        None => None,
    }
}

/// A count answer is a small JSON object.
const SMALL_ANSWER: u64 = 64 * 1024;
/// `/apply-template` answers the rendered prompt: about the body's size, JSON-escaped.
const TEMPLATE_ANSWER: u64 = 2 * MAX_BODY as u64 + SMALL_ANSWER;
/// `/tokenize` answers a number per token; it is counted as it streams, never held.
const TOKENS_ANSWER: u64 = 8 * MAX_BODY as u64;

/// Asks `host` for the exact prompt token count of `body` (sent to `rest`), every call done by
/// `deadline` ([`COUNT_TIMEOUT`] from now, for the guard). `model`, when given, is the name the
/// body must carry (a router needs one). `None` when the host cannot say in time.
pub(super) fn exact(
    agent: &ureq::Agent,
    host: &Host,
    rest: &str,
    body: &[u8],
    model: Option<&str>,
    deadline: Instant,
) -> Option<u64> {
    let call = count_call(rest)?;
    let ask = Ask {
        agent,
        host,
        deadline,
    };
    let body = match model {
        Some(model) => super::model::named(body, model),
        None => body.into(),
    };
    match call {
        CountCall::Endpoint { path, template } => match ask.post(path, &body) {
            Ok(answer) => input_tokens(answer),
            // Builds before the count endpoints answer 404 for it.
            Err(Failed::Status(404 | 405 | 501)) if template => {
                let prompt = ask.post("/apply-template", &body).ok()?;
                let prompt = read_json(prompt, TEMPLATE_ANSWER)?;
                ask.tokenize(prompt.get("prompt")?.as_str()?)
            }
            Err(_) => None,
        },
        CountCall::Prompt => {
            let parsed: Value = serde_json::from_slice(&body).ok()?;
            match parsed.get("prompt")? {
                Value::String(prompt) => ask.tokenize(prompt),
                // Already tokens: the count is their number.
                Value::Array(items) if items.iter().all(Value::is_u64) => Some(items.len() as u64),
                _ => None,
            }
        }
    }
}

/// One request's count calls: the host and what is left of their common deadline.
struct Ask<'a> {
    agent: &'a ureq::Agent,
    host: &'a Host,
    deadline: Instant,
}

#[derive(Debug)]
enum Failed {
    Status(u16),
    Transport,
}

impl Ask<'_> {
    fn post(&self, path: &str, body: &[u8]) -> Result<Answer, Failed> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Failed::Transport);
        }
        let mut request = self
            .agent
            .post(format!("{}{}", self.host.url, path))
            .config()
            // The whole exchange, answer body included, ends by the common deadline.
            .timeout_global(Some(left))
            .build()
            .header("Content-Type", "application/json");
        if let Some(key) = &self.host.api_key {
            request = request.header("Authorization", format!("Bearer {key}"));
        }
        match request.send(body) {
            Ok(answer) if answer.status() == 200 => Ok(answer),
            Ok(answer) => Err(Failed::Status(answer.status().as_u16())),
            Err(_) => Err(Failed::Transport),
        }
    }

    /// `/tokenize` with the special tokens the server adds to a prompt, counted as it streams.
    fn tokenize(&self, prompt: &str) -> Option<u64> {
        let body = serde_json::json!({"content": prompt, "add_special": true});
        let answer = self.post("/tokenize", body.to_string().as_bytes()).ok()?;
        count_tokens(answer.into_body().into_reader().take(TOKENS_ANSWER))
    }
}

/// A host's answer to a count call.
type Answer = ureq::http::Response<ureq::Body>;

/// `{"input_tokens": N, ...}`.
fn input_tokens(answer: Answer) -> Option<u64> {
    read_json(answer, SMALL_ANSWER)?
        .get("input_tokens")?
        .as_u64()
}

/// The answer's JSON, or `None` when it is not JSON or longer than `limit` bytes.
fn read_json(answer: Answer, limit: u64) -> Option<Value> {
    let bytes = answer
        .into_body()
        .into_with_config()
        .limit(limit)
        .read_to_vec()
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The number of entries in `/tokenize`'s `{"tokens":[1,2,...]}`, read piece by piece without
/// keeping the answer. `None` for anything but a flat array of numbers ending in `]`.
fn count_tokens(mut answer: impl Read) -> Option<u64> {
    let mut buf = [0u8; 16 * 1024];
    let mut in_array = false;
    let (mut commas, mut digits) = (0u64, false);
    loop {
        let n = answer.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        for &b in &buf[..n] {
            if !in_array {
                in_array = b == b'[';
                continue;
            }
            match b {
                b'0'..=b'9' => digits = true,
                b',' => commas += 1,
                b' ' | b'\n' | b'\r' | b'\t' => {}
                b']' => return Some(if digits { commas + 1 } else { 0 }),
                _ => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Counter {
        fn start_now(&self, host: &str) -> Option<CountPermit<'_>> {
            self.start(host, Instant::now())
        }
    }
    use std::net::TcpListener;
    use std::time::Duration;

    #[test]
    fn a_host_that_does_not_answer_in_time_cannot_count() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let host = Host {
            name: "hung".into(),
            url: format!("http://{}", listener.local_addr().unwrap()),
            weight: 1,
            api_key: None,
            ctx: None,
            models: Default::default(),
            upstream: Default::default(),
        };
        // Accepts (the kernel's backlog does) and never answers.
        let agent = ureq::Agent::new_with_defaults();
        let started = Instant::now();
        let deadline = started + Duration::from_millis(200);
        let body = br#"{"messages":[{"role":"user","content":"hi"}]}"#;
        let counted = exact(&agent, &host, "/v1/chat/completions", body, None, deadline);
        assert_eq!(counted, None);
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(200), "{took:?}");
        assert!(
            took < Duration::from_secs(3),
            "the deadline bounds the wait: {took:?}"
        );
        drop(listener);
    }

    #[test]
    fn a_request_waits_for_a_turn_until_its_deadline_then_goes_without() {
        let counter = Counter::new(ureq::Agent::new_with_defaults());
        let held: Vec<_> = (0..PER_HOST)
            .map(|_| counter.start_now("a").unwrap())
            .collect();
        let started = Instant::now();
        assert!(counter
            .start("a", started + Duration::from_millis(20))
            .is_none());
        assert!(started.elapsed() >= Duration::from_millis(20));
        assert_eq!(counter.waiting(), 0);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                counter
                    .start("a", Instant::now() + Duration::from_secs(30))
                    .is_some()
            });
            while counter.waiting() == 0 {
                std::thread::yield_now();
            }
            drop(held);
            assert!(waiter.join().unwrap(), "a returned permit wakes the waiter");
        });
    }

    #[test]
    fn each_host_counts_for_at_most_per_host_requests_and_a_permit_comes_back_on_drop() {
        let counter = Counter::new(ureq::Agent::new_with_defaults());
        let mut held: Vec<_> = (0..PER_HOST)
            .map(|_| counter.start_now("a").expect("under the bound"))
            .collect();
        assert!(counter.start_now("a").is_none(), "at the bound");
        let other = counter
            .start_now("b")
            .expect("another host has its own bound");
        held.pop();
        let again = counter.start_now("a").expect("a permit came back");
        assert!(counter.start_now("a").is_none());
        drop((again, other));
        assert_eq!(counter.in_flight.lock().len(), 1, "b is gone, a holds one");
        drop(held);
        assert!(
            counter.in_flight.lock().is_empty(),
            "no host is left without a call"
        );
    }

    #[test]
    fn each_api_names_its_count_endpoint() {
        let path = |rest| match count_call(rest) {
            Some(CountCall::Endpoint { path, .. }) => path,
            other => panic!("{rest}: {other:?}"),
        };
        assert_eq!(
            path("/v1/chat/completions"),
            "/v1/chat/completions/input_tokens"
        );
        assert_eq!(path("/v1/messages"), "/v1/messages/count_tokens");
        assert_eq!(path("/v1/responses"), "/v1/responses/input_tokens");
        assert_eq!(count_call("/completion"), Some(CountCall::Prompt));
        assert_eq!(count_call("/v1/completions"), Some(CountCall::Prompt));
        for uncounted in ["/v1/embeddings", "/infill", "/v1/models", "/tokenize"] {
            assert_eq!(count_call(uncounted), None, "{uncounted}");
        }
    }

    #[test]
    fn token_lists_are_counted_at_every_split() {
        let answer = br#"{"tokens":[128000, 9906,1917 ,0]}"#;
        for split in 0..answer.len() {
            let (a, b) = answer.split_at(split);
            assert_eq!(count_tokens(a.chain(b)), Some(4), "split at {split}");
        }
        assert_eq!(count_tokens(&br#"{"tokens":[]}"#[..]), Some(0));
        assert_eq!(count_tokens(&br#"{"tokens":[1,2"#[..]), None, "cut short");
        let pieces = br#"{"tokens":[{"id":1,"piece":"a"}]}"#;
        assert_eq!(count_tokens(&pieces[..]), None);
        assert_eq!(count_tokens(&b"<html>"[..]), None);
    }
}
