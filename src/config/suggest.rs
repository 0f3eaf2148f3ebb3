//! "Did you mean": the nearest known key for an unknown one (`pararell` → `parallel`).
//!
//! The known keys come from the raw serde types themselves (the field lists serde generates), so
//! a key added to the config is suggested without a second list to keep in step. Pure.

use serde::de::{self, Deserialize, Deserializer, Visitor};

use super::raw::{RawConfig, RawHost, RawKey, RawModel, RawRoute};

/// The known key nearest to the last segment of an unknown key's dotted path, when one is close
/// enough to be a typo (`nearest`).
pub(super) fn for_key(path: &str) -> Option<&'static str> {
    let parts: Vec<&str> = path.split('.').collect();
    let (last, parents) = parts.split_last()?;
    let known = match parents {
        [] => fields::<RawConfig>(),
        ["hosts", _] => fields::<RawHost>(),
        ["hosts", _, "models", _] => fields::<RawModel>(),
        ["routes", _] => fields::<RawRoute>(),
        ["keys", _] => fields::<RawKey>(),
        _ => return None,
    };
    crate::nearest::nearest(last, known.iter().copied())
}

/// Every key a config may hold, as the README's table writes them: `listen`, `hosts.NAME.url`,
/// `hosts.NAME.models.MODEL.parallel`, `routes.NAME.hosts`... (the tables themselves excluded).
pub fn all_keys() -> Vec<String> {
    let tables = ["hosts", "routes", "models", "keys"];
    let level = |prefix: &str, keys: &[&str]| -> Vec<String> {
        keys.iter()
            .filter(|k| !tables.contains(k))
            .map(|k| format!("{prefix}{k}"))
            .collect()
    };
    [
        level("", fields::<RawConfig>()),
        level("hosts.NAME.", fields::<RawHost>()),
        level("hosts.NAME.models.MODEL.", fields::<RawModel>()),
        level("routes.NAME.", fields::<RawRoute>()),
        level("keys.NAME.", fields::<RawKey>()),
    ]
    .concat()
}

/// The field names serde knows for `T` (a struct deriving `Deserialize`).
fn fields<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    let mut grab = FieldGrab(None);
    let _ = T::deserialize(&mut grab);
    grab.0.unwrap_or(&[])
}

/// A deserializer that only records the field list a struct asks for, then fails.
struct FieldGrab(Option<&'static [&'static str]>);

impl<'de> Deserializer<'de> for &mut FieldGrab {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("only the field list is wanted"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0 = Some(fields);
        Err(de::Error::custom("only the field list is wanted"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_get_the_nearest_key_at_their_level() {
        for (path, want) in [
            ("hosts.titan.models.qwen.pararell", Some("parallel")),
            ("hosts.titan.wieght", Some("weight")),
            ("routes.projA.host", Some("hosts")),
            ("lease_idel", Some("lease_idle")),
            ("admin_listn", Some("admin_listen")),
            ("colour", None),
            ("hosts.titan.models.qwen.slots", None),
            ("a.b.c", None),
        ] {
            assert_eq!(for_key(path), want, "{path}");
        }
    }

    #[test]
    fn field_lists_come_from_serde() {
        assert!(fields::<RawModel>().contains(&"parallel"));
        assert!(fields::<RawConfig>().contains(&"queue_timeout"));
    }
}
