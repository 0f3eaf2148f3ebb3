//! The one parse of a request body: only the fields the peek and the APIs read are built as values.
//!
//! A long conversation's body is mostly its later turns; those (everything after the first
//! `user` message or item) and every unknown field are skipped with `IgnoredAny`, so the peek
//! allocates little more than the leading turns. Members are read as the host reads them
//! (`crate::members`): keys with their escapes decoded, and of a key given twice the last wins.
//! What is built is bounded too: at most [`MAX_VALUES`] values per body (a `Value` costs 32 bytes
//! and more, so `[0,0,...]` would cost 16 times its size); a body past that names no conversation,
//! and is read again for its `model`, `stream` and `prompt_cache_key` alone.

use std::cell::Cell;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, Error, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use super::Api;

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
    /// The tool definitions every API may carry (part of a request's prompt family).
    pub tools: Option<Value>,
    /// OpenAI Responses' `input` (only for that API; elsewhere `input` is a prompt field).
    pub input: Option<Input>,
    pub prompts: [Option<Value>; 4],
    /// The body names a slot (`id_slot`, whatever its value): a client may not (issue 46).
    pub names_slot: bool,
}

/// A Responses `input`: a plain string, or the items up to and including the first user message
/// (all when none is; empty when it is neither a string nor an array).
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    Text(String),
    Items(Vec<Value>),
}

/// Most JSON values (numbers, strings, arrays, objects... at any depth) the peek builds from one
/// body: far more than the leading turns of any real conversation hold, and about 16 MiB of them.
pub(crate) const MAX_VALUES: usize = 1 << 18;

impl Body {
    /// `None` when `bytes` is not one JSON object. `api` says what `input` is.
    pub fn parse(bytes: &[u8], api: Api) -> Option<Body> {
        let budget = Budget(Cell::new(MAX_VALUES));
        match Body::parse_as(
            bytes,
            BodyVisitor {
                api,
                budget: &budget,
                minimal: false,
                body: Body::default(),
            },
        ) {
            None if budget.0.get() == 0 => {
                let budget = Budget(Cell::new(MAX_VALUES));
                Body::parse_as(
                    bytes,
                    BodyVisitor {
                        api,
                        budget: &budget,
                        minimal: true,
                        body: Body::default(),
                    },
                )
            }
            parsed => parsed,
        }
    }

    fn parse_as(bytes: &[u8], mut visitor: BodyVisitor<'_>) -> Option<Body> {
        crate::members::read(bytes, &mut visitor)?;
        Some(visitor.body)
    }
}

/// How many more values may be built; 0 once the body had too many.
struct Budget(Cell<usize>);

impl Budget {
    fn spend<E: Error>(&self) -> Result<(), E> {
        match self.0.get() {
            0 => Err(E::custom("too many values")),
            left => {
                self.0.set(left - 1);
                Ok(())
            }
        }
    }
}

/// `minimal`: only `model`, `stream` and `prompt_cache_key` are built (the body had too many
/// values for the rest). Members come as the host reads them (`members`): keys decoded, the last
/// of two winning.
struct BodyVisitor<'b> {
    api: Api,
    budget: &'b Budget,
    minimal: bool,
    body: Body,
}

impl<'de> crate::members::Take<'de> for BodyVisitor<'_> {
    fn member<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<bool, A::Error> {
        let body = &mut self.body;
        let field = Field(self.budget);
        let leading = |last| Leading(last, self.budget);
        match key {
            "id_slot" => {
                body.names_slot = true;
                return Ok(false);
            }
            "model" => body.model = map.next_value_seed(field)?,
            "stream" => body.stream = map.next_value_seed(field)?,
            "prompt_cache_key" => body.prompt_cache_key = map.next_value_seed(field)?,
            _ if self.minimal => return Ok(false),
            "system" => body.system = map.next_value_seed(field)?,
            "instructions" => body.instructions = map.next_value_seed(field)?,
            "tools" => body.tools = map.next_value_seed(field)?,
            "messages" => {
                body.messages = map.next_value_seed(leading(is_user))?.map(|i| match i {
                    Input::Items(items) => items,
                    Input::Text(_) => Vec::new(),
                })
            }
            "input" if self.api.input_is_conversation() => {
                body.input = map.next_value_seed(leading(crate::api::is_user_item))?
            }
            other => match PROMPT_FIELDS.iter().position(|f| *f == other) {
                Some(i) => body.prompts[i] = map.next_value_seed(field)?,
                None => return Ok(false),
            },
        }
        Ok(true)
    }
}

fn is_user(message: &Value) -> bool {
    message.get("role").and_then(Value::as_str) == Some("user")
}

/// Reads an array up to and including the first element `.0` says is the last one read (the
/// rest is skipped unbuilt); a string as itself; `null` as absent; any other value as no items.
struct Leading<'b>(fn(&Value) -> bool, &'b Budget);

impl<'de> DeserializeSeed<'de> for Leading<'_> {
    type Value = Option<Input>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<Input>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Leading<'_> {
    type Value = Option<Input>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Option<Input>, A::Error> {
        let mut out = Vec::new();
        while let Some(item) = seq.next_element_seed(Tree(self.1))? {
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

/// A field's value built within the budget; `null` counts as absent (as `Option<Value>` reads it).
#[derive(Clone, Copy)]
struct Field<'b>(&'b Budget);

impl<'de> DeserializeSeed<'de> for Field<'_> {
    type Value = Option<Value>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<Value>, D::Error> {
        Tree(self.0)
            .deserialize(d)
            .map(|v| (!v.is_null()).then_some(v))
    }
}

/// A `Value` exactly as `serde_json` builds one, each of its values spent from the budget.
#[derive(Clone, Copy)]
struct Tree<'b>(&'b Budget);

impl<'de> DeserializeSeed<'de> for Tree<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Tree<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: Error>(self, v: bool) -> Result<Value, E> {
        self.0.spend()?;
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: Error>(self, v: i64) -> Result<Value, E> {
        self.0.spend()?;
        Ok(Value::from(v))
    }

    fn visit_u64<E: Error>(self, v: u64) -> Result<Value, E> {
        self.0.spend()?;
        Ok(Value::from(v))
    }

    fn visit_f64<E: Error>(self, v: f64) -> Result<Value, E> {
        self.0.spend()?;
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E: Error>(self, v: &str) -> Result<Value, E> {
        self.0.spend()?;
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E: Error>(self, v: String) -> Result<Value, E> {
        self.0.spend()?;
        Ok(Value::String(v))
    }

    fn visit_unit<E: Error>(self) -> Result<Value, E> {
        self.0.spend()?;
        Ok(Value::Null)
    }

    fn visit_none<E: Error>(self) -> Result<Value, E> {
        self.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        self.deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        self.0.spend()?;
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(self)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        self.0.spend()?;
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value_seed(self)?;
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}
