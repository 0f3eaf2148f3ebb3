//! Where a request that takes a slot goes: a conversation's lease (seed 000's rules and issue 23's
//! placement, in `lease`), the context guard's check of the prompt against that host, or, for a
//! stateless request, the chooser's pick; and where it goes once more when its host refused the
//! connection (issue 24). Builds the request's [`Plan`].

use crate::api::Api;
use crate::config::Config;
use crate::fingerprint::Family;
use crate::lease::{Ask, Key, Placed};

use super::ctxguard;
use super::plan::{configured_host, outgoing, Ctx, LeaseUse, Plan};
use super::ProxyError;

/// What placing needs to know of the request beyond its key and body.
pub(super) struct What {
    pub(super) api: Api,
    pub(super) rest: String,
    pub(super) family: Option<Family>,
    /// The body names its model itself (else the outgoing body names the route's, or the chosen
    /// host's own name for it).
    pub(super) named: bool,
}

/// Places a request that takes a slot and fills in the row's host and context estimate.
pub(super) fn place<'c>(
    ctx: &mut Ctx<'_>,
    config: &'c Config,
    key: Key,
    what: What,
    body: Vec<u8>,
) -> Result<Plan<'c>, ProxyError> {
    let gw = ctx.gw;
    let route = &config.routes[&key.route];
    // Lease events carry the request's start, as every placement of the request path does.
    let now = ctx.row.started;
    let ask = Ask {
        family: what.family,
        // A quarter of the body's bytes: the same measure as a family's size before a host
        // answered (the context guard's own estimate keeps its safety margin).
        prompt: body.len() as u64 / 4,
        slot: true,
        move_when_busy: route.move_when_busy,
        // Whose request it is: a new lease is that client's (issue 46).
        client: ctx.client,
    };
    if !what.api.takes_lease() {
        // Stateless (issue 18): no lease at all, the chooser's pick, a slot.
        let placed = gw.leases.place(&key, &route.hosts, now, &ask)?;
        ctx.row.host = placed.host;
        let host = configured_host(config, &ctx.row.host)?;
        let body = outgoing(host, body, &key.model, what.named);
        let lease = (LeaseUse::Stateless, placed.placed);
        let mut plan = Plan::new(host, key, (what.api, what.rest), body, lease);
        plan.slot = true;
        plan.arrive(gw);
        return Ok(plan);
    }
    let (acquired, hold) = gw.leases.acquire_held(&key, &route.hosts, now, &ask)?;
    ctx.row.host = acquired.host.clone();
    let mut placed = acquired.placed;
    let prompt = ctxguard::Prompt {
        rest: &what.rest,
        body: &body,
        estimate: ctxguard::estimate(&ctx.incoming, body.len()),
    };
    ctx.row.ctx_est = Some(i64::try_from(prompt.estimate).unwrap_or(i64::MAX));
    // Counted where the chooser placed it, until it has its slot (a ctx move below included).
    let chosen = placed
        .chosen()
        .then(|| crate::holdings::Arrival::of(&gw.holdings, &ctx.row.host, &key.model));
    let moved = ctxguard::check(ctx, config, &key, &acquired.host, &prompt)?;
    if let Some(moved) = &moved {
        ctx.row.host = moved.to.clone();
        placed = Placed::Ctx;
    }
    let host = configured_host(config, &ctx.row.host)?;
    // A move lands on a cold cache: that is a new lease, whatever the old one was.
    let lease = if acquired.reused && moved.is_none() {
        LeaseUse::Reused
    } else {
        LeaseUse::New
    };
    let body = outgoing(host, body, &key.model, what.named);
    let mut plan = Plan::new(host, key, (what.api, what.rest), body, (lease, placed));
    plan.slot = true;
    plan.family = what.family;
    plan.arrival = chosen;
    plan.ctx_moved = moved.map(|m| format!("moved:{}>{}", m.from, m.to));
    plan.hold = hold;
    Ok(plan)
}

/// Places the request of `old` once more after its host refused the connection (that host is
/// down now, so the lease moves with event `unhealthy` or the chooser picks another). The body
/// goes out naming the new host's name for the model.
pub(super) fn again<'c>(
    ctx: &mut Ctx<'_>,
    config: &'c Config,
    mut old: Plan<'c>,
) -> Result<Plan<'c>, ProxyError> {
    // The slot it was pinned to is on the host that refused: its body goes without it.
    super::pin::unpin(&mut old);
    let what = What {
        api: old.api,
        rest: std::mem::take(&mut old.rest),
        family: old.family,
        named: true,
    };
    let Plan {
        key,
        body,
        hold,
        admitted,
        keyed,
        permit,
        ..
    } = old;
    // The old hold goes first: the lease it holds is about to move; and the slot on the host
    // that refused is of no use now.
    drop((hold, permit));
    let mut plan = place(ctx, config, key, what, body)?;
    (plan.admitted, plan.keyed) = (admitted, keyed);
    Ok(plan)
}
