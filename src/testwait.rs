//! Unit tests only: waiting, boundedly, for a condition the code under test changes (another
//! thread's effect), instead of sleeping a guessed time.

use std::time::{Duration, Instant};

/// How long a condition may take before the test fails.
const BOUND: Duration = Duration::from_secs(10);

/// Looks at `cond` until it holds; fails the test, naming `what`, after [`BOUND`]. The pause
/// between looks only spares the CPU.
#[track_caller]
pub(crate) fn until(what: &str, cond: impl FnMut() -> bool) {
    within(BOUND, what, cond);
}

/// [`until`] with a bound of the test's own: for a condition that must hold sooner than some
/// fallback would make it hold anyway.
#[track_caller]
pub(crate) fn within(bound: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + bound;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::park_timeout(Duration::from_millis(1));
    }
}
