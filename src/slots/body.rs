//! `id_slot` in a request's body: put in as its first member, taken out again.

use std::ops::Range;

/// Whether `body` can be pinned: a JSON object that names no slot itself (the client's own
/// choice stands, and its request counts as unpinned).
pub fn pinnable(body: &[u8]) -> bool {
    let open = body.iter().find(|b| !b.is_ascii_whitespace());
    open == Some(&b'{') && !body.windows(ID.len()).any(|w| w == ID)
}

const ID: &[u8] = b"\"id_slot\"";

/// `body`, which [`pinnable`] accepted, with `"id_slot":at` as its first member, and the range it
/// took; `None` when it does not open an object.
pub fn insert_id(body: &mut Vec<u8>, at: usize) -> Option<Range<usize>> {
    let open = body.iter().position(|b| !b.is_ascii_whitespace())?;
    if body[open] != b'{' {
        return None;
    }
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
