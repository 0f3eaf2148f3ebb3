//! Reading a host's `/props` and `/v1/models` (or a router's `/models`) answers without building
//! them. A host is hostile until checked: parsed into a `serde_json::Value`, a 10 MiB answer of
//! `[0,0,0,…]` or `{"data":[{},{},…]}` became a hundred or more MB of values on every poll. Here
//! every field crossbar does not read is skipped by the parser unbuilt, a listing's entries are
//! handled one at a time and dropped, and what an entry keeps is bounded ([`MAX_TEXTS`] names or
//! arguments). A field of the wrong shape reads as absent, as before: only an answer that is not
//! JSON, or not an object (a listing: nor an array), is a bad answer.

use std::fmt;

use serde::de::{Deserialize, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess};
use serde::de::{Error, Visitor};

use super::ParseError;

/// Most strings kept from one list in an answer (an entry's aliases, a model's arguments).
pub const MAX_TEXTS: usize = 1024;

/// What `/props` says, as far as crossbar reads it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Props {
    /// `default_generation_settings.n_ctx`: the per-slot context.
    pub n_ctx: Option<u64>,
    pub total_slots: Option<u64>,
    /// A router's `--models-max`.
    pub max_instances: Option<u64>,
}

/// One listing entry, as far as crossbar reads it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Entry {
    pub id: Option<String>,
    pub aliases: Vec<String>,
    /// Present (router mode) whatever its shape: `{"value": …, "args": […]}` or a bare string.
    pub status: Option<Status>,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Status {
    pub value: Option<String>,
    pub args: Vec<String>,
}

/// `/props`; not JSON, or not an object, is an error.
pub fn props(body: &str) -> Result<Props, ParseError> {
    let mut de = serde_json::Deserializer::from_str(body);
    let props = de.deserialize_any(PropsVisitor).map_err(ParseError::Json)?;
    de.end().map_err(ParseError::Json)?;
    props.ok_or(ParseError::Shape("an object"))
}

/// Calls `each` for every entry of a listing (`{"data": [...]}` or a bare array), in order.
pub fn listing(body: &str, each: &mut dyn FnMut(Entry)) -> Result<(), ParseError> {
    let mut de = serde_json::Deserializer::from_str(body);
    let found = (de.deserialize_any(ListingVisitor(each))).map_err(ParseError::Json)?;
    de.end().map_err(ParseError::Json)?;
    found
        .then_some(())
        .ok_or(ParseError::Shape("an object with a `data` array"))
}

/// An entry from a JSON text (tests build entries this way).
#[cfg(test)]
pub fn entry(text: &str) -> Entry {
    let mut got = None;
    listing(&format!("[{text}]"), &mut |e| got = Some(e)).unwrap();
    got.unwrap()
}

/// Implements the visits of booleans, numbers and null, all giving `$other`.
macro_rules! scalars {
    ($value:ty, $other:expr) => {
        fn visit_bool<E: Error>(self, _: bool) -> Result<$value, E> {
            Ok($other)
        }
        fn visit_i64<E: Error>(self, _: i64) -> Result<$value, E> {
            Ok($other)
        }
        fn visit_u64<E: Error>(self, _: u64) -> Result<$value, E> {
            Ok($other)
        }
        fn visit_f64<E: Error>(self, _: f64) -> Result<$value, E> {
            Ok($other)
        }
        fn visit_unit<E: Error>(self) -> Result<$value, E> {
            Ok($other)
        }
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("any JSON value")
        }
    };
}

/// Skips the rest of a sequence or map unbuilt.
fn drain_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

fn drain_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

/// Reads a map field by field: `read` takes the value of each key it knows and answers `true`;
/// the values of all other keys are skipped unbuilt.
fn each_field<'de, A: MapAccess<'de>>(
    mut map: A,
    mut read: impl FnMut(&str, &mut A) -> Result<bool, A::Error>,
) -> Result<(), A::Error> {
    while let Some(key) = map.next_key::<Scalar>()? {
        let known = match key.text() {
            Some(key) => read(&key, &mut map)?,
            None => false,
        };
        if !known {
            map.next_value::<IgnoredAny>()?;
        }
    }
    Ok(())
}

/// A value read as far as an answer's fields need: a string, a non-negative integer, or
/// anything else (skipped unbuilt).
enum Scalar {
    Text(String),
    Count(u64),
    Other,
}

impl Scalar {
    fn text(self) -> Option<String> {
        match self {
            Scalar::Text(s) => Some(s),
            _ => None,
        }
    }

    fn count(self) -> Option<u64> {
        match self {
            Scalar::Count(n) => Some(n),
            _ => None,
        }
    }
}

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Scalar, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Scalar;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_bool<E: Error>(self, _: bool) -> Result<Scalar, E> {
                Ok(Scalar::Other)
            }
            fn visit_i64<E: Error>(self, v: i64) -> Result<Scalar, E> {
                Ok(u64::try_from(v).map_or(Scalar::Other, Scalar::Count))
            }
            fn visit_u64<E: Error>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar::Count(v))
            }
            fn visit_f64<E: Error>(self, _: f64) -> Result<Scalar, E> {
                Ok(Scalar::Other)
            }
            fn visit_unit<E: Error>(self) -> Result<Scalar, E> {
                Ok(Scalar::Other)
            }
            fn visit_str<E: Error>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar::Text(v.to_string()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Scalar, A::Error> {
                drain_seq(seq).map(|()| Scalar::Other)
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Scalar, A::Error> {
                drain_map(map).map(|()| Scalar::Other)
            }
        }
        d.deserialize_any(V)
    }
}

