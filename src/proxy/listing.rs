//! A model listing through crossbar names models the way crossbar's config does. A host may know a
//! model by another name (`upstream = "..."`); its `/v1/models` (and `/models`) answer is read whole
//! (4 MiB, one bound on its head and one on its body), each entry naming an upstream name is renamed
//! to the configured one in place — every other byte as the host sent it, no `Value` built — and
//! the result is sent with its length. Every other answer passes through byte for byte
//! (`forward::relay`).

use std::io::Read;
use std::time::Duration;

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use serde::de::{Deserializer as _, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::conn::Request;

use super::end::Outcome;
use super::exchange::Answer;
use super::headers::response_headers;
use super::incoming::Incoming;
use super::plan::{Ctx, Plan};
use super::ProxyError;

/// A listing answer is small; a host sending more than this gets the client a 502.
const MAX_LISTING: u64 = 4 << 20;

/// The longest a listing's head may take, and then its body, whatever `first_byte_timeout` allows
/// (a listing is answered from memory; unlike a stream it has no reason to be slow).
const LISTING_TIMEOUT: Duration = Duration::from_secs(30);

/// The bound on the answer to this request when it is a model listing — every `GET` of a
/// host's models through a route is named as the config names them (issue 48) —, for its head
/// and then for its whole body: `first_byte_timeout`, at most [`LISTING_TIMEOUT`] (per-read
/// timeouts alone let a host trickle it a byte at a time); `None` for every other request.
/// Decided once, as the plan is made.
pub(super) fn bound(
    incoming: &Incoming,
    rest: &str,
    first_byte_timeout: Duration,
) -> Option<Duration> {
    let listing = incoming.method == "GET" && matches!(rest, "/v1/models" | "/models");
    listing.then(|| first_byte_timeout.min(LISTING_TIMEOUT))
}

/// Reads the listing and renames it; it goes out once its row is in (`end.rs`). A listing the
/// host cannot give whole within its bounds is the client's 502.
pub(super) fn relay(
    ctx: &mut Ctx<'_>,
    request: &mut Request<'_>,
    plan: &Plan<'_>,
    answer: Answer,
) -> Outcome {
    let (head, upstream) = answer.response.into_parts();
    let headers = response_headers(&head.headers, plan);
    ctx.row.status = head.status.as_u16();
    let mut body = Vec::new();
    let read = (upstream.into_reader())
        .take(MAX_LISTING + 1)
        .read_to_end(&mut body);
    let failed = match read {
        Err(err) => Some(format!("model listing broke off: {err}")),
        Ok(n) if n as u64 > MAX_LISTING => Some(format!("model listing over {MAX_LISTING} bytes")),
        Ok(_) => None,
    };
    if let Some(detail) = failed {
        return Outcome::Refused(ProxyError::Upstream {
            host: plan.host.name.clone(),
            detail,
            refused: false,
        });
    }
    // The models of the route this host serves, by the names the host knows them by; a name
    // that is itself one of them is that one.
    let config = ctx.gw.config();
    let route = &config.routes[&plan.key.route];
    let served: Vec<&String> = (config.models_of(&route.hosts).iter())
        .filter_map(|m| plan.host.models.get_key_value(m).map(|(k, _)| k))
        .collect();
    let status = ctx.gw.health.get(&plan.host.name);
    let configured = |name: &str| -> Option<String> {
        if let Some(m) = served.iter().find(|m| m.as_str() == name) {
            return Some(m.to_string());
        }
        (served.iter())
            .find(|m| super::alias::answers_to(plan.host, status.as_ref(), m, name))
            .map(|m| m.to_string())
    };
    let renamed = rename(&body, &configured);
    let out = renamed.as_deref().unwrap_or(&body);
    match request.send_later(ctx.row.status, &headers, out) {
        Ok(end) => Outcome::Answered { end, coming: None },
        Err(err) => Outcome::Gone(format!("client gone before the model listing: {err}")),
    }
}

/// The listing as the route's config names its models (issue 48): each entry of `data` (and of
/// the `models` list llama-server adds) that `configured` maps to a model of the route — by its
/// id or an alias, or its `name`/`model` — is kept under the configured name, every other byte of
/// it as the host wrote it; an entry for anything else is left out, and each configured model is
/// listed once. `None` when the body is not a JSON object with a list in it. Nothing is built but
/// one entry's borrowed fields at a time and the output.
pub(super) fn rename(body: &[u8], configured: &dyn Fn(&str) -> Option<String>) -> Option<Vec<u8>> {
    #[derive(Deserialize)]
    struct Lists<'a> {
        #[serde(borrow)]
        data: Option<&'a RawValue>,
        #[serde(borrow)]
        models: Option<&'a RawValue>,
    }
    // Serde would also read an array positionally into `Lists`.
    if body.trim_ascii_start().first() != Some(&b'{') {
        return None;
    }
    let lists: Lists = serde_json::from_slice(body).ok()?;
    if lists.data.is_none() && lists.models.is_none() {
        return None;
    }
    let mut out = br#"{"object":"list""#.to_vec();
    for (key, list, fields) in [
        ("data", lists.data, ID),
        ("models", lists.models, NAME_MODEL),
    ] {
        let Some(list) = list else { continue };
        let mut kept = Kept {
            configured,
            fields,
            entries: Vec::new(),
            named: Vec::new(),
        };
        // A list that is not an array of objects keeps what it had up to where it broke.
        let _ = serde_json::Deserializer::from_str(list.get()).deserialize_seq(&mut kept);
        out.extend_from_slice(format!(r#","{key}":["#).as_bytes());
        for (i, entry) in kept.entries.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(entry);
        }
        out.push(b']');
    }
    out.push(b'}');
    Some(out)
}

/// The fields that name the model: a `data` entry's id (its aliases are where the host's names
/// are matched too), a `models` entry's name and model.
const ID: &[&str] = &["id", "aliases"];
const NAME_MODEL: &[&str] = &["name", "model"];

/// One list's entries kept so far, renamed, and the configured names they took.
struct Kept<'c> {
    configured: &'c dyn Fn(&str) -> Option<String>,
    fields: &'static [&'static str],
    entries: Vec<Vec<u8>>,
    named: Vec<String>,
}

