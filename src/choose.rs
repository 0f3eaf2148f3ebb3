//! The chooser rule (spec §5): which candidate host gets a new conversation.
//!
//! A pure function over a snapshot the caller builds from config, health, drain set and limiter.
//! It does no I/O, takes no locks and keeps no state; ties are broken by the route's order.
//!
//! One rule beyond spec §5: between "fewest queued" and "highest weight" comes "fewest leases per
//! unit of weight". Free slots say how busy a host is this instant; when conversations start while
//! every host is idle (the usual case: a turn takes seconds, think time minutes) they all tie, and
//! without this rule every new conversation would land on the route's first host, crowding its
//! slots and prompt cache while the others sit empty (the affinity benchmark showed 7/4/1 of 12).

use std::cmp::Ordering;

/// One candidate host as seen at the moment of choosing, for one model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Info {
    pub name: String,
    pub healthy: bool,
    pub draining: bool,
    /// The host reports the model loaded (no load wait).
    pub loaded: bool,
    /// Loading the model there evicts nothing in use: always for a single-model host; for a
    /// router at its `--models-max`, only when none of its loaded models has a request in flight
    /// or a lease (a conversation whose cache the swap would wipe).
    pub room: bool,
    /// The host's config lists the model.
    pub serves: bool,
    /// Free slots on this host for THIS model.
    pub free: usize,
    /// Requests waiting for a slot of this host+model.
    pub queued: usize,
    /// Conversations (leases) the host already holds for this model.
    pub leases: usize,
    /// At least 1 (config validation).
    pub weight: u32,
}

/// `infos` in the route's order. Among healthy, non-draining hosts that serve the model: loaded
/// first, then room to load it without evicting a model in use, then most free slots (for this model), fewest queued, fewest leases per unit of weight,
/// highest weight, earliest in list.
pub fn best(infos: &[Info]) -> Option<&Info> {
    infos
        .iter()
        .enumerate()
        .filter(|(_, i)| i.healthy && !i.draining && i.serves)
        .max_by(|(pa, a), (pb, b)| better(a, b).then(pb.cmp(pa)))
        .map(|(_, i)| i)
}

/// `Greater` when `a` should win over `b` on everything but route order.
fn better(a: &Info, b: &Info) -> Ordering {
    // a.leases / a.weight < b.leases / b.weight, without division.
    let per_weight = |x: &Info, y: &Info| x.leases as u64 * u64::from(y.weight);
    a.loaded
        .cmp(&b.loaded)
        .then(a.room.cmp(&b.room))
        .then(a.free.cmp(&b.free))
        .then(b.queued.cmp(&a.queued))
        .then(per_weight(b, a).cmp(&per_weight(a, b)))
        .then(a.weight.cmp(&b.weight))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A usable host: healthy, serving, not loaded, no free slots, nothing queued, no leases,
    /// weight 1.
    fn host(name: &str) -> Info {
        Info {
            name: name.into(),
            healthy: true,
            draining: false,
            loaded: false,
            room: true,
            serves: true,
            free: 0,
            queued: 0,
            leases: 0,
            weight: 1,
        }
    }

    #[track_caller]
    fn check(infos: &[Info], want: Option<&str>) {
        assert_eq!(best(infos).map(|i| i.name.as_str()), want, "{infos:#?}");
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
            assert_eq!(best(&infos).map(|i| i.name.as_str()), Some(want), "{story}");
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
                best(&[bad.clone(), plain]).map(|i| i.name.as_str()),
                Some("plain"),
                "{story}"
            );
            assert_eq!(best(&[bad]), None, "{story} alone");
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
}
