//! The admin listener: the operator's JSON API, `/metrics` and the status page.
//!
//! [`handle`] answers one admin request. It checks the bearer token or a signed-in browser's
//! session (constant time; `guard`, `signin`), parses bodies into typed requests whose errors name
//! the bad field, and calls the lease table, drain set and store. It never serves client (proxy)
//! paths, and the client listener never serves these.

use std::time::SystemTime;

use serde::Deserialize;
use serde_json::{json, Value};

mod guard;
mod signin;
pub(crate) mod throttle;
mod verbs;

use crate::conn::{BodyError, Request};
use crate::logfmt::val;
use crate::metrics::Gauges;
use crate::page;
use crate::state::Gateway;
use crate::store::unix_ms;

/// Admin bodies are a few fields; anything larger is a mistake.
const MAX_ADMIN_BODY: usize = 64 * 1024;

/// An admin answer: status and JSON (or another content type for `/metrics` and `/`), and the
/// headers a sign-in adds (`Location`, `Set-Cookie`).
#[derive(Debug)]
pub(crate) struct Answer {
    status: u16,
    content_type: &'static str,
    body: String,
    headers: Vec<(&'static str, String)>,
}

/// What an HTML answer may do: no scripts or outside resources at all, forms only to this
/// listener, and no framing by another page (the sign-in and sign-out buttons).
const HTML_POLICY: &str = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; \
                           frame-ancestors 'none'; base-uri 'none'";

impl Answer {
    fn json(status: u16, value: Value) -> Answer {
        Answer::with(status, "application/json", value.to_string())
    }

    fn html(status: u16, body: String) -> Answer {
        let mut answer = Answer::with(status, "text/html; charset=utf-8", body);
        answer
            .headers
            .push(("Content-Security-Policy", HTML_POLICY.to_string()));
        answer
    }

    fn with(status: u16, content_type: &'static str, body: String) -> Answer {
        Answer {
            status,
            content_type,
            body,
            headers: Vec::new(),
        }
    }

