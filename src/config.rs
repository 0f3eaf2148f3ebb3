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
    /// Most leases kept; beyond it the least recently used idle one is evicted.
    pub max_leases: usize,
    /// Most leases one client (its key, else its address) keeps; beyond it its own least
    /// recently used idle one is evicted (issue 46).
    pub max_leases_per_client: usize,
    /// How long accounting rows and lease events are kept before background pruning.
    pub keep_requests: Duration,
    pub keep_events: Duration,
    pub health_interval: Duration,
    /// Failed polls, or forwards that may have reached the host and failed, in a row that take a
    /// host down (issue 24).
    pub health_fall: u32,
    /// Good polls in a row that bring a down host back.
    pub health_rise: u32,
    pub queue_max: usize,
    pub queue_timeout: Duration,
    /// What requests waiting for a slot may hold, all queues together and per client (issue 46).
    pub waiting: crate::limiter::Waiting,

    pub connect_timeout: Duration,
    /// Longest silence tolerated from an upstream, the wait for the first byte (prefill) included.
    pub first_byte_timeout: Duration,
    /// How long a stop waits for in-flight requests.
    pub shutdown_grace: Duration,
    /// The connection layer's limits (`client_header_timeout`, `client_body_timeout`,
    /// `client_body_min_rate`, `keepalive_idle`, `client_write_timeout`, `accept_queue`,
    /// `max_connections_per_peer`, `max_body_readers_per_peer`).
    pub front: crate::conn::Settings,
    pub log_level: log::LevelFilter,
    pub hosts: BTreeMap<String, Host>,
    pub routes: BTreeMap<String, Route>,
    /// Client keys (issue 25); none: the client port is open, as before.
    pub keys: BTreeMap<String, ClientKey>,
    /// What works but is probably not what the operator meant (a retired key, say): `check`
    /// prints each, `serve` logs each at start.
    pub warnings: Vec<String>,
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
    /// Operator override of how many tokens the host's KV cache holds in all (placement's
    /// capacity), e.g. for llama-server's RAM prompt cache, which crossbar cannot read.
    pub kv_tokens: Option<u64>,
    /// The `--slot-prompt-similarity` the operator says the host runs with; `None`: learned
    /// from the host (`learn`). Above 0, a new conversation takes the idle slot of a sibling
    /// sharing its prompt family and wipes that sibling's history (issue 23).
    pub slot_prompt_similarity: Option<f64>,
    /// Nothing but crossbar talks to this host (issue 47), so crossbar may pick the slot inside
    /// it for each request (`id_slot`, `slots.rs`) — until it sees a slot busy with a task it did
    /// not start.
    pub exclusive: bool,
    /// Whether the host's RAM prompt cache (`--cache-ram`) gives an evicted conversation its
    /// history back, as the operator says; `None`: learned from the host (`learn`).
    pub ram_cache: Option<bool>,
    /// Model name → its `parallel` override (`None`: the host's own slot count for it).
    pub models: BTreeMap<String, Option<usize>>,
    /// The host has no `[hosts.NAME.models.M]` tables: its models are the ones the routes naming
    /// it use, and whether it serves each is what it lists (issue 47).
    pub implied: bool,
    /// Model name → the name this host knows it by (`upstream`), where they differ.
    pub upstream: BTreeMap<String, String>,
}

impl Host {
    /// The name this host knows `model` by: its `upstream`, else the model's own.
    pub fn upstream_name<'a>(&'a self, model: &'a str) -> &'a str {
        self.upstream.get(model).map_or(model, String::as_str)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    pub name: String,
    /// Candidate hosts, in order of preference for ties.
    pub hosts: Vec<String>,
    /// The model used when a request body names none.
    pub model: String,
    /// A conversation whose host is far too busy moves to a free one (issue 23). Off by default.
    pub move_when_busy: bool,
}

impl Config {
    /// Reads and validates a config file. A relative `db` is the config file's neighbour, made
    /// absolute ([`resolve_db`]), so every command reads the same db from any directory.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|err| ConfigError::Read {
            path: path.to_path_buf(),
            err,
        })?;
        let mut config = Config::from_toml(&text)?;
        config.db = resolve_db(path, &config.db)?;
        Ok(config)
    }

    /// Parses and validates config text, reporting every problem found: TOML that does not parse
    /// is one error; otherwise every wrongly typed value, unknown key and invalid setting is a
    /// problem of its own, each naming its key.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let mut table: toml::Table = text
            .parse()
            .map_err(|err: toml::de::Error| syntax_error(text, &err))?;
        let mut problems = Vec::new();
        let mut mistyped = Vec::new();
        // A wrongly typed value stops deserialization: note it, take it out, and go again, so one
        // mistake does not hide the others. Each round removes a key, so this ends.
        let raw: RawConfig = loop {
            let mut unknown = Vec::new();
            let mut track = serde_path_to_error::Track::new();
            let value = toml::Value::Table(table.clone());
            let tracked = serde_path_to_error::Deserializer::new(value, &mut track);
            match serde_ignored::deserialize(tracked, |path| unknown.push(path.to_string())) {
                Ok(raw) => {
                    problems.extend(unknown.into_iter().map(|k| {
                        let message = match suggest::for_key(&k) {
                            Some(near) => format!("unknown key; did you mean `{near}`?"),
                            None => "unknown key".to_string(),
                        };
                        Problem::new(k, message)
                    }));
                    break raw;
                }
                Err(err) => {
                    let key = track.path().to_string();
                    // toml adds "in `key`" on a second line; the key is already the problem's.
                    let message = err.to_string();
                    let message = message.lines().next().unwrap_or_default().to_string();
                    problems.push(Problem::new(key.clone(), message));
                    if !remove_key(&mut table, &key) {
                        return Err(ConfigError::Invalid(problems));
                    }
                    mistyped.push(key);
                }
            }
        };
        let mut settings = Vec::new();
        let config = validate(raw, &mut settings);
        // A removed value may also be reported as missing; its type problem says it better.
        problems.extend(settings.into_iter().filter(|p| !mistyped.contains(&p.key)));
        if problems.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError::Invalid(problems))
        }
    }

    /// Whether `host` may serve `model`: a model its tables list, or (a host with none) one a
    /// route naming it uses. Whether it does is the host's to say (`Health::serves`).
    pub fn serves(&self, host: &str, model: &str) -> bool {
        self.hosts
            .get(host)
            .is_some_and(|h| h.models.contains_key(model))
    }

    /// The models any of `hosts` lists, sorted, each once.
    pub fn models_of(&self, hosts: &[String]) -> Vec<String> {
        let set: std::collections::BTreeSet<&String> = hosts
            .iter()
            .filter_map(|h| self.hosts.get(h))
            .flat_map(|h| h.models.keys())
            .collect();
        set.into_iter().cloned().collect()
    }

    /// The `parallel` the config gives `host` for `model`; `None` when the host's own slot
    /// count decides (or it does not serve it).
    pub fn parallel(&self, host: &str, model: &str) -> Option<usize> {
        self.hosts
            .get(host)
            .and_then(|h| h.models.get(model))
            .copied()
            .flatten()
    }
}

