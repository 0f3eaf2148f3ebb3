//! Seats per host+model, with a bounded FIFO queue in front of each.
//!
//! A request takes a [`Permit`] for its host+model before it is forwarded; the permit frees its seat
//! and wakes the next waiter when dropped, so a `?`, a panic or a client hanging up mid-stream cannot
//! leak a seat. Waiters are admitted strictly in arrival (ticket) order, each waits at most
//! `queue_timeout` (a deadline computed once), and [`Limiter::close`] wakes every waiter for
//! shutdown. Beside each queue's `queue_max`, what all the queues hold together — requests, each
//! holding a worker, and their bodies — is bounded in all and per client (`waiting.rs`, issue
//! 46). This module does no I/O and knows nothing about health, leases or HTTP.

mod waiting;

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};

use waiting::Held;
pub use waiting::{Bound, Waiter, Waiting};

/// How often a waiter checks that its client is still there (seed 001 step 4: within a second).
pub const GONE_CHECK: Duration = Duration::from_millis(500);

/// Why [`Limiter::acquire`] gave no seat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitError {
    /// `queue_max` requests were already waiting for this host+model.
    QueueFull,
    /// No seat came free within `queue_timeout`.
    Timeout,
    /// The limiter was closed for shutdown.
    Closed,
    /// The config gives this host+model no seats: a request for it must not get here.
    NotConfigured,
    /// The waiter's `gone` check said its client left; it gave up its place in line.
    Gone,
    /// Waiting would take the requests in line over a bound on all the queues together or on one
    /// client's share of them (issue 46).
    Waiting(Bound),
}

impl fmt::Display for LimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LimitError::QueueFull => "queue full",
            LimitError::Timeout => "queue timeout",
            LimitError::Closed => "shutting down",
            LimitError::NotConfigured => "host and model not configured",
            LimitError::Gone => "client gone while queued",
            LimitError::Waiting(bound) => bound.key(),
        })
    }
}

impl std::error::Error for LimitError {}

/// The seat table. Share it behind an `Arc`; every method takes `&self`.
#[derive(Debug)]
pub struct Limiter {
    shared: Arc<Shared>,
}

/// One taken seat. Dropping it frees the seat, folds how long it was held into the seat's mean
/// (placement's expected wait, issue 23) and wakes the next waiter.
#[derive(Debug)]
pub struct Permit {
    shared: Arc<Shared>,
    host: String,
    model: String,
    since: Instant,
}

/// What one host+model's seats look like now, for placement (one turn of the lock).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Load {
    pub parallel: usize,
    pub in_flight: usize,
    pub queued: usize,
    /// Recent mean time a permit was held, ms; `None` before the first one was given back.
    pub hold_ms: Option<f64>,
}

/// Weight of the newest hold in the seat's mean: about the last ten holds count.
const HOLD_WEIGHT: f64 = 0.2;

/// What one host+model looks like right now, for the admin API and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeatStats {
    pub host: String,
    pub model: String,
    pub parallel: usize,
    pub in_flight: usize,
    pub queued: usize,
}

impl Limiter {
    pub fn new(queue_max: usize, queue_timeout: Duration) -> Limiter {
        let inner = Inner {
            closed: false,
            queue_max,
            queue_timeout,
            waiting: Waiting::UNBOUNDED,
            held: Held::default(),
            seats: BTreeMap::new(),
        };
        Limiter {
            shared: Arc::new(Shared {
                inner: Mutex::new(inner),
            }),
        }
    }

    /// Sets the seats of a host+model (from the config, also on reload). Raising it admits waiters
    /// at once; lowering it lets the requests in flight finish and admits no one until below.
    pub fn set_capacity(&self, host: &str, model: &str, parallel: usize) {
        let mut inner = self.shared.inner.lock();
        let seat = inner.seats_or_insert(host, model);
        seat.parallel = parallel;
        seat.wake_if_admissible();
    }

    /// Forgets every idle host+model that `keep` rejects (a reload removed the host or model), so
    /// its seat stats and gauges go. A pair with a request in flight or waiting stays until a
    /// later call finds it idle.
    pub fn retain(&self, keep: impl Fn(&str, &str) -> bool) {
        let mut inner = self.shared.inner.lock();
        for (host, models) in inner.seats.iter_mut() {
            models.retain(|model, seat| {
                keep(host, model) || seat.in_flight > 0 || !seat.waiting.is_empty()
            });
        }
        inner.seats.retain(|_, models| !models.is_empty());
    }

