//! A request body still coming, and what all of them may hold (issue 24). A worker waits
//! [`BODY_STEP`] for a body; one not whole by then is handed to the poller with its head, read
//! there off the workers, and the request goes back on the queue once its body is whole (or has
//! failed: the handler answers 408, 413, 400 or 503 then). A stalled body therefore costs a socket
//! and a timer, not a worker.
//!
//! The bytes of bodies being received are charged to one [`Budget`] per listener
//! (`client_body_buffer_mib`) as they arrive, and given back once the body is whole (issue 46: a
//! charge kept until the request ended let one client's whole bodies, queued for a busy host,
//! hold the budget and refuse every other client's body); a body that would go over it is `503
//! busy`. What a client declares is never charged, so silent bodies declaring 16 MiB cost
//! nothing. The bytes of bodies being received are therefore bounded by the budget (their
//! buffers by twice that, as a growing buffer doubles), plus per connection the bytes read but
//! not yet decoded (at most 64 KiB + 16 KiB). A whole body is its request's: what requests
//! waiting for a slot may hold is the limiter's bound (`queue_body_mib`, per client and in all).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::body::{BodyError, BodyTiming, Decoder, Pace};
use super::head::{BodyKind, Head};
use super::inbound::Inbound;
use super::peers::BodySlot;

/// How long a worker waits for a body not whole with its head before the poller takes it.
pub(super) const BODY_STEP: Duration = Duration::from_millis(50);

/// The bytes all bodies being received on a listener may hold.
#[derive(Debug)]
pub(super) struct Budget {
    max: usize,
    used: AtomicUsize,
}

/// What one body holds of its listener's [`Budget`]; given back on drop.
#[derive(Debug)]
pub(super) struct Charge {
    budget: Arc<Budget>,
    bytes: usize,
}

impl Budget {
    pub(super) fn new(max: usize) -> Arc<Budget> {
        Arc::new(Budget {
            max,
            used: AtomicUsize::new(0),
        })
    }

    /// Bytes charged now, all bodies together.
    pub(super) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

impl Charge {
    pub(super) fn new(budget: &Arc<Budget>) -> Charge {
        Charge {
            budget: budget.clone(),
            bytes: 0,
        }
    }

    /// Holds `total` bytes from now on; false (and unchanged) when that would take the budget over
    /// its max.
    fn to(&mut self, total: usize) -> bool {
        let used = &self.budget.used;
        if total <= self.bytes {
            used.fetch_sub(self.bytes - total, Ordering::Relaxed);
        } else {
            let more = total - self.bytes;
            if used.fetch_add(more, Ordering::Relaxed) + more > self.budget.max {
                used.fetch_sub(more, Ordering::Relaxed);
                return false;
            }
        }
        self.bytes = total;
        true
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// A body being received: what has been decoded, its pace, its place in its peer's count of
/// bodies and its charge.
#[derive(Debug)]
pub(super) struct Awaiting {
    decoder: Decoder,
    pace: Pace,
    _slot: Option<BodySlot>,
    charge: Charge,
}

/// A request whose body the poller read off the workers: its head, and its body or why not. The
/// handler is called again with it.
#[derive(Debug)]
pub(super) struct Arrived {
    pub(super) head: Head,
    pub(super) body: Result<Vec<u8>, BodyError>,
}

impl Awaiting {
    /// A body of `kind`, at most `max` bytes (`TooLarge` at once for a declared length over it).
    pub(super) fn new(
        kind: BodyKind,
        max: usize,
        timing: BodyTiming,
        slot: Option<BodySlot>,
        budget: &Arc<Budget>,
    ) -> Result<Awaiting, BodyError> {
        Ok(Awaiting {
            decoder: Decoder::new(kind, max)?,
            pace: Pace::new(timing, Instant::now(), kind),
            _slot: slot,
            charge: Charge::new(budget),
        })
    }

    /// Takes what is pending on `inb`: `None` once the body is whole (then [`Awaiting::finish`]),
    /// else until when more must come. `Busy` when what it holds would take the budget over;
    /// `Timeout` when it fell behind its pace.
    pub(super) fn step<W: super::inbound::Wire>(
        &mut self,
        inb: &mut Inbound<W>,
        now: Instant,
    ) -> Result<Option<Instant>, BodyError> {
        let whole = self.decoder.feed(inb)?;
        if !self.charge.to(self.decoder.got() as usize) {
            return Err(BodyError::Busy);
        }
        if whole {
            return Ok(None);
        }
        self.pace.by(now, self.decoder.got()).map(Some)
    }

    /// The whole body. Its charge and its place in its peer's count are given back: it is no
    /// longer arriving.
    pub(super) fn finish(self) -> Vec<u8> {
        self.decoder.into_body()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_are_capped_together_and_given_back_on_drop() {
        let budget = Budget::new(100);
        let mut a = Charge::new(&budget);
        let mut b = Charge::new(&budget);
        assert!(a.to(60));
        assert!(!b.to(41), "over the max together");
        assert_eq!(budget.used(), 60, "a refused charge takes nothing");
        assert!(b.to(40));
        assert!(a.to(10), "shrinking gives back");
        assert!(b.to(90));
        drop(a);
        drop(b);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_body_over_the_budget_is_busy_and_a_whole_one_gives_its_charge_back_issue_46() {
        let budget = Budget::new(64 << 10);
        let timing = BodyTiming {
            base: Duration::from_secs(10),
            min_rate: 1,
        };
        let mut inb = Inbound::new(std::io::Cursor::new(Vec::new()));
        let mut wait = Awaiting::new(BodyKind::Length(200_000), 1 << 20, timing, None, &budget);
        inb.push(&[b'x'; 100_000]);
        let got = wait.as_mut().unwrap().step(&mut inb, Instant::now());
        assert!(matches!(got, Err(BodyError::Busy)), "{got:?}");
        drop(wait);
        assert_eq!(budget.used(), 0);

        let mut wait = Awaiting::new(BodyKind::Length(3), 16, timing, None, &budget).unwrap();
        inb.consume(inb.pending().len());
        inb.push(b"ab");
        assert!(wait.step(&mut inb, Instant::now()).unwrap().is_some());
        inb.push(b"cGET");
        assert!(wait.step(&mut inb, Instant::now()).unwrap().is_none());
        assert!(budget.used() >= 3, "charged while it arrives");
        let body = wait.finish();
        assert_eq!((body.as_slice(), inb.pending()), (&b"abc"[..], &b"GET"[..]));
        assert_eq!(budget.used(), 0, "given back once whole");
    }
}
