//! The overhead benchmark's arithmetic: one phase's latencies and wall time, a front end's medians
//! over the interleaved rounds, and what its process tree spent on the CPU per request.

use std::time::Duration;

/// Latencies (ms) of one phase, its wall time, and the CPU ticks the measured front end spent on
/// it (when it is a process of its own).
pub struct Sample {
    pub ms: Vec<f64>,
    pub wall: Duration,
    pub ticks: u64,
}

impl Sample {
    /// Nearest-rank percentile.
    pub fn p(&self, pct: f64) -> f64 {
        percentile(&mut self.ms.clone(), pct)
    }

    pub fn rps(&self) -> f64 {
        self.ms.len() as f64 / self.wall.as_secs_f64()
    }
}

/// One front end's figures at one client count: medians over the interleaved rounds, and its
/// CPU per request over all of them (µs; NaN when not measured).
pub struct Figures {
    pub p50: f64,
    pub p99: f64,
    pub rps: f64,
    pub cpu_us: f64,
}

impl Figures {
    pub fn of(rounds: &[Sample]) -> Figures {
        let median = |f: &dyn Fn(&Sample) -> f64| {
            let mut v: Vec<f64> = rounds.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let requests: usize = rounds.iter().map(|s| s.ms.len()).sum();
        let ticks: u64 = rounds.iter().map(|s| s.ticks).sum();
        Figures {
            p50: median(&|s| s.p(50.0)),
            p99: median(&|s| s.p(99.0)),
            rps: median(&|s| s.rps()),
            cpu_us: if ticks == 0 {
                f64::NAN
            } else {
                ticks as f64 * crate::gateway::TICK_US / requests as f64
            },
        }
    }

    /// CPU per request worked out from req/s alone (docs/BENCHMARKS.md): `direct` at 32 clients
    /// is CPU-bound, so 2 cores ÷ its req/s is what client and upstream cost a request, and a
    /// front end that keeps a share r of that rate costs that × (1/r − 1) more.
    pub fn worked_out_us(&self, direct: &Figures) -> f64 {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get()) as f64;
        cores * 1e6 / direct.rps * (direct.rps / self.rps - 1.0)
    }
}

/// Nearest-rank percentile of `v` (sorted in place); NaN when empty.
pub fn percentile(v: &mut [f64], pct: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((pct / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

pub fn print_row(path: &str, clients: usize, f: &Figures) {
    println!(
        "{path:<10} {clients:>8} {:>9.3} {:>9.3} {:>10.0} {:>9.1}",
        f.p50, f.p99, f.rps, f.cpu_us
    );
}
