//! The client request path: route, peek, lease, context guard, slot, forward, record.
//!
//! [`handle`] serves one request from the client listener start to finish on the calling worker
//! thread. It owns the order of the steps and the mapping of every failure to its documented JSON
//! answer ([`ProxyError`]); the upstream exchange and streaming live in `forward`, the context guard
//! in `ctxguard`, route parsing in `route`. It never holds a lock across network I/O: the lease table,
//! limiter and health table are called between reads and writes, never around them.

mod alias;
mod count;
mod ctxguard;
mod error;
mod forward;
mod headers;
mod incoming;
mod listing;
mod model;
mod pin;
mod place;
mod record;
mod route;
mod upstream;

use std::time::Instant;

use crate::api::Api;
use crate::config::Config;
use crate::conn::{peer_key, BodyError, Request};
use crate::fingerprint::{self, Family};
use crate::holdings::Arrival;
use crate::lease::{Key, Placed};
use crate::state::Gateway;
use crate::store::{unix_ms, RequestRow};

pub use count::{Counter, PER_HOST as COUNTS_PER_HOST};
pub use error::ProxyError;
use incoming::Incoming;
use record::{log_request, record, refuse, warn_on_cold_cache};
pub use route::{normalize, resolve};
pub use upstream::{agent_config as upstream_config, Pools as UpstreamPools};

/// Largest request body crossbar reads (it must see the body to fingerprint it).
pub const MAX_BODY: usize = 16 << 20;
pub const HOST_HEADER: &str = "X-Crossbar-Host";
pub const LEASE_HEADER: &str = "X-Crossbar-Lease";
pub const ROUTE_HEADER: &str = "X-Crossbar-Route";
pub const CTX_HEADER: &str = "X-Crossbar-Ctx";
pub const PLACEMENT_HEADER: &str = "X-Crossbar-Placement";

/// A request that passed every check: its host, and (unless it is stateless or metadata) its
/// lease.
struct Plan<'a> {
    host: &'a crate::config::Host,
    api: Api,
    rest: String,
    body: Vec<u8>,
    lease: LeaseUse,
    /// Why the request went to its host (issue 23).
    placed: Placed,
    family: Option<Family>,
    /// The model, as the lease and the limiter name it.
    model: String,
    /// Counts the request as arriving on its host until it has its slot or place in line (a
    /// chooser's placement).
    arrival: Option<Arrival>,
    /// Whether the request takes a limiter slot: metadata never does (llama-server answers it
    /// without one, so it must not wait behind generations here).
    slot: bool,
    ctx_moved: Option<String>,
    /// Keeps the lease from eviction while the request runs.
    _hold: Option<crate::lease::Hold>,
    /// Counts the request against its client key's `max_in_flight` while it runs (issue 25).
    _key: Option<crate::keys::Admitted>,
    /// Client keys are on: the headers a key comes in never go upstream.
    keyed: bool,
    /// Its slot on a host with `pin_slots`, once it has its limiter slot.
    pin: Option<pin::Pinned>,
}

/// What a request did with the lease table, as `X-Crossbar-Lease` and the log line say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LeaseUse {
    New,
    Reused,
    /// Metadata: no lease (and no slot), so a polled model list steers nothing (issue 23).
    None,
    /// Stateless (embeddings, rerank: `Api::takes_lease`): no lease, but a slot.
    Stateless,
}

impl LeaseUse {
    fn as_str(self) -> &'static str {
        match self {
            LeaseUse::New => "new",
            LeaseUse::Reused => "reused",
            LeaseUse::None | LeaseUse::Stateless => "none",
        }
    }
}

