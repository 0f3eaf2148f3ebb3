//! The lease table's window on live host state: its `HostView` (health, drains) and its
//! `Chooser`, which builds the chooser's snapshot of each candidate (`choose::Info`) from the
//! config, health, the limiter and what hosts hold, then asks `choose`. Called with the lease
//! table's lock held: it takes the other locks one at a time (but holdings inside the limiter, to
//! count each request once) and never calls back into the table.

use std::sync::Arc;

use parking_lot::RwLock;

use super::Drains;
use crate::choose;
use crate::config::Config;
use crate::health::Health;
use crate::holdings::Holdings;
use crate::lease::{self, Placed};
use crate::limiter::Limiter;

/// A prefill speed for a route none of whose hosts has measured one yet (then all tie on it).
const DEFAULT_TPS: f64 = 1000.0;
/// A slot hold for a host+model that has given none back yet, when no other host has either.
const DEFAULT_HOLD_MS: f64 = 1000.0;
/// Measured prefill speeds within this factor of the route's median count as the median. Three
/// identical real llama-servers (issue 23's agents benchmark, sharing two cores) measured within
/// 1.9x of their median in 10 of 12 runs, 2.1x and 3x in the others, and 2.7x and 3.3x in two
/// runs later, from a few prefills each (hence `holdings::MIN_SPEED_SAMPLES`); placing by that
/// noise sent 10 to 20 of 24 new conversations to one host, and wiped one family's histories turn
/// after turn. A faster host mistaken for an equal one costs little: it takes its share, and the wait
/// in the estimate still sends work away from a slower host's queue. A CPU host beside a GPU, or
/// an old card beside a new one, is a larger factor.
const SPEED_NOISE: f64 = 4.0;

/// The lease table's window on live host state.
pub(super) struct View {
    pub(super) config: Arc<RwLock<Arc<Config>>>,
    pub(super) health: Arc<Health>,
    pub(super) limiter: Arc<Limiter>,
    pub(super) drains: Arc<Drains>,
    pub(super) holdings: Arc<Holdings>,
    pub(super) learned: Arc<crate::learn::Learned>,
    pub(super) slots: crate::slots::Slots,
}

impl lease::HostView for View {
    fn healthy(&self, host: &str) -> bool {
        self.health.healthy(host)
    }

    fn draining(&self, host: &str) -> bool {
        self.drains.contains(host)
    }
}

impl lease::Chooser for View {
    fn choose(
        &self,
        candidates: &[lease::Candidate],
        model: &str,
        ask: &lease::Ask,
        now: i64,
    ) -> Option<(String, Placed)> {
        let infos = self.infos(candidates, model, ask, now);
        let (info, why) = choose::best(&infos, ask.prompt)?;
        let placed = match why {
            choose::Why::Family => Placed::Family,
            choose::Why::Inherit => Placed::Inherit,
            choose::Why::LeastLoaded => Placed::LeastLoaded,
        };
        if ask.slot || ask.family.is_some() {
            (self.holdings).placed(&info.name, model, ask.family, ask.slot, now);
        }
        Some((info.name.clone(), placed))
    }

    fn busy_move(
        &self,
        current: &lease::Candidate,
        others: &[lease::Candidate],
        model: &str,
        ask: &lease::Ask,
        now: i64,
    ) -> Option<String> {
        // Cheap first: most turns find a free slot on their host and look no further.
        let load = self.limiter.load(&current.host, model);
        if load.in_flight + load.queued < load.parallel {
            return None;
        }
        let mut all = Vec::with_capacity(others.len() + 1);
        all.push(current.clone());
        all.extend_from_slice(others);
        let mut infos = self.infos(&all, model, ask, now);
        let current = infos.remove(0);
        let to = choose::busy_move(&current, &infos, ask.prompt)?
            .name
            .clone();
        (self.holdings).placed(&to, model, ask.family, ask.slot, now);
        Some(to)
    }
}

