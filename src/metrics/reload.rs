//! The last config reload (issue 48): when, whether it was applied or refused, and what it said
//! (a refused one's problems, an applied one's warnings), for `/admin/status`, `crossbar status`,
//! the page and `/metrics`; and how many of each since start. A refused reload used to show only
//! in the log while everything else said all was well. Bounded: the last one only, its lines
//! capped in number and length.

use super::Metrics;

/// Lines kept of a reload's problems or warnings, and the bytes kept of each.
const MAX_LINES: usize = 20;
const MAX_LINE: usize = 512;

/// One reload, as SIGHUP left it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastReload {
    /// Unix ms.
    pub at: i64,
    /// Put in force (`true`), or refused with the old config kept.
    pub applied: bool,
    /// Why it was refused: one line per problem, each naming its key.
    pub problems: Vec<String>,
    /// What an applied one warned of (a key that needs a restart, the config's own warnings).
    pub warnings: Vec<String>,
}

/// Reloads since start, applied and refused, and the last one.
#[derive(Debug, Default)]
pub(super) struct Reloads {
    pub(super) applied: u64,
    pub(super) refused: u64,
    pub(super) last: Option<LastReload>,
}

impl Metrics {
    /// A reload at `at` was put in force, with these warnings.
    pub fn observe_reload_applied(&self, at: i64, warnings: &[String]) {
        let mut inner = self.inner.lock();
        inner.reloads.applied += 1;
        inner.reloads.last = Some(LastReload {
            at,
            applied: true,
            problems: Vec::new(),
            warnings: bounded(warnings),
        });
    }

    /// A reload at `at` was refused for these problems; the old config serves on.
    pub fn observe_reload_refused(&self, at: i64, problems: &[String]) {
        let mut inner = self.inner.lock();
        inner.reloads.refused += 1;
        inner.reloads.last = Some(LastReload {
            at,
            applied: false,
            problems: bounded(problems),
            warnings: Vec::new(),
        });
    }

    /// The last reload since start, if any.
    pub fn last_reload(&self) -> Option<LastReload> {
        self.inner.lock().reloads.last.clone()
    }
}

fn bounded(lines: &[String]) -> Vec<String> {
    let mut kept: Vec<String> = (lines.iter().take(MAX_LINES))
        .map(|l| crate::logfmt::cut(l, MAX_LINE).to_string())
        .collect();
    if lines.len() > MAX_LINES {
        kept.push(format!("... and {} more", lines.len() - MAX_LINES));
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_reload_is_kept_bounded_issue_48() {
        let metrics = Metrics::default();
        assert_eq!(metrics.last_reload(), None);
        let many: Vec<String> = (0..30)
            .map(|i| format!("{i}: {}", "x".repeat(900)))
            .collect();
        metrics.observe_reload_refused(5, &many);
        let last = metrics.last_reload().unwrap();
        assert!(!last.applied && last.at == 5);
        assert_eq!(last.problems.len(), MAX_LINES + 1);
        assert!(last.problems.iter().all(|l| l.len() <= MAX_LINE));
        assert_eq!(last.problems[MAX_LINES], "... and 10 more");
        metrics.observe_reload_applied(9, &[]);
        assert!(metrics.last_reload().unwrap().applied);
        let text = metrics.render(&crate::metrics::Gauges::default());
        for line in [
            "crossbar_config_reloads_total{result=\"applied\"} 1",
            "crossbar_config_reloads_total{result=\"refused\"} 1",
            "crossbar_config_last_reload_successful 1",
            "crossbar_config_last_reload_timestamp_seconds 0.009",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
    }
}
