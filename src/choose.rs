//! The chooser (issue 23, over spec §5): which candidate host gets a new conversation, and
//! whether a conversation's busy host is worth leaving.
//!
//! A pure function over a snapshot the caller builds from config, health, drains, the limiter,
//! the lease table and what hosts hold (`holdings`). It does no I/O, takes no locks and keeps no
//! state; it is O(candidates).
//!
//! Order: usable hosts only (healthy, not draining, serving the model); a host whose forwards are
//! failing ranks last; then the model loaded, then room to load it without evicting a model in
//! use (issue 15). Among the hosts left the **estimate** decides: the time to the first token
//! there, that is prefill of the prompt less the family prefix the host holds warm, at the host's
//! measured speed, plus the expected wait for a slot (0 with one free, else (queued + 1) ÷ slots ×
//! its mean slot hold). Estimates within 10 % or 50 ms of the best are tied; ties go to the host
//! the route's own lease is on (seed 000's rule 3, now a preference, never a rule that beats
//! load), then, when slot similarity is on, to the fewer live siblings (the family's
//! conversations under way there) per unit of weight, then to the fewer live conversations per
//! slot, then to the lower share of capacity its leases hold per unit of weight, then to more
//! free slots, fewer queued, fewer leases per unit of weight (without it conversations that start
//! while every host is idle all land on the first), more weight, and the route's order.
//!
//! Live conversations are the most recently used ones across the candidates, as many as their
//! slots together: those under way, which come back for their slots. Spreading them is what a
//! sticky round-robin does by arrival order (consecutive arrivals are the ones under way
//! together); counting every lease or every placement since start counted conversations that
//! ended long ago (issue 23's agents benchmark with llama-server's defaults).
//!
//! A family prefix counts as warm only when the host has room for it: held tokens plus the prompt
//! within its capacity. Else the prompt would push the family out of its cache. Held tokens there
//! are what its slots hold — its newest conversations, one per slot — not every lease it keeps: a
//! lease outlives its conversation by `lease_idle`, its slot long since someone else's. The
//! tie-break's share still counts every lease: each is a conversation that may come back.
//!
//! Nor does it count on a host with no free slot while no slot hold has been measured: the wait
//! there is a guess (1 s), and conversations that start together (a chat UI's morning, issue
//! 23's chat benchmark) would all gather on the first warm host and queue there turn after turn.
//!
//! With llama-server's slot similarity on (its default, 0.10) a family is never gathered: a new
//! sibling takes the idle slot sharing the family prefix, and since most of that slot survives,
//! llama-server neither saves it to its RAM cache nor restores the sibling's own history from
//! there (server-context.cpp, `get_available_slot`: `f_keep < 0.5`). Two siblings on one host then
//! wipe each other's history turn after turn. There siblings are kept apart instead.

use std::cmp::Ordering;

/// One candidate host as seen at the moment of choosing, for one model.
#[derive(Debug, Clone, PartialEq)]
pub struct Info {
    pub name: String,
    pub healthy: bool,
    pub draining: bool,
    /// The host reports the model loaded (no load wait).
    pub loaded: bool,
    /// Loading the model there evicts nothing in use: always for a single-model host; for a
    /// router at its `--models-max`, only when none of its loaded models has a request in flight
    /// or a lease (a conversation whose cache the swap would wipe).
    pub room: bool,
    /// The host's config lists the model.
    pub serves: bool,
    /// Limiter seats of this host for this model: the requests it runs at once, one per
    /// llama-server slot (at least 1 when it serves the model).
    pub seats: usize,
    /// Free seats for this model, new conversations on their way there counted as taken.
    pub free: usize,
    /// Requests that would wait before this one (beyond the slots).
    pub queued: usize,
    /// Conversations (leases) the host already holds for this model.
    pub leases: usize,
    /// At least 1 (config validation).
    pub weight: u32,
    /// Tokens of the request's family prefix held warm there (0: cold, or no family).
    pub family_tokens: u64,
    /// The request's family's size in tokens, warm there or not (0: no family). What prefilling
    /// it costs the fleet again where it is cold while another candidate holds it warm.
    pub family_size: u64,
    /// Slots there are picked by prompt similarity (llama-server's default) and crossbar does not
    /// pin them: a new sibling takes a live sibling's idle slot and wipes its history.
    pub kept_apart: bool,
    /// Its RAM prompt cache gives an evicted conversation its history back: what its slots
    /// cannot hold still lasts there, so a warm family is not judged against the KV alone.
    pub ram: bool,
    /// Cold answers on reused leases there lately (issue 47): as many as its seats, and it is
    /// oversubscribed — what it holds does not last.
    pub colds: usize,
    /// Routes whose only candidate it is: among equals it keeps its room for them.
    pub reserved: usize,
    /// Its live conversations: of the most recently used conversations across the candidates,
    /// as many as their slots together, those on this host.
    pub live: usize,
    /// How many of its live conversations are siblings (the request's family); 0 without one.
    pub siblings: usize,
    /// Prefill speed, tokens per second (the host's measured one, else the route's median).
    pub prefill_tps: f64,
    /// Mean time a request holds one of its slots, ms.
    pub hold_ms: f64,
    /// `hold_ms` was measured, here or on another candidate (else it is a guess).
    pub hold_known: bool,
    /// Tokens its slots hold: its most recently used conversations' (last prompt plus
    /// completion), one per slot. Older leases' slots went to others since. For the room check.
    pub held: u64,
    /// Tokens all its leases hold, every conversation that may come back to it. For the
    /// tie-break's share of capacity.
    pub leased: u64,
    /// Tokens its KV cache holds in all; 0 when unknown.
    pub capacity: u64,
    /// The route-level lease of this model is on this host.
    pub inherited: bool,
    /// Its forwarded requests have failed since its last success.
    pub failing: bool,
}

