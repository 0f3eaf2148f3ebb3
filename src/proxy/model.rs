//! The model a forwarded body names. A router-mode llama-server routes by the body's `model` and
//! refuses a body without one, so crossbar puts the route's model into a body that names none; and
//! a host may know a model by another name (`upstream` in the config), so crossbar renames it on
//! the way out. Pure: bytes in, bytes out; a body that is not a JSON object passes untouched, and
//! every byte but the model's value stays as the client sent it (no value is built: a body may be
//! 16 MiB of small numbers, and a re-serialised `Value` would round big integers).

use std::borrow::Cow;
use std::ops::Range;

/// Where text the parser borrowed from a body sits in it (`proxy/listing.rs` too).
pub(super) use crate::members::span_in;

/// `body` naming `model`: a JSON object without a `model` gets one, inserted right after the
/// opening brace; an object naming another model gets `model` instead, in place (every top-level
/// `model` key, should there be several); anything else is returned as it is.
pub(super) fn named<'a>(body: &'a [u8], model: &str) -> Cow<'a, [u8]> {
    let Some(spans) = model_spans(body) else {
        return body.into();
    };
    let name = serde_json::Value::from(model).to_string();
    match spans.last() {
        Some(last) if body[last.clone()] == *name.as_bytes() && spans.len() == 1 => body.into(),
        Some(_) => {
            let edits = spans.into_iter().map(|span| (span, name.as_bytes()));
            splice(body, edits).map_or(body.into(), Cow::Owned)
        }
        None => {
            let Some(open) = crate::members::open(body) else {
                return body.into();
            };
            let empty = body[open + 1..]
                .iter()
                .all(|b| b.is_ascii_whitespace() || *b == b'}');
            let mut out = Vec::with_capacity(body.len() + name.len() + 10);
            out.extend_from_slice(&body[..=open]);
            out.extend_from_slice(b"\"model\":");
            out.extend_from_slice(name.as_bytes());
            if !empty {
                out.push(b',');
            }
            out.extend_from_slice(&body[open + 1..]);
            out.into()
        }
    }
}

/// Where the values of the top-level `model` keys are in `body`, in order, read as the host reads
/// them (`members`: escaped and repeated keys too); `None` when `body` is not one JSON object.
fn model_spans(body: &[u8]) -> Option<Vec<Range<usize>>> {
    crate::members::spans(body, "model")
}

/// `body` with each span replaced by its bytes, every other byte as it was; `edits` come in
/// body order and do not overlap (`None` if they do).
pub(super) fn splice<'e>(
    body: &[u8],
    edits: impl IntoIterator<Item = (Range<usize>, &'e [u8])>,
) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(body.len() + 64);
    let mut at = 0;
    for (span, with) in edits {
        out.extend_from_slice(body.get(at..span.start)?);
        out.extend_from_slice(with);
        at = span.end;
    }
    out.extend_from_slice(body.get(at..)?);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[track_caller]
    fn check(body: &str, model: &str, want: &str) {
        let got = named(body.as_bytes(), model);
        assert_eq!(String::from_utf8_lossy(&got), want, "{body}");
    }

    #[test]
    fn a_body_without_a_model_gets_it_and_keeps_every_other_byte() {
        check(
            r#" { "messages" : [ {"role":"user"} ] }"#,
            "coder",
            r#" {"model":"coder", "messages" : [ {"role":"user"} ] }"#,
        );
        check("{}", "coder", r#"{"model":"coder"}"#);
        check(" {\n}", "a\"b", " {\"model\":\"a\\\"b\"\n}");
    }

    #[test]
    fn a_body_naming_the_model_is_untouched_and_another_name_is_replaced() {
        check(
            r#"{"model":"coder","x":1}"#,
            "coder",
            r#"{"model":"coder","x":1}"#,
        );
        let renamed = named(br#"{"model":"coder","x":1}"#, "Qwen2.5-Coder-32B");
        let renamed: Value = serde_json::from_slice(&renamed).unwrap();
        assert_eq!(renamed["model"], "Qwen2.5-Coder-32B");
        assert_eq!(renamed["x"], 1);
    }

    /// Review (issue 15): a rename re-serialised the whole body through `Value`, which turned
    /// `123456789012345678901234567890` into `1.2345678901234568e29`, reordered keys, and built
    /// 32 bytes per value of a 16 MiB body. Only the model's value changes now.
    #[test]
    fn a_rename_changes_the_models_value_and_no_other_byte() {
        check(
            r#"{"t":1.10, "seed":123456789012345678901234567890,"model" : "coder","m":[{"b":1,"a":2}]}"#,
            "Q\"x",
            r#"{"t":1.10, "seed":123456789012345678901234567890,"model" : "Q\"x","m":[{"b":1,"a":2}]}"#,
        );
        check(
            r#"{"model":{"a":[1]},"x":null,"model":7}"#,
            "Q",
            r#"{"model":"Q","x":null,"model":"Q"}"#,
        );
        let many = format!(
            r#"{{"model":"coder","p":[{}]}}"#,
            vec!["0"; 100_000].join(",")
        );
        let renamed = named(many.as_bytes(), "Q");
        assert_eq!(renamed.len(), many.len() - 4);
    }

    /// Issue 46: the host reads a key with its escapes decoded and keeps the last of two; a body
    /// that names its model so is renamed as the host will read it, and one with a byte order
    /// mark gets its model inside the object.
    #[test]
    fn an_escaped_or_repeated_model_key_is_renamed_as_the_host_reads_it_issue_46() {
        check(
            r#"{"mod\u0065l":"coder","x":1}"#,
            "Q",
            r#"{"mod\u0065l":"Q","x":1}"#,
        );
        check(
            r#"{"model":"coder","model":"other"}"#,
            "Q",
            r#"{"model":"Q","model":"Q"}"#,
        );
        check(
            "\u{feff}{\"x\":1}",
            "Q",
            "\u{feff}{\"model\":\"Q\",\"x\":1}",
        );
    }

    #[test]
    fn what_is_not_a_json_object_passes_untouched() {
        for body in ["", "[1,2]", "not json", "\"s\"", "{\"a\":"] {
            check(body, "coder", body);
        }
    }
}
