//! Completion-style prompts (`/completion`, `/completions`, `/v1/completions`, `/infill`): the
//! body carries the rendered text itself in the first non-null of `prompt`, `input_prefix`,
//! `content`, `input`.
//!
//! Conversation (kind `prompt`): the prompt up to the end of its first assistant-turn marker
//! (`<|im_start|>assistant`, `<|start_header_id|>assistant<|end_header_id|>`, `[/INST]`,
//! `<start_of_turn>model`, `\nAssistant:` ... see [`TURN_MARKERS`]), when one starts within the
//! first [`PROMPT_PREFIX`] bytes; else the first [`PROMPT_PREFIX`] bytes (the seed's rule).
//!
//! Why: turn n of a completion-style conversation is turn 1's prompt, its answer and the next
//! user turn, so a cut at a fixed length cannot hold a conversation whose first prompt is shorter
//! than the cut — its fingerprint changed every turn. Turn 1's prompt ends with the generation
//! prompt (the first assistant marker); in every later turn the first assistant marker is at the
//! same place. So "up to the first assistant marker" is the first user turn, like the chat rule's
//! "up to the first user message", and turn 1's fingerprint is exactly the seed's (same kind, same
//! bytes): leases made before this rule keep their keys. Prompts without a marker (plain text
//! continuation, fill-in-the-middle) keep the seed's rule. A few-shot preamble that itself holds a
//! marker cuts inside the preamble: its conversations share one lease, like the route-level one.
//! Token-list prompts hash the first bytes of their JSON text (kind `prompt-json`, so the string
//! `"[1]"` and the list `[1]` stay apart). Usage as in Chat Completions.

use serde_json::Value;

use super::body::Body;
use super::Conversation;

pub(super) const PATHS: &[&str] = &["/completion", "/completions", "/v1/completions", "/infill"];

/// How many bytes of a completion-style prompt identify the conversation at most.
pub const PROMPT_PREFIX: usize = 4096;

/// Where an assistant turn starts in the chat templates llama.cpp ships and in plain transcripts.
/// Where two markers start at the same place the longer one counts, so a template's own
/// newline after the marker is part of turn 1 (whose prompt then hashes exactly as before).
pub const TURN_MARKERS: &[&str] = &[
    "<|im_start|>assistant\n",
    "<|im_start|>assistant",
    "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "<|start_header_id|>assistant<|end_header_id|>",
    "[/INST]",
    "<start_of_turn>model\n",
    "<start_of_turn>model",
    "<|assistant|>\n",
    "<|assistant|>",
    "<|Assistant|>",
    "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
    "### Response:",
    "\nAssistant:",
    "\nASSISTANT:",
    "\nassistant:",
];

/// Where a user turn starts in the same templates: a prompt's family is the text before the
/// first of them (its system turn), when that text holds more than a BOS token's worth.
pub const USER_MARKERS: &[&str] = &[
    "<|im_start|>user",
    "<|start_header_id|>user<|end_header_id|>",
    "[INST]",
    "<start_of_turn>user",
    "<|user|>",
    "<|User|>",
    "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>",
    "### Instruction:",
    "\nUser:",
    "\nUSER:",
    "\nuser:",
];

/// Shortest text before a user marker that counts as a preamble (`<|begin_of_text|>`, `<s>` and
/// the like are shorter).
const MIN_PREAMBLE: usize = 24;

/// How far into a prompt its first user turn is looked for: a system prompt of about 16k tokens.
const FAMILY_WINDOW: usize = 64 << 10;

/// Family (kind `prompt-family`): the model and the prompt's text before its first user turn,
/// when that turn starts within [`FAMILY_WINDOW`] bytes. Token-list prompts and prompts without a
/// user marker have no family.
/// llama-server keeps a body's `id_slot` here.
pub(super) const KEEPS_ID_SLOT: bool = true;

/// The field that bounds what a request generates and its aliases, in the order llama-server's
/// schema reads them (b11434 `server-schema.cpp`); chat bodies share them.
pub(super) const LIMIT: &[&str] = &["n_predict", "max_completion_tokens", "max_tokens"];

