//! Prometheus metrics: counters and histograms fed by the request path and the lease table, gauges
//! read from live state at scrape time, rendered in the text exposition format (`render`); and the
//! last hour per host for the status page (`recent`). No I/O here.

mod histogram;
pub mod recent;
mod reload;
mod render;

use std::collections::BTreeMap;
use std::time::Duration;

use parking_lot::Mutex;

use crate::store::RequestRow;
use histogram::Histogram;
pub use recent::HourView;
pub use reload::LastReload;

/// Upper bounds (seconds) of the request-duration and time-to-first-byte histogram buckets.
const BUCKETS: &[f64] = &[
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];
/// Upper bounds (seconds) of the queue-wait histogram buckets: most waits are none at all.
const WAIT_BUCKETS: &[f64] = &[
    0.001, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0,
];

/// Counters since start. Gauges are not kept here: they are read from live state when rendered.
#[derive(Debug, Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

/// Keys are configured route and host names (or `-`), never client text: the request path
/// refuses unknown routes and models before anything is observed, so every map stays small.
#[derive(Debug, Default)]
struct Inner {
    /// (route, host) → status → requests.
    requests: Pairs<BTreeMap<u16, u64>>,
    tokens: Pairs<Tokens>,
    durations: BTreeMap<String, Histogram>,
    /// Request start to the upstream's response head, by (route, host).
    ttfb: Pairs<Histogram>,
    /// Time waiting for a slot, by (route, host).
    queue_wait: Pairs<Histogram>,
    lease_events: BTreeMap<String, u64>,
    /// Client key's configured name (issue 25) → requests and tokens (prompt plus completion).
    keys: BTreeMap<String, (u64, u64)>,
    /// (route, host) → why requests were placed there (`crate::lease::Placed`, issue 23).
    placements: Pairs<BTreeMap<String, u64>>,
    /// Accounting rows the store could not write.
    rows_lost: u64,
    /// (against `host` or `client`, kind) → forwards that failed before or during the answer.
    forward_failures: BTreeMap<(&'static str, &'static str), u64>,
    /// (listener, reason) → connections answered before a request was routed (no accounting row).
    refused: BTreeMap<(&'static str, &'static str), u64>,
    /// The last hour, per host.
    recent: BTreeMap<String, recent::Window>,
    /// Per API (`crate::api::Api::name`, `-` before the API is known): requests and tokens.
    apis: BTreeMap<String, ApiTotals>,
    /// Exclusive host → its pins and its unpinned requests' waits.
    slot_pins: BTreeMap<String, SlotPins>,
    /// Config reloads since start and the last one (issue 48).
    reloads: reload::Reloads,
}

/// One host's slot work. On a pinning host: requests sent with a slot crossbar chose, and
/// without one; of those without, the ones that waited for pins sent before them to start
/// (`crate::slots`).
#[derive(Debug, Default, Clone, Copy)]
struct SlotPins {
    pinned: u64,
    unpinned: u64,
    /// Waits that ended with the pins started, and at their bound.
    settled: u64,
    timed_out: u64,
    waited_us: u64,
    /// Slots saved to RAM before a returning conversation was pinned there, and saves that failed.
    saved: u64,
    save_failed: u64,
    /// Stashes sent before a request to a host that picks slots by age (`proxy/stash.rs`),
    /// ones that failed, and the tokens the host prefilled for them.
    stashed: u64,
    stash_failed: u64,
    stash_tokens: u64,
}

/// A map by (route, host), nested so that a request finds its entry by `&str`: a key is
/// allocated once, when the pair is first seen, never per request under the lock.
#[derive(Debug)]
struct Pairs<V>(BTreeMap<String, BTreeMap<String, V>>);

impl<V> Default for Pairs<V> {
    fn default() -> Pairs<V> {
        Pairs(BTreeMap::new())
    }
}

impl<V> Pairs<V> {
    fn at(&mut self, route: &str, host: &str, new: impl FnOnce() -> V) -> &mut V {
        at(at(&mut self.0, route, BTreeMap::new), host, new)
    }

    /// `(route, host, value)` in the order of the pair.
    fn iter(&self) -> impl Iterator<Item = (&str, &str, &V)> {
        (self.0.iter()).flat_map(|(r, hosts)| hosts.iter().map(move |(h, v)| (&**r, &**h, v)))
    }
}

/// `map[key]`, made by `new` the first time: the key is copied only then.
fn at<'m, V>(map: &'m mut BTreeMap<String, V>, key: &str, new: impl FnOnce() -> V) -> &'m mut V {
    if map.contains_key(key) {
        return map.get_mut(key).expect("looked up just above");
    }
    map.entry(key.to_string()).or_insert_with(new)
}

