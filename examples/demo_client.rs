//! `make demo`'s scripted client: three conversations of four turns against a running crossbar,
//! one per API — Chat Completions, Anthropic Messages (as Claude Code sends it) and OpenAI
//! Responses (as Codex sends it) — one line per turn with the host that answered, the lease and
//! the cache figures from each API's own usage fields.
//!
//! Usage: `demo_client http://127.0.0.1:PORT` (through crossbar), or `demo_client --direct URL...`
//! (the same script straight to the hosts, round robin, as a balancer without stickiness would
//! send it). A conversation is a system prompt and a first question (these name it), then each
//! answer and a follow-up appended, as an agent does — so each turn's prompt extends the last.
//! Ends with a `totals:` line (prompt, cached and prefilled tokens, prefill ms where the API
//! reports `timings` — Messages does not) that the demo compares between the two runs. Must not:
//! need anything but the crate's own dependencies (the demo runs on a machine with nothing else
//! installed).

use std::io::{BufRead, BufReader};
use std::process::ExitCode;

use serde_json::{json, Value};

#[derive(Clone, Copy, PartialEq)]
enum Api {
    Chat,
    Messages,
    Responses,
}

struct Conversation {
    route: &'static str,
    topic: &'static str,
    api: Api,
    stream: bool,
    system: String,
    /// (role, text) turns after the system prompt.
    turns: Vec<(&'static str, String)>,
}

/// What one answer said: its text, prompt tokens (cached included), cached tokens and the
/// prefill time from `timings` (none in Messages answers).
#[derive(Default)]
struct Said {
    text: String,
    prompt: i64,
    cached: i64,
    prefill_ms: Option<f64>,
}

/// Where the script's requests go.
enum Target {
    /// crossbar: `/<route>/v1/...`.
    Gateway(String),
    /// The hosts themselves, one after the other.
    Direct(Vec<String>),
}

/// The script's figures.
#[derive(Default)]
struct Totals {
    requests: usize,
    prompt: i64,
    cached: i64,
    prefill_ms: f64,
}

impl Conversation {
    fn new(route: &'static str, topic: &'static str, api: Api, stream: bool) -> Conversation {
        let system = format!(
            "You are a careful assistant on the {topic} project. {}",
            "Follow the house style and explain each step. ".repeat(30)
        );
        let first = format!("Tell me about {topic}.");
        Conversation {
            route,
            topic,
            api,
            stream,
            system,
            turns: vec![("user", first)],
        }
    }

    /// The request body in this conversation's API.
    fn body(&self) -> (String, Value) {
        let (path, mut body) = match self.api {
            Api::Chat => {
                let mut messages = vec![json!({"role": "system", "content": self.system})];
                messages.extend(
                    self.turns
                        .iter()
                        .map(|(r, t)| json!({"role": r, "content": t})),
                );
                (
                    "v1/chat/completions",
                    json!({"messages": messages, "max_tokens": 24}),
                )
            }
            Api::Messages => {
                // Claude Code's shape: system blocks, content blocks, a moving cache marker.
                let n = self.turns.len();
                let messages: Vec<Value> = (self.turns.iter().enumerate())
                    .map(|(i, (r, t))| {
                        let mut block = json!({"type": "text", "text": t});
                        if i + 1 == n {
                            block["cache_control"] = json!({"type": "ephemeral"});
                        }
                        json!({"role": r, "content": [block]})
                    })
                    .collect();
                let system = json!([{"type": "text", "text": self.system}]);
                let body = json!({"system": system, "messages": messages, "max_tokens": 24});
                ("v1/messages", body)
            }
            Api::Responses => {
                let input: Vec<Value> = (self.turns.iter())
                    .map(|(r, t)| {
                        let kind = if *r == "user" {
                            "input_text"
                        } else {
                            "output_text"
                        };
                        json!({"type": "message", "role": r,
                               "content": [{"type": kind, "text": t}]})
                    })
                    .collect();
                let body = json!({"instructions": self.system, "input": input,
                                  "max_output_tokens": 24});
                ("v1/responses", body)
            }
        };
        body["stream"] = json!(self.stream);
        (path.to_string(), body)
    }

