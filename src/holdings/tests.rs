//! What hosts hold: warm families from placement and answers, sizes from warm first turns,
//! arrivals until their slot, prefill speed, failing, and every table's bound.

use super::*;

fn fam(id: u32, bytes: u64) -> Option<Family> {
    Some(Family { id, bytes })
}

#[test]
fn a_family_is_warm_from_its_placement_and_sized_by_its_warm_first_turns() {
    let h = Holdings::default();
    let f = fam(7, 4000);
    assert_eq!(
        h.facts("a", "m", f, 0).family_tokens,
        0,
        "cold before anything"
    );
    h.placed("a", "m", f, true, 0);
    // Before an answer says better, bytes ÷ 4.
    assert_eq!(h.facts("a", "m", f, 0).family_tokens, 1000);
    assert_eq!(
        h.facts("b", "m", f, 0).family_tokens,
        0,
        "only where placed"
    );
    assert_eq!(h.facts("a", "other", f, 0).family_tokens, 0, "per model");
    // A cold first turn's cache_n says nothing about the family; warm ones do, the smallest wins.
    let served = |cached, warm_first_turn| Served {
        ok: true,
        family: f,
        warm_first_turn,
        cached: Some(cached),
        conversation: None,
    };
    h.served("a", "m", served(10, false));
    assert_eq!(h.facts("a", "m", f, 0).family_tokens, 1000);
    h.served("a", "m", served(950, true));
    h.served("a", "m", served(990, true));
    assert_eq!(h.facts("a", "m", f, 0).family_tokens, 950);
    // A warm first turn that found (almost) nothing missed: the host did not hold the family yet.
    h.served("a", "m", served(0, true));
    h.served("a", "m", served(2, true));
    h.served("a", "m", served(249, true));
    assert_eq!(
        h.facts("a", "m", f, 0).family_tokens,
        950,
        "misses are no size"
    );
    h.served("a", "m", served(250, true));
    assert_eq!(
        h.facts("a", "m", f, 0).family_tokens,
        250,
        "a partial hit is"
    );
    // Served elsewhere, warm there too, at the learned size.
    h.served("b", "m", served(5000, false));
    assert_eq!(h.facts("b", "m", f, 0).family_tokens, 250);
    // A failed answer warms nothing.
    let failed = Served {
        ok: false,
        ..served(0, false)
    };
    h.served("c", "m", failed);
    assert_eq!(h.facts("c", "m", f, 0).family_tokens, 0);
    assert_eq!(
        h.warm_on("a", "m"),
        vec![(Family { id: 7, bytes: 4000 }, 250)]
    );
}

#[test]
fn arrivals_count_until_their_slot_and_expire_when_they_never_come() {
    let h = Holdings::default();
    h.placed("a", "m", None, true, 1_000);
    h.placed("a", "m", None, true, 2_000);
    h.placed("a", "m", None, false, 2_000);
    assert_eq!(
        h.facts("a", "m", None, 2_000).arriving,
        2,
        "no slot, no arrival"
    );
    h.arrived("a", "m");
    assert_eq!(h.facts("a", "m", None, 2_000).arriving, 1);
    // One whose request never reached its slot is forgotten after the TTL.
    assert_eq!(h.facts("a", "m", None, 2_000 + ARRIVAL_TTL + 1).arriving, 0);
    h.arrived("a", "m");
    h.arrived("nowhere", "m");
    assert_eq!(h.facts("a", "m", None, 0).arriving, 0);
}

#[test]
fn prefill_speed_comes_from_recent_long_prefills_and_failing_lasts_until_an_answer() {
    let h = Holdings::default();
    assert_eq!(h.facts("a", "m", None, 0).prefill_tps, None);
    // Under a batch of 512 a prefill measures its partial batch, not the host.
    h.prefilled("a", 10, 1_000_000);
    h.prefilled("a", 511, 1_000_000);
    h.prefilled("a", 1_000, 1_000_000);
    h.prefilled("a", 3_000, 1_000_000);
    assert_eq!(h.prefill_tps("a"), Some(2_000.0));
    // Placement takes a speed only from enough prefills: two could be an idle moment's.
    assert_eq!(h.facts("a", "m", None, 0).prefill_tps, None);
    for _ in 2..MIN_SPEED_SAMPLES {
        h.prefilled("a", 2_000, 1_000_000);
    }
    assert_eq!(h.facts("a", "m", None, 0).prefill_tps, Some(2_000.0));
    // Pooled over hosts, however few each has: the route's scale before any is measured apart.
    h.prefilled("b", 6_000, 1_000_000);
    assert_eq!(h.pooled_tps(["b"]), Some(6_000.0));
    assert_eq!(h.pooled_tps(["b", "nowhere"]), Some(6_000.0));
    let a_tokens = 1_000 + 3_000 + 2_000 * (MIN_SPEED_SAMPLES as u64 - 2);
    let pooled = (a_tokens + 6_000) as f64 / (MIN_SPEED_SAMPLES + 1) as f64;
    assert_eq!(h.pooled_tps(["a", "b"]), Some(pooled));
    assert_eq!(h.pooled_tps(["nowhere"]), None);
    for _ in 0..PREFILLS {
        h.prefilled("a", 600, 1_000_000);
    }
    assert_eq!(h.prefill_tps("a"), Some(600.0), "only the last {PREFILLS}");
    h.failed("a");
    assert!(h.facts("a", "m", None, 0).failing);
    h.served("a", "m", Served::default());
    assert!(!h.facts("a", "m", None, 0).failing);
}

