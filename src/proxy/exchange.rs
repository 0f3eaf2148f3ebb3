//! The upstream exchange: the request sent to its host (once more on a fresh connection when a
//! pooled one turns out closed), waiting for the answer's head while watching the client. A
//! failure before the head is classified here: the client left (499), the client's request could
//! not be built (400), or the host failed (502, blamed in `blame.rs`). Upstream error statuses are
//! answers, not errors.

use std::net::TcpStream;
use std::sync::Arc;

use ureq::{http, Body};

use crate::health::error_chain;
use crate::logfmt::val;
use crate::upstream::Exchange;

use super::blame::{connect_failed, counts_against_host, host_failed};
use super::plan::{Ctx, Plan};
use super::send::{send, Attempt};
use super::ProxyError;

/// An upstream answer whose head has arrived.
pub(super) struct Answer {
    pub(super) response: http::Response<Body>,
    /// The watch over the upstream connection, kept until the answer has been relayed.
    pub(super) exchange: Exchange,
}

/// Sends the request of `plan` upstream and waits for the response head. While it waits, a
/// `client` that leaves ends the wait and closes the upstream connection (499, the host is not
/// marked down).
pub(super) fn exchange(
    ctx: &mut Ctx<'_>,
    plan: &Plan<'_>,
    client: Option<Arc<TcpStream>>,
) -> Result<Answer, ProxyError> {
    let gw = ctx.gw;
    let exchange = Exchange::start(client);
    let agent = &gw.upstream.forwarding(&plan.host.name);
    let mut result = send(agent, &exchange, &ctx.incoming, plan, Attempt::Pooled)?;
    // A pooled connection the host had closed (pooled connections are not probed: the request's
    // own write or first read finds it): once more on a fresh one.
    if result.is_err() && exchange.retryable() {
        log::debug!("retry on a fresh connection host={}", val(&plan.host.name));
        result = send(agent, &exchange, &ctx.incoming, plan, Attempt::Fresh)?;
    }
    let row = &mut ctx.row;
    row.ttfb_ms = ctx.clock.elapsed().as_millis() as i64;
    match result {
        Ok(response) => {
            gw.health.request_ok(&plan.host.name);
            gw.metrics
                .observe_ttfb(&row.route, &plan.host.name, row.started, row.ttfb_ms);
            Ok(Answer { response, exchange })
        }
        Err(_) if exchange.client_left() => Err(ProxyError::ClientGone(
            "client gone while waiting for upstream",
        )),
        Err(err) if !counts_against_host(&err) => {
            gw.metrics.observe_forward_failure("client", "request");
            Err(ProxyError::BadRequest(err.to_string()))
        }
        Err(err) => {
            let host = plan.host.name.clone();
            let refused = !exchange.sent() && connect_failed(&err);
            let pair = (host.as_str(), plan.model());
            host_failed(gw, pair, &plan.rest, refused, &error_chain(&err));
            log::warn!(
                "forward failed host={} connect={refused} error={}",
                val(&host),
                val(&err.to_string())
            );
            Err(ProxyError::Upstream {
                host,
                detail: err.to_string(),
                refused,
            })
        }
    }
}
