use super::*;

const FAMILY: u32 = 7;
/// The family prefix, in the host's tokens.
const P: u64 = 3000;
const HOST: (&str, &str) = ("h", "m");

pub(super) fn want(conversation: u64, first_turn: bool) -> Want {
    Want {
        conversation,
        family: Some(FAMILY),
        family_bytes: 4 * P,
        first_turn,
        bytes: 4 * (P + 500),
    }
}

/// A free slot last used at `last_used` by `holder`, holding `tokens`.
fn slot(holder: u64, family: Option<u32>, tokens: u64, saved: bool, last_used: u64) -> Slot {
    Slot {
        holder: Some(holder),
        family,
        tokens,
        busy: false,
        doubtful_since: None,
        unsettled_since: None,
        saved,
        last_used,
    }
}

#[test]
fn a_conversation_gets_its_own_free_slot_back_whatever_is_older() {
    let slots = [
        slot(9, None, 100, true, 1),
        slot(1, Some(FAMILY), P + 400, false, 5),
    ];
    assert_eq!(choose(&slots, &want(1, false), P), Some(1));
}

/// The case pinning is for: conversation 1's slot went to its sibling 2. Left to itself
/// llama-server would give 1 the sibling's slot (the longest shared prefix) and reload nothing;
/// pinned to the unrelated slot, 1's history comes back from RAM and 2 keeps its own.
#[test]
fn a_returning_conversation_goes_where_its_history_is_reloaded_not_to_its_sibling() {
    let slots = [
        slot(2, Some(FAMILY), P + 300, true, 4),
        slot(9, None, 5000, false, 6),
    ];
    assert_eq!(choose(&slots, &want(1, false), P), Some(1));
    // A sibling's slot holding more than twice the prefix is saved and reloaded too, but its
    // size is a guess: an unrelated slot goes first, the sibling's before one kept whole.
    let long = [
        slot(2, Some(FAMILY), 3 * P, false, 4),
        slot(9, None, 5000, false, 6),
    ];
    assert_eq!(choose(&long, &want(1, false), P), Some(1));
    assert_eq!(choose(&long[..1], &want(1, false), P), Some(0));
}

#[test]
fn a_first_turn_takes_a_siblings_slot_when_nothing_unsaved_is_lost_there() {
    let saved = [
        slot(9, None, 5000, true, 1),
        slot(2, Some(FAMILY), P + 300, true, 4),
    ];
    assert_eq!(
        choose(&saved, &want(3, true), P),
        Some(1),
        "the prefix is there"
    );
    // The sibling's history was never copied to RAM: taking its slot would lose it.
    let unsaved = [
        slot(9, None, 5000, true, 1),
        slot(2, Some(FAMILY), P + 300, false, 4),
    ];
    assert_eq!(choose(&unsaved, &want(3, true), P), Some(0));
    // Sized by a guess four times too small, the sibling's slot looked "long": still saved.
    assert_eq!(choose(&unsaved, &want(3, true), P / 4), Some(1));
}

#[test]
fn a_slot_whose_state_would_be_lost_is_the_last_resort_and_a_busy_or_doubtful_one_never() {
    let mut slots = [
        slot(2, Some(FAMILY), P + 300, false, 1),
        slot(9, None, 5000, false, 6),
        slot(8, None, 5000, false, 0),
    ];
    slots[1].busy = true;
    slots[2].doubtful_since = Some(1);
    assert_eq!(choose(&slots, &want(1, false), P), Some(0));
    slots[0].busy = true;
    assert_eq!(choose(&slots, &want(1, false), P), None);
}

#[test]
fn without_a_family_the_least_recently_used_free_slot_goes() {
    let slots = [slot(8, None, 10, false, 3), slot(9, None, 10, false, 2)];
    let w = Want {
        family: None,
        family_bytes: 0,
        ..want(1, true)
    };
    assert_eq!(choose(&slots, &w, 0), Some(1));
}

/// A `/slots` answer showing the slots `ids` idle.
pub(super) fn idle(ids: &[usize]) -> Polled {
    Polled {
        idle: ids.to_vec(),
        busy: Vec::new(),
        max_task: None,
    }
}

/// A mirror whose slots a `/slots` poll has seen idle.
pub(super) fn polled(count: usize) -> Slots {
    let slots = Slots::default();
    slots.take(HOST, count, None, 10).finish(None);
    assert!(slots.doubtful("h"));
    slots.saw("h", 11, &idle(&(0..count).collect::<Vec<_>>()));
    assert!(!slots.doubtful("h"));
    slots
}

