//! `crossbar report`: what the accounting rows say, per route, host and API — requests, errors, tokens,
//! the share of prompt tokens the hosts' caches served, and time to first byte. Reads the db
//! directly (it works while crossbar runs: WAL), so it needs no running gateway.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::store::{unix_ms, Reader, RequestRow, StoreError};

mod keys;

/// Figures for one route, host and API over the window.
#[derive(Debug, Default, Clone, PartialEq, Serialize)]
pub struct Line {
    pub route: String,
    pub host: String,
    /// `chat`, `messages`, `responses`, `completion`, `stateless`, `other`; `-` for rows older
    /// than the column. Tokens mean the same in every API (see OPERATIONS.md).
    pub api: String,
    pub requests: u64,
    pub errors: u64,
    pub prompt_tokens: i64,
    pub cached_tokens: i64,
    pub completion_tokens: i64,
    /// cached / prompt over rows that report both; None when none do.
    pub cached_share: Option<f64>,
    pub ttfb_p50_ms: Option<i64>,
    pub ttfb_p95_ms: Option<i64>,
    /// New conversations placed where their prompt family was warm (issue 23)...
    pub family_first_turns: u64,
    /// ...and the prompt tokens their hosts served from cache: the first-turn prefill that family
    /// placement saved.
    pub family_saved_tokens: i64,
}

/// Reads the rows since `since` ago and renders the report (a table, or JSON).
pub fn run(
    db: &Path,
    since: Duration,
    route: Option<&str>,
    json: bool,
    by_key: bool,
) -> Result<String, StoreError> {
    // A missing file is Reader::open's error, naming it.
    let store = Reader::open(db)?;
    let from = unix_ms(SystemTime::now()) - since.as_millis() as i64;
    let rows = store.requests_since(from, route)?;
    if by_key {
        let lines = keys::summarize(&rows);
        return Ok(if json {
            serde_json::to_string_pretty(&lines).unwrap_or_default() + "\n"
        } else {
            keys::render(&lines, &pretty_window(since.as_secs_f64() / 3600.0))
        });
    }
    let lines = summarize(&rows);
    Ok(if json {
        serde_json::to_string_pretty(&lines).unwrap_or_default() + "\n"
    } else {
        render(&lines, since)
    })
}

/// Groups rows by route, host and API; an error is a status of 400 or more, or a recorded error.
pub fn summarize(rows: &[RequestRow]) -> Vec<Line> {
    // Per (route, host, api): the line, successful TTFBs, and prompt/cached sums over rows with both.
    type Group = (Line, Vec<i64>, i64, i64);
    let mut groups: BTreeMap<(String, String, String), Group> = BTreeMap::new();
    for row in rows {
        let host = if row.host.is_empty() { "-" } else { &row.host };
        let api = if row.api.is_empty() { "-" } else { &row.api };
        let (line, ttfbs, share_prompt, share_cached) = groups
            .entry((row.route.clone(), host.to_string(), api.to_string()))
            .or_insert_with(|| {
                let line = Line {
                    route: row.route.clone(),
                    host: host.to_string(),
                    api: api.to_string(),
                    ..Line::default()
                };
                (line, Vec::new(), 0, 0)
            });
        line.requests += 1;
        if row.status >= 400 || !row.err.is_empty() {
            line.errors += 1;
        } else {
            ttfbs.push(row.ttfb_ms);
        }
        // Upstream numbers: any size may be stored, and a report must not panic on them.
        let add = |total: &mut i64, n: Option<i64>| *total = total.saturating_add(n.unwrap_or(0));
        add(&mut line.prompt_tokens, row.prompt_tokens);
        add(&mut line.cached_tokens, row.cached_tokens);
        add(&mut line.completion_tokens, row.completion_tokens);
        if let (Some(p), Some(c)) = (row.prompt_tokens, row.cached_tokens) {
            add(share_prompt, Some(p));
            add(share_cached, Some(c));
        }
        if row.placed == "family" && row.status < 400 && row.err.is_empty() {
            line.family_first_turns += 1;
            add(&mut line.family_saved_tokens, row.cached_tokens);
        }
    }
    groups
        .into_values()
        .map(|(mut line, mut ttfbs, prompt, cached)| {
            ttfbs.sort_unstable();
            line.ttfb_p50_ms = percentile(&ttfbs, 50);
            line.ttfb_p95_ms = percentile(&ttfbs, 95);
            line.cached_share = (prompt > 0).then(|| cached as f64 / prompt as f64);
            line
        })
        .collect()
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[i64], p: usize) -> Option<i64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p * sorted.len()).div_ceil(100).max(1);
    Some(sorted[rank - 1])
}

