//! A `usage` object read in the answer's one pass (`lenient`, issue 26): its members kept with
//! their counts, so each API asks for its own names. Every answer carries one (a stream,
//! several); building it as a `Value` cost a map node and a key string per member.

use serde::de::MapAccess;

use super::lenient::{members, Count, Lenient, Shape};

/// One `usage` object's members, in order, borrowed from the payload: at most
/// [`super::lenient::MEMBERS`], a key with escapes skipped (no API names its counts that way).
/// The last of two equal keys wins, as in a `Value`.
#[derive(Debug, Default)]
pub struct UsageFields<'a>(Vec<(&'a str, Member<'a>)>);

/// A member's value as the counts read it: a count (unknown for a value of any other shape), or
/// an object one level down (`prompt_tokens_details`) whose members are read as counts.
#[derive(Debug)]
enum Member<'a> {
    Count(Count),
    Object(Vec<(&'a str, Count)>),
}

impl Default for Member<'_> {
    fn default() -> Self {
        Member::Count(Count(None))
    }
}

impl<'a> UsageFields<'a> {
    /// The members of `json` when it is an object; `None` otherwise (`null` included).
    pub fn parse(json: &'a str) -> Option<UsageFields<'a>> {
        serde_json::from_str::<Lenient<Option<UsageFields<'a>>>>(json)
            .ok()?
            .0
    }

    fn get(&self, key: &str) -> Option<&Member<'a>> {
        self.0.iter().rev().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    /// The member `key` as a token count: a non-negative integer, anything else unknown.
    pub(super) fn count(&self, key: &str) -> Option<i64> {
        match self.get(key)? {
            Member::Count(n) => n.0,
            Member::Object(_) => None,
        }
    }

    /// The count `key` inside the object member `outer` (`prompt_tokens_details.cached_tokens`).
    pub(super) fn nested_count(&self, outer: &str, key: &str) -> Option<i64> {
        let Member::Object(inner) = self.get(outer)? else {
            return None;
        };
        inner.iter().rev().find(|(k, _)| *k == key)?.1 .0
    }
}

impl<'de> Shape<'de> for Option<UsageFields<'de>> {
    fn from_map<A: MapAccess<'de>>(map: A) -> Result<Self, A::Error> {
        Ok(Some(UsageFields(members(map)?)))
    }
}

impl<'de> Shape<'de> for Member<'de> {
    fn from_u64(n: u64) -> Self {
        Member::Count(Count::from_u64(n))
    }
    fn from_i64(n: i64) -> Self {
        Member::Count(Count::from_i64(n))
    }
    fn from_map<A: MapAccess<'de>>(map: A) -> Result<Self, A::Error> {
        Ok(Member::Object(members(map)?))
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
