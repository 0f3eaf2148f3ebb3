//! Polling llama-server hosts: the HTTP side of health (spec §4).
//!
//! [`poll_host`] asks one host `/health`, `/props`, `/v1/models` (and `/models` for router mode)
//! and turns the answers into a [`Poll`]; [`Poller`] runs it on one owned thread per host, so a
//! hung host never delays the others, and applies each result to the [`Health`] table. Parsing
//! is tolerant of older llama-server builds: a missing field means "unknown", never an error.
//! This module never holds the table's lock across a request; it does not decide routing.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use super::{answers, error_chain, DownReason, Health, Poll, RouterModel};
use crate::config;
use crate::logfmt::val;
use crate::slots::{parse_slots, Polled};
use crate::upstream::side;

/// A `/props` or `/v1/models` body crossbar cannot use.
#[derive(Debug)]
pub enum ParseError {
    Json(serde_json::Error),
    /// Valid JSON of the wrong shape; says what was expected.
    Shape(&'static str),
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::Json(_) => f.write_str("invalid JSON"),
            ParseError::Shape(expected) => write!(f, "unexpected JSON: expected {expected}"),
        }
    }
}

impl std::error::Error for ParseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ParseError::Json(err) => Some(err),
            ParseError::Shape(_) => None,
        }
    }
}

/// The largest poll answer read (what ureq 2's `into_string` allowed): a router's `/models` lists
/// every model it knows with its arguments, and no real one comes near this.
const MAX_ANSWER: u64 = 10 << 20;

/// Polls one host. `/health` 200 → go on, 503 → down loading, no answer → down unreachable; any
/// other status, or an unusable `/props` or `/v1/models` body → down, the reason naming the path
/// and what came back. A `/props` that does not exist (404, 501) only leaves the context unknown.
pub fn poll_host(agent: &ureq::Agent, host: &config::Host) -> Poll {
    match poll_up(agent, host) {
        Ok(up) => up,
        Err(reason) => Poll::Down(reason),
    }
}

/// `(per-slot n_ctx, total_slots)` from a `/props` body; missing fields are `None`, and so is an
/// `n_ctx` of 0 (a router's own `/props`): an unknown context, which the guard leaves alone.
pub fn parse_props(body: &str) -> Result<(Option<u64>, Option<u64>), ParseError> {
    let props = answers::props(body)?;
    Ok((props.n_ctx, props.total_slots))
}

/// Loaded model ids and aliases from a `/v1/models` or router `/models` body. Entries with a
/// `status` (router mode) count only when it says `loaded`; entries without one are loaded.
pub fn parse_models(body: &str) -> Result<Vec<String>, ParseError> {
    parse_model_list(body).map(|list| list.loaded)
}

/// Polls every host on its own thread until stopped.
#[derive(Debug)]
pub struct Poller {
    /// Dropping it disconnects the channel every thread waits on: that is the stop signal.
    stop: Option<Sender<()>>,
    threads: Vec<thread::JoinHandle<()>>,
}

/// What the rest of crossbar does with each poll, on the host's own poller thread.
pub trait Watch: Send + Sync {
    /// Requests crossbar has in flight on `host` now (asked as each poll starts).
    fn in_flight(&self, host: &str) -> usize;
    /// After each poll is applied: what `/slots` showed when the host answered it, and what
    /// [`Watch::in_flight`] said as the poll started. May take a while (the probe): only this
    /// host's next poll waits for it.
    fn polled(&self, host: &config::Host, seen: Option<&Seen>, before: usize);
}

/// What a `/slots` poll showed, and when it started ([`crate::slots::now_us`]).
#[derive(Debug, Clone)]
pub struct Seen {
    pub slots: Polled,
    pub started: i64,
}

impl Poller {
    /// Starts one thread per host; each polls at once, then every `interval`, and tells `watch`.
    pub fn start(
        health: Arc<Health>,
        watch: Arc<dyn Watch>,
        hosts: Vec<config::Host>,
        (interval, timeout): (Duration, Duration),
    ) -> Poller {
        let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(0);
        let agent = side::poll_agent(timeout);
        let threads = hosts
            .into_iter()
            .map(|host| {
                let watch = (Arc::clone(&health), Arc::clone(&watch));
                let (agent, stop_rx) = (agent.clone(), stop_rx.clone());
                thread::Builder::new()
                    .name(format!("health-{}", host.name))
                    .spawn(move || poll_loop(&watch, &agent, &host, interval, &stop_rx))
                    .expect("spawning a health thread")
            })
            .collect();
        Poller {
            stop: Some(stop_tx),
            threads,
        }
    }

    /// Stops every thread and joins it. A thread in the middle of a poll finishes it first, which
    /// the agent's timeouts bound.
    pub fn stop(mut self) {
        self.stop.take();
        for handle in self.threads.drain(..) {
            if handle.join().is_err() {
                log::error!("health thread panicked");
            }
        }
    }
}

/// Polls at most this often, however often a failed forward asks (issue 24).
pub const MIN_GAP: Duration = Duration::from_secs(1);

fn poll_loop(
    (health, watch): &(Arc<Health>, Arc<dyn Watch>),
    agent: &ureq::Agent,
    host: &config::Host,
    interval: Duration,
    stop: &Receiver<()>,
) {
    // One poke waits at most: a burst of failed forwards asks for one poll, not a poll each.
    let (poke, poked) = crossbeam_channel::bounded::<()>(1);
    health.set_poke(&host.name, poke);
    loop {
        let started = Instant::now();
        let before = watch.in_flight(&host.name);
        let poll = poll_host(agent, host);
        let single = matches!(&poll, Poll::Up { router: false, .. });
        health.apply(&host.name, poll, unix_ms());
        let seen = single.then(|| read_slots(agent, host)).flatten();
        watch.polled(host, seen.as_ref(), before);
        // The next poll is due one interval after this one started, however long it took, or a
        // second after it when a failed forward asks sooner.
        crossbeam_channel::select! {
            recv(stop) -> _ => return,
            recv(poked) -> _ => {
                if let Ok(()) | Err(RecvTimeoutError::Disconnected) =
                    stop.recv_deadline(started + MIN_GAP)
                {
                    return;
                }
            }
            default(interval.saturating_sub(started.elapsed())) => {}
        }
    }
}

