//! `prefill_shared`: slots prefilling at once share one compute budget, as llama-server's do
//! (docs/BENCHMARKS.md: two 11k-token prompts at once on a real two-slot server took 2.4–2.6 s
//! to finish both, where one alone prefills 8k tokens in 0.6–0.7 s).

use super::*;
use std::sync::atomic::Ordering;

/// The `prompt_n` and `prompt_ms` a sim reports for one fresh prompt, with `others` slots
/// prefilling beside it the whole time.
fn prefilled(shared: bool, others: usize) -> (u64, f64) {
    let sim = Sim::start(SimConfig {
        prefill_us_per_token: 10,
        prefill_shared: shared,
        ..SimConfig::default()
    });
    sim.shared.prefilling.store(others, Ordering::SeqCst);
    let words = vec!["word"; 3000].join(" ");
    let (status, answer) = json_of(post(
        &sim,
        "/v1/chat/completions",
        &json!({"messages": convo(&words), "max_tokens": 1}),
    ));
    assert_eq!(status, 200, "{answer}");
    let timings = &answer["timings"];
    (
        timings["prompt_n"].as_u64().expect("prompt_n"),
        timings["prompt_ms"].as_f64().expect("prompt_ms"),
    )
}

#[test]
fn a_prefill_beside_another_takes_twice_as_long_when_slots_share_the_compute() {
    let (n, alone) = prefilled(true, 0);
    assert!(n > 2048, "more than one batch: {n}");
    assert_eq!(alone, n as f64 * 10.0 / 1000.0);
    let (_, beside_one) = prefilled(true, 1);
    assert_eq!(beside_one, 2.0 * alone);
    // Off (the default), each slot prefills at full speed whatever the others do.
    let (_, parallel) = prefilled(false, 1);
    assert_eq!(parallel, alone);
}

#[test]
fn a_token_decoded_beside_a_prefill_waits_for_its_batch_when_slots_share_the_compute() {
    let sim = |shared| {
        Sim::start(SimConfig {
            prefill_us_per_token: 10,
            decode_us_per_token: 300,
            prefill_shared: shared,
            ..SimConfig::default()
        })
    };
    let (shared, parallel) = (sim(true), sim(false));
    assert_eq!(shared.shared.decode_us(), 300);
    shared.shared.prefilling.store(1, Ordering::SeqCst);
    assert_eq!(shared.shared.decode_us(), 10 * 2048);
    parallel.shared.prefilling.store(1, Ordering::SeqCst);
    assert_eq!(parallel.shared.decode_us(), 300);
}
