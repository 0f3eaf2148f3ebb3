//! What crossbar keeps of a request it answers before its route and key are known (issue 46):
//! a count per reason in `/metrics` (`crossbar_refused_total{listener="clients"}`, beside the
//! connection layer's) and a log line per reason at most once a second, saying how many there
//! were since the last — never an accounting row. A stranger's flood of wrong keys, unknown
//! routes or preflights wrote a row each, kept 90 days: 15–20k rows a second from one address
//! filled a 40 MiB disk in 6 s, and a valid key's new conversations got `503 store
//! unavailable`. Which refusals keep their row is the request path's to say (`proxy/record.rs`).
//! No I/O but the log.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::logfmt::val;
use crate::metrics::Metrics;

/// Log lines per reason: at most one a second.
const EVERY: Duration = Duration::from_secs(1);

/// Per reason, the answers since its last log line and when that line was. Invariant: reasons
/// are crossbar's own constants (`unauthorized`, `unknown_route`, `preflight`...: tokens, never
/// a client's text), so the table has a handful of entries.
#[derive(Debug, Default)]
pub struct Unrouted(Mutex<Vec<(&'static str, u64, Instant)>>);

impl Unrouted {
    /// Counts one answer of `status` for `reason` to `peer`, and logs it when its reason's line
    /// is due: the first of a burst at once, then one a second with the count since the last.
    pub fn answered(
        &self,
        metrics: &Metrics,
        reason: &'static str,
        status: u16,
        peer: Option<IpAddr>,
    ) {
        metrics.observe_refused("clients", reason);
        let since = {
            let mut table = self.0.lock();
            let now = Instant::now();
            match table.iter_mut().find(|(r, ..)| *r == reason) {
                Some((_, n, at)) => {
                    *n += 1;
                    if at.elapsed() < EVERY {
                        return;
                    }
                    *at = now;
                    std::mem::take(n)
                }
                None => {
                    table.push((reason, 0, now));
                    1
                }
            }
        };
        let peer = peer.map_or_else(|| "-".to_string(), |ip| ip.to_string());
        log::info!(
            "answered before routing listener=clients status={status} reason={reason} peer={} count={since}",
            val(&peer)
        );
    }
}
