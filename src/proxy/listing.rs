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

use crate::config::Host;
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

/// The bound on the answer to this request when it is a listing to rename — a `GET` of the models
/// of a host that knows some configured model by another name —, for its head and then for its
/// whole body: `first_byte_timeout`, at most [`LISTING_TIMEOUT`] (per-read timeouts alone let a
/// host trickle it a byte at a time); `None` for every other request. Decided once, as the plan
/// is made.
pub(super) fn bound(
    incoming: &Incoming,
    host: &Host,
    rest: &str,
    first_byte_timeout: Duration,
) -> Option<Duration> {
    let renames = incoming.method == "GET"
        && matches!(rest, "/v1/models" | "/models")
        && !host.upstream.is_empty();
    renames.then(|| first_byte_timeout.min(LISTING_TIMEOUT))
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
    let renamed = rename(&body, plan.host);
    let out = renamed.as_deref().unwrap_or(&body);
    match request.send_later(ctx.row.status, &headers, out) {
        Ok(end) => Outcome::Answered { end, coming: None },
        Err(err) => Outcome::Gone(format!("client gone before the model listing: {err}")),
    }
}

/// The listing with every `id` (and `name`/`model` in the `models` list) that is a configured
/// model's upstream name replaced by the configured name, every other byte as the host sent it;
/// `None` when it is not a JSON object or names nothing to rename. Nothing is built but the
/// borrowed fields of one entry at a time and the replacements.
pub(super) fn rename(body: &[u8], host: &Host) -> Option<Vec<u8>> {
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
    // A name the config also uses for a model of its own stays as it is.
    let configured = |name: &str| {
        (host.upstream.iter())
            .find(|(_, upstream)| *upstream == name && !host.models.contains_key(name))
            .map(|(model, _)| model.as_str())
    };
    let mut edits = Edits {
        body,
        configured: &configured,
        found: Vec::new(),
    };
    for (list, fields) in [(lists.data, ID), (lists.models, NAME_MODEL)] {
        let Some(list) = list else { continue };
        let entries = Entries {
            edits: &mut edits,
            fields,
        };
        // A list that is not an array of objects renames what it can up to where it breaks.
        let _ = serde_json::Deserializer::from_str(list.get()).deserialize_seq(entries);
    }
    if edits.found.is_empty() {
        return None;
    }
    // In body order (`models` may come before `data`, and fields in any order).
    edits.found.sort_by_key(|(span, _)| span.start);
    let names: Vec<String> = (edits.found.iter())
        .map(|(_, name)| serde_json::to_string(name))
        .collect::<Result<_, _>>()
        .ok()?;
    let spans = edits.found.into_iter().map(|(span, _)| span);
    super::model::splice(body, spans.zip(names.iter().map(|n| n.as_bytes())))
}

/// The fields renamed in a `data` entry and in a `models` entry.
const ID: &[&str] = &["id"];
const NAME_MODEL: &[&str] = &["name", "model"];

/// Replacements found so far: byte ranges of the body (in order) and the configured name.
struct Edits<'c> {
    body: &'c [u8],
    configured: &'c dyn Fn(&str) -> Option<&'c str>,
    /// Where a name to replace is, and the configured name it becomes.
    found: Vec<(Range<usize>, &'c str)>,
}

/// Visits one list's entries one at a time, never holding the list.
struct Entries<'e, 'c> {
    edits: &'e mut Edits<'c>,
    fields: &'static [&'static str],
}

impl<'de> Visitor<'de> for Entries<'_, '_> {
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
            name: Option<&'a RawValue>,
            #[serde(borrow)]
            model: Option<&'a RawValue>,
        }
        while let Some(entry) = seq.next_element::<&RawValue>()? {
            if !entry.get().starts_with('{') {
                continue;
            }
            let Ok(names) = serde_json::from_str::<Names>(entry.get()) else {
                continue;
            };
            let fields = [
                ("id", names.id),
                ("name", names.name),
                ("model", names.model),
            ];
            let found = (fields.into_iter())
                .filter(|(field, _)| self.fields.contains(field))
                .filter_map(|(_, raw)| raw);
            for raw in found {
                let Ok(name) = serde_json::from_str::<Cow<'_, str>>(raw.get()) else {
                    continue;
                };
                let configured = (self.edits.configured)(&name);
                let span = super::model::span_in(self.edits.body, raw.get());
                if let (Some(configured), Some(span)) = (configured, span) {
                    self.edits.found.push((span, configured));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use std::collections::BTreeMap;

    #[test]
    fn upstream_names_become_configured_names_and_nothing_else_changes() {
        let host = Host {
            name: "titan".into(),
            url: "http://127.0.0.1:1".into(),
            weight: 1,
            api_key: None,
            ctx: None,
            kv_tokens: None,
            slot_prompt_similarity: Some(0.1),
            exclusive: false,
            ram_cache: None,
            implied: false,
            models: BTreeMap::from([
                ("qwen-coder".to_string(), Some(1)),
                ("chat".to_string(), Some(1)),
            ]),
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

    /// Issue 15 (review): the listing was parsed into a `Value` (~16× its 4 MiB bound, built from
    /// a host's bytes) and written back re-ordered, with big integers turned into floats.
    #[test]
    fn a_renamed_listing_keeps_every_other_byte_as_the_host_wrote_it_issue_15() {
        let host = Host {
            name: "titan".into(),
            url: "http://127.0.0.1:1".into(),
            weight: 1,
            api_key: None,
            ctx: None,
            kv_tokens: None,
            slot_prompt_similarity: Some(0.1),
            exclusive: false,
            ram_cache: None,
            implied: false,
            models: BTreeMap::from([("qwen".to_string(), Some(1))]),
            upstream: BTreeMap::from([("qwen".to_string(), "coder".to_string())]),
        };
        let body = br#"{"object":"list","models":[{"model":"coder","name":"n"}], "data":[ {"owned_by":"x","id" : "coder","created":123456789012345678901234567890},
            {"id":"c\u006fder"}, 7, {"id":"other"}]}"#;
        let want = r#"{"object":"list","models":[{"model":"qwen","name":"n"}], "data":[ {"owned_by":"x","id" : "qwen","created":123456789012345678901234567890},
            {"id":"qwen"}, 7, {"id":"other"}]}"#;
        let renamed = rename(body, &host).unwrap();
        assert_eq!(String::from_utf8(renamed).unwrap(), want);
        assert_eq!(
            rename(br#"{"data":[{"id":"other"}]}"#, &host),
            None,
            "nothing to rename"
        );
    }
}