#[test]
fn nothing_is_pinned_until_a_poll_started_later_shows_the_slots_idle() {
    // At start a crossbar before this one may have left a generation running anywhere.
    let slots = Slots::default();
    assert_eq!(slots.take(HOST, 2, Some(&want(1, true)), 10).index(), None);
    slots.saw("h", 10, &idle(&[0, 1]));
    assert_eq!(slots.take(HOST, 2, Some(&want(1, true)), 12).index(), None);
    slots.saw("h", 11, &idle(&[1]));
    let pinned = slots.take(HOST, 2, Some(&want(1, true)), 12);
    assert_eq!(pinned.index(), Some(1));
}

#[test]
fn a_pin_holds_its_slot_until_its_answer_ends_and_each_start_saves_the_free_ones() {
    let slots = polled(2);
    let a = slots.take(HOST, 2, Some(&want(1, true)), 20);
    let b = slots.take(HOST, 2, Some(&want(2, true)), 20);
    let (ia, ib) = (a.index().expect("pinned"), b.index().expect("pinned"));
    assert_ne!(ia, ib);
    let third = slots.take(HOST, 2, Some(&want(3, true)), 20);
    assert_eq!(third.index(), None, "both busy: unpinned");
    third.finish(None);
    let counted = Tokens {
        prompt: P + 700,
        completion: 100,
    };
    a.finish(Some(counted));
    let mirror = slots.of("h", "m");
    let held = &mirror[ia];
    assert_eq!(
        (held.busy, held.tokens, held.saved),
        (false, P + 800, false)
    );
    assert_eq!((held.holder, held.doubtful_since), (Some(1), None));
    b.finish(None);
    // Conversation 1 comes back to its own slot; as it starts, the other free one is copied.
    let again = slots.take(HOST, 2, Some(&want(1, false)), 30);
    assert_eq!(again.index(), Some(ia));
    assert!(slots.of("h", "m")[ib].saved);
}

/// A request that ends before its answer (its client left, the host broke off) may leave
/// llama-server generating in its slot: pinning another request there would reload a state
/// under that generation. Its slot is in doubt until a later poll shows it idle.
#[test]
fn a_slot_whose_request_ended_early_is_in_doubt_until_a_later_poll_sees_it_idle() {
    let slots = polled(2);
    let early = slots.take(HOST, 2, Some(&want(1, true)), 20);
    let at = early.index().expect("pinned");
    drop(early);
    assert!(slots.of("h", "m")[at].doubtful_since.is_some());
    let next = slots.take(HOST, 2, Some(&want(1, false)), 21);
    assert_eq!(next.index(), Some(1 - at), "not its own slot: in doubt");
    next.finish(None);
    // A poll that started before the early end says nothing about it.
    slots.saw("h", 0, &idle(&[0, 1]));
    assert!(slots.doubtful("h"));
    slots.saw("h", i64::MAX, &idle(&[1 - at]));
    assert!(slots.doubtful("h"), "still busy at the host");
    slots.saw("h", i64::MAX, &idle(&[at]));
    assert!(!slots.doubtful("h"));
}

/// llama-server chose the slot of a request crossbar did not pin: while one is in flight
/// nothing is pinned, and one that ended early puts every slot not busy in doubt.
#[test]
fn a_request_the_host_placed_itself_stops_pinning_while_it_runs() {
    let slots = polled(2);
    let messages = slots.take(HOST, 2, None, 20);
    assert_eq!(messages.index(), None);
    let meanwhile = slots.take(HOST, 2, Some(&want(1, true)), 20);
    assert_eq!(meanwhile.index(), None);
    meanwhile.finish(None);
    messages.finish(None);
    let pinned = slots.take(HOST, 2, Some(&want(1, true)), 20);
    let at = pinned.index().expect("pinned again");
    drop(slots.take(HOST, 2, None, 21));
    let mirror = slots.of("h", "m");
    assert!(mirror[at].busy && mirror[at].doubtful_since.is_none());
    assert!(mirror[1 - at].doubtful_since.is_some());
    pinned.finish(None);
    assert_eq!(
        slots.take(HOST, 2, Some(&want(2, true)), 22).index(),
        Some(at)
    );
}

#[test]
fn a_family_is_sized_in_the_tokens_the_host_counted_for_bodies() {
    let slots = polled(2);
    let taken = slots.take(HOST, 2, Some(&want(1, true)), 20);
    // The host counted 1.5 tokens per 4 bytes of body.
    let bytes = want(1, true).bytes;
    let counted = Tokens {
        prompt: bytes * 3 / 8,
        completion: 0,
    };
    taken.finish(Some(counted));
    let table = slots.shared.lock();
    let pair = &table.pairs[&("h".to_string(), "m".to_string())];
    assert_eq!(pair.tokens_of(4000), 1500);
}

