//! The chooser's stories: each tie-breaker in its turn, hosts that never win, and issue 23's
//! estimate (a warm family against a queue, capacity, bursts, the inherited host, failing hosts,
//! the busy move).

use super::*;

mod estimate;
mod spread;

/// A usable host: healthy, serving, not loaded, one slot and none free, nothing queued, no
/// leases, weight 1, nothing warm, 1,000 tokens/s, a slot held 1 s, capacity unknown.
pub(crate) fn host(name: &str) -> Info {
    Info {
        name: name.into(),
        healthy: true,
        draining: false,
        loaded: false,
        room: true,
        serves: true,
        seats: 1,
        free: 0,
        queued: 0,
        leases: 0,
        weight: 1,
        family_tokens: 0,
        family_size: 0,
        kept_apart: false,
        ram: false,
        colds: 0,
        reserved: 0,
        live: 0,
        siblings: 0,
        prefill_tps: 1000.0,
        hold_ms: 1000.0,
        hold_known: true,
        held: 0,
        leased: 0,
        capacity: 0,
        inherited: false,
        failing: false,
    }
}

/// An idle loaded host with `slots` free slots.
fn idle(name: &str, slots: usize) -> Info {
    Info {
        loaded: true,
        seats: slots,
        free: slots,
        ..host(name)
    }
}

fn winner(infos: &[Info], prompt: u64) -> Option<(&str, Why)> {
    best(infos, prompt).map(|(i, why)| (i.name.as_str(), why))
}

#[track_caller]
fn check(infos: &[Info], want: Option<&str>) {
    assert_eq!(winner(infos, 0).map(|w| w.0), want, "{infos:#?}");
}

#[test]
fn each_tie_breaker_decides_when_the_ones_before_it_tie() {
    // (story, candidates in route order, expected winner)
    let cases: Vec<(&str, Vec<Info>, &str)> = vec![
        (
            "loaded beats more free slots, fewer queued and more weight",
            vec![
                Info {
                    free: 4,
                    weight: 9,
                    ..host("cold")
                },
                Info {
                    loaded: true,
                    queued: 3,
                    ..host("warm")
                },
            ],
            "warm",
        ),
        (
            "then room to load it without evicting a busy model (issue 15)",
            vec![
                Info {
                    room: false,
                    free: 4,
                    weight: 9,
                    ..host("full")
                },
                Info {
                    queued: 2,
                    ..host("spare")
                },
            ],
            "spare",
        ),
        (
            "where slots are picked by similarity, the fewest live siblings, then the fewest live",
            vec![
                Info {
                    siblings: 1,
                    live: 1,
                    free: 1,
                    kept_apart: true,
                    ..host("beside a sibling")
                },
                Info {
                    live: 2,
                    free: 1,
                    kept_apart: true,
                    ..host("apart")
                },
            ],
            "apart",
        ),
        (
            "then the fewest live conversations per slot, before the tokens the leases hold",
            vec![
                Info {
                    live: 2,
                    free: 1,
                    ..host("under way")
                },
                Info {
                    live: 1,
                    leases: 12,
                    leased: 90_000,
                    free: 1,
                    ..host("ended")
                },
            ],
            "ended",
        ),
        (
            "counted per slot: 3 live on 4 slots beat 1 on 1",
            vec![
                Info {
                    live: 1,
                    free: 1,
                    ..host("one slot")
                },
                Info {
                    live: 3,
                    seats: 4,
                    free: 1,
                    ..host("four slots")
                },
            ],
            "four slots",
        ),
        (
            "held tokens as a share of capacity only when both are known, else as tokens",
            vec![
                Info {
                    leased: 50_000,
                    capacity: 100_000,
                    free: 1,
                    ..host("known")
                },
                Info {
                    leased: 10_000,
                    free: 1,
                    ..host("unknown")
                },
            ],
            "unknown",
        ),
        (
            "then the most free slots for this model",
            vec![
                Info {
                    free: 1,
                    weight: 9,
                    ..host("one")
                },
                Info {
                    free: 2,
                    queued: 5,
                    ..host("two")
                },
            ],
            "two",
        ),
        (
            "then the fewest queued",
            vec![
                Info {
                    queued: 2,
                    weight: 9,
                    ..host("busy")
                },
                Info {
                    queued: 1,
                    leases: 5,
                    ..host("calm")
                },
            ],
            "calm",
        ),
        (
            "then the fewest leases",
            vec![
                Info {
                    leases: 3,
                    weight: 2,
                    ..host("crowded")
                },
                Info {
                    leases: 1,
                    ..host("roomy")
                },
            ],
            "roomy",
        ),
        (
            "counted per unit of weight: 3 leases on weight 2 beat 2 on weight 1",
            vec![
                Info {
                    leases: 2,
                    ..host("small")
                },
                Info {
                    leases: 3,
                    weight: 2,
                    ..host("big")
                },
            ],
            "big",
        ),
        (
            "then the highest weight",
            vec![
                Info {
                    leases: 1,
                    ..host("light")
                },
                Info {
                    leases: 2,
                    weight: 2,
                    ..host("heavy")
                },
            ],
            "heavy",
        ),
        (
            "then the earliest in the route's list",
            vec![host("first"), host("second"), host("third")],
            "first",
        ),
        (
            "earliest among the tied best, not the earliest overall",
            vec![
                host("worse"),
                Info {
                    free: 1,
                    ..host("a")
                },
                Info {
                    free: 1,
                    ..host("b")
                },
            ],
            "a",
        ),
    ];
    for (story, infos, want) in cases {
        assert_eq!(winner(&infos, 0).map(|w| w.0), Some(want), "{story}");
    }
}

