//! The row and the line of a request's end (`end.rs` decides when): the accounting row (store and
//! metrics, the key's spending), the one log line, the cold-cache warning, and the answer when
//! crossbar refuses a request or answers a browser's preflight. A request answered before its
//! route and key are known has no row and no line of its own (issue 46: `unrouted.rs`).

use std::sync::Arc;

use crate::conn::{Request, Tail};
use crate::envelope::Shape;
use crate::fingerprint;
use crate::keys::Reserved;
use crate::logfmt::{val, Fields};
use crate::metrics::Metrics;
use crate::state::Gateway;
use crate::store::{Coming, RequestRow, StoreError};
use crate::tee::Tee;

use super::plan::{Ctx, HOST_HEADER};
use super::{cors, ProxyError};

/// Writes the accounting row and waits for its commit (shared with concurrent requests), so it
/// is in the db before the answer's last bytes go out. A failure is counted and never shown to the
/// client; the store logs its cause once per burst (here only at debug).
pub(super) fn record(gw: &Gateway, row: &RequestRow) {
    account(gw, row);
    if let Err(err) = gw.store.record_request(row) {
        row_lost(&gw.metrics, &row.route, &err);
    }
}

/// [`record`] for an answer whose end waits for the row (issue 26): the thread that commits the
/// row sends `tail`, and this one goes on at once instead of sleeping on the commit. `coming` is
/// the row's announcement when its whole answer arrived: a commit under way may wait for it.
pub(super) fn record_then_send(
    gw: &Gateway,
    row: &RequestRow,
    coming: Option<Coming>,
    tail: Arc<Tail>,
) {
    account(gw, row);
    let metrics = gw.metrics.clone();
    let route = row.route.clone();
    let then = move |outcome: &Result<(), StoreError>| {
        tail.send();
        if let Err(err) = outcome {
            row_lost(&metrics, &route, err);
        }
    };
    gw.store.record_then(row, coming, Box::new(then));
}

/// What a row counts before it is written: its metrics. (The key's spending is settled with
/// its turn, in `end.rs`.)
fn account(gw: &Gateway, row: &RequestRow) {
    gw.metrics.observe_request(row);
}

/// What a request spent of its key's `tokens_per_day` (issue 46): the host's counts, a stream's
/// events where the client left before them ([`Ctx::read`]); where the host's answer lacks them,
/// what the request reserved — its prompt's estimate once the host answered or generated, its
/// limit for a whole answer without a completion count (`"response_fields"` can leave the counts
/// out). An answer that is not a 2xx and generated nothing spent nothing.
pub(super) fn spent(row: &RequestRow, reserved: Reserved) -> u64 {
    let count = |n: Option<i64>| n.and_then(|n| u64::try_from(n).ok());
    let ok = (200..300).contains(&row.status);
    let completion = count(row.completion_tokens).unwrap_or(if ok && !row.streamed {
        reserved.output
    } else {
        0
    });
    let prompt = count(row.prompt_tokens).unwrap_or(if ok || completion > 0 {
        reserved.prompt
    } else {
        0
    });
    prompt.saturating_add(completion)
}

fn row_lost(metrics: &Metrics, route: &str, err: &StoreError) {
    metrics.observe_row_lost();
    log::debug!(
        "accounting row lost route={} error={}",
        val(route),
        val(&err.to_string())
    );
}

/// The one plain line per request (never the body). `lease` is `new`, `reused`, `none`
/// (metadata) or `-` when crossbar answered itself before a lease was in play; `placed` says why
/// the host was chosen (issue 23), `family` the prompt family (8 hex).
pub(super) fn log_request(row: &RequestRow, lease: &str) {
    if !log::log_enabled!(log::Level::Info) {
        return;
    }
    let mut line = Fields::with_capacity(320);
    line.val("route", or_dash(&row.route))
        .token("api", or_dash(&row.api))
        .val("host", or_dash(&row.host))
        .token("lease", lease)
        .token("placed", or_dash(&row.placed))
        .token("family", or_dash(&row.family))
        .val("model", or_dash(&row.model))
        .val("fp", or_dash(fingerprint::short(&row.fp)))
        .number("status", row.status)
        .number("queued_ms", row.queued_ms)
        .number("ttfb_ms", row.ttfb_ms)
        .number("total_ms", row.total_ms)
        .count("prompt", row.prompt_tokens)
        .count("cached", row.cached_tokens)
        .count("completion", row.completion_tokens);
    if let Some(est) = row.ctx_est {
        line.number("ctx_est", est);
    }
    if let Some(exact) = row.ctx_exact {
        line.number("ctx_exact", exact);
    }
    if !row.key.is_empty() {
        line.val("key", &row.key);
    }
    if !row.err.is_empty() {
        line.val("err", &row.err);
    }
    log::info!("{}", line.as_str());
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() {
        "-"
    } else {
        s
    }
}

impl Ctx<'_> {
    /// Fills the row from what the tee read of the answer: its token counts, an upstream error
    /// event, and the prefill the host reported (for its speed, learned at the end). A stream
    /// whose completion count never came (the client left before it, or the host left it out)
    /// counts the events it carried, one per token (issue 46: 8 streams left before their end
    /// recorded 0 of their 440 tokens).
    pub(super) fn read(&mut self, tee: &Tee) {
        self.prefill = tee.prefill();
        let usage = tee.usage();
        let row = &mut self.row;
        row.prompt_tokens = usage.prompt_tokens;
        row.cached_tokens = usage.cached_tokens;
        row.completion_tokens = (usage.completion_tokens)
            .or_else(|| (tee.events() > 0).then(|| i64::try_from(tee.events()).unwrap_or(0)));
        if let Some(err) = tee.upstream_error() {
            row.err = format!("upstream error event: {err}");
        }
    }
}