/// Serves one client request completely. Never panics on client input; every outcome is answered
/// (or, when the client left, recorded as 499).
pub fn handle(gw: &Gateway, request: &mut Request<'_>) {
    let clock = Instant::now();
    let incoming = Incoming::of(request);
    let mut row = RequestRow {
        started: unix_ms(std::time::SystemTime::now()),
        ..RequestRow::default()
    };
    let config = gw.config();
    let (mut plan, key) = match prepare(gw, &config, request, &incoming, &mut row) {
        Ok(ready) => ready,
        // The body is still coming: the connection layer reads it off the workers and calls
        // again (issue 24). Nothing is answered or recorded now.
        Err(ProxyError::BodyLater) => return incoming.give_back(request),
        Err(err) => return refuse(gw, request, err, row, clock),
    };
    // A host that refused the connection got nothing: the request goes once to the next
    // candidate, the host being down now (issue 24).
    let mut retried = false;
    let exchanged = loop {
        row.placed = plan.placed.as_str().to_string();
        let permit = match take_slot(gw, &config, request, &mut plan, &key, &mut row) {
            Ok(permit) => permit,
            Err(err) => return refuse(gw, request, err, row, clock),
        };
        let client = request.socket();
        let result = forward::exchange(gw, &incoming, &plan, permit, client, &mut row, clock);
        let refused = matches!(&result, Err(ProxyError::Upstream { refused: true, .. }));
        if !refused || !plan.slot || retried {
            break result;
        }
        retried = true;
        log::info!(
            "retry on the next host refused={}",
            crate::logfmt::val(&row.host)
        );
        let what = place::What {
            incoming: &incoming,
            api: plan.api,
            rest: plan.rest.clone(),
            family: plan.family,
            named: true,
            client: client_id(request, &row),
        };
        plan = match place::again(gw, &config, &key, what, plan, &mut row) {
            Ok(plan) => plan,
            Err(err) => return refuse(gw, request, err, row, clock),
        };
    };
    match exchanged {
        Ok(answer) => {
            pin::started(&plan);
            if listing::renames(&incoming, &plan) {
                listing::relay(gw, request, &plan, answer, &mut row, clock);
            } else {
                forward::relay(gw, request, &incoming, &plan, answer, &mut row, clock);
            }
            log_request(&row, plan.lease.as_str());
            if plan.slot && plan.lease != LeaseUse::Stateless {
                warn_on_cold_cache(gw, &key, &row, plan.lease == LeaseUse::Reused);
            }
        }
        Err(err) => {
            // Its slot, if pinned, is told before the row is written (as in `forward::relay`).
            pin::abandon(&plan);
            refuse(gw, request, err, row, clock)
        }
    }
}

/// The request's slot on its host, waiting in line if need be (metadata takes none: llama-server
/// answers it without one, so it never waits behind generations here). A client that leaves while
/// queued leaves the line within a second (seed 001 step 4), and one whose slot came free just as
/// it left is never forwarded.
fn take_slot(
    gw: &Gateway,
    config: &Config,
    request: &mut Request<'_>,
    plan: &mut Plan<'_>,
    key: &Key,
    row: &mut RequestRow,
) -> Result<Option<crate::limiter::Permit>, ProxyError> {
    if !plan.slot {
        return Ok(None);
    }
    // Its place in line or its slot counts it from the moment it has one; no longer an arrival.
    let arrival = plan.arrival.take();
    let entered = move || drop(arrival);
    // Issue 46: what it holds in line counts against its client's share and all of theirs.
    let client = client_id(request, row);
    let waiter = crate::limiter::Waiter {
        client,
        bytes: plan.body.len(),
    };
    let host = &plan.host.name;
    let taken =
        (gw.limiter).acquire_unless(host, &key.model, waiter, entered, || request.client_gone());
    let (permit, waited) = taken.inspect_err(|err| {
        if *err == crate::limiter::LimitError::Timeout {
            let waited = config.queue_timeout.as_millis() as i64;
            gw.metrics
                .observe_queue_wait(&row.route, &plan.host.name, waited);
        }
    })?;
    row.queued_ms = waited.as_millis() as i64;
    gw.metrics
        .observe_queue_wait(&row.route, &plan.host.name, row.queued_ms);
    // (One that got its slot at once was looked at by no one: nothing to check.)
    if row.queued_ms > 0 && request.client_gone() {
        return Err(ProxyError::ClientGone("client gone while queued"));
    }
    pin::pin(gw, plan, key);
    Ok(Some(permit))
}

