//! What the client asked: method, target, headers and version, out of the request before its body
//! is read, so the rest of the path can borrow them while the request is answered. The headers
//! are moved, not copied (issue 26: a copy was 8 % of a request's allocations).

use crate::conn::{Headers, Request};

/// What the client asked, out of the request before its body is read.
#[derive(Debug)]
pub(super) struct Incoming {
    pub(super) method: String,
    pub(super) path: String,
    pub(super) query: String,
    pub(super) headers: Headers,
    pub(super) http10: bool,
}

impl Incoming {
    /// Takes the request's headers with it: [`Incoming::give_back`] returns them to a request
    /// whose handler is called again.
    pub(super) fn of(request: &mut Request<'_>) -> Incoming {
        let target = request.target();
        let (path, query) = match target.split_once('?') {
            Some((path, query)) => (path, format!("?{query}")),
            None => (target, String::new()),
        };
        Incoming {
            method: request.method().to_string(),
            path: path.to_string(),
            query,
            headers: request.take_headers(),
            http10: request.http10(),
        }
    }

    /// The headers back to `request`, whose body is still coming (the handler is called again).
    pub(super) fn give_back(self, request: &mut Request<'_>) {
        request.restore_headers(self.headers);
    }

    pub(super) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name)
    }

    pub(super) fn bodyless(&self) -> bool {
        self.method == "GET" || self.method == "HEAD"
    }
}
