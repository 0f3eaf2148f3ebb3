//! The one writer thread: every write to the database goes through it, in the order submitted.
//!
//! Callers queue [`Write`]s and get a [`Ticket`] that says when their transaction committed;
//! while one transaction commits, later submissions queue and the next loop commits them all in
//! one transaction (group commit), so concurrent workers share one `fsync`-free WAL commit instead
//! of taking turns on a connection lock. Writes nobody waits for (touches of reused leases,
//! evictions) are jobs whose ticket was dropped; they ride along in the same batches. This thread never takes another module's lock; a caller
//! waits on its ticket with no lock held.
//!
//! A batch that fails is retried job by job, so one bad write cannot fail its neighbours; the
//! outcome of every commit goes to [`StoreHealth`], which logs a failure once per burst.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, Sender};
use rusqlite::{params, Connection, TransactionBehavior};

use super::health::StoreHealth;
use super::{LeaseEvent, LeaseRow, RequestRow, StoreError};

/// Most jobs committed in one transaction.
const MAX_BATCH: usize = 512;
/// Most jobs queued for the writer; beyond it a submission fails at once (never blocks).
const QUEUE: usize = 16_384;
/// Longest a caller waits for its commit before answering "store unavailable".
const COMMIT_WAIT: Duration = Duration::from_secs(30);

/// One change to the database.
#[derive(Debug, Clone)]
pub enum Write {
    /// Inserts or replaces the lease (or pin) keyed by route, fp, model.
    SaveLease(LeaseRow),
    /// Deletes one lease or pin; a missing one is not an error.
    DeleteLease {
        route: String,
        fp: String,
        model: String,
    },
    /// Moves a lease's `last_used` forward (never back); a missing lease is not an error.
    Touch {
        route: String,
        fp: String,
        model: String,
        last_used: i64,
    },
    /// Appends a lease event.
    Event(LeaseEvent),
    /// Appends an accounting row.
    Request(RequestRow),
    /// Deletes up to `limit` of the oldest accounting rows that started before `before`.
    PruneRequests { before: i64, limit: usize },
    /// Deletes up to `limit` of the oldest lease events before `before`.
    PruneEvents { before: i64, limit: usize },
    /// Caps the file at `n` pages (never below its current size: `Some(1)` freezes it), or lifts
    /// the cap (`None`):
    /// SQLite's own `max_page_count`, so tests get a real "database or disk is full".
    #[doc(hidden)]
    LimitPages(Option<u32>),
}

/// The promise of a commit: [`Ticket::wait`] answers once the writes it covers are in the db.
#[derive(Debug)]
pub struct Ticket(Receiver<Result<(), StoreError>>);

impl Ticket {
    /// A ticket already answered (persisters that write synchronously, and refusals).
    pub fn ready(result: Result<(), StoreError>) -> Ticket {
        let (tx, rx) = bounded(1);
        let _ = tx.send(result);
        Ticket(rx)
    }

    /// A ticket answered later through the returned sender (persisters other than the writer).
    pub fn promise() -> (Sender<Result<(), StoreError>>, Ticket) {
        let (tx, rx) = bounded(1);
        (tx, Ticket(rx))
    }

    /// Waits for the commit, at most [`COMMIT_WAIT`].
    pub fn wait(self) -> Result<(), StoreError> {
        match self.0.recv_timeout(COMMIT_WAIT) {
            Ok(result) => result,
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => Err(StoreError::Stalled),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Err(StoreError::Stopped),
        }
    }
}

#[derive(Debug)]
struct Job {
    writes: Vec<Write>,
    done: Option<Sender<Result<(), StoreError>>>,
}

/// The writer thread's handle: a queue in, a thread to join when the store is dropped.
#[derive(Debug)]
pub(super) struct Writer {
    queue: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl Writer {
    pub(super) fn start(conn: Connection, health: Arc<StoreHealth>) -> Writer {
        let (queue, jobs) = bounded(QUEUE);
        let thread = std::thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || run(conn, &jobs, &health))
            .expect("the OS refused to start a thread");
        Writer {
            queue: Some(queue),
            thread: Some(thread),
        }
    }

    /// Queues `writes` as one job after everything queued before; the ticket answers at commit.
    pub(super) fn submit(&self, writes: Vec<Write>) -> Ticket {
        let (done, answer) = bounded(1);
        let job = Job {
            writes,
            done: Some(done),
        };
        // Never blocks: callers may hold the lease table's lock. A full queue means the writer
        // is stuck (a hung disk); the caller answers "store unavailable" at once.
        let sent = match &self.queue {
            Some(queue) => queue.try_send(job).is_ok(),
            None => false,
        };
        if sent {
            Ticket(answer)
        } else {
            Ticket::ready(Err(StoreError::Stalled))
        }
    }
}

