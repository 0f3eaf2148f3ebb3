//! The lease verdicts: a conversation may change host only for a logged reason (a lease event
//! other than `new`), and a conversation no fault touched reuses its lease on every later turn.
//! From the db's rows and events and the ledger's `X-Crossbar-Host` / `X-Crossbar-Lease` headers.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::checks::{Event, Row};
use crate::ledger::{Corr, Outcome, Run, Sent};

/// Conversations that changed host without a lease event explaining it, and conversations no
/// fault touched whose later turns were not reused leases on the first turn's host.
pub fn moves(ledger: &[Sent], rows: &[Row], events: &[Event], run: &Run) -> (u64, Vec<String>) {
    let mut explained: HashMap<(&str, &str), Vec<(i64, &str)>> = HashMap::new();
    for e in events {
        explained
            .entry((&e.route, &e.fp))
            .or_default()
            .push((e.at, &e.reason));
    }
    let mut by_fp: HashMap<&str, Vec<&Row>> = HashMap::new();
    for r in rows
        .iter()
        .filter(|r| matches!(r.route.as_str(), "alpha" | "beta") && !r.host.is_empty())
    {
        by_fp.entry(&r.fp).or_default().push(r);
    }
    let (mut bad, mut examples) = (0u64, Vec::new());
    let mut moved = 0;
    for list in by_fp.values_mut() {
        // In start order: a turn abandoned while queued may be recorded after the next turn.
        list.sort_by_key(|r| r.started);
        for w in list.windows(2) {
            if w[0].host == w[1].host {
                continue;
            }
            moved += 1;
            let reasons = explained.get(&(w[1].route.as_str(), w[1].fp.as_str()));
            let ok = reasons.is_some_and(|list| {
                list.iter().any(|(at, why)| {
                    *why != "new" && *at >= w[0].started && *at <= w[1].started + 1000
                })
            });
            if !ok {
                bad += 1;
                if examples.len() < 5 {
                    examples.push(format!(
                        "fp {} moved {} -> {} between {} and {} with no logged reason",
                        w[1].fp, w[0].host, w[1].host, w[0].started, w[1].started
                    ));
                }
            }
        }
    }
    let mut convs: BTreeMap<u64, Vec<&Sent>> = BTreeMap::new();
    for s in ledger.iter().filter(|s| s.turn.is_some()) {
        convs.entry(s.turn.map_or(0, |t| t.0)).or_default().push(s);
    }
    let (mut clean, mut checked_turns, mut not_reused) = (0, 0, 0u64);
    for turns in convs.values() {
        let Corr::Fp(fp) = &turns[0].corr else {
            continue;
        };
        let touched = explained
            .get(&(turns[0].route, fp.as_str()))
            .is_some_and(|l| l.iter().any(|(_, why)| *why != "new"));
        let all_clean = turns.iter().all(|s| {
            matches!(
                s.outcome,
                Outcome::Answered {
                    status: 200,
                    complete: true,
                    ..
                }
            ) && !run.at_kill(s.start, s.end, Duration::ZERO)
        });
        if touched || !all_clean || turns.len() < 2 {
            continue;
        }
        clean += 1;
        let host = |s: &Sent| match &s.outcome {
            Outcome::Answered { host, lease, .. } => (host.clone(), lease.clone()),
            _ => (None, None),
        };
        let first = host(turns[0]).0;
        for s in &turns[1..] {
            checked_turns += 1;
            let (h, lease) = host(s);
            if h != first || lease.as_deref() != Some("reused") {
                not_reused += 1;
                if examples.len() < 10 {
                    examples.push(format!("fp {fp} turn {:?}: host {h:?} lease {lease:?}, first turn on {first:?}, no fault touched it", s.turn));
                }
            }
        }
    }
    let ok = |n: u64| if n == 0 { "ok" } else { "FAIL" };
    let mut lines = vec![
        format!("check moves: conversations={} host_changes={moved} unexplained={bad} -> {}", convs.len(), ok(bad)),
        format!("check reuse: untouched_conversations={clean} later_turns={checked_turns} not_reused={not_reused} -> {}", ok(not_reused)),
    ];
    lines.extend(examples.into_iter().map(|e| format!("    {e}")));
    (bad + not_reused, lines)
}
