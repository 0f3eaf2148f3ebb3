//! The lease decision (seed 000's rules, rule 3 a preference since issue 23, and issue 23's move
//! off a busy host) and the places a request without a lease goes. A
//! new or moved lease is decided under the lock and then written the way `write` writes every
//! change: reserved (so a concurrent turn of the same conversation waits for it and the chooser
//! counts it), committed with the lock released, put in memory. A reused lease's `last_used` is
//! changed in memory at once and written behind.

use std::sync::Arc;

use super::write::Change;
use super::{Acquired, Ask, Candidate, Hold, Inner, Key, LeaseError, Placed, Table};
use crate::logfmt::val;
use crate::store::Reason;

/// What the rules decided under the lock.
enum Step {
    /// An existing lease serves; nothing to wait for.
    Done(Acquired),
    /// A lease to create or move: written first, then put in memory.
    Write {
        host: String,
        reason: Reason,
        from: String,
        placed: Placed,
    },
}

/// No conversation moves off a busy host twice within this long (unix ms).
pub const BUSY_MOVE_EVERY: i64 = 10 * 60_000;

impl Table {
    /// Seed 000's rules, then the write a new or moved lease needs. `candidates` are remembered
    /// as seen for the route in the same turn of the lock, unless a write failed; with `hold`,
    /// the request is marked in flight on its lease in that turn too (no moment unheld).
    pub(super) fn acquire_inner(
        &self,
        key: &Key,
        candidates: &[String],
        now: i64,
        ask: &Ask,
        hold: bool,
    ) -> Result<(Acquired, Option<Hold>), LeaseError> {
        let mut inner = self.lock();
        self.settle_key(&mut inner, key)?;
        let step = self.decide(&mut inner, key, candidates, now, ask);
        if !matches!(step, Ok(Step::Write { .. })) {
            inner.see_all(&key.route, candidates);
        }
        let held = match step? {
            Step::Done(acquired) => {
                let held = if hold { inner.hold(key) } else { None };
                return Ok((acquired, self.hold_of(held)));
            }
            Step::Write {
                host,
                reason,
                from,
                placed,
            } => {
                let mut held = None;
                let change = Change {
                    to: &host,
                    reason,
                    from: &from,
                    owner: ask.client,
                };
                self.put_reserved(inner, key, change, now, |inner| {
                    inner.see_all(&key.route, candidates);
                    if let Some(entry) = inner.leases.get_mut(key) {
                        entry.family = ask.family.map(|f| f.id).or(entry.family);
                        if placed == Placed::Busy {
                            entry.busy_moved = now;
                        }
                    }
                    if hold {
                        held = inner.hold(key);
                    }
                })?;
                let reused = false;
                (
                    Acquired {
                        host,
                        reused,
                        placed,
                    },
                    held,
                )
            }
        };
        Ok((held.0, self.hold_of(held.1)))
    }

    fn hold_of(&self, key: Option<Arc<Key>>) -> Option<Hold> {
        key.map(|key| Hold {
            shared: self.shared.clone(),
            key,
        })
    }

