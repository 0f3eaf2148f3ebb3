//! Client keys on the request path (issue 25): who sent a request, whether the key may use the
//! route, and its limits — requests in flight and tokens per UTC day — plus the brute-force guard.
//!
//! Checked from the head alone, before the body is read or `100 Continue` sent, before any hint
//! that names routes or models. A key arrives as `Authorization: Bearer` (OpenAI SDKs),
//! `x-api-key` (the Anthropic SDK, Claude Code) or `api-key`; two that disagree, or one header
//! sent twice, are refused. Keys are compared as SHA-256 digests in constant time against every
//! configured key; the key itself is never kept, logged or recorded, only its configured name.
//!
//! State is in memory and bounded: a counter per configured key, today's tokens per configured key
//! (rebuilt from the rows at start, never a query per request), what its requests in flight have
//! reserved of them, and at most [`PEERS`] addresses with recent failures. No I/O, no clock (`now`
//! is a parameter).
//!
//! A day's budget (issue 46): 10 requests at once spent 803 tokens of a 200-token budget, as
//! admission looked only at what was spent. Now each request reserves, once its body is read,
//! what it may spend — its prompt's estimate and what it may generate — and is refused while
//! what the key spent and what its requests in flight reserved reach the budget; at its end
//! ([`Admitted::settle`]) what it spent replaces what it reserved, in one turn of the lock. So
//! requests at once spend at most the budget and one request's reservation over it.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::Config;
use crate::conn::Headers;
use crate::fasthash::HashMap;
use crate::logfmt::val;

/// Failed keys from one address within [`WINDOW_MS`] past which it is refused for a minute.
pub const MAX_FAILURES: usize = 10;
pub const WINDOW_MS: i64 = 60_000;
/// Addresses remembered for their failures; past it the one quiet longest is forgotten.
pub const PEERS: usize = 4096;
/// A day, in ms: budgets reset at 00:00 UTC.
const DAY_MS: i64 = 86_400_000;
/// What a request that sets no bound on its answer reserves for it (llama-server's own default
/// for a Messages body without `max_tokens`).
pub const DEFAULT_OUTPUT: u64 = 4096;

/// Why a request's key was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// No key: 401.
    Unauthorized,
    /// A key no configured key matches: 401, told apart from none (issue 48).
    UnknownKey,
    /// Keys that disagree, one header twice, an `Authorization` that is not `Bearer`: 401.
    Unreadable,
    /// A known key not allowed on the route: 403.
    Forbidden,
    /// Over the key's `max_in_flight`, its day's budget, or too many failures from the address:
    /// 429, retry after this many seconds.
    TooMany { retry_after: u64, why: &'static str },
}

/// The runtime side of client keys. Cheap to share behind an `Arc`.
#[derive(Debug, Default)]
pub struct Keys {
    inner: Mutex<Inner>,
}

/// Invariants: `in_flight`, `spent` and `reserved` have entries only for configured key names;
/// `reserved` is the sum of the reservations of the key's [`Admitted`] requests not yet settled;
/// `peers` holds at most [`PEERS`] addresses, each with failure times within [`WINDOW_MS`],
/// oldest first.
#[derive(Debug, Default)]
struct Inner {
    in_flight: HashMap<String, usize>,
    /// The UTC day (`now / DAY_MS`) `spent` counts, and tokens spent that day per key.
    day: i64,
    spent: HashMap<String, u64>,
    /// Tokens the key's requests in flight may still spend (issue 46).
    reserved: HashMap<String, u64>,
    peers: HashMap<IpAddr, Peer>,
}

#[derive(Debug, Default)]
struct Peer {
    failures: VecDeque<i64>,
    blocked_until: i64,
}

/// A request admitted under its key: counted in flight, holding what it reserved of the key's
/// day, until settled or dropped.
#[derive(Debug)]
pub struct Admitted {
    keys: Arc<Keys>,
    pub name: String,
    released: AtomicBool,
    /// What it reserved: its prompt's estimate and what it may generate (issue 46).
    reserved: Mutex<Reserved>,
}

/// Tokens a request reserved of its key's day.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reserved {
    /// Its prompt, as estimated from the body.
    pub prompt: u64,
    /// What it may generate: its API's limit field, or [`DEFAULT_OUTPUT`].
    pub output: u64,
}

impl Reserved {
    fn total(self) -> u64 {
        self.prompt.saturating_add(self.output)
    }
}

