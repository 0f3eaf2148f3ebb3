//! What the client asked: method, target, headers and version, copied out of the request before
//! its body is read, so the rest of the path can borrow them while the request is answered.

use crate::conn::Request;

/// What the client asked, copied out of the request before its body is read.
#[derive(Debug)]
pub(super) struct Incoming {
    pub(super) method: String,
    pub(super) path: String,
    pub(super) query: String,
    pub(super) headers: Vec<(String, String)>,
    pub(super) http10: bool,
}

impl Incoming {
    pub(super) fn of(request: &Request<'_>) -> Incoming {
        let target = request.target();
        let (path, query) = match target.split_once('?') {
            Some((path, query)) => (path, format!("?{query}")),
            None => (target, String::new()),
        };
        Incoming {
            method: request.method().to_string(),
            path: path.to_string(),
            query,
            headers: request.headers().to_vec(),
            http10: request.http10(),
        }
    }

    pub(super) fn header(&self, name: &str) -> Option<&str> {
        crate::wire::header(&self.headers, name)
    }

    pub(super) fn bodyless(&self) -> bool {
        self.method == "GET" || self.method == "HEAD"
    }
}