    /// Seed 000's rules in order, deciding without writing (a touch is written behind). Rule 3
    /// (inherit the route-level lease) is a preference the chooser weighs since issue 23, never a
    /// rule that beats load; rule 2 may give way to a move off a busy host where the route allows.
    fn decide(
        &self,
        inner: &mut Inner,
        key: &Key,
        candidates: &[String],
        now: i64,
        ask: &Ask,
    ) -> Result<Step, LeaseError> {
        // 1. A pin outranks everything, health included.
        if let Some(pin) = inner.pins.get(&key.route).cloned() {
            if !self.hosts.healthy(&pin) {
                return Err(LeaseError::PinnedDown { host: pin });
            }
            let from = match inner.leases.get(key) {
                Some(lease) if lease.host == pin => {
                    inner.touch(key, now);
                    return Ok(Step::Done(Acquired {
                        host: pin,
                        reused: true,
                        placed: Placed::Pinned,
                    }));
                }
                Some(lease) => lease.host.clone(),
                None => String::new(),
            };
            let reason = if from.is_empty() {
                Reason::New
            } else {
                Reason::Pin
            };
            return Ok(Step::Write {
                host: pin,
                reason,
                from,
                placed: Placed::Pinned,
            });
        }

        // 2. The key's own lease, on a healthy host (draining or not), stays put — unless the
        //    route moves conversations off a busy host and this one is worth moving.
        let mut moving_from = None;
        if let Some(lease) = inner.leases.get(key) {
            if lease.cold && self.hosts.healthy(&lease.host) {
                return self.replace_cold(inner, key, candidates, now, ask);
            }
            if self.hosts.healthy(&lease.host) {
                let host = lease.host.clone();
                if let Some(to) = self.busy_move(inner, key, &host, candidates, now, ask) {
                    return Ok(Step::Write {
                        host: to,
                        reason: Reason::Busy,
                        from: host,
                        placed: Placed::Busy,
                    });
                }
                inner.touch(key, now);
                return Ok(Step::Done(Acquired {
                    host,
                    reused: true,
                    placed: Placed::Sticky,
                }));
            }
            moving_from = Some(lease.host.clone());
        }

        // 3 and 4. Choose among usable candidates, the route-level lease's host (a new
        //    conversation's only) offered as inherited; nothing is created when there is none.
        let inherit = moving_from.is_none() && !key.fp.is_empty();
        let offer = Offer {
            excluded: moving_from.as_deref(),
            inherit,
            stay: None,
        };
        let (host, placed) = self.choose_locked(inner, key, candidates, offer, now, ask)?;
        Ok(match moving_from {
            Some(from) => Step::Write {
                host,
                reason: Reason::Unhealthy,
                from,
                placed: Placed::Unhealthy,
            },
            None => Step::Write {
                host,
                reason: Reason::New,
                from: String::new(),
                placed,
            },
        })
    }

    /// Issue 23's wait-or-move: where `key`'s conversation on `host` should go instead, when its
    /// route allows it, it has not moved for that within [`BUSY_MOVE_EVERY`], and the chooser
    /// finds waiting on `host` costlier than starting over elsewhere.
    fn busy_move(
        &self,
        inner: &Inner,
        key: &Key,
        host: &str,
        candidates: &[String],
        now: i64,
        ask: &Ask,
    ) -> Option<String> {
        let lease = inner.leases.get(key)?;
        if !ask.move_when_busy || (lease.busy_moved > 0 && now - lease.busy_moved < BUSY_MOVE_EVERY)
        {
            return None;
        }
        let current = candidate(inner, &key.model, host, None);
        let others: Vec<Candidate> = (candidates.iter())
            .filter(|h| h.as_str() != host)
            .filter(|h| self.hosts.healthy(h) && !self.hosts.draining(h))
            .map(|h| candidate(inner, &key.model, h, None))
            .collect();
        let to = (self.chooser).busy_move(&current, &others, &key.model, ask, now)?;
        others.iter().any(|c| c.host == to).then_some(to)
    }

    /// Where a request that holds no lease goes (metadata, see `proxy::route::is_metadata`): the
    /// route's pin (an error when it is down), else the key's own lease on a healthy host, else the
    /// chooser's pick. Reads only: nothing is created, touched or recorded.
    pub(super) fn lookup_locked(
        &self,
        inner: &Inner,
        key: &Key,
        candidates: &[String],
        now: i64,
    ) -> Result<String, LeaseError> {
        if let Some(pinned) = self.pinned_locked(inner, &key.route) {
            return pinned;
        }
        match inner.leases.get(key) {
            Some(lease) if self.hosts.healthy(&lease.host) => Ok(lease.host.clone()),
            _ => {
                let ask = Ask::default();
                Ok(self
                    .choose_locked(inner, key, candidates, Offer::default(), now, &ask)?
                    .0)
            }
        }
    }

    /// The route's pin, when it has one: its host, or an error when that host is down (a pin
    /// outranks health: no silent move).
    fn pinned_locked(&self, inner: &Inner, route: &str) -> Option<Result<String, LeaseError>> {
        let pin = inner.pins.get(route)?;
        Some(if self.hosts.healthy(pin) {
            Ok(pin.clone())
        } else {
            Err(LeaseError::PinnedDown { host: pin.clone() })
        })
    }