fn render(lines: &[Line], since: Duration) -> String {
    let hours = since.as_secs_f64() / 3600.0;
    let mut out = format!("requests in the last {}\n", pretty_window(hours));
    if lines.is_empty() {
        out.push_str("no requests\n");
        return out;
    }
    let mut rows = vec![[
        "ROUTE",
        "HOST",
        "API",
        "REQUESTS",
        "ERRORS",
        "PROMPT",
        "CACHED",
        "COMPLETION",
        "CACHED%",
        "TTFB_P50",
        "TTFB_P95",
    ]
    .map(String::from)
    .to_vec()];
    let ms = |v: Option<i64>| v.map_or("-".to_string(), |v| format!("{v}ms"));
    for l in lines {
        // Requests refused before a route was known (no key, no or an unknown route): issue 48,
        // a blank cell.
        let route = if l.route.is_empty() {
            NO_ROUTE
        } else {
            &l.route
        };
        rows.push(vec![
            route.to_string(),
            l.host.clone(),
            l.api.clone(),
            l.requests.to_string(),
            l.errors.to_string(),
            l.prompt_tokens.to_string(),
            l.cached_tokens.to_string(),
            l.completion_tokens.to_string(),
            l.cached_share
                .map_or("-".to_string(), |s| format!("{:.1}%", s * 100.0)),
            ms(l.ttfb_p50_ms),
            ms(l.ttfb_p95_ms),
        ]);
    }
    out.push_str(&crate::table::table(&rows));
    let turns: u64 = lines.iter().map(|l| l.family_first_turns).sum();
    if turns > 0 {
        let saved = (lines.iter()).fold(0i64, |t, l| t.saturating_add(l.family_saved_tokens));
        out.push_str(&format!(
            "first-turn prefill saved by family placement: {saved} tokens over {turns} new \
             conversations placed where their prompt family was warm\n"
        ));
    }
    out
}

/// The ROUTE of rows refused before their route was known.
const NO_ROUTE: &str = "(no route)";