/// Why the chosen host won, for `X-Crossbar-Placement` and the row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// Its warm family prefix made it the best estimate.
    Family,
    /// Tied with others, and the route's lease is there.
    Inherit,
    /// The least loaded by the estimate and the tie-breakers.
    LeastLoaded,
}

/// How much one more prefill of a family somewhere in the fleet weighs against a request's own
/// time to first token (issue 47): as much. Prefill is the fleet's one shared cost — a slot busy
/// prefilling a family again is a slot no conversation has — so a family gathers where its wait
/// costs less than its prefill twice, and spreads past that (a saturated host).
pub const FLEET: f64 = 1.0;

/// Slowest a host may look: a prefill speed of 0 or less is read as this.
const MIN_TPS: f64 = 1.0;
/// Estimates within this share of the best are tied...
const TIE_SHARE: f64 = 0.10;
/// ...or within this many ms.
const TIE_MS: f64 = 50.0;
/// A busy move pays off when the wait exceeds this many re-prefills of the whole prompt...
const MOVE_FACTOR: f64 = 1.5;
/// ...plus this many ms.
const MOVE_MARGIN_MS: f64 = 1000.0;

impl Info {
    /// Whether the host may take a new conversation of the model at all.
    pub fn usable(&self) -> bool {
        self.healthy && !self.draining && self.serves
    }

    /// The family prefix that counts for a prompt of `prompt` tokens. None where it would not
    /// last or not be found: the host is oversubscribed (as many cold answers lately as seats);
    /// a live sibling there would lose its slot to this request (slots picked by similarity,
    /// unpinned); its KV has no room left to keep it (held tokens plus the prompt over its
    /// capacity) and no RAM cache to keep it in; or it has no free slot while the wait for one
    /// is a guess (no slot hold measured yet).
    pub fn warm_tokens(&self, prompt: u64) -> u64 {
        let oversubscribed = self.colds >= self.seats.max(1);
        let wipes_a_sibling = self.kept_apart && self.siblings > 0;
        let over =
            !self.ram && self.capacity > 0 && self.held.saturating_add(prompt) > self.capacity;
        let full_unmeasured = self.free == 0 && !self.hold_known;
        if oversubscribed || wipes_a_sibling || over || full_unmeasured {
            0
        } else {
            self.family_tokens.min(prompt)
        }
    }

    /// What a new conversation of `prompt` tokens costs placed here: its time to first token
    /// ([`Info::estimate_ms`]), and, where its family is cold while another candidate holds it
    /// warm (`warm_elsewhere`), the family's prefill once more in the fleet, at [`FLEET`] times its
    /// time. A family gathers where the wait costs less than prefilling it again elsewhere.
    pub fn cost_ms(&self, prompt: u64, warm_elsewhere: bool) -> f64 {
        let again = warm_elsewhere && self.warm_tokens(prompt) == 0;
        let fleet = if again {
            FLEET * self.prefill_ms(self.family_size.min(prompt))
        } else {
            0.0
        };
        self.estimate_ms(prompt) + fleet
    }

    /// Milliseconds to prefill `tokens` here.
    pub fn prefill_ms(&self, tokens: u64) -> f64 {
        tokens as f64 * 1000.0 / self.prefill_tps.max(MIN_TPS)
    }

    /// Expected milliseconds before a slot is free for a new request.
    pub fn wait_ms(&self) -> f64 {
        if self.free > 0 {
            0.0
        } else {
            (self.queued + 1) as f64 / self.seats.max(1) as f64 * self.hold_ms
        }
    }

    /// The time to the first token of a new conversation of `prompt` tokens here.
    pub fn estimate_ms(&self, prompt: u64) -> f64 {
        self.prefill_ms(prompt - self.warm_tokens(prompt)) + self.wait_ms()
    }

