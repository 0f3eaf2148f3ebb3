//! The `leases` line of `make bench` (issue 12): the lease table with 100,000 live leases on a real
//! SQLite store — acquire p50/p99 for reused and new leases, resident memory, and the longest
//! acquire while an idle sweep expires all of them; then the commit of one accounting row on its own
//! (what every request waits for before its answer's last piece).
//!
//! The table runs as `serve` runs it (the store's writer thread behind it); hosts and chooser are
//! trivial stand-ins (every host healthy, fewest leases wins), so the figures are the table's and
//! the store's, not the HTTP path's (the lines above measure that).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use crossbar::lease::{Ask, Candidate, Chooser, HostView, Key, Placed, Table};
use crossbar::store::{unix_ms, LeaseRow, LeaseState, RequestRow, Store, Write};

const LEASES: usize = 100_000;
const ACQUIRES: usize = 20_000;
const NEW: usize = 2_000;
const HOSTS: [&str; 4] = ["a", "b", "c", "d"];

struct AllUp;

impl HostView for AllUp {
    fn healthy(&self, _: &str) -> bool {
        true
    }
    fn draining(&self, _: &str) -> bool {
        false
    }
}

impl Chooser for AllUp {
    fn choose(
        &self,
        candidates: &[Candidate],
        _: &str,
        _: &Ask,
        _: i64,
    ) -> Option<(String, Placed)> {
        candidates
            .iter()
            .min_by_key(|c| c.leases)
            .map(|c| (c.host.clone(), Placed::LeastLoaded))
    }

    fn busy_move(
        &self,
        _: &Candidate,
        _: &[Candidate],
        _: &str,
        _: &Ask,
        _: i64,
    ) -> Option<String> {
        None
    }
}

fn key(i: usize) -> Key {
    Key {
        route: "bench".into(),
        fp: format!("{:016x}", (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        model: "m".into(),
    }
}

/// Runs the measurement and returns the `leases ...` line.
pub fn run(db: &Path) -> String {
    let now = unix_ms(SystemTime::now());
    let store = Arc::new(Store::open(db).expect("bench store"));
    // 100,000 leases idle for three hours, written in large jobs.
    for chunk in (0..LEASES).collect::<Vec<_>>().chunks(10_000) {
        let writes = chunk
            .iter()
            .map(|&i| {
                let k = key(i);
                Write::SaveLease(LeaseRow {
                    route: k.route,
                    fp: k.fp,
                    model: k.model,
                    host: HOSTS[i % HOSTS.len()].to_string(),
                    state: LeaseState::Active,
                    created: now - 3 * 3_600_000,
                    last_used: now - 3 * 3_600_000,
                })
            })
            .collect();
        store.submit(writes).wait().expect("bench rows");
    }
    let rss_before = rss_kib();
    let table = Table::new(
        store.clone(),
        Arc::new(AllUp),
        Arc::new(AllUp),
        Duration::from_secs(7200),
    )
    .expect("bench table");
    let rss_after = rss_kib();
    assert_eq!(table.len(), LEASES);
    let candidates: Vec<String> = HOSTS.iter().map(|h| h.to_string()).collect();

    // Reused leases: a touch in memory, written behind.
    let mut rng = fastrand::Rng::with_seed(12);
    let mut reused = Vec::with_capacity(ACQUIRES);
    for _ in 0..ACQUIRES {
        let k = key(rng.usize(..LEASES));
        let t = Instant::now();
        let got = table.acquire(&k, &candidates, now).expect("acquire");
        reused.push(t.elapsed().as_secs_f64() * 1e6);
        assert!(got.reused);
    }
    // New leases: written through (one commit each, nothing else queued), the oldest evicted.
    table.set_max_leases(LEASES, LEASES);
    let mut fresh = Vec::with_capacity(NEW);
    for i in 0..NEW {
        let t = Instant::now();
        table
            .acquire(&key(LEASES + i), &candidates, now)
            .expect("new");
        fresh.push(t.elapsed().as_secs_f64() * 1e6);
    }
    assert_eq!(table.len(), LEASES);

    // What the sweeper thread does every tick before it sweeps: the touches go out as one job.
    let flushed = table.flush_touches();
    // The sweep: everything untouched above is idle. Meanwhile one client keeps acquiring recent
    // leases, one every 100 us (several times what the HTTP path serves); its longest acquire is
    // the stall the sweep caused.
    let working: Vec<Key> = (LEASES..LEASES + NEW).map(key).collect();
    let sweeping = AtomicBool::new(true);
    let (expired, sweep_ms, stall_us, during) = thread::scope(|s| {
        let sweeper = s.spawn(|| {
            let t = Instant::now();
            let n = table.expire_idle(now + 1);
            sweeping.store(false, Ordering::SeqCst);
            (n, t.elapsed().as_secs_f64() * 1e3)
        });
        let (mut worst, mut n, mut i) = (0f64, 0usize, 0usize);
        while sweeping.load(Ordering::SeqCst) {
            let t = Instant::now();
            table
                .acquire(&working[i % working.len()], &candidates, now + 1)
                .expect("during");
            worst = worst.max(t.elapsed().as_secs_f64() * 1e6);
            n += 1;
            i += 1;
            thread::sleep(Duration::from_micros(100));
        }
        let (expired, ms) = sweeper.join().expect("sweeper");
        (expired, ms, worst, n)
    });
    drop(table);
    // The accounting row's commit alone, as a lone request makes it (on its own thread).
    let mut rows = Vec::with_capacity(NEW);
    for i in 0..NEW {
        let row = RequestRow {
            started: now + i as i64,
            route: "bench".into(),
            fp: format!("{i:064x}"),
            model: "m".into(),
            host: "a".into(),
            status: 200,
            ..RequestRow::default()
        };
        let t = Instant::now();
        store.record_request(&row).expect("row");
        rows.push(t.elapsed().as_secs_f64() * 1e6);
    }
    drop(store);
    format!(
        "leases live={LEASES} acquire_p50_us={:.1} acquire_p99_us={:.1} new_p50_us={:.1} \
         new_p99_us={:.1} rss_mib={:.1} table_mib={:.1} sweep_expired={expired} sweep_ms={sweep_ms:.0} \
         sweep_stall_max_us={stall_us:.0} acquires_during_sweep={during} touches_flushed={flushed} \
         row_commit_p50_us={:.1} row_commit_p99_us={:.1}",
        crate::figures::percentile(&mut reused, 50.0),
        crate::figures::percentile(&mut reused, 99.0),
        crate::figures::percentile(&mut fresh, 50.0),
        crate::figures::percentile(&mut fresh, 99.0),
        rss_after as f64 / 1024.0,
        rss_after.saturating_sub(rss_before) as f64 / 1024.0,
        crate::figures::percentile(&mut rows, 50.0),
        crate::figures::percentile(&mut rows, 99.0),
    )
}

/// This process's resident set, KiB (Linux `/proc/self/status`).
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}