    /// Changes the queue bound and timeout for requests that arrive from now on; requests already
    /// waiting keep their deadline.
    pub fn set_queue(&self, queue_max: usize, queue_timeout: Duration) {
        let mut inner = self.shared.inner.lock();
        inner.queue_max = queue_max;
        inner.queue_timeout = queue_timeout;
    }

    /// Changes what requests waiting for a seat may hold, all queues together and per client
    /// (issue 46), for requests that start waiting from now on.
    pub fn set_waiting(&self, waiting: Waiting) {
        self.shared.inner.lock().waiting = waiting;
    }

    /// Takes a seat for `host`+`model`, waiting in line when all are busy. Returns the permit and
    /// how long the caller waited in line for it: zero when admitted at once, else at least a
    /// millisecond. A pair [`Limiter::set_capacity`] never named is refused,
    /// so client-chosen model names cannot grow the table.
    pub fn acquire(&self, host: &str, model: &str) -> Result<(Permit, Duration), LimitError> {
        self.acquire_unless(host, model, Waiter::default(), || (), || false)
    }

    /// [`Limiter::acquire`] for `waiter`, which waits only within the bounds on all the queues
    /// together and on its client's share ([`Waiting`]; past one, [`LimitError::Waiting`]). A
    /// waiter also asks `gone` at least every [`GONE_CHECK`] and
    /// leaves the line ([`LimitError::Gone`]) when it says yes. `gone` runs with the lock
    /// released (it may peek at a socket). `entered` runs with the lock held, in the turn that
    /// gives the caller its seat or its place in line: a count kept elsewhere of requests on their
    /// way here ([`crate::holdings::Arrival`]) hands over to this one with no moment in both or
    /// neither, for a reader that holds the lock ([`Limiter::load_with`]). It must take no lock
    /// that may be held while this one is taken.
    pub fn acquire_unless(
        &self,
        host: &str,
        model: &str,
        waiter: Waiter,
        entered: impl FnOnce(),
        mut gone: impl FnMut() -> bool,
    ) -> Result<(Permit, Duration), LimitError> {
        let started = Instant::now();
        let mut inner = self.shared.inner.lock();
        if inner.closed {
            return Err(LimitError::Closed);
        }
        let (queue_max, wait_until) = (inner.queue_max, started + inner.queue_timeout);
        let Some(seat) = inner.seats(host, model) else {
            return Err(LimitError::NotConfigured);
        };
        // A free seat with people in line belongs to the one in front, not to a newcomer.
        if seat.waiting.is_empty() && seat.in_flight < seat.parallel {
            seat.in_flight += 1;
            entered();
            drop(inner);
            // Admitted at once: it waited in no line.
            return Ok((self.permit(host, model), Duration::ZERO));
        }
        if seat.waiting.len() >= queue_max {
            return Err(LimitError::QueueFull);
        }
        let Inner { held, waiting, .. } = &mut *inner;
        held.enter(waiting, waiter).map_err(LimitError::Waiting)?;
        let seat = inner.seats(host, model).expect("looked up above");
        let ticket = seat.next_ticket;
        seat.next_ticket += 1;
        seat.waiting.push_back(ticket);
        entered();
        let cond = Arc::clone(&seat.cond);
        // Every way out of the line below leaves it in the same turn of the lock.
        let outcome = loop {
            let closed = inner.closed;
            let seat = inner
                .seats(host, model)
                .expect("a seat with waiters is never removed");
            if closed {
                seat.leave(ticket);
                break Err(LimitError::Closed);
            }
            if seat.waiting.front() == Some(&ticket) && seat.in_flight < seat.parallel {
                seat.waiting.pop_front();
                seat.in_flight += 1;
                // Capacity may have grown by more than one: let the next in line look too.
                seat.wake_if_admissible();
                break Ok(());
            }
            if Instant::now() >= wait_until {
                seat.leave(ticket);
                break Err(LimitError::Timeout);
            }
            let step = wait_until.min(Instant::now() + GONE_CHECK);
            if cond.wait_until(&mut inner, step).timed_out()
                && MutexGuard::unlocked(&mut inner, &mut gone)
            {
                inner
                    .seats(host, model)
                    .expect("a seat with waiters is never removed")
                    .leave(ticket);
                break Err(LimitError::Gone);
            }
        };
        inner.held.leave(waiter);
        drop(inner);
        // It stood in line: at least a millisecond, so a wait is never read as none.
        let waited = started.elapsed().max(Duration::from_millis(1));
        outcome.map(|()| (self.permit(host, model), waited))
    }