impl<'de> Visitor<'de> for &mut Kept<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of models")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        #[derive(Deserialize)]
        struct Names<'a> {
            #[serde(borrow)]
            id: Option<&'a RawValue>,
            #[serde(borrow)]
            aliases: Option<&'a RawValue>,
            #[serde(borrow)]
            name: Option<&'a RawValue>,
            #[serde(borrow)]
            model: Option<&'a RawValue>,
        }
        while let Some(entry) = seq.next_element::<&RawValue>()? {
            let text = entry.get();
            if self.entries.len() >= MAX_ENTRIES || !text.starts_with('{') {
                continue;
            }
            let Ok(names) = serde_json::from_str::<Names>(text) else {
                continue;
            };
            let string = |raw: Option<&RawValue>| -> Option<String> {
                serde_json::from_str::<Cow<'_, str>>(raw?.get())
                    .ok()
                    .map(Cow::into_owned)
            };
            let aliases: Vec<String> = (names.aliases)
                .and_then(|raw| serde_json::from_str::<Vec<String>>(raw.get()).ok())
                .unwrap_or_default();
            let fields = [
                ("id", names.id),
                ("name", names.name),
                ("model", names.model),
            ];
            let ours = |field: &str| self.fields.contains(&field);
            let candidates = (fields.iter())
                .filter(|(field, _)| ours(field))
                .filter_map(|(_, raw)| string(*raw))
                .chain(aliases.into_iter().filter(|_| ours("aliases")));
            let Some(model) = candidates.into_iter().find_map(|n| (self.configured)(&n)) else {
                continue;
            };
            if self.named.contains(&model) {
                continue;
            }
            // The entry's own name fields become the configured name, in place.
            let mut spans: Vec<Range<usize>> = (fields.iter())
                .filter(|(field, _)| ours(field))
                .filter_map(|(_, raw)| super::model::span_in(text.as_bytes(), (*raw)?.get()))
                .collect();
            spans.sort_by_key(|span| span.start);
            let Ok(quoted) = serde_json::to_string(&model) else {
                continue;
            };
            let replaced = spans.into_iter().map(|span| (span, quoted.as_bytes()));
            let renamed = super::model::splice(text.as_bytes(), replaced)
                .unwrap_or_else(|| text.as_bytes().to_vec());
            self.entries.push(renamed);
            self.named.push(model);
        }
        Ok(())
    }
}