impl View {
    /// The chooser's snapshot of each candidate for a request of `model` (`ask`), in order. A
    /// host that has not measured its prefill speed or slot hold yet gets the median of those that
    /// have (the candidates' pooled speed when none has), and so does one whose speed is within
    /// [`SPEED_NOISE`] of it. Locks taken one at a time (config, then per host health, then
    /// limiter with holdings inside, then holdings alone).
    fn infos(
        &self,
        candidates: &[lease::Candidate],
        model: &str,
        ask: &lease::Ask,
        now: i64,
    ) -> Vec<choose::Info> {
        let config = self.config.read().clone();
        let offered: Vec<(&crate::config::Host, &lease::Candidate)> = candidates
            .iter()
            .filter_map(|c| Some((config.hosts.get(&c.host)?, c)))
            .collect();
        let slots: Vec<usize> = (offered.iter())
            .map(|(host, _)| super::seats(&config, &self.health, &host.name, model))
            .collect();
        let family = ask.family.map(|f| f.id);
        let live = live(offered.iter().map(|(_, c)| *c), &slots, family);
        let asked = Asked { model, ask, now };
        let mut infos: Vec<choose::Info> = (offered.iter().zip(live))
            .map(|((host, c), live)| self.info(&config, (host, c), live, &asked))
            .collect();
        let pooled = (self.holdings).pooled_tps(offered.iter().map(|(h, _)| h.name.as_str()));
        settle_measures(&mut infos, pooled);
        infos
    }

    /// One candidate; an unmeasured speed or hold is left at 0 for [`View::infos`] to fill.
    fn info(
        &self,
        config: &Config,
        (host, c): (&crate::config::Host, &lease::Candidate),
        live: Live,
        asked: &Asked<'_>,
    ) -> choose::Info {
        let Asked { model, ask, now } = *asked;
        let name = &host.name;
        // Read together: an arrival leaves the holdings in the limiter's turn that counts it in
        // line or in a slot, so each request is counted once (lock order: limiter, holdings).
        let (load, facts) = (self.limiter).load_with(name, model, |load| {
            (load, self.holdings.facts(name, model, ask.family, now))
        });
        let busy = load.in_flight + load.queued + facts.arriving;
        let parallel = super::seats(config, &self.health, name, model);
        // A full router evicts one of its loaded models to load this one: no room when any of
        // them is in use — a request in flight, or a conversation leased there whose cache the
        // swap would wipe (health's lock is released before the limiter's is taken).
        let room = match self.health.full_router(name) {
            None => true,
            Some(loaded) => !(loaded.iter())
                .any(|m| c.leased_models.contains(m) || self.limiter.in_flight(name, m) > 0),
        };
        let capacity = capacity(&self.health, host, model, parallel);
        // Unknown until the host is probed: llama-server's default (on) until then.
        let similarity = self.learned.similarity(name).unwrap_or(true);
        // Pinned now, not just pinning: while a request there goes unpinned, so does every other,
        // and under steady load that lasts. Real agents on llama-server's defaults, `exclusive`,
        // families gathered: 0.63 × the oracle's prefill with 2 s pauses (167 of 168 pinned);
        // without pauses, gathering whatever the pins did, 2.17 × (114 unpinned).
        let pinned = super::hosts::pinning(host, &self.health, &self.learned, now)
            && self.slots.pins_now(name, model);
        let learned = self.learned.get(name);
        let colds = learned.as_ref().map_or(0, |l| l.recent_colds(now));
        // Unknown: as without one, the KV alone.
        let ram = learned.is_some_and(|l| l.ram.value == Some(true));
        let reserved = (config.routes.values())
            .filter(|r| r.hosts.len() == 1 && r.hosts[0] == *name)
            .count();
        choose::Info {
            name: name.clone(),
            healthy: self.health.healthy(name),
            draining: self.drains.contains(name),
            loaded: self.health.is_loaded(name, model),
            room,
            serves: parallel > 0,
            seats: parallel,
            free: parallel.saturating_sub(busy),
            queued: busy.saturating_sub(parallel),
            leases: c.leases,
            weight: host.weight,
            family_tokens: facts.family_tokens,
            family_size: facts.family_size,
            // Siblings take each other's slots where llama-server picks them by similarity and
            // crossbar does not pin them now (issue 23's agents benchmark): a family gathers
            // there only while no sibling is live (`choose::Info::warm_tokens`).
            kept_apart: similarity && !pinned,
            ram,
            colds,
            reserved,
            siblings: live.siblings,
            live: live.all,
            prefill_tps: facts.prefill_tps.unwrap_or(0.0),
            hold_ms: load.hold_ms.unwrap_or(0.0),
            hold_known: load.hold_ms.is_some(),
            held: c.held_newest.iter().take(parallel).map(|h| h.tokens).sum(),
            leased: c.leased,
            capacity,
            inherited: c.inherited,
            failing: facts.failing,
        }
    }
}

/// What the request being placed asks: its model, its prompt and family, and when.
#[derive(Clone, Copy)]
struct Asked<'a> {
    model: &'a str,
    ask: &'a lease::Ask,
    now: i64,
}