/// What `/slots` shows of a single-model host: its idle and busy slots (the pinning mirror's
/// doubts, an exclusive host's foreign tasks) and its largest task id (a restart). A host without
/// the endpoint (`--no-slots`) shows nothing, which is no reason to think it down.
fn read_slots(agent: &ureq::Agent, host: &config::Host) -> Option<Seen> {
    let started = crate::slots::now_us();
    let seen = fetch(agent, host, "/slots")
        .map_err(|reason| reason.to_string())
        .and_then(|body| parse_slots(&body).ok_or_else(|| "not an array of slots".to_string()));
    match seen {
        Ok(slots) => Some(Seen { slots, started }),
        Err(reason) => {
            log::debug!(
                "/slots unread host={} reason={}",
                val(&host.name),
                val(&reason)
            );
            None
        }
    }
}

fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn poll_up(agent: &ureq::Agent, host: &config::Host) -> Result<Poll, DownReason> {
    fetch(agent, host, "/health")?;
    let (per_slot_ctx, total_slots, max_instances, build) = match fetch(agent, host, "/props") {
        Ok(body) => {
            let props = answers::props(&body).map_err(|e| bad_answer("/props", &e))?;
            (
                props.n_ctx,
                props.total_slots,
                props.max_instances,
                props.build,
            )
        }
        Err(DownReason::Status {
            status: 404 | 501, ..
        }) => (None, None, None, None),
        Err(reason) => return Err(reason),
    };
    let models = parse_model_list(&fetch(agent, host, "/v1/models")?)
        .map_err(|e| bad_answer("/v1/models", &e))?;
    let list = if models.router {
        models
    } else {
        // A router may only say which models are loaded on `/models`. Anything but a router
        // answer there (404 on older builds, the same plain list) leaves `/v1/models` in charge.
        match fetch(agent, host, "/models").map(|body| parse_model_list(&body)) {
            Ok(Ok(router)) if router.router => router,
            _ => models,
        }
    };
    Ok(Poll::Up {
        per_slot_ctx,
        total_slots,
        loaded: list.loaded,
        router: list.router,
        models: list.models,
        max_instances,
        build,
        ctx_train: list.ctx_train,
    })
}

fn bad_answer(path: &str, err: &ParseError) -> DownReason {
    DownReason::BadAnswer {
        path: path.to_string(),
        error: err.to_string(),
    }
}

/// GETs `path` and returns the body of a 200 answer (at most [`MAX_ANSWER`] bytes); anything else
/// as the reason it is down.
fn fetch(agent: &ureq::Agent, host: &config::Host, path: &str) -> Result<String, DownReason> {
    use crate::upstream::side::GetError;
    let path = path.to_string();
    side::get(agent, host, &path, MAX_ANSWER).map_err(|err| match err {
        GetError::Unreachable(err) => DownReason::Unreachable {
            path,
            error: error_chain(&err),
        },
        GetError::Body(err) => DownReason::Unreachable {
            path,
            error: format!("reading the body: {}", error_chain(&err)),
        },
        GetError::Status(503) => DownReason::Loading { path },
        GetError::Status(status) => DownReason::Status { path, status },
    })
}

/// A models list: what is loaded, whether any entry carried a router `status`, and the router's
/// models (at most [`MAX_ROUTER_MODELS`]).
struct ModelList {
    loaded: Vec<String>,
    router: bool,
    models: Vec<RouterModel>,
    /// The first entry's training context (a single-model host lists one model).
    ctx_train: Option<u64>,
}

/// A host's answer sizes nothing in crossbar beyond this many models.
const MAX_ROUTER_MODELS: usize = 256;

/// The loaded ids and aliases kept per host (first come). The chooser and the guard only ask
/// about configured models, and no real host lists this many; a hostile listing of 700 k names
/// would otherwise cost every request's `Health::is_loaded` scan.
pub(super) const MAX_LOADED: usize = 1024;

fn parse_model_list(body: &str) -> Result<ModelList, ParseError> {
    let mut list = ModelList {
        loaded: Vec::new(),
        router: false,
        models: Vec::new(),
        ctx_train: None,
    };
    // Names kept so far: one lookup per name, not a scan of `loaded` (quadratic over a listing).
    let mut seen = BTreeSet::new();
    answers::listing(body, &mut |entry| {
        list.ctx_train = list.ctx_train.or(entry.ctx_train);
        if let Some(model) = RouterModel::of(&entry) {
            if list.models.len() < MAX_ROUTER_MODELS {
                list.models.push(model);
            }
        }
        if let Some(status) = &entry.status {
            list.router = true;
            // `{"value": "loaded", ...}`; a bare string is accepted too. Anything else: not loaded.
            if status.value.as_deref() != Some("loaded") {
                return;
            }
        }
        for name in entry.id.into_iter().chain(entry.aliases) {
            if list.loaded.len() >= MAX_LOADED {
                return;
            }
            if seen.insert(name.clone()) {
                list.loaded.push(name);
            }
        }
    })?;
    Ok(list)
}

#[cfg(test)]
mod tests;
