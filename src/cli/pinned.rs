//! `crossbar status`'s table of pinned slots: what crossbar believes each slot of a host with
//! an exclusive host holds, so an operator can see pinning at work (or why it is not).

use serde_json::Value;

use crate::table::{header, kilo, table, text};

/// The table, or `None` when no host pins.
pub fn slots_table(status: &Value) -> Option<String> {
    let mut rows = vec![header(&[
        "HOST", "MODEL", "SLOT", "STATE", "FAMILY", "TOKENS", "IN RAM",
    ])];
    let mut unpinned = Vec::new();
    for h in status["hosts"].as_array().into_iter().flatten() {
        for m in h["models"].as_array().into_iter().flatten() {
            let pinned = &m["pinned_slots"];
            let slots = pinned["slots"].as_array().into_iter().flatten();
            for s in slots {
                let in_ram = if s["saved"].as_bool() == Some(true) {
                    "yes"
                } else {
                    "no"
                };
                rows.push(vec![
                    text(&h["name"]),
                    text(&m["model"]),
                    text(&s["id"]),
                    text(&s["state"]),
                    text(&s["family"]),
                    kilo(s["tokens"].as_u64().unwrap_or(0)),
                    in_ram.to_string(),
                ]);
            }
            if let Some(n) = pinned["unpinned"].as_u64().filter(|&n| n > 0) {
                unpinned.push(format!(
                    "{} {}: {n} request(s) crossbar could not pin running (nothing pinned until they end)",
                    text(&h["name"]),
                    text(&m["model"])
                ));
            }
        }
    }
    if rows.len() == 1 {
        return None;
    }
    let mut out = table(&rows);
    for line in unpinned {
        out.push_str(&line);
        out.push('\n');
    }
    Some(out)
}
