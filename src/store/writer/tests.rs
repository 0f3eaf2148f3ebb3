//! Who commits when: a lone waiter on its own thread, concurrent waiters in shared batches on the
//! writer thread, rows on their way handed to it, a dropped ticket's job without anyone waiting, and
//! what is queued at the stop.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::Connection;

use super::{Shared, Writer};
use crate::store::tests::TempDb;
use crate::store::{health::StoreHealth, setup, RequestRow, Write};

fn writer(db: &TempDb) -> Writer {
    let conn = setup(&db.path, Connection::open(&db.path).unwrap()).unwrap();
    let nudge = crate::store::checkpoint::Nudge::nowhere();
    Writer::start(conn, Arc::new(StoreHealth::new(&db.path)), nudge)
}

fn row(started: i64) -> Vec<Write> {
    vec![Write::Request(RequestRow {
        started,
        route: "r".into(),
        status: 200,
        ..RequestRow::default()
    })]
}

fn rows(db: &TempDb) -> i64 {
    let conn = Connection::open(&db.path).unwrap();
    conn.query_row("SELECT count(*) FROM requests", [], |r| r.get(0))
        .unwrap()
}

/// (batches committed by callers, by the writer thread).
fn batches(sh: &Shared) -> (u64, u64) {
    let q = sh.queue.lock();
    (q.by_caller, q.by_thread)
}

/// Until the queue is empty and nobody commits (each commit wakes this), at most 5 s.
fn settled(sh: &Shared) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut q = sh.queue.lock();
    while !q.jobs.is_empty() || q.committing {
        assert!(
            !sh.committed.wait_until(&mut q, deadline).timed_out(),
            "the queue never drained"
        );
    }
}

#[test]
fn issue12_a_lone_waiter_commits_its_own_row_without_waking_the_writer_thread() {
    let db = TempDb::new("writer-lone");
    let w = writer(&db);
    for i in 0..3 {
        w.submit(row(i)).wait().unwrap();
        // In the db once the wait returns, not later.
        assert_eq!(rows(&db), i + 1);
    }
    assert_eq!(batches(&w.shared), (3, 0));
}

#[test]
fn issue12_jobs_queued_behind_a_commit_go_to_the_writer_thread_in_one_batch() {
    let db = TempDb::new("writer-batch");
    let w = writer(&db);
    let sh = w.shared.clone();
    // The connection is held here, so the first waiter takes the role and then stops in it.
    let held = sh.conn.lock();
    let first = w.submit(row(0));
    let lone = std::thread::spawn(move || first.wait());
    let deadline = Instant::now() + Duration::from_secs(5);
    while !sh.queue.lock().committing {
        assert!(Instant::now() < deadline, "nobody took the role");
        std::thread::yield_now();
    }
    let behind: Vec<_> = (1..=5)
        .map(|i| {
            let t = w.submit(row(i));
            std::thread::spawn(move || t.wait())
        })
        .collect();
    drop(held);
    lone.join().unwrap().unwrap();
    for t in behind {
        t.join().unwrap().unwrap();
    }
    assert_eq!(rows(&db), 6);
    assert_eq!(
        batches(&sh),
        (1, 1),
        "one lone commit, then one batch of five"
    );
}

#[test]
fn issue12_many_concurrent_waiters_all_get_their_rows() {
    let db = TempDb::new("writer-many");
    let w = Arc::new(writer(&db));
    let (threads, each) = (8, 40);
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let w = w.clone();
            std::thread::spawn(move || {
                for i in 0..each {
                    w.submit(row(t * 1000 + i)).wait().unwrap();
                }
            })
        })
        .collect();
    for t in workers {
        t.join().unwrap();
    }
    assert_eq!(rows(&db), threads * each);
}

#[test]
fn issue12_a_dropped_tickets_job_is_committed_by_the_writer_thread() {
    let db = TempDb::new("writer-dropped");
    let w = writer(&db);
    drop(w.submit(row(1)));
    settled(&w.shared);
    assert_eq!(rows(&db), 1);
    assert_eq!(batches(&w.shared), (0, 1));
}

#[test]
fn issue12_jobs_still_queued_at_the_stop_are_committed_and_their_tickets_answered() {
    let db = TempDb::new("writer-stop");
    let w = writer(&db);
    // Held, not waited for and not dropped: nobody asks for a commit until the stop.
    let tickets: Vec<_> = (0..5).map(|i| w.submit(row(i))).collect();
    assert_eq!(rows(&db), 0);
    drop(w);
    assert_eq!(rows(&db), 5);
    for t in tickets {
        t.wait().unwrap();
    }
}

/// A handle on a writer that has stopped (its thread joined).
fn stopped(db: &TempDb) -> Writer {
    let w = writer(db);
    let sh = w.shared.clone();
    drop(w);
    super::Writer {
        shared: sh,
        thread: None,
    }
}

#[test]
fn issue12_a_submission_after_the_stop_is_refused_at_once() {
    let db = TempDb::new("writer-late");
    let late = stopped(&db);
    assert!(matches!(
        late.submit(row(1)).wait(),
        Err(crate::store::StoreError::Stopped)
    ));
}