#[test]
fn a_changed_slot_count_starts_the_mirror_over_and_the_table_is_bounded() {
    let slots = polled(2);
    slots.take(HOST, 2, Some(&want(1, true)), 20).finish(None);
    slots.take(HOST, 3, Some(&want(1, true)), 20).finish(None);
    let mirror = slots.of("h", "m");
    assert_eq!(mirror.len(), 3);
    assert!(mirror
        .iter()
        .all(|s| s.holder.is_none() && s.doubtful_since.is_some()));
    for i in 0..MAX_PAIRS + 5 {
        drop(slots.take((&format!("h{i}"), "m"), 1_000_000, None, 30));
    }
    let table = slots.shared.lock();
    assert!(table.pairs.len() <= MAX_PAIRS);
    assert!(table.pairs.values().all(|p| p.slots.len() <= MAX_SLOTS));
}

#[test]
fn id_slot_goes_first_in_the_body_and_comes_out_again() {
    let cases: [(&str, Option<&str>); 10] = [
        (r#"{"model":"q"}"#, Some(r#"{"id_slot":3,"model":"q"}"#)),
        (" {}", Some(r#" {"id_slot":3}"#)),
        ("{ \n }", Some("{\"id_slot\":3 \n }")),
        ("\u{feff}{}", Some("\u{feff}{\"id_slot\":3}")),
        (r#"{"id_slot":1,"model":"q"}"#, None),
        // Issue 46: the host decodes a key's escapes; a byte search did not.
        (r#"{"model":"q","id\u005fslot":1}"#, None),
        // What the host would refuse is not pinned either.
        (r#"{"model":"q"} x"#, None),
        ("{", None),
        ("[1,2]", None),
        ("", None),
    ];
    for (body, expected) in cases {
        assert_eq!(pinnable(body.as_bytes()), expected.is_some(), "{body:?}");
        if expected.is_none() {
            continue;
        }
        let mut out = body.as_bytes().to_vec();
        let range = insert_id(&mut out, 3).unwrap_or_else(|| panic!("{body:?} not pinned"));
        assert_eq!(String::from_utf8_lossy(&out), expected.unwrap_or_default());
        remove_id(&mut out, range);
        assert_eq!(out, body.as_bytes());
    }
}

#[test]
fn a_slots_answer_is_read_for_its_idle_and_busy_slots_and_nothing_else() {
    let body = r#"[{"id":0,"is_processing":true,"params":{"x":[1,2]}},
        {"id":1,"is_processing":false},{"id":"2","is_processing":false},{"is_processing":false},
        7,{"id":99999,"is_processing":false},{"id":3,"is_processing":false}]"#;
    let seen = parse_slots(body).expect("an array");
    assert_eq!((seen.idle, seen.busy), (vec![1, 3], vec![0]));
    assert_eq!(parse_slots(r#"{"error":"no"}"#), None);
    assert_eq!(parse_slots("not json"), None);
    let many = format!(
        "[{}]",
        vec![r#"{"id":1,"is_processing":false}"#; 5000].join(",")
    );
    assert_eq!(parse_slots(&many).map(|s| s.idle.len()), Some(MAX_SLOTS));
}

/// What the status shows: each slot busy, free or in doubt, with its family, and the requests
/// running unpinned; nothing for a host+model crossbar never pinned on.
#[test]
fn the_status_shows_each_slot_as_the_mirror_holds_it() {
    let slots = polled(3);
    assert_eq!(slots.mirror("h", "other"), None);
    let busy = slots.take(HOST, 3, Some(&want(1, true)), 20);
    let early = slots.take(HOST, 3, Some(&want(3, true)), 20);
    let e = early.index().unwrap();
    drop(early);
    let done = slots.take(HOST, 3, Some(&want(2, true)), 21);
    done.finish(Some(Tokens {
        prompt: P,
        completion: 10,
    }));
    let running = slots.take(HOST, 3, None, 22);
    let mirror = slots.mirror("h", "m").expect("a pinning pair");
    let state = |i: usize| mirror.slots[i].state;
    let (b, d) = (busy.index().unwrap(), done.index().unwrap());
    assert_eq!(b + d + e, 3, "three slots");
    assert_eq!((state(b), state(d), state(e)), ("busy", "free", "doubt"));
    assert_eq!(mirror.slots[d].family, Some(FAMILY));
    assert_eq!(mirror.slots[d].tokens, P + 10);
    assert_eq!(mirror.unpinned, 1);
    assert_eq!(
        mirror.summary(),
        "pinned: 1 busy, 1 free, 1 in doubt; 1 unpinned running"
    );
    running.finish(None);
}

mod save;
mod settle;
