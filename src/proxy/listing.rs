//! A model listing through crossbar names models the way crossbar's config does. A host may know a
//! model by another name (`upstream = "..."`); its `/v1/models` (and `/models`) answer is read whole
//! (bounded), each entry naming an upstream name is renamed to the configured one, and the result
//! is sent with its length. Every other answer passes through byte for byte (`forward::relay`).

use std::io::Read;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::config::Host;
use crate::conn::Request;
use crate::state::Gateway;
use crate::store::RequestRow;

use super::forward::{response_headers, Answer};
use super::{record, Incoming, Plan};

/// A listing answer is small; a host sending more than this gets the client a 502.
const MAX_LISTING: u64 = 4 << 20;

/// The longest a listing may take, head and body together, whatever `first_byte_timeout` allows
/// (a listing is answered from memory; unlike a stream it has no reason to be slow).
const LISTING_TIMEOUT: Duration = Duration::from_secs(30);

/// One deadline for the whole exchange of a listing to rename: `first_byte_timeout`, at most
/// [`LISTING_TIMEOUT`]. Per-read timeouts alone let a host trickle it a byte at a time.
pub(super) fn deadline(first_byte_timeout: Duration) -> Duration {
    first_byte_timeout.min(LISTING_TIMEOUT)
}

/// Whether the answer to this request is a listing to rename: a `GET` of the models of a host
/// that knows some configured model by another name.
pub(super) fn renames(incoming: &Incoming, plan: &Plan<'_>) -> bool {
    incoming.method == "GET"
        && matches!(plan.rest.as_str(), "/v1/models" | "/models")
        && !plan.host.upstream.is_empty()
}

/// Reads the listing, renames it and sends it; the row is recorded before the answer goes out.
pub(super) fn relay(
    gw: &Gateway,
    request: &mut Request<'_>,
    plan: &Plan<'_>,
    answer: Answer,
    row: &mut RequestRow,
    clock: Instant,
) {
    let headers = response_headers(answer.response.headers(), plan);
    row.status = answer.response.status().as_u16();
    let mut body = Vec::new();
    let read = (answer.response.into_body().into_reader())
        .take(MAX_LISTING + 1)
        .read_to_end(&mut body);
    let failed = match read {
        Err(err) => Some(format!("upstream failed mid-body: model listing: {err}")),
        Ok(n) if n as u64 > MAX_LISTING => Some(format!("model listing over {MAX_LISTING} bytes")),
        Ok(_) => None,
    };
    if let Some(err) = &failed {
        row.err = err.clone();
        row.status = 502;
    }
    row.total_ms = clock.elapsed().as_millis() as i64;
    record(gw, row);
    if failed.is_some() {
        let body = serde_json::json!({"error": "upstream error", "host": plan.host.name});
        let json = [("Content-Type".to_string(), "application/json".to_string())];
        let _ = request.send(502, &json, body.to_string().as_bytes());
        return;
    }
    let renamed = rename(&body, plan.host);
    let out = renamed.as_deref().unwrap_or(&body);
    if let Err(err) = request.send(row.status, &headers, out) {
        log::debug!(
            "client gone before the model listing error={}",
            crate::logfmt::val(&err.to_string())
        );
    }
}

/// The listing with every `id` (and `name`/`model` in the `models` list) that is a configured
/// model's upstream name replaced by the configured name; `None` when it is not a JSON listing.
pub(super) fn rename(body: &[u8], host: &Host) -> Option<Vec<u8>> {
    let mut listing: Value = serde_json::from_slice(body).ok()?;
    // A name the config also uses for a model of its own stays as it is.
    let configured = |name: &str| {
        (host.upstream.iter())
            .find(|(_, upstream)| *upstream == name && !host.models.contains_key(name))
            .map(|(model, _)| model.clone())
    };
    for (list, fields) in [("data", &["id"][..]), ("models", &["name", "model"][..])] {
        let Some(entries) = listing.get_mut(list).and_then(Value::as_array_mut) else {
            continue;
        };
        for entry in entries {
            for field in fields {
                let renamed = entry
                    .get(*field)
                    .and_then(Value::as_str)
                    .and_then(configured);
                if let Some(name) = renamed {
                    entry[*field] = name.into();
                }
            }
        }
    }
    serde_json::to_vec(&listing).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn upstream_names_become_configured_names_and_nothing_else_changes() {
        let host = Host {
            name: "titan".into(),
            url: "http://127.0.0.1:1".into(),
            weight: 1,
            api_key: None,
            ctx: None,
            models: BTreeMap::from([("qwen-coder".to_string(), 1), ("chat".to_string(), 1)]),
            upstream: BTreeMap::from([("qwen-coder".to_string(), "Qwen2.5-Coder".to_string())]),
        };
        let body = br#"{"object":"list","data":[{"id":"Qwen2.5-Coder","status":{"value":"loaded"}},
            {"id":"chat"}],"models":[{"name":"Qwen2.5-Coder","model":"Qwen2.5-Coder"}]}"#;
        let renamed: Value = serde_json::from_slice(&rename(body, &host).unwrap()).unwrap();
        assert_eq!(renamed["data"][0]["id"], "qwen-coder");
        assert_eq!(renamed["data"][0]["status"]["value"], "loaded");
        assert_eq!(renamed["data"][1]["id"], "chat");
        assert_eq!(renamed["models"][0]["name"], "qwen-coder");
        assert_eq!(renamed["models"][0]["model"], "qwen-coder");
        assert_eq!(rename(b"<html>", &host), None);
    }
}