#[test]
fn issue26_a_lone_row_on_its_way_is_committed_on_its_own_thread() {
    let db = TempDb::new("writer-coming-lone");
    let w = writer(&db);
    for i in 0..3 {
        let coming = w.coming();
        w.submit_coming(row(i), coming).wait().unwrap();
        assert_eq!(rows(&db), i + 1);
    }
    assert_eq!(batches(&w.shared), (3, 0));
    assert_eq!(
        w.shared.coming.load(std::sync::atomic::Ordering::Acquire),
        0
    );
}

#[test]
fn issue26_rows_on_their_way_go_to_the_writer_thread_not_one_commit_each() {
    let db = TempDb::new("writer-coming-gather");
    let w = Arc::new(writer(&db));
    // Four rows announced before any arrives: the first to arrive does not commit alone but
    // hands the queue to the writer thread, which gathers the others (for at most 200 µs).
    let comings: Vec<_> = (0..4).map(|_| w.coming()).collect();
    let go = Arc::new(std::sync::Barrier::new(4));
    let workers: Vec<_> = comings
        .into_iter()
        .enumerate()
        .map(|(i, coming)| {
            let (w, go) = (w.clone(), go.clone());
            std::thread::spawn(move || {
                go.wait();
                w.submit_coming(row(i as i64), coming).wait()
            })
        })
        .collect();
    for t in workers {
        t.join().unwrap().unwrap();
    }
    assert_eq!(rows(&db), 4);
    let (by_caller, by_thread) = batches(&w.shared);
    // Only the last to arrive can find nothing on its way, when the gather ran out before it.
    assert!(by_caller <= 1, "{by_caller} rows committed alone");
    assert!(by_thread >= 1, "the writer thread committed nothing");
    assert!(by_caller + by_thread <= 4);
}

#[test]
fn issue26_a_row_that_never_comes_does_not_hold_the_others() {
    let db = TempDb::new("writer-coming-never");
    let w = writer(&db);
    let never = w.coming();
    let coming = w.coming();
    // Handed to the writer thread (a row is still on its way), committed after its gather.
    w.submit_coming(row(1), coming).wait().unwrap();
    drop(never);
    assert_eq!(rows(&db), 1);
    assert_eq!(
        w.shared.coming.load(std::sync::atomic::Ordering::Acquire),
        0
    );
    // Nothing on its way any more, and once the writer thread has let go of its batch, the next
    // row is committed alone.
    settled(&w.shared);
    let coming = w.coming();
    w.submit_coming(row(2), coming).wait().unwrap();
    assert_eq!(batches(&w.shared), (1, 1));
}

/// A job left (not waited for) whose `then` reports the thread it ran on and whether its row
/// was already in the db.
fn left(w: &Writer, db: &TempDb, started: i64) -> crossbeam_channel::Receiver<(String, i64)> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    let path = db.path.clone();
    let then: super::Then = Box::new(move |outcome| {
        assert!(outcome.is_ok(), "{outcome:?}");
        let conn = Connection::open(&path).unwrap();
        let found: i64 = conn
            .query_row(
                "SELECT count(*) FROM requests WHERE started = ?1",
                [started],
                |r| r.get(0),
            )
            .unwrap();
        let thread = std::thread::current().name().unwrap_or("").to_string();
        let _ = tx.send((thread, found));
    });
    w.leave(row(started), then, None);
    rx
}

#[test]
fn issue26_a_lone_job_left_is_committed_on_its_own_thread_then_followed() {
    let db = TempDb::new("writer-then-lone");
    let w = writer(&db);
    let me = std::thread::current().name().unwrap_or("").to_string();
    let rx = left(&w, &db, 1);
    // Done before `leave` returned, on this thread, with the row already in the db.
    assert_eq!(rx.try_recv().unwrap(), (me, 1));
    assert_eq!(batches(&w.shared), (1, 0));
}

#[test]
fn issue26_a_job_left_beside_others_is_followed_on_the_writer_thread_after_its_commit() {
    let db = TempDb::new("writer-then-busy");
    let w = writer(&db);
    // Another row is on its way: the job is not committed alone but handed to the writer thread,
    // and `leave` does not wait for it.
    let coming = w.coming();
    let rx = left(&w, &db, 7);
    let (thread, found) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(thread, "store-writer");
    assert_eq!(found, 1, "what follows a commit sees its row in the db");
    drop(coming);
    settled(&w.shared);
    assert_eq!(batches(&w.shared), (0, 1));
}

#[test]
fn issue26_a_job_refused_at_the_stop_is_still_followed() {
    let db = TempDb::new("writer-then-late");
    let late = stopped(&db);
    let (tx, rx) = crossbeam_channel::bounded(1);
    let then: super::Then = Box::new(move |outcome| {
        let _ = tx.send(matches!(outcome, Err(crate::store::StoreError::Stopped)));
    });
    late.leave(row(1), then, None);
    // The answer's end is never left unsent because its row could not be written.
    assert_eq!(rx.try_recv(), Ok(true));
}
