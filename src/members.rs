//! A request body's top-level members, read as llama-server reads them (issue 46). Its parser
//! (nlohmann's) skips a UTF-8 byte order mark, decodes a key's escapes (`"id\u005fslot"` is
//! `id_slot`) and, of a key given twice, keeps the last. A reader that did otherwise would see
//! another body than the host: a byte search missed an escaped `id_slot`, and the host then took
//! the client's slot over crossbar's. So every place that looks a client body's member up by
//! name reads it here — the fingerprint's peek (`fingerprint/body.rs`), the model a forwarded body
//! names (`proxy/model.rs`), the prompt the context guard counts (`proxy/count/prompt.rs`), the
//! slot a pinned body names (`slots/body.rs`) — and sees each member in order, the later of two
//! overriding the earlier. Values nobody takes are skipped unbuilt (`IgnoredAny`: no depth limit,
//! nothing allocated; a key is copied only when it has escapes). Pure: no I/O.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use serde::de::{DeserializeSeed, Deserializer, Error, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

/// The byte order mark llama-server's parser skips at the start of a body.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// What a reader takes of a body's members.
pub(crate) trait Take<'de> {
    /// Called for each member in body order with its decoded key: reads the value from `map` and
    /// says so (`true`), or leaves it to be skipped (`false`). A key may come twice; the later
    /// value is the one the host uses.
    fn member<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<bool, A::Error>;
}

/// Offers each member of `body`, one JSON object, to `take`; `None` when `body` is not one (the
/// host refuses such a body) or `take` failed.
pub(crate) fn read<'de, T: Take<'de>>(body: &'de [u8], take: &mut T) -> Option<()> {
    let mut de = serde_json::Deserializer::from_slice(text(body));
    de.deserialize_map(Object(take)).ok()?;
    de.end().ok()
}

/// `body` as the host's parser starts on it: without a leading UTF-8 byte order mark.
pub(crate) fn text(body: &[u8]) -> &[u8] {
    body.strip_prefix(BOM).unwrap_or(body)
}

/// Where the brace that opens `body` is (after the byte order mark and whitespace); `None` when
/// it opens no object.
pub(crate) fn open(body: &[u8]) -> Option<usize> {
    let skipped = body.len() - text(body).len();
    let at = skipped + text(body).iter().position(|b| !is_space(*b))?;
    (body[at] == b'{').then_some(at)
}

/// JSON's whitespace, the only bytes both parsers skip between tokens.
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// The value of the member `name` (of two, the last) as its JSON text, borrowed from `body`:
/// `Some(None)` when `body` is an object without it, `None` when it is not one object.
pub(crate) fn last<'b>(body: &'b [u8], name: &str) -> Option<Option<&'b RawValue>> {
    struct Last<'b, 'n>(&'n str, Option<&'b RawValue>);
    impl<'b> Take<'b> for Last<'b, '_> {
        fn member<A: MapAccess<'b>>(&mut self, key: &str, map: &mut A) -> Result<bool, A::Error> {
            if key != self.0 {
                return Ok(false);
            }
            self.1 = Some(map.next_value()?);
            Ok(true)
        }
    }
    let mut last = Last(name, None);
    read(body, &mut last)?;
    Some(last.1)
}

/// The value of the first of `names` that `body` has (of a key given twice, the last), as its
/// JSON text: llama-server's reading of a field with aliases (its schema takes the field's own
/// name, then each alias in the order given). `Some(None)` when the body has none of them, `None`
/// when it is not one object.
pub(crate) fn first_named<'b>(body: &'b [u8], names: &[&str]) -> Option<Option<&'b RawValue>> {
    struct Named<'b, 'n, 's>(&'n [&'s str], Vec<Option<&'b RawValue>>);
    impl<'b> Take<'b> for Named<'b, '_, '_> {
        fn member<A: MapAccess<'b>>(&mut self, key: &str, map: &mut A) -> Result<bool, A::Error> {
            let Some(at) = self.0.iter().position(|name| *name == key) else {
                return Ok(false);
            };
            self.1[at] = Some(map.next_value()?);
            Ok(true)
        }
    }
    let mut named = Named(names, vec![None; names.len()]);
    read(body, &mut named)?;
    Some(named.1.into_iter().flatten().next())
}

/// Whether `body`, one JSON object, has a member `name` (whatever its value); `None` when it is
/// not one object.
pub(crate) fn has(body: &[u8], name: &str) -> Option<bool> {
    last(body, name).map(|v| v.is_some())
}

/// Where the value of every member `name` sits in `body`, in body order; `None` when `body` is
/// not one object.
pub(crate) fn spans(body: &[u8], name: &str) -> Option<Vec<Range<usize>>> {
    struct Spans<'b, 'n>(&'b [u8], &'n str, Vec<Range<usize>>);
    impl<'b> Take<'b> for Spans<'b, '_> {
        fn member<A: MapAccess<'b>>(&mut self, key: &str, map: &mut A) -> Result<bool, A::Error> {
            if key != self.1 {
                return Ok(false);
            }
            let raw = map.next_value::<&'b RawValue>()?.get();
            let span = span_in(self.0, raw).ok_or_else(|| A::Error::custom("not in the body"))?;
            self.2.push(span);
            Ok(true)
        }
    }
    let mut spans = Spans(body, name, Vec::new());
    read(body, &mut spans)?;
    Some(spans.2)
}

/// Where `raw`, text the parser borrowed from `body` itself, sits in `body`: its address says
/// so. `None` when it is not there after all.
pub(crate) fn span_in(body: &[u8], raw: &str) -> Option<Range<usize>> {
    let start = (raw.as_ptr() as usize).wrapping_sub(body.as_ptr() as usize);
    let span = start..start.checked_add(raw.len())?;
    (body.get(span.clone()) == Some(raw.as_bytes())).then_some(span)
}

/// The object: each key decoded, its value taken or skipped.
struct Object<'t, T>(&'t mut T);

impl<'de, T: Take<'de>> Visitor<'de> for Object<'_, T> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key_seed(Key)? {
            if !self.0.member(&key, &mut map)? {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

/// A key with its escapes decoded: borrowed from the body when it has none.
struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Cow<'de, str>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_borrowed_str<E: Error>(self, v: &'de str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Borrowed(v))
    }

    fn visit_str<E: Error>(self, v: &str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(v.to_owned()))
    }

    fn visit_string<E: Error>(self, v: String) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(v))
    }
}

#[cfg(test)]
mod tests;
