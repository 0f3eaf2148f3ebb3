//! Reading a host's `/props` and `/v1/models` (or a router's `/models`) answers without building
//! them. A host is hostile until checked: parsed into a `serde_json::Value`, a 10 MiB answer of
//! `[0,0,0,…]` or `{"data":[{},{},…]}` became a hundred or more MB of values on every poll.
//!
//! Read the way `proxy::listing` reads a listing: the fields crossbar reads are borrowed as raw
//! JSON (everything else is skipped by the parser unbuilt), a listing's entries are visited one at
//! a time, and a list of strings keeps at most [`MAX_TEXTS`]. A field of the wrong shape reads as
//! absent, as with `Value`: only an answer that is not JSON, or not an object (a listing: nor an
//! array), is a bad answer.

use std::fmt;

use serde::de::{Deserializer as _, IgnoredAny, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::ParseError;

/// Most strings kept from one list in an answer (an entry's aliases, a model's arguments).
pub const MAX_TEXTS: usize = 1024;

/// What `/props` says, as far as crossbar reads it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Props {
    /// `default_generation_settings.n_ctx`: the per-slot context; `None` for 0 too.
    pub n_ctx: Option<u64>,
    pub total_slots: Option<u64>,
    /// A router's `--models-max`.
    pub max_instances: Option<u64>,
    /// `build_info` ("b11434-abcdef"), at most [`MAX_BUILD`] characters.
    pub build: Option<String>,
}

/// Most characters of a `build_info` kept.
pub const MAX_BUILD: usize = 64;

/// One listing entry, as far as crossbar reads it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Entry {
    pub id: Option<String>,
    pub aliases: Vec<String>,
    /// Present (router mode) whatever its shape: `{"value": …, "args": […]}` or a bare string.
    pub status: Option<Status>,
    /// `meta.n_ctx_train`: the context the model was trained for, when the entry says.
    pub ctx_train: Option<u64>,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Status {
    pub value: Option<String>,
    pub args: Vec<String>,
}

/// The fields of an object, each borrowed raw when present.
#[derive(Deserialize)]
struct RawProps<'a> {
    #[serde(borrow)]
    default_generation_settings: Option<&'a RawValue>,
    #[serde(borrow)]
    total_slots: Option<&'a RawValue>,
    #[serde(borrow)]
    max_instances: Option<&'a RawValue>,
    #[serde(borrow)]
    build_info: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct RawSettings<'a> {
    #[serde(borrow)]
    n_ctx: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct RawEntry<'a> {
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    #[serde(borrow)]
    aliases: Option<&'a RawValue>,
    #[serde(borrow)]
    status: Option<&'a RawValue>,
    #[serde(borrow)]
    meta: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct RawMeta<'a> {
    #[serde(borrow)]
    n_ctx_train: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct RawStatus<'a> {
    #[serde(borrow)]
    value: Option<&'a RawValue>,
    #[serde(borrow)]
    args: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct RawListing<'a> {
    #[serde(borrow)]
    data: Option<&'a RawValue>,
}

/// `/props`; not JSON, or not an object, is an error.
pub fn props(body: &str) -> Result<Props, ParseError> {
    let raw: RawProps = object(body)?;
    let settings = raw
        .default_generation_settings
        .and_then(fields::<RawSettings>);
    Ok(Props {
        // 0 (a router's own `/props`) is an unknown context, which the guard leaves alone.
        n_ctx: (settings.and_then(|s| s.n_ctx).and_then(count)).filter(|n| *n > 0),
        total_slots: raw.total_slots.and_then(count),
        max_instances: raw.max_instances.and_then(count),
        build: (raw.build_info)
            .and_then(|v| serde_json::from_str::<String>(v.get()).ok())
            .map(|b| b.chars().take(MAX_BUILD).collect()),
    })
}