/// One API's requests and tokens since start (prompt includes cached, in every API).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ApiTotals {
    pub requests: u64,
    pub prompt: u64,
    pub cached: u64,
    pub completion: u64,
}

#[derive(Debug, Default, Clone, Copy)]
struct Tokens {
    prompt: u64,
    cached: u64,
    completion: u64,
}

/// Live values the renderer needs besides the counters.
#[derive(Debug, Default)]
pub struct Gauges {
    /// (host, up)
    pub hosts: Vec<(String, bool)>,
    /// (host, model, in_flight, queued)
    pub slots: Vec<(String, String, usize, usize)>,
    /// (host, leases)
    pub leases: Vec<(String, usize)>,
    /// Bytes of the bodies of requests waiting for a slot, all queues together (issue 46).
    pub queued_body_bytes: usize,
    /// Host flips since start: (host, to, why) → count.
    pub transitions: Vec<((String, &'static str, &'static str), u64)>,
    /// Whether the store's last commit succeeded, and its failed commits since start.
    pub store_ok: bool,
    pub store_write_errors: u64,
}

impl Metrics {
    pub fn observe_request(&self, row: &RequestRow) {
        let mut inner = self.inner.lock();
        let host = if row.host.is_empty() { "-" } else { &row.host };
        let route = if row.route.is_empty() {
            "-"
        } else {
            &row.route
        };
        *(inner.requests.at(route, host, BTreeMap::new))
            .entry(row.status)
            .or_default() += 1;
        let tokens = inner.tokens.at(route, host, Tokens::default);
        // Upstream numbers: any size may arrive, and a counter must not panic on them.
        let add = |total: &mut u64, n: Option<i64>| {
            *total = total.saturating_add(n.unwrap_or(0).max(0) as u64);
        };
        add(&mut tokens.prompt, row.prompt_tokens);
        add(&mut tokens.cached, row.cached_tokens);
        add(&mut tokens.completion, row.completion_tokens);
        let api = if row.api.is_empty() { "-" } else { &row.api };
        let totals = at(&mut inner.apis, api, ApiTotals::default);
        totals.requests += 1;
        add(&mut totals.prompt, row.prompt_tokens);
        add(&mut totals.cached, row.cached_tokens);
        add(&mut totals.completion, row.completion_tokens);
        at(&mut inner.durations, route, || Histogram::new(BUCKETS))
            .observe(row.total_ms.max(0) as f64 / 1000.0);
        // Only configured key names reach the row's `key`: a bounded label set.
        if !row.key.is_empty() {
            let tokens = row.prompt_tokens.unwrap_or(0).max(0) as u64
                + row.completion_tokens.unwrap_or(0).max(0) as u64;
            let entry = at(&mut inner.keys, &row.key, || (0, 0));
            entry.0 += 1;
            entry.1 = entry.1.saturating_add(tokens);
        }
        // Only crossbar's own words (lease::Placed) reach the row's `placed`: a small label set.
        if !row.placed.is_empty() && row.placed != "none" && !row.host.is_empty() {
            let reasons = inner.placements.at(route, host, BTreeMap::new);
            *at(reasons, &row.placed, || 0) += 1;
        }
        if !row.host.is_empty() {
            let positive = |n: Option<i64>| n.unwrap_or(0).max(0) as u64;
            at(&mut inner.recent, &row.host, recent::Window::default).request(
                row.started,
                positive(row.prompt_tokens),
                positive(row.cached_tokens),
            );
        }
    }

    /// The upstream's response head arrived `ms` after the request (started at `started`, unix
    /// ms) reached crossbar.
    pub fn observe_ttfb(&self, route: &str, host: &str, started: i64, ms: i64) {
        let mut inner = self.inner.lock();
        (inner.ttfb.at(route, host, || Histogram::new(BUCKETS))).observe(ms.max(0) as f64 / 1000.0);
        at(&mut inner.recent, host, recent::Window::default).ttfb(started, ms.max(0) as f64);
    }

    /// A request waited `ms` for a slot on `host` (0 when one was free).
    pub fn observe_queue_wait(&self, route: &str, host: &str, ms: i64) {
        (self.inner.lock().queue_wait)
            .at(route, host, || Histogram::new(WAIT_BUCKETS))
            .observe(ms.max(0) as f64 / 1000.0);
    }

    /// llama-server's `timings` said it prefilled `tokens` in `us` microseconds on `host`.
    pub fn observe_prefill(&self, host: &str, tokens: u64, us: u64) {
        at(&mut self.inner.lock().recent, host, recent::Window::default).prefill(tokens, us);
    }

