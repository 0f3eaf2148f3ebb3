//! Reading llama-server's `/slots` answer — an array of slot objects, `id` and `is_processing`
//! among their fields — for the slots it shows idle and at work. The host is hostile until checked: each
//! entry is read alone (the rest of it skipped unbuilt), and at most `MAX_SLOTS` ids are kept;
//! the answer itself is bounded by the health poller's read limit.

use std::fmt;

use serde::de::{Deserializer as _, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::MAX_SLOTS;

/// What a `/slots` answer shows, by slot id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Polled {
    pub idle: Vec<usize>,
    /// At work (`is_processing`): a task was launched there.
    pub busy: Vec<usize>,
    /// The largest `id_task` any slot shows (its running or last task): llama-server numbers its
    /// tasks from 0 at start, so a smaller one later means it restarted (issue 47).
    pub max_task: Option<u64>,
}

/// The slots a `/slots` answer shows idle and at work; `None` when it is not a JSON array.
/// Entries that do not say both fields are skipped.
pub fn parse_slots(body: &str) -> Option<Polled> {
    let mut de = serde_json::Deserializer::from_str(body);
    de.deserialize_seq(SlotList).ok()
}

#[derive(Deserialize)]
struct Entry {
    id: Option<u64>,
    is_processing: Option<bool>,
    id_task: Option<u64>,
}

struct SlotList;

impl<'de> Visitor<'de> for SlotList {
    type Value = Polled;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of slots")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Polled, A::Error> {
        let mut seen = Polled::default();
        while let Some(raw) = seq.next_element::<&RawValue>()? {
            // An entry of another shape is skipped, not a reason to drop the answer.
            let Ok(entry) = serde_json::from_str::<Entry>(raw.get()) else {
                continue;
            };
            let (Some(id), Some(processing)) = (entry.id, entry.is_processing) else {
                continue;
            };
            if let Some(task) = entry.id_task {
                seen.max_task = Some(seen.max_task.map_or(task, |m| m.max(task)));
            }
            let list = if processing {
                &mut seen.busy
            } else {
                &mut seen.idle
            };
            match usize::try_from(id) {
                Ok(id) if id < MAX_SLOTS && list.len() < MAX_SLOTS => list.push(id),
                _ => {}
            }
        }
        Ok(seen)
    }
}
