//! The client request path: route, peek, lease, context guard, slot, forward, record.
//!
//! [`handle`] serves one request from the client listener start to finish on the calling worker
//! thread. It owns the order of the steps and the mapping of every failure to its documented JSON
//! answer ([`ProxyError`]); the upstream exchange and streaming live in `forward`, the context guard
//! in `ctxguard`, route parsing in `route`. It never holds a lock across network I/O: the lease table,
//! limiter and health table are called between reads and writes, never around them.

mod ctxguard;
mod error;
mod forward;
mod record;
mod route;

use std::io::Read;
use std::time::Instant;

use crate::api::Api;
use crate::config::Config;
use crate::fingerprint;
use crate::lease::Key;
use crate::logfmt::val;
use crate::state::Gateway;
use crate::store::{unix_ms, RequestRow};
use crate::wire;

pub use error::ProxyError;
use record::{log_request, record, warn_on_cold_cache};
pub use route::resolve;

/// Largest request body crossbar reads (it must see the body to fingerprint it).
pub const MAX_BODY: usize = 16 << 20;
pub const HOST_HEADER: &str = "X-Crossbar-Host";
pub const LEASE_HEADER: &str = "X-Crossbar-Lease";
pub const ROUTE_HEADER: &str = "X-Crossbar-Route";
pub const CTX_HEADER: &str = "X-Crossbar-Ctx";

/// What the client asked, copied out of the tiny_http request before its body is read.
#[derive(Debug)]
struct Incoming {
    method: String,
    path: String,
    query: String,
    headers: Vec<(String, String)>,
    http10: bool,
}

impl Incoming {
    fn of(request: &tiny_http::Request) -> Incoming {
        let url = request.url();
        let (path, query) = match url.split_once('?') {
            Some((path, query)) => (path, format!("?{query}")),
            None => (url, String::new()),
        };
        Incoming {
            method: request.method().as_str().to_string(),
            path: path.to_string(),
            query,
            headers: request
                .headers()
                .iter()
                .map(|h| {
                    (
                        h.field.as_str().as_str().to_string(),
                        h.value.as_str().to_string(),
                    )
                })
                .collect(),
            http10: request.http_version() == &tiny_http::HTTPVersion(1, 0),
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        wire::header(&self.headers, name)
    }

    fn bodyless(&self) -> bool {
        self.method == "GET" || self.method == "HEAD"
    }
}

/// A request that passed every check: its host, and (unless it is metadata or stateless) its lease.
struct Plan<'a> {
    host: &'a crate::config::Host,
    api: Api,
    rest: String,
    body: Vec<u8>,
    lease: LeaseUse,
    ctx_moved: Option<String>,
}

/// What a request did with the lease table, as `X-Crossbar-Lease` and the log line say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LeaseUse {
    New,
    Reused,
    /// Metadata (`route::is_metadata`): no lease and no slot.
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
/// and recorded. The request stays in `slot` until the answer starts, so a worker that catches a
/// panic before then can still answer 500.
pub fn handle(gw: &Gateway, slot: &mut Option<tiny_http::Request>) {
    let Some(request) = slot.as_mut() else {
        return;
    };
    let clock = Instant::now();
    let incoming = Incoming::of(request);
    let mut row = RequestRow {
        started: unix_ms(std::time::SystemTime::now()),
        ..RequestRow::default()
    };
    let mut ctx_est = None;
    let config = gw.config();
    let (plan, key) = match prepare(gw, &config, request, &incoming, &mut row, &mut ctx_est) {
        Ok(ready) => ready,
        Err(err) => return refuse(gw, slot, &incoming, err, row, clock, ctx_est),
    };
    // Metadata uses no slot upstream, so it never waits behind generations for one here.
    let permit = match plan.lease {
        LeaseUse::None => None,
        LeaseUse::New | LeaseUse::Reused | LeaseUse::Stateless => {
            match gw.limiter.acquire(&plan.host.name, &key.model) {
                Ok((permit, waited)) => {
                    row.queued_ms = waited.as_millis() as i64;
                    Some(permit)
                }
                Err(err) => return refuse(gw, slot, &incoming, err.into(), row, clock, ctx_est),
            }
        }
    };
    match forward::exchange(gw, &incoming, &plan, permit, &mut row, clock) {
        Ok(answer) => {
            if let Some(request) = slot.take() {
                forward::relay(gw, request, &incoming, &plan, answer, &mut row, clock);
            }
            log_request(&row, plan.lease.as_str(), ctx_est);
            if matches!(plan.lease, LeaseUse::New | LeaseUse::Reused) {
                warn_on_cold_cache(gw, &key, &row, plan.lease == LeaseUse::Reused);
            }
        }
        Err(err) => refuse(gw, slot, &incoming, err, row, clock, ctx_est),
    }
}

