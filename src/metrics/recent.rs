//! The last hour per host, minute by minute, for the status page's charts (requests, cached-token
//! share, TTFB p50/p95), and what the "served from cache" headline needs: cached tokens since start
//! and the host's measured prefill rate from llama-server's `timings`. Pure and bounded: a ring of
//! [`MINUTES`] slots per host, each a few counters and one small histogram.

use super::histogram::Histogram;

/// Minutes kept per host.
pub const MINUTES: usize = 60;
/// TTFB bucket bounds, in milliseconds.
pub const TTFB_MS: &[f64] = &[
    25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 30000.0, 60000.0, 120000.0,
    300000.0, 600000.0,
];
/// Prefills shorter than this say more about per-request overhead than about the host's speed;
/// they are left out of the measured rate.
pub const MIN_PREFILL_TOKENS: u64 = 32;

/// One minute of one host.
#[derive(Debug, Clone)]
struct Slot {
    /// Unix minute this slot holds; a slot with an older one is empty for a newer minute.
    minute: i64,
    requests: u64,
    prompt: u64,
    cached: u64,
    ttfb: Histogram,
}

impl Slot {
    fn empty(minute: i64) -> Slot {
        Slot {
            minute,
            requests: 0,
            prompt: 0,
            cached: 0,
            ttfb: Histogram::new(TTFB_MS),
        }
    }
}

/// One host's ring of minutes and its totals since start.
#[derive(Debug, Clone, Default)]
pub struct Window {
    /// Invariant: empty, or exactly [`MINUTES`] slots, slot `i` holding a minute `m` with
    /// `m % MINUTES == i`.
    ring: Vec<Slot>,
    cached_total: u64,
    prefill_tokens: u64,
    prefill_us: u64,
}

/// What the page draws for one minute.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MinuteView {
    pub requests: u64,
    /// Cached prompt tokens / prompt tokens, when the minute had prompt tokens.
    pub cached_share: Option<f64>,
    pub ttfb_p50_ms: Option<f64>,
    pub ttfb_p95_ms: Option<f64>,
}

/// The last hour of a host, oldest minute first, and its headline figures.
#[derive(Debug, Clone, PartialEq)]
pub struct HourView {
    pub minutes: Vec<MinuteView>,
    /// Prompt tokens the host served from its cache since crossbar started.
    pub cached_total: u64,
    /// Measured prefill speed, tokens per second, when `timings` gave one.
    pub prefill_rate: Option<f64>,
}

impl Window {
    /// The slot for `at_ms`'s minute, reset if it held an older minute; `None` when `at_ms` is
    /// older than what the slot holds now (outside the window).
    fn slot(&mut self, at_ms: i64) -> Option<&mut Slot> {
        if self.ring.is_empty() {
            self.ring = (0..MINUTES as i64)
                .map(|m| Slot::empty(m - MINUTES as i64))
                .collect();
        }
        let minute = at_ms.div_euclid(60_000);
        let slot = &mut self.ring[minute.rem_euclid(MINUTES as i64) as usize];
        if slot.minute < minute {
            *slot = Slot::empty(minute);
        }
        (slot.minute == minute).then_some(slot)
    }

    pub fn request(&mut self, at_ms: i64, prompt: u64, cached: u64) {
        self.cached_total = self.cached_total.saturating_add(cached);
        if let Some(slot) = self.slot(at_ms) {
            slot.requests += 1;
            slot.prompt = slot.prompt.saturating_add(prompt);
            slot.cached = slot.cached.saturating_add(cached);
        }
    }

    pub fn ttfb(&mut self, at_ms: i64, ms: f64) {
        if let Some(slot) = self.slot(at_ms) {
            slot.ttfb.observe(ms);
        }
    }

    /// A prefill of `tokens` that took `us` microseconds (llama-server's `timings`).
    pub fn prefill(&mut self, tokens: u64, us: u64) {
        if tokens >= MIN_PREFILL_TOKENS && us > 0 {
            self.prefill_tokens = self.prefill_tokens.saturating_add(tokens);
            self.prefill_us = self.prefill_us.saturating_add(us);
        }
    }

    /// The hour ending with `now_ms`'s minute.
    pub fn hour(&self, now_ms: i64) -> HourView {
        let now = now_ms.div_euclid(60_000);
        let minutes = (now - MINUTES as i64 + 1..=now)
            .map(|m| {
                let slot = self
                    .ring
                    .get(m.rem_euclid(MINUTES as i64) as usize)
                    .filter(|s| s.minute == m);
                slot.map_or_else(MinuteView::default, |s| MinuteView {
                    requests: s.requests,
                    cached_share: (s.prompt > 0).then(|| s.cached as f64 / s.prompt as f64),
                    ttfb_p50_ms: s.ttfb.percentile(50),
                    ttfb_p95_ms: s.ttfb.percentile(95),
                })
            })
            .collect();
        HourView {
            minutes,
            cached_total: self.cached_total,
            prefill_rate: (self.prefill_us > 0)
                .then(|| self.prefill_tokens as f64 * 1e6 / self.prefill_us as f64),
        }
    }
}

