//! The probe (issue 47): a few tiny `/completion` requests that show how a single-model host picks
//! its slots and whether its RAM prompt cache gives a history back, which llama-server reports in
//! no endpoint. Sent once at first contact (and after a new build or a restart), only while the
//! host is idle: the caller holds every seat crossbar has there while it runs.
//!
//! Two slots or more (`n_predict` 1, `cache_prompt` on, each prompt ~100 tokens of words that no
//! client sends, two prompts sharing nothing):
//! 0. W left to the host: whichever slot it takes, llama-server then saves every idle slot's
//!    state to its RAM cache (when it has one), so the pinned steps after it, which on a host
//!    with similarity off save nothing they displace, lose no conversation's last turn;
//! 1. Q pinned to slot 0; 2. P pinned to slot 1, and a prompt of its own pinned to each slot
//!    after it (up to [`MOST_SLOTS`]), so that slot 0 is the least recently used;
//! 3. P plus a few words, left to the host: similarity takes slot 1 (it holds P), the least
//!    recently used choice slot 0;
//! 4. the RAM test. Similarity on: an unrelated prompt pinned to slot 0, then Q plus a few words
//!    pinned there (llama-server saves what a pinned request displaces and loads the best saved
//!    prompt). Similarity off: Q plus a few words left to the host (a pinned request is never
//!    saved or loaded there; the least recently used slot, 1, is saved and Q loaded).
//!
//! One slot: A, an unrelated prompt, A again (the RAM test); then two siblings sharing a long
//! start and the first again: with similarity off its state was saved before the second took the
//! slot and comes back whole, with it on only the shared start is left (`learn::read_probe`).
//!
//! Every answer is read with a size bound and every step with a timeout; a step that fails ends
//! the probe with an error (tried again at a later poll). It knows nothing of leases or routes.

use std::time::Duration;

use serde_json::{json, Value};

use super::side::Side;
use crate::config::Host;
use crate::learn::{ProbeAnswers, Step};

/// Longest one step may take: a tiny prompt and one token, on a host that is idle.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// Most bytes of a step's answer read.
const ANSWER: u64 = 64 * 1024;
/// Words in a probe prompt (about 100 tokens on a llama-3 tokenizer).
const WORDS: usize = 60;
/// Slots the probe uses, whatever a host reports (it says how many, so it is bounded here): on a
/// host with more, the least recently used slot may be another than 0, which reads as unknown.
pub const MOST_SLOTS: u64 = 16;

/// Runs the probe on `host`, which has `slots` slots; `nonce` makes its prompts its own.
pub fn run(side: &Side, host: &Host, slots: u64, nonce: u64) -> Result<ProbeAnswers, String> {
    let say = |tag: &str| prompt(tag, nonce);
    let ask = |prompt: &str, slot: Option<u64>| step(side, host, prompt, slot);
    if slots >= 2 {
        ask(&say("w"), None)?;
        let (q, p) = (say("q"), say("p"));
        let first = ask(&q, Some(0))?;
        ask(&p, Some(1))?;
        for slot in 2..slots.min(MOST_SLOTS) {
            ask(&say(&format!("s{slot}")), Some(slot))?;
        }
        let choice = ask(&format!("{p} tango uniform"), None)?;
        let on = choice.0.slot == Some(1);
        let ram = if on {
            ask(&say("r"), Some(0))?;
            ask(&format!("{q} tango uniform"), Some(0))?
        } else {
            ask(&format!("{q} tango uniform"), None)?
        };
        return Ok(ProbeAnswers::Slots {
            choice: choice.0,
            ram: ram.0,
            tokens: first.1,
        });
    }
    let a = say("a");
    ask(&a, None)?;
    ask(&say("r"), None)?;
    let ram = ask(&a, None)?;
    // Siblings: a long shared start and short ends of their own.
    let family = say("f");
    let (one, two) = (
        format!("{family} oscar papa quebec romeo sierra tango uniform victor whiskey xray"),
        format!("{family} yankee zulu alpha bravo charlie delta echo foxtrot golf hotel"),
    );
    let sibling_tokens = ask(&one, None)?.1;
    ask(&two, None)?;
    let sibling = ask(&one, None)?;
    let family_tokens = sibling_tokens * family.len() as u64 / one.len().max(1) as u64;
    Ok(ProbeAnswers::OneSlot {
        ram: ram.0,
        sibling: sibling.0,
        tokens: sibling_tokens,
        family: family_tokens,
    })
}

/// A probe prompt: `tag` and the nonce first (so no two prompts share a start), then words.
fn prompt(tag: &str, nonce: u64) -> String {
    const WORD: [&str; 16] = [
        "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
        "juliet", "kilo", "lima", "mike", "november", "oscar", "papa",
    ];
    let mut x = nonce ^ u64::from_le_bytes(*b"crossbar") ^ tag.len() as u64;
    for b in tag.bytes() {
        x = x.rotate_left(7) ^ u64::from(b);
    }
    let mut out = format!("{tag} {nonce}:");
    for _ in 0..WORDS {
        // xorshift: deterministic words from the tag and nonce.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.push(' ');
        out.push_str(WORD[(x % 16) as usize]);
    }
    out
}

/// One step: the answer's slot and cached tokens, and the prompt's tokens as the host counted
/// them (cached plus evaluated).
fn step(side: &Side, host: &Host, prompt: &str, slot: Option<u64>) -> Result<(Step, u64), String> {
    let mut body = json!({
        "prompt": prompt, "n_predict": 1, "cache_prompt": true, "temperature": 0,
    });
    if let Some(slot) = slot {
        body["id_slot"] = json!(slot);
    }
    let body = body.to_string();
    let answer = (side.post_json(host, "/completion", body.as_bytes(), STEP_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let status = answer.status().as_u16();
    let bytes = (answer.into_body().into_with_config())
        .limit(ANSWER)
        .read_to_vec()
        .map_err(|e| e.to_string())?;
    if status != 200 {
        return Err(format!("/completion answered {status}"));
    }
    let v: Value = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
    let timings = &v["timings"];
    let count = |field: &str| timings[field].as_u64();
    let (Some(cached), Some(evaluated)) = (count("cache_n"), count("prompt_n")) else {
        return Err("an answer without timings".to_string());
    };
    let step = Step {
        slot: v["id_slot"].as_u64(),
        cached,
    };
    Ok((step, cached + evaluated))
}

#[cfg(test)]
mod tests {
    use super::prompt;

    #[test]
    fn probe_prompts_are_the_nonces_own_and_share_no_start() {
        let (q, p) = (prompt("q", 7), prompt("p", 7));
        assert_ne!(q.as_bytes()[0], p.as_bytes()[0]);
        assert_eq!(q, prompt("q", 7), "deterministic");
        assert_ne!(q, prompt("q", 8));
        assert_eq!(q.split(' ').count(), super::WORDS + 2);
    }
}
