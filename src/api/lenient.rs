//! Answers' JSON read in one pass and leniently: each value is read as the shape it should have
//! (a token count, an object of known keys), and a value of any other shape reads as absent
//! instead of failing the payload. An upstream's odd field costs that field, never the answer's
//! other counts. Nothing is built but what is read: other values are skipped by the parser.
//!
//! Before (issue 26), each object that mattered was borrowed raw and parsed again, and each count
//! parsed a third time from its text: a quarter of an answer's parse.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// Most members of one object kept by [`members`]; the rest are skipped (real `usage` objects
/// have four to eight).
pub const MEMBERS: usize = 32;

/// What a value of each JSON kind reads as; every kind a shape does not take reads as
/// `Self::default()`, its absence.
pub trait Shape<'de>: Default {
    fn from_u64(_: u64) -> Self {
        Self::default()
    }
    fn from_i64(_: i64) -> Self {
        Self::default()
    }
    fn from_f64(_: f64) -> Self {
        Self::default()
    }
    fn from_bool(_: bool) -> Self {
        Self::default()
    }
    /// An object. The default skips its members.
    fn from_map<A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Self::default())
    }
}

/// A value read as the shape `T`. It fails only where the JSON itself is broken.
#[derive(Debug, Default)]
pub struct Lenient<T>(pub T);

impl<'de, T: Shape<'de>> Deserialize<'de> for Lenient<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ShapeVisitor(PhantomData)).map(Lenient)
    }
}

struct ShapeVisitor<T>(PhantomData<T>);

impl<'de, T: Shape<'de>> Visitor<'de> for ShapeVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, b: bool) -> Result<T, E> {
        Ok(T::from_bool(b))
    }

    fn visit_i64<E>(self, n: i64) -> Result<T, E> {
        Ok(T::from_i64(n))
    }

    fn visit_u64<E>(self, n: u64) -> Result<T, E> {
        Ok(T::from_u64(n))
    }

    fn visit_f64<E>(self, x: f64) -> Result<T, E> {
        Ok(T::from_f64(x))
    }

    fn visit_str<E>(self, _: &str) -> Result<T, E> {
        Ok(T::default())
    }

    fn visit_unit<E>(self) -> Result<T, E> {
        Ok(T::default())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<T, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(T::default())
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::from_map(map)
    }
}

/// A token count: a non-negative integer that fits an `i64`; anything else is unknown.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Count(pub Option<i64>);

impl Shape<'_> for Count {
    fn from_u64(n: u64) -> Count {
        Count(i64::try_from(n).ok())
    }
    fn from_i64(n: i64) -> Count {
        Count((n >= 0).then_some(n))
    }
}

/// Any JSON number, as an `f64` (`timings`' milliseconds).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Number(pub Option<f64>);

impl Shape<'_> for Number {
    fn from_u64(n: u64) -> Number {
        Number(Some(n as f64))
    }
    fn from_i64(n: i64) -> Number {
        Number(Some(n as f64))
    }
    fn from_f64(x: f64) -> Number {
        Number(Some(x))
    }
}

impl Shape<'_> for bool {
    fn from_bool(b: bool) -> bool {
        b
    }
}

/// Walks an object's members: `read` is given each key and the map, and reads the value of a key
/// it knows (returning `true`); every other value is skipped unbuilt. A key written with escapes
/// is skipped too: no API names a field that way. Of two equal keys a reader sees both, in order.
pub fn each_member<'de, A: MapAccess<'de>>(
    mut map: A,
    mut read: impl FnMut(&'de str, &mut A) -> Result<bool, A::Error>,
) -> Result<(), A::Error> {
    while let Some(Key(key)) = map.next_key()? {
        let taken = match key {
            Some(key) => read(key, &mut map)?,
            None => false,
        };
        if !taken {
            map.next_value::<IgnoredAny>()?;
        }
    }
    Ok(())
}

/// An object's members, at most [`MEMBERS`], each read as `T`, in order, their keys borrowed from
/// the payload.
pub fn members<'de, A: MapAccess<'de>, T: Shape<'de>>(
    map: A,
) -> Result<Vec<(&'de str, T)>, A::Error> {
    let mut members = Vec::with_capacity(8);
    each_member(map, |key, map| {
        if members.len() == MEMBERS {
            return Ok(false);
        }
        members.push((key, map.next_value::<Lenient<T>>()?.0));
        Ok(true)
    })?;
    Ok(members)
}

/// An object's key borrowed from the payload, `None` when it had escapes (serde's `Cow` always
/// copies, so it cannot tell).
#[derive(Debug)]
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

    fn read<'a, T: Shape<'a>>(json: &'a str) -> Result<T, serde_json::Error> {
        serde_json::from_str::<Lenient<T>>(json).map(|l| l.0)
    }

    #[test]
    fn a_value_of_another_shape_reads_as_absent_and_only_broken_json_fails() {
        let counts = [("7", Some(7)), ("0", Some(0)), ("-1", None)];
        for (json, want) in counts {
            assert_eq!(read::<Count>(json).unwrap(), Count(want), "{json}");
        }
        let others = [
            "7.0",
            "-0",
            "1e3",
            "18446744073709551615",
            "\"7\"",
            "false",
            "null",
        ];
        for json in others.into_iter().chain(["[7]", "{\"n\": 7}", "[[[{}]]]"]) {
            assert_eq!(read::<Count>(json).unwrap(), Count(None), "{json}");
            assert!(!read::<bool>(json).unwrap(), "{json}");
        }
        assert!(read::<bool>("true").unwrap());
        assert_eq!(read::<Count>("true").unwrap(), Count(None));
        assert_eq!(read::<Number>("12").unwrap(), Number(Some(12.0)));
        assert_eq!(read::<Number>("-2.5").unwrap(), Number(Some(-2.5)));
        assert_eq!(read::<Number>("\"12\"").unwrap(), Number(None));
        for broken in ["", "{", "[1,", "7 7", "{\"a\" 1}", "nul"] {
            assert!(read::<Count>(broken).is_err(), "{broken:?}");
        }
    }

    #[test]
    fn members_keep_their_order_skip_escaped_keys_and_stop_at_the_cap() {
        #[derive(Default)]
        struct Obj<'a>(Vec<(&'a str, Count)>);
        impl<'de> Shape<'de> for Obj<'de> {
            fn from_map<A: MapAccess<'de>>(map: A) -> Result<Self, A::Error> {
                members(map).map(Obj)
            }
        }
        let obj = read::<Obj>(r#"{"b": 2, "a\u0041": 3, "a": "x", "b": 4}"#).unwrap();
        assert_eq!(
            obj.0,
            [
                ("b", Count(Some(2))),
                ("a", Count(None)),
                ("b", Count(Some(4)))
            ]
        );
        let many: Vec<String> = (0..100).map(|i| format!("\"k{i}\": {i}")).collect();
        let many = format!("{{{}}}", many.join(","));
        let obj = read::<Obj>(&many).unwrap();
        assert_eq!(obj.0.len(), MEMBERS);
        assert_eq!(obj.0.last(), Some(&("k31", Count(Some(31)))));
    }
}
