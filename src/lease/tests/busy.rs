//! Issue 23's wait-or-move: a conversation leaves its busy host only where its route allows it,
//! with a `busy` event, never twice within ten minutes, and never off a pin.

use super::*;

const MIN: i64 = 60_000;

fn busy_ask() -> Ask {
    Ask {
        prompt: 8_000,
        slot: true,
        move_when_busy: true,
        ..Ask::default()
    }
}

fn turn(f: &Fix, fp: &str, now: i64, ask: &Ask) -> Acquired {
    let (got, _hold) = f
        .table
        .acquire_held(&key("projA", fp), &both(), now, ask)
        .unwrap();
    got
}

#[test]
fn a_conversation_leaves_a_busy_host_once_in_ten_minutes_and_only_where_allowed() {
    let f = fix();
    let ask = busy_ask();
    assert_eq!(turn(&f, "c1", 0, &ask).host, "titan");
    // The chooser finds waiting on titan costlier than starting over on mini.
    f.chooser.leave_for(Some("mini"));
    // A route without move_when_busy waits.
    let stay = Ask {
        move_when_busy: false,
        ..ask
    };
    let got = turn(&f, "c1", MIN, &stay);
    assert_eq!((got.host.as_str(), got.placed), ("titan", Placed::Sticky));
    let got = turn(&f, "c1", 2 * MIN, &ask);
    let want = Acquired {
        host: "mini".into(),
        reused: false,
        placed: Placed::Busy,
    };
    assert_eq!(got, want);
    assert_eq!(
        f.p.events().last(),
        Some(&ev(Reason::Busy, "titan", "mini"))
    );
    // Busy again within ten minutes: it stays, however busy.
    f.chooser.leave_for(Some("titan"));
    let got = turn(&f, "c1", 2 * MIN + 9 * MIN, &ask);
    assert_eq!((got.host.as_str(), got.placed), ("mini", Placed::Sticky));
    // After ten minutes it may move again.
    let got = turn(&f, "c1", 2 * MIN + 10 * MIN, &ask);
    assert_eq!((got.host.as_str(), got.placed), ("titan", Placed::Busy));
    assert_eq!(
        f.p.events().iter().filter(|e| e.0 == Reason::Busy).count(),
        2
    );
}

#[test]
fn a_pinned_route_never_moves_for_busy_and_a_draining_host_is_no_refuge() {
    let f = fix();
    let ask = busy_ask();
    turn(&f, "c1", 0, &ask);
    f.table.pin("projA", "titan", 1).unwrap();
    f.chooser.leave_for(Some("mini"));
    let got = turn(&f, "c1", MIN, &ask);
    assert_eq!((got.host.as_str(), got.placed), ("titan", Placed::Pinned));
    f.table.unpin("projA", 2).unwrap();
    // Unpinned, the conversation was released; its next first turn is on titan again.
    f.chooser.prefer("titan");
    turn(&f, "c2", 3, &ask);
    f.hosts.drain("mini");
    let got = turn(&f, "c2", MIN, &ask);
    assert_eq!((got.host.as_str(), got.placed), ("titan", Placed::Sticky));
}
