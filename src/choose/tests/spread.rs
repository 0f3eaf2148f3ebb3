//! Issue 23's spreading stories: bursts over idle hosts, siblings apart where slots are picked
//! by similarity, new conversations where the fewest are under way, and a family gathered at
//! the start only where a slot is free.

use super::*;

#[test]
fn a_burst_of_new_conversations_spreads_over_idle_hosts() {
    // Eight conversations at once on three idle 2-slot hosts: each placement counts as an
    // arrival (a slot taken, or a place in line) for the next.
    let mut hosts = vec![idle("a", 2), idle("b", 2), idle("c", 2)];
    let placed = place_in_turn(&mut hosts, 8, |host| {
        if host.free > 0 {
            host.free -= 1;
        } else {
            host.queued += 1;
        }
        host.leases += 1;
    });
    assert_eq!(placed, [3, 3, 2]);
}

/// Places `n` new conversations of 1,000 tokens one after another, `taken` updating each winner
/// before the next is placed; how many each host got, in route order.
fn place_in_turn(hosts: &mut [Info], n: usize, taken: impl Fn(&mut Info)) -> Vec<usize> {
    let order = winners_in_turn(hosts, n, taken);
    (hosts.iter())
        .map(|h| order.iter().filter(|w| **w == h.name).count())
        .collect()
}

/// As [`place_in_turn`], but the winners in placement order.
fn winners_in_turn(hosts: &mut [Info], n: usize, taken: impl Fn(&mut Info)) -> Vec<String> {
    let mut order = Vec::with_capacity(n);
    for _ in 0..n {
        let name = winner(hosts, 1000).unwrap().0.to_string();
        let at = hosts.iter().position(|h| h.name == name).unwrap();
        taken(&mut hosts[at]);
        order.push(name);
    }
    order
}

#[test]
fn with_slot_similarity_on_a_family_spreads_by_weight_before_held_tokens() {
    // Siblings on three idle hosts whose llama-server picks slots by similarity, one after
    // another, each still under way when the next starts. Host "a" weighs 2; "b" already holds a
    // long conversation of another family. Each goes where the fewest of its family are under way
    // per unit of weight, whatever the tokens held: a gets 4 of 8, b and c 2 each (by held
    // tokens alone b would get none).
    let apart = |name| Info {
        kept_apart: true,
        ..idle(name, 4)
    };
    let mut hosts = vec![
        Info {
            weight: 2,
            ..apart("a")
        },
        Info {
            leased: 60_000,
            ..apart("b")
        },
        apart("c"),
    ];
    let placed = place_in_turn(&mut hosts, 8, |host| {
        host.siblings += 1;
        host.live += 1;
        host.leases += 1;
        host.leased += 5_000;
    });
    assert_eq!(placed, [4, 2, 2]);
    // Fewer siblings beat a lower share held: the siblings are what would wipe the newcomer's
    // history.
    let beside_siblings = Info {
        siblings: 3,
        ..apart("a")
    };
    let fuller_but_apart = Info {
        siblings: 1,
        leased: 50_000,
        ..apart("b")
    };
    assert_eq!(
        winner(&[beside_siblings, fuller_but_apart], 1000),
        Some(("b", Why::LeastLoaded))
    );
}

#[test]
fn new_conversations_go_where_the_fewest_are_under_way_not_where_the_fewest_ended() {
    // Three idle hosts of two slots. "a" has two conversations under way; "c" kept the leases of
    // twelve that ended (their tokens lasting `lease_idle`), none of them live. Each newcomer
    // stays under way: the two hosts with none take the next four in turn, c's ended leases
    // notwithstanding, as a sticky round-robin would; then all three have two under way and the
    // fifth goes to a, whose leases hold the smaller share.
    let hosts = vec![
        Info {
            live: 2,
            leases: 2,
            leased: 10_000,
            ..idle("a", 2)
        },
        idle("b", 2),
        Info {
            leases: 12,
            leased: 80_000,
            ..idle("c", 2)
        },
    ];
    let starts = |host: &mut Info| {
        host.live += 1;
        host.leases += 1;
        host.leased += 5_000;
    };
    let order = winners_in_turn(&mut hosts.clone(), 5, starts);
    assert_eq!(order, ["b", "c", "b", "c", "a"]);
    // Blind to what is under way (every lease's tokens alone), c would have taken none of the
    // five, and a two more beside its two running.
    let mut blind: Vec<Info> = (hosts.iter())
        .map(|h| Info {
            live: 0,
            ..h.clone()
        })
        .collect();
    let order = winners_in_turn(&mut blind, 5, |h| {
        h.leases += 1;
        h.leased += 5_000;
    });
    assert_eq!(order, ["b", "b", "a", "b", "a"]);
}

/// Places `families.len()` new conversations of 2,400 tokens one after another, the `Some`s of
/// one 2,000-token family (warm where one was placed before) and the `None`s with none, each
/// under way when the next starts (a slot taken, or a place in line); the winners in order.
fn gather_in_turn(hosts: &mut [Info], families: &[Option<()>]) -> Vec<String> {
    let mut warm = vec![false; hosts.len()];
    let mut order = Vec::with_capacity(families.len());
    for family in families {
        for (host, warm) in hosts.iter_mut().zip(&warm) {
            host.family_tokens = if family.is_some() && *warm { 2_000 } else { 0 };
        }
        let name = winner(hosts, 2_400).unwrap().0.to_string();
        let at = hosts.iter().position(|h| h.name == name).unwrap();
        warm[at] |= family.is_some();
        let host = &mut hosts[at];
        host.live += 1;
        host.leases += 1;
        if host.free > 0 {
            host.free -= 1;
        } else {
            host.queued += 1;
        }
        order.push(name);
    }
    order
}

#[test]
fn conversations_that_start_together_gather_a_family_only_where_a_slot_is_free() {
    // The chat benchmark with `-sps 0`: twelve conversations start together on three idle 4-slot
    // hosts, every other one of a shared persona, before any turn has measured how long a slot
    // is held. The persona gathers on a until a's four slots are taken, then starts on b and
    // gathers there: every host ends with four conversations, one per slot.
    let persona = [Some(()), None].repeat(6);
    let unmeasured = |name| Info {
        hold_known: false,
        ..idle(name, 4)
    };
    let hosts = vec![unmeasured("a"), unmeasured("b"), unmeasured("c")];
    let per_host = |order: &[String]| {
        let count = |h: &str, of: &dyn Fn(usize) -> bool| {
            (0..order.len())
                .filter(|i| of(*i) && order[*i] == h)
                .count()
        };
        let all = ["a", "b", "c"].map(|h| count(h, &|_| true));
        let persona = ["a", "b", "c"].map(|h| count(h, &|i| i % 2 == 0));
        (all, persona)
    };
    let order = gather_in_turn(&mut hosts.clone(), &persona);
    assert_eq!(per_host(&order), ([4, 4, 4], [4, 2, 0]), "{order:?}");
    // Taking the guessed 1 s hold for a measure, a saved prefill beats a quarter-second wait
    // on a: it takes six and queues two of them, and they wait there turn after turn.
    let mut guessed: Vec<Info> = hosts.iter().map(|h| idle(&h.name, 4)).collect();
    let order = gather_in_turn(&mut guessed, &persona);
    assert_eq!(per_host(&order), ([6, 3, 3], [6, 0, 0]), "{order:?}");
}