#[test]
fn unusable_hosts_never_win_however_good_they_look() {
    let shiny = |name: &str| Info {
        loaded: true,
        free: 8,
        weight: 9,
        ..host(name)
    };
    let cases: Vec<(&str, Info)> = vec![
        (
            "down",
            Info {
                healthy: false,
                ..shiny("down")
            },
        ),
        (
            "draining",
            Info {
                draining: true,
                ..shiny("draining")
            },
        ),
        (
            "not serving the model",
            Info {
                serves: false,
                ..shiny("other")
            },
        ),
    ];
    for (story, bad) in cases {
        let plain = host("plain");
        assert_eq!(
            winner(&[bad.clone(), plain], 0).map(|w| w.0),
            Some("plain"),
            "{story}"
        );
        assert_eq!(best(&[bad], 0), None, "{story} alone");
    }
}

#[test]
fn no_candidates_means_no_choice() {
    check(&[], None);
}

#[test]
fn a_loaded_host_with_no_free_slot_still_beats_a_cold_idle_one() {
    // A model load costs seconds to minutes; a queue on a warm host is cheaper.
    check(
        &[
            host("idle-cold"),
            Info {
                loaded: true,
                queued: 4,
                ..host("busy-warm")
            },
        ],
        Some("busy-warm"),
    );
}

/// Issue 23's stories: the estimate (prefill less the warm family, plus the wait) decides.
#[test]
fn the_inherited_host_wins_only_a_tie() {
    let inherited = |info: Info| Info {
        inherited: true,
        ..info
    };
    // Tied (both idle): the route's lease decides, over route order and held tokens.
    let roomy = Info {
        leased: 0,
        capacity: 10_000,
        ..idle("a", 2)
    };
    let parent = Info {
        leased: 5_000,
        capacity: 10_000,
        ..inherited(idle("b", 2))
    };
    assert_eq!(
        winner(&[roomy.clone(), parent], 1000),
        Some(("b", Why::Inherit))
    );
    // A polled listing's lease on a busy host no longer steers: its queue is not a tie.
    let busy = Info {
        free: 0,
        queued: 4,
        ..inherited(idle("b", 2))
    };
    assert_eq!(winner(&[roomy, busy], 1000), Some(("a", Why::LeastLoaded)));
}

#[test]
fn a_failing_host_ranks_last_and_speed_counts() {
    let failing = Info {
        failing: true,
        family_tokens: 8000,
        ..idle("failing", 2)
    };
    assert_eq!(
        winner(&[failing.clone(), host("cold-busy")], 9000),
        Some(("cold-busy", Why::LeastLoaded))
    );
    assert_eq!(winner(&[failing], 9000), Some(("failing", Why::Family)));
    // Twice the prefill speed is half the estimate: not a tie.
    let fast = Info {
        prefill_tps: 2000.0,
        ..idle("fast", 2)
    };
    assert_eq!(
        winner(&[idle("slow", 2), fast], 4000).map(|w| w.0),
        Some("fast")
    );
}

#[test]
fn a_busy_host_is_left_only_when_waiting_costs_more_than_starting_over() {
    let leased = |queued, hold_ms| Info {
        free: 0,
        queued,
        hold_ms,
        ..idle("leased", 2)
    };
    let other = idle("other", 2);
    // 8,000 tokens re-prefilled at 1,000/s: 8 s; the bar is 1.5 × 8 s + 1 s = 13 s.
    // Wait (3 + 1) / 2 × 5 s = 10 s: stay.
    let others = [other.clone()];
    assert_eq!(busy_move(&leased(3, 5_000.0), &others, 8000), None);
    // Wait (5 + 1) / 2 × 5 s = 15 s: move.
    let to = busy_move(&leased(5, 5_000.0), &others, 8000);
    assert_eq!(to.map(|i| i.name.as_str()), Some("other"));
    // Never while the leased host has a free slot, nor to a host without one.
    assert_eq!(busy_move(&idle("leased", 2), &others, 8000), None);
    let full = Info { free: 0, ..other };
    assert_eq!(busy_move(&leased(50, 5_000.0), &[full], 8000), None);
}
