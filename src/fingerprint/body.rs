//! The one parse of a request body: only the fields the peek and the APIs read are built as values.
//!
//! A long conversation's body is mostly its later turns; those (everything after the first
//! `user` message or item) and every unknown field are skipped with `IgnoredAny`, so the peek
//! allocates little more than the leading turns. Duplicate keys: the last one wins, as in `Value`.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, Error, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use crate::api::Api;

/// Completion-style prompt fields, in order of precedence (`Body::prompts` follows this order).
pub(crate) const PROMPT_FIELDS: [&str; 4] = ["prompt", "input_prefix", "content", "input"];

/// The fields of a request body that the peek reads; `null` counts as absent.
#[derive(Debug, Default)]
pub struct Body {
    pub model: Option<Value>,
    pub stream: Option<Value>,
    pub prompt_cache_key: Option<Value>,
    /// `messages` up to and including the first with role `user` (all when none is); empty when
    /// `messages` is not an array.
    pub messages: Option<Vec<Value>>,
    /// Anthropic Messages' top-level `system`.
    pub system: Option<Value>,
    /// OpenAI Responses' `instructions`.
    pub instructions: Option<Value>,
    /// OpenAI Responses' `input` (only for that API; elsewhere `input` is a prompt field).
    pub input: Option<Input>,
    pub prompts: [Option<Value>; 4],
}

/// A Responses `input`: a plain string, or the items up to and including the first user message
/// (all when none is; empty when it is neither a string nor an array).
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    Text(String),
    Items(Vec<Value>),
}

impl Body {
    /// `None` when `bytes` is not one JSON object. `api` says what `input` is.
    pub fn parse(bytes: &[u8], api: Api) -> Option<Body> {
        let mut de = serde_json::Deserializer::from_slice(bytes);
        let body = de.deserialize_map(BodyVisitor(api)).ok()?;
        de.end().ok()?;
        Some(body)
    }
}

struct BodyVisitor(Api);

impl<'de> Visitor<'de> for BodyVisitor {
    type Value = Body;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Body, A::Error> {
        let mut body = Body::default();
        let items = self.0.input_is_conversation();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "model" => body.model = map.next_value()?,
                "stream" => body.stream = map.next_value()?,
                "prompt_cache_key" => body.prompt_cache_key = map.next_value()?,
                "system" => body.system = map.next_value()?,
                "instructions" => body.instructions = map.next_value()?,
                "messages" => {
                    body.messages = map.next_value_seed(Leading(is_user))?.map(|i| match i {
                        Input::Items(items) => items,
                        Input::Text(_) => Vec::new(),
                    })
                }
                "input" if items => {
                    body.input = map.next_value_seed(Leading(crate::api::is_user_item))?
                }
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

fn is_user(message: &Value) -> bool {
    message.get("role").and_then(Value::as_str) == Some("user")
}

/// Reads an array up to and including the first element `.0` says is the last one read (the
/// rest is skipped unbuilt); a string as itself; `null` as absent; any other value as no items.
struct Leading(fn(&Value) -> bool);

impl<'de> DeserializeSeed<'de> for Leading {
    type Value = Option<Input>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<Input>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Leading {
    type Value = Option<Input>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Option<Input>, A::Error> {
        let mut out = Vec::new();
        while let Some(item) = seq.next_element::<Value>()? {
            let last = (self.0)(&item);
            out.push(item);
            if last {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                break;
            }
        }
        Ok(Some(Input::Items(out)))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<Input>, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Some(Input::Items(Vec::new())))
    }

    fn visit_str<E: Error>(self, s: &str) -> Result<Option<Input>, E> {
        Ok(Some(Input::Text(s.to_owned())))
    }

    fn visit_bool<E: Error>(self, _: bool) -> Result<Option<Input>, E> {
        Ok(Some(Input::Items(Vec::new())))
    }

    fn visit_i64<E: Error>(self, _: i64) -> Result<Option<Input>, E> {
        Ok(Some(Input::Items(Vec::new())))
    }

    fn visit_u64<E: Error>(self, _: u64) -> Result<Option<Input>, E> {
        Ok(Some(Input::Items(Vec::new())))
    }

    fn visit_f64<E: Error>(self, _: f64) -> Result<Option<Input>, E> {
        Ok(Some(Input::Items(Vec::new())))
    }

    fn visit_unit<E: Error>(self) -> Result<Option<Input>, E> {
        Ok(None)
    }
}
