//! Why a host is down, said so an operator can act on it: every reason names the path crossbar
//! asked and the status or error it got (`401 from /props: check api_key`). Pure data.

use std::fmt;

/// Why a host is down. The `Display` form is what the log, `crossbar status`, the admin API and
/// the status page show; [`DownReason::kind`] is its stable one-word class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DownReason {
    /// No answer from `path`: connection refused, reset or timed out.
    Unreachable { path: String, error: String },
    /// 503 from `path`: llama-server is loading its model.
    Loading { path: String },
    /// Any other status than 200 from `path` (401/403: the host wants another `api_key`).
    Status { path: String, status: u16 },
    /// A 200 from `path` whose body crossbar cannot use (not JSON, or JSON of the wrong shape).
    BadAnswer { path: String, error: String },
    /// A forward to `path` failed before the response head.
    ForwardFailed { path: String, error: String },
}

impl DownReason {
    /// `unreachable`, `loading`, `status`, `bad answer` or `forward failed`.
    pub fn kind(&self) -> &'static str {
        match self {
            DownReason::Unreachable { .. } => "unreachable",
            DownReason::Loading { .. } => "loading",
            DownReason::Status { .. } => "status",
            DownReason::BadAnswer { .. } => "bad answer",
            DownReason::ForwardFailed { .. } => "forward failed",
        }
    }

    /// The path whose answer (or silence) put the host down.
    pub fn path(&self) -> &str {
        match self {
            DownReason::Unreachable { path, .. }
            | DownReason::Loading { path }
            | DownReason::Status { path, .. }
            | DownReason::BadAnswer { path, .. }
            | DownReason::ForwardFailed { path, .. } => path,
        }
    }
}

impl fmt::Display for DownReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DownReason::Unreachable { path, error } => write!(f, "no answer from {path}: {error}"),
            DownReason::Loading { path } => write!(f, "503 from {path}: loading"),
            DownReason::Status {
                path,
                status: status @ (401 | 403),
            } => write!(f, "{status} from {path}: check api_key"),
            DownReason::Status { path, status } => write!(f, "{status} from {path}"),
            DownReason::BadAnswer { path, error } => write!(f, "bad answer from {path}: {error}"),
            DownReason::ForwardFailed { path, error } => {
                write!(f, "forward to {path} failed: {error}")
            }
        }
    }
}

/// A ureq failure in a few words, without the URL (the reason names the path already): the error
/// and its innermost cause, e.g. `io: Connection refused (os error 111)`.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut last = None;
    let mut cause = err.source();
    while let Some(c) = cause {
        last = Some(c.to_string());
        cause = c.source();
    }
    match last {
        Some(cause) => format!("{err}: {cause}"),
        None => err.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_names_its_path_and_what_came_back() {
        let p = || "/props".to_string();
        for (reason, text) in [
            (
                DownReason::Status {
                    path: p(),
                    status: 401,
                },
                "401 from /props: check api_key",
            ),
            (
                DownReason::Status {
                    path: p(),
                    status: 403,
                },
                "403 from /props: check api_key",
            ),
            (
                DownReason::Status {
                    path: "/health".into(),
                    status: 500,
                },
                "500 from /health",
            ),
            (
                DownReason::Loading {
                    path: "/health".into(),
                },
                "503 from /health: loading",
            ),
            (
                DownReason::Unreachable {
                    path: "/health".into(),
                    error: "Connection Failed: refused".into(),
                },
                "no answer from /health: Connection Failed: refused",
            ),
            (
                DownReason::BadAnswer {
                    path: p(),
                    error: "invalid JSON".into(),
                },
                "bad answer from /props: invalid JSON",
            ),
            (
                DownReason::ForwardFailed {
                    path: "/v1/chat/completions".into(),
                    error: "Network Error: reset".into(),
                },
                "forward to /v1/chat/completions failed: Network Error: reset",
            ),
        ] {
            assert_eq!(reason.to_string(), text);
            assert!(reason.to_string().contains(reason.path()));
        }
    }
}
