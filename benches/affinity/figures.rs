//! From one run's turns and the hosts' own counters to the figures the benchmark reports.
//!
//! Pure: numbers in, numbers out (unit-tested from tests/it through a `#[path]` module).
//!
//! - prefilled: prompt tokens the hosts evaluated (their `prompt_n` totals, failed attempts included:
//!   that work was done).
//! - history re-prefilled: of a successful turn's prefilled tokens, those the conversation had already
//!   sent in an earlier turn. A turn's prompt extends the previous turn's prompt, so the prefilled range
//!   `[cache_n, n_prompt)` overlaps the history `[0, prev_prompt)` by `prev_prompt - cache_n` (at least
//!   0, at most `prompt_n`). New tokens of a turn — the reply it appended and its new message — are
//!   never counted.
//! - floor: the fewest tokens any router could have had prefilled for the same turns — every
//!   turn's new tokens once, and a system prompt several conversations share once in all (its size
//!   as the hosts count it: the largest `cache_n` of a sharer's first turn, in this run or, through
//!   [`Floor::with_shared`], another front end's of the same scenario). Unknown (`None`) where no
//!   sharer's first turn found it warm.

/// One run's figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Figures {
    pub turns: usize,
    /// Turns given up after every retry.
    pub lost_turns: usize,
    /// Failed attempts the clients saw (each retried).
    pub failed_attempts: u64,
    /// Turns served by another host than their conversation's previous turn.
    pub moves: usize,
    pub prefilled: u64,
    pub cached: u64,
    pub history_reprefilled: u64,
    pub floor: Floor,
    pub ttfb_mean_ms: f64,
    pub ttfb_p95_ms: f64,
    /// Successful turns per second of wall time.
    pub turns_per_s: f64,
}

impl Figures {
    /// Share of prompt tokens the hosts took from a cache.
    pub fn cached_share(&self) -> f64 {
        ratio(self.cached, self.cached + self.prefilled)
    }
}

/// What a client saw of one turn (or of a turn given up after every retry: `ok == false`).
#[derive(Debug, Clone, Copy, Default)]
pub struct TurnFacts {
    pub ok: bool,
    /// Attempts that failed before this turn succeeded (or gave up).
    pub failed_attempts: u32,
    /// The successful attempt's time from sending the request to the first byte of its body
    /// (a streamed answer's first event; its headers may come before the host's prefill).
    pub ttfb_ms: f64,
    /// The successful attempt's `timings`.
    pub prompt_n: u64,
    pub cache_n: u64,
    /// Prompt tokens (`prompt_n + cache_n`) of the conversation's previous successful turn; 0 first.
    pub prev_prompt: u64,
    /// Served by another host than the conversation's previous successful turn.
    pub moved: bool,
    /// Its conversation's system prompt is one other conversations share.
    pub shared_system: bool,
}

/// What the floor (see the module) is made of in one run.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Floor {
    /// Each successful turn's tokens beyond its conversation's previous prompt.
    pub new_tokens: u64,
    /// Conversations sharing a system prompt (their first turns that succeeded).
    pub sharers: u64,
    /// The shared system prompt's tokens, as far as a sharer's warm first turn showed them.
    pub shared: u64,
}

impl Floor {
    pub fn of(turns: &[TurnFacts]) -> Floor {
        let ok = || turns.iter().filter(|t| t.ok);
        let first = || ok().filter(|t| t.prev_prompt == 0 && t.shared_system);
        Floor {
            new_tokens: ok()
                .map(|t| (t.prompt_n + t.cache_n).saturating_sub(t.prev_prompt))
                .sum(),
            sharers: first().count() as u64,
            shared: first().map(|t| t.cache_n).max().unwrap_or(0),
        }
    }

    /// The same run's floor, the shared prompt's size taken as `shared` where that is larger (a
    /// front end that gathered the sharers saw it; one that spread them may not have).
    pub fn with_shared(self, shared: u64) -> Floor {
        Floor {
            shared: self.shared.max(shared),
            ..self
        }
    }

    /// The floor in tokens, `None` while the shared prompt's size is unknown.
    pub fn tokens(&self) -> Option<u64> {
        (self.shared > 0 || self.sharers < 2).then(|| {
            let repeats = self.sharers.saturating_sub(1) * self.shared;
            self.new_tokens.saturating_sub(repeats)
        })
    }
}

/// Prefilled tokens of a turn that repeat the conversation's earlier prompt.
pub fn history_reprefilled(t: &TurnFacts) -> u64 {
    if !t.ok {
        return 0;
    }
    t.prev_prompt.saturating_sub(t.cache_n).min(t.prompt_n)
}

/// `host_prompt_n`/`host_cache_n`: the hosts' own totals for the run; `wall_s`: the run's wall time.
pub fn figures(turns: &[TurnFacts], host_prompt_n: u64, host_cache_n: u64, wall_s: f64) -> Figures {
    let ok: Vec<&TurnFacts> = turns.iter().filter(|t| t.ok).collect();
    let mut ttfb: Vec<f64> = ok.iter().map(|t| t.ttfb_ms).collect();
    ttfb.sort_by(f64::total_cmp);
    let mean = if ttfb.is_empty() {
        0.0
    } else {
        ttfb.iter().sum::<f64>() / ttfb.len() as f64
    };
    Figures {
        turns: turns.len(),
        lost_turns: turns.len() - ok.len(),
        failed_attempts: turns.iter().map(|t| u64::from(t.failed_attempts)).sum(),
        moves: ok.iter().filter(|t| t.moved).count(),
        prefilled: host_prompt_n,
        cached: host_cache_n,
        history_reprefilled: turns.iter().map(history_reprefilled).sum(),
        floor: Floor::of(turns),
        ttfb_mean_ms: mean,
        ttfb_p95_ms: percentile(&ttfb, 95.0),
        turns_per_s: if wall_s > 0.0 {
            ok.len() as f64 / wall_s
        } else {
            0.0
        },
    }
}

/// Nearest-rank percentile of sorted values (0 when empty).
pub fn percentile(sorted: &[f64], pct: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((pct / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// `a / b`, with 0/0 = 1 (equal) and x/0 = infinity.
pub fn ratio(a: u64, b: u64) -> f64 {
    match (a, b) {
        (0, 0) => 1.0,
        (_, 0) => f64::INFINITY,
        _ => a as f64 / b as f64,
    }
}

/// A ratio for the table and the last line: three decimals, `inf` when the divisor was 0.
pub fn show_ratio(r: f64) -> String {
    if r.is_finite() {
        format!("{r:.3}")
    } else {
        "inf".to_string()
    }
}
