//! Siblings where llama-server picks slots by similarity (its default): kept apart, first by
//! whether a host's slots hold one at all, then by how many per unit of weight.

use super::*;

#[test]
fn with_slot_similarity_on_a_family_spreads_by_weight_before_held_tokens() {
    // Siblings on three idle hosts whose llama-server picks slots by similarity, one after
    // another, each staying in a slot. Host "a" weighs 2; "b" already holds a long conversation of another family. Each
    // goes where the fewest of its family were placed per unit of weight, whatever the tokens
    // held: a gets 4 of 8, b and c 2 each (by held tokens alone b would get none).
    let mut hosts = vec![
        Info {
            weight: 2,
            ..idle("a", 4)
        },
        Info {
            leased: 60_000,
            ..idle("b", 4)
        },
        idle("c", 4),
    ];
    let placed = place_in_turn(&mut hosts, 8, |host| {
        host.siblings += 1;
        host.leases += 1;
        host.leased += 5_000;
    });
    assert_eq!(placed, [4, 2, 2]);
    // Fewer siblings beat a lower share held: the siblings are what would wipe the newcomer's
    // history.
    let beside_siblings = Info {
        siblings: 3,
        ..idle("a", 4)
    };
    let fuller_but_apart = Info {
        siblings: 1,
        leased: 50_000,
        ..idle("b", 4)
    };
    assert_eq!(
        winner(&[beside_siblings, fuller_but_apart], 1000),
        Some(("b", Why::LeastLoaded))
    );
}

#[test]
fn a_host_whose_slots_hold_a_sibling_ranks_below_one_whose_do_not() {
    // Where a sibling is in a slot, the newcomer takes that slot (it shares the family prefix)
    // and wipes the sibling's history. A host holding none wins though it must wait for a slot
    // and the other has two free...
    let beside_sibling = Info {
        siblings: 1,
        ..idle("a", 2)
    };
    let busy_but_apart = Info {
        free: 0,
        queued: 1,
        hold_ms: 5_000.0,
        ..idle("b", 2)
    };
    assert_eq!(
        winner(&[beside_sibling.clone(), busy_but_apart.clone()], 9000),
        Some(("b", Why::LeastLoaded))
    );
    // ...unless it is failing, not loaded, or has no room: those classes come first.
    for worse in [
        Info {
            failing: true,
            ..busy_but_apart.clone()
        },
        Info {
            loaded: false,
            ..busy_but_apart.clone()
        },
        Info {
            room: false,
            ..busy_but_apart.clone()
        },
    ] {
        assert_eq!(
            winner(&[beside_sibling.clone(), worse], 9000).unwrap().0,
            "a"
        );
    }
    // Where every host holds siblings, the estimate decides again, then fewer per weight.
    let two_siblings = Info {
        siblings: 2,
        ..idle("c", 2)
    };
    assert_eq!(
        winner(&[two_siblings.clone(), beside_sibling.clone()], 9000)
            .unwrap()
            .0,
        "a"
    );
    let waiting_with_one = Info {
        siblings: 1,
        ..busy_but_apart
    };
    assert_eq!(
        winner(&[waiting_with_one, two_siblings], 9000).unwrap().0,
        "c",
        "a 5 s wait is no tie"
    );
}
