//! Where a request that takes a slot goes: a conversation's lease (seed 000's rules and issue 23's
//! placement, in `lease`), the context guard's check of the prompt against that host, or, for a
//! stateless request, the chooser's pick; and where it goes once more when its host refused the
//! connection (issue 24). Builds the request's [`Plan`].

use crate::api::Api;
use crate::config::Config;
use crate::fingerprint::Family;
use crate::holdings::Arrival;
use crate::lease::{Ask, Key, Placed};
use crate::state::Gateway;
use crate::store::RequestRow;

use super::ProxyError;
use super::{arrival, configured_host, ctxguard, outgoing, plan, Incoming, LeaseUse, Plan};

/// What placing needs to know of the request beyond its key and body.
pub(super) struct What<'r> {
    pub(super) incoming: &'r Incoming,
    pub(super) api: Api,
    pub(super) rest: String,
    pub(super) family: Option<Family>,
    /// The body names its model itself (else the outgoing body names the route's, or the chosen
    /// host's own name for it).
    pub(super) named: bool,
    /// Whose request it is: a new lease is that client's (issue 46).
    pub(super) client: crate::clientid::ClientId,
}

/// Places a request that takes a slot and fills in the row's host and context estimate.
pub(super) fn place<'c>(
    gw: &Gateway,
    config: &'c Config,
    key: &Key,
    what: What<'_>,
    body: Vec<u8>,
    row: &mut RequestRow,
) -> Result<Plan<'c>, ProxyError> {
    let route = &config.routes[&key.route];
    // Lease events carry the request's start, as every placement of the request path does.
    let now = row.started;
    let ask = Ask {
        family: what.family,
        // A quarter of the body's bytes: the same measure as a family's size before a host
        // answered (the context guard's own estimate keeps its safety margin).
        prompt: body.len() as u64 / 4,
        slot: true,
        move_when_busy: route.move_when_busy,
        client: what.client,
    };
    if !what.api.takes_lease() {
        // Stateless (issue 18): no lease at all, the chooser's pick, a slot.
        let placed = gw.leases.place(key, &route.hosts, now, &ask)?;
        row.host = placed.host;
        let host = configured_host(config, &row.host)?;
        let body = outgoing(host, body, &key.model, what.named);
        let lease = LeaseUse::Stateless;
        let mut plan = plan(host, (what.api, what.rest, key), body, lease, placed.placed);
        plan.slot = true;
        plan.arrival = arrival(gw, &plan, key);
        return Ok(plan);
    }
    let (acquired, hold) = gw.leases.acquire_held(key, &route.hosts, now, &ask)?;
    row.host = acquired.host.clone();
    let mut placed = acquired.placed;
    let prompt = ctxguard::Prompt {
        rest: &what.rest,
        body: &body,
        estimate: ctxguard::estimate(what.incoming, body.len()),
    };
    row.ctx_est = Some(i64::try_from(prompt.estimate).unwrap_or(i64::MAX));
    // Counted where the chooser placed it, until it has its slot (a ctx move below included).
    let chosen = placed
        .chosen()
        .then(|| Arrival::of(&gw.holdings, &row.host, &key.model));
    let moved = ctxguard::check(gw, config, key, &acquired.host, &prompt, row, now)?;
    if let Some(moved) = &moved {
        row.host = moved.to.clone();
        placed = Placed::Ctx;
    }
    let host = configured_host(config, &row.host)?;
    // A move lands on a cold cache: that is a new lease, whatever the old one was.
    let lease = if acquired.reused && moved.is_none() {
        LeaseUse::Reused
    } else {
        LeaseUse::New
    };
    let body = outgoing(host, body, &key.model, what.named);
    let mut plan = plan(host, (what.api, what.rest, key), body, lease, placed);
    plan.slot = true;
    plan.family = what.family;
    plan.arrival = chosen;
    plan.ctx_moved = moved.map(|m| format!("moved:{}>{}", m.from, m.to));
    plan._hold = hold;
    Ok(plan)
}

/// Places the request of `old` once more after its host refused the connection (that host is
/// down now, so the lease moves with event `unhealthy` or the chooser picks another). The body
/// goes out naming the new host's name for the model.
pub(super) fn again<'c>(
    gw: &Gateway,
    config: &'c Config,
    key: &Key,
    what: What<'_>,
    mut old: Plan<'c>,
    row: &mut RequestRow,
) -> Result<Plan<'c>, ProxyError> {
    // The slot it was pinned to is on the host that refused: its body goes without it.
    super::pin::unpin(&mut old);
    let Plan {
        body,
        _hold,
        _key,
        keyed,
        ..
    } = old;
    // The old hold goes first: the lease it holds is about to move.
    drop(_hold);
    let mut plan = place(gw, config, key, what, body, row)?;
    (plan._key, plan.keyed) = (_key, keyed);
    Ok(plan)
}