impl Admitted {
    /// Reserves `want()` of the key's `tokens_per_day` for this request (nothing, and `want`
    /// not asked, without a budget; once). Refused (429) while what the key spent today and what
    /// its requests in flight reserved reach the budget: until midnight when spent, in a second
    /// when reserved (those requests may leave some).
    pub fn reserve(
        &self,
        config: &Config,
        want: impl FnOnce() -> Reserved,
        now: i64,
    ) -> Result<(), Denied> {
        let Some(budget) = config.keys.get(&self.name).and_then(|k| k.tokens_per_day) else {
            return Ok(());
        };
        let want = want();
        let mut inner = self.keys.inner.lock();
        inner.roll(now);
        if let Some(denied) = inner.over(&self.name, budget, now) {
            return Err(denied);
        }
        let mut reserved = self.reserved.lock();
        if *reserved == Reserved::default() && !self.released.load(Ordering::Relaxed) {
            *reserved = want;
            let total = inner.reserved.entry(self.name.clone()).or_default();
            *total = total.saturating_add(want.total());
        }
        Ok(())
    }

    /// What this request reserved.
    pub fn reserved(&self) -> Reserved {
        *self.reserved.lock()
    }

    /// Ends the request having spent `tokens`: charged to its key's day, its reservation and
    /// its place in flight given back, in one turn of the lock (no moment where another request
    /// sees neither). Before an answer's last bytes go out, so the client's next request never
    /// finds its own finished one still counted. Once; the drop does nothing after.
    pub fn settle(&self, tokens: u64, now: i64) {
        if self.released.swap(true, Ordering::Relaxed) {
            return;
        }
        let reserved = std::mem::take(&mut *self.reserved.lock()).total();
        let mut inner = self.keys.inner.lock();
        if let Some(n) = inner.in_flight.get_mut(&self.name) {
            *n = n.saturating_sub(1);
        }
        if let Some(r) = inner.reserved.get_mut(&self.name) {
            *r = r.saturating_sub(reserved);
        }
        // (Its name was a configured key's when it was admitted.)
        if tokens > 0 {
            inner.roll(now);
            let spent = inner.spent.entry(self.name.clone()).or_default();
            *spent = spent.saturating_add(tokens);
        }
    }
}

impl Drop for Admitted {
    /// A request that never reached its end (a refusal, a panic) spent nothing.
    fn drop(&mut self) {
        self.settle(0, 0);
    }
}

/// The key a request carries: `Ok(None)` when it sends none, [`Denied::Unreadable`] when it
/// sends two that disagree, one header twice, or an `Authorization` that is not `Bearer`.
pub fn presented(headers: &Headers) -> Result<Option<&str>, Denied> {
    let mut found: Option<&str> = None;
    for name in ["authorization", "x-api-key", "api-key"] {
        let mut sent = headers.all(name);
        let Some(value) = sent.next() else {
            continue;
        };
        if sent.next().is_some() {
            return Err(Denied::Unreadable);
        }
        let value = if name == "authorization" {
            match value.split_once(' ') {
                Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token.trim(),
                _ => return Err(Denied::Unreadable),
            }
        } else {
            value.trim()
        };
        match found {
            Some(other) if other != value => return Err(Denied::Unreadable),
            _ => found = Some(value),
        }
    }
    Ok(found.filter(|v| !v.is_empty()))
}

/// The header names a key may come in: stripped from what goes upstream when keys are on.
pub fn is_key_header(name: &str) -> bool {
    ["authorization", "x-api-key", "api-key"]
        .iter()
        .any(|h| name.eq_ignore_ascii_case(h))
}

impl Keys {
    /// Who sent the request: the configured name of its key, or `None` when no keys are
    /// configured (the port is open, as before keys). `peer` is the client's address (an IPv6
    /// /64 counts as one).
    pub fn identify(
        &self,
        config: &Config,
        headers: &Headers,
        peer: IpAddr,
        now: i64,
    ) -> Result<Option<String>, Denied> {
        if config.keys.is_empty() {
            return Ok(None);
        }
        let blocked = {
            let inner = self.inner.lock();
            inner.peers.get(&peer).map_or(0, |p| p.blocked_until)
        };
        if blocked > now {
            let retry_after = ((blocked - now) as u64).div_ceil(1000);
            let why = "too many failed keys from this address";
            return Err(Denied::TooMany { retry_after, why });
        }
        let presented = presented(headers);
        let found = presented.ok().flatten().and_then(|key| {
            let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
            // Every configured key is compared, in constant time: the time taken says nothing
            // about which one came close.
            let mut hit = None;
            for k in config.keys.values() {
                if bool::from(k.hash.ct_eq(&digest)) {
                    hit = Some(k.name.clone());
                }
            }
            hit
        });
        match found {
            Some(name) => Ok(Some(name)),
            None => {
                self.failed(peer, now);
                // What was sent, never what it came close to: every refusal says only that.
                Err(match presented {
                    Ok(None) => Denied::Unauthorized,
                    Ok(Some(_)) => Denied::UnknownKey,
                    Err(denied) => denied,
                })
            }
        }
    }

