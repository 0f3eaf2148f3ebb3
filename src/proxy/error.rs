//! [`ProxyError`]: every reason crossbar answers a request itself, with its status, JSON body (in
//! the client's API's envelope, `envelope`) and `Retry-After` (spec §2's error table). Pure.

use std::fmt;

use crate::envelope::{self, Shape};
use crate::lease::LeaseError;
use crate::limiter::LimitError;

/// Why crossbar answers a request itself instead of forwarding it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxyError {
    /// No route in the path or header; `routes` are the configured ones, for the hint.
    MissingRoute {
        routes: Vec<String>,
    },
    ConflictingRoute,
    UnknownRoute {
        route: String,
        routes: Vec<String>,
    },
    NotFound,
    /// `/projA/chat/completions`: a path that exists under `/v1`; the client's base URL lacks it.
    MissingV1 {
        route: String,
    },
    /// The client's base URL carries what the client adds itself, or the route in the wrong
    /// place (issue 48): `/projA/v1/v1/messages`. Refused before the lease.
    BaseUrl {
        route: String,
        mistake: Mistake,
    },
    /// No candidate of the route lists the model (spec §2): 404 with what the route serves.
    ModelNotFound {
        model: String,
        served: Vec<String>,
    },
    BodyTooLarge,
    /// Fits no candidate. `exact` is the host's own count when it was asked and answered.
    PromptTooLarge {
        estimate: u64,
        exact: Option<u64>,
        max: u64,
    },
    /// No candidate could take the request; each candidate host with why not (issue 24), filled
    /// in when the answer is made (`record::refuse`).
    NoHealthyHost(Vec<(String, String)>),
    PinnedDown(String),
    QueueFull,
    /// Waiting would take the requests in line over a bound on all the queues together or on
    /// the client's share (issue 46): the bound, named in the answer.
    WaitingFull(crate::limiter::Bound),
    QueueTimeout,
    ShuttingDown,
    /// The lease could not be written: the store fails (disk full, read-only file).
    StoreUnavailable,
    Upstream {
        host: String,
        detail: String,
        /// The host refused the connection (or it timed out): it got nothing, so the request may
        /// go to the next candidate once (issue 24).
        refused: bool,
    },
    /// The request body could not be read: malformed chunked framing, or the client went away
    /// mid-upload. The client's fault, not crossbar's.
    BadBody(String),
    /// The request itself is malformed or cannot be forwarded as sent: a dot segment, backslash,
    /// encoded `/` or NUL in the path, a header name or value upstream would refuse (spec §2's
    /// "bad request (+ what)"). The client's fault; it never counts against a host.
    BadRequest(String),
    /// The head, as crossbar would send it upstream, is over what it writes
    /// (`upstream::HEAD_ROOM`) or what llama-server reads (a line over 8,192 bytes, more than
    /// 100 lines): the client's 431, saying which, decided before anything is sent.
    HeadTooLarge(&'static str),
    /// The request line, as crossbar would send it upstream, is over what llama-server reads
    /// (32,768 bytes: past it the host closes without a word): the client's 414.
    UriTooLong,
    /// No client key sent (issue 25). Names no key or route.
    Unauthorized,
    /// A client key this gateway does not know (issue 48: told apart from none at all). Says
    /// nothing about the keys it knows.
    UnknownKey,
    /// Keys that cannot be read as one: two that disagree, one header twice, an `Authorization`
    /// that is not `Bearer`.
    UnreadableKey,
    /// A client key not allowed on the route.
    Forbidden,
    /// A client key over its limits, or an address over its failed keys: retry after so many
    /// seconds.
    TooManyRequests {
        retry_after: u64,
        why: &'static str,
    },
    /// The body did not arrive within its deadline (`client_body_timeout` plus its size at
    /// `client_body_min_rate`).
    BodyTimeout,
    /// The bodies being received hold `client_body_buffer_mib` already (issue 24).
    BodiesBusy,
    /// The body is still coming: the connection layer reads it off the workers and calls the
    /// handler again. Never answered, never recorded.
    BodyLater,
    /// The client left before an answer could start (queued for a slot): recorded as 499, never
    /// answered.
    ClientGone(&'static str),
    Internal(String),
}

impl ProxyError {
    pub fn status(&self) -> u16 {
        match self {
            ProxyError::MissingRoute { .. }
            | ProxyError::ConflictingRoute
            | ProxyError::BadBody(_)
            | ProxyError::BadRequest(_) => 400,
            ProxyError::PromptTooLarge { .. } => 400,
            ProxyError::UnknownRoute { .. }
            | ProxyError::NotFound
            | ProxyError::MissingV1 { .. }
            | ProxyError::BaseUrl { .. }
            | ProxyError::ModelNotFound { .. } => 404,
            ProxyError::BodyTooLarge => 413,
            ProxyError::HeadTooLarge(_) => 431,
            ProxyError::UriTooLong => 414,
            ProxyError::Unauthorized | ProxyError::UnknownKey | ProxyError::UnreadableKey => 401,
            ProxyError::Forbidden => 403,
            ProxyError::TooManyRequests { .. } => 429,
            ProxyError::BodyTimeout => 408,
            ProxyError::ClientGone(_) => 499,
            ProxyError::NoHealthyHost(_)
            | ProxyError::PinnedDown(_)
            | ProxyError::QueueFull
            | ProxyError::WaitingFull(_)
            | ProxyError::QueueTimeout
            | ProxyError::StoreUnavailable
            | ProxyError::BodiesBusy
            | ProxyError::BodyLater
            | ProxyError::ShuttingDown => 503,
            ProxyError::Upstream { .. } => 502,
            ProxyError::Internal(_) => 500,
        }
    }

    /// The JSON answer in the envelope of the API the client speaks (issue 27, `envelope`):
    /// `code` is the error's words (`Display`), `message` those words and how to fix the request
    /// or what went wrong, and the error object carries the fields the spec names, and for a
    /// client's addressing mistake a `hint` (issue 13).
    pub fn body(&self, shape: Shape) -> serde_json::Value {
        let mut fields = Vec::new();
        if let Some(hint) = self.hint(shape) {
            fields.push(("hint", hint.into()));
        }
        match self {
            ProxyError::ModelNotFound { model, served } => {
                fields.push(("model", model.clone().into()));
                fields.push(("served", served.clone().into()));
            }
            ProxyError::UnknownRoute { route, .. } => fields.push(("route", route.clone().into())),
            ProxyError::PromptTooLarge {
                estimate,
                exact,
                max,
            } => {
                fields.push(("estimate", (*estimate).into()));
                if let Some(exact) = exact {
                    fields.push(("exact", (*exact).into()));
                }
                fields.push(("max", (*max).into()));
            }
            ProxyError::Upstream { host, .. } | ProxyError::PinnedDown(host) => {
                fields.push(("host", host.clone().into()));
            }
            ProxyError::BadRequest(detail) => fields.push(("detail", detail.clone().into())),
            ProxyError::WaitingFull(bound) => fields.push(("bound", bound.key().into())),
            ProxyError::NoHealthyHost(hosts) => {
                let why: serde_json::Map<String, serde_json::Value> = (hosts.iter())
                    .map(|(host, why)| (host.clone(), why.clone().into()))
                    .collect();
                fields.push(("hosts", why.into()));
            }
            _ => {}
        }
        let code = self.to_string();
        let message = format!("{code}: {}", self.what(shape));
        envelope::body(shape, self.status(), &code, &message, fields)
    }

    /// What went wrong, or for an addressing mistake how to fix it (its [`hint`](Self::hint)): a
    /// sentence a person can act on, naming nothing a client should not see (an upstream's or an
    /// internal error's detail stays in the log and the row).
    fn what(&self, shape: Shape) -> String {
        match self {
            ProxyError::ConflictingRoute => {
                "the path names one route and X-Crossbar-Route another; name one".to_string()
            }
            ProxyError::BodyTooLarge => format!(
                "the request body is over {} MiB, the most crossbar reads",
                super::plan::MAX_BODY >> 20
            ),
            ProxyError::Unauthorized => {
                "this gateway needs a client key: send it as Authorization: Bearer <key> (OpenAI \
                 SDKs: api_key), x-api-key (Anthropic SDK, Claude Code) or api-key"
                    .to_string()
            }
            ProxyError::UnknownKey => {
                "the client key sent is not one this gateway knows: check the key you were given \
                 (a character missing, a space, a key for another gateway)"
                    .to_string()
            }
            ProxyError::UnreadableKey => {
                "the client key cannot be read: send one key, once, as Authorization: Bearer <key>, \
                 x-api-key or api-key (two that differ, or one header twice, are refused)"
                    .to_string()
            }
            ProxyError::Forbidden => "this client key may not use this route".to_string(),
            // SDKs show the message, not the headers: the wait is in it (issue 48).
            ProxyError::TooManyRequests { why, retry_after } => {
                format!("{why}; retry in {retry_after} s (Retry-After)")
            }
            ProxyError::HeadTooLarge(why) => {
                format!("the request's headers are too large to forward ({why}); send fewer or shorter ones")
            }
            ProxyError::UriTooLong => format!(
                "the request's path and query are too long to forward (a request line of at most \
                 {} bytes reaches the host); send a shorter one",
                super::send::HOST_REQUEST_LINE
            ),
            ProxyError::PromptTooLarge {
                estimate,
                exact,
                max,
            } => {
                let size = match exact {
                    Some(exact) => format!("{exact} tokens, as the host counts it"),
                    None => format!("about {estimate} tokens"),
                };
                format!(
                    "the prompt ({size}) does not fit the context of any host of this route \
                     (at most {max} tokens); shorten the conversation"
                )
            }
            ProxyError::NoHealthyHost(_) => {
                "no host of this route can take it (`hosts` says why of each); retry after \
                 Retry-After seconds"
                    .to_string()
            }
            ProxyError::PinnedDown(host) => format!(
                "the route is pinned to host {host}, which is down; retry later, or unpin the route"
            ),
            ProxyError::QueueFull => {
                "every slot of the host is busy and its queue is full; retry after Retry-After \
                 seconds"
                    .to_string()
            }
            ProxyError::WaitingFull(bound) => format!(
                "{} ({}); retry after Retry-After seconds",
                bound.what(),
                bound.key()
            ),
            ProxyError::QueueTimeout => {
                "no slot of the host came free while the request waited (queue_timeout); retry \
                 after Retry-After seconds"
                    .to_string()
            }
            ProxyError::ShuttingDown => "crossbar is stopping; retry in a moment".to_string(),
            ProxyError::StoreUnavailable => {
                "crossbar cannot record a new conversation (its database fails); retry after \
                 Retry-After seconds"
                    .to_string()
            }
            ProxyError::Upstream { host, .. } => {
                format!("host {host} failed to answer; crossbar's log says why")
            }
            ProxyError::BadBody(detail) => format!("the request body could not be read: {detail}"),
            ProxyError::BadRequest(detail) => detail.clone(),
            ProxyError::BodyTimeout => {
                "the request body did not arrive in time (client_body_timeout)".to_string()
            }
            ProxyError::BodiesBusy => {
                "crossbar holds as many request bodies being received as it may \
                 (client_body_buffer_mib); retry after Retry-After seconds"
                    .to_string()
            }
            ProxyError::BodyLater => "the request body is still coming".to_string(),
            ProxyError::ClientGone(why) => why.to_string(),
            ProxyError::Internal(_) => {
                "crossbar failed to answer this request; its log says why".to_string()
            }
            // Addressing mistakes: the hint says how to fix them.
            ProxyError::MissingRoute { .. }
            | ProxyError::UnknownRoute { .. }
            | ProxyError::NotFound
            | ProxyError::MissingV1 { .. }
            | ProxyError::BaseUrl { .. }
            | ProxyError::ModelNotFound { .. } => self.hint(shape).unwrap_or_default(),
        }
    }

    /// How to fix a request crossbar cannot place: the URL shape and the names that exist. The
    /// base URL is the one of the client's API (issue 48): an OpenAI SDK's ends in `/v1`, an
    /// Anthropic SDK's does not (it adds `/v1/messages` itself).
    fn hint(&self, api: Shape) -> Option<String> {
        let shape = format!(
            "use {} as the base URL, or send the header X-Crossbar-Route: <route>",
            base_url(api, "<route>")
        );
        Some(match self {
            ProxyError::MissingRoute { routes } => {
                format!("no route named; {shape}; routes: {}", names(routes))
            }
            // crossbar's own pages are on the admin listener (issue 27).
            ProxyError::UnknownRoute { route, .. }
                if ["admin", "metrics", "livez", "readyz"].contains(&route.as_str()) =>
            {
                format!(
                    "/{route} is served by crossbar's admin listener, not this port: use the \
                     address admin_listen names in the config (127.0.0.1:8081 unless set)"
                )
            }
            ProxyError::UnknownRoute { route, routes } => {
                let near = crate::nearest::nearest(route, routes.iter().map(String::as_str))
                    .map_or(String::new(), |near| format!(" (did you mean {near:?}?)"));
                format!(
                    "no route is called {route:?}{near}; routes: {}; {shape}",
                    names(routes)
                )
            }
            ProxyError::MissingV1 { route } => format!(
                "the base URL ends in /v1: use http://<gateway>/{route}/v1 (e.g. /{route}/v1/chat/completions)"
            ),
            ProxyError::NotFound => "crossbar forwards /<route>/v1/... and llama-server's inference \
                 endpoints (/completion, /infill, /tokenize, /detokenize, /embedding, /rerank, \
                 /apply-template, /health, /props)"
                .to_string(),
            ProxyError::BaseUrl { route, mistake } => {
                let what = match mistake {
                    Mistake::V1Twice => "the path has /v1 twice",
                    Mistake::RouteTwice => "the path names a route twice",
                    Mistake::EndpointTwice => "the path repeats its endpoint",
                    Mistake::RouteAfterV1 => "the route comes after /v1 instead of before it",
                };
                let adds = match api {
                    Shape::Anthropic => "the Anthropic SDK and Claude Code add /v1/messages themselves",
                    Shape::OpenAi => "the client adds /chat/completions, /responses or /models itself",
                };
                format!(
                    "{what}: use {} as the base URL; {adds}",
                    base_url(api, route)
                )
            }
            ProxyError::ModelNotFound { model, served } => format!(
                "no host of this route serves {model:?}; name one of: {}",
                names(served)
            ),
            _ => return None,
        })
    }

    /// Seconds a client should wait before retrying a 503.
    pub(super) fn retry_after(&self, health_interval_s: u64) -> Option<u64> {
        match self {
            ProxyError::NoHealthyHost(_) | ProxyError::PinnedDown(_) => {
                Some(health_interval_s.max(1))
            }
            ProxyError::QueueFull
            | ProxyError::WaitingFull(_)
            | ProxyError::ShuttingDown
            | ProxyError::BodiesBusy => Some(1),
            ProxyError::QueueTimeout | ProxyError::StoreUnavailable => Some(5),
            ProxyError::TooManyRequests { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }
}

impl fmt::Display for ProxyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProxyError::MissingRoute { .. } => "missing route",
            ProxyError::ConflictingRoute => "conflicting route",
            ProxyError::UnknownRoute { .. } => "unknown route",
            ProxyError::NotFound | ProxyError::MissingV1 { .. } | ProxyError::BaseUrl { .. } => {
                "not found"
            }
            ProxyError::ModelNotFound { .. } => "model_not_found",
            ProxyError::BodyTooLarge => "body too large",
            ProxyError::HeadTooLarge(_) => "headers too large",
            ProxyError::UriTooLong => "uri too long",
            ProxyError::Unauthorized | ProxyError::UnknownKey | ProxyError::UnreadableKey => {
                "unauthorized"
            }
            ProxyError::Forbidden => "forbidden",
            ProxyError::TooManyRequests { .. } => "too many requests",
            ProxyError::PromptTooLarge { .. } => "prompt too large",
            ProxyError::NoHealthyHost(_) => "no healthy host",
            ProxyError::PinnedDown(_) => "pinned host down",
            ProxyError::QueueFull | ProxyError::WaitingFull(_) => "queue full",
            ProxyError::QueueTimeout => "queue timeout",
            ProxyError::ShuttingDown => "shutting down",
            ProxyError::StoreUnavailable => "store unavailable",
            ProxyError::Upstream { .. } => "upstream error",
            ProxyError::BadBody(_) => "unreadable body",
            ProxyError::BadRequest(_) => "bad request",
            ProxyError::BodyTimeout => "request timeout",
            ProxyError::BodiesBusy => "busy",
            ProxyError::BodyLater => "body still coming",
            ProxyError::ClientGone(_) => "client gone",
            ProxyError::Internal(_) => "internal error",
        })
    }
}

