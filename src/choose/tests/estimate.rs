//! Issue 23's estimate and issue 47's cost: a warm family against the queue it would wait in,
//! the room a family needs to last, and where a family gathers or spreads as what crossbar knows
//! of each host changes (similarity, the RAM cache, cold answers, a route's only host).

use super::*;

#[test]
fn the_estimate_weighs_a_warm_family_against_the_queue_it_would_wait_in() {
    let warm = |name: &str, tokens| Info {
        family_tokens: tokens,
        ..idle(name, 2)
    };
    // A 9,000-token first turn whose 8,000-token family is warm on b: 1 s there, 9 s on a.
    let infos = [idle("a", 2), warm("b", 8000)];
    assert_eq!(winner(&infos, 9000), Some(("b", Why::Family)));
    // The same warm host with both slots busy and three waiting, slots held 30 s: a 60 s
    // wait loses to a cold prefill on a free host.
    let saturated = Info {
        free: 0,
        queued: 3,
        hold_ms: 30_000.0,
        ..warm("b", 8000)
    };
    assert_eq!(
        winner(&[idle("a", 2), saturated.clone()], 9000),
        Some(("a", Why::LeastLoaded))
    );
    // With slots held 2 s, one waiting: a 3 s wait plus 1 s of prefill beats 9 s cold.
    let short = Info {
        hold_ms: 2_000.0,
        queued: 1,
        ..saturated
    };
    assert_eq!(
        winner(&[idle("a", 2), short], 9000),
        Some(("b", Why::Family))
    );
}

#[test]
fn a_host_with_no_room_for_the_prompt_counts_its_family_as_cold() {
    let full = Info {
        family_tokens: 8000,
        held: 60_000,
        leased: 60_000,
        capacity: 64_000,
        ..idle("full", 2)
    };
    let roomy = Info {
        held: 1_000,
        leased: 1_000,
        capacity: 64_000,
        ..idle("roomy", 2)
    };
    assert_eq!(full.warm_tokens(9000), 0);
    // Tied on a cold prefill, the lower share held wins.
    assert_eq!(
        winner(&[full.clone(), roomy.clone()], 9000),
        Some(("roomy", Why::LeastLoaded))
    );
    // A small prompt still fits beside what it holds: the family counts.
    assert_eq!(full.warm_tokens(3000), 3000);
    assert_eq!(winner(&[roomy, full], 3500), Some(("full", Why::Family)));
}

/// Two hosts for a family of `family` tokens whose prompt is `prompt`: "warm" holds the family
/// and has no free seat (its wait `wait_ms`), "cold" is idle.
fn warm_and_busy_or_cold_and_idle(family: u64, wait_ms: f64) -> Vec<Info> {
    vec![
        Info {
            family_tokens: family,
            family_size: family,
            hold_ms: wait_ms,
            ..host("warm")
        },
        Info {
            family_size: family,
            free: 1,
            ..host("cold")
        },
    ]
}

/// Issue 47: a family gathers on the host that holds it while waiting there costs less than
/// prefilling it twice — once for this request, once more for the fleet — and spreads past that.
#[test]
fn a_family_gathers_while_its_wait_costs_less_than_prefilling_it_again_issue_47() {
    // 8,000 tokens of family at 1,000 tokens/s: 8 s to prefill. One request queued ahead
    // (queued 0, 1 seat): the wait is one slot hold.
    let prompt = 9_000;
    for (wait_ms, gathers) in [(1_000.0, true), (12_000.0, true), (17_000.0, false)] {
        let hosts = warm_and_busy_or_cold_and_idle(8_000, wait_ms);
        let won = winner(&hosts, prompt).map(|w| w.0);
        let want = if gathers { "warm" } else { "cold" };
        assert_eq!(won, Some(want), "a wait of {wait_ms} ms");
    }
    // Without the fleet's cost (no candidate warm) the idle host wins as soon as it is quicker.
    let mut hosts = warm_and_busy_or_cold_and_idle(8_000, 12_000.0);
    hosts[0].family_tokens = 0;
    assert_eq!(winner(&hosts, prompt).map(|w| w.0), Some("cold"));
}

/// Issue 47: where llama-server picks slots by similarity and crossbar does not pin them, a new
/// sibling takes a live sibling's idle slot and wipes its history: the family counts there only
/// while no sibling is under way.
#[test]
fn a_family_counts_where_slots_are_picked_by_similarity_only_while_no_sibling_is_live_issue_47() {
    let similar = |siblings| Info {
        kept_apart: true,
        family_tokens: 4_000,
        family_size: 4_000,
        siblings,
        free: 1,
        ..host("similar")
    };
    assert_eq!(
        similar(0).warm_tokens(5_000),
        4_000,
        "its siblings have ended"
    );
    assert_eq!(
        similar(1).warm_tokens(5_000),
        0,
        "one under way would lose its slot"
    );
    let pinned = Info {
        kept_apart: false,
        ..similar(3)
    };
    assert_eq!(
        pinned.warm_tokens(5_000),
        4_000,
        "crossbar pins: siblings keep their slots"
    );
}

/// Issue 47: a host whose reused leases came back cold as often as it has seats lately is
/// oversubscribed — what it holds does not last — and ties go to the one with fewer colds.
#[test]
fn an_oversubscribed_host_keeps_nothing_warm_and_loses_ties_issue_47() {
    let warm = |colds| Info {
        family_tokens: 2_000,
        family_size: 2_000,
        seats: 2,
        free: 2,
        colds,
        ..host("h")
    };
    assert_eq!(warm(1).warm_tokens(3_000), 2_000);
    assert_eq!(warm(2).warm_tokens(3_000), 0, "two colds on two seats");
    let cold = |name, colds| Info {
        colds,
        ..idle(name, 1)
    };
    check(&[cold("thrashing", 1), cold("calm", 0)], Some("calm"));
}

/// Issue 47 (`make demo`): among equals, a host that is some route's only candidate keeps its
/// room for that route; another route's new conversation goes where it takes nobody's.
#[test]
fn a_routes_only_host_keeps_its_room_among_equals_issue_47() {
    let only = Info {
        reserved: 1,
        ..idle("mini", 1)
    };
    let shared = Info {
        live: 1,
        seats: 2,
        free: 1,
        ..idle("titan", 2)
    };
    check(&[only.clone(), shared.clone()], Some("titan"));
    // Not when it is the better host: a warm family still wins there.
    let warm = Info {
        family_tokens: 3_000,
        family_size: 3_000,
        ..only
    };
    assert_eq!(winner(&[warm, shared], 4_000).map(|w| w.0), Some("mini"));
}

/// Issue 47: a RAM cache keeps what the KV cannot hold, so a family counts there past the KV.
#[test]
fn a_ram_cache_keeps_a_family_warm_past_the_kv_issue_47() {
    let full = |ram| Info {
        family_tokens: 2_000,
        capacity: 10_000,
        held: 9_000,
        free: 1,
        ram,
        ..host("h")
    };
    assert_eq!(full(false).warm_tokens(3_000), 0, "no room in the KV");
    assert_eq!(
        full(true).warm_tokens(3_000),
        2_000,
        "the RAM cache keeps it"
    );
}