    /// Tokens of the host's leases against its capacity (`by_capacity`), per unit of weight (a
    /// heavier host takes proportionally more); tokens per unit of weight otherwise.
    fn held_share(&self, by_capacity: bool) -> f64 {
        let weight = f64::from(self.weight.max(1));
        if by_capacity {
            self.leased as f64 / self.capacity as f64 / weight
        } else {
            self.leased as f64 / weight
        }
    }
}

/// The host for a new conversation of `prompt` tokens among `infos` (in the route's order), and
/// why it won; `None` when no host is usable.
pub fn best(infos: &[Info], prompt: u64) -> Option<(&Info, Why)> {
    let usable: Vec<(usize, &Info)> = infos
        .iter()
        .enumerate()
        .filter(|(_, i)| i.usable())
        .collect();
    // The class: not failing, loaded, room. Only the best class competes on the estimate.
    let class = |i: &Info| (!i.failing, i.loaded, i.room);
    let top = usable.iter().map(|(_, i)| class(i)).max()?;
    let best_class: Vec<(usize, &Info)> = (usable.into_iter())
        .filter(|(_, i)| class(i) == top)
        .collect();
    let warm_somewhere = (best_class.iter()).any(|(_, i)| i.warm_tokens(prompt) > 0);
    let contenders: Vec<(usize, &Info, f64)> = (best_class.into_iter())
        .map(|(at, i)| (at, i, i.cost_ms(prompt, warm_somewhere)))
        .collect();
    let least = (contenders.iter())
        .map(|(_, _, e)| *e)
        .fold(f64::INFINITY, f64::min);
    let tied = |e: f64| e <= least * (1.0 + TIE_SHARE) || e <= least + TIE_MS;
    let (_, winner, _) = (contenders.iter())
        .filter(|(_, _, e)| tied(*e))
        .max_by(|(pa, a, _), (pb, b, _)| tie_break(a, b).then(pb.cmp(pa)))?;
    let why = if winner.warm_tokens(prompt) > 0 {
        Why::Family
    } else if winner.inherited {
        Why::Inherit
    } else {
        Why::LeastLoaded
    };
    Some((winner, why))
}

/// `Greater` when `a` should win a tie over `b`, on everything but route order.
fn tie_break(a: &Info, b: &Info) -> Ordering {
    // x / host.weight against the other's, without division: `n` times the other's weight.
    let per_weight = |n: usize, other: &Info| n as u64 * u64::from(other.weight);
    // The same per seat.
    let per_seat = |n: usize, other: &Info| n as u64 * other.seats.max(1) as u64;
    // Siblings count where they would take each other's slots.
    let siblings = |i: &Info| if i.kept_apart { i.siblings } else { 0 };
    // Shares of capacity only when both capacities are known: a share against raw tokens would
    // send every conversation to whichever host's `/props` was read last.
    let by_capacity = a.capacity > 0 && b.capacity > 0;
    let held = |i: &Info| i.held_share(by_capacity);
    a.inherited
        .cmp(&b.inherited)
        .then(per_weight(siblings(b), a).cmp(&per_weight(siblings(a), b)))
        .then(per_seat(b.colds, a).cmp(&per_seat(a.colds, b)))
        .then(b.reserved.cmp(&a.reserved))
        .then(per_seat(b.live, a).cmp(&per_seat(a.live, b)))
        .then(held(b).total_cmp(&held(a)))
        .then(a.free.cmp(&b.free))
        .then(b.queued.cmp(&a.queued))
        .then(per_weight(b.leases, a).cmp(&per_weight(a.leases, b)))
        .then(a.weight.cmp(&b.weight))
}

/// Where a conversation whose host is `current` should go instead, when waiting there is worse
/// than starting over (issue 23's `move_when_busy`): the current host's expected wait exceeds
/// 1.5 × re-prefilling the whole prompt on the best candidate with a free slot, plus 1 s.
/// `others` are the route's other hosts; the best one is the quickest to prefill the prompt
/// among the usable, loaded, not failing ones with a free slot.
pub fn busy_move<'a>(current: &Info, others: &'a [Info], prompt: u64) -> Option<&'a Info> {
    if current.free > 0 {
        return None;
    }
    let wait = current.wait_ms();
    let best = (others.iter())
        .filter(|i| i.usable() && i.loaded && !i.failing && i.free > 0 && i.name != current.name)
        .min_by(|a, b| a.prefill_ms(prompt).total_cmp(&b.prefill_ms(prompt)))?;
    (wait > MOVE_FACTOR * best.prefill_ms(prompt) + MOVE_MARGIN_MS).then_some(best)
}

#[cfg(test)]
pub(crate) mod tests;
