//! What a request is on its way through: its context ([`Ctx`]: what the client asked, the row it
//! fills, its clock) and, once it passed every check, its [`Plan`] (the host, the body as that host
//! gets it, what it did with the lease table and why it went there, and what it holds — its hold on
//! the lease, its key's turn, its slot, its pinned slot). Built by `proxy.rs` for metadata and by
//! `place.rs` for everything that takes a slot; read by every later step, ended by `end.rs`.
//! Nothing here does I/O.

use std::time::{Duration, Instant};

use crate::api::Api;
use crate::config::{Config, Host};
use crate::conn::Request;
use crate::fingerprint::Family;
use crate::holdings::Arrival;
use crate::lease::{Key, Placed};
use crate::limiter::Permit;
use crate::state::Gateway;
use crate::store::{unix_ms, RequestRow};

use super::incoming::Incoming;
use super::pin::Pinned;
use super::ProxyError;

/// Largest request body crossbar reads (it must see the body to fingerprint it).
pub const MAX_BODY: usize = 16 << 20;
pub const HOST_HEADER: &str = "X-Crossbar-Host";
pub const LEASE_HEADER: &str = "X-Crossbar-Lease";
pub const ROUTE_HEADER: &str = "X-Crossbar-Route";
pub const CTX_HEADER: &str = "X-Crossbar-Ctx";
pub const PLACEMENT_HEADER: &str = "X-Crossbar-Placement";

/// One request on its way: what every step reads and the row they fill.
pub(super) struct Ctx<'g> {
    pub(super) gw: &'g Gateway,
    pub(super) incoming: Incoming,
    pub(super) row: RequestRow,
    pub(super) clock: Instant,
    /// The prefill the host reported (tokens, µs), for its measured speed.
    pub(super) prefill: Option<(u64, u64)>,
    /// Whose request it is, once its key is known (its key, else its address): what it may hold
    /// in line and the leases it makes count against that client (issue 46).
    pub(super) client: crate::clientid::ClientId,
}

impl<'g> Ctx<'g> {
    /// Takes what the client asked out of `request` (its headers move with it).
    pub(super) fn of(gw: &'g Gateway, request: &mut Request<'_>) -> Ctx<'g> {
        Ctx {
            gw,
            clock: Instant::now(),
            incoming: Incoming::of(request),
            row: RequestRow {
                started: unix_ms(std::time::SystemTime::now()),
                ..RequestRow::default()
            },
            prefill: None,
            client: crate::clientid::ClientId::default(),
        }
    }
}

/// A request that passed every check: its host, and (unless it is stateless or metadata) its
/// lease; then what it holds until its end.
pub(super) struct Plan<'c> {
    pub(super) host: &'c Host,
    /// The conversation: route, fingerprint (empty for metadata and stateless requests), and the
    /// model as the lease table and the limiter name it (the configured name).
    pub(super) key: Key,
    pub(super) api: Api,
    pub(super) rest: String,
    pub(super) body: Vec<u8>,
    pub(super) lease: LeaseUse,
    /// Why the request went to its host (issue 23).
    pub(super) placed: Placed,
    pub(super) family: Option<Family>,
    /// Counts the request as arriving on its host until it has its slot or place in line (a
    /// chooser's placement).
    pub(super) arrival: Option<Arrival>,
    /// Whether the request takes a limiter slot: metadata never does (llama-server answers it
    /// without one, so it must not wait behind generations here).
    pub(super) slot: bool,
    pub(super) ctx_moved: Option<String>,
    /// A model listing crossbar renames: read whole within this bound on its head and again on
    /// its body (`listing.rs`); `None` for every answer relayed as it comes.
    pub(super) listing: Option<Duration>,
    /// Keeps the lease from eviction while the request runs.
    pub(super) hold: Option<crate::lease::Hold>,
    /// Counts the request against its client key's `max_in_flight` while it runs (issue 25).
    pub(super) admitted: Option<crate::keys::Admitted>,
    /// Client keys are on: the headers a key comes in never go upstream.
    pub(super) keyed: bool,
    /// Its limiter slot, once it has one.
    pub(super) permit: Option<Permit>,
    /// Its slot on an `exclusive` host, once it has its limiter slot.
    pub(super) pin: Option<Pinned>,
}

/// What a request did with the lease table, as `X-Crossbar-Lease` and the log line say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LeaseUse {
    New,
    Reused,
    /// Metadata: no lease (and no slot), so a polled model list steers nothing (issue 23).
    None,
    /// Stateless (embeddings, rerank: `Api::takes_lease`): no lease, but a slot.
    Stateless,
}

impl LeaseUse {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            LeaseUse::New => "new",
            LeaseUse::Reused => "reused",
            LeaseUse::None | LeaseUse::Stateless => "none",
        }
    }
}

impl<'c> Plan<'c> {
    /// A plan with no slot, no family, no arrival, no ctx move, no hold and nothing held yet.
    pub(super) fn new(
        host: &'c Host,
        key: Key,
        (api, rest): (Api, String),
        body: Vec<u8>,
        (lease, placed): (LeaseUse, Placed),
    ) -> Plan<'c> {
        Plan {
            host,
            key,
            api,
            rest,
            body,
            lease,
            placed,
            family: None,
            arrival: None,
            slot: false,
            ctx_moved: None,
            listing: None,
            hold: None,
            admitted: None,
            keyed: false,
            permit: None,
            pin: None,
        }
    }

    /// The model, as the lease table, the limiter and the row name it.
    pub(super) fn model(&self) -> &str {
        &self.key.model
    }

    /// The conversation it belongs to, as the slot mirror and the holdings name it; `None` for a
    /// stateless request or one without a fingerprint.
    pub(super) fn conversation(&self) -> Option<u64> {
        (self.lease != LeaseUse::Stateless && !self.key.fp.is_empty())
            .then(|| crate::slots::conversation(&self.key.fp))
    }

    /// The arrival a chooser's placement counts for this request, to give back with its slot.
    pub(super) fn arrive(&mut self, gw: &Gateway) {
        if self.placed.chosen() {
            self.arrival = Some(Arrival::of(&gw.holdings, &self.host.name, &self.key.model));
        }
    }
}

/// The body as `host` gets it: naming the model by the host's name for it (`upstream`), and
/// naming the route's model when the client named none (`named` false). Otherwise untouched.
pub(super) fn outgoing(host: &Host, body: Vec<u8>, model: &str, named: bool) -> Vec<u8> {
    let upstream = host.upstream_name(model);
    if body.is_empty() || (named && upstream == model) {
        return body;
    }
    match super::model::named(&body, upstream) {
        std::borrow::Cow::Borrowed(_) => body,
        std::borrow::Cow::Owned(changed) => changed,
    }
}

/// The config entry of a host the lease table named (it only names configured hosts).
pub(super) fn configured_host<'c>(config: &'c Config, name: &str) -> Result<&'c Host, ProxyError> {
    config
        .hosts
        .get(name)
        .ok_or_else(|| ProxyError::Internal(format!("host {name} is not configured")))
}
