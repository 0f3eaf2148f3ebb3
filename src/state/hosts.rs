//! What each host is, as crossbar knows it now (issue 47): the config's overrides over what the
//! host reports (`health`) and what crossbar learned of it (`learn`). [`seats`] is how many
//! requests crossbar runs there at once; [`Gateway::pinning`] whether it picks the host's slots;
//! and the poll hook ([`Watch`]) keeps both true as hosts answer: the limiter's seats follow the
//! host's slots, a configured value the host contradicts is a warning (once per change), a host
//! that restarted has what it held forgotten, an exclusive host running a task crossbar did not
//! start stops being pinned, and a host seen for the first time (or with a new build) is probed
//! while it is idle.
//!
//! Runs on each host's poller thread; the probe is its only network I/O, and no lock is held
//! across it (the seats it holds are the limiter's RAII hold).

use std::sync::atomic::Ordering;
use std::time::SystemTime;

use crate::config::{Config, Host};
use crate::health::{Health, Seen, Watch};
use crate::learn::{self, Answered};
use crate::logfmt::val;
use crate::store::unix_ms;

use super::Gateway;

/// Limiter seats of `host` for configured `model`: the slots the host says it runs for the model,
/// or the config's `parallel` where set — the smaller of the two when both say, as crossbar must
/// never run more at once than the host does; 1 while neither says; 0 when the host does not
/// serve the model (a router that does not list it).
pub fn seats(config: &Config, health: &Health, host: &str, model: &str) -> usize {
    let Some(configured) = (config.hosts.get(host)).and_then(|h| h.models.get(model)) else {
        return 0;
    };
    if health.serves(host, model) == Some(false) {
        return 0;
    }
    let reported = health.slots_for(host, model).map(|n| n as usize);
    match (*configured, reported) {
        (Some(configured), Some(reported)) => configured.min(reported),
        (Some(n), None) | (None, Some(n)) => n,
        (None, None) => 1,
    }
}

/// [`Gateway::pinning`], for the placement view, which has no gateway.
pub(super) fn pinning(host: &Host, health: &Health, learned: &learn::Learned, now: i64) -> bool {
    host.exclusive
        && health.own_slots(&host.name).is_some()
        && learned.similarity(&host.name) != Some(false)
        && learned.get(&host.name).is_none_or(|h| h.quiet(now))
}

impl Gateway {
    /// Whether crossbar has `host` copy its idle slots to RAM before a conversation's turn that
    /// needs it (`proxy/stash.rs`): a single-model host of two slots or more that picks a slot by
    /// age alone (similarity off) and whose RAM cache gives a history back, as far as the config
    /// or the evidence says. Such a host is never pinned ([`Gateway::pinning`]).
    pub fn stashes(&self, host: &Host) -> bool {
        let name = host.name.as_str();
        self.health.own_slots(name).is_some_and(|n| n >= 2)
            && self.learned.similarity(name) == Some(false)
            && self.learned.ram(name) == Some(true)
    }

    /// Limiter seats of `host` for `model` now ([`seats`]).
    pub fn seats(&self, host: &str, model: &str) -> usize {
        seats(&self.config(), &self.health, host, model)
    }

    /// Whether crossbar picks `host`'s slots now: the host is declared `exclusive`, is a
    /// single-model host whose slots `/props` told, picks slots by similarity (or is not known
    /// not to: with similarity off it is stashed instead, `proxy/stash.rs`), and showed no task
    /// crossbar did not start within the last [`learn::QUIET_MS`].
    pub fn pinning(&self, host: &Host) -> bool {
        pinning(
            host,
            &self.health,
            &self.learned,
            unix_ms(SystemTime::now()),
        )
    }

    /// The limiter's seats for every model of `host`, as [`seats`] says now.
    fn sync_seats(&self, config: &Config, host: &Host) {
        for model in host.models.keys() {
            let n = seats(config, &self.health, &host.name, model);
            self.limiter.set_capacity(&host.name, model, n);
        }
    }

    /// Warnings about what the host says against the config: a `parallel` above the host's own
    /// slots, and the learned evidence against a configured similarity. Each is logged once
    /// while it stands; all are kept for the status.
    fn contradictions(&self, host: &Host) -> Vec<String> {
        let mut notes = Vec::new();
        for (model, configured) in &host.models {
            let reported = self.health.slots_for(&host.name, model);
            if let (Some(configured), Some(reported)) = (configured, reported) {
                if *configured as u64 > reported {
                    notes.push(format!(
                        "hosts.{}.models.{model}.parallel is {configured} but the host runs \
                         {reported} slots: crossbar sends it {reported} at once; fix -np or the key",
                        host.name
                    ));
                }
            }
        }
        notes.extend(self.learned.notes(&host.name));
        if let (None, Some(ctx)) = (host.kv_tokens, self.health.unified_guess(&host.name)) {
            notes.push(format!(
                "kv cache guessed: the host runs 4 slots that each report the model's training \
                 context ({ctx} tokens), as llama-server's automatic -np does, sharing one KV cache \
                 of {ctx} tokens; crossbar counts {ctx} in all. Start it with an explicit -np, or \
                 set hosts.{}.kv_tokens",
                host.name
            ));
        }
        notes
    }