/// Everything before the slot: route, body, fingerprint, lease and context guard. Fills in the
/// row as it learns the route, conversation, model and host.
fn prepare<'c>(
    gw: &Gateway,
    config: &'c Config,
    request: &mut tiny_http::Request,
    incoming: &Incoming,
    row: &mut RequestRow,
    ctx_est: &mut Option<u64>,
) -> Result<(Plan<'c>, Key), ProxyError> {
    let (route_name, rest) = resolve(&incoming.path, incoming.header(ROUTE_HEADER), config)?;
    let route = &config.routes[&route_name];
    row.route = route_name.clone();
    let api = Api::of(&rest);
    row.api = api.name().to_string();
    let body = read_body(request, incoming)?;
    let (model, fp) = if incoming.bodyless() {
        (None, String::new())
    } else {
        let session = incoming
            .header("X-Session-Id")
            .or_else(|| incoming.header("X-Conversation-Id"));
        let peek = fingerprint::peek_as(api, &body, session);
        (peek.model, peek.fp)
    };
    let key = Key {
        route: route_name,
        fp,
        model: model.unwrap_or_else(|| route.model.clone()),
    };
    row.fp = key.fp.clone();
    row.model = key.model.clone();
    // A model no candidate serves has no usable host (spec §2), pinned route or not. Refused
    // before the lease so a client's made-up names create no lease, slot or metric series.
    if !route.hosts.iter().any(|h| config.serves(h, &key.model)) {
        return Err(ProxyError::NoHealthyHost);
    }
    if route::is_metadata(&incoming.method, &rest) {
        return metadata_plan(gw, config, key, &route.hosts, (api, rest), body, row);
    }
    if !api.takes_lease() {
        row.host = gw.leases.place(&key, &route.hosts)?;
        let host = configured_host(config, &row.host)?;
        let lease = LeaseUse::Stateless;
        let (ctx_moved, api) = (None, api);
        return Ok((
            Plan {
                host,
                api,
                rest,
                body,
                lease,
                ctx_moved,
            },
            key,
        ));
    }
    let now = row.started;
    let acquired = gw.leases.acquire(&key, &route.hosts, now)?;
    row.host = acquired.host.clone();
    let estimate = ctxguard::estimate(incoming, body.len());
    *ctx_est = Some(estimate);
    let moved = ctxguard::check(gw, config, &key, &acquired.host, estimate, now)?;
    if let Some(moved) = &moved {
        row.host = moved.to.clone();
    }
    let host = configured_host(config, &row.host)?;
    let plan = Plan {
        host,
        api,
        rest,
        body,
        // A move lands on a cold cache: that is a new lease, whatever the old one was.
        lease: if acquired.reused && moved.is_none() {
            LeaseUse::Reused
        } else {
            LeaseUse::New
        },
        ctx_moved: moved.map(|m| format!("moved:{}>{}", m.from, m.to)),
    };
    Ok((plan, key))
}

/// A metadata request's plan: the route-level key's host by lookup (pin, existing lease, or the
/// chooser), no lease created, so a chat UI listing models never steers new conversations.
fn metadata_plan<'c>(
    gw: &Gateway,
    config: &'c Config,
    key: Key,
    candidates: &[String],
    (api, rest): (Api, String),
    body: Vec<u8>,
    row: &mut RequestRow,
) -> Result<(Plan<'c>, Key), ProxyError> {
    let key = Key {
        fp: String::new(),
        ..key
    };
    row.fp.clear();
    row.host = gw.leases.lookup(&key, candidates)?;
    let host = configured_host(config, &row.host)?;
    let plan = Plan {
        host,
        api,
        rest,
        body,
        lease: LeaseUse::None,
        ctx_moved: None,
    };
    Ok((plan, key))
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

/// Reads the body, refusing more than [`MAX_BODY`] bytes.
fn read_body(request: &mut tiny_http::Request, incoming: &Incoming) -> Result<Vec<u8>, ProxyError> {
    let declared = incoming
        .header("Content-Length")
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return Err(ProxyError::BodyTooLarge);
    }
    let mut body = Vec::with_capacity(declared.unwrap_or(0) as usize);
    request
        .as_reader()
        .take(MAX_BODY as u64 + 1)
        .read_to_end(&mut body)
        .map_err(|err| ProxyError::BadBody(err.to_string()))?;
    if body.len() > MAX_BODY {
        return Err(ProxyError::BodyTooLarge);
    }
    Ok(body)
}

/// Answers with crossbar's own error, recording the row before the client can see the answer.
fn refuse(
    gw: &Gateway,
    slot: &mut Option<tiny_http::Request>,
    incoming: &Incoming,
    err: ProxyError,
    mut row: RequestRow,
    clock: Instant,
    ctx_est: Option<u64>,
) {
    if let ProxyError::Upstream { host, detail } = &err {
        row.host = host.clone();
        row.err = format!("upstream error: {detail}");
    } else if let ProxyError::BadBody(detail) = &err {
        row.err = format!("{err}: {detail}");
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
    let body = err.body().to_string();
    let head_only = incoming.method == "HEAD";
    if let Some(request) = slot.take() {
        let out = request.into_writer();
        let _ = wire::send(
            out,
            incoming.http10,
            head_only,
            row.status,
            &headers,
            body.as_bytes(),
        );
    }
    log_request(&row, "-", ctx_est);
}