    /// Seats, requests in flight and queued, and the mean hold of `host`+`model` (all 0 when the
    /// pair is not configured).
    pub fn load(&self, host: &str, model: &str) -> Load {
        self.load_with(host, model, |load| load)
    }

    /// `f` of [`Limiter::load`], run with the lock held: what `f` reads of the requests on their
    /// way to this host+model is consistent with the load (see `entered` of
    /// [`Limiter::acquire_unless`]). `f` must take no lock that may be held while this one is.
    pub fn load_with<T>(&self, host: &str, model: &str, f: impl FnOnce(Load) -> T) -> T {
        let inner = self.shared.inner.lock();
        f(match inner.seats.get(host).and_then(|m| m.get(model)) {
            Some(s) => Load {
                parallel: s.parallel,
                in_flight: s.in_flight,
                queued: s.waiting.len(),
                hold_ms: s.hold_ms,
            },
            None => Load {
                parallel: 0,
                in_flight: 0,
                queued: 0,
                hold_ms: None,
            },
        })
    }

    /// Requests holding a seat of `host`+`model`.
    pub fn in_flight(&self, host: &str, model: &str) -> usize {
        self.read(host, model, |s| s.in_flight)
    }

    /// Requests waiting for a seat of `host`+`model`.
    pub fn queued(&self, host: &str, model: &str) -> usize {
        self.read(host, model, |s| s.waiting.len())
    }

    /// Requests waiting for a seat and the bytes of their bodies, all queues together (issue 46).
    pub fn waiting_held(&self) -> (usize, usize) {
        self.shared.inner.lock().held.totals()
    }

    /// Every host+model configured so far, sorted by host then model.
    pub fn snapshot(&self) -> Vec<SeatStats> {
        let inner = self.shared.inner.lock();
        let mut out = Vec::new();
        for (host, models) in &inner.seats {
            for (model, seat) in models {
                out.push(SeatStats {
                    host: host.clone(),
                    model: model.clone(),
                    parallel: seat.parallel,
                    in_flight: seat.in_flight,
                    queued: seat.waiting.len(),
                });
            }
        }
        out
    }

    /// Requests in flight on `host`, every model together.
    pub fn in_flight_on(&self, host: &str) -> usize {
        let inner = self.shared.inner.lock();
        (inner.seats.get(host)).map_or(0, |models| models.values().map(|s| s.in_flight).sum())
    }

    /// Every seat of `host`, taken at once while none is in use and nobody waits (the probe's,
    /// issue 47); `None` otherwise. Dropping the hold frees them and wakes whoever queued behind
    /// it; it folds nothing into the seats' mean hold, which placement reads as the time a request
    /// holds a seat.
    pub fn hold_idle(&self, host: &str) -> Option<IdleHold> {
        let mut inner = self.shared.inner.lock();
        if inner.closed {
            return None;
        }
        let models = inner.seats.get_mut(host)?;
        if (models.values()).any(|s| s.in_flight > 0 || !s.waiting.is_empty()) {
            return None;
        }
        let taken = (models.iter_mut())
            .map(|(model, seat)| {
                seat.in_flight += seat.parallel;
                (model.clone(), seat.parallel)
            })
            .collect();
        Some(IdleHold {
            shared: Arc::clone(&self.shared),
            host: host.to_string(),
            taken,
        })
    }

    /// Shutdown: every waiter returns [`LimitError::Closed`], and so does every later acquire.
    /// Permits already given out stay valid and free their seats as usual.
    pub fn close(&self) {
        let mut inner = self.shared.inner.lock();
        inner.closed = true;
        for seat in inner.seats.values().flat_map(|m| m.values()) {
            seat.cond.notify_all();
        }
    }

    fn permit(&self, host: &str, model: &str) -> Permit {
        Permit {
            shared: Arc::clone(&self.shared),
            host: host.to_string(),
            model: model.to_string(),
            since: Instant::now(),
        }
    }

