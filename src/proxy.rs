//! The client request path: route, peek, lease, context guard, slot, forward, record.
//!
//! [`handle`] serves one request from the client listener start to finish on the calling worker
//! thread, and owns the order of the steps: [`prepare`] (client key, route, body, fingerprint,
//! placement: `place`), the slot, the exchange (`exchange`, built by `send`), the relay
//! (`forward`, or `listing` for a listing it renames), and the end (`end`), where every outcome —
//! answered, broken, client gone, refused — is recorded and freed in one fixed order. It never
//! holds a lock across network I/O: the lease table, limiter and health table are called between
//! reads and writes, never around them. Children import from each other and from `plan`, never
//! from this file.

mod alias;
mod blame;
mod cors;
mod count;
mod ctxguard;
mod end;
mod error;
mod exchange;
mod forward;
mod headers;
mod incoming;
mod listing;
mod model;
mod pin;
mod place;
mod plan;
mod record;
mod route;
mod send;
mod stash;

use crate::api::Api;
use crate::config::Config;
use crate::conn::{peer_key, BodyError, Request};
use crate::fingerprint::{self, Family};
use crate::lease::{Key, Placed};
use crate::state::Gateway;

use end::{end, Outcome};
pub use error::ProxyError;
use plan::{configured_host, outgoing, Ctx, LeaseUse, Plan};
pub use plan::{CTX_HEADER, HOST_HEADER, LEASE_HEADER, MAX_BODY, PLACEMENT_HEADER, ROUTE_HEADER};
pub use route::{check_normal, normalize, resolve};

/// Serves one client request completely. Never panics on client input; every outcome is answered
/// (or, when the client left, recorded as 499).
pub fn handle(gw: &Gateway, request: &mut Request<'_>) {
    let mut ctx = Ctx::of(gw, request);
    // A browser asking whether its page may send the real request: no credentials to check,
    // nothing to route, nothing to forward (issue 46).
    if cors::is_preflight(&ctx.incoming) {
        return end(&mut ctx, request, None, Outcome::Preflight);
    }
    let config = gw.config();
    let plan = match prepare(&mut ctx, &config, request) {
        Ok(plan) => plan,
        // The body is still coming: the connection layer reads it off the workers and calls
        // again (issue 24). Nothing is answered or recorded now.
        Err(ProxyError::BodyLater) => return ctx.incoming.give_back(request),
        Err(err) => return end(&mut ctx, request, None, Outcome::Refused(err)),
    };
    let (plan, outcome) = serve(&mut ctx, &config, request, plan);
    end(&mut ctx, request, plan, outcome);
}

/// The slot, the exchange and the relay. A host that refused the connection got nothing: the
/// request goes once to the next candidate, the host being down now (issue 24).
fn serve<'c>(
    ctx: &mut Ctx<'_>,
    config: &'c Config,
    request: &mut Request<'_>,
    mut plan: Plan<'c>,
) -> (Option<Plan<'c>>, Outcome) {
    let mut retried = false;
    loop {
        ctx.row.placed = plan.placed.as_str().to_string();
        if let Err(err) = take_slot(ctx, config, request, &mut plan) {
            return (Some(plan), Outcome::Refused(err));
        }
        let client = request.socket();
        match exchange::exchange(ctx, &plan, client) {
            Ok(answer) => {
                pin::started(&plan);
                let outcome = match plan.listing {
                    Some(_) => listing::relay(ctx, request, &plan, answer),
                    None => forward::relay(ctx, request, &plan, answer),
                };
                return (Some(plan), outcome);
            }
            Err(ProxyError::Upstream { refused: true, .. }) if plan.slot && !retried => {
                retried = true;
                log::info!(
                    "retry on the next host refused={}",
                    crate::logfmt::val(&ctx.row.host)
                );
                plan = match place::again(ctx, config, plan) {
                    Ok(plan) => plan,
                    Err(err) => return (None, Outcome::Refused(err)),
                };
            }
            Err(err) => return (Some(plan), Outcome::Refused(err)),
        }
    }
}