    pub(crate) fn error(status: u16, message: impl Into<String>) -> Answer {
        Answer::json(status, json!({ "error": message.into() }))
    }
}

/// Serves one admin request. The gateway's own health probes need no token; otherwise the token
/// (or, without one, the browser checks) is decided before any body is read.
pub fn handle(gw: &Gateway, request: &mut Request<'_>) {
    let method = request.method().to_string();
    let target = request.target().to_string();
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let early = (probe(gw, &method, path))
        // Issue 46: an address guessing the token is refused before anything checks one.
        .or_else(|| throttle::refused(gw, request))
        .or_else(|| signin::handle(gw, request, &method, path));
    let answer = match early.map_or_else(|| guard::guard(gw, request), Err) {
        Err(answer) if answer.status == 401 => {
            signin::instead_of_page(gw, request, &method, path).unwrap_or(answer)
        }
        Err(answer) => answer,
        Ok(()) => match request.read_body(MAX_ADMIN_BODY) {
            Ok(body) => route(gw, &method, path, query, &body),
            Err(BodyError::TooLarge) => Answer::error(413, "body too large"),
            Err(err) => Answer::error(400, format!("cannot read the body: {err}")),
        },
    };
    // The body is still coming: called again once the poller has it (issue 24).
    if request.body_later() {
        return;
    }
    if answer.status >= 400 {
        log::info!(
            "admin refused method={} path={} status={}",
            val(&method),
            val(path),
            answer.status
        );
    }
    let mut headers = vec![
        ("Content-Type".to_string(), answer.content_type.to_string()),
        ("Cache-Control".to_string(), "no-store".to_string()),
    ];
    headers.extend((answer.headers.into_iter()).map(|(name, value)| (name.to_string(), value)));
    if let Err(err) = request.send(answer.status, &headers, answer.body.as_bytes()) {
        log::debug!(
            "client gone before its admin answer error={}",
            val(&err.to_string())
        );
    }
}

/// The gateway's own health, answered without the token for systemd and uptime checks:
/// `/livez` (the process serves) and `/readyz` (at least one host polled and up, else 503). They
/// say nothing a token would protect: counts only, no names.
fn probe(gw: &Gateway, method: &str, path: &str) -> Option<Answer> {
    if method != "GET" && method != "HEAD" {
        return None;
    }
    match path {
        "/livez" | "/health/live" => Some(Answer::json(200, json!({ "status": "live" }))),
        "/readyz" | "/health/ready" => {
            let config = gw.config();
            let up = config
                .hosts
                .keys()
                .filter(|h| {
                    gw.health
                        .get(h)
                        .is_some_and(|s| s.healthy && s.last_poll > 0)
                })
                .count();
            let (status, word) = if up > 0 {
                (200, "ready")
            } else {
                (503, "not ready")
            };
            Some(Answer::json(
                status,
                json!({ "status": word, "hosts_up": up, "hosts": config.hosts.len() }),
            ))
        }
        _ => None,
    }
}

fn route(gw: &Gateway, method: &str, path: &str, query: &str, body: &[u8]) -> Answer {
    let now = unix_ms(SystemTime::now());
    match (method, path) {
        ("GET" | "HEAD", "/") => Answer::html(200, signin::page(gw, page::render(gw, now))),
        ("GET" | "HEAD", "/metrics") => Answer::with(
            200,
            "text/plain; version=0.0.4; charset=utf-8",
            gw.metrics.render(&gauges(gw)),
        ),
        ("GET", "/admin/status") => Answer::json(200, status(gw)),
        ("GET", "/admin/leases") => Answer::json(200, leases(gw)),
        ("GET", "/admin/events") => events(gw, query),
        ("POST", "/admin/pin") => parse(body).map_or_else(|e| e, |r| verbs::pin(gw, r, now)),
        ("POST", "/admin/unpin") => parse(body).map_or_else(|e| e, |r| verbs::unpin(gw, r, now)),
        ("POST", "/admin/release") => {
            parse(body).map_or_else(|e| e, |r| verbs::release(gw, r, now))
        }
        ("POST", "/admin/drain") => parse(body).map_or_else(|e| e, |r| verbs::drain(gw, r)),
        (_, "/" | "/metrics" | "/admin/status" | "/admin/leases" | "/admin/events") => {
            Answer::error(405, "method not allowed")
        }
        (_, "/admin/pin" | "/admin/unpin" | "/admin/release" | "/admin/drain") => {
            Answer::error(405, "method not allowed")
        }
        _ => Answer::error(404, "not found"),
    }
}

/// Parses a JSON body; the error names the missing, unknown or mistyped field.
fn parse<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, Answer> {
    let mut de = serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(&mut de).map_err(|err| {
        let path = err.path().to_string();
        let message = err.into_inner().to_string();
        let message = message.split(" at line").next().unwrap_or(&message);
        let message = if path == "." {
            format!("bad body: {message}")
        } else {
            format!("bad body: field `{path}`: {message}")
        };
        Answer::error(400, message)
    })
}

fn events(gw: &Gateway, query: &str) -> Answer {
    let mut limit = 50;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("limit", value)) => match value.parse::<usize>() {
                Ok(n) if (1..=10_000).contains(&n) => limit = n,
                _ => return Answer::error(400, "limit: must be a whole number from 1 to 10000"),
            },
            _ => return Answer::error(400, format!("unknown query parameter {pair:?}")),
        }
    }
    match gw.store.recent_events(limit) {
        Ok(list) => {
            let list: Vec<Value> = list
                .iter()
                .map(|e| {
                    json!({ "id": e.id, "at": e.at, "route": e.route, "fp": e.fp, "model": e.model,
                            "reason": e.reason.as_str(), "from": e.from_host, "to": e.to_host })
                })
                .collect();
            Answer::json(200, json!({ "events": list }))
        }
        Err(err) => Answer::error(500, err.to_string()),
    }
}

