//! `crossbar report --by key` (issue 25): who used what — requests, refusals and tokens per client
//! key, by its configured name (`-` for requests that came with none).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::store::RequestRow;

/// One client key's figures over the window.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct KeyLine {
    pub key: String,
    pub requests: u64,
    /// Answered 401, 403 or 429: refused by the key's own checks or limits.
    pub refused: u64,
    pub errors: u64,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
}

pub fn summarize(rows: &[RequestRow]) -> Vec<KeyLine> {
    let mut lines: BTreeMap<&str, KeyLine> = BTreeMap::new();
    for row in rows {
        let key = if row.key.is_empty() { "-" } else { &row.key };
        let line = lines.entry(key).or_insert_with(|| KeyLine {
            key: key.to_string(),
            ..KeyLine::default()
        });
        line.requests += 1;
        if matches!(row.status, 401 | 403 | 429) {
            line.refused += 1;
        } else if row.status >= 400 || !row.err.is_empty() {
            line.errors += 1;
        }
        let add = |total: &mut i64, n: Option<i64>| *total = total.saturating_add(n.unwrap_or(0));
        add(&mut line.prompt_tokens, row.prompt_tokens);
        add(&mut line.completion_tokens, row.completion_tokens);
    }
    lines.into_values().collect()
}

pub fn render(lines: &[KeyLine], window: &str) -> String {
    let mut out = format!("requests per client key in the last {window}\n");
    if lines.is_empty() {
        out.push_str("no requests\n");
        return out;
    }
    let mut rows = vec![[
        "KEY",
        "REQUESTS",
        "REFUSED",
        "ERRORS",
        "PROMPT",
        "COMPLETION",
    ]
    .map(String::from)
    .to_vec()];
    for l in lines {
        rows.push(vec![
            l.key.clone(),
            l.requests.to_string(),
            l.refused.to_string(),
            l.errors.to_string(),
            l.prompt_tokens.to_string(),
            l.completion_tokens.to_string(),
        ]);
    }
    out.push_str(&crate::table::table(&rows));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_key_has_its_line_and_refusals_are_counted_apart() {
        let row = |key: &str, status, tokens: Option<(i64, i64)>| RequestRow {
            key: key.into(),
            status,
            prompt_tokens: tokens.map(|t| t.0),
            completion_tokens: tokens.map(|t| t.1),
            ..RequestRow::default()
        };
        let rows = [
            row("alice", 200, Some((100, 10))),
            row("alice", 200, Some((50, 5))),
            row("alice", 429, None),
            row("ci", 502, None),
            row("", 401, None),
        ];
        let lines = summarize(&rows);
        let alice = &lines[1];
        assert_eq!(lines[0].key, "-");
        assert_eq!(
            (
                alice.requests,
                alice.refused,
                alice.errors,
                alice.prompt_tokens,
                alice.completion_tokens
            ),
            (3, 1, 0, 150, 15)
        );
        assert_eq!((lines[2].key.as_str(), lines[2].errors), ("ci", 1));
        let text = render(&lines, "24h");
        assert!(text.contains("KEY") && text.contains("alice"), "{text}");
    }
}