    fn read(&self, host: &str, model: &str, f: impl Fn(&Seats) -> usize) -> usize {
        let inner = self.shared.inner.lock();
        inner
            .seats
            .get(host)
            .and_then(|m| m.get(model))
            .map_or(0, f)
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut inner = self.shared.inner.lock();
        let held = self.since.elapsed().as_secs_f64() * 1000.0;
        // A permit is only made for an existing seat, and a held seat is never removed.
        if let Some(seat) = inner.seats(&self.host, &self.model) {
            seat.in_flight = seat.in_flight.saturating_sub(1);
            seat.hold_ms = Some(mean_hold(seat.hold_ms, held));
            seat.wake_if_admissible();
        }
    }
}

/// Every seat of one host, held while it is probed ([`Limiter::hold_idle`]).
#[derive(Debug)]
pub struct IdleHold {
    shared: Arc<Shared>,
    host: String,
    /// Each model and the seats taken of it.
    taken: Vec<(String, usize)>,
}

impl Drop for IdleHold {
    fn drop(&mut self) {
        let mut inner = self.shared.inner.lock();
        for (model, n) in &self.taken {
            if let Some(seat) = inner.seats(&self.host, model) {
                seat.in_flight = seat.in_flight.saturating_sub(*n);
                seat.wake_if_admissible();
            }
        }
    }
}

/// The seat's mean hold after one more of `held` ms: the first sets it, later ones move it
/// [`HOLD_WEIGHT`] of the way.
fn mean_hold(mean: Option<f64>, held: f64) -> f64 {
    mean.map_or(held, |mean| mean + HOLD_WEIGHT * (held - mean))
}

#[derive(Debug)]
struct Shared {
    inner: Mutex<Inner>,
}

/// Invariants, all under the one mutex:
/// - a `Seats` is created only by `set_capacity` (the config) and removed only by `retain` when
///   no permit holds it and no one waits for it, so a `Permit` or a waiter always finds its own;
/// - `in_flight` counts exactly the live `Permit`s for that host+model (it may exceed `parallel`
///   after a lowering, until they drain);
/// - `waiting` holds the tickets of the threads blocked in `acquire`, oldest first; only the front
///   ticket may take a seat, and a waiter that gives up removes its own ticket before returning;
/// - whenever the front waiter could take a seat, its `cond` has been notified;
/// - every `Seats::cond` is only ever waited on with this mutex (no other lock is involved).
#[derive(Debug)]
struct Inner {
    closed: bool,
    queue_max: usize,
    queue_timeout: Duration,
    /// The bounds on all the queues together and per client.
    waiting: Waiting,
    /// What the requests in every queue hold: each waiter counted from entering its line until
    /// it leaves it, in the same turns of the lock as its ticket.
    held: Held,
    seats: BTreeMap<String, BTreeMap<String, Seats>>,
}

#[derive(Debug)]
struct Seats {
    parallel: usize,
    in_flight: usize,
    next_ticket: u64,
    waiting: VecDeque<u64>,
    cond: Arc<Condvar>,
    /// Recent mean time a permit was held, ms.
    hold_ms: Option<f64>,
}

impl Inner {
    fn seats(&mut self, host: &str, model: &str) -> Option<&mut Seats> {
        self.seats.get_mut(host).and_then(|m| m.get_mut(model))
    }

    fn seats_or_insert(&mut self, host: &str, model: &str) -> &mut Seats {
        // Looked up before inserting so the common case allocates nothing.
        if !self.seats.contains_key(host) {
            self.seats.insert(host.to_string(), BTreeMap::new());
        }
        let models = self.seats.get_mut(host).expect("inserted above");
        if !models.contains_key(model) {
            models.insert(model.to_string(), Seats::new());
        }
        models.get_mut(model).expect("inserted above")
    }
}

impl Seats {
    fn new() -> Seats {
        Seats {
            parallel: 0,
            in_flight: 0,
            next_ticket: 0,
            waiting: VecDeque::new(),
            cond: Arc::new(Condvar::new()),
            hold_ms: None,
        }
    }

    /// Wakes the waiters when the one in front could take a seat now. All wake, but only the
    /// front ticket proceeds, so the order stays FIFO.
    fn wake_if_admissible(&self) {
        if !self.waiting.is_empty() && self.in_flight < self.parallel {
            self.cond.notify_all();
        }
    }

    /// Removes a waiter that gives up; the next one may now be in front.
    fn leave(&mut self, ticket: u64) {
        self.waiting.retain(|&t| t != ticket);
        self.wake_if_admissible();
    }
}

#[cfg(test)]
mod tests;