/// Calls `each` for every entry of a listing (`{"data": [...]}` or a bare array), in order.
pub fn listing(body: &str, each: &mut dyn FnMut(Entry)) -> Result<(), ParseError> {
    let list = if top(body) == Some(b'[') {
        body
    } else {
        let raw = object::<RawListing>(body).map_err(|err| match err {
            ParseError::Shape(_) => ParseError::Shape(LISTING),
            json => json,
        })?;
        raw.data.map(RawValue::get).unwrap_or("null")
    };
    if top(list) != Some(b'[') {
        return Err(ParseError::Shape(LISTING));
    }
    let mut de = serde_json::Deserializer::from_str(list);
    de.deserialize_seq(Entries(each))
        .map_err(ParseError::Json)?;
    de.end().map_err(ParseError::Json)
}

const LISTING: &str = "an object with a `data` array";

/// An entry from a JSON text (tests build entries this way).
#[cfg(test)]
pub fn entry(text: &str) -> Entry {
    read_entry(text)
}

/// The first byte that is not whitespace.
fn top(body: &str) -> Option<u8> {
    body.as_bytes().trim_ascii_start().first().copied()
}

/// `body` as an object's fields; not JSON, or not an object, is an error. (Serde would also read
/// an array positionally into the fields.)
fn object<'a, T: Deserialize<'a>>(body: &'a str) -> Result<T, ParseError> {
    if top(body) == Some(b'{') {
        return serde_json::from_str(body).map_err(ParseError::Json);
    }
    serde_json::from_str::<IgnoredAny>(body).map_err(ParseError::Json)?;
    Err(ParseError::Shape("an object"))
}

/// A raw value's fields when it is an object (of fields that are all optional), else `None`.
fn fields<'a, T: Deserialize<'a>>(raw: &'a RawValue) -> Option<T> {
    (top(raw.get()) == Some(b'{'))
        .then(|| serde_json::from_str(raw.get()).ok())
        .flatten()
}

fn count(raw: &RawValue) -> Option<u64> {
    serde_json::from_str(raw.get()).ok()
}

fn text(raw: &RawValue) -> Option<String> {
    serde_json::from_str(raw.get()).ok()
}

fn read_entry(raw: &str) -> Entry {
    let Some(entry) = (top(raw) == Some(b'{'))
        .then(|| serde_json::from_str::<RawEntry>(raw).ok())
        .flatten()
    else {
        return Entry::default();
    };
    let status = entry.status.map(|raw| match fields::<RawStatus>(raw) {
        Some(status) => Status {
            value: status.value.and_then(text),
            args: status.args.map(texts).unwrap_or_default(),
        },
        None => Status {
            value: text(raw),
            args: Vec::new(),
        },
    });
    let ctx_train = (entry.meta.and_then(fields::<RawMeta>))
        .and_then(|m| m.n_ctx_train)
        .and_then(count);
    Entry {
        id: entry.id.and_then(text),
        aliases: entry.aliases.map(texts).unwrap_or_default(),
        status,
        ctx_train,
    }
}

/// The strings of an array, at most [`MAX_TEXTS`]; anything else in it is skipped unbuilt.
fn texts(raw: &RawValue) -> Vec<String> {
    struct Texts;
    impl<'de> Visitor<'de> for Texts {
        type Value = Vec<String>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an array")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<String>, A::Error> {
            let mut kept = Vec::new();
            while let Some(item) = seq.next_element::<&RawValue>()? {
                if kept.len() < MAX_TEXTS {
                    kept.extend(text(item));
                }
            }
            Ok(kept)
        }
    }
    let mut de = serde_json::Deserializer::from_str(raw.get());
    de.deserialize_seq(Texts).unwrap_or_default()
}

/// Visits a listing's entries one at a time, never holding the list.
struct Entries<'f>(&'f mut dyn FnMut(Entry));

impl<'de> Visitor<'de> for Entries<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of models")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(entry) = seq.next_element::<&RawValue>()? {
            (self.0)(read_entry(entry.get()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
