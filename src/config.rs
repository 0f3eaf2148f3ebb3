//! The configuration: `crossbar.toml` read in two stages.
//!
//! [`RawConfig`] mirrors the file for serde; [`Config::from_toml`] turns it into a validated
//! [`Config`] with every default applied and every problem collected, each naming its key. Nothing
//! else in crossbar reads TOML or applies a default. This module does no I/O beyond [`Config::load`].

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// Names a route may not take: they would shadow llama-server paths or crossbar's own.
const RESERVED_ROUTES: &[&str] = &["v1", "health", "props", "admin", "metrics"];

/// A validated configuration: defaults applied, cross references checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub admin_token: Option<String>,
    pub db: PathBuf,
    pub workers: usize,
    pub lease_idle: Duration,
    pub health_interval: Duration,
    pub queue_max: usize,
    pub queue_timeout: Duration,
    pub connect_timeout: Duration,
    /// Longest silence tolerated from an upstream, the wait for the first byte (prefill) included.
    pub first_byte_timeout: Duration,
    /// How long a stop waits for in-flight requests.
    pub shutdown_grace: Duration,
    pub log_level: log::LevelFilter,
    pub hosts: BTreeMap<String, Host>,
    pub routes: BTreeMap<String, Route>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Host {
    pub name: String,
    /// Base URL without a trailing slash, e.g. `http://192.168.1.10:8080`.
    pub url: String,
    pub weight: u32,
    pub api_key: Option<String>,
    /// Operator override of the per-slot context that `/props` reports.
    pub ctx: Option<u64>,
    /// Model name → parallel slots for it.
    pub models: BTreeMap<String, usize>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    pub name: String,
    /// Candidate hosts, in order of preference for ties.
    pub hosts: Vec<String>,
    /// The model used when a request body names none.
    pub model: String,
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|err| ConfigError::Read {
            path: path.to_path_buf(),
            err,
        })?;
        Config::from_toml(&text)
    }

    /// Parses and validates config text, reporting every problem found.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let mut problems = Vec::new();
        let deserializer = toml::Deserializer::new(text);
        let raw: RawConfig = serde_ignored::deserialize(deserializer, |path| {
            problems.push(Problem::new(path.to_string(), "unknown key"))
        })
        .map_err(|err| ConfigError::Syntax(err.to_string().trim_end().to_string()))?;
        let config = validate(raw, &mut problems);
        if problems.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError::Invalid(problems))
        }
    }

    /// Whether `host` lists `model` among the models it serves.
    pub fn serves(&self, host: &str, model: &str) -> bool {
        self.hosts
            .get(host)
            .is_some_and(|h| h.models.contains_key(model))
    }

    /// The slots `host` has for `model`; 0 when it does not serve it.
    pub fn parallel(&self, host: &str, model: &str) -> usize {
        self.hosts
            .get(host)
            .and_then(|h| h.models.get(model))
            .copied()
            .unwrap_or(0)
    }
}

/// One problem in a config, tied to the key it concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub key: String,
    pub message: String,
}

impl Problem {
    fn new(key: impl Into<String>, message: impl Into<String>) -> Problem {
        Problem {
            key: key.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

#[derive(Debug)]
pub enum ConfigError {
    Read {
        path: PathBuf,
        err: std::io::Error,
    },
    /// The text is not TOML of the expected shape (wrong type, bad syntax).
    Syntax(String),
    Invalid(Vec<Problem>),
}

impl ConfigError {
    /// One line per problem, for `crossbar check` and start-up errors.
    pub fn lines(&self) -> Vec<String> {
        match self {
            ConfigError::Invalid(problems) => problems.iter().map(|p| p.to_string()).collect(),
            other => vec![other.to_string()],
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Read { path, err } => write!(f, "cannot read {}: {err}", path.display()),
            ConfigError::Syntax(msg) => write!(f, "config is not valid TOML: {}", one_line(msg)),
            ConfigError::Invalid(problems) => {
                let lines: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
                write!(f, "{}", lines.join("; "))
            }
        }
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConfigError::Read { err, .. } => Some(err),
            _ => None,
        }
    }
}

fn one_line(msg: &str) -> String {
    msg.split('\n')
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.chars().all(|c| c == '|' || c == ' ' || c == '^'))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Parses `500ms`, `30s`, `5m`, `2h`, `1d`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 500ms, 30s, 5m, 2h or 1d"))?;
    let millis = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("{text:?} has no unit; use ms, s, m, h or d")),
    };
    n.checked_mul(millis)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?} is too long"))
}

// ---- stage one: the file as serde sees it ----

#[derive(Debug, Deserialize)]
struct RawConfig {
    listen: Option<String>,
    admin_listen: Option<String>,
    admin_token: Option<String>,
    db: Option<PathBuf>,
    workers: Option<usize>,
    lease_idle: Option<String>,
    health_interval: Option<String>,
    queue_max: Option<usize>,
    queue_timeout: Option<String>,
    connect_timeout: Option<String>,
    first_byte_timeout: Option<String>,
    shutdown_grace: Option<String>,
    log_level: Option<String>,
    #[serde(default)]
    hosts: BTreeMap<String, RawHost>,
    #[serde(default)]
    routes: BTreeMap<String, RawRoute>,
}