    /// Sends the next turn to `target` and prints its line; appends the answer and the next
    /// question; adds the turn's figures to `totals`.
    fn turn(
        &mut self,
        agent: &ureq::Agent,
        target: &Target,
        totals: &mut Totals,
    ) -> Result<(), String> {
        let n = self.turns.len() / 2;
        let (path, body) = self.body();
        let url = match target {
            Target::Gateway(gateway) => format!("{gateway}/{}/{path}", self.route),
            Target::Direct(hosts) => format!("{}/{path}", hosts[totals.requests % hosts.len()]),
        };
        let resp = agent
            .post(&url)
            .header("Content-Type", "application/json")
            .send(body.to_string())
            .map_err(|e| format!("{url}: {e}"))?;
        let header = |name: &str| {
            let value = resp.headers().get(name).and_then(|v| v.to_str().ok());
            value.unwrap_or("?").to_string()
        };
        let (host, lease) = (header("X-Crossbar-Host"), header("X-Crossbar-Lease"));
        let host = match target {
            Target::Gateway(_) => host,
            Target::Direct(hosts) => format!("#{}", totals.requests % hosts.len()),
        };
        let mut body = resp.into_body();
        let said = if self.stream {
            read_stream(self.api, body)?
        } else {
            // At most ureq's default 10 MB: a demo answer is a few hundred bytes.
            let bytes = body.read_to_vec().map_err(|e| e.to_string())?;
            let v: Value = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
            read_whole(self.api, &v)
        };
        let api = match self.api {
            Api::Chat => "chat",
            Api::Messages => "messages",
            Api::Responses => "responses",
        };
        totals.requests += 1;
        totals.prompt += said.prompt;
        totals.cached += said.cached;
        totals.prefill_ms += said.prefill_ms.unwrap_or(0.0);
        println!(
            "  {:<5} {:<9} {:<7} turn {n}{:<9} host={host:<5} lease={lease:<6} prompt={:<4} cached={:<4} \
             prefill_ms={}",
            self.route,
            api,
            self.topic,
            if self.stream { " (stream)" } else { "" },
            said.prompt,
            said.cached,
            said.prefill_ms.map_or("-".to_string(), |ms| ms.floor().to_string()),
        );
        self.turns.push(("assistant", said.text));
        let next = format!(
            "Go on about {}, part {}, with an example.",
            self.topic,
            n + 1
        );
        self.turns.push(("user", next));
        Ok(())
    }
}

fn int(v: &Value) -> i64 {
    v.as_i64().unwrap_or(0)
}

/// A non-streamed answer's text and tokens, each API in its own fields.
fn read_whole(api: Api, v: &Value) -> Said {
    let u = &v["usage"];
    let prefill_ms = v["timings"]["prompt_ms"].as_f64();
    let said = match api {
        Api::Chat => Said {
            text: v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or("")
                .to_string(),
            prompt: int(&u["prompt_tokens"]),
            cached: int(&u["prompt_tokens_details"]["cached_tokens"]),
            prefill_ms: None,
        },
        Api::Messages => Said {
            text: v["content"][0]["text"].as_str().unwrap_or("").to_string(),
            // Messages' input_tokens excludes the cached part.
            prompt: int(&u["input_tokens"]) + int(&u["cache_read_input_tokens"]),
            cached: int(&u["cache_read_input_tokens"]),
            prefill_ms: None,
        },
        Api::Responses => Said {
            text: v["output"][0]["content"][0]["text"]
                .as_str()
                .unwrap_or("")
                .to_string(),
            prompt: int(&u["input_tokens"]),
            cached: int(&u["input_tokens_details"]["cached_tokens"]),
            prefill_ms: None,
        },
    };
    Said { prefill_ms, ..said }
}

/// Joins a streamed answer's deltas and picks up its figures; stops at the API's last event.
fn read_stream(api: Api, body: ureq::Body) -> Result<Said, String> {
    let mut said = Said::default();
    for line in BufReader::new(body.into_reader()).lines() {
        let line = line.map_err(|e| e.to_string())?;
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let ev: Value = serde_json::from_str(data).map_err(|e| e.to_string())?;
        match (api, ev["type"].as_str().unwrap_or("")) {
            (Api::Chat, _) => {
                if let Some(text) = ev["choices"][0]["delta"]["content"].as_str() {
                    said.text.push_str(text);
                }
                if let Some(t) = ev.get("timings") {
                    said.prompt = int(&t["prompt_n"]) + int(&t["cache_n"]);
                    said.cached = int(&t["cache_n"]);
                    said.prefill_ms = t["prompt_ms"].as_f64();
                }
            }
            (Api::Messages, "message_start") => {
                let u = &ev["message"]["usage"];
                said.prompt = int(&u["input_tokens"]) + int(&u["cache_read_input_tokens"]);
                said.cached = int(&u["cache_read_input_tokens"]);
            }
            (Api::Messages, "content_block_delta") => {
                said.text
                    .push_str(ev["delta"]["text"].as_str().unwrap_or(""));
            }
            (Api::Messages, "message_stop") => break,
            (Api::Responses, "response.output_text.delta") => {
                said.text.push_str(ev["delta"].as_str().unwrap_or(""));
            }
            (Api::Responses, "response.completed") => {
                let done = read_whole(Api::Responses, &ev["response"]);
                (said.prompt, said.cached) = (done.prompt, done.cached);
                said.prefill_ms = ev["timings"]["prompt_ms"].as_f64();
                break;
            }
            _ => {}
        }
    }
    Ok(said)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let target = match args.as_slice() {
        [flag, hosts @ ..] if flag == "--direct" && !hosts.is_empty() => {
            Target::Direct(hosts.to_vec())
        }
        [gateway] if !gateway.starts_with('-') => Target::Gateway(gateway.clone()),
        _ => {
            eprintln!("usage: demo_client http://HOST:PORT | demo_client --direct URL...");
            return ExitCode::from(2);
        }
    };
    let mut totals = Totals::default();
    let config = ureq::Agent::config_builder()
        .timeout_global(Some(std::time::Duration::from_secs(10)))
        .build();
    let agent = ureq::Agent::new_with_config(config);
    let mut conversations = [
        Conversation::new("projA", "parsers", Api::Chat, false),
        Conversation::new("projA", "sqlite", Api::Messages, true),
        Conversation::new("projB", "lexers", Api::Responses, true),
    ];
    for _ in 0..4 {
        for c in &mut conversations {
            if let Err(e) = c.turn(&agent, &target, &mut totals) {
                eprintln!("demo_client: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    println!(
        "totals: requests={} prompt={} cached={} prefilled={} prefill_ms={:.0}",
        totals.requests,
        totals.prompt,
        totals.cached,
        totals.prompt - totals.cached,
        totals.prefill_ms
    );
    ExitCode::SUCCESS
}
