//! The store's one writer: every write to the database goes through it, in the order submitted.
//!
//! Callers queue [`Write`]s as one job and get a [`Ticket`] that says when it committed. One
//! connection commits at a time, and who commits depends on the load:
//! - **Alone:** a caller that waits on its ticket while nobody is committing and nothing else is
//!   queued commits its job on its own thread. A lone request's accounting row thus costs no
//!   hand-off: the hop to a writer thread and back was the largest part of what crossbar added
//!   per request at one client (issue 12, docs/BENCHMARKS.md).
//! - **Together:** when other jobs are queued beside it, or rows are on their way ([`Coming`]:
//!   requests whose whole answer has arrived and whose row is being filled in), the waiter hands
//!   the queue to the writer thread, which waits up to [`GATHER`] for the rows on their way and
//!   commits everything queued in one transaction (group commit), so concurrent workers share one
//!   `fsync`-free WAL commit: its six lock calls and its frames (issue 26: batches of 1.4 rows
//!   at 32 clients before rows on their way were waited for). A worker that took a batch could be
//!   preempted with 60 threads on 2 cores, and everyone queued behind it would wait for its next
//!   time slice (a 15 ms p99 at 32 clients); the writer thread, asleep between batches, is run as
//!   soon as it is woken.
//! - **Left, not waited for** ([`Writer::leave`]): a job may carry what must follow its commit
//!   ([`Then`]: a request's answer end), run by whoever commits it. Its caller commits it itself
//!   when alone, as above, and otherwise goes on at once: a worker of a busy gateway no longer
//!   sleeps on its row's batch and wakes only to write the answer's last bytes (issue 26).
//!
//! The writer thread also commits jobs nobody waits for (touches of reused leases written
//! behind, evictions, prunes: a dropped ticket wakes it), and at stop whatever is still queued.
//! Nothing here takes another module's lock, and the queue's lock is never held while SQLite
//! runs: a caller may queue a job with the lease table's lock held.
//!
//! A batch that fails is retried job by job, so one bad write cannot fail its neighbours; the
//! outcome of every commit goes to [`StoreHealth`], which logs a failure once per burst.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use lock::{Condvar, Mutex, MutexGuard};
use rusqlite::Connection;

use super::checkpoint::Nudge;
use super::health::StoreHealth;
use super::write::{commit, Write};
use super::StoreError;

/// Most jobs committed in one transaction.
const MAX_BATCH: usize = 512;
/// Most jobs queued; beyond it a submission fails at once (never blocks).
const QUEUE: usize = 16_384;
/// Longest a caller waits for its commit before answering "store unavailable".
const COMMIT_WAIT: Duration = Duration::from_secs(30);
/// How often the writer thread looks at the queue unwoken: a safety net, since it is woken for
/// every job it is to commit (an idle gateway's writer woke four times a second, issue 26).
const IDLE_TICK: Duration = Duration::from_secs(5);
/// Longest the writer thread waits for rows on their way ([`Coming`]) before it commits what is
/// queued: about the time a worker takes from a whole answer to its row on a busy CPU. Nobody
/// waits for it when nothing else is on its way.
const GATHER: Duration = Duration::from_micros(200);

type Outcome = Result<(), StoreError>;

/// What runs on the committer's thread once a job is committed (or has failed), before its
/// waiter is answered: a request's answer end, sent after its row (issue 26).
pub type Then = Box<dyn FnOnce(&Outcome) + Send>;

struct Job {
    writes: Vec<Write>,
    /// Where its waiter finds the outcome; none for a job left ([`Writer::leave`]).
    slot: Option<Slot>,
    then: Option<Then>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("writes", &self.writes)
            .field("then", &self.then.is_some())
            .finish()
    }
}

#[derive(Debug, Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Someone holds the connection and commits.
    committing: bool,
    /// The writer thread is wanted: waiters handed it their jobs, or a queued job's ticket was
    /// dropped unwaited.
    wanted: bool,
    stopping: bool,
    /// The writer thread waits for rows on their way: [`Coming`] wakes it when the last arrives.
    gathering: bool,
    /// Batches committed by a waiting caller, and by the writer thread (for tests and tuning).
    by_caller: u64,
    by_thread: u64,
}

