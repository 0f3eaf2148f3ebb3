//! `make demo`'s scripted client: three conversations of four turns against a running crossbar, one
//! line per turn with the host that answered, the lease and the cache figures from `timings`.
//!
//! Usage: `demo_client http://127.0.0.1:PORT`. A conversation is a system prompt and a first
//! question (these name it), then each answer and a follow-up appended, as a chat client does — so
//! each turn's prompt extends the last. Must not: need anything but the crate's own dependencies
//! (the demo runs on a machine with nothing else installed).

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

    /// Sends the next turn and prints its line; appends the answer and the next question.
    fn turn(&mut self, agent: &ureq::Agent, gateway: &str) -> Result<(), String> {
        let n = (self.messages.len() - 1) / 2;
        let body = json!({"messages": self.messages, "stream": self.stream, "max_tokens": 24});
        let url = format!("{gateway}/{}/v1/chat/completions", self.route);
        let resp = agent
            .post(&url)
            .send_json(body)
            .map_err(|e| format!("{url}: {e}"))?;
        let header = |name: &str| resp.header(name).unwrap_or("?").to_string();
        let (host, lease) = (header("X-Crossbar-Host"), header("X-Crossbar-Lease"));
        let (answer, timings) = if self.stream {
            read_stream(resp)?
        } else {
            let v: Value = resp.into_json().map_err(|e| e.to_string())?;
            let text = v["choices"][0]["message"]["content"].as_str().unwrap_or("");
            (text.to_string(), v["timings"].clone())
        };
        let num = |k: &str| timings[k].as_f64().unwrap_or(0.0);
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

/// Joins an SSE answer's deltas; the last event with `timings` carries the cache figures.
fn read_stream(resp: ureq::Response) -> Result<(String, Value), String> {
    let (mut answer, mut timings) = (String::new(), Value::Null);
    for line in BufReader::new(resp.into_reader()).lines() {
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
    let Some(gateway) = std::env::args().nth(1) else {
        eprintln!("usage: demo_client http://HOST:PORT");
        return ExitCode::from(2);
    };
    let agent = ureq::AgentBuilder::new()
        .timeout(std::time::Duration::from_secs(10))
        .build();
    let mut conversations = [
        Conversation::new("projA", "parsers", false),
        Conversation::new("projA", "sqlite", false),
        Conversation::new("projB", "lexers", true),
    ];
    for _ in 0..4 {
        for c in &mut conversations {
            if let Err(e) = c.turn(&agent, &gateway) {
                eprintln!("demo_client: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
