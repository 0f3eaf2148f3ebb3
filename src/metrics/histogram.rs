//! A fixed-bucket histogram in the Prometheus shape (`_bucket{le=..}` cumulative, `_sum`,
//! `_count`), and the nearest-bucket percentile the status page reads from one. Pure.

use std::fmt::Write;

/// Counts per bucket of `bounds` (upper bounds, ascending); values above the last go to `+Inf`.
/// Invariant: `counts.len() == bounds.len() + 1` (the last is the `+Inf` bucket).
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    pub fn observe(&mut self, value: f64) {
        let value = if value.is_finite() {
            value.max(0.0)
        } else {
            0.0
        };
        let i = self
            .bounds
            .iter()
            .position(|b| value <= *b)
            .unwrap_or(self.bounds.len());
        self.counts[i] += 1;
        self.sum += value;
        self.count += 1;
    }

    /// The upper bound of the bucket holding the `pct`th percentile (nearest rank); the largest
    /// bound when it lies in `+Inf`; `None` when empty.
    pub fn percentile(&self, pct: u32) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = (self.count * u64::from(pct)).div_ceil(100).max(1);
        let mut seen = 0;
        for (i, n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return self.bounds.get(i).or(self.bounds.last()).copied();
            }
        }
        self.bounds.last().copied()
    }

    /// The exposition lines of one series; `labels` is `a="x",b="y"` (no braces), may be empty.
    pub fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (i, n) in self.counts.iter().enumerate() {
            cumulative += n;
            let le = self
                .bounds
                .get(i)
                .map_or("+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {cumulative}"
            );
        }
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: &[f64] = &[1.0, 2.0, 5.0];

    #[test]
    fn renders_cumulative_buckets_sum_and_count() {
        let mut h = Histogram::new(B);
        for v in [0.5, 1.5, 1.7, 9.0] {
            h.observe(v);
        }
        let mut out = String::new();
        h.render(&mut out, "x", "route=\"a\"");
        assert_eq!(
            out,
            "x_bucket{route=\"a\",le=\"1\"} 1\nx_bucket{route=\"a\",le=\"2\"} 3\n\
             x_bucket{route=\"a\",le=\"5\"} 3\nx_bucket{route=\"a\",le=\"+Inf\"} 4\n\
             x_sum{route=\"a\"} 12.7\nx_count{route=\"a\"} 4\n"
        );
    }

    #[test]
    fn percentiles_are_bucket_bounds() {
        let mut h = Histogram::new(B);
        assert_eq!(h.percentile(50), None);
        for v in [0.5, 0.6, 1.5, 4.0, 100.0] {
            h.observe(v);
        }
        assert_eq!(h.percentile(40), Some(1.0));
        assert_eq!(h.percentile(50), Some(2.0));
        assert_eq!(h.percentile(80), Some(5.0));
        assert_eq!(
            h.percentile(95),
            Some(5.0),
            "+Inf shows as the largest bound"
        );
    }
}