impl std::error::Error for ProxyError {}

/// What a base URL that carries too much, or has the route in the wrong place, did to the path
/// (issue 48).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mistake {
    /// `/projA/v1/v1/messages`: the Anthropic SDK given an OpenAI-style base URL.
    V1Twice,
    /// `/projA/projA/v1/...`, `/projA/v1/projA/v1/...`.
    RouteTwice,
    /// `/projA/v1/chat/completions/chat/completions`: a whole endpoint's URL as the base URL.
    EndpointTwice,
    /// `/v1/projA/v1/...`.
    RouteAfterV1,
}

/// The base URL a client of `api` is given for `route`: `http://<gateway>/<route>/v1` for the
/// OpenAI SDKs, `http://<gateway>/<route>` for the Anthropic SDK and Claude Code.
fn base_url(api: Shape, route: &str) -> String {
    match api {
        Shape::OpenAi => format!("http://<gateway>/{route}/v1"),
        Shape::Anthropic => format!("http://<gateway>/{route}"),
    }
}

/// Most names a hint lists; a config with more routes or models shows the first ones and a count.
const MAX_NAMES: usize = 20;

/// `a, b, c` (or `a, b, ... and 7 more`); `(none)` when empty.
fn names(list: &[String]) -> String {
    if list.is_empty() {
        return "(none)".to_string();
    }
    let mut out = list
        .iter()
        .take(MAX_NAMES)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    if list.len() > MAX_NAMES {
        out.push_str(&format!(" and {} more", list.len() - MAX_NAMES));
    }
    out
}

