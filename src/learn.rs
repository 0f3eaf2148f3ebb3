//! What crossbar learns about each host that llama-server reports in no endpoint (issue 47):
//! whether it picks an idle slot by prompt similarity (`--slot-prompt-similarity` above 0), and
//! whether its RAM prompt cache gives an evicted conversation its history back (`--cache-ram`);
//! whether anything but crossbar uses an `exclusive` host; and the cold answers and restarts that
//! say what it holds is gone.
//!
//! Two sources, each shown with its evidence: the probe (`probe.rs`'s answers, read here by
//! [`read_probe`]), sent once at first contact and again when the host's `build_info` changes or
//! it restarts; and passive checks of what crossbar sent and what came back ([`Learned::answered`]),
//! which may revise what the probe found. "Unknown" until there is evidence; a config key still
//! overrides, and a configured value the evidence contradicts is a warning ([`Learned::notes`]).
//!
//! Pure bookkeeping under one lock: no I/O, no clock (`now` is a parameter). Bounded: one entry
//! per configured host, a few counters each.

use std::collections::BTreeMap;

use parking_lot::Mutex;

/// A fact about a host, as far as crossbar knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Belief {
    /// `None`: unknown.
    pub value: Option<bool>,
    pub source: Source,
    /// When the value was last set, unix ms (0: never).
    pub at: i64,
}

/// Where a belief comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Nothing yet.
    None,
    /// The config says so (`slot_prompt_similarity`); the host is not asked.
    Config,
    /// The probe found it.
    Probe,
    /// What answers showed since (passive checks).
    Seen,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::None => "unknown",
            Source::Config => "config",
            Source::Probe => "probe",
            Source::Seen => "answers",
        }
    }
}

impl Belief {
    const UNKNOWN: Belief = Belief {
        value: None,
        source: Source::None,
        at: 0,
    };

    fn set(&mut self, value: Option<bool>, source: Source, now: i64) {
        *self = Belief {
            value,
            source,
            at: now,
        };
    }

    /// "on", "off" or "unknown", with its source: how status shows it.
    pub fn shown(&self, on: &'static str, off: &'static str) -> String {
        match self.value {
            Some(true) => format!("{on} ({})", self.source.as_str()),
            Some(false) => format!("{off} ({})", self.source.as_str()),
            None => "unknown".to_string(),
        }
    }
}

/// What one probe sent and got back: each step's slot (the answer's `id_slot`) and cached tokens
/// (`timings.cache_n`), against the tokens of the prompt it measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Step {
    pub slot: Option<u64>,
    pub cached: u64,
}

/// The probe's answers (see `upstream/probe.rs` for what each step sends).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeAnswers {
    /// Two slots or more: Q pinned to slot 0, P pinned to slot 1, then P plus a few words left to
    /// the host (`choice`), then the RAM test (`ram`): with similarity on, an unrelated prompt
    /// pinned to slot 0 and Q plus a few words pinned there after it; with it off, Q plus a few
    /// words left to the host. `tokens`: Q's and P's length, as the host counted them.
    Slots {
        choice: Step,
        ram: Step,
        tokens: u64,
    },
    /// One slot: a prompt, an unrelated one, the first again (`ram`); then a family's two
    /// siblings and the first again (`sibling`). `tokens`: the first prompt's; `family`: the
    /// siblings' shared start.
    OneSlot {
        ram: Step,
        sibling: Step,
        tokens: u64,
        family: u64,
    },
}

