//! The client request path: route, peek, lease, context guard, slot, forward, record.
//!
//! [`handle`] serves one request from the client listener start to finish on the calling worker
//! thread. It owns the order of the steps and the mapping of every failure to its documented JSON
//! answer ([`ProxyError`]); the upstream exchange and streaming live in `forward`, the context guard
//! in `ctxguard`, route parsing in `route`. It never holds a lock across network I/O: the lease table,
//! limiter and health table are called between reads and writes, never around them.

mod count;
mod ctxguard;
mod error;
mod forward;
mod incoming;
mod listing;
mod model;
mod record;
mod route;
mod upstream;

use std::time::Instant;

use crate::api::Api;
use crate::config::Config;
use crate::conn::{BodyError, Request};
use crate::fingerprint;
use crate::lease::Key;
use crate::logfmt::val;
use crate::state::Gateway;
use crate::store::{unix_ms, RequestRow};

pub use count::{Counter, PER_HOST as COUNTS_PER_HOST};
pub use error::ProxyError;
use incoming::Incoming;
use record::{log_request, record, warn_on_cold_cache};
pub use route::{normalize, resolve};
pub use upstream::{agent as upstream_agent, agent_config as upstream_config};

/// Largest request body crossbar reads (it must see the body to fingerprint it).
pub const MAX_BODY: usize = 16 << 20;
pub const HOST_HEADER: &str = "X-Crossbar-Host";
pub const LEASE_HEADER: &str = "X-Crossbar-Lease";
pub const ROUTE_HEADER: &str = "X-Crossbar-Route";
pub const CTX_HEADER: &str = "X-Crossbar-Ctx";

/// A request that passed every check: its host, and (unless it is stateless or spread metadata)
/// its lease.
struct Plan<'a> {
    host: &'a crate::config::Host,
    api: Api,
    rest: String,
    body: Vec<u8>,
    lease: LeaseUse,
    /// Whether the request takes a limiter slot: metadata never does (llama-server answers it
    /// without one, so it must not wait behind generations here).
    slot: bool,
    ctx_moved: Option<String>,
    /// Keeps the lease from eviction while the request runs.
    _hold: Option<crate::lease::Hold>,
}

/// What a request did with the lease table, as `X-Crossbar-Lease` and the log line say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LeaseUse {
    New,
    Reused,
    /// Metadata on a `spread_new` route: no lease (and, like all metadata, no slot).
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
    let (plan, key) = match prepare(gw, &config, request, &incoming, &mut row) {
        Ok(ready) => ready,
        Err(err) => return refuse(gw, request, err, row, clock),
    };
    // Metadata uses no slot upstream, so it never waits behind generations for one here. A
    // client that leaves while queued leaves the queue within a second (seed 001 step 4).
    let permit = if plan.slot {
        let model = &key.model;
        match gw
            .limiter
            .acquire_unless(&plan.host.name, model, || request.client_gone())
        {
            Ok((permit, waited)) => {
                row.queued_ms = waited.as_millis() as i64;
                gw.metrics
                    .observe_queue_wait(&row.route, &plan.host.name, row.queued_ms);
                Some(permit)
            }
            Err(err) => {
                if err == crate::limiter::LimitError::Timeout {
                    let waited = config.queue_timeout.as_millis() as i64;
                    gw.metrics
                        .observe_queue_wait(&row.route, &plan.host.name, waited);
                }
                return refuse(gw, request, err.into(), row, clock);
            }
        }
    } else {
        None
    };
    // The slot may have come free just as a queued client left: such a request is never
    // forwarded. (One that got its slot at once was looked at by no one: nothing to check.)
    if permit.is_some() && row.queued_ms > 0 && request.client_gone() {
        let err = ProxyError::ClientGone("client gone while queued");
        return refuse(gw, request, err, row, clock);
    }
    let client = request.socket();
    match forward::exchange(gw, &incoming, &plan, permit, client, &mut row, clock) {
        Ok(answer) => {
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
        Err(err) => refuse(gw, request, err, row, clock),
    }
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
    let (route_name, rest) = resolve(&incoming.path, incoming.header(ROUTE_HEADER), config)?;
    let route = &config.routes[&route_name];
    row.route = route_name.clone();
    let api = Api::of(&rest);
    row.api = api.name().to_string();
    let body = request.read_body(MAX_BODY).map_err(|err| match err {
        BodyError::TooLarge => ProxyError::BodyTooLarge,
        BodyError::Timeout => ProxyError::BodyTimeout,
        other => ProxyError::BadBody(other.to_string()),
    })?;
    let (model, fp) = if incoming.bodyless() {
        (None, String::new())
    } else {
        let session = incoming
            .header("X-Session-Id")
            .or_else(|| incoming.header("X-Conversation-Id"));
        let peek = fingerprint::peek_as(api, &body, session);
        (peek.model, peek.fp)
    };
    // A body that names no model is forwarded naming the route's (a router needs one).
    let named = model.is_some() || incoming.bodyless();
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
    // Metadata is the route-level request (seed 001 step 2): its lease is the one new
    // conversations inherit (seed 000 rule 3), unless the route spreads them.
    let metadata = route::is_metadata(&incoming.method, &rest);
    if metadata {
        key.fp.clear();
        row.fp.clear();
        if route.spread_new {
            let (mut plan, key) =
                lookup_plan(gw, config, key, &route.hosts, (api, rest), body, row)?;
            plan.body = outgoing(plan.host, plan.body, &key.model, named);
            return Ok((plan, key));
        }
    } else if !api.takes_lease() {
        // Stateless (issue 18): no lease at all, the chooser's pick, a slot.
        row.host = gw.leases.place(&key, &route.hosts)?;
        let host = configured_host(config, &row.host)?;
        let body = outgoing(host, body, &key.model, named);
        let (lease, slot, ctx_moved) = (LeaseUse::Stateless, true, None);
        let plan = Plan {
            host,
            api,
            rest,
            body,
            lease,
            slot,
            ctx_moved,
            _hold: None,
        };
        return Ok((plan, key));
    }
    let now = row.started;
    let (acquired, hold) = gw
        .leases
        .acquire_held(&key, &route.hosts, now, route.spread_new)?;
    row.host = acquired.host.clone();
    let moved = if metadata {
        None
    } else {
        let prompt = ctxguard::Prompt {
            rest: &rest,
            body: &body,
            estimate: ctxguard::estimate(incoming, body.len()),
        };
        row.ctx_est = Some(i64::try_from(prompt.estimate).unwrap_or(i64::MAX));
        ctxguard::check(gw, config, &key, &acquired.host, &prompt, row, now)?
    };
    if let Some(moved) = &moved {
        row.host = moved.to.clone();
    }
    let host = configured_host(config, &row.host)?;
    let plan = Plan {
        host,
        api,
        rest,
        body: outgoing(host, body, &key.model, named),
        // A move lands on a cold cache: that is a new lease, whatever the old one was.
        lease: if acquired.reused && moved.is_none() {
            LeaseUse::Reused
        } else {
            LeaseUse::New
        },
        slot: !metadata,
        ctx_moved: moved.map(|m| format!("moved:{}>{}", m.from, m.to)),
        _hold: hold,
    };
    Ok((plan, key))
}

