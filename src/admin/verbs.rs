//! The operator verbs of the admin API: pin, unpin, release and drain. Each checks its names
//! against one config snapshot, calls the lease table or the drain set, logs one line and answers
//! JSON. A store that refuses the write is `503 store unavailable`, as on the client path.

use serde::Deserialize;
use serde_json::json;

use crate::config::{Config, Route};
use crate::lease::LeaseError;
use crate::state::Gateway;

use super::Answer;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PinRequest {
    route: String,
    host: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RouteRequest {
    route: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DrainRequest {
    host: String,
    on: bool,
}

/// The route as `config` has it. Callers pass one snapshot and look nothing up in another: a
/// reload between two `gw.config()` calls could remove what the first one found.
fn known_route<'c>(config: &'c Config, route: &str) -> Result<&'c Route, Answer> {
    config
        .routes
        .get(route)
        .ok_or_else(|| unknown("route", route, config.routes.keys()))
}

fn known_host(config: &Config, host: &str) -> Result<(), Answer> {
    if config.hosts.contains_key(host) {
        Ok(())
    } else {
        Err(unknown("host", host, config.hosts.keys()))
    }
}

/// 404 for a name the config does not have, with the one it probably meant and the ones it has
/// (issue 27: `crossbar drain tital`).
fn unknown<'a>(what: &str, name: &str, known: impl Iterator<Item = &'a String> + Clone) -> Answer {
    let near = crate::nearest::nearest(name, known.clone().map(String::as_str))
        .map_or(String::new(), |near| format!("; did you mean {near:?}?"));
    let all: Vec<&str> = known.map(String::as_str).collect();
    Answer::error(
        404,
        format!(
            "unknown {what} {name:?}{near} ({what}s: {})",
            all.join(", ")
        ),
    )
}

fn lease_failure(err: LeaseError) -> Answer {
    match err {
        LeaseError::UnknownHost { host } => {
            Answer::error(404, format!("unknown host {host:?} for this route"))
        }
        LeaseError::Store(err) => Answer::json(
            503,
            json!({ "error": "store unavailable", "detail": err.to_string() }),
        ),
        other => Answer::error(500, other.to_string()),
    }
}

pub(super) fn pin(gw: &Gateway, req: PinRequest, now: i64) -> Answer {
    let config = gw.config();
    let route = match known_route(&config, &req.route) {
        Ok(route) => route,
        Err(answer) => return answer,
    };
    if let Err(answer) = known_host(&config, &req.host) {
        return answer;
    }
    if !route.hosts.contains(&req.host) {
        return Answer::error(
            404,
            format!(
                "host {:?} is not a candidate of route {:?} (its hosts: {})",
                req.host,
                req.route,
                route.hosts.join(", ")
            ),
        );
    }
    match gw.leases.pin(&req.route, &req.host, now) {
        Ok(dropped) => {
            log::info!(
                "pin route={} host={} leases_dropped={dropped}",
                req.route,
                req.host
            );
            let mut answer = json!({ "route": req.route, "host": req.host, "dropped": dropped });
            if let Some(warning) = down_warning(gw, &req.route, &req.host) {
                log::warn!("pin onto a down host route={} host={}", req.route, req.host);
                answer["warning"] = warning.into();
            }
            Answer::json(200, answer)
        }
        Err(err) => lease_failure(err),
    }
}

/// What a pin onto a host that is down now means for the route's clients (issue 27: it was
/// accepted silently). The pin stands: the operator may be about to bring the host back.
fn down_warning(gw: &Gateway, route: &str, host: &str) -> Option<String> {
    let status = gw.health.get(host).filter(|s| !s.healthy)?;
    let why = status
        .reason
        .map_or("no answer".to_string(), |r| r.to_string());
    Some(format!(
        "host {host} is down ({why}): requests of route {route} get 503 `pinned host down` \
         until it is back; `crossbar unpin {route}` lets the route use its other hosts"
    ))
}

pub(super) fn unpin(gw: &Gateway, req: RouteRequest, now: i64) -> Answer {
    if let Err(answer) = known_route(&gw.config(), &req.route) {
        return answer;
    }
    match gw.leases.unpin(&req.route, now) {
        Ok(was) => {
            log::info!("unpin route={} was_pinned={was}", req.route);
            Answer::json(200, json!({ "route": req.route, "was_pinned": was }))
        }
        Err(err) => lease_failure(err),
    }
}

pub(super) fn release(gw: &Gateway, req: RouteRequest, now: i64) -> Answer {
    if let Err(answer) = known_route(&gw.config(), &req.route) {
        return answer;
    }
    match gw.leases.release(&req.route, now) {
        Ok(dropped) => {
            log::info!("release route={} leases_dropped={dropped}", req.route);
            Answer::json(200, json!({ "route": req.route, "dropped": dropped }))
        }
        Err(err) => lease_failure(err),
    }
}

pub(super) fn drain(gw: &Gateway, req: DrainRequest) -> Answer {
    if let Err(answer) = known_host(&gw.config(), &req.host) {
        return answer;
    }
    let changed = gw.drains.set(&req.host, req.on);
    let remaining = gw.leases.per_host().get(&req.host).copied().unwrap_or(0);
    log::info!(
        "drain host={} on={} changed={changed} leases_remaining={remaining}",
        req.host,
        req.on
    );
    Answer::json(
        200,
        json!({ "host": req.host, "draining": req.on, "changed": changed, "leases": remaining }),
    )
}