    /// What a poll of `host` showed that says it restarted: it came up again after being down,
    /// its task ids went back, its build changed. `None` when nothing does.
    fn restart(&self, host: &Host, seen: Option<&Seen>) -> Option<&'static str> {
        let status = self.health.get(&host.name)?;
        let mut facts = self.host_facts.lock();
        let facts = facts.entry(host.name.clone()).or_default();
        let mut why = None;
        if status.ups > facts.ups {
            why = Some("it was down and answers again");
        }
        facts.ups = status.ups;
        if let Some(task) = seen.and_then(|s| s.slots.max_task) {
            if facts.max_task.is_some_and(|last| task < last) {
                why = Some("its task ids went back");
            }
            facts.max_task = Some(task);
        }
        if let Some(build) = &status.build {
            if facts.build.as_ref().is_some_and(|last| last != build) {
                why = Some("its build changed");
            }
            facts.build = Some(build.clone());
        }
        why
    }

    /// Forgets what `host` held (warm families, the slot mirror) and asks its facts again.
    fn forget(&self, host: &str, why: &str) {
        self.holdings.forget_host(host);
        self.slots.forget_host(host);
        self.learned.restarted(host);
        log::info!(
            "host restarted host={} why={}: its warm families, slots and ram cache are forgotten",
            val(host),
            val(why)
        );
    }

    /// Probes `host` while it is idle (every seat crossbar has there held meanwhile, so nothing
    /// of crossbar's runs beside it); a busy host is probed at a later poll.
    fn probe(&self, host: &Host, slots: u64) {
        let Some(_held) = self.limiter.hold_idle(&host.name) else {
            return;
        };
        let now = unix_ms(SystemTime::now());
        let nonce = now.unsigned_abs() ^ PROBES.fetch_add(1, Ordering::Relaxed);
        let answers = crate::upstream::probe::run(self.upstream.side(), host, slots, nonce);
        // The probe's prompts now fill the slots it used: nothing crossbar pinned is there.
        self.slots.forget_host(&host.name);
        match answers {
            Ok(answers) => {
                let (similarity, ram) = learn::read_probe(&answers);
                let word = |b: Option<bool>| match b {
                    Some(true) => "on",
                    Some(false) => "off",
                    None => "unknown",
                };
                log::info!(
                    "host probed host={} similarity={} ram_cache={}",
                    val(&host.name),
                    word(similarity),
                    word(ram)
                );
                self.learned
                    .probed(&host.name, Some((similarity, ram)), now);
            }
            Err(err) => log::debug!(
                "host probe failed host={} error={}",
                val(&host.name),
                val(&err)
            ),
        }
    }

    /// The slot mirror of each model of an exclusive `host`: made (or resized to the host's slots)
    /// with every slot in doubt since `since`.
    pub fn prepare_slots(&self, host: &Host, since: i64) {
        if !host.exclusive {
            return;
        }
        for model in host.models.keys() {
            let count = self.seats(&host.name, model);
            (self.slots).prepare_pair((&host.name, model), count, since);
        }
    }

    /// What `host` says against the config now (each also logged once while it stands).
    pub fn host_notes(&self, host: &str) -> Vec<String> {
        (self.host_facts.lock().get(host)).map_or_else(Vec::new, |f| f.notes.clone())
    }

    /// Whether and why crossbar pins `host`'s slots now, as the status says it.
    pub fn pinning_shown(&self, host: &Host) -> String {
        let now = unix_ms(SystemTime::now());
        let learned = self.learned.get(&host.name);
        if !host.exclusive {
            "off (not exclusive)".to_string()
        } else if let Some(at) = learned
            .as_ref()
            .and_then(|l| l.foreign_at)
            .filter(|_| !learned.as_ref().is_some_and(|l| l.quiet(now)))
        {
            format!(
                "paused: a task crossbar did not send, {} s ago",
                (now - at).max(0) / 1000
            )
        } else if self.health.own_slots(&host.name).is_none() {
            "waiting: the host has not told its slots (a router is never pinned)".to_string()
        } else if self.learned.similarity(&host.name) == Some(false) {
            "off: the host picks slots by age; crossbar keeps each conversation's last turn in its \
             RAM cache instead (stash)"
                .to_string()
        } else {
            "on".to_string()
        }
    }

    /// A reused conversation's turn on `host` came back `warm` or not, its slot taken by others
    /// since its last turn or not: the passive checks' evidence (`learn::Learned::answered`).
    /// Conversations coming back cold one after another with nothing to explain it say the host
    /// restarted between two polls: what it held is forgotten.
    pub fn answered(&self, host: &str, answer: Answered) {
        if (self.learned).answered(host, answer, unix_ms(SystemTime::now())) {
            self.forget(
                host,
                "reused conversations came back cold with their slots untouched",
            );
        }
    }
}