/// What a probe's answers say: similarity on or off (or unknown), RAM cache or not.
pub fn read_probe(answers: &ProbeAnswers) -> (Option<bool>, Option<bool>) {
    let hit = |step: &Step, tokens: u64| step.cached * 2 >= tokens.max(1);
    match *answers {
        // Similarity sends P plus a few words to slot 1, which holds P; least-recently-used
        // choice to slot 0, the older. Anything else (a slot in use by someone else) says nothing.
        ProbeAnswers::Slots {
            choice,
            ram,
            tokens,
        } => {
            let similarity = match choice.slot {
                Some(1) if hit(&choice, tokens) => Some(true),
                Some(0) => Some(false),
                _ => None,
            };
            let ram = similarity.map(|_| hit(&ram, tokens));
            (similarity, ram)
        }
        // One slot: the RAM test works either way (an unrelated prompt is no sibling). A sibling
        // then takes the only slot; with similarity off its predecessor is saved to RAM first and
        // comes back whole, with it on only the family is left. Without a RAM cache the two
        // behave alike, and the similarity is left unknown: it changes nothing there.
        ProbeAnswers::OneSlot {
            ram,
            sibling,
            tokens,
            family,
        } => {
            let ram = hit(&ram, tokens);
            let whole = sibling.cached > family + (tokens - family.min(tokens)) / 2;
            let similarity = ram.then_some(!whole);
            (similarity, Some(ram))
        }
    }
}

/// The learned facts of every configured host.
#[derive(Debug, Default)]
pub struct Learned {
    hosts: Mutex<BTreeMap<String, Host>>,
}

/// What is known of one host.
#[derive(Debug, Clone, PartialEq)]
pub struct Host {
    /// `/props` `build_info` when the facts were learned.
    pub build: Option<String>,
    pub similarity: Belief,
    pub ram: Belief,
    /// The configured similarity, when set: it wins, and evidence against it is a warning.
    pub configured: Option<bool>,
    /// The configured RAM cache, when set: it wins the same way.
    pub configured_ram: Option<bool>,
    /// What the last probe found of the similarity, kept beside a configured one.
    pub probed_similarity: Option<bool>,
    /// A probe is due: first contact, a new build, a restart.
    pub probe_due: bool,
    /// Reused conversations the RAM cache gave back after other conversations took their slot,
    /// and ones it did not (passive checks).
    pub restored: u64,
    pub lost: u64,
    /// An `exclusive` host: when a slot busy with a task crossbar did not start was last seen.
    pub foreign_at: Option<i64>,
    /// Cold answers on reused leases, most recent last (at most [`COLDS_KEPT`]), unix ms.
    pub colds: Vec<i64>,
    /// Restarts seen (a poll that failed then answered, task ids going back, a new build,
    /// reused conversations coming back cold that nothing displaced).
    pub restarts: u64,
    /// Conversations whose reused turn came back cold though no other took their slot, since the
    /// last warm one: at [`RESTART_COLDS`] of them, the host lost everything it held.
    pub unexplained: Vec<u64>,
}

/// Cold answers kept per host.
pub const COLDS_KEPT: usize = 16;
/// Cold answers count towards a host's oversubscription for this long.
pub const COLD_WINDOW_MS: i64 = 10 * 60_000;
/// An exclusive host where crossbar saw a foreign task is pinned again after this long without
/// seeing another.
pub const QUIET_MS: i64 = 5 * 60_000;
/// Reused conversations, each coming back cold with nothing to explain it (its slot not taken
/// by others), none warm between: what a host that restarted unseen between two polls shows.
pub const RESTART_COLDS: usize = 3;
/// Passive evidence that revises a probe: this many restores against none lost, or lost
/// against none restored.
const REVISE_AFTER: u64 = 3;

impl Host {
    fn fresh((configured, configured_ram): (Option<bool>, Option<bool>), now: i64) -> Host {
        let mut host = Host {
            build: None,
            similarity: Belief::UNKNOWN,
            ram: Belief::UNKNOWN,
            configured: None,
            configured_ram: None,
            probed_similarity: None,
            probe_due: true,
            restored: 0,
            lost: 0,
            foreign_at: None,
            colds: Vec::new(),
            restarts: 0,
            unexplained: Vec::new(),
        };
        host.configure((configured, configured_ram), now);
        host
    }

