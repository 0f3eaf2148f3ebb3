//! Unit tests only: waiting, boundedly, for a condition the code under test changes (another
//! thread's effect), instead of sleeping a guessed time.

use std::time::{Duration, Instant};

/// How long a condition may take before the test fails.
const BOUND: Duration = Duration::from_secs(10);

/// Looks at `cond` until it holds; fails the test, naming `what`, after [`BOUND`]. The pause
/// between looks only spares the CPU.
#[track_caller]
pub(crate) fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + BOUND;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::park_timeout(Duration::from_millis(1));
    }
}