/// Answers with crossbar's own error, in the envelope of the API the request's path names
/// (issue 27), recording the row before the client can see the answer.
pub(super) fn refuse(ctx: &mut Ctx<'_>, request: &mut Request<'_>, mut err: ProxyError) {
    let (gw, row) = (ctx.gw, &mut ctx.row);
    if let ProxyError::NoHealthyHost(hosts) = &mut err {
        *hosts = why_not(gw, &row.route);
    }
    if let ProxyError::Upstream { host, detail, .. } = &err {
        row.host = host.clone();
        row.err = format!("upstream error: {detail}");
    } else if let ProxyError::BadBody(detail) | ProxyError::BadRequest(detail) = &err {
        row.err = format!("{err}: {detail}");
    } else if let ProxyError::ClientGone(why) = &err {
        row.err = why.to_string();
    } else if let ProxyError::Internal(detail) = &err {
        row.err = detail.clone();
        log::error!(
            "internal error route={} error={}",
            val(&row.route),
            val(detail)
        );
    } else {
        row.err = err.to_string();
    }
    row.status = err.status();
    row.total_ms = ctx.clock.elapsed().as_millis() as i64;
    let mut headers = vec![("Content-Type".to_string(), "application/json".to_string())];
    if let Some(secs) = err.retry_after(gw.config().health_interval.as_secs()) {
        headers.push(("Retry-After".to_string(), secs.to_string()));
    }
    if err.status() == 401 {
        headers.push((
            "WWW-Authenticate".to_string(),
            "Bearer realm=\"crossbar\"".to_string(),
        ));
    }
    if !row.host.is_empty() {
        headers.push((HOST_HEADER.to_string(), row.host.clone()));
    }
    // Issue 46: refused before its route is known — and so its key, which is checked first —
    // a request is a stranger's or a mistake: counted and logged once per burst, no row (a
    // flood of them filled the disk). From its route on, every request keeps its row.
    if row.route.is_empty() {
        if row.status == 499 {
            request.abandon();
        } else {
            let body = err.body(shape_of(request.target())).to_string();
            if let Err(err) = request.send(row.status, &headers, body.as_bytes()) {
                log::debug!("error answer not sent error={}", val(&err.to_string()));
            }
        }
        let peer = request.peer_addr().map(|a| a.ip());
        return (gw.unrouted).answered(&gw.metrics, unrouted(&err), row.status, peer);
    }
    if row.status == 499 {
        // Nobody to answer.
        record(gw, row);
        request.abandon();
    } else {
        // Sent once the row is in, by whoever commits it: a flood of refusals (a stranger's
        // requests without a key, a burst over the queue) does not put a worker to sleep on each
        // refusal's commit (issue 26).
        let body = err.body(shape_of(request.target())).to_string();
        match request.send_later(row.status, &headers, body.as_bytes()) {
            Ok(tail) => record_then_send(gw, row, None, tail),
            Err(err) => {
                record(gw, row);
                log::debug!("error answer not sent error={}", val(&err.to_string()));
            }
        }
    }
    log_request(row, "-");
}

/// The reason a refusal before routing counts under (a metric label, as the connection layer's).
fn unrouted(err: &ProxyError) -> &'static str {
    match err {
        ProxyError::Unauthorized | ProxyError::UnknownKey | ProxyError::UnreadableKey => {
            "unauthorized"
        }
        // Before a key is known, only the guard against guessing keys answers 429.
        ProxyError::TooManyRequests { .. } => "failed_keys",
        ProxyError::MissingRoute { .. } => "missing_route",
        ProxyError::ConflictingRoute => "conflicting_route",
        ProxyError::UnknownRoute { .. } => "unknown_route",
        ProxyError::NotFound | ProxyError::MissingV1 { .. } => "not_found",
        ProxyError::BadRequest(_) => "bad_request",
        _ => "other",
    }
}

/// Answers a browser's CORS preflight itself (issue 46): no key, route, body or host; counted and
/// logged as answered before routing, no row.
pub(super) fn preflight(ctx: &Ctx<'_>, request: &mut Request<'_>) {
    let headers = cors::answer(&ctx.incoming);
    if let Err(err) = request.send(200, &headers, b"") {
        log::debug!("preflight answer not sent error={}", val(&err.to_string()));
    }
    let (gw, peer) = (ctx.gw, request.peer_addr().map(|a| a.ip()));
    gw.unrouted.answered(&gw.metrics, "preflight", 200, peer);
}

/// Why each candidate of `route` could not take a request (issue 24: a refusal says why): its
/// down reason (`401 from /props: check api_key`), `draining`, or `up` (busy, or not serving the
/// model).
fn why_not(gw: &Gateway, route: &str) -> Vec<(String, String)> {
    let config = gw.config();
    let Some(route) = config.routes.get(route) else {
        return Vec::new();
    };
    (route.hosts.iter())
        .map(|host| {
            let status = gw.health.get(host);
            let why = match status.and_then(|s| s.reason) {
                Some(reason) => reason.to_string(),
                None if gw.drains.contains(host) => "draining".to_string(),
                None => "up".to_string(),
            };
            (host.clone(), why)
        })
        .collect()
}

/// The envelope of crossbar's own answers to `target`: its path as routing reads it (decoded,
/// checked; as sent when it is refused), so `/projA/v1/m%65ssages` is a Messages path too.
pub(super) fn shape_of(target: &str) -> Shape {
    let path = target.split_once('?').map_or(target, |(path, _)| path);
    match super::normalize(path) {
        Ok(path) => Shape::of(&path),
        Err(_) => Shape::of(path),
    }
}
