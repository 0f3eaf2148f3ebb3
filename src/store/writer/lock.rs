//! The writer's queue lock: std's mutex and condvar behind the guard the writer uses (released
//! for a commit with [`MutexGuard::unlocked`], waited on through `&mut`), as parking_lot's are.
//!
//! Every request takes this lock to leave its row, and on a busy CPU its holder is often off the
//! CPU. parking_lot spins with `sched_yield` before it parks: at 32 clients on 2 cores that was
//! 0.45 yields a request, 77 % of them here (issue 26). std's futex mutex spins without yielding,
//! then sleeps until the holder lets go. On an answer's tail (`conn/tail.rs`), where most of the
//! other yields were, sleeping instead cost more switches than the yields it saved (2.62 → 2.88
//! a request), so it keeps parking_lot, as do the lease, limiter and health state the design card
//! names. Poisoning is ignored, as parking_lot has none: a panic under the lock (caught around
//! each commit) must not fail every later request.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::PoisonError;
use std::time::{Duration, Instant};

#[derive(Debug, Default)]
pub(super) struct Mutex<T>(std::sync::Mutex<T>);

/// Holds the lock, except inside [`MutexGuard::unlocked`] and a condvar's wait, which take it
/// through `&mut` and give it back before they return.
pub(super) struct MutexGuard<'a, T> {
    mutex: &'a Mutex<T>,
    held: Option<std::sync::MutexGuard<'a, T>>,
}

impl<T> Mutex<T> {
    pub(super) fn new(value: T) -> Mutex<T> {
        Mutex(std::sync::Mutex::new(value))
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, T> {
        MutexGuard {
            mutex: self,
            held: Some(self.0.lock().unwrap_or_else(PoisonError::into_inner)),
        }
    }
}

impl<T> MutexGuard<'_, T> {
    /// Runs `f` with the lock released, and takes it again.
    pub(super) fn unlocked<R>(guard: &mut Self, f: impl FnOnce() -> R) -> R {
        drop(guard.held.take());
        let out = f();
        guard.held = Some(guard.mutex.0.lock().unwrap_or_else(PoisonError::into_inner));
        out
    }
}

impl<T> Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.held
            .as_ref()
            .expect("a guard is held outside `unlocked` and waits")
    }
}

impl<T> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.held
            .as_mut()
            .expect("a guard is held outside `unlocked` and waits")
    }
}

/// Whether a wait ended by its time rather than a notification.
pub(super) struct WaitTimeoutResult(bool);

impl WaitTimeoutResult {
    pub(super) fn timed_out(&self) -> bool {
        self.0
    }
}

/// std's condvar, told only when someone waits: std's makes a system call on every notify, where
/// parking_lot's makes none without a waiter (a commit's notify cost every request a `futex`).
/// A waiter is counted while it holds the lock, and the state it waits on changes under that
/// lock, so a notifier that finds nobody counted has nobody to wake.
#[derive(Debug, Default)]
pub(super) struct Condvar {
    cv: std::sync::Condvar,
    waiters: AtomicUsize,
}

impl Condvar {
    pub(super) fn new() -> Condvar {
        Condvar::default()
    }

    pub(super) fn notify_one(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.cv.notify_one();
        }
    }

    pub(super) fn notify_all(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.cv.notify_all();
        }
    }

    /// Waits at most `wait`, the lock released meanwhile; holds it again on return.
    pub(super) fn wait_for<T>(
        &self,
        guard: &mut MutexGuard<'_, T>,
        wait: Duration,
    ) -> WaitTimeoutResult {
        let held = guard
            .held
            .take()
            .expect("a guard is held outside `unlocked` and waits");
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let (held, result) =
            (self.cv.wait_timeout(held, wait)).unwrap_or_else(PoisonError::into_inner);
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        guard.held = Some(held);
        WaitTimeoutResult(result.timed_out())
    }

    pub(super) fn wait_until<T>(
        &self,
        guard: &mut MutexGuard<'_, T>,
        until: Instant,
    ) -> WaitTimeoutResult {
        self.wait_for(guard, until.saturating_duration_since(Instant::now()))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[test]
    fn unlocked_lets_another_thread_in_and_holds_the_lock_again_after() {
        let m = Arc::new(Mutex::new(0));
        let mut guard = m.lock();
        let other = m.clone();
        MutexGuard::unlocked(&mut guard, || {
            std::thread::spawn(move || *other.lock() += 1)
                .join()
                .unwrap();
        });
        assert_eq!(*guard, 1, "the other thread got in while it was released");
        assert!(m.0.try_lock().is_err(), "held again");
    }

    #[test]
    fn a_wait_ends_by_notification_or_by_its_time_holding_the_lock() {
        let pair = Arc::new((Mutex::new(false), Condvar::new()));
        let mut guard = pair.0.lock();
        assert!(pair
            .1
            .wait_for(&mut guard, Duration::from_millis(1))
            .timed_out());
        assert!(
            pair.0 .0.try_lock().is_err(),
            "held after a wait that timed out"
        );
        let other = pair.clone();
        let waker = std::thread::spawn(move || {
            *other.0.lock() = true;
            other.1.notify_one();
        });
        // The waker changes the flag under the lock and notifies after letting it go: a waiter
        // counted under the lock is woken, never left to its time.
        while !*guard {
            let woken = !pair
                .1
                .wait_for(&mut guard, Duration::from_secs(10))
                .timed_out();
            assert!(woken, "the notify was lost");
        }
        waker.join().unwrap();
    }

    #[test]
    fn a_panic_under_the_lock_does_not_poison_it() {
        let m = Arc::new(Mutex::new(7));
        let other = m.clone();
        let panicked = std::thread::spawn(move || {
            let _guard = other.lock();
            panic!("under the lock");
        });
        assert!(panicked.join().is_err());
        assert_eq!(*m.lock(), 7);
    }
}