struct Shared {
    queue: Mutex<Queue>,
    /// A batch committed (for whoever waits for the queue to settle).
    committed: Condvar,
    /// Wakes the writer thread: it is wanted, or the store stops.
    wake: Condvar,
    /// Used only by the committer of the moment (`Queue::committing`).
    conn: Mutex<Connection>,
    health: Arc<StoreHealth>,
    /// Tells the checkpoint thread of every commit.
    nudge: Nudge,
    /// Rows on their way: [`Coming`]s alive.
    coming: AtomicUsize,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}

/// The writer's handle: the queue, and the writer thread to join when the store is dropped.
#[derive(Debug)]
pub(super) struct Writer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Writer {
    pub(super) fn start(conn: Connection, health: Arc<StoreHealth>, nudge: Nudge) -> Writer {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            committed: Condvar::new(),
            wake: Condvar::new(),
            conn: Mutex::new(conn),
            health,
            nudge,
            coming: AtomicUsize::new(0),
        });
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || sh.writer_thread())
            .expect("the OS refused to start a thread");
        Writer {
            shared,
            thread: Some(thread),
        }
    }

    /// Queues `writes` as one job after everything queued before; the ticket answers at commit.
    /// Never blocks: callers may hold the lease table's lock. A full queue means commits are
    /// stuck (a hung disk); the caller answers "store unavailable" at once.
    pub(super) fn submit(&self, writes: Vec<Write>) -> Ticket {
        let slot = Slot::default();
        let mut q = self.shared.queue.lock();
        if q.stopping {
            return Ticket::ready(Err(StoreError::Stopped));
        }
        if q.jobs.len() >= QUEUE {
            return Ticket::ready(Err(StoreError::Stalled));
        }
        q.jobs.push_back(Job {
            writes,
            slot: Some(slot.clone()),
            then: None,
        });
        drop(q);
        Ticket::queued(self.shared.clone(), slot)
    }

    /// Queues `writes` with what must follow their commit ([`Then`]), and sees them committed
    /// without waiting: here when they are the only job, nobody commits and no row is on its way
    /// (as [`Ticket::wait`] would), else by the writer thread, woken for them. The row's
    /// announcement (`coming`) ends in the same turn of the queue's lock: one taking of it per
    /// request, where a worker woken on a busy CPU otherwise spun and yielded for it (issue 26).
    /// A job refused at once (the store stopping, a full queue) is followed here.
    pub(super) fn leave(&self, writes: Vec<Write>, then: Then, coming: Option<Coming>) {
        let sh = &self.shared;
        let mut q = sh.queue.lock();
        if let Some(coming) = coming {
            coming.arrived(&q);
        }
        let refused = if q.stopping {
            Some(StoreError::Stopped)
        } else if q.jobs.len() >= QUEUE {
            Some(StoreError::Stalled)
        } else {
            None
        };
        if let Some(err) = refused {
            drop(q);
            return then(&Err(err));
        }
        q.jobs.push_back(Job {
            writes,
            slot: None,
            then: Some(then),
        });
        if q.committing {
            // The committer hands what is queued behind it to the writer thread.
        } else if q.jobs.len() == 1 && sh.coming.load(Ordering::Acquire) == 0 {
            q.by_caller += 1;
            sh.commit_queued(&mut q);
        } else {
            q.wanted = true;
            sh.wake.notify_one();
        }
    }
}

#[cfg(test)]
impl Writer {
    /// What a commit tells the checkpoint thread, for a test that fails a commit by hand.
    pub(super) fn nudge_checkpoint(&self) {
        self.shared.nudge.wrote();
    }
}