#[test]
fn every_table_is_bounded() {
    let h = Holdings::default();
    for id in 0..(WARM_CAP as u32 + 10) {
        h.placed("a", "m", fam(id, 400), false, 0);
    }
    let warm = h.warm_on("a", "m");
    assert_eq!(warm.len(), WARM_CAP);
    // The least recently used went first; the newest is first in the list.
    assert_eq!(warm[0].0.id, WARM_CAP as u32 + 9);
    assert!(warm.iter().all(|(f, _)| f.id >= 10));
    for id in 0..(FAMILY_CAP as u32 + 5) {
        h.placed("b", "m", fam(1_000_000 + id, 400), false, 0);
    }
    assert_eq!(h.inner.lock().families.len(), FAMILY_CAP);
    for t in 0..(ARRIVING_CAP as i64 + 5) {
        h.placed("c", "m", None, true, t);
    }
    assert_eq!(h.facts("c", "m", None, 0).arriving, ARRIVING_CAP);
    h.retain_hosts(|host| host == "a");
    assert!(h.warm_on("b", "m").is_empty());
    assert_eq!(h.warm_on("a", "m").len(), WARM_CAP);
}

#[test]
fn a_restart_rebuilds_warm_families_and_sizes_from_rows() {
    let h = Holdings::default();
    let row = |host: &str, family, cached| Recent {
        host: host.to_string(),
        model: "m".to_string(),
        family,
        warm_first_cached: cached,
    };
    h.rebuild([
        row("a", 5, None),
        row("b", 5, Some(800)),
        row("a", 5, Some(MIN_FAMILY_HIT - 1)),
        row("a", 6, None),
    ]);
    let f = fam(5, 4000);
    assert_eq!(h.facts("a", "m", f, 0).family_tokens, 800);
    assert_eq!(h.facts("b", "m", f, 0).family_tokens, 800);
    // A family whose size no row measured learns its bytes from its next request.
    assert_eq!(h.facts("a", "m", fam(6, 2000), 0).family_tokens, 0);
    h.placed("c", "m", fam(6, 2000), false, 0);
    assert_eq!(h.facts("a", "m", fam(6, 2000), 0).family_tokens, 500);
}

#[test]
fn a_conversation_is_unsaved_from_its_answer_until_the_host_is_next_sent_a_request() {
    let h = Holdings::default();
    let answered = |conversation| Served {
        ok: true,
        conversation: Some(conversation),
        ..Served::default()
    };
    // Nothing answered yet: nothing of it waits in an idle slot.
    assert!(!h.launch("a", "m", Some(1)));
    h.served("a", "m", answered(1));
    h.served("a", "m", answered(2));
    // Another conversation's request starts first: its start copies both idle slots.
    assert!(!h.launch("a", "m", Some(3)));
    assert!(!h.launch("a", "m", Some(1)));
    // Conversation 1 answered and comes back before anything else was sent there.
    h.served("a", "m", answered(1));
    assert!(h.launch("a", "m", Some(1)));
    assert!(!h.launch("a", "m", Some(1)), "that launch copied it");
    // Another host or model keeps its own account; a request with no conversation clears too.
    h.served("a", "m", answered(1));
    assert!(!h.launch("b", "m", Some(1)));
    assert!(!h.launch("a", "other", Some(1)));
    assert!(!h.launch("a", "m", None));
    assert!(!h.launch("a", "m", Some(1)));
}

#[test]
fn the_unsaved_conversations_of_a_host_are_bounded() {
    let h = Holdings::default();
    let answer_all = || {
        for c in 0..(UNSAVED_CAP as u64 + 10) {
            let served = Served {
                ok: true,
                conversation: Some(c),
                ..Served::default()
            };
            h.served("a", "m", served);
        }
    };
    answer_all();
    // The newest are still known...
    assert!(h.launch("a", "m", Some(UNSAVED_CAP as u64 + 9)));
    // ...and the oldest were dropped.
    answer_all();
    assert!(!h.launch("a", "m", Some(0)));
}