/// `GET /admin/leases`: every conversation lease, plus the pins.
pub fn leases(gw: &Gateway) -> Value {
    let list: Vec<Value> = gw
        .leases
        .snapshot()
        .iter()
        .map(|l| {
            json!({ "route": l.key.route, "fp": l.key.fp, "model": l.key.model, "host": l.host,
                    "created": l.created, "last_used": l.last_used })
        })
        .collect();
    let pins: Vec<Value> = gw
        .leases
        .pins()
        .into_iter()
        .map(|(route, host)| json!({ "route": route, "host": host }))
        .collect();
    json!({ "leases": list, "pins": pins })
}

/// A pinning host+model's slots as crossbar believes them (an `exclusive` host): per slot its state
/// (`busy`, `doubt`, `free`), the family and tokens it last held, whether it is in the RAM cache;
/// and the requests running there that crossbar could not pin.
fn pinned_slots(mirror: &crate::slots::Mirror) -> Value {
    let slots: Vec<Value> = (mirror.slots.iter().enumerate())
        .map(|(id, s)| {
            json!({ "id": id, "state": s.state, "tokens": s.tokens, "saved": s.saved,
                    "family": s.family.map(crate::fingerprint::Family::id_hex) })
        })
        .collect();
    json!({ "slots": slots, "unpinned": mirror.unpinned })
}

/// Warm families listed per host+model in the status (the count covers them all).
const WARM_SHOWN: usize = 8;

/// `GET /admin/status`: hosts (with what placement sees: held tokens against capacity, warm
/// families, the prefill speed), routes with their pins, and the lease count.
pub fn status(gw: &Gateway) -> Value {
    let config = gw.config();
    let per_host = gw.leases.per_host();
    let snapshot = gw.leases.snapshot();
    let slots = gw.limiter.snapshot();
    let hosts: Vec<Value> = config
        .hosts
        .values()
        .map(|host| {
            let health = gw.health.get(&host.name);
            let models: Vec<Value> = host
                .models
                .keys()
                .map(|model| {
                    let s = slots.iter().find(|s| s.host == host.name && &s.model == model);
                    let (held, capacity) = gw.held(&host.name, model);
                    let warm = gw.holdings.warm_on(&host.name, model);
                    let families: Vec<Value> = (warm.iter().take(WARM_SHOWN))
                        .map(|(f, tokens)| json!({ "family": f.hex(), "tokens": tokens }))
                        .collect();
                    let mut out = json!({ "model": model, "parallel": gw.seats(&host.name, model),
                            "configured_parallel": config.parallel(&host.name, model),
                            "host_slots": gw.health.slots_for(&host.name, model),
                            "in_flight": s.map_or(0, |s| s.in_flight), "queued": s.map_or(0, |s| s.queued),
                            "loaded": gw.health.is_loaded(&host.name, model),
                            "state": gw.health.model_state(&host.name, model),
                            "per_slot_ctx": gw.health.ctx_for(&host.name, model),
                            "held_tokens": held, "capacity": capacity,
                            "warm_families": warm.len(), "families": families });
                    if let Some(mirror) = gw.pinned_slots(host, model) {
                        out["pinned_slots"] = pinned_slots(&mirror);
                    }
                    out
                })
                .collect();
            let mine = slots.iter().filter(|s| s.host == host.name);
            json!({
                "name": host.name, "url": host.url,
                "healthy": health.as_ref().is_some_and(|h| h.healthy),
                "reason": health.as_ref().and_then(|h| h.reason.as_ref()).map(|r| r.to_string()),
                "draining": gw.drains.contains(&host.name),
                "loaded": health.as_ref().map(|h| h.loaded.clone()).unwrap_or_default(),
                "per_slot_ctx": gw.health.per_slot_ctx(&host.name),
                "in_flight": mine.clone().map(|s| s.in_flight).sum::<usize>(),
                "queued": mine.map(|s| s.queued).sum::<usize>(),
                "leases": per_host.get(&host.name).copied().unwrap_or(0),
                "prefill_tps": gw.holdings.prefill_tps(&host.name),
                "learned": learned(gw, host),
                "models": models,
            })
        })
        .collect();
    let pins = gw.leases.pins();
    let routes: Vec<Value> = config
        .routes
        .values()
        .map(|r| {
            let pin = pins
                .iter()
                .find(|(route, _)| route == &r.name)
                .map(|(_, h)| h.clone());
            json!({ "name": r.name, "hosts": r.hosts, "model": r.model, "pinned": pin,
                    "leases": snapshot.iter().filter(|l| l.key.route == r.name).count() })
        })
        .collect();
    let now = unix_ms(SystemTime::now());
    let hours: Vec<_> = config
        .hosts
        .keys()
        .map(|h| gw.metrics.hour(h, now))
        .collect();
    let (tokens, seconds) = crate::metrics::recent::saved(&hours);
    let store = gw.store.status();
    json!({ "hosts": hosts, "routes": routes, "leases": snapshot.len(),
            "served_from_cache": { "tokens": tokens, "seconds": seconds },
            "store": { "ok": store.ok, "since": store.since, "cause": store.cause,
                       "write_errors": store.write_errors, "db": config.db },
            "build": build(), "last_reload": last_reload(gw), "keys": keys(gw, &config, now) })
}