/// A metadata request's plan on a `spread_new` route: the route-level key's host by lookup (pin,
/// existing lease, or the chooser), no lease created or kept alive.
fn lookup_plan<'c>(
    gw: &Gateway,
    config: &'c Config,
    key: Key,
    candidates: &[String],
    (api, rest): (Api, String),
    body: Vec<u8>,
    row: &mut RequestRow,
) -> Result<(Plan<'c>, Key), ProxyError> {
    row.host = gw.leases.lookup(&key, candidates)?;
    let host = configured_host(config, &row.host)?;
    let plan = Plan {
        host,
        api,
        rest,
        body,
        lease: LeaseUse::None,
        slot: false,
        ctx_moved: None,
        _hold: None,
    };
    Ok((plan, key))
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

/// Answers with crossbar's own error, recording the row before the client can see the answer.
fn refuse(
    gw: &Gateway,
    request: &mut Request<'_>,
    err: ProxyError,
    mut row: RequestRow,
    clock: Instant,
) {
    if let ProxyError::Upstream { host, detail } = &err {
        row.host = host.clone();
        row.err = format!("upstream error: {detail}");
    } else if let ProxyError::BadBody(detail) | ProxyError::BadRequest(detail) = &err {
        row.err = format!("{err}: {detail}");
    } else if let ProxyError::ClientGone(why) = &err {
        row.err = why.to_string();
    } else if let ProxyError::Internal(detail) = &err {
        row.err = detail.clone();
        log::error!(
            "internal error route={} error={}",
            val(&row.route),
            val(detail)
        );
    } else {
        row.err = err.to_string();
    }
    row.status = err.status();
    row.total_ms = clock.elapsed().as_millis() as i64;
    let mut headers = vec![("Content-Type".to_string(), "application/json".to_string())];
    if let Some(secs) = err.retry_after(gw.config().health_interval.as_secs()) {
        headers.push(("Retry-After".to_string(), secs.to_string()));
    }
    if !row.host.is_empty() {
        headers.push((HOST_HEADER.to_string(), row.host.clone()));
    }
    record(gw, &row);
    if row.status == 499 {
        // Nobody to answer.
        request.abandon();
    } else {
        let body = err.body().to_string();
        if let Err(err) = request.send(row.status, &headers, body.as_bytes()) {
            log::debug!(
                "client gone before its error answer error={}",
                val(&err.to_string())
            );
        }
    }
    log_request(&row, "-");
}
