//! The `keys` line of `make bench` (issue 25): what checking a client key costs a request — find
//! the key in its headers, hash it, compare it with every configured key in constant time, admit
//! it under its limits and let it go — with 16 keys configured, as a household or team would.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use crossbar::config::Config;
use crossbar::keys::Keys;

const KEYS: usize = 16;
const ROUNDS: usize = 200_000;

/// Runs the measurement and returns the `keys ...` line.
pub fn run() -> String {
    let mut text = "[hosts.a]\nurl = \"http://127.0.0.1:9\"\n[hosts.a.models.m]\n\
                    [routes.projA]\nhosts = [\"a\"]\nmodel = \"m\"\n"
        .to_string();
    let mut last = String::new();
    for i in 0..KEYS {
        let (key, hash) = crossbar::keys::new_key().expect("randomness");
        text.push_str(&format!(
            "[keys.k{i}]\nhash = \"{hash}\"\nmax_in_flight = 64\n"
        ));
        last = key;
    }
    let config = Config::from_toml(&text).expect("bench config");
    let keys = Arc::new(Keys::default());
    let bearer = format!("Bearer {last}");
    let headers: crossbar::conn::Headers = [
        ("Host", "gateway"),
        ("Content-Type", "application/json"),
        ("Authorization", bearer.as_str()),
    ]
    .into_iter()
    .collect();
    let peer: IpAddr = [127, 0, 0, 1].into();
    let mut samples = Vec::with_capacity(ROUNDS);
    for i in 0..ROUNDS {
        let started = Instant::now();
        let name = keys
            .identify(&config, &headers, peer, i as i64)
            .expect("known key");
        let admitted = keys.admit(&config, name.as_deref().unwrap_or(""), "projA", i as i64);
        drop(admitted);
        samples.push(started.elapsed().as_nanos() as f64 / 1000.0);
    }
    samples.sort_by(f64::total_cmp);
    let p = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    format!(
        "keys configured={KEYS} check_p50_us={:.2} check_p99_us={:.2} (identify + admit + release, goal <= 2 us)",
        p(0.50),
        p(0.99)
    )
}
