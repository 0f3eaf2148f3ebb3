//! The agents workload's output: one console table per scenario (a row per front end, then the
//! family floor) and the machine-readable last line. Pure formatting: numbers in, text out.

use crate::agents_run::{Front, Sample};
use crate::figures::{figures, ratio, show_ratio, Figures};

/// One front end's figures in one scenario, or the family floor (`front: None`: only `prefilled`).
#[derive(Debug, Clone)]
pub struct Row {
    pub scenario: &'static str,
    pub front: Option<Front>,
    pub figures: Figures,
    /// Completions each host ran.
    pub per_host: Vec<u64>,
    /// Per host: conversations (main, sub-agent) whose first answered turn it served.
    pub placed: Vec<[u64; 2]>,
    /// `GET /v1/models` answers the UI got.
    pub listings: u64,
    /// Tokens prefilled by conversations' first turns (their family prefix, where it was cold).
    pub first_turns: u64,
}

impl Row {
    /// Prefilled and cached tokens are the clients' sums of `timings` over answered turns.
    pub fn new(scenario: &'static str, front: Option<Front>, s: &Sample) -> Row {
        let facts: Vec<_> = s.turns.iter().map(|t| t.facts).collect();
        let ok = facts.iter().filter(|t| t.ok);
        let prompt_n = ok.clone().map(|t| t.prompt_n).sum();
        let cache_n = ok.clone().map(|t| t.cache_n).sum();
        let first_turns = ok.filter(|t| t.prev_prompt == 0).map(|t| t.prompt_n).sum();
        Row {
            scenario,
            front,
            figures: figures(&facts, prompt_n, cache_n, s.wall_s),
            per_host: s.per_host.clone(),
            placed: s.placed.clone(),
            listings: s.listings,
            first_turns,
        }
    }

    pub fn floor(scenario: &'static str, prefilled: u64) -> Row {
        Row {
            scenario,
            front: None,
            figures: Figures {
                prefilled,
                ..Figures::default()
            },
            per_host: Vec::new(),
            placed: Vec::new(),
            listings: 0,
            first_turns: 0,
        }
    }

    fn name(&self) -> &'static str {
        self.front.map_or("family floor", Front::name)
    }
}

const COLUMNS: [&str; 15] = [
    "scenario",
    "front end",
    "prefilled",
    "/oracle",
    "first turns",
    "history again",
    "cached",
    "TTFB mean ms",
    "TTFB p95 ms",
    "failed attempts",
    "lost turns",
    "host changes",
    "completions per host",
    "conversations per host (main+sub)",
    "UI listings",
];
const WIDTHS: [usize; 15] = [8, 13, 9, 7, 11, 13, 6, 12, 11, 15, 10, 12, 20, 33, 11];

pub fn header() -> String {
    join(COLUMNS.map(String::from))
}

/// The console line for `row`; the sticky oracle's figures come from the `earlier` rows.
pub fn line(row: &Row, earlier: &[Row]) -> String {
    let f = &row.figures;
    let vs_oracle = find(earlier, row.scenario, Front::Oracle).map_or("-".to_string(), |o| {
        show_ratio(ratio(f.prefilled, o.prefilled))
    });
    let mut c = [
        row.scenario.to_string(),
        row.name().to_string(),
        f.prefilled.to_string(),
        vs_oracle,
        row.first_turns.to_string(),
        f.history_reprefilled.to_string(),
        format!("{:.1}%", 100.0 * f.cached_share()),
        format!("{:.1}", f.ttfb_mean_ms),
        format!("{:.1}", f.ttfb_p95_ms),
        f.failed_attempts.to_string(),
        f.lost_turns.to_string(),
        f.moves.to_string(),
        slash(row.per_host.iter().map(u64::to_string)),
        slash(row.placed.iter().map(|[m, s]| format!("{m}+{s}"))),
        row.listings.to_string(),
    ];
    if row.front.is_none() {
        // Computed, not run: only the prefill means anything.
        for cell in &mut c[4..] {
            *cell = "-".to_string();
        }
    }
    join(c)
}

/// `affinity-agents crossbar_over_oracle=.. family_oracle_over_oracle=.. floor_over_oracle=..
/// crossbar_ttfb_p95_ms=.. oracle_ttfb_p95_ms=.. smg_over_oracle=.. smg_ttfb_p95_ms=..` for the
/// first scenario run (`defaults` unless `--only`; `-` for a front end that did not run), then
/// the workload and scenario.
pub fn last_line(rows: &[Row], small: bool) -> String {
    let scenario = rows.first().map_or("none", |r| r.scenario);
    let get = |front: Option<Front>| {
        rows.iter()
            .find(|r| r.scenario == scenario && r.front == front)
            .map(|r| r.figures.clone())
    };
    let oracle = get(Some(Front::Oracle)).unwrap_or_default();
    let over = |front| {
        get(front).map_or("-".to_string(), |f| {
            show_ratio(ratio(f.prefilled, oracle.prefilled))
        })
    };
    let p95 = |front| get(Some(front)).map_or("-".to_string(), |f| format!("{:.1}", f.ttfb_p95_ms));
    format!(
        "affinity-agents crossbar_over_oracle={} family_oracle_over_oracle={} floor_over_oracle={} \
         crossbar_ttfb_p95_ms={} oracle_ttfb_p95_ms={} smg_over_oracle={} smg_ttfb_p95_ms={} \
         workload={} scenario={scenario}",
        over(Some(Front::Crossbar)),
        over(Some(Front::Family)),
        over(None),
        p95(Front::Crossbar),
        p95(Front::Oracle),
        over(Some(Front::Smg)),
        p95(Front::Smg),
        if small { "agents-small" } else { "agents" },
    )
}

fn find<'a>(rows: &'a [Row], scenario: &str, front: Front) -> Option<&'a Figures> {
    rows.iter()
        .find(|r| r.scenario == scenario && r.front == Some(front))
        .map(|r| &r.figures)
}

fn slash(parts: impl Iterator<Item = String>) -> String {
    parts.collect::<Vec<_>>().join("/")
}

fn join(cells: [String; 15]) -> String {
    let cols: Vec<String> = cells
        .iter()
        .zip(WIDTHS)
        .map(|(c, w)| format!("{c:>w$}"))
        .collect();
    cols.join(" ")
}
