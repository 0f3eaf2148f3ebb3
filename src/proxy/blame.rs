//! What a failed forward says about its host (issue 24: health judged by what the host did). A
//! fresh connection refused or timed out: the host is down at once. A request that may have
//! reached it (a first-byte timeout, a malformed answer, a reset or a break mid-answer): a 502 for
//! that request alone, one more in the host's failure streak, and an early health poll. Either way
//! new conversations avoid it until it answers again. A request the HTTP library could not build
//! is the client's, never the host's.

use std::time::SystemTime;

use crate::health::DownReason;
use crate::state::Gateway;
use crate::store::unix_ms;

/// Counts a failure against `host`: `refused` when a fresh connection was refused or timed out,
/// else one that may have reached it, on `path`. A router loading the model (it was not loaded
/// when this request left) may take longer than `first_byte_timeout`: that is a slow load, not a
/// dead host (issue 15).
pub(super) fn host_failed(
    gw: &Gateway,
    (host, model): (&str, &str),
    path: &str,
    refused: bool,
    error: &str,
) {
    gw.holdings.failed(host);
    let kind = if refused { "connect" } else { "reached" };
    gw.metrics.observe_forward_failure("host", kind);
    let loading = (gw.health.model_state(host, model)).is_some_and(|state| state != "loaded");
    if loading {
        return;
    }
    let reason = DownReason::ForwardFailed {
        path: path.to_string(),
        error: error.to_string(),
    };
    let now = unix_ms(SystemTime::now());
    if refused {
        gw.health.mark_down(host, reason, now);
    } else {
        gw.health.request_failed(host, reason, now);
        gw.health.poke(host);
    }
}

/// Failures that happen before a connection exists: nothing of the request reached the host.
pub(super) fn connect_failed(err: &ureq::Error) -> bool {
    use std::io::ErrorKind as K;
    use ureq::Error as E;
    match err {
        E::Timeout(ureq::Timeout::Connect | ureq::Timeout::Resolve) => true,
        E::HostNotFound | E::ConnectionFailed => true,
        E::Io(e) => matches!(
            e.kind(),
            K::ConnectionRefused | K::TimedOut | K::HostUnreachable | K::NetworkUnreachable
        ),
        _ => false,
    }
}

/// Whether a failure before the response head is the host's (it cannot be reached, timed out, or
/// answered something that is not HTTP) rather than a request that could not be built. Only the
/// host's failures mark it down.
pub(super) fn counts_against_host(err: &ureq::Error) -> bool {
    use ureq::Error as E;
    !matches!(err, E::Http(_) | E::BadUri(_) | E::InvalidProxyUrl)
}
