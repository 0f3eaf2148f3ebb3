//! The soak's verdicts, from what crossbar itself reports: its db (accounting rows and lease
//! events, read-only, by the column names of spec §6), `/metrics` and `/admin/status`, against the
//! ledger of what the clients sent and saw. Each check returns its count and one printable line.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use crate::ledger::{Corr, Outcome, Run, Sent};

#[derive(Debug, Clone)]
pub struct Row {
    pub api: String,
    pub err: String,
    pub started: i64,
    pub total_ms: i64,
    pub route: String,
    pub fp: String,
    pub host: String,
    pub status: u16,
}

#[derive(Debug, Clone)]
pub struct Event {
    pub at: i64,
    pub route: String,
    pub fp: String,
    pub reason: String,
}

/// Every accounting row and lease event, in id order.
pub fn load(db: &Path) -> rusqlite::Result<(Vec<Row>, Vec<Event>)> {
    let conn = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    let mut q = conn.prepare(
        "SELECT started, route, fp, host, status, total_ms, err, api FROM requests ORDER BY id",
    )?;
    let rows = q
        .query_map([], |r| {
            Ok(Row {
                started: r.get(0)?,
                route: r.get(1)?,
                fp: r.get(2)?,
                host: r.get(3)?,
                status: r.get(4)?,
                total_ms: r.get(5)?,
                err: r.get(6)?,
                api: r.get(7)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let mut q = conn.prepare("SELECT at, route, fp, reason FROM lease_events ORDER BY id")?;
    let events = q
        .query_map([], |r| {
            Ok(Event {
                at: r.get(0)?,
                route: r.get(1)?,
                fp: r.get(2)?,
                reason: r.get(3)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok((rows, events))
}

/// What one request should have left in the db.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Exactly one row with the status the client saw.
    Status(u16),
    /// The client left: exactly one row, 499 — or crossbar's own 503 given at once (it took the
    /// request up after the client had gone and refused it with no wait in which to notice), or
    /// what a fault on the row's host made of it (502, or 200 with the body broken off), when
    /// that host had one at the time: two faults at once, whichever crossbar saw first wins.
    Left,
    /// Exactly one row, status not knowable from outside (see `expect`).
    One,
    /// Zero or one row: in flight at the SIGKILL, or the answer does not say.
    Maybe,
    /// No row: refused before routing, or never reached crossbar.
    Nothing,
}

impl Expect {
    fn accepts(self, row: RowKey) -> bool {
        match self {
            Expect::Status(s) => row.status == s,
            Expect::Left => {
                row.status == 499
                    || (row.status == 503 && row.at_once)
                    || (row.faulted && matches!(row.status, 200 | 502))
            }
            Expect::One | Expect::Maybe => true,
            Expect::Nothing => false,
        }
    }

    /// Most constrained first, so the greedy matching does not waste a row another needs.
    fn rank(self) -> u8 {
        match self {
            Expect::Status(_) => 0,
            Expect::Left => 1,
            Expect::One => 2,
            Expect::Maybe => 3,
            Expect::Nothing => 4,
        }
    }
}

/// A row as the matching sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct RowKey {
    status: u16,
    /// Answered in under a second (for a 503: queue full, no healthy host, pinned host down).
    at_once: bool,
    /// Its host had a fault (kill, hang, broken streams) while it ran.
    faulted: bool,
}

fn expect(s: &Sent, run: &Run, tally: &mut BTreeMap<&'static str, u64>) -> Expect {
    // A request crossbar had not finished may still be pending long after its client gave up
    // (queued up to `queue_timeout`, then the upstream's first byte): 20 s of slack for those.
    let at_kill = run.at_kill(s.start, s.end, Duration::ZERO);
    let pending_at_kill = run.at_kill(s.start, s.end, Duration::from_secs(20));
    let conversation = matches!(s.corr, Corr::Fp(_));
    let mut note = |what| *tally.entry(what).or_default() += 1;
    match &s.outcome {
        Outcome::NoConnection => Expect::Nothing,
        Outcome::Dropped if pending_at_kill => Expect::Maybe,
        // Closed without a byte of answer: crossbar closed an idle keep-alive connection, which
        // it may, but then it never read the request, so no row may exist for it.
        Outcome::Dropped => {
            note("dropped_keepalive");
            Expect::Nothing
        }
        Outcome::Unanswered if pending_at_kill || !conversation => {
            note(if conversation {
                "unanswered_at_kill"
            } else {
                s.route
            });
            Expect::Maybe
        }
        Outcome::Unanswered => {
            note("unanswered");
            Expect::One
        }
        Outcome::Left if pending_at_kill => Expect::Maybe,
        Outcome::Left => {
            note("left");
            Expect::Left
        }
        Outcome::Answered {
            pre_route: true, ..
        } => {
            note("refused_before_routing");
            Expect::Nothing
        }
        Outcome::Answered {
            complete: false, ..
        } if at_kill => Expect::Maybe,
        Outcome::Answered { own_400: true, .. } => {
            note("own_400");
            Expect::Maybe
        }
        Outcome::Answered { status, .. } => Expect::Status(*status),
    }
}

/// Which ledger bucket a row belongs to.
fn bucket(row: &Row) -> Corr {
    match row.route.as_str() {
        "alpha" | "beta" => Corr::Fp(row.fp.clone()),
        "junk" => Corr::Route("junk"),
        _ => Corr::Nothing,
    }
}

/// Exactly one row per routed request with the status the client saw (499 for a client that
/// left), none for requests refused before routing. Returns (missing, extra, line).
pub fn rows(ledger: &[Sent], rows: &[Row], run: &Run) -> (u64, u64, String) {
    #[derive(Default)]
    struct B {
        want: Vec<Expect>,
        got: BTreeMap<RowKey, u64>,
        seen: BTreeMap<String, u64>,
    }
    let mut buckets: HashMap<Corr, B> = HashMap::new();
    let mut notes = BTreeMap::new();
    for s in ledger {
        let b = buckets.entry(s.corr.clone()).or_default();
        b.want.push(expect(s, run, &mut notes));
        *b.seen.entry(outcome_name(&s.outcome)).or_default() += 1;
    }
    for r in rows {
        let key = RowKey {
            status: r.status,
            at_once: r.total_ms < 1000,
            faulted: run.host_faulted(&r.host, r.started, r.started + r.total_ms),
        };
        *buckets
            .entry(bucket(r))
            .or_default()
            .got
            .entry(key)
            .or_default() += 1;
    }
    let (mut missing, mut extra, mut examples, mut expected) = (0, 0, Vec::new(), 0);
    for (corr, b) in &mut buckets {
        b.want.sort_by_key(|e| e.rank());
        let mut got = b.got.clone();
        let mut miss = 0;
        for e in &b.want {
            // A row a leaver could also use is taken last.
            let hit = got
                .iter_mut()
                .filter(|(k, n)| **n > 0 && e.accepts(**k))
                .min_by_key(|(k, _)| *e != Expect::Left && Expect::Left.accepts(**k));
            let found = hit.map(|(_, n)| *n -= 1).is_some();
            if matches!(e, Expect::Status(_) | Expect::Left | Expect::One) {
                expected += 1;
                miss += u64::from(!found);
            }
        }
        let left: u64 = got.values().sum();
        if (miss > 0 || left > 0) && examples.len() < 5 {
            let rows: Vec<String> = b
                .got
                .iter()
                .map(|(k, n)| {
                    format!(
                        "{}{}{} x{n}",
                        k.status,
                        if k.at_once { " at-once" } else { "" },
                        if k.faulted { " faulted-host" } else { "" }
                    )
                })
                .collect();
            examples.push(format!("{corr:?} client saw {:?}, rows {rows:?}", b.seen));
        }
        missing += miss;
        extra += left;
    }
    let stalled = rows.iter().filter(|r| r.err.contains("stalled")).count();
    let mut ok_by_api: BTreeMap<&str, u64> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.status == 200) {
        *ok_by_api.entry(&r.api).or_default() += 1;
    }
    let line = format!(
        "check rows: requests={} rows={} expected_rows={expected} missing={missing} extra={extra} stalled_rows={stalled} ok_by_api={ok_by_api:?} {notes:?}{}",
        ledger.len(),
        rows.len(),
        examples.iter().map(|e| format!("\n    {e}")).collect::<String>()
    );
    (missing, extra, line)
}

fn outcome_name(o: &Outcome) -> String {
    match o {
        Outcome::Answered {
            status, complete, ..
        } => format!("{status}{}", if *complete { "" } else { " broken" }),
        Outcome::Left => "left".into(),
        Outcome::NoConnection => "no connection".into(),
        Outcome::Dropped => "dropped".into(),
        Outcome::Unanswered => "unanswered".into(),
    }
}

/// `/metrics`' `crossbar_requests_total` per status against the db's rows of the same process
/// (those started after `since_ms`). Returns (metrics over db, db over metrics, line).
pub fn metrics(text: &str, rows: &[Row], since_ms: i64) -> (u64, u64, String) {
    let mut m: BTreeMap<u16, u64> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("crossbar_requests_total{"))
    {
        let status = line
            .split("status=\"")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .and_then(|s| s.parse().ok());
        let n = line.rsplit(' ').next().and_then(|n| n.parse::<f64>().ok());
        if let (Some(status), Some(n)) = (status, n) {
            *m.entry(status).or_default() += n as u64;
        }
    }
    let mut d: BTreeMap<u16, u64> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.started > since_ms) {
        *d.entry(r.status).or_default() += 1;
    }
    let (mut over, mut under) = (0, 0);
    let statuses: std::collections::BTreeSet<u16> = m.keys().chain(d.keys()).copied().collect();
    for s in statuses {
        let (a, b) = (*m.get(&s).unwrap_or(&0), *d.get(&s).unwrap_or(&0));
        over += a.saturating_sub(b);
        under += b.saturating_sub(a);
    }
    let ok = if m == d { "ok" } else { "FAIL" };
    let line = format!("check metrics: /metrics {m:?} db {d:?} -> {ok}");
    (over, under, line)
}

/// In flight and queued per host+model from `/admin/status`.
pub fn slots(status: &serde_json::Value) -> u64 {
    let mut n = 0;
    for h in status["hosts"].as_array().into_iter().flatten() {
        for m in h["models"].as_array().into_iter().flatten() {
            n += m["in_flight"].as_u64().unwrap_or(0) + m["queued"].as_u64().unwrap_or(0);
        }
    }
    n
}

/// Lines of crossbar's logs that report a panic.
pub fn panics(logs: &[std::path::PathBuf]) -> (u64, Vec<String>) {
    let mut found = Vec::new();
    for log in logs {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        found.extend(
            text.lines()
                .filter(|l| l.contains("panicked"))
                .map(str::to_string),
        );
    }
    (found.len() as u64, found.into_iter().take(5).collect())
}
