//! `make demo`'s scripted client: three conversations of four turns against a running crossbar, one
//! line per turn with the host that answered, the lease and the cache figures from `timings`.
//!
//! Usage: `demo_client http://127.0.0.1:PORT` (through crossbar), or `demo_client --direct URL...`
//! (the same script straight to the hosts, round robin, as a balancer without stickiness would
//! send it). A conversation is a system prompt and a first question (these name it), then each
//! answer and a follow-up appended, as a chat client does — so each turn's prompt extends the
//! last. Ends with a `totals:` line (prompt, cached and prefilled tokens, prefill ms, from the
//! hosts' `timings`) that the demo compares between the two runs. Must not: need anything but the
//! crate's own dependencies (the demo runs on a machine with nothing else installed).

use std::io::{BufRead, BufReader};
use std::process::ExitCode;

use serde_json::{json, Value};

struct Conversation {
    route: &'static str,
    topic: &'static str,
    stream: bool,
    messages: Vec<Value>,
}

impl Conversation {
    fn new(route: &'static str, topic: &'static str, stream: bool) -> Conversation {
        let system = format!(
            "You are a careful assistant on the {topic} project. {}",
            "Follow the house style and explain each step. ".repeat(30)
        );
        Conversation {
            route,
            topic,
            stream,
            messages: vec![
                json!({"role": "system", "content": system}),
                json!({"role": "user", "content": format!("Tell me about {topic}.")}),
            ],
        }
    }

    /// Sends the next turn to `target` and prints its line; appends the answer and the next
    /// question; adds the turn's figures to `totals`.
    fn turn(
        &mut self,
        agent: &ureq::Agent,
        target: &Target,
        totals: &mut Totals,
    ) -> Result<(), String> {
        let n = (self.messages.len() - 1) / 2;
        let body = json!({"messages": self.messages, "stream": self.stream, "max_tokens": 24});
        let url = match target {
            Target::Gateway(gateway) => format!("{gateway}/{}/v1/chat/completions", self.route),
            Target::Direct(hosts) => {
                let host = &hosts[totals.requests % hosts.len()];
                format!("{host}/v1/chat/completions")
            }
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
        let mut body = resp.into_body();
        let (answer, timings) = if self.stream {
            read_stream(body)?
        } else {
            // At most ureq's default 10 MB: a demo answer is a few hundred bytes.
            let bytes = body.read_to_vec().map_err(|e| e.to_string())?;
            let v: Value = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
            let text = v["choices"][0]["message"]["content"].as_str().unwrap_or("");
            (text.to_string(), v["timings"].clone())
        };
        let num = |k: &str| timings[k].as_f64().unwrap_or(0.0);
        let host = match target {
            Target::Gateway(_) => host,
            Target::Direct(hosts) => format!("#{}", totals.requests % hosts.len()),
        };
        totals.requests += 1;
        totals.prompt += num("prompt_n") + num("cache_n");
        totals.cached += num("cache_n");
        totals.prefilled += num("prompt_n");
        totals.prefill_ms += num("prompt_ms");
        println!(
            "  {:<5} {:<8} turn {n}{:<9} host={host:<5} lease={lease:<6} prompt={:<4} cached={:<4} \
             prefill_ms={}",
            self.route,
            self.topic,
            if self.stream { " (stream)" } else { "" },
            num("prompt_n") + num("cache_n"),
            num("cache_n"),
            num("prompt_ms").floor(),
        );
        self.messages
            .push(json!({"role": "assistant", "content": answer}));
        let next = format!(
            "Go on about {}, part {}, with an example.",
            self.topic,
            n + 1
        );
        self.messages.push(json!({"role": "user", "content": next}));
        Ok(())
    }
}

/// Where the script's requests go.
enum Target {
    /// crossbar: `/<route>/v1/...`.
    Gateway(String),
    /// The hosts themselves, one after the other.
    Direct(Vec<String>),
}

/// The script's figures, from the hosts' `timings`.
#[derive(Default)]
struct Totals {
    requests: usize,
    prompt: f64,
    cached: f64,
    prefilled: f64,
    prefill_ms: f64,
}

/// Joins an SSE answer's deltas; the last event with `timings` carries the cache figures.
fn read_stream(body: ureq::Body) -> Result<(String, Value), String> {
    let (mut answer, mut timings) = (String::new(), Value::Null);
    for line in BufReader::new(body.into_reader()).lines() {
        let line = line.map_err(|e| e.to_string())?;
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let event: Value = serde_json::from_str(data).map_err(|e| e.to_string())?;
        if let Some(text) = event["choices"][0]["delta"]["content"].as_str() {
            answer.push_str(text);
        }
        if event.get("timings").is_some() {
            timings = event["timings"].clone();
        }
    }
    Ok((answer, timings))
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
        Conversation::new("projA", "parsers", false),
        Conversation::new("projA", "sqlite", false),
        Conversation::new("projB", "lexers", true),
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
        totals.requests, totals.prompt, totals.cached, totals.prefilled, totals.prefill_ms
    );
    ExitCode::SUCCESS
}