/// Who the request counts against where one client must not take what all share (issue 46): its
/// key, else its address.
fn client_id(request: &Request<'_>, row: &RequestRow) -> crate::clientid::ClientId {
    let ip = (request.peer_addr()).map_or([0, 0, 0, 0].into(), |a| a.ip());
    crate::clientid::ClientId::of_request(&row.key, ip)
}

/// What a request the host answered whole teaches placement, before the answer's end goes out (a
/// client's next turn finds it learned): the host is not failing; after a 2xx, its family is warm
/// there, a warm first turn sizes the family, and the conversation holds its prompt plus
/// completion there.
fn learn(gw: &Gateway, plan: &Plan<'_>, row: &RequestRow) {
    if !plan.slot {
        return;
    }
    let ok = (200..300).contains(&row.status) && row.err.is_empty();
    let served = crate::holdings::Served {
        ok,
        family: plan.family,
        warm_first_turn: plan.placed == Placed::Family,
        cached: row.cached_tokens.and_then(|c| u64::try_from(c).ok()),
    };
    gw.holdings.served(&plan.host.name, &plan.model, served);
    if let (true, Some(hold)) = (ok, &plan._hold) {
        let held = row.prompt_tokens.unwrap_or(0) + row.completion_tokens.unwrap_or(0);
        hold.set_held(u64::try_from(held).unwrap_or(0), plan.family.map(|f| f.id));
    }
    pin::finish(plan, row);
}

/// Everything before the slot: route, body, fingerprint, lease and context guard. Fills in the
/// row as it learns the route, conversation, model and host.
fn prepare<'c>(
    gw: &Gateway,
    config: &'c Config,
    request: &mut Request<'_>,
    incoming: &Incoming,
    row: &mut RequestRow,
) -> Result<(Plan<'c>, Key), ProxyError> {
    // Issue 25: who sent it, from the head alone, before anything that names a route or a model
    // (a CORS preflight carries no credentials).
    let client = match incoming.method.as_str() {
        "OPTIONS" => None,
        _ => {
            let peer = (request.peer_addr()).map_or([0, 0, 0, 0].into(), |a| peer_key(a.ip()));
            gw.keys
                .identify(config, &incoming.headers, peer, row.started)?
        }
    };
    row.key = client.clone().unwrap_or_default();
    let (route_name, rest) = resolve(&incoming.path, incoming.header(ROUTE_HEADER), config)?;
    let route = &config.routes[&route_name];
    row.route = route_name.clone();
    let admitted = match &client {
        Some(name) => Some(gw.keys.admit(config, name, &route_name, row.started)?),
        None => None,
    };
    forward::check_headers(incoming)?;
    let api = Api::of(&rest);
    row.api = api.name().to_string();
    let body = request.read_body(MAX_BODY).map_err(|err| match err {
        BodyError::TooLarge => ProxyError::BodyTooLarge,
        BodyError::Timeout => ProxyError::BodyTimeout,
        BodyError::Busy => ProxyError::BodiesBusy,
        // Its connection ended or broke inside the body: the client left.
        BodyError::Gone | BodyError::Io(_) => {
            ProxyError::ClientGone("client gone while sending its body")
        }
        BodyError::Later => ProxyError::BodyLater,
        other => ProxyError::BadBody(other.to_string()),
    })?;
    // A name a host of the route knows a configured model by is that model from here on: its
    // fingerprint, lease, slot and row (issue 27).
    let mut renamed = false;
    let (model, fp, family) = if incoming.bodyless() {
        (None, String::new(), None)
    } else {
        let session = incoming
            .header("X-Session-Id")
            .or_else(|| incoming.header("X-Conversation-Id"));
        let peek = fingerprint::peek_named(api, &body, session, |name| {
            let model = alias::configured(config, &route.hosts, name, |h| gw.health.get(h));
            renamed = model.is_some();
            model
        });
        // Issue 46: the slot inside a host is crossbar's to choose, never a client's.
        if peek.names_slot {
            return Err(pin::client_slot());
        }
        // Issue 46: with keys on, a conversation is its key's own.
        let fp = match &client {
            Some(name) => fingerprint::scoped(&peek.fp, name),
            None => peek.fp,
        };
        (peek.model, fp, peek.family)
    };
    row.family = family.map(Family::hex).unwrap_or_default();
    // A body that names no model is forwarded naming the route's (a router needs one); one that
    // names a host's own name for it, naming the chosen host's name for it.
    let named = (model.is_some() && !renamed) || incoming.bodyless();
    let mut key = Key {
        route: route_name,
        fp,
        model: model.unwrap_or_else(|| route.model.clone()),
    };
    row.fp = key.fp.clone();
    row.model = key.model.clone();
    // A model no candidate serves is 404 model_not_found (spec §2), pinned route or not. Refused
    // before the lease so a client's made-up names create no lease, slot or metric series.
    // The name is the client's: what the row, the log line and the answer keep of it is bounded.
    if !route.hosts.iter().any(|h| config.serves(h, &key.model)) {
        row.model = shown(&key.model).to_string();
        return Err(ProxyError::ModelNotFound {
            model: row.model.clone(),
            served: config.models_of(&route.hosts),
        });
    }
    let now = row.started;
    // Metadata (seed 001 step 2) takes no lease and leaves none: a chat UI polling its model
    // list must not steer new conversations (issue 23, over seed 000 rule 3).
    if route::is_metadata(&incoming.method, &rest) {
        key.fp.clear();
        row.fp.clear();
        row.host = gw.leases.lookup(&key, &route.hosts, now)?;
        let host = configured_host(config, &row.host)?;
        let body = outgoing(host, body, &key.model, named);
        let mut plan = plan(host, (api, rest, &key), body, LeaseUse::None, Placed::None);
        (plan._key, plan.keyed) = (admitted, !config.keys.is_empty());
        return Ok((plan, key));
    }
    let what = place::What {
        incoming,
        api,
        rest,
        family,
        named,
        client: client_id(request, row),
    };
    let mut plan = place::place(gw, config, &key, what, body, row)?;
    (plan._key, plan.keyed) = (admitted, !config.keys.is_empty());
    Ok((plan, key))
}

