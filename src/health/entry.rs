//! One host's entry in the health table: its status, what the config says of it, and the
//! streaks its polls and forwards are on. Bookkeeping under the table's lock; no I/O.

use std::collections::BTreeMap;

use crossbeam_channel::Sender;

use super::{DownReason, HostStatus, RouterModel};
use crate::logfmt::val;

#[derive(Debug)]
pub(super) struct Entry {
    pub(super) status: HostStatus,
    /// The config's `ctx` for this host.
    pub(super) ctx_override: Option<u64>,
    /// The per-slot context the last good poll reported.
    pub(super) polled_ctx: Option<u64>,
    /// The models the config lists for this host, sorted.
    pub(super) models: Vec<String>,
    /// Configured model → the name the host knows it by, where they differ.
    pub(super) upstream: BTreeMap<String, String>,
    /// A router's model id → how often polls saw it go from loaded to not loaded (at most
    /// [`MAX_UNLOAD_COUNTS`] ids).
    pub(super) unloads: BTreeMap<String, u64>,
    /// Failed polls in a row; good polls in a row; forwards that may have reached the host and
    /// failed, in a row with no answered one between.
    pub(super) failed_polls: u32,
    pub(super) good_polls: u32,
    pub(super) streak: u32,
    /// A poll found it up at least once since start.
    pub(super) ever_up: bool,
    /// Wakes its poller early.
    pub(super) poke: Option<Sender<()>>,
}

impl Entry {
    /// The name this host knows configured `model` by.
    pub(super) fn known_as<'a>(&'a self, model: &'a str) -> &'a str {
        self.upstream.get(model).map_or(model, String::as_str)
    }

    /// A router's entry for configured `model`.
    pub(super) fn router_model(&self, model: &str) -> Option<&RouterModel> {
        let name = self.known_as(model);
        self.status.models.iter().find(|m| m.is_named(name))
    }

    pub(super) fn fresh() -> Entry {
        Entry {
            status: HostStatus {
                healthy: true,
                reason: None,
                since: 0,
                per_slot_ctx: None,
                total_slots: None,
                loaded: Vec::new(),
                router: false,
                models: Vec::new(),
                max_instances: None,
                build: None,
                ctx_train: None,
                ups: 0,
                last_poll: 0,
            },
            ctx_override: None,
            polled_ctx: None,
            models: Vec::new(),
            upstream: BTreeMap::new(),
            unloads: BTreeMap::new(),
            failed_polls: 0,
            good_polls: 0,
            streak: 0,
            ever_up: false,
            poke: None,
        }
    }

    /// Marks the entry down; logs and returns true when that changes what an operator sees.
    pub(super) fn down(&mut self, host: &str, reason: DownReason, now: i64) -> bool {
        let status = &mut self.status;
        // A down host's loaded list is stale: it may come back having loaded something else.
        status.loaded.clear();
        status.models.clear();
        if status.reason.as_ref() == Some(&reason) {
            return false;
        }
        if status.healthy {
            status.healthy = false;
            status.since = now;
        }
        log::info!(
            "host down host={} reason={}",
            val(host),
            val(&reason.to_string())
        );
        status.reason = Some(reason);
        true
    }
}

/// Names a log line shows of a host's loaded list.
const SHOWN_NAMES: usize = 8;
/// Bytes a log line shows of one name.
const SHOWN_NAME_BYTES: usize = 64;

/// The first [`SHOWN_NAMES`] of `names`, each cut to [`SHOWN_NAME_BYTES`] on a char boundary
/// (marked `...`), then `+N more`: a host's listing sizes no log line.
pub(super) fn shown_loaded(names: &[String]) -> String {
    let mut shown: Vec<String> = (names.iter().take(SHOWN_NAMES))
        .map(|name| {
            let cut = crate::logfmt::cut(name, SHOWN_NAME_BYTES);
            let more = if cut.len() < name.len() { "..." } else { "" };
            format!("{cut}{more}")
        })
        .collect();
    if names.len() > SHOWN_NAMES {
        shown.push(format!("+{} more", names.len() - SHOWN_NAMES));
    }
    shown.join(",")
}
