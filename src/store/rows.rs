//! The rows the store reads and writes, as the rest of the crate sees them: leases and pins, lease
//! events with their reasons (spec §6), and per-request accounting rows.

use std::fmt;

/// Whether a `leases` row is a conversation's lease or a route's pin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    /// A lease taken by traffic; stored as `active`.
    Active,
    /// An operator's pin (`fp = model = ''`); stored as `pinned`.
    Pinned,
}

/// One row of the `leases` table. Times are unix milliseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRow {
    pub route: String,
    pub fp: String,
    pub model: String,
    pub host: String,
    pub state: LeaseState,
    pub created: i64,
    pub last_used: i64,
}

/// Why a lease event happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// A lease was created.
    New,
    /// A lease left a host that was not healthy.
    Unhealthy,
    /// A lease expired after `lease_idle`.
    Idle,
    /// An operator released a route, or unpinned it.
    Release,
    /// An operator pinned a route.
    Pin,
    /// The context guard moved a conversation to a host where its prompt fits.
    Ctx,
    /// A config reload removed the lease's host.
    Removed,
    /// The table was at `max_leases`: the least recently used idle lease made room.
    Evicted,
    /// Its host was so busy that starting over elsewhere was quicker (`move_when_busy`, issue 23).
    Busy,
    /// Its last answer showed its host had lost its cache, and it was placed again as if new
    /// (issue 47).
    Cold,
}

/// One row of the `lease_events` table; `id` is 0 until stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseEvent {
    pub id: i64,
    pub at: i64,
    pub route: String,
    pub fp: String,
    pub model: String,
    pub reason: Reason,
    pub from_host: String,
    pub to_host: String,
}

/// One row of the `requests` table; `id` is 0 until stored. Token counts are `None` when the
/// upstream did not report them (stored as NULL, never as 0).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestRow {
    pub id: i64,
    pub started: i64,
    pub route: String,
    /// The API the request spoke (`crate::api::Api::name`); `""` in rows older than the column.
    pub api: String,
    pub fp: String,
    pub model: String,
    pub host: String,
    pub queued_ms: i64,
    pub ttfb_ms: i64,
    pub total_ms: i64,
    pub status: u16,
    pub streamed: bool,
    pub prompt_tokens: Option<i64>,
    pub cached_tokens: Option<i64>,
    pub completion_tokens: Option<i64>,
    pub err: String,
    /// The context guard's estimate of the prompt (bytes / 4 × 1.2); `None` when the guard did
    /// not look (metadata, or refused before).
    pub ctx_est: Option<i64>,
    /// The prompt's exact token count, when the guard asked a host for it (the estimate did not
    /// fit); `None` otherwise.
    pub ctx_exact: Option<i64>,
    /// The request's prompt family, 8 hex digits (`""`: none, or a row older than the column).
    pub family: String,
    /// Why it went where it went (`crate::lease::Placed::as_str`; `""` in older rows).
    pub placed: String,
    /// The configured name of its client key (issue 25); `""` without keys. Never the key.
    pub key: String,
}

impl LeaseState {
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseState::Active => "active",
            LeaseState::Pinned => "pinned",
        }
    }
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::New => "new",
            Reason::Unhealthy => "unhealthy",
            Reason::Idle => "idle",
            Reason::Release => "release",
            Reason::Pin => "pin",
            Reason::Ctx => "ctx",
            Reason::Removed => "removed",
            Reason::Evicted => "evicted",
            Reason::Busy => "busy",
            Reason::Cold => "cold",
        }
    }

    pub(crate) const ALL: [Reason; 10] = [
        Reason::New,
        Reason::Unhealthy,
        Reason::Idle,
        Reason::Release,
        Reason::Pin,
        Reason::Ctx,
        Reason::Removed,
        Reason::Evicted,
        Reason::Busy,
        Reason::Cold,
    ];
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for LeaseState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