/// A plan with no slot, no family, no arrival, no ctx move and no hold yet.
fn plan<'c>(
    host: &'c crate::config::Host,
    (api, rest, key): (Api, String, &Key),
    body: Vec<u8>,
    lease: LeaseUse,
    placed: Placed,
) -> Plan<'c> {
    Plan {
        host,
        api,
        rest,
        body,
        lease,
        placed,
        family: None,
        model: key.model.clone(),
        arrival: None,
        slot: false,
        ctx_moved: None,
        _hold: None,
        _key: None,
        keyed: false,
        pin: None,
    }
}

/// The arrival a chooser's placement counted for this request, to give back with its slot.
fn arrival(gw: &Gateway, plan: &Plan<'_>, key: &Key) -> Option<Arrival> {
    (plan.placed.chosen()).then(|| Arrival::of(&gw.holdings, &plan.host.name, &key.model))
}

/// The body as `host` gets it: naming the model by the host's name for it (`upstream`), and
/// naming the route's model when the client named none (`named` false). Otherwise untouched.
fn outgoing(host: &crate::config::Host, body: Vec<u8>, model: &str, named: bool) -> Vec<u8> {
    let upstream = host.upstream_name(model);
    if body.is_empty() || (named && upstream == model) {
        return body;
    }
    match model::named(&body, upstream) {
        std::borrow::Cow::Borrowed(_) => body,
        std::borrow::Cow::Owned(changed) => changed,
    }
}

/// Most bytes of a refused model name that crossbar records or echoes.
const MAX_MODEL_SHOWN: usize = 256;

/// `name` cut to [`MAX_MODEL_SHOWN`] bytes on a char boundary.
fn shown(name: &str) -> &str {
    crate::logfmt::cut(name, MAX_MODEL_SHOWN)
}

/// The config entry of a host the lease table named (it only names configured hosts).
fn configured_host<'c>(
    config: &'c Config,
    name: &str,
) -> Result<&'c crate::config::Host, ProxyError> {
    config
        .hosts
        .get(name)
        .ok_or_else(|| ProxyError::Internal(format!("host {name} is not configured")))
}
