//! [`ProxyError`]: every reason crossbar answers a request itself, with its status, JSON body and
//! `Retry-After` (spec §2's error table). Pure.

use std::fmt;

use crate::lease::LeaseError;
use crate::limiter::LimitError;

/// Why crossbar answers a request itself instead of forwarding it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxyError {
    MissingRoute,
    ConflictingRoute,
    UnknownRoute(String),
    NotFound,
    BodyTooLarge,
    PromptTooLarge {
        estimate: u64,
        max: u64,
    },
    NoHealthyHost,
    PinnedDown(String),
    QueueFull,
    QueueTimeout,
    ShuttingDown,
    Upstream {
        host: String,
        detail: String,
    },
    /// The request body could not be read: malformed chunked framing, or the client went away
    /// mid-upload. The client's fault, not crossbar's.
    BadBody(String),
    /// The request itself is malformed or cannot be forwarded as sent: a dot segment, backslash,
    /// encoded `/` or NUL in the path, a header name or value upstream would refuse (spec §2's
    /// "bad request (+ what)"). The client's fault; it never counts against a host.
    BadRequest(String),
    /// The body did not arrive within its deadline (`client_body_timeout` plus its size at
    /// `client_body_min_rate`).
    BodyTimeout,
    /// The client left before an answer could start (queued for a slot): recorded as 499, never
    /// answered.
    ClientGone(&'static str),
    Internal(String),
}

impl ProxyError {
    pub fn status(&self) -> u16 {
        match self {
            ProxyError::MissingRoute | ProxyError::ConflictingRoute | ProxyError::BadBody(_) => 400,
            ProxyError::BadRequest(_) => 400,
            ProxyError::PromptTooLarge { .. } => 400,
            ProxyError::UnknownRoute(_) | ProxyError::NotFound => 404,
            ProxyError::BodyTooLarge => 413,
            ProxyError::BodyTimeout => 408,
            ProxyError::ClientGone(_) => 499,
            ProxyError::NoHealthyHost
            | ProxyError::PinnedDown(_)
            | ProxyError::QueueFull
            | ProxyError::QueueTimeout
            | ProxyError::ShuttingDown => 503,
            ProxyError::Upstream { .. } => 502,
            ProxyError::Internal(_) => 500,
        }
    }

    /// The JSON answer: `{"error": "..."}` plus the fields the spec names.
    pub fn body(&self) -> serde_json::Value {
        let mut body = serde_json::json!({ "error": self.to_string() });
        match self {
            ProxyError::PromptTooLarge { estimate, max } => {
                body["estimate"] = (*estimate).into();
                body["max"] = (*max).into();
            }
            ProxyError::Upstream { host, .. } => body["host"] = host.clone().into(),
            ProxyError::PinnedDown(host) => body["host"] = host.clone().into(),
            ProxyError::BadRequest(detail) => body["detail"] = detail.clone().into(),
            _ => {}
        }
        body
    }

    /// Seconds a client should wait before retrying a 503.
    pub(super) fn retry_after(&self, health_interval_s: u64) -> Option<u64> {
        match self {
            ProxyError::NoHealthyHost | ProxyError::PinnedDown(_) => Some(health_interval_s.max(1)),
            ProxyError::QueueFull | ProxyError::ShuttingDown => Some(1),
            ProxyError::QueueTimeout => Some(5),
            _ => None,
        }
    }
}

impl fmt::Display for ProxyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProxyError::MissingRoute => "missing route",
            ProxyError::ConflictingRoute => "conflicting route",
            ProxyError::UnknownRoute(_) => "unknown route",
            ProxyError::NotFound => "not found",
            ProxyError::BodyTooLarge => "body too large",
            ProxyError::PromptTooLarge { .. } => "prompt too large",
            ProxyError::NoHealthyHost => "no healthy host",
            ProxyError::PinnedDown(_) => "pinned host down",
            ProxyError::QueueFull => "queue full",
            ProxyError::QueueTimeout => "queue timeout",
            ProxyError::ShuttingDown => "shutting down",
            ProxyError::Upstream { .. } => "upstream error",
            ProxyError::BadBody(_) => "unreadable body",
            ProxyError::BadRequest(_) => "bad request",
            ProxyError::BodyTimeout => "request timeout",
            ProxyError::ClientGone(_) => "client gone",
            ProxyError::Internal(_) => "internal error",
        })
    }
}

impl std::error::Error for ProxyError {}

impl From<LeaseError> for ProxyError {
    fn from(err: LeaseError) -> ProxyError {
        match err {
            LeaseError::NoHost => ProxyError::NoHealthyHost,
            LeaseError::PinnedDown { host } => ProxyError::PinnedDown(host),
            other => ProxyError::Internal(other.to_string()),
        }
    }
}

impl From<LimitError> for ProxyError {
    fn from(err: LimitError) -> ProxyError {
        match err {
            LimitError::QueueFull => ProxyError::QueueFull,
            LimitError::Timeout => ProxyError::QueueTimeout,
            LimitError::Closed => ProxyError::ShuttingDown,
            LimitError::Gone => ProxyError::ClientGone("client gone while queued"),
            // Not reached: `prepare` refuses a model the host does not serve.
            LimitError::NotConfigured => ProxyError::NoHealthyHost,
        }
    }
}
