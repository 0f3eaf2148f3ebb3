//! Stage two of config loading: the raw serde shape of the file (`raw.rs`) validated into a
//! [`Config`] with defaults applied and every problem collected with its key.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::raw::{RawConfig, RawRoute};
use super::{parse_duration, Config, Host, Problem, Route, RESERVED_ROUTES};

pub(super) fn validate(raw: RawConfig, problems: &mut Vec<Problem>) -> Config {
    let raw_shares = super::shares::RawShares::of(&raw);
    let body_min_rate = at_least_one(
        "client_body_min_rate",
        raw.client_body_min_rate,
        64 * 1024,
        " (bytes per second)",
        problems,
    );
    let body_buffer_mib = at_least_one(
        "client_body_buffer_mib",
        raw.client_body_buffer_mib,
        256,
        " (MiB)",
        problems,
    );
    if body_buffer_mib > 1 << 20 {
        problems.push(Problem::new(
            "client_body_buffer_mib",
            "must be at most 1048576 (1 TiB)",
        ));
    }
    let accept_queue = at_least_one("accept_queue", raw.accept_queue, 128, "", problems);
    let max_per_peer = at_least_one(
        "max_connections_per_peer",
        raw.max_connections_per_peer,
        64,
        "",
        problems,
    );
    let max_bodies_per_peer = at_least_one(
        "max_body_readers_per_peer",
        raw.max_body_readers_per_peer,
        8,
        "",
        problems,
    );
    let health_fall = at_least_one("health_fall", raw.health_fall, 3, "", problems);
    let health_rise = at_least_one("health_rise", raw.health_rise, 2, "", problems);
    let mut duration = |key: &str, value: Option<String>, default: &str| {
        let text = value.unwrap_or_else(|| default.to_string());
        match parse_duration(&text) {
            Ok(d) if d.is_zero() => {
                problems.push(Problem::new(key, "must be longer than zero"));
                Duration::from_secs(1)
            }
            Ok(d) => d,
            Err(msg) => {
                problems.push(Problem::new(key, msg));
                Duration::from_secs(1)
            }
        }
    };
    let lease_idle = duration("lease_idle", raw.lease_idle, "2h");
    let keep_requests = duration("keep_requests", raw.keep_requests, "90d");
    let keep_events = duration("keep_events", raw.keep_events, "90d");
    let health_interval = duration("health_interval", raw.health_interval, "5s");
    let queue_timeout = duration("queue_timeout", raw.queue_timeout, "10m");
    let connect_timeout = duration("connect_timeout", raw.connect_timeout, "3s");
    let first_byte_timeout = duration("first_byte_timeout", raw.first_byte_timeout, "15m");
    let shutdown_grace = duration("shutdown_grace", raw.shutdown_grace, "30s");
    let front = crate::conn::Settings {
        header_timeout: duration("client_header_timeout", raw.client_header_timeout, "10s"),
        body_timeout: duration("client_body_timeout", raw.client_body_timeout, "10s"),
        body_min_rate,
        body_buffer: usize::try_from(body_buffer_mib.min(1 << 20) << 20).unwrap_or(usize::MAX),
        keepalive_idle: duration("keepalive_idle", raw.keepalive_idle, "15s"),
        write_timeout: duration("client_write_timeout", raw.client_write_timeout, "60s"),
        accept_queue,
        max_per_peer,
        max_bodies_per_peer,
    };

    let listen = socket_addr(
        "listen",
        raw.listen.as_deref().unwrap_or("0.0.0.0:8080"),
        problems,
    );
    let admin_listen = socket_addr(
        "admin_listen",
        raw.admin_listen.as_deref().unwrap_or("127.0.0.1:8081"),
        problems,
    );
    if listen == admin_listen && listen.port() != 0 {
        problems.push(Problem::new(
            "admin_listen",
            format!("is the same address as listen ({listen})"),
        ));
    } else if overlaps(listen, admin_listen) {
        problems.push(Problem::new(
            "admin_listen",
            format!("overlaps listen ({listen}): same port, and an unspecified address takes every address"),
        ));
    }
    let max_leases = at_least_one(
        "max_leases",
        raw.max_leases,
        crate::lease::MAX_LEASES,
        "",
        problems,
    );
    let workers = at_least_one("workers", raw.workers, 64, "", problems);
    let log_level = match raw.log_level.as_deref().unwrap_or("info").parse() {
        Ok(level) => level,
        Err(_) => {
            problems.push(Problem::new(
                "log_level",
                "must be one of off, error, warn, info, debug, trace",
            ));
            log::LevelFilter::Info
        }
    };
    if raw.admin_token.as_deref() == Some("") {
        problems.push(Problem::new(
            "admin_token",
            "is empty; remove it or set a secret",
        ));
    }
    if raw.hosts.is_empty() {
        problems.push(Problem::new("hosts", "no host is configured"));
    }
    if raw.routes.is_empty() {
        problems.push(Problem::new("routes", "no route is configured"));
    }

    let mut warnings: Vec<String> = Vec::new();
    let mut hosts: BTreeMap<String, Host> = raw
        .hosts
        .into_iter()
        .map(|(name, h)| {
            let host = super::host::validate_host(&name, h, problems, &mut warnings);
            (name, host)
        })
        .collect();
    let routes = raw
        .routes
        .into_iter()
        .map(|(name, r)| {
            if r.spread_new.is_some() {
                warnings.push(format!(
                    "routes.{name}.spread_new is ignored: crossbar now places every new \
                     conversation by load and warm prompt families, and a model listing leaves \
                     no lease to follow; remove the key"
                ));
            }
            let route = validate_route(&name, r, &hosts, problems);
            (name, route)
        })
        .collect();
    imply_models(&mut hosts, &routes, &mut warnings);

    let shares = super::shares::validate_shares(
        raw_shares,
        (workers, max_leases),
        &hosts,
        problems,
        &mut warnings,
    );
    let keys = super::keys::validate_keys(raw.keys, &routes, problems);
    if keys.is_empty() && !listen.ip().is_loopback() {
        warnings.push(format!(
            "listen {listen} is not loopback and no [keys] are set: anyone who can reach the \
             port can use every route; `crossbar key new NAME` makes one"
        ));
    }
    Config {
        listen,
        admin_listen,
        admin_token: raw.admin_token,
        db: raw.db.unwrap_or_else(|| PathBuf::from("crossbar.db")),
        workers,
        lease_idle,
        max_leases,
        max_leases_per_client: shares.max_leases_per_client,
        keep_requests,
        keep_events,
        health_interval,
        health_fall,
        health_rise,
        queue_max: raw.queue_max.unwrap_or(16),
        queue_timeout,
        waiting: shares.waiting,
        connect_timeout,
        first_byte_timeout,
        shutdown_grace,
        front,
        log_level,
        hosts,
        routes,
        keys,
        warnings,
    }
}