impl From<LeaseError> for ProxyError {
    fn from(err: LeaseError) -> ProxyError {
        match err {
            LeaseError::NoHost => ProxyError::NoHealthyHost(Vec::new()),
            LeaseError::PinnedDown { host } => ProxyError::PinnedDown(host),
            // The store logged the cause once for the burst; the client learns it may retry.
            LeaseError::Store(_) => ProxyError::StoreUnavailable,
            other => ProxyError::Internal(other.to_string()),
        }
    }
}

impl From<LimitError> for ProxyError {
    fn from(err: LimitError) -> ProxyError {
        match err {
            LimitError::QueueFull => ProxyError::QueueFull,
            LimitError::Waiting(bound) => ProxyError::WaitingFull(bound),
            LimitError::Timeout => ProxyError::QueueTimeout,
            LimitError::Closed => ProxyError::ShuttingDown,
            LimitError::Gone => ProxyError::ClientGone("client gone while queued"),
            // Not reached: `prepare` refuses a model the host does not serve.
            LimitError::NotConfigured => ProxyError::NoHealthyHost(Vec::new()),
        }
    }
}

#[cfg(test)]
mod tests;

impl From<crate::keys::Denied> for ProxyError {
    fn from(denied: crate::keys::Denied) -> ProxyError {
        use crate::keys::Denied;
        match denied {
            Denied::Unauthorized => ProxyError::Unauthorized,
            Denied::UnknownKey => ProxyError::UnknownKey,
            Denied::Unreadable => ProxyError::UnreadableKey,
            Denied::Forbidden => ProxyError::Forbidden,
            Denied::TooMany { retry_after, why } => {
                ProxyError::TooManyRequests { retry_after, why }
            }
        }
    }
}