impl Drop for Writer {
    /// Commits what is queued, then joins the writer thread.
    fn drop(&mut self) {
        self.shared.queue.lock().stopping = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Shared {
    /// Until `slot` has its outcome. When nobody is committing, the job is still queued (a
    /// committer fills the slots of every job it takes before it stops): alone, it is committed
    /// here; with others, the writer thread is woken for them all. When someone is committing,
    /// that committer hands what is queued behind it to the writer thread.
    fn wait(&self, slot: &Slot, deadline: Instant) -> Outcome {
        let mut q = self.queue.lock();
        if !slot.is_set() && !q.committing {
            if q.jobs.len() == 1 && self.coming.load(Ordering::Acquire) == 0 {
                q.by_caller += 1;
                self.commit_queued(&mut q);
            } else {
                q.wanted = true;
                self.wake.notify_one();
            }
        }
        drop(q);
        slot.wait(deadline)
    }

    fn orphaned(&self) {
        self.queue.lock().wanted = true;
        self.wake.notify_one();
    }

    /// Takes the role, commits the oldest [`MAX_BATCH`] queued jobs with the queue unlocked,
    /// answers each job's waiter, gives the role up and wakes the writer thread for whatever
    /// queued meanwhile.
    fn commit_queued(&self, q: &mut MutexGuard<'_, Queue>) {
        q.committing = true;
        let n = q.jobs.len().min(MAX_BATCH);
        let batch: Vec<Job> = q.jobs.drain(..n).collect();
        MutexGuard::unlocked(q, || {
            let outcomes = catch_unwind(AssertUnwindSafe(|| {
                commit_jobs(&mut self.conn.lock(), &batch, &self.health)
            }))
            .unwrap_or_else(|_| {
                log::error!("store commit panicked jobs={}", batch.len());
                Vec::new()
            });
            let mut outcomes = outcomes.into_iter();
            for job in batch {
                let outcome = outcomes.next().unwrap_or(Err(StoreError::Stalled));
                if let Some(then) = job.then {
                    if catch_unwind(AssertUnwindSafe(|| then(&outcome))).is_err() {
                        log::error!("what follows a commit panicked");
                    }
                }
                if let Some(slot) = job.slot {
                    slot.set(outcome);
                }
            }
            // After the answers: a sleeping checkpoint thread's wake-up is not on their path.
            self.nudge.wrote();
        });
        q.committing = false;
        q.wanted = !q.jobs.is_empty();
        if q.wanted || q.stopping {
            self.wake.notify_one();
        }
        self.committed.notify_all();
    }

    /// The writer thread: commits what it was woken for, and everything at stop.
    fn writer_thread(&self) {
        let mut q = self.queue.lock();
        loop {
            if !q.committing && !q.jobs.is_empty() && (q.wanted || q.stopping) {
                self.gather(&mut q);
                // A waiter may have committed while the queue was unlocked.
                if !q.committing && !q.jobs.is_empty() {
                    q.by_thread += 1;
                    self.commit_queued(&mut q);
                }
                continue;
            }
            if q.stopping && !q.committing && q.jobs.is_empty() {
                return;
            }
            self.wake.wait_for(&mut q, IDLE_TICK);
        }
    }
}

impl Shared {
    /// Waits, at most [`GATHER`], while rows are on their way and the batch has room.
    fn gather(&self, q: &mut MutexGuard<'_, Queue>) {
        let until = Instant::now() + GATHER;
        while !q.stopping && q.jobs.len() < MAX_BATCH && self.coming.load(Ordering::Acquire) > 0 {
            q.gathering = true;
            let timed_out = self.wake.wait_until(q, until).timed_out();
            q.gathering = false;
            if timed_out {
                return;
            }
        }
    }
}

/// One outcome per job: all share a batch that committed; if it failed, each is tried alone, so
/// one bad write cannot fail its neighbours.
fn commit_jobs(conn: &mut Connection, batch: &[Job], health: &StoreHealth) -> Vec<Outcome> {
    // The disk is full and the WAL is being copied back: nothing is written, so the WAL stops
    // growing into the space the copy needs (`reserve`).
    if health.reclaiming() {
        let full = || {
            rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
                None,
            )
        };
        return batch.iter().map(|_| health.outcome(Err(full()))).collect();
    }
    match commit(conn, batch.iter().flat_map(|j| &j.writes)) {
        Ok(wrote) => {
            health.committed(wrote);
            batch.iter().map(|_| Ok(())).collect()
        }
        Err(_) if batch.len() > 1 => batch
            .iter()
            .map(|job| health.outcome(commit(conn, job.writes.iter())))
            .collect(),
        Err(err) => vec![health.outcome(Err(err))],
    }
}

mod coming;
mod lock;
#[cfg(test)]
mod tests;
mod ticket;

pub use coming::Coming;
use ticket::Slot;
pub use ticket::Ticket;
