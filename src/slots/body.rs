//! `id_slot` in a request's body: put in as its first member, taken out again. The body is read
//! as the host reads it (`crate::members`): a byte order mark skipped, keys decoded.

use std::ops::Range;

/// Whether `body` can be pinned: one JSON object, as the host reads it, that names no slot
/// itself (the proxy refuses a client's `id_slot` before this; a body naming one is never
/// pinned, should one get here).
pub fn pinnable(body: &[u8]) -> bool {
    crate::members::has(body, "id_slot") == Some(false)
}

/// `body`, which [`pinnable`] accepted, with `"id_slot":at` as its first member, and the range it
/// took; `None` when it does not open an object.
pub fn insert_id(body: &mut Vec<u8>, at: usize) -> Option<Range<usize>> {
    let open = crate::members::open(body)?;
    let rest = &body[open + 1..];
    let empty = rest.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'}');
    let member = format!("\"id_slot\":{at}{}", if empty { "" } else { "," });
    let range = open + 1..open + 1 + member.len();
    body.splice(range.start..range.start, member.into_bytes());
    Some(range)
}

/// `body` without what [`insert_id`] put in at `range`.
pub fn remove_id(body: &mut Vec<u8>, range: Range<usize>) {
    if range.end <= body.len() {
        body.drain(range);
    }
}
