//! The `prompt` of a completion-style body, read for counting without building the body: only
//! `prompt` is kept, as the borrowed bytes of its JSON (every other field is skipped, not built),
//! and a prompt of token ids is counted element by element, never held as a list. A body is up
//! to 16 MiB from a stranger; a `serde_json::Value` of it costs ~16 times that (issue 11).
//! Must not do I/O.

use std::fmt;

use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

/// What a completion-style body asks to have counted.
#[derive(Debug)]
pub(super) enum Prompt<'a> {
    /// A JSON string, as its raw text (quotes and escapes as sent): it goes to `/tokenize` as is.
    Text(&'a RawValue),
    /// A flat array of token ids: already tokens, its length is the count.
    Tokens(u64),
}

/// The body's `prompt`; `None` for a body that is not a JSON object, has no `prompt`, or one
/// that is neither a string nor an array of token ids (llama-server's other prompt shapes —
/// several prompts, mixed pieces — are left to the estimate).
pub(super) fn read(body: &[u8]) -> Option<Prompt<'_>> {
    // As the host reads it: of two `prompt`s the last, an escaped key too (`members`).
    let prompt = crate::members::last(body, "prompt")??;
    match prompt.get().as_bytes().first()? {
        b'"' => Some(Prompt::Text(prompt)),
        b'[' => serde_json::from_str::<TokenCount>(prompt.get())
            .ok()
            .map(|count| Prompt::Tokens(count.0)),
        _ => None,
    }
}

/// The number of elements of a JSON array of u64s; any other element is an error.
struct TokenCount(u64);

impl<'de> Deserialize<'de> for TokenCount {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<TokenCount, D::Error> {
        struct Count;
        impl<'de> Visitor<'de> for Count {
            type Value = TokenCount;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array of token ids")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<TokenCount, A::Error> {
                let mut n = 0u64;
                while seq.next_element::<u64>()?.is_some() {
                    n += 1;
                }
                Ok(TokenCount(n))
            }
        }
        deserializer.deserialize_seq(Count)
    }
}

#[cfg(test)]
mod tests {
    use super::super::exact;
    use super::*;
    use std::time::{Duration, Instant};

    /// Counts `body` as a `/completion` call to a host that is never asked (token ids need no
    /// host): a listener that accepts nothing.
    #[track_caller]
    fn counted_without_a_host(body: &[u8]) -> Option<u64> {
        let (_listener, host) = super::super::tests::silent_host("quiet");
        let side = crate::upstream::Side::new(ureq::Agent::new_with_defaults());
        let deadline = Instant::now() + Duration::from_millis(50);
        exact(&side, &host, "/completion", body, None, deadline)
    }

    /// Issue 11 (review): `CountCall::Prompt` parsed the whole body into a `Value`. Beside the
    /// ~16× memory, that refused bodies `Value` cannot hold: past serde_json's depth limit (128)
    /// in a field crossbar never reads, the prompt went uncounted.
    #[test]
    fn a_token_prompt_is_counted_whatever_the_other_fields_hold_issue_11() {
        let deep = format!("{}{}", "[".repeat(300), "]".repeat(300));
        let body = format!(r#"{{"n_predict":8,"junk":{deep},"prompt":[1, 2 ,3],"x":{{}}}}"#);
        assert_eq!(counted_without_a_host(body.as_bytes()), Some(3));
        let many = vec!["0"; 1 << 20].join(",");
        let body = format!(r#"{{"prompt":[{many}]}}"#);
        assert_eq!(counted_without_a_host(body.as_bytes()), Some(1 << 20));
        assert_eq!(counted_without_a_host(br#"{"prompt":[]}"#), Some(0));
    }

    #[test]
    fn a_text_prompt_is_the_bodys_own_bytes_and_other_shapes_are_not_counted() {
        let body = br#"{"model":"m","prompt" : "caf\u00e9 \"x\"","stream":true}"#;
        let Some(Prompt::Text(raw)) = read(body) else {
            panic!("{:?}", read(body))
        };
        assert_eq!(raw.get(), r#""caf\u00e9 \"x\"""#);
        let within = body.as_ptr_range();
        assert!(within.contains(&raw.get().as_ptr()), "borrowed, not copied");
        // Issue 46: as the host reads it, the last of two and an escaped key too.
        let twice = br#"{"prompt":"a b","x":1,"pr\u006fmpt":[1,2,3]}"#;
        assert!(
            matches!(read(twice), Some(Prompt::Tokens(3))),
            "{:?}",
            read(twice)
        );
        let bom = b"\xEF\xBB\xBF{\"prompt\":[4]}";
        assert!(matches!(read(bom), Some(Prompt::Tokens(1))));
        for uncounted in [
            &br#"{"prompt":[[1,2],[3]]}"#[..],
            br#"{"prompt":[1,"two"]}"#,
            br#"{"prompt":[-1]}"#,
            br#"{"prompt":7}"#,
            br#"{"prompt":null}"#,
            br#"{"messages":[]}"#,
            br#"[1,2]"#,
            b"not json",
        ] {
            assert!(
                read(uncounted).is_none(),
                "{}",
                String::from_utf8_lossy(uncounted)
            );
        }
    }
}