    /// Takes what the config says (a reload may change it): a configured fact is believed, one
    /// left to the host is asked again; nothing is asked of a host whose facts are all configured.
    fn configure(&mut self, (similarity, ram): (Option<bool>, Option<bool>), now: i64) {
        if (self.configured, self.configured_ram) == (similarity, ram) && self.build.is_some() {
            return;
        }
        (self.configured, self.configured_ram) = (similarity, ram);
        match similarity {
            Some(on) => self.similarity.set(Some(on), Source::Config, now),
            None if self.similarity.source == Source::Config => self.similarity = Belief::UNKNOWN,
            None => {}
        }
        match ram {
            Some(on) => self.ram.set(Some(on), Source::Config, now),
            None if self.ram.source == Source::Config => self.ram = Belief::UNKNOWN,
            None => {}
        }
        self.probe_due = similarity.is_none() || ram.is_none();
    }

    /// Cold answers within [`COLD_WINDOW_MS`] of `now`.
    pub fn recent_colds(&self, now: i64) -> usize {
        (self.colds.iter())
            .filter(|t| now - **t <= COLD_WINDOW_MS)
            .count()
    }

    /// Both facts come from the config: nothing to ask the host.
    pub fn all_configured(&self) -> bool {
        self.configured.is_some() && self.configured_ram.is_some()
    }

    /// Whether crossbar may pin this exclusive host's slots now: no foreign task seen within
    /// [`QUIET_MS`].
    pub fn quiet(&self, now: i64) -> bool {
        self.foreign_at.is_none_or(|at| now - at > QUIET_MS)
    }
}

/// How a reused conversation's turn came back, for the passive checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answered {
    /// Its slot had gone to other conversations since its last turn (as many as the host has
    /// slots used it since).
    pub displaced: bool,
    /// It came back with its history (cached at least half its previous prompt).
    pub warm: bool,
    /// Which conversation it was (`slots::conversation`).
    pub conversation: u64,
}

impl Learned {
    /// Keeps an entry for each of `hosts` (name; configured similarity and RAM cache, each on,
    /// off or left to the host), forgetting others; a kept host takes what the config says now.
    pub fn set_hosts<'h>(
        &self,
        hosts: impl Iterator<Item = (&'h str, (Option<bool>, Option<bool>))>,
        now: i64,
    ) {
        let mut table = self.hosts.lock();
        let mut kept = BTreeMap::new();
        for (name, configured) in hosts {
            let host = match table.remove(name) {
                Some(mut host) => {
                    host.configure(configured, now);
                    host
                }
                None => Host::fresh(configured, now),
            };
            kept.insert(name.to_string(), host);
        }
        *table = kept;
    }

    pub fn get(&self, host: &str) -> Option<Host> {
        self.hosts.lock().get(host).cloned()
    }

    /// Whether `host` picks idle slots by similarity: the config's word, else the evidence's;
    /// `None` while unknown.
    pub fn similarity(&self, host: &str) -> Option<bool> {
        self.hosts.lock().get(host)?.similarity.value
    }

    /// Whether `host`'s RAM cache gives a history back; `None` while unknown.
    pub fn ram(&self, host: &str) -> Option<bool> {
        self.hosts.lock().get(host)?.ram.value
    }

    /// The host answered a poll with `build`: a build other than the one its facts were learned
    /// on makes a probe due (the first one too). Returns whether one is due.
    pub fn polled(&self, host: &str, build: Option<&str>) -> bool {
        let mut table = self.hosts.lock();
        let Some(entry) = table.get_mut(host) else {
            return false;
        };
        if build.is_some() && entry.build.as_deref() != build {
            if entry.build.is_some() {
                entry.probe_due = true;
            }
            entry.build = build.map(str::to_string);
        }
        entry.probe_due && !entry.all_configured()
    }