    /// The last hour of `host` up to `now` (unix ms); empty when it served nothing yet.
    pub fn hour(&self, host: &str, now: i64) -> HourView {
        let inner = self.inner.lock();
        inner
            .recent
            .get(host)
            .map_or_else(|| recent::Window::default().hour(now), |w| w.hour(now))
    }

    /// A connection refused by the connection layer before any handler saw a request (busy, a
    /// head too large, bad framing, a head timeout). Both labels are crossbar's own constants.
    pub fn observe_refused(&self, listener: &'static str, reason: &'static str) {
        *self
            .inner
            .lock()
            .refused
            .entry((listener, reason))
            .or_default() += 1;
    }

    /// Requests and tokens per API since start, by API name.
    pub fn api_totals(&self) -> Vec<(String, ApiTotals)> {
        let inner = self.inner.lock();
        inner.apis.iter().map(|(a, t)| (a.clone(), *t)).collect()
    }

    pub fn observe_lease_event(&self, reason: &str) {
        *at(&mut self.inner.lock().lease_events, reason, || 0) += 1;
    }

    /// A forward failed: counted against the host (`connect`: refused or timed out; `reached`: it
    /// may have acted on it) or against the client (`request`: it could not be sent as asked).
    pub fn observe_forward_failure(&self, against: &'static str, kind: &'static str) {
        *(self.inner.lock().forward_failures)
            .entry((against, kind))
            .or_default() += 1;
    }

    /// A request to an exclusive host went with a slot crossbar chose (`pinned`) or without.
    pub fn observe_slot_pin(&self, host: &str, pinned: bool) {
        let mut inner = self.inner.lock();
        let counts = at(&mut inner.slot_pins, host, SlotPins::default);
        if pinned {
            counts.pinned += 1;
        } else {
            counts.unpinned += 1;
        }
    }

    /// A sibling's slot was saved to the host's RAM cache before a returning conversation was
    /// pinned there (`ok`), or the save failed and the request went unpinned.
    pub fn observe_slot_save(&self, host: &str, ok: bool) {
        let mut inner = self.inner.lock();
        let counts = at(&mut inner.slot_pins, host, SlotPins::default);
        if ok {
            counts.saved += 1;
        } else {
            counts.save_failed += 1;
        }
    }

    /// A stash was sent to `host` before a request: `tokens` it prefilled, or `None` when it
    /// failed.
    pub fn observe_stash(&self, host: &str, tokens: Option<u64>) {
        let mut inner = self.inner.lock();
        let counts = at(&mut inner.slot_pins, host, SlotPins::default);
        match tokens {
            Some(tokens) => {
                counts.stashed += 1;
                counts.stash_tokens += tokens;
            }
            None => counts.stash_failed += 1,
        }
    }

    /// A request crossbar could not pin waited `waited` for the pinned ones sent before it to
    /// start (`settled`), or until its bound.
    pub fn observe_settle_wait(&self, host: &str, settled: bool, waited: Duration) {
        let mut inner = self.inner.lock();
        let counts = at(&mut inner.slot_pins, host, SlotPins::default);
        if settled {
            counts.settled += 1;
        } else {
            counts.timed_out += 1;
        }
        let us = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
        counts.waited_us = counts.waited_us.saturating_add(us);
    }

    /// `host`'s holds of requests crossbar could not pin (see [`Metrics::observe_settle_wait`]):
    /// settled, at their bound, and their time in all.
    pub fn settle_waits(&self, host: &str) -> (u64, u64, Duration) {
        let inner = self.inner.lock();
        let c = inner.slot_pins.get(host).copied().unwrap_or_default();
        (c.settled, c.timed_out, Duration::from_micros(c.waited_us))
    }

    /// A pinning host's requests pinned and not, and its slots saved first and saves failed
    /// (for the affinity benchmark's lines).
    pub fn slot_pins(&self, host: &str) -> [u64; 4] {
        let inner = self.inner.lock();
        let c = inner.slot_pins.get(host).copied().unwrap_or_default();
        [c.pinned, c.unpinned, c.saved, c.save_failed]
    }

    /// `host`'s stashes so far: sent, failed, and the tokens it prefilled for them.
    pub fn stashes(&self, host: &str) -> [u64; 3] {
        let inner = self.inner.lock();
        let c = inner.slot_pins.get(host).copied().unwrap_or_default();
        [c.stashed, c.stash_failed, c.stash_tokens]
    }

    pub fn observe_row_lost(&self) {
        self.inner.lock().rows_lost += 1;
    }
}

#[cfg(test)]
mod tests;