#[derive(Debug, Deserialize)]
struct RawHost {
    url: Option<String>,
    weight: Option<u32>,
    api_key: Option<String>,
    ctx: Option<u64>,
    #[serde(default)]
    models: BTreeMap<String, RawModel>,
}

#[derive(Debug, Deserialize)]
struct RawModel {
    parallel: Option<i64>,
}

#[derive(Debug, Deserialize)]
struct RawRoute {
    #[serde(default)]
    hosts: Vec<String>,
    model: Option<String>,
}

// ---- stage two: validation ----

fn validate(raw: RawConfig, problems: &mut Vec<Problem>) -> Config {
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
    let health_interval = duration("health_interval", raw.health_interval, "5s");
    let queue_timeout = duration("queue_timeout", raw.queue_timeout, "10m");
    let connect_timeout = duration("connect_timeout", raw.connect_timeout, "3s");
    let first_byte_timeout = duration("first_byte_timeout", raw.first_byte_timeout, "15m");
    let shutdown_grace = duration("shutdown_grace", raw.shutdown_grace, "30s");

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
    }
    let workers = raw.workers.unwrap_or(64);
    if workers == 0 {
        problems.push(Problem::new("workers", "must be at least 1"));
    }
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

    let hosts: BTreeMap<String, Host> = raw
        .hosts
        .into_iter()
        .map(|(name, h)| {
            let host = validate_host(&name, h, problems);
            (name, host)
        })
        .collect();
    let routes = raw
        .routes
        .into_iter()
        .map(|(name, r)| {
            let route = validate_route(&name, r, &hosts, problems);
            (name, route)
        })
        .collect();

    Config {
        listen,
        admin_listen,
        admin_token: raw.admin_token,
        db: raw.db.unwrap_or_else(|| PathBuf::from("crossbar.db")),
        workers,
        lease_idle,
        health_interval,
        queue_max: raw.queue_max.unwrap_or(16),
        queue_timeout,
        connect_timeout,
        first_byte_timeout,
        shutdown_grace,
        log_level,
        hosts,
        routes,
    }
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

fn validate_host(name: &str, raw: RawHost, problems: &mut Vec<Problem>) -> Host {
    let key = format!("hosts.{name}");
    if !valid_name(name) {
        problems.push(Problem::new(
            &key,
            "host names use only letters, digits, '-' and '_'",
        ));
    }
    let url = match raw.url {
        None => {
            problems.push(Problem::new(format!("{key}.url"), "is missing"));
            String::new()
        }
        Some(url) => check_url(&url).unwrap_or_else(|msg| {
            problems.push(Problem::new(format!("{key}.url"), msg));
            url
        }),
    };
    if raw.weight == Some(0) {
        problems.push(Problem::new(format!("{key}.weight"), "must be at least 1"));
    }
    if raw.ctx == Some(0) {
        problems.push(Problem::new(
            format!("{key}.ctx"),
            "must be at least 1 token",
        ));
    }
    if raw.models.is_empty() {
        problems.push(Problem::new(
            format!("{key}.models"),
            "the host serves no model",
        ));
    }
    let models = raw
        .models
        .into_iter()
        .map(|(model, m)| {
            let parallel = m.parallel.unwrap_or(1);
            if parallel < 1 {
                problems.push(Problem::new(
                    format!("{key}.models.{model}.parallel"),
                    format!("is {parallel}; a host has at least 1 slot"),
                ));
            }
            (model, parallel.max(1) as usize)
        })
        .collect();
    Host {
        name: name.to_string(),
        url,
        weight: raw.weight.unwrap_or(1),
        api_key: raw.api_key.filter(|k| !k.is_empty()),
        ctx: raw.ctx,
        models,
    }
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
            problems.push(Problem::new(
                format!("{key}.hosts"),
                format!("unknown host {host:?}"),
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
    let known: Vec<&Host> = raw.hosts.iter().filter_map(|h| hosts.get(h)).collect();
    if !model.is_empty()
        && !known.is_empty()
        && !known.iter().any(|h| h.models.contains_key(&model))
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
    }
}

pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Checks an upstream base URL and returns it without a trailing slash.
fn check_url(url: &str) -> Result<String, String> {
    let rest = match url.split_once("://") {
        Some(("http", rest)) => rest,
        Some(("https", _)) => {
            return Err(format!(
                "{url:?}: https is not supported; put llama-server on http"
            ))
        }
        _ => return Err(format!("{url:?} is not an http:// URL")),
    };
    let authority = rest.split('/').next().unwrap_or("");
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) if !authority.ends_with(']') => (host, Some(port)),
        _ => (authority, None),
    };
    if host.is_empty() || host.contains(['@', ' ', '?', '#']) {
        return Err(format!("{url:?} has no valid host name"));
    }
    if let Some(port) = port {
        if port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(format!("{url:?} has a bad port {port:?}"));
        }
    }
    if rest.contains(['?', '#']) {
        return Err(format!("{url:?} must not carry a query or fragment"));
    }
    Ok(url.trim_end_matches('/').to_string())
}

#[cfg(test)]
mod tests;