    /// Admits a request of key `name` on `route`: the route must be allowed, the key under its
    /// `max_in_flight` and its day's `tokens_per_day` (what it spent and what its requests in
    /// flight reserved). The returned guard counts it in flight; what it reserves comes once its
    /// body is read ([`Admitted::reserve`]).
    pub fn admit(
        self: &Arc<Self>,
        config: &Config,
        name: &str,
        route: &str,
        now: i64,
    ) -> Result<Admitted, Denied> {
        let Some(key) = config.keys.get(name) else {
            return Err(Denied::Unauthorized);
        };
        if !key.allows(route) {
            return Err(Denied::Forbidden);
        }
        let mut inner = self.inner.lock();
        inner.roll(now);
        if let Some(denied) = (key.tokens_per_day).and_then(|budget| inner.over(name, budget, now))
        {
            return Err(denied);
        }
        let in_flight = inner.in_flight.entry(name.to_string()).or_default();
        if key.max_in_flight.is_some_and(|max| *in_flight >= max) {
            let why = "this key's max_in_flight requests are running";
            return Err(Denied::TooMany {
                retry_after: 1,
                why,
            });
        }
        *in_flight += 1;
        Ok(Admitted {
            keys: self.clone(),
            name: name.to_string(),
            released: AtomicBool::new(false),
            reserved: Mutex::new(Reserved::default()),
        })
    }

    /// Today's tokens per key as the rows have them (at start).
    pub fn rebuild(&self, today: impl IntoIterator<Item = (String, u64)>, now: i64) {
        let mut inner = self.inner.lock();
        inner.roll(now);
        for (name, tokens) in today {
            inner.spent.insert(name, tokens);
        }
    }

    /// Per configured key: tokens spent today and requests in flight now.
    pub fn usage(&self, config: &Config, now: i64) -> Vec<(String, u64, usize)> {
        let mut inner = self.inner.lock();
        inner.roll(now);
        (config.keys.keys())
            .map(|name| {
                let spent = inner.spent.get(name).copied().unwrap_or(0);
                let running = inner.in_flight.get(name).copied().unwrap_or(0);
                (name.clone(), spent, running)
            })
            .collect()
    }

    /// Counts a failed key from `peer`: past [`MAX_FAILURES`] in [`WINDOW_MS`] it is refused for
    /// a minute. Logged once per burst, with the address, never the key.
    fn failed(&self, peer: IpAddr, now: i64) {
        let mut inner = self.inner.lock();
        if !inner.peers.contains_key(&peer) && inner.peers.len() >= PEERS {
            let quiet = (inner.peers.iter())
                .min_by_key(|(_, p)| p.failures.back().copied().unwrap_or(0))
                .map(|(ip, _)| *ip);
            if let Some(ip) = quiet {
                inner.peers.remove(&ip);
            }
        }
        let entry = inner.peers.entry(peer).or_default();
        while entry.failures.front().is_some_and(|t| now - t > WINDOW_MS) {
            entry.failures.pop_front();
        }
        let first = entry.failures.is_empty();
        if entry.failures.len() <= MAX_FAILURES {
            entry.failures.push_back(now);
        }
        if first {
            log::warn!("client key refused peer={}", val(&peer.to_string()));
        }
        if entry.failures.len() > MAX_FAILURES && entry.blocked_until <= now {
            entry.blocked_until = now + WINDOW_MS;
            log::warn!(
                "client key failures peer={} failed={} blocked_s=60",
                val(&peer.to_string()),
                entry.failures.len()
            );
        }
    }
}

impl Inner {
    /// Why key `name` may spend nothing more today, if so: what it spent reaches `budget`
    /// (until midnight), or with what its requests in flight reserved (in a second).
    fn over(&self, name: &str, budget: u64, now: i64) -> Option<Denied> {
        let spent = self.spent.get(name).copied().unwrap_or(0);
        let reserved = self.reserved.get(name).copied().unwrap_or(0);
        if spent >= budget {
            let retry_after = ((DAY_MS - now.rem_euclid(DAY_MS)) as u64).div_ceil(1000);
            let why = "this key's tokens_per_day are spent; they start afresh at 00:00 UTC";
            return Some(Denied::TooMany { retry_after, why });
        }
        (spent.saturating_add(reserved) >= budget).then_some(Denied::TooMany {
            retry_after: 1,
            why: "this key's tokens_per_day are reserved by its requests in flight",
        })
    }

    /// A new UTC day starts every budget afresh.
    fn roll(&mut self, now: i64) {
        let day = now.div_euclid(DAY_MS);
        if day != self.day {
            self.day = day;
            self.spent.clear();
        }
    }
}

/// A fresh random key (256 bits from the OS) and its config hash: `crossbar key new`.
pub fn new_key() -> std::io::Result<(String, String)> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    let key = format!("cb-{}", hex(&bytes));
    let hash = format!("sha256:{}", hex(&Sha256::digest(key.as_bytes())));
    Ok((key, hash))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests;