/// Where `db`, as written in the config file at `config`, is: an absolute path as it is; a relative
/// one against the config file's directory (issue 27: it was the working directory's, so `check`
/// in a shell and `serve` under systemd could open two different files), made absolute. An
/// upgrade that would start on an empty db — a file at the old, working-directory place and none
/// at the new one — is refused, naming both.
fn resolve_db(config: &Path, db: &Path) -> Result<PathBuf, ConfigError> {
    if db.is_absolute() {
        return Ok(db.to_path_buf());
    }
    let absolute = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    // The directory exists (the config was just read from it): its real path, without `..`.
    let dir = match config.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let new = std::fs::canonicalize(dir).map_or_else(|_| absolute(&dir.join(db)), |d| d.join(db));
    let old = absolute(db);
    if old != new && old.exists() && !new.exists() {
        let message = format!(
            "{db:?} is now read next to the config file, as {new}, where there is no database; \
             {old} (the working directory, where crossbar looked before) has one. Move it to \
             {new}, or set db = {old:?}",
            new = new.display(),
            old = old.display(),
        );
        return Err(ConfigError::Invalid(vec![Problem::new("db", message)]));
    }
    Ok(new)
}

/// Removes the value at a dotted `key` path (as serde_path_to_error prints it); false when there is
/// none (the problem is with the whole file).
fn remove_key(table: &mut toml::Table, key: &str) -> bool {
    let mut parts: Vec<&str> = key.split('.').collect();
    let Some(last) = parts.pop() else {
        return false;
    };
    let mut current = table;
    for part in parts {
        match current.get_mut(part) {
            Some(toml::Value::Table(inner)) => current = inner,
            _ => return false,
        }
    }
    current.remove(last).is_some()
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
    /// The text is not TOML: the parser's message, and where (1-based line and column, and that
    /// line's text) when it knows.
    Syntax {
        message: String,
        at: Option<(usize, usize, String)>,
    },
    Invalid(Vec<Problem>),
}

impl ConfigError {
    /// What `crossbar check` and a failed start print: one line per problem; a syntax error's
    /// line is followed by the source line, indented, and a caret under the column.
    pub fn lines(&self) -> Vec<String> {
        match self {
            ConfigError::Syntax {
                at: Some((_, column, source)),
                ..
            } => {
                let caret = " ".repeat(column.saturating_sub(1));
                vec![
                    self.to_string(),
                    format!("    {source}"),
                    format!("    {caret}^"),
                ]
            }
            other => other.problems(),
        }
    }

    /// One line per problem and nothing else, for the log (a refused reload).
    pub fn problems(&self) -> Vec<String> {
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
            ConfigError::Syntax { message, at } => {
                write!(f, "config is not valid TOML")?;
                if let Some((line, column, _)) = at {
                    write!(f, " at line {line}, column {column}")?;
                }
                write!(f, ": {}", one_line(message))
            }
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

/// A parse error as the parser reports it, with the line and column of its span.
fn syntax_error(text: &str, err: &toml::de::Error) -> ConfigError {
    let at = err.span().map(|span| {
        let start = span.start.min(text.len());
        let before = &text[..start];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = text[line_start..start].chars().count() + 1;
        let source = text[line_start..].lines().next().unwrap_or("").to_string();
        (line, column, source)
    });
    ConfigError::Syntax {
        message: err.message().to_string(),
        at,
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
        "" => return Err(format!("{text:?} has no unit; use ms, s, m, h or d")),
        unit => {
            return Err(format!(
                "{text:?} has an unknown unit {unit:?}; use ms, s, m, h or d"
            ))
        }
    };
    n.checked_mul(millis)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?} is too long"))
}

mod host;
mod keys;
mod raw;
mod shares;
mod suggest;
mod validate;

pub use keys::ClientKey;
pub use suggest::all_keys;

#[cfg(test)]
use host::check_url;
pub use host::{MAX_API_KEY, MAX_URL};
use raw::RawConfig;
pub(crate) use validate::valid_name;
use validate::validate;

#[cfg(test)]
mod tests;