    /// The host restarted (what it held is gone): its beliefs are asked again.
    pub fn restarted(&self, host: &str) {
        if let Some(entry) = self.hosts.lock().get_mut(host) {
            entry.restarts += 1;
            entry.probe_due = true;
            entry.colds.clear();
            entry.unexplained.clear();
            (entry.restored, entry.lost) = (0, 0);
        }
    }

    /// A probe of `host` ended: what it found (see [`read_probe`]), `None` when it could not run
    /// to the end (it is tried again at a later poll). The config's similarity stays.
    pub fn probed(&self, host: &str, found: Option<(Option<bool>, Option<bool>)>, now: i64) {
        let mut table = self.hosts.lock();
        let Some(entry) = table.get_mut(host) else {
            return;
        };
        let Some((similarity, ram)) = found else {
            return;
        };
        entry.probe_due = false;
        if entry.configured.is_none() {
            entry.similarity.set(similarity, Source::Probe, now);
        }
        if entry.configured_ram.is_none() {
            entry.ram.set(ram, Source::Probe, now);
        }
        (entry.restored, entry.lost) = (0, 0);
        entry.probed_similarity = similarity;
    }

    /// A reused conversation's turn on `host` came back (see [`Answered`]). A displaced one that
    /// came back warm was restored from RAM; one that came back cold was not. Enough of one kind
    /// against none of the other revises the RAM belief. A cold one is also counted as a cold
    /// answer ([`Host::recent_colds`]). Returns true when the host looks restarted: the
    /// [`RESTART_COLDS`]th conversation in a row came back cold with its slot not displaced.
    pub fn answered(&self, host: &str, answer: Answered, now: i64) -> bool {
        let mut table = self.hosts.lock();
        let Some(entry) = table.get_mut(host) else {
            return false;
        };
        if answer.warm {
            entry.unexplained.clear();
        } else {
            if entry.colds.len() == COLDS_KEPT {
                entry.colds.remove(0);
            }
            entry.colds.push(now);
            if !answer.displaced && !entry.unexplained.contains(&answer.conversation) {
                entry.unexplained.push(answer.conversation);
            }
            if entry.unexplained.len() >= RESTART_COLDS {
                return true;
            }
        }
        if !answer.displaced {
            return false;
        }
        if answer.warm {
            entry.restored += 1;
        } else {
            entry.lost += 1;
        }
        if entry.configured_ram.is_some() {
            return false;
        }
        let revised = match entry.ram.value {
            Some(false) | None if entry.restored >= REVISE_AFTER && entry.lost == 0 => Some(true),
            Some(true) | None if entry.lost >= REVISE_AFTER && entry.restored == 0 => Some(false),
            _ => None,
        };
        if let Some(value) = revised {
            log::info!(
                "host ram cache revised host={} restores={} value={}",
                crate::logfmt::val(host),
                entry.restored,
                if value { "yes" } else { "no" }
            );
            entry.ram.set(Some(value), Source::Seen, now);
        }
        false
    }

    /// What the evidence says against the config for `host`: a warning each, for the log, `check`
    /// and the status.
    pub fn notes(&self, host: &str) -> Vec<String> {
        let table = self.hosts.lock();
        let Some(entry) = table.get(host) else {
            return Vec::new();
        };
        let word = |on: bool| if on { "on" } else { "off (0)" };
        match (entry.configured, entry.probed_similarity) {
            (Some(configured), Some(found)) if configured != found => vec![format!(
                "hosts.{host}.slot_prompt_similarity says similarity is {}, but the host picks \
                 slots as with it {}: check its --slot-prompt-similarity, or leave the key out \
                 and let crossbar read it",
                word(configured),
                word(found)
            )],
            _ => Vec::new(),
        }
    }

    /// An `exclusive` host showed a slot busy with a task crossbar did not start.
    pub fn foreign(&self, host: &str, now: i64) {
        if let Some(entry) = self.hosts.lock().get_mut(host) {
            entry.foreign_at = Some(now);
        }
    }
}

#[cfg(test)]
mod tests;