/// The headline over several hosts: cached tokens, and the seconds they would have taken to
/// prefill at each host's own measured rate (hosts without a rate add tokens but no seconds).
pub fn saved(hours: &[HourView]) -> (u64, f64) {
    let tokens = hours.iter().map(|h| h.cached_total).sum();
    // Folded from +0.0: `Sum` for `f64` starts at -0.0, which the status showed as "-0.0".
    let seconds = (hours.iter().filter_map(HourView::saved_seconds)).fold(0.0, |all, s| all + s);
    (tokens, seconds)
}

/// A saved prefill time in words: `42.0 seconds` under a minute, else `3.5 minutes`; never below
/// `0.0` (no `-0.0`, whatever rounding or a caller's sum gives).
pub fn in_words(seconds: f64) -> String {
    // `NaN > 0` is false too.
    let seconds = if seconds > 0.0 { seconds } else { 0.0 };
    if seconds < 60.0 {
        format!("{seconds:.1} seconds")
    } else {
        format!("{:.1} minutes", seconds / 60.0)
    }
}

impl HourView {
    /// Seconds the cached tokens would have taken to prefill at the measured rate.
    pub fn saved_seconds(&self) -> Option<f64> {
        self.prefill_rate
            .filter(|r| *r > 0.0)
            .map(|rate| self.cached_total as f64 / rate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60_000;

    #[test]
    fn minutes_land_in_their_slot_and_age_out_after_an_hour() {
        let mut w = Window::default();
        let t0 = 1_000 * MIN;
        w.request(t0, 100, 80);
        w.request(t0 + 10, 100, 0);
        w.ttfb(t0, 40.0);
        w.ttfb(t0, 400.0);
        w.request(t0 + 5 * MIN, 10, 10);
        let hour = w.hour(t0 + 5 * MIN);
        assert_eq!(hour.minutes.len(), MINUTES);
        let first = hour.minutes[MINUTES - 6];
        assert_eq!(first.requests, 2);
        assert_eq!(first.cached_share, Some(0.4));
        assert_eq!(first.ttfb_p50_ms, Some(50.0));
        assert_eq!(first.ttfb_p95_ms, Some(500.0));
        assert_eq!(hour.minutes[MINUTES - 1].requests, 1);
        assert_eq!(hour.cached_total, 90);
        // An hour later the first minute's slot is reused; the old minute is gone.
        w.request(t0 + 60 * MIN, 1, 0);
        let later = w.hour(t0 + 60 * MIN);
        assert_eq!(later.minutes.iter().map(|m| m.requests).sum::<u64>(), 2);
        // A request that started before the window counts in the totals only.
        w.request(t0 - 2 * MIN, 5, 5);
        assert_eq!(w.hour(t0 + 60 * MIN).cached_total, 95);
        assert_eq!(
            w.hour(t0 + 60 * MIN)
                .minutes
                .iter()
                .map(|m| m.requests)
                .sum::<u64>(),
            2
        );
    }

    #[test]
    fn the_prefill_rate_comes_from_long_enough_prefills() {
        let mut w = Window::default();
        assert_eq!(w.hour(0).prefill_rate, None);
        w.prefill(10, 1_000_000); // too short to measure the host
        w.prefill(1000, 2_000_000);
        w.prefill(3000, 2_000_000);
        w.request(0, 4000, 2000);
        let hour = w.hour(0);
        assert_eq!(hour.prefill_rate, Some(1000.0));
        assert_eq!(hour.saved_seconds(), Some(2.0));
        assert_eq!(in_words(2.0), "2.0 seconds");
        assert_eq!(in_words(90.0), "1.5 minutes");
    }

    /// Issue 27: a fresh gateway's status said "prefill saved: 0 tokens (≈ -0.0 seconds)": an
    /// empty `f64` sum is -0.0. No figure is ever shown below zero.
    #[test]
    fn issue27_nothing_saved_is_zero_seconds_never_minus_zero() {
        let (tokens, seconds) = saved(&[]);
        assert_eq!((tokens, seconds.to_string()), (0, "0".to_string()));
        let unmeasured = Window::default().hour(0);
        assert_eq!(saved(&[unmeasured]).1.to_string(), "0");
        assert_eq!(in_words(seconds), "0.0 seconds");
        assert_eq!(in_words(-0.0), "0.0 seconds");
        assert_eq!(in_words(-0.04), "0.0 seconds");
        assert_eq!(in_words(f64::NAN), "0.0 seconds");
    }
}