/// What a completion-style body may generate: [`LIMIT`]; none is no bound.
pub(super) fn output_limit(body: &[u8]) -> Option<u64> {
    super::limit_field(body, LIMIT).ok().and_then(super::bound)
}

/// A body sent to `path` is counted by tokenizing its `prompt`: every completion path but
/// `/infill`, whose body is more than its prompt (the text around the gap).
pub(super) fn counts_by_prompt(path: &str) -> bool {
    path != "/infill"
}

pub(super) fn family(body: &Body) -> Option<Conversation> {
    let prompt = first_prompt(body)?.as_str()?.as_bytes();
    let prompt = &prompt[..prompt.len().min(FAMILY_WINDOW)];
    let at = USER_MARKERS
        .iter()
        .filter_map(|m| {
            let m = m.as_bytes();
            prompt.windows(m.len()).position(|w| w == m)
        })
        .min()?;
    let text = std::str::from_utf8(&prompt[..at]).ok()?;
    if text.trim().len() < MIN_PREAMBLE {
        return None;
    }
    super::preamble("prompt-family", body, |parts| parts.json(&text))
}

pub(super) fn conversation(body: &Body) -> Option<Conversation> {
    let prompt = first_prompt(body)?;
    Some(match prompt.as_str() {
        Some(s) => prompt_part(&s.as_bytes()[..first_turn(s.as_bytes())]),
        None => json_part(prompt),
    })
}

/// The seed's rule, for bodies that reach a chat path without `messages`: the first
/// [`PROMPT_PREFIX`] bytes, whatever they hold.
pub(super) fn whole_prefix(body: &Body) -> Option<Conversation> {
    let prompt = first_prompt(body)?;
    Some(match prompt.as_str() {
        Some(s) => prompt_part(&s.as_bytes()[..s.len().min(PROMPT_PREFIX)]),
        None => json_part(prompt),
    })
}

/// `prompts` follows the fields' order of precedence, so the first present one wins.
fn first_prompt(body: &Body) -> Option<&Value> {
    body.prompts.iter().flatten().next()
}

/// The length of the first turn: up to the end of the earliest assistant marker that starts in
/// the first [`PROMPT_PREFIX`] bytes, else [`PROMPT_PREFIX`] (or the whole prompt if shorter).
fn first_turn(prompt: &[u8]) -> usize {
    let window = &prompt[..prompt.len().min(PROMPT_PREFIX)];
    TURN_MARKERS
        .iter()
        .filter_map(|m| {
            let m = m.as_bytes();
            let end = (window.len() + m.len() - 1).min(prompt.len());
            prompt[..end]
                .windows(m.len())
                .position(|w| w == m)
                .map(|at| (at, std::cmp::Reverse(at + m.len())))
        })
        .min()
        .map_or(window.len(), |(_, end)| end.0)
}

fn prompt_part(bytes: &[u8]) -> Conversation {
    let mut parts = Conversation::new("prompt");
    parts.bytes(bytes);
    parts
}

fn json_part(prompt: &Value) -> Conversation {
    let mut parts = Conversation::new("prompt-json");
    parts.bytes(&json_prefix(prompt, PROMPT_PREFIX));
    parts
}

/// The first `max` bytes of `v`'s compact JSON text, without serialising the rest.
pub(crate) fn json_prefix(v: &Value, max: usize) -> Vec<u8> {
    struct Capped {
        buf: Vec<u8>,
        max: usize,
    }
    impl std::fmt::Write for Capped {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            let room = self.max - self.buf.len();
            let take = s.len().min(room);
            self.buf.extend_from_slice(&s.as_bytes()[..take]);
            if take < s.len() {
                Err(std::fmt::Error) // full: stop the serialiser early
            } else {
                Ok(())
            }
        }
    }
    let mut out = Capped {
        buf: Vec::with_capacity(max.min(1024)),
        max,
    };
    // An Err here only means "capped": what was written is exactly the prefix we want.
    let _ = std::fmt::write(&mut out, format_args!("{v}"));
    out.buf
}
