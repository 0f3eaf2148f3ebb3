//! Rows on their way ([`Coming`]): what lets the writer thread gather the rows of requests that
//! have their whole answer into one commit (issue 26) instead of each committing alone.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{Queue, Shared, Writer};
#[cfg(test)]
use super::{Ticket, Write};

/// A row on its way: the request has its whole answer and will submit its row in a moment (the
/// tee's last look, metrics, the log line's fields). While one lives, a lone waiter does not
/// commit on its own thread but lets the writer thread gather (up to [`GATHER`]) and commit them
/// together. Ends when its row is queued ([`Writer::leave`]) or is dropped when it never will be.
#[derive(Debug)]
pub struct Coming(Option<Arc<Shared>>);

impl Drop for Coming {
    fn drop(&mut self) {
        let Some(shared) = self.0.take() else {
            return;
        };
        if shared.coming.fetch_sub(1, Ordering::AcqRel) == 1 {
            // The gathering writer checks the count under the queue's lock before it waits.
            if shared.queue.lock().gathering {
                shared.wake.notify_one();
            }
        }
    }
}

impl Coming {
    /// Stops counting, under the queue's lock its caller holds for the row it queues.
    pub(super) fn arrived(mut self, q: &Queue) {
        if let Some(shared) = self.0.take() {
            if shared.coming.fetch_sub(1, Ordering::AcqRel) == 1 && q.gathering {
                shared.wake.notify_one();
            }
        }
    }
}

impl Writer {
    /// Says that a row is on its way (see [`Coming`]).
    pub(in crate::store) fn coming(&self) -> Coming {
        self.shared.coming.fetch_add(1, Ordering::AcqRel);
        Coming(Some(self.shared.clone()))
    }

    /// [`Writer::submit`] for the row `coming` announced, queued before it stops counting: the
    /// gathering as a waiter meets it (lease writes wait on tickets beside rows on their way).
    #[cfg(test)]
    pub(in crate::store) fn submit_coming(&self, writes: Vec<Write>, coming: Coming) -> Ticket {
        let ticket = self.submit(writes);
        drop(coming);
        ticket
    }
}