    /// Where a stateless request goes (embeddings, rerank: no conversation, no lease): the
    /// route's pin (an error when it is down), else the chooser's pick — never a lease, not even
    /// the route-level one, so such requests spread over the hosts. Reads only.
    pub(super) fn place_locked(
        &self,
        inner: &Inner,
        key: &Key,
        candidates: &[String],
        now: i64,
        ask: &Ask,
    ) -> Result<Acquired, LeaseError> {
        let (host, placed) = match self.pinned_locked(inner, &key.route) {
            Some(pinned) => (pinned?, Placed::Pinned),
            None => self.choose_locked(inner, key, candidates, Offer::default(), now, ask)?,
        };
        Ok(Acquired {
            host,
            reused: false,
            placed,
        })
    }

    /// A lease whose last answer showed its host had lost its cache (issue 47) is placed again as
    /// if new: what it held there is gone, so only load and warm families decide. Its host, which
    /// prefilled it whole on that turn, is preferred among equals; a move is event `cold`.
    fn replace_cold(
        &self,
        inner: &mut Inner,
        key: &Key,
        candidates: &[String],
        now: i64,
        ask: &Ask,
    ) -> Result<Step, LeaseError> {
        let Some(entry) = inner.leases.get_mut(key) else {
            return Err(LeaseError::NoHost);
        };
        entry.cold = false;
        let current = entry.host.clone();
        let offer = Offer {
            excluded: None,
            inherit: false,
            stay: Some(&current),
        };
        let (host, _) = self.choose_locked(inner, key, candidates, offer, now, ask)?;
        if host == current {
            inner.touch(key, now);
            return Ok(Step::Done(Acquired {
                host,
                reused: true,
                placed: Placed::Cold,
            }));
        }
        Ok(Step::Write {
            host,
            reason: Reason::Cold,
            from: current,
            placed: Placed::Cold,
        })
    }

    /// The chooser's pick among healthy, non-draining candidates (as `offer` says), each
    /// offered with its lease count and held tokens for the model (reservations included).
    fn choose_locked(
        &self,
        inner: &Inner,
        key: &Key,
        candidates: &[String],
        offer: Offer<'_>,
        now: i64,
        ask: &Ask,
    ) -> Result<(String, Placed), LeaseError> {
        let parent = (offer.inherit)
            .then(|| route_lease_host(inner, key))
            .flatten()
            .or(offer.stay);
        let usable: Vec<Candidate> = candidates
            .iter()
            .filter(|h| Some(h.as_str()) != offer.excluded)
            .filter(|h| self.hosts.healthy(h) && !self.hosts.draining(h))
            .map(|h| candidate(inner, &key.model, h, parent))
            .collect();
        match self.chooser.choose(&usable, &key.model, ask, now) {
            Some((host, placed)) if usable.iter().any(|c| c.host == host) => Ok((host, placed)),
            Some((host, _)) => {
                log::debug!(
                    "lease chooser picked a host it was not offered host={}",
                    val(&host)
                );
                Err(LeaseError::NoHost)
            }
            None => Err(LeaseError::NoHost),
        }
    }
}

/// Which candidates the chooser is offered: all but `excluded` (the host a conversation is
/// leaving), the route-level lease's host marked inherited when `inherit` (a new conversation's),
/// or the host it `stay`s on unless another is better (a conversation placed again after a cold
/// answer).
#[derive(Debug, Clone, Copy, Default)]
struct Offer<'a> {
    excluded: Option<&'a str>,
    inherit: bool,
    stay: Option<&'a str>,
}

/// `host` as the chooser sees it for a lease of `model`; `parent`: the host of the route-level
/// lease a new conversation may inherit.
fn candidate(inner: &Inner, model: &str, host: &str, parent: Option<&str>) -> Candidate {
    Candidate {
        host: host.to_string(),
        leases: inner.leases_of(model, host),
        leased: inner.held_on(model, host),
        held_newest: (inner.held_newest(model, host))
            .take(super::HELD_NEWEST)
            .collect(),
        leased_models: inner.models_on(host),
        inherited: parent == Some(host),
    }
}

/// The host of the route-level lease of `key`'s model, if there is one.
fn route_lease_host<'i>(inner: &'i Inner, key: &Key) -> Option<&'i str> {
    let route_key = Key {
        route: key.route.clone(),
        fp: String::new(),
        model: key.model.clone(),
    };
    inner.leases.get(&route_key).map(|l| l.host.as_str())
}