/// Most entries kept of one list: a route's models, never more than a host lists.
const MAX_ENTRIES: usize = 1024;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// A host that knows `qwen-coder` as `Qwen2.5-Coder` and serves `chat` by its own name.
    fn titan(name: &str) -> Option<String> {
        match name {
            "Qwen2.5-Coder" | "qwen-coder" => Some("qwen-coder".into()),
            "chat" => Some("chat".into()),
            _ => None,
        }
    }

    #[test]
    fn a_listing_names_the_routes_models_as_the_config_does_and_nothing_else_issue_48() {
        let body = br#"{"object":"list","data":[{"id":"Qwen2.5-Coder","status":{"value":"loaded"}},
            {"id":"chat"},{"id":"llama-3-8b"},{"id":"qc","aliases":["qwen-coder"]}],
            "models":[{"name":"Qwen2.5-Coder","model":"Qwen2.5-Coder"},{"name":"x","model":"x"}]}"#;
        let renamed: Value = serde_json::from_slice(&rename(body, &titan).unwrap()).unwrap();
        let ids: Vec<&str> = (renamed["data"].as_array().unwrap().iter())
            .map(|e| e["id"].as_str().unwrap())
            .collect();
        assert_eq!(
            ids,
            ["qwen-coder", "chat"],
            "a model the route does not serve is left out, and each once"
        );
        assert_eq!(renamed["data"][0]["status"]["value"], "loaded");
        assert_eq!(renamed["models"][0]["name"], "qwen-coder");
        assert_eq!(renamed["models"][0]["model"], "qwen-coder");
        assert_eq!(renamed["models"].as_array().unwrap().len(), 1);
        assert_eq!(rename(b"<html>", &titan), None);
        assert_eq!(rename(b"{}", &titan), None);
    }

    /// A single-model host started without `-a` lists its model file's path: through a route it is
    /// the route's model.
    #[test]
    fn a_host_listing_its_model_file_shows_the_routes_model_issue_48() {
        let body = br#"{"object":"list","data":[{"id":"/models/tiny-llama3.gguf","meta":{"n_ctx":2048}}]}"#;
        let route = |name: &str| (name == "/models/tiny-llama3.gguf").then(|| "qwen-coder".into());
        let renamed = String::from_utf8(rename(body, &route).unwrap()).unwrap();
        assert_eq!(
            renamed,
            r#"{"object":"list","data":[{"id":"qwen-coder","meta":{"n_ctx":2048}}]}"#
        );
    }

    /// Issue 15 (review): the listing was parsed into a `Value` (~16× its 4 MiB bound, built from
    /// a host's bytes) and written back re-ordered, with big integers turned into floats.
    #[test]
    fn a_renamed_entry_keeps_every_other_byte_as_the_host_wrote_it_issue_15() {
        let body = br#"{"object":"list","models":[{"model":"coder","name":"n"}], "data":[ {"owned_by":"x","id" : "coder","created":123456789012345678901234567890},
            {"id":"c\u006fder"}, 7, {"id":"other"}]}"#;
        let qwen = |name: &str| (name == "coder").then(|| "qwen".to_string());
        let want = r#"{"object":"list","data":[{"owned_by":"x","id" : "qwen","created":123456789012345678901234567890}],"models":[{"model":"qwen","name":"qwen"}]}"#;
        let renamed = rename(body, &qwen).unwrap();
        assert_eq!(String::from_utf8(renamed).unwrap(), want);
    }
}
