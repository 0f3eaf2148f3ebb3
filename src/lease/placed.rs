//! What a placement is: why a request went where it went ([`Placed`]), and what the chooser weighs
//! beyond the candidates ([`Ask`]). Plain data, shared by the lease table, the chooser's adapter,
//! the proxy (its header and row) and the metrics.

use crate::fingerprint::Family;

/// Why a request went where it went (issue 23): `X-Crossbar-Placement`, the row's `placed`, the
/// log line and `crossbar_placements_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Placed {
    /// The conversation's own lease.
    Sticky,
    /// A new conversation, where its prompt family is warm.
    Family,
    /// A new conversation, tied for the best estimate, on the host of its route's lease.
    Inherit,
    /// A new conversation (or a stateless request), on the least loaded host by the estimate.
    LeastLoaded,
    /// Moved by the context guard: the prompt no longer fits where it was.
    Ctx,
    /// Moved because waiting on its busy host cost more than starting over (`move_when_busy`).
    Busy,
    /// Moved because its host is down.
    Unhealthy,
    /// Placed again after its host lost its cache (issue 47): stayed or moved, by the chooser.
    Cold,
    /// The route's pin.
    Pinned,
    /// No placement: metadata, or refused before one was made.
    None,
}

impl Placed {
    pub const ALL: [Placed; 10] = [
        Placed::Sticky,
        Placed::Family,
        Placed::Inherit,
        Placed::LeastLoaded,
        Placed::Ctx,
        Placed::Busy,
        Placed::Unhealthy,
        Placed::Cold,
        Placed::Pinned,
        Placed::None,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Placed::Sticky => "sticky",
            Placed::Family => "family",
            Placed::Inherit => "inherit",
            Placed::LeastLoaded => "least-loaded",
            Placed::Ctx => "ctx",
            Placed::Busy => "busy",
            Placed::Cold => "cold",
            Placed::Unhealthy => "unhealthy",
            Placed::Pinned => "pinned",
            Placed::None => "none",
        }
    }

    /// Whether the chooser made this placement (so it counted the request as arriving there).
    pub fn chosen(self) -> bool {
        matches!(
            self,
            Placed::Family
                | Placed::Inherit
                | Placed::LeastLoaded
                | Placed::Busy
                | Placed::Unhealthy
                | Placed::Cold
        )
    }
}

/// What the chooser weighs beyond the candidates, from the request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ask {
    /// The request's prompt family, if it has one.
    pub family: Option<Family>,
    /// Its prompt's size, estimated in tokens.
    pub prompt: u64,
    /// It will take a slot (counted as arriving where it is placed until it does).
    pub slot: bool,
    /// Its route lets a conversation leave a busy host (`move_when_busy`).
    pub move_when_busy: bool,
    /// Whose request it is (its key, else its address): a new lease is that client's, and one
    /// client keeps at most `max_leases_per_client` (issue 46).
    pub client: crate::clientid::ClientId,
}