/// Which build answers (issue 48): `{"version", "commit", "dirty"}`, `commit` null without git.
fn build() -> Value {
    use crate::version;
    json!({ "version": version::VERSION, "commit": version::commit(), "dirty": version::dirty() })
}

/// The last config reload since start (issue 48): when (unix ms), applied or refused, and its
/// problems or warnings; null when there was none.
fn last_reload(gw: &Gateway) -> Value {
    match gw.metrics.last_reload() {
        Some(r) => json!({ "at": r.at, "applied": r.applied, "problems": r.problems,
                           "warnings": r.warnings }),
        None => Value::Null,
    }
}

/// Per client key, by its configured name (never the key): today's tokens (UTC) against its
/// budget, requests in flight against its cap (issue 48: only the page, `/metrics` and `report`
/// had them).
fn keys(gw: &Gateway, config: &crate::config::Config, now: i64) -> Value {
    let list: Vec<Value> = (gw.keys.usage(config, now).into_iter())
        .map(|(name, spent, running)| {
            let key = &config.keys[&name];
            json!({ "name": name, "tokens_today": spent, "tokens_per_day": key.tokens_per_day,
                    "in_flight": running, "max_in_flight": key.max_in_flight })
        })
        .collect();
    Value::Array(list)
}

/// What crossbar learned of `host` that it does not report, with the evidence (issue 47).
fn learned(gw: &Gateway, host: &crate::config::Host) -> Value {
    let now = unix_ms(SystemTime::now());
    let Some(l) = gw.learned.get(&host.name) else {
        return Value::Null;
    };
    json!({
        "build": l.build,
        "similarity": l.similarity.shown("on", "off"),
        "ram_cache": l.ram.shown("yes", "no"),
        "probe_due": l.probe_due,
        "restored": l.restored, "lost": l.lost,
        "colds": l.recent_colds(now),
        "restarts": l.restarts,
        "pinning": gw.pinning_shown(host),
        "notes": gw.host_notes(&host.name),
    })
}

fn gauges(gw: &Gateway) -> Gauges {
    let config = gw.config();
    let per_host = gw.leases.per_host();
    let store = gw.store.status();
    Gauges {
        hosts: config
            .hosts
            .keys()
            .map(|h| (h.clone(), gw.health.healthy(h)))
            .collect(),
        slots: gw
            .limiter
            .snapshot()
            .into_iter()
            .map(|s| (s.host, s.model, s.in_flight, s.queued))
            .collect(),
        leases: config
            .hosts
            .keys()
            .map(|h| (h.clone(), per_host.get(h).copied().unwrap_or(0)))
            .collect(),
        store_ok: store.ok,
        store_write_errors: store.write_errors,
        transitions: gw.health.transitions(),
        queued_body_bytes: gw.limiter.waiting_held().1,
    }
}
