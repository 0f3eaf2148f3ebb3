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
