//! Tickets: the promise of a commit, and where the committer leaves each job's outcome.

use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{bounded, Receiver, Sender};
use parking_lot::{Condvar, Mutex};

use super::{Outcome, Shared, COMMIT_WAIT};
use crate::store::StoreError;

/// Where the committer leaves one job's outcome, and wakes that job's waiter alone: waiters
/// woken together through the queue's lock would take it one after another, each behind the
/// last one's turn on a busy CPU (tails of 10–25 ms at 32 clients).
#[derive(Debug, Default)]
pub(super) struct Answer {
    outcome: Mutex<Option<Outcome>>,
    ready: Condvar,
}

pub(super) type Slot = Arc<Answer>;

impl Answer {
    pub(super) fn set(&self, outcome: Outcome) {
        *self.outcome.lock() = Some(outcome);
        self.ready.notify_one();
    }

    pub(super) fn is_set(&self) -> bool {
        self.outcome.lock().is_some()
    }

    /// Until the outcome is there, at most until `deadline`.
    pub(super) fn wait(&self, deadline: Instant) -> Outcome {
        let mut outcome = self.outcome.lock();
        loop {
            if let Some(outcome) = outcome.take() {
                return outcome;
            }
            if self.ready.wait_until(&mut outcome, deadline).timed_out() {
                return outcome.take().unwrap_or(Err(StoreError::Stalled));
            }
        }
    }
}

/// The promise of a commit: [`Ticket::wait`] answers once the writes it covers are in the db.
/// Dropping it unwaited leaves the job to the writer thread.
#[derive(Debug)]
pub struct Ticket(Option<Promise>);

#[derive(Debug)]
enum Promise {
    /// Answered through a channel: refusals, and persisters other than the store.
    Answer(Receiver<Outcome>),
    /// A job in the writer's queue.
    Queued { writer: Arc<Shared>, slot: Slot },
}

impl Ticket {
    /// The ticket of a job queued with `slot` for its outcome.
    pub(super) fn queued(writer: Arc<Shared>, slot: Slot) -> Ticket {
        Ticket(Some(Promise::Queued { writer, slot }))
    }

    /// A ticket already answered (persisters that write synchronously, and refusals).
    pub fn ready(result: Outcome) -> Ticket {
        let (tx, rx) = bounded(1);
        let _ = tx.send(result);
        Ticket(Some(Promise::Answer(rx)))
    }

    /// A ticket answered later through the returned sender (persisters other than the writer).
    pub fn promise() -> (Sender<Outcome>, Ticket) {
        let (tx, rx) = bounded(1);
        (tx, Ticket(Some(Promise::Answer(rx))))
    }

    /// Waits for the commit, at most [`COMMIT_WAIT`]: committing it on this thread when it is
    /// the only job and nobody is committing, else leaving it to the writer thread's batch.
    pub fn wait(mut self) -> Outcome {
        let deadline = Instant::now() + COMMIT_WAIT;
        match self.0.take() {
            Some(Promise::Answer(rx)) => match rx.recv_deadline(deadline) {
                Ok(result) => result,
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => Err(StoreError::Stalled),
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Err(StoreError::Stopped),
            },
            Some(Promise::Queued { writer, slot }) => writer.wait(&slot, deadline),
            None => Err(StoreError::Stopped),
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(Promise::Queued { writer, slot }) = self.0.take() {
            if !slot.is_set() {
                writer.orphaned();
            }
        }
    }
}
