//! The model a forwarded body names. A router-mode llama-server routes by the body's `model` and
//! refuses a body without one, so crossbar puts the route's model into a body that names none; and
//! a host may know a model by another name (`upstream` in the config), so crossbar renames it on
//! the way out. Pure: bytes in, bytes out; a body that is not a JSON object passes untouched.

use std::borrow::Cow;

use serde_json::Value;

/// `body` naming `model`: a JSON object without a `model` gets one, inserted right after the
/// opening brace so every other byte stays as the client sent it; an object naming another model
/// gets `model` instead (re-serialised); anything else is returned as it is.
pub(super) fn named<'a>(body: &'a [u8], model: &str) -> Cow<'a, [u8]> {
    let Ok(Value::Object(mut map)) = serde_json::from_slice::<Value>(body) else {
        return body.into();
    };
    match map.get("model") {
        Some(Value::String(named)) if named == model => body.into(),
        Some(_) => {
            map.insert("model".to_string(), model.into());
            serde_json::to_vec(&Value::Object(map)).map_or(body.into(), Into::into)
        }
        None => {
            let Some(open) = body.iter().position(|b| *b == b'{') else {
                return body.into();
            };
            let name = Value::from(model).to_string();
            let empty = map.is_empty();
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

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn what_is_not_a_json_object_passes_untouched() {
        for body in ["", "[1,2]", "not json", "\"s\"", "{\"a\":"] {
            check(body, "coder", body);
        }
    }
}
