//! A prompt family's pieces written straight out as the JSON their normalised `Value`s would be,
//! without building those `Value`s (issue 26: the family cost a map, a string copy and a text
//! block per leading message on every request).
//!
//! Byte for byte what `normalise_content`/`normalise_block` then `to_string` give: keys in the
//! order a `Value`'s sorted map writes them, `cache_control` left out, every text block spelled
//! `{"text":…,"type":"text"}`. Family ids are kept in rows and rebuilt at start, so a byte of
//! difference would orphan them; a test compares both ways over many shapes.

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::Value;

/// The compact JSON of `v`, as [`super::Conversation`] writes a part (the tests' comparison).
#[cfg(test)]
fn json(v: &impl Serialize) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_default()
}

/// A leading chat message as its family sees it: `{"content": <normalised>, "role": …}`.
pub(super) struct Message<'a>(pub &'a Value);

/// Content normalised: a string is one text block, an array's blocks are each normalised.
pub(super) struct Content<'a>(pub &'a Value);

/// One block normalised: text-like blocks as a plain text block, others without
/// `cache_control`.
pub(super) struct Block<'a>(pub &'a Value);

/// Tool definitions: each normalised like a block.
pub(super) struct Blocks<'a>(pub &'a [Value]);

struct TextBlock<'a>(&'a str);

impl Serialize for Message<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(2))?;
        match self.0.get("content") {
            Some(content) => map.serialize_entry("content", &Content(content))?,
            None => map.serialize_entry("content", &Value::Null)?,
        }
        map.serialize_entry("role", self.0.get("role").unwrap_or(&Value::Null))?;
        map.end()
    }
}

impl Serialize for Content<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::String(text) => s.collect_seq([TextBlock(text)]),
            Value::Array(blocks) => s.collect_seq(blocks.iter().map(Block)),
            other => other.serialize(s),
        }
    }
}

impl Serialize for Block<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let Value::Object(fields) = self.0 else {
            return self.0.serialize(s);
        };
        let kind = fields.get("type").and_then(Value::as_str);
        if let (Some("text" | "input_text" | "output_text"), Some(Value::String(text))) =
            (kind, fields.get("text"))
        {
            return TextBlock(text).serialize(s);
        }
        let kept = fields.iter().filter(|(k, _)| *k != "cache_control");
        let mut map = s.serialize_map(None)?;
        for (k, v) in kept {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl Serialize for Blocks<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(Block))
    }
}

impl Serialize for TextBlock<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(2))?;
        map.serialize_entry("text", self.0)?;
        map.serialize_entry("type", "text")?;
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::api::{normalise_block, normalise_content};

    /// Shapes a preamble takes, odd ones included: every view must write exactly what the
    /// normalised `Value` writes.
    fn shapes() -> Vec<Value> {
        vec![
            json!("You are a coding agent. \"Quotes\", \\ and \u{1F600} and \n newlines."),
            json!([{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}]),
            json!([{"type": "input_text", "text": "b"}, {"type": "output_text", "text": "c"}]),
            json!([{"type": "image", "source": {"z": 1, "a": [1.5, -2, 1e300]}, "cache_control": 1}]),
            json!([{"type": "text", "text": 7}, "bare", 3, null, [1, [2]]]),
            json!({"zeta": 1, "alpha": {"cache_control": "kept inside"}, "cache_control": "top"}),
            json!(null),
            json!(42),
            json!([]),
            json!({}),
        ]
    }

    #[test]
    fn each_view_writes_what_the_normalised_value_writes() {
        for shape in shapes() {
            let want = normalise_content(&shape).to_string().into_bytes();
            assert_eq!(json(&Content(&shape)), want, "content {shape}");
            let want = normalise_block(&shape).to_string().into_bytes();
            assert_eq!(json(&Block(&shape)), want, "block {shape}");
            for role in [json!("system"), json!("developer"), json!(null)] {
                let message = json!({"role": role, "content": shape, "name": "x"});
                let want = json!({
                    "role": message.get("role").cloned().unwrap_or(Value::Null),
                    "content": normalise_content(&shape),
                });
                assert_eq!(json(&Message(&message)), want.to_string().into_bytes());
            }
        }
        let no_content = json!({"role": "system"});
        let want = json!({"role": "system", "content": null}).to_string();
        assert_eq!(json(&Message(&no_content)), want.into_bytes());
        let tools = shapes();
        let want = Value::Array(tools.iter().map(normalise_block).collect()).to_string();
        assert_eq!(json(&Blocks(&tools)), want.into_bytes());
    }
}