fn pretty_window(hours: f64) -> String {
    if hours >= 48.0 && hours % 24.0 == 0.0 {
        format!("{} days", hours / 24.0)
    } else if hours >= 1.0 {
        format!("{hours:.0}h")
    } else {
        format!("{:.0}m", hours * 60.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(
        route: &str,
        host: &str,
        status: u16,
        ttfb: i64,
        tokens: Option<(i64, i64, i64)>,
    ) -> RequestRow {
        RequestRow {
            route: route.into(),
            host: host.into(),
            status,
            ttfb_ms: ttfb,
            prompt_tokens: tokens.map(|t| t.0),
            cached_tokens: tokens.map(|t| t.1),
            completion_tokens: tokens.map(|t| t.2),
            ..RequestRow::default()
        }
    }

    #[test]
    fn rows_are_grouped_and_summed_per_route_and_host() {
        let rows = [
            row("a", "titan", 200, 10, Some((100, 0, 5))),
            row("a", "titan", 200, 30, Some((150, 99, 5))),
            row("a", "titan", 503, 0, None),
            row("a", "mini", 200, 20, Some((40, 39, 1))),
            row("b", "", 404, 0, None),
        ];
        let lines = summarize(&rows);
        assert_eq!(lines.len(), 3);
        let titan = lines
            .iter()
            .find(|l| l.route == "a" && l.host == "titan")
            .unwrap();
        assert_eq!((titan.requests, titan.errors), (3, 1));
        assert_eq!(
            (
                titan.prompt_tokens,
                titan.cached_tokens,
                titan.completion_tokens
            ),
            (250, 99, 10)
        );
        assert_eq!(titan.cached_share, Some(99.0 / 250.0));
        assert_eq!((titan.ttfb_p50_ms, titan.ttfb_p95_ms), (Some(10), Some(30)));
        let b = lines.iter().find(|l| l.route == "b").unwrap();
        assert_eq!(
            (b.host.as_str(), b.errors, b.cached_share, b.ttfb_p50_ms),
            ("-", 1, None, None)
        );
        assert_eq!(b.api, "-", "rows older than the api column");
    }

    #[test]
    fn each_api_has_its_own_line() {
        let mut rows = vec![
            row("a", "titan", 200, 10, Some((100, 0, 5))),
            row("a", "titan", 200, 10, Some((100, 90, 5))),
            row("a", "titan", 200, 10, Some((50, 0, 2))),
        ];
        rows[0].api = "messages".into();
        rows[1].api = "messages".into();
        rows[2].api = "responses".into();
        let lines = summarize(&rows);
        let apis: Vec<(&str, u64, i64)> = lines
            .iter()
            .map(|l| (l.api.as_str(), l.requests, l.cached_tokens))
            .collect();
        assert_eq!(apis, [("messages", 2, 90), ("responses", 1, 0)]);
        assert!(render(&lines, Duration::from_secs(3600)).contains("API"));
    }

    /// Issue 23: the first-turn prefill family placement saved, per line and in the table's foot.
    #[test]
    fn first_turns_placed_for_their_family_count_what_they_saved() {
        let mut rows = vec![
            row("a", "titan", 200, 10, Some((9000, 8000, 5))),
            row("a", "titan", 200, 10, Some((9000, 7990, 5))),
            row("a", "titan", 200, 10, Some((9100, 9050, 5))),
            row("a", "titan", 502, 10, Some((9000, 8000, 0))),
        ];
        rows[0].placed = "family".into();
        rows[1].placed = "family".into();
        rows[2].placed = "sticky".into();
        rows[3].placed = "family".into();
        let lines = summarize(&rows);
        assert_eq!(
            (lines[0].family_first_turns, lines[0].family_saved_tokens),
            (2, 15990)
        );
        let text = render(&lines, Duration::from_secs(3600));
        assert!(
            text.contains("first-turn prefill saved by family placement: 15990 tokens over 2"),
            "{text}"
        );
        let none = render(&summarize(&rows[2..3]), Duration::from_secs(3600));
        assert!(!none.contains("family placement"), "{none}");
    }

    /// Review finding: upstream-reported counts were summed unchecked (a panic in debug builds).
    #[test]
    fn huge_token_counts_saturate() {
        let big = Some((i64::MAX, i64::MAX, i64::MAX));
        let lines = summarize(&[row("a", "t", 200, 1, big), row("a", "t", 200, 1, big)]);
        assert_eq!(
            (
                lines[0].prompt_tokens,
                lines[0].cached_tokens,
                lines[0].completion_tokens
            ),
            (i64::MAX, i64::MAX, i64::MAX)
        );
        assert_eq!(lines[0].cached_share, Some(1.0));
    }

    #[test]
    fn percentiles_use_nearest_rank() {
        let v: Vec<i64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50), Some(50));
        assert_eq!(percentile(&v, 95), Some(95));
        assert_eq!(percentile(&[7], 95), Some(7));
        assert_eq!(percentile(&[], 50), None);
    }
}