/// One candidate's share of the conversations that are live across the candidates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Live {
    /// Its conversations among the live ones.
    all: usize,
    /// Those of them of the request's family.
    siblings: usize,
}

/// Each candidate's share of the live conversations: the most recently used ones across all
/// candidates, as many as their slots together (`slots`, in the candidates' order). Those are
/// the conversations under way (agents between turns, sub-agents, users typing); older leases
/// are mostly conversations that ended, whose slots are anyone's. Counting a host's newest per
/// slot instead (its own slots) hid a crowded host's third and fourth live conversations and
/// drew more to it (issue 23's agents benchmark on real servers); counting every lease, or
/// every placement since start, counted conversations that ended long ago.
fn live<'c>(
    candidates: impl Iterator<Item = &'c lease::Candidate>,
    slots: &[usize],
    family: Option<u32>,
) -> Vec<Live> {
    let mut newest: Vec<(i64, usize, Option<u32>)> = candidates
        .enumerate()
        .flat_map(|(at, c)| (c.held_newest.iter()).map(move |h| (h.last_used, at, h.family)))
        .collect();
    newest.sort_unstable_by_key(|n| std::cmp::Reverse(n.0));
    let mut live = vec![Live::default(); slots.len()];
    for (_, at, f) in newest.into_iter().take(slots.iter().sum()) {
        live[at].all += 1;
        if family.is_some() && f == family {
            live[at].siblings += 1;
        }
    }
    live
}

/// How many tokens `host`'s KV cache holds for `model`: its `kv_tokens`, else its slots times the
/// per-slot context it reports (0 while unknown). With unified KV (llama-server's automatic `-np`)
/// every slot reports the whole pool: where the host looks like that (`Health::unified_guess`),
/// the pool once, a guess the status shows; `kv_tokens` overrides (docs/OPERATIONS.md).
pub(super) fn capacity(
    health: &Health,
    host: &crate::config::Host,
    model: &str,
    parallel: usize,
) -> u64 {
    host.kv_tokens.unwrap_or_else(|| {
        if let Some(pool) = health.unified_guess(&host.name) {
            return pool;
        }
        let per_slot = health.ctx_for(&host.name, model).unwrap_or(0);
        per_slot.saturating_mul(parallel as u64)
    })
}

/// Gives a host without a measured prefill speed or slot hold the median of the others' (when
/// none has one: the speed `pooled` from all their prefills, else a default), and one whose speed
/// is within [`SPEED_NOISE`] of the median the median itself. The pooled speed keeps the scale of
/// a prefill saved against a wait right while no host has prefilled enough to stand apart (the
/// agents benchmark: most turns prefill under 512 tokens, and no host reached 8 long prefills in
/// a run, so every estimate used the default 1,000 tokens/s where the hosts ran 2,000-6,000).
fn settle_measures(infos: &mut [choose::Info], pooled: Option<f64>) {
    let tps = median(infos.iter().map(|i| i.prefill_tps).filter(|t| *t > 0.0)).or(pooled);
    let hold = median(infos.iter().map(|i| i.hold_ms).filter(|h| *h > 0.0));
    for info in infos {
        let noise = |m: f64| (m / SPEED_NOISE..=m * SPEED_NOISE).contains(&info.prefill_tps);
        if info.prefill_tps <= 0.0 || tps.is_some_and(noise) {
            info.prefill_tps = tps.unwrap_or(DEFAULT_TPS);
        }
        if info.hold_ms <= 0.0 {
            info.hold_ms = hold.unwrap_or(DEFAULT_HOLD_MS);
            info.hold_known = hold.is_some();
        }
    }
}