/// The request's slot on its host, waiting in line if need be (metadata takes none: llama-server
/// answers it without one, so it never waits behind generations here). A client that leaves while
/// queued leaves the line within a second (seed 001 step 4), and one whose slot came free just as
/// it left is never forwarded. On a pinning host, its slot there too.
fn take_slot(
    ctx: &mut Ctx<'_>,
    config: &Config,
    request: &mut Request<'_>,
    plan: &mut Plan<'_>,
) -> Result<(), ProxyError> {
    if !plan.slot {
        return Ok(());
    }
    let (gw, row) = (ctx.gw, &mut ctx.row);
    // Its place in line or its slot counts it from the moment it has one; no longer an arrival.
    let arrival = plan.arrival.take();
    let entered = move || drop(arrival);
    // Issue 46: what it holds in line counts against its client's share and all of theirs.
    let waiter = crate::limiter::Waiter {
        client: ctx.client,
        bytes: plan.body.len(),
    };
    let (host, model) = (&plan.host.name, &plan.key.model);
    let taken = (gw.limiter).acquire_unless(host, model, waiter, entered, || request.client_gone());
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
    plan.permit = Some(permit);
    // (One that got its slot at once was looked at by no one: nothing to check.)
    if row.queued_ms > 0 && request.client_gone() {
        return Err(ProxyError::ClientGone("client gone while queued"));
    }
    pin::pin(gw, plan);
    stash::before(gw, plan);
    Ok(())
}

/// Everything before the slot: client key, route, body, fingerprint, lease and context guard.
/// Fills in the row as it learns the route, conversation, model and host.
fn prepare<'c>(
    ctx: &mut Ctx<'_>,
    config: &'c Config,
    request: &mut Request<'_>,
) -> Result<Plan<'c>, ProxyError> {
    let (gw, incoming, row) = (ctx.gw, &ctx.incoming, &mut ctx.row);
    // Issue 25: who sent it, from the head alone, before anything that names a route or a model.
    // Every request, `OPTIONS` too (issue 46: only a preflight, answered in `handle`, needs none).
    let peer = (request.peer_addr()).map_or([0, 0, 0, 0].into(), |a| peer_key(a.ip()));
    let client = (gw.keys).identify(config, &incoming.headers, peer, row.started)?;
    row.key = client.clone().unwrap_or_default();
    // Who the request counts against where one client must not take what all share (issue
    // 46): its key, else its address.
    let ip = (request.peer_addr()).map_or([0, 0, 0, 0].into(), |a| a.ip());
    ctx.client = crate::clientid::ClientId::of_request(&row.key, ip);
    let (route_name, rest) = resolve(&incoming.path, incoming.header(ROUTE_HEADER), config)?;
    let route = &config.routes[&route_name];
    row.route = route_name.clone();
    let admitted = match &client {
        Some(name) => Some(gw.keys.admit(config, name, &route_name, row.started)?),
        None => None,
    };
    send::check_headers(incoming, !config.keys.is_empty())?;
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
        let listing = listing::bound(incoming, &rest, config.first_byte_timeout);
        let lease = (LeaseUse::None, Placed::None);
        let mut plan = Plan::new(host, key, (api, rest), body, lease);
        (plan.listing, plan.admitted) = (listing, admitted);
        plan.keyed = !config.keys.is_empty();
        return Ok(plan);
    }
    // Issue 46: what it may spend of its key's day, reserved before it costs anything.
    if let Some(key) = &admitted {
        let want = || crate::keys::Reserved {
            prompt: ctxguard::estimate(incoming, body.len()),
            output: (api.output_limit(&body)).unwrap_or(crate::keys::DEFAULT_OUTPUT),
        };
        key.reserve(config, want, now)?;
    }
    let what = place::What {
        api,
        rest,
        family,
        named,
    };
    let mut plan = place::place(ctx, config, key, what, body)?;
    (plan.admitted, plan.keyed) = (admitted, !config.keys.is_empty());
    Ok(plan)
}

/// Most bytes of a refused model name that crossbar records or echoes.
const MAX_MODEL_SHOWN: usize = 256;

/// `name` cut to [`MAX_MODEL_SHOWN`] bytes on a char boundary.
fn shown(name: &str) -> &str {
    crate::logfmt::cut(name, MAX_MODEL_SHOWN)
}
