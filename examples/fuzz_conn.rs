//! `make fuzz`: the connection layer's seeded mutation runner (`crossbar::conn::fuzz`) for as many
//! cases as asked. Usage: `fuzz_conn [cases] [seed]` (defaults 200000 and the current time).

use std::time::{Instant, SystemTime, UNIX_EPOCH};

fn main() {
    let mut args = std::env::args().skip(1);
    let cases = args.next().and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let seed = args.next().and_then(|a| a.parse().ok()).unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_secs())
    });
    let started = Instant::now();
    // Routing's promise about any path a head carries: canonical once accepted, no dot segment.
    let report = crossbar::conn::fuzz::run(cases, seed, |input, path| {
        if let Err(broken) = crossbar::proxy::check_normal(path) {
            panic!("{broken}: {input:?}");
        }
    });
    println!(
        "fuzz_conn seed={seed} cases={} heads_accepted={} bodies_read={} secs={:.1}",
        report.cases,
        report.heads,
        report.bodies,
        started.elapsed().as_secs_f64()
    );
}
