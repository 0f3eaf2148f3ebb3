//! The mirror as the status shows it: per slot of a pinning host, what crossbar believes it holds.

use super::Slots;

/// A pinning host+model's slots, by id.
#[derive(Debug, Clone, PartialEq)]
pub struct Mirror {
    pub slots: Vec<Shown>,
    /// Requests crossbar could not pin running there (while any is, nothing is pinned).
    pub unpinned: usize,
}

/// One slot.
#[derive(Debug, Clone, PartialEq)]
pub struct Shown {
    /// `busy` (a pinned request runs there), `doubt` (a request ended early: not pinned until a
    /// `/slots` poll started later shows it idle) or `free`.
    pub state: &'static str,
    /// The prompt family it last served.
    pub family: Option<u32>,
    /// Tokens it holds: its last prompt and answer as the host counted them (an estimate while
    /// the request runs).
    pub tokens: u64,
    /// Copied to the host's RAM cache since it last served.
    pub saved: bool,
}

impl Slots {
    /// `host`+`model`'s mirror; `None` when crossbar pins nothing there.
    pub fn mirror(&self, host: &str, model: &str) -> Option<Mirror> {
        let key = (host.to_string(), model.to_string());
        let table = self.shared.lock();
        let pair = table.pairs.get(&key)?;
        let slots = (pair.slots.iter())
            .map(|s| Shown {
                state: match (s.busy, s.doubtful_since.is_some()) {
                    (true, _) => "busy",
                    (false, true) => "doubt",
                    (false, false) => "free",
                },
                family: s.family,
                tokens: s.tokens,
                saved: s.saved,
            })
            .collect();
        Some(Mirror {
            slots,
            unpinned: pair.unpinned,
        })
    }
}

impl Mirror {
    /// One line: how many slots are busy, free and in doubt, and the unpinned requests.
    pub fn summary(&self) -> String {
        let count = |state: &str| self.slots.iter().filter(|s| s.state == state).count();
        let mut out = format!(
            "pinned: {} busy, {} free, {} in doubt",
            count("busy"),
            count("free"),
            count("doubt")
        );
        if self.unpinned > 0 {
            out.push_str(&format!("; {} unpinned running", self.unpinned));
        }
        out
    }
}