/// The strings of an array, at most [`MAX_TEXTS`]; anything else is no strings.
struct Texts(Vec<String>);

impl<'de> Deserialize<'de> for Texts {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Texts, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Texts;
            scalars!(Texts, Texts(Vec::new()));
            fn visit_str<E: Error>(self, _: &str) -> Result<Texts, E> {
                Ok(Texts(Vec::new()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Texts, A::Error> {
                let mut kept = Vec::new();
                while kept.len() < MAX_TEXTS {
                    match seq.next_element::<Scalar>()? {
                        Some(s) => kept.extend(s.text()),
                        None => return Ok(Texts(kept)),
                    }
                }
                drain_seq(seq).map(|()| Texts(kept))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Texts, A::Error> {
                drain_map(map).map(|()| Texts(Vec::new()))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for Status {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Status, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Status;
            scalars!(Status, Status::default());
            fn visit_str<E: Error>(self, v: &str) -> Result<Status, E> {
                let value = Some(v.to_string());
                Ok(Status {
                    value,
                    args: Vec::new(),
                })
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Status, A::Error> {
                drain_seq(seq).map(|()| Status::default())
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Status, A::Error> {
                let mut status = Status::default();
                each_field(map, |key, map| {
                    match key {
                        "value" => status.value = map.next_value::<Scalar>()?.text(),
                        "args" => status.args = map.next_value::<Texts>()?.0,
                        _ => return Ok(false),
                    }
                    Ok(true)
                })?;
                Ok(status)
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for Entry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Entry, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Entry;
            scalars!(Entry, Entry::default());
            fn visit_str<E: Error>(self, _: &str) -> Result<Entry, E> {
                Ok(Entry::default())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Entry, A::Error> {
                drain_seq(seq).map(|()| Entry::default())
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Entry, A::Error> {
                let mut entry = Entry::default();
                each_field(map, |key, map| {
                    match key {
                        "id" => entry.id = map.next_value::<Scalar>()?.text(),
                        "aliases" => entry.aliases = map.next_value::<Texts>()?.0,
                        "status" => entry.status = Some(map.next_value::<Status>()?),
                        _ => return Ok(false),
                    }
                    Ok(true)
                })?;
                Ok(entry)
            }
        }
        d.deserialize_any(V)
    }
}

/// `/props`' object (`None` for any other shape).
struct PropsVisitor;

impl<'de> Visitor<'de> for PropsVisitor {
    type Value = Option<Props>;
    scalars!(Option<Props>, None);
    fn visit_str<E: Error>(self, _: &str) -> Result<Option<Props>, E> {
        Ok(None)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Option<Props>, A::Error> {
        drain_seq(seq).map(|()| None)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Option<Props>, A::Error> {
        let mut props = Props::default();
        each_field(map, |key, map| {
            match key {
                "default_generation_settings" => props.n_ctx = map.next_value::<Settings>()?.0,
                "total_slots" => props.total_slots = map.next_value::<Scalar>()?.count(),
                "max_instances" => props.max_instances = map.next_value::<Scalar>()?.count(),
                _ => return Ok(false),
            }
            Ok(true)
        })?;
        Ok(Some(props))
    }
}

/// `default_generation_settings.n_ctx`.
struct Settings(Option<u64>);

impl<'de> Deserialize<'de> for Settings {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Settings, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Settings;
            scalars!(Settings, Settings(None));
            fn visit_str<E: Error>(self, _: &str) -> Result<Settings, E> {
                Ok(Settings(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Settings, A::Error> {
                drain_seq(seq).map(|()| Settings(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Settings, A::Error> {
                let mut n_ctx = None;
                each_field(map, |key, map| {
                    if key == "n_ctx" {
                        n_ctx = map.next_value::<Scalar>()?.count();
                    }
                    Ok(key == "n_ctx")
                })?;
                Ok(Settings(n_ctx))
            }
        }
        d.deserialize_any(V)
    }
}

/// A listing's top: `{"data": [...]}` or a bare array; `false` when neither.
struct ListingVisitor<'f>(&'f mut dyn FnMut(Entry));

impl<'de> Visitor<'de> for ListingVisitor<'_> {
    type Value = bool;
    scalars!(bool, false);
    fn visit_str<E: Error>(self, _: &str) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<bool, A::Error> {
        each_entry(seq, self.0).map(|()| true)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<bool, A::Error> {
        let (mut found, each) = (false, self.0);
        each_field(map, |key, map| {
            let data = key == "data" && !found;
            if data {
                found = map.next_value_seed(Entries(&mut *each))?;
            }
            Ok(data)
        })?;
        Ok(found)
    }
}

/// The `data` array, entry by entry; `false` when it is not an array.
struct Entries<'f>(&'f mut dyn FnMut(Entry));

impl<'de> DeserializeSeed<'de> for Entries<'_> {
    type Value = bool;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(EntriesVisitor(self.0))
    }
}

struct EntriesVisitor<'f>(&'f mut dyn FnMut(Entry));

impl<'de> Visitor<'de> for EntriesVisitor<'_> {
    type Value = bool;
    scalars!(bool, false);
    fn visit_str<E: Error>(self, _: &str) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<bool, A::Error> {
        each_entry(seq, self.0).map(|()| true)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<bool, A::Error> {
        drain_map(map).map(|()| false)
    }
}

fn each_entry<'de, A: SeqAccess<'de>>(
    mut seq: A,
    each: &mut dyn FnMut(Entry),
) -> Result<(), A::Error> {
    while let Some(entry) = seq.next_element::<Entry>()? {
        each(entry);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