/// A count that must be at least 1: `value`, else `default`. A 0 is a problem (`unit` follows "at
/// least 1" in it) and reads as 1, so the rest of validation goes on.
pub(super) fn at_least_one<T: Copy + PartialEq + From<u8>>(
    key: &str,
    value: Option<T>,
    default: T,
    unit: &str,
    problems: &mut Vec<Problem>,
) -> T {
    let n = value.unwrap_or(default);
    if n == T::from(0) {
        problems.push(Problem::new(key, format!("must be at least 1{unit}")));
        return T::from(1);
    }
    n
}

fn socket_addr(key: &str, text: &str, problems: &mut Vec<Problem>) -> SocketAddr {
    text.parse().unwrap_or_else(|_| {
        problems.push(Problem::new(
            key,
            format!("{text:?} is not an address like 127.0.0.1:8080"),
        ));
        SocketAddr::from(([0, 0, 0, 0], 0))
    })
}

fn validate_route(
    name: &str,
    raw: RawRoute,
    hosts: &BTreeMap<String, Host>,
    problems: &mut Vec<Problem>,
) -> Route {
    let key = format!("routes.{name}");
    if !valid_name(name) {
        problems.push(Problem::new(
            &key,
            "route names use only letters, digits, '-' and '_'",
        ));
    } else if RESERVED_ROUTES.contains(&name) {
        problems.push(Problem::new(
            &key,
            format!("{name:?} is reserved; pick another route name"),
        ));
    }
    if raw.hosts.is_empty() {
        problems.push(Problem::new(format!("{key}.hosts"), "names no host"));
    }
    for (i, host) in raw.hosts.iter().enumerate() {
        if !hosts.contains_key(host) {
            // Issue 48: `mni` → `mini`, as config keys get.
            let near = crate::nearest::nearest(host, hosts.keys().map(String::as_str))
                .map_or(String::new(), |near| format!("; did you mean {near:?}?"));
            problems.push(Problem::new(
                format!("{key}.hosts"),
                format!("unknown host {host:?}{near}"),
            ));
        } else if raw.hosts[..i].contains(host) {
            problems.push(Problem::new(
                format!("{key}.hosts"),
                format!("{host:?} is listed twice"),
            ));
        }
    }
    let model = match raw.model {
        Some(model) if !model.is_empty() => model,
        _ => {
            problems.push(Problem::new(format!("{key}.model"), "is missing"));
            String::new()
        }
    };
    // A host without model tables serves what it lists, checked against the host itself.
    let known: Vec<&Host> = raw.hosts.iter().filter_map(|h| hosts.get(h)).collect();
    if !model.is_empty()
        && !known.is_empty()
        && !known
            .iter()
            .any(|h| h.implied || h.models.contains_key(&model))
    {
        problems.push(Problem::new(
            format!("{key}.model"),
            format!("no host of the route serves {model:?}"),
        ));
    }
    Route {
        name: name.to_string(),
        hosts: raw.hosts,
        model,
        move_when_busy: raw.move_when_busy.unwrap_or(false),
    }
}

/// A host without model tables (issue 47: only its `url`) may serve the model of every route that
/// names it; whether it does is what it lists. One no route names serves nothing: a warning.
fn imply_models(
    hosts: &mut BTreeMap<String, Host>,
    routes: &BTreeMap<String, Route>,
    warnings: &mut Vec<String>,
) {
    for route in routes.values() {
        for name in &route.hosts {
            match hosts.get_mut(name) {
                Some(host) if host.implied && !route.model.is_empty() => {
                    host.models.insert(route.model.clone(), None);
                }
                _ => {}
            }
        }
    }
    for host in hosts.values().filter(|h| h.implied && h.models.is_empty()) {
        warnings.push(format!(
            "hosts.{} is in no route and has no [hosts.{}.models.NAME] table: it serves nothing",
            host.name, host.name
        ));
    }
}

pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Whether two different listen addresses cannot both be bound: the same (non-zero) port where
/// either side is unspecified (`0.0.0.0` or `[::]`, which take that port on every address).
fn overlaps(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port() && a.port() != 0 && (a.ip().is_unspecified() || b.ip().is_unspecified())
}
