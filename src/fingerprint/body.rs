//! The one parse of a request body: only the fields the peek reads are built as values.
//!
//! A long conversation's body is mostly its later messages; those (everything after the first
//! `user` message) and every unknown field are skipped with `IgnoredAny`, so the peek allocates
//! little more than the leading messages. Duplicate keys: the last one wins, as in `Value`.

use std::fmt;

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

/// Completion-style prompt fields, in order of precedence (`Body::prompts` follows this order).
pub(super) const PROMPT_FIELDS: [&str; 4] = ["prompt", "input_prefix", "content", "input"];

/// The fields of a request body that the peek reads; `null` counts as absent.
#[derive(Debug, Default)]
pub(super) struct Body {
    pub model: Option<Value>,
    pub stream: Option<Value>,
    pub prompt_cache_key: Option<Value>,
    /// `messages` up to and including the first with role `user` (all when none is); empty when
    /// `messages` is not an array.
    pub messages: Option<Vec<Value>>,
    pub prompts: [Option<Value>; 4],
}

impl Body {
    /// `None` when `bytes` is not one JSON object.
    pub fn parse(bytes: &[u8]) -> Option<Body> {
        serde_json::from_slice(bytes).ok()
    }
}

impl<'de> Deserialize<'de> for Body {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Body, D::Error> {
        d.deserialize_map(BodyVisitor)
    }
}

struct BodyVisitor;

impl<'de> Visitor<'de> for BodyVisitor {
    type Value = Body;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Body, A::Error> {
        let mut body = Body::default();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "model" => body.model = map.next_value()?,
                "stream" => body.stream = map.next_value()?,
                "prompt_cache_key" => body.prompt_cache_key = map.next_value()?,
                "messages" => body.messages = map.next_value::<Option<Leading>>()?.map(|l| l.0),
                other => match PROMPT_FIELDS.iter().position(|f| *f == other) {
                    Some(i) => body.prompts[i] = map.next_value()?,
                    None => {
                        map.next_value::<IgnoredAny>()?;
                    }
                },
            }
        }
        Ok(body)
    }
}

/// The leading messages of a `messages` array; any other JSON value gives an empty list.
struct Leading(Vec<Value>);

fn is_user(message: &Value) -> bool {
    message.get("role").and_then(Value::as_str) == Some("user")
}

impl<'de> Deserialize<'de> for Leading {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Leading, D::Error> {
        d.deserialize_any(LeadingVisitor)
    }
}

struct LeadingVisitor;

impl<'de> Visitor<'de> for LeadingVisitor {
    type Value = Leading;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Leading, A::Error> {
        let mut out = Vec::new();
        while let Some(message) = seq.next_element::<Value>()? {
            let user = is_user(&message);
            out.push(message);
            if user {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                break;
            }
        }
        Ok(Leading(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Leading, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Leading(Vec::new()))
    }

    fn visit_bool<E>(self, _: bool) -> Result<Leading, E> {
        Ok(Leading(Vec::new()))
    }

    fn visit_i64<E>(self, _: i64) -> Result<Leading, E> {
        Ok(Leading(Vec::new()))
    }

    fn visit_u64<E>(self, _: u64) -> Result<Leading, E> {
        Ok(Leading(Vec::new()))
    }

    fn visit_f64<E>(self, _: f64) -> Result<Leading, E> {
        Ok(Leading(Vec::new()))
    }

    fn visit_str<E>(self, _: &str) -> Result<Leading, E> {
        Ok(Leading(Vec::new()))
    }

    fn visit_unit<E>(self) -> Result<Leading, E> {
        Ok(Leading(Vec::new()))
    }
}