/// Probes started since the process did: part of each probe's nonce.
static PROBES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// What the poll hook remembers of a host between polls, to see a restart.
#[derive(Debug, Default)]
pub(super) struct Facts {
    ups: u64,
    max_task: Option<u64>,
    build: Option<String>,
    /// The warnings last logged, so each is logged once while it stands.
    notes: Vec<String>,
    /// Polls in a row that showed more busy slots than crossbar had requests there.
    foreign: u32,
    /// Polls this hook has finished with.
    polls: u64,
}

impl Watch for Gateway {
    fn in_flight(&self, host: &str) -> usize {
        self.limiter.in_flight_on(host)
    }

    fn polled(&self, host: &Host, seen: Option<&Seen>, before: usize) {
        self.watch(host, seen, before);
        let mut facts = self.host_facts.lock();
        facts.entry(host.name.clone()).or_default().polls += 1;
    }
}

impl Gateway {
    /// Polls of `host` whose results crossbar has acted on (seats, restarts, the probe).
    pub fn polls_seen(&self, host: &str) -> u64 {
        (self.host_facts.lock().get(host)).map_or(0, |f| f.polls)
    }

    fn watch(&self, host: &Host, seen: Option<&Seen>, before: usize) {
        let config = self.config();
        // The config as it is now: a reload may have changed the host since its poller started.
        let Some(host) = config.hosts.get(&host.name) else {
            return;
        };
        self.sync_seats(&config, host);
        let Some(status) = self.health.get(&host.name) else {
            return;
        };
        if !status.healthy {
            return;
        }
        if let Some(why) = self.restart(host, seen) {
            self.forget(&host.name, why);
        }
        let notes = self.contradictions(host);
        {
            let mut facts = self.host_facts.lock();
            let facts = facts.entry(host.name.clone()).or_default();
            for note in notes.iter().filter(|n| !facts.notes.contains(n)) {
                log::warn!(
                    "host contradicts the config host={} {note}",
                    val(&host.name)
                );
            }
            facts.notes = notes;
        }
        if let Some(seen) = seen {
            self.watch_slots(host, seen, before);
        }
        let due = self.learned.polled(&host.name, status.build.as_deref());
        if let (true, false, Some(slots)) = (due, status.router, status.total_slots) {
            self.probe(host, slots);
        }
    }
}

impl Gateway {
    /// What `/slots` showed: the pinning mirror's doubts cleared; and, on an exclusive host, a
    /// slot busy with a task crossbar did not start (more busy slots than crossbar had requests
    /// there both as the poll started and now, two polls in a row: a request crossbar cancelled
    /// may run on for a moment) stops pinning there for a quiet while.
    fn watch_slots(&self, host: &Host, seen: &Seen, before: usize) {
        if host.exclusive {
            // In doubt since just before this poll, which then clears what it saw idle.
            self.prepare_slots(host, seen.started - 1);
            self.slots.saw(&host.name, seen.started, &seen.slots);
        }
        let ours = before.max(self.limiter.in_flight_on(&host.name));
        let excess = seen.slots.busy.len() > ours;
        let mut facts = self.host_facts.lock();
        let facts = facts.entry(host.name.clone()).or_default();
        facts.foreign = if excess { facts.foreign + 1 } else { 0 };
        if host.exclusive && facts.foreign >= 2 {
            let now = unix_ms(SystemTime::now());
            let was_quiet = self.learned.get(&host.name).is_none_or(|h| h.quiet(now));
            self.learned.foreign(&host.name, now);
            if was_quiet {
                log::warn!(
                    "exclusive host runs tasks crossbar did not send host={} busy={} ours={ours}: \
                     slots are not pinned there until it is quiet for {} minutes",
                    val(&host.name),
                    seen.slots.busy.len(),
                    learn::QUIET_MS / 60_000
                );
            }
        }
    }
}