/// The median of `xs` (the upper one of an even count), `None` when empty.
fn median(xs: impl Iterator<Item = f64>) -> Option<f64> {
    let mut xs: Vec<f64> = xs.collect();
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn speeds(tps: &[f64]) -> Vec<f64> {
        speeds_pooled(tps, None)
    }

    fn speeds_pooled(tps: &[f64], pooled: Option<f64>) -> Vec<f64> {
        let mut infos: Vec<choose::Info> = tps.iter().map(|&t| unmeasured(t)).collect();
        settle_measures(&mut infos, pooled);
        assert!(infos
            .iter()
            .all(|i| i.hold_ms == DEFAULT_HOLD_MS && !i.hold_known));
        infos.iter().map(|i| i.prefill_tps).collect()
    }

    #[test]
    fn a_slot_hold_measured_on_one_candidate_is_a_measure_for_all() {
        let measured = choose::Info {
            hold_ms: 800.0,
            hold_known: true,
            ..unmeasured(0.0)
        };
        let mut infos = vec![unmeasured(0.0), measured];
        settle_measures(&mut infos, None);
        let holds: Vec<(f64, bool)> = infos.iter().map(|i| (i.hold_ms, i.hold_known)).collect();
        assert_eq!(holds, [(800.0, true), (800.0, true)]);
    }

    /// A candidate with a free slot whose prefill speed is `tps` (0: unmeasured) and whose slot
    /// hold is unmeasured.
    fn unmeasured(tps: f64) -> choose::Info {
        choose::Info {
            loaded: true,
            free: 1,
            prefill_tps: tps,
            hold_ms: 0.0,
            hold_known: false,
            ..crate::choose::tests::host("")
        }
    }

    #[test]
    fn identical_hosts_measured_apart_by_noise_count_as_equally_fast() {
        // Unmeasured: the others' median; when no host has measured, their pooled speed, else
        // the default.
        assert_eq!(speeds(&[0.0, 0.0]), [DEFAULT_TPS, DEFAULT_TPS]);
        assert_eq!(speeds_pooled(&[0.0, 0.0], Some(3_500.0)), [3_500.0; 2]);
        assert_eq!(speeds(&[0.0, 800.0, 1200.0]), [1200.0, 1200.0, 1200.0]);
        assert_eq!(
            speeds_pooled(&[0.0, 800.0, 1200.0], Some(3_500.0)),
            [1200.0; 3]
        );
        // Identical hosts as real runs measured them: within 4x of the median they tie on
        // speed, even the 3x and 3.3x that sent one host most new conversations.
        assert_eq!(speeds(&[3234.0, 1787.0, 5405.0]), [3234.0; 3]);
        assert_eq!(speeds(&[746.0, 674.0, 2271.0]), [746.0; 3]);
        assert_eq!(speeds(&[12076.0, 3654.0, 3654.0]), [3654.0; 3]);
        // A host more than four times as fast or slow (a GPU beside a CPU) is not noise.
        assert_eq!(speeds(&[1000.0, 1000.0, 4500.0]), [1000.0, 1000.0, 4500.0]);
        assert_eq!(speeds(&[200.0, 1000.0, 1000.0]), [200.0, 1000.0, 1000.0]);
    }

    /// A candidate holding conversations `(last used, family)`, newest first as the table lists.
    fn holding(host: &str, convs: &[(i64, Option<u32>)]) -> lease::Candidate {
        let mut held_newest: Vec<lease::Resident> = (convs.iter())
            .map(|&(last_used, family)| lease::Resident {
                tokens: 1_000,
                family,
                last_used,
            })
            .collect();
        held_newest.sort_by_key(|h| std::cmp::Reverse(h.last_used));
        lease::Candidate {
            host: host.to_string(),
            leases: convs.len(),
            leased: 1_000 * convs.len() as u64,
            held_newest,
            leased_models: Vec::new(),
            inherited: false,
        }
    }

    fn counts(
        candidates: &[lease::Candidate],
        slots: &[usize],
        family: Option<u32>,
    ) -> Vec<(usize, usize)> {
        (live(candidates.iter(), slots, family).into_iter())
            .map(|l| (l.all, l.siblings))
            .collect()
    }

    #[test]
    fn live_conversations_are_the_newest_across_hosts_as_many_as_their_slots() {
        // Two hosts of two slots: the four newest conversations anywhere are live. "crowded" has
        // three of them (its own two newest would hide the third); "quiet" kept five that ended.
        let crowded = holding("crowded", &[(90, Some(1)), (80, Some(2)), (70, Some(1))]);
        let quiet = holding(
            "quiet",
            &[
                (85, Some(1)),
                (20, Some(1)),
                (15, Some(2)),
                (10, None),
                (5, Some(1)),
            ],
        );
        let both = [crowded, quiet];
        assert_eq!(counts(&both, &[2, 2], Some(1)), [(3, 2), (1, 1)]);
        assert_eq!(counts(&both, &[2, 2], Some(2)), [(3, 1), (1, 0)]);
        // No family: no siblings; a conversation of unknown family is no sibling either.
        assert_eq!(counts(&both, &[2, 2], None), [(3, 0), (1, 0)]);
        // More slots, more live: with 8 every conversation is, ended or not.
        assert_eq!(counts(&both, &[4, 4], Some(1)), [(3, 2), (5, 3)]);
        // Nothing held anywhere: nothing live.
        let empty = [holding("a", &[]), holding("b", &[])];
        assert_eq!(counts(&empty, &[2, 2], Some(1)), [(0, 0), (0, 0)]);
    }
}