impl Drop for Writer {
    /// Commits what is queued, then joins the thread.
    fn drop(&mut self) {
        drop(self.queue.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run(mut conn: Connection, jobs: &Receiver<Job>, health: &StoreHealth) {
    let mut batch: Vec<Job> = Vec::with_capacity(MAX_BATCH);
    while let Ok(first) = jobs.recv() {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let all = batch.iter().flat_map(|j| &j.writes);
        match commit(&mut conn, all) {
            Ok(wrote) => {
                health.committed(wrote);
                for job in batch.drain(..) {
                    answer(job, Ok(()));
                }
            }
            Err(_) if batch.len() > 1 => {
                // Alone, each job fails or succeeds on its own merits.
                for job in batch.drain(..) {
                    let result = commit(&mut conn, job.writes.iter());
                    answer(job, health.outcome(result));
                }
            }
            Err(err) => {
                let result = health.outcome(Err(err));
                if let Some(job) = batch.pop() {
                    answer(job, result);
                }
            }
        }
    }
}

fn answer(job: Job, result: Result<(), StoreError>) {
    if let Some(done) = job.done {
        let _ = done.send(result);
    }
}

/// Commits `writes` as one transaction; answers whether any row changed. A commit that changed
/// nothing (a prune with nothing old, a touch of a gone lease) appends nothing to the WAL, so it
/// proves nothing about a full disk and must not end a failure burst.
fn commit<'a>(
    conn: &mut Connection,
    writes: impl Iterator<Item = &'a Write>,
) -> rusqlite::Result<bool> {
    let before = conn.total_changes();
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    for write in writes {
        apply(&tx, write)?;
    }
    tx.commit()?;
    Ok(conn.total_changes() > before)
}

fn apply(conn: &Connection, write: &Write) -> rusqlite::Result<()> {
    match write {
        Write::SaveLease(row) => {
            let mut stmt = conn.prepare_cached(
                "INSERT INTO leases (route, fp, model, host, state, created, last_used)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT (route, fp, model) DO UPDATE SET
                   host = excluded.host, state = excluded.state,
                   created = excluded.created, last_used = excluded.last_used",
            )?;
            stmt.execute(params![
                row.route,
                row.fp,
                row.model,
                row.host,
                row.state,
                row.created,
                row.last_used
            ])?;
        }
        Write::DeleteLease { route, fp, model } => {
            let mut stmt = conn
                .prepare_cached("DELETE FROM leases WHERE route = ?1 AND fp = ?2 AND model = ?3")?;
            stmt.execute(params![route, fp, model])?;
        }
        Write::Touch {
            route,
            fp,
            model,
            last_used,
        } => {
            let mut stmt = conn.prepare_cached(
                "UPDATE leases SET last_used = max(last_used, ?4)
                 WHERE route = ?1 AND fp = ?2 AND model = ?3",
            )?;
            stmt.execute(params![route, fp, model, last_used])?;
        }
        Write::Event(ev) => {
            let mut stmt = conn.prepare_cached(
                "INSERT INTO lease_events (at, route, fp, model, reason, from_host, to_host)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?;
            stmt.execute(params![
                ev.at,
                ev.route,
                ev.fp,
                ev.model,
                ev.reason,
                ev.from_host,
                ev.to_host
            ])?;
        }
        Write::Request(row) => super::requests::insert_request(conn, row)?,
        Write::PruneRequests { before, limit } => {
            let mut stmt = conn.prepare_cached(
                "DELETE FROM requests WHERE id IN
                   (SELECT id FROM requests WHERE started < ?1 ORDER BY started LIMIT ?2)",
            )?;
            stmt.execute(params![before, super::sql_limit(*limit)])?;
        }
        Write::PruneEvents { before, limit } => {
            let mut stmt = conn.prepare_cached(
                "DELETE FROM lease_events WHERE id IN
                   (SELECT id FROM lease_events WHERE at < ?1 ORDER BY at LIMIT ?2)",
            )?;
            stmt.execute(params![before, super::sql_limit(*limit)])?;
        }
        Write::LimitPages(pages) => {
            // SQLite's default; a cap below the current size becomes the current size.
            let pages = pages.unwrap_or(1_073_741_823);
            let _now: i64 =
                conn.query_row(&format!("PRAGMA max_page_count = {pages}"), [], |r| {
                    r.get(0)
                })?;
        }
    }
    Ok(())
}
