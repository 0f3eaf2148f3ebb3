//! Which free slot a request gets: the choice alone, a pure function over the mirror.

use super::{Slot, Want};

/// The slot for `want` among `slots`, `None` when none is surely free; `family_tokens` is the
/// size of its family prefix in the host's tokens. Its own slot if free; else the free slot whose
/// use loses nothing unsaved and reuses the most, the least recently used of a kind:
/// - a returning conversation: an unrelated slot (llama-server saves it and reloads the
///   conversation's own state from RAM), then a sibling's with less than half of it shared (the
///   same, by a guessed size), then a sibling's already in RAM, then any;
/// - a first turn: a sibling's that is in RAM or saved anyway (its prefix is there), then an
///   unrelated one (its occupant saved, the prefix perhaps in RAM), then any.
pub(crate) fn choose(slots: &[Slot], want: &Want, family_tokens: u64) -> Option<usize> {
    let free = || (slots.iter().enumerate()).filter(|(_, s)| s.free());
    if let Some((at, _)) = free().find(|(_, s)| s.holder == Some(want.conversation)) {
        return Some(at);
    }
    let rank = |s: &Slot| -> u8 {
        match (
            want.first_turn,
            sibling(s, want),
            kept_whole(s, want, family_tokens),
            s.saved,
        ) {
            (_, true, true, false) => 3,
            (true, true, _, _) => 0,
            (true, false, _, _) => 1,
            (false, false, _, _) => 0,
            (false, true, false, _) => 1,
            (false, true, true, true) => 2,
        }
    };
    free()
        .min_by_key(|(_, s)| (rank(s), s.last_used))
        .map(|(at, _)| at)
}

/// Whether `s` last served a sibling of `want` (its family, when it has one).
fn sibling(s: &Slot, want: &Want) -> bool {
    want.family.is_some() && s.family == want.family
}

/// Whether `want`, pinned to `s`, keeps more than half of what `s` holds: a sibling's slot
/// holding less than twice the family prefix (`family_tokens`). llama-server then saves nothing
/// and reloads nothing: the request prefills whatever follows the prefix.
pub(crate) fn kept_whole(s: &Slot, want: &Want, family_tokens: u64) -> bool {
    sibling(s, want) && s.tokens < family_tokens.saturating_mul(2)
}

/// [`choose`] for a host with similarity off, where a slot asked for by id is neither saved nor
/// reloaded: a returning conversation gets its own slot, never anyone else's (left to the host,
/// it gets the least recently used slot, whose occupant is saved, and its own state from RAM),
/// and not one an unpinned request may have taken since (`foreign`); a first turn gets a
/// sibling's slot whose state is already in RAM (the family's prefix is kept in place), else a
/// slot holding nothing crossbar knows of or whose state is in RAM, else one an unpinned request
/// may have taken (what that request left is lost, once: the way pinning comes back after
/// requests it could not pin), the least recently used of a kind.
pub(crate) fn choose_own(slots: &[Slot], want: &Want) -> Option<usize> {
    let free = || (slots.iter().enumerate()).filter(|(_, s)| s.free());
    if !want.first_turn {
        return free()
            .find(|(_, s)| !s.foreign && s.holder == Some(want.conversation))
            .map(|(at, _)| at);
    }
    let rank = |s: &Slot| match (s.foreign, s.holder.is_none(), s.saved) {
        // The family's prefix is there to keep, and the sibling's state is in RAM.
        (false, false, true) if sibling(s, want) => 0,
        (false, true, _) => 1,
        (false, false, true) => 1,
        (true, _, _) => 2,
        (false, false, false) => 3,
    };
    free()
        .filter(|(_, s)| rank(s) < 3)
        .min_by_key(|(_, s)| (rank(s), s.last_used))
        .map(|(at, _)| at)
}
