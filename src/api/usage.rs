//! A `usage` object read without building it (issue 26): its members borrowed unparsed, each
//! count parsed alone when an API asks for it. Every answer carries one (a stream, several), and
//! building it as a `Value` cost a map node and a key string per member.

use std::fmt;

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

/// Most members kept; the rest of a bigger object is skipped (real ones have four to eight).
const MEMBERS: usize = 32;

/// One `usage` object's members, in order, borrowed from the payload. A member whose key has
/// escapes is skipped (no API names its counts that way); the last of two equal keys wins, as in
/// a `Value`.
#[derive(Debug, Default)]
pub struct UsageFields<'a>(Vec<(&'a str, &'a RawValue)>);

impl<'a> UsageFields<'a> {
    /// The members of `json` when it is an object; `None` otherwise (`null` included).
    pub fn parse(json: &'a str) -> Option<UsageFields<'a>> {
        serde_json::from_str(json).ok()
    }

    fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| *v)
    }

    /// The member `key` as a token count: a non-negative integer, anything else unknown.
    pub(super) fn count(&self, key: &str) -> Option<i64> {
        let n: i64 = serde_json::from_str(self.get(key)?.get()).ok()?;
        (n >= 0).then_some(n)
    }

    /// The count `key` inside the object member `outer` (`prompt_tokens_details.cached_tokens`).
    pub(super) fn nested_count(&self, outer: &str, key: &str) -> Option<i64> {
        UsageFields::parse(self.get(outer)?.get())?.count(key)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for UsageFields<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(Members)
    }
}

struct Members;

impl<'de> Visitor<'de> for Members {
    type Value = UsageFields<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a usage object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut members = Vec::with_capacity(8);
        while let Some(key) = map.next_key::<Key<'de>>()? {
            match key {
                Key(Some(key)) if members.len() < MEMBERS => {
                    members.push((key, map.next_value::<&'de RawValue>()?));
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(UsageFields(members))
    }
}

/// A member's key borrowed from the payload, `None` when it had escapes (serde's `Cow` always
/// copies, so it cannot tell).
struct Key<'a>(Option<&'a str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = Key<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_borrowed_str<E>(self, key: &'de str) -> Result<Key<'de>, E> {
        Ok(Key(Some(key)))
    }

    fn visit_str<E>(self, _: &str) -> Result<Key<'de>, E> {
        Ok(Key(None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_non_negative_integers_and_anything_else_is_unknown() {
        let text = r#"{"a": 5, "b": -1, "c": 5.0, "d": "5", "e": null, "f": 18446744073709551615,
                       "a\u0041": 7, "g": {"h": 3, "i": [1]}, "j": 1, "j": 2}"#;
        let u = UsageFields::parse(text).unwrap();
        assert_eq!(u.count("a"), Some(5));
        for unknown in ["b", "c", "d", "e", "f", "aA", "g", "missing"] {
            assert_eq!(u.count(unknown), None, "{unknown}");
        }
        assert_eq!(u.count("j"), Some(2), "the last of two wins");
        assert_eq!(u.nested_count("g", "h"), Some(3));
        assert_eq!(u.nested_count("g", "i"), None);
        assert_eq!(u.nested_count("a", "h"), None, "not an object");
        for not_object in ["null", "[1, 2]", "7", "\"usage\"", "{", ""] {
            assert!(UsageFields::parse(not_object).is_none(), "{not_object}");
        }
        let many: String = (0..100)
            .map(|i| format!("\"k{i}\": {i}"))
            .collect::<Vec<_>>()
            .join(",");
        let many = format!("{{{many}}}");
        let u = UsageFields::parse(&many).unwrap();
        assert_eq!(
            (u.count("k31"), u.count("k32")),
            (Some(31), None),
            "at most 32 kept"
        );
    }
}
