//! Reading llama-server's `/slots` answer — an array of slot objects, `id` and `is_processing`
//! among their fields — for the slots it shows idle. The host is hostile until checked: each
//! entry is read alone (the rest of it skipped unbuilt), and at most `MAX_SLOTS` ids are kept;
//! the answer itself is bounded by the health poller's read limit.

use std::fmt;

use serde::de::{Deserializer as _, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::MAX_SLOTS;

/// The ids of the slots a `/slots` answer shows idle; `None` when it is not a JSON array.
/// Entries that do not say both fields are skipped.
pub fn parse_slots(body: &str) -> Option<Vec<usize>> {
    let mut de = serde_json::Deserializer::from_str(body);
    de.deserialize_seq(Idle).ok()
}

#[derive(Deserialize)]
struct Entry {
    id: Option<u64>,
    is_processing: Option<bool>,
}

struct Idle;

impl<'de> Visitor<'de> for Idle {
    type Value = Vec<usize>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of slots")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<usize>, A::Error> {
        let mut idle = Vec::new();
        while let Some(raw) = seq.next_element::<&RawValue>()? {
            // An entry of another shape is skipped, not a reason to drop the answer.
            let Ok(entry) = serde_json::from_str::<Entry>(raw.get()) else {
                continue;
            };
            if let (Some(id), Some(false)) = (entry.id, entry.is_processing) {
                match usize::try_from(id) {
                    Ok(id) if id < MAX_SLOTS && idle.len() < MAX_SLOTS => idle.push(id),
                    _ => {}
                }
            }
        }
        Ok(idle)
    }
}
