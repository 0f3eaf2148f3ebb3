//! The benchmark's output: the console table, the ratios, the section of docs/BENCHMARKS.md between
//! its `affinity` markers, docs/affinity.png (drawn by gnuplot) and the last line for scripts.

use std::fmt::Write as _;
use std::io::Write as _;
use std::ops::Range;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::figures::{ratio, show_ratio, Figures};
use crate::frontend::Kind;
use crate::workload::Shape;
use crate::{Row, SCENARIOS};

const COLUMNS: [&str; 13] = [
    "scenario",
    "front end",
    "prefilled",
    "/oracle",
    "history re-prefilled",
    "host changes",
    "cached",
    "TTFB mean ms",
    "TTFB p95 ms",
    "turns/s",
    "failed attempts",
    "lost turns",
    "turns per host",
];

fn cells(row: &Row, oracle: Option<&Figures>) -> [String; 13] {
    let f = &row.figures;
    let vs_oracle = oracle.map_or("-".to_string(), |o| {
        show_ratio(ratio(f.prefilled, o.prefilled))
    });
    [
        row.scenario.to_string(),
        row.kind.name().to_string(),
        f.prefilled.to_string(),
        vs_oracle,
        f.history_reprefilled.to_string(),
        f.moves.to_string(),
        format!("{:.1}%", 100.0 * f.cached_share()),
        format!("{:.1}", f.ttfb_mean_ms),
        format!("{:.1}", f.ttfb_p95_ms),
        format!("{:.2}", f.turns_per_s),
        f.failed_attempts.to_string(),
        f.lost_turns.to_string(),
        row.per_host
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join("/"),
    ]
}

const WIDTHS: [usize; 13] = [8, 9, 9, 7, 20, 12, 6, 12, 11, 7, 15, 10, 14];

pub fn header() -> String {
    let cols: Vec<String> = COLUMNS
        .iter()
        .zip(WIDTHS)
        .map(|(c, w)| format!("{c:>w$}"))
        .collect();
    cols.join(" ")
}

/// The console line for `row`; the oracle's figures come from the `earlier` rows (it runs first).
pub fn line(row: &Row, earlier: &[Row]) -> String {
    let oracle = find(earlier, row.scenario, Kind::Oracle);
    let cols: Vec<String> = cells(row, oracle)
        .iter()
        .zip(WIDTHS)
        .map(|(c, w)| format!("{c:>w$}"))
        .collect();
    cols.join(" ")
}

fn find<'a>(rows: &'a [Row], scenario: &str, kind: Kind) -> Option<&'a Figures> {
    rows.iter()
        .find(|r| r.scenario == scenario && r.kind == kind)
        .map(|r| &r.figures)
}

/// The ratios the issue asks for, per scenario, and what each front end lost to the killed host.
pub fn ratios(rows: &[Row]) -> Vec<String> {
    let mut out = Vec::new();
    for s in SCENARIOS {
        let get = |k| find(rows, s.name, k);
        let (Some(cb), Some(oracle)) = (get(Kind::Crossbar), get(Kind::Oracle)) else {
            continue;
        };
        let mut text = format!(
            "{:<6}  prefilled crossbar/oracle {}",
            s.name,
            show_ratio(ratio(cb.prefilled, oracle.prefilled))
        );
        // The fewest any router could prefill, from the oracle's own turns, the shared prompt's
        // size as any front end's turns showed it (see `figures.rs`).
        let shared = (rows.iter().filter(|r| r.scenario == s.name))
            .map(|r| r.figures.floor.shared)
            .max()
            .unwrap_or(0);
        if let Some(floor) = oracle.floor.with_shared(shared).tokens() {
            let floor = show_ratio(ratio(floor, oracle.prefilled));
            let _ = write!(text, "  floor/oracle {floor}");
        }
        for k in [Kind::RoundRobin, Kind::LeastConn, Kind::Smg] {
            if let Some(f) = get(k) {
                let _ = write!(
                    text,
                    "  {}/crossbar: prefilled {} history {}",
                    k.name(),
                    show_ratio(ratio(f.prefilled, cb.prefilled)),
                    show_ratio(ratio(f.history_reprefilled, cb.history_reprefilled))
                );
            }
        }
        out.push(text);
    }
    for k in Kind::ALL {
        let (Some(base), Some(hit)) = (find(rows, "roomy", k), find(rows, "killed", k)) else {
            continue;
        };
        out.push(format!(
            "killed  {:<9} lost {:+} prefilled tokens ({:+.1}%), {} failed attempts, {} turns",
            k.name(),
            hit.prefilled as i64 - base.prefilled as i64,
            100.0 * (ratio(hit.prefilled, base.prefilled) - 1.0),
            hit.failed_attempts,
            hit.lost_turns
        ));
    }
    out
}

/// `affinity crossbar_over_oracle=.. rr_over_crossbar=..` for the roomy scenario.
pub fn last_line(rows: &[Row]) -> String {
    let get = |k| find(rows, "roomy", k).cloned().unwrap_or_default();
    let (cb, oracle, rr) = (
        get(Kind::Crossbar),
        get(Kind::Oracle),
        get(Kind::RoundRobin),
    );
    format!(
        "affinity crossbar_over_oracle={} rr_over_crossbar={}",
        show_ratio(ratio(cb.prefilled, oracle.prefilled)),
        show_ratio(ratio(rr.history_reprefilled, cb.history_reprefilled))
    )
}

const BEGIN: &str = "<!-- affinity:begin (written by `make bench-affinity`) -->";
const END: &str = "<!-- affinity:end -->";

/// Rewrites the marked section of docs/BENCHMARKS.md (appending it the first time) and draws
/// docs/affinity.png. Returns what was written.
pub fn write_docs(
    root: &Path,
    rows: &[Row],
    hosts: usize,
    shape: &Shape,
    seeds: Range<u64>,
) -> Result<String, String> {
    let md_path = root.join("docs/BENCHMARKS.md");
    let old =
        std::fs::read_to_string(&md_path).map_err(|e| format!("{}: {e}", md_path.display()))?;
    let section = markdown(rows, hosts, shape, seeds);
    let new = match (old.find(BEGIN), old.find(END)) {
        (Some(b), Some(e)) if b < e => format!("{}{section}{}", &old[..b], &old[e + END.len()..]),
        _ => format!("{}\n{section}\n", old.trim_end()),
    };
    std::fs::write(&md_path, new).map_err(|e| format!("{}: {e}", md_path.display()))?;
    let png = root.join("docs/affinity.png");
    chart(rows, &png)?;
    Ok(format!("{} and {}", md_path.display(), png.display()))
}

fn markdown(rows: &[Row], hosts: usize, shape: &Shape, seeds: Range<u64>) -> String {
    let mut s = format!("{BEGIN}\n\n");
    let starts = if shape.random_starts {
        "at random moments"
    } else {
        "in order"
    };
    let _ = writeln!(
        s,
        "{hosts} hosts, {} conversations x {} turns starting {starts}, seeds {}..={} \
         (figures summed over seeds).\n",
        shape.conversations,
        shape.turns,
        seeds.start,
        seeds.end - 1
    );
    let _ = writeln!(s, "| {} |", COLUMNS.join(" | "));
    let _ = writeln!(s, "|{}", "---|".repeat(COLUMNS.len()));
    for row in rows {
        let oracle = find(rows, row.scenario, Kind::Oracle);
        let mut c = cells(row, oracle);
        if !row.killed.is_empty() {
            let hosts: Vec<String> = row.killed.iter().map(|h| format!("h{h}")).collect();
            c[0] = format!("killed ({})", hosts.join(","));
        }
        let _ = writeln!(s, "| {} |", c.join(" | "));
    }
    s.push_str("\n```\n");
    for line in ratios(rows) {
        let _ = writeln!(s, "{line}");
    }
    let _ = writeln!(s, "{}\n```\n", last_line(rows));
    s.push_str("![prefilled and history re-prefilled tokens per front end](affinity.png)\n\n");
    s.push_str(END);
    s
}

/// Two panels of clustered bars (scenario x front end): prompt tokens prefilled, and history
/// re-prefilled. gnuplot reads the data inline from stdin.
fn chart(rows: &[Row], png: &Path) -> Result<(), String> {
    let data = |value: fn(&Figures) -> u64| {
        let mut d = String::new();
        for s in SCENARIOS {
            let _ = write!(d, "{}", s.name);
            for k in Kind::ALL {
                let v = find(rows, s.name, k).map_or(0, value);
                let _ = write!(d, " {}", v as f64 / 1000.0);
            }
            d.push('\n');
        }
        d.push_str("e\n");
        d
    };
    let prefilled = data(|f| f.prefilled);
    let history = data(|f| f.history_reprefilled);
    let titles: Vec<String> = Kind::ALL.iter().map(|k| k.name().to_string()).collect();
    let plot = |title: &str, d: &str| {
        let series: Vec<String> = titles
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let using = if i == 0 {
                    "2:xtic(1)".to_string()
                } else {
                    format!("{}", i + 2)
                };
                format!("'-' using {using} title '{t}'")
            })
            .collect();
        format!(
            "set title '{title}'\nplot {}\n{}",
            series.join(", "),
            d.repeat(titles.len())
        )
    };
    let script = format!(
        "set terminal pngcairo size 1100,450 font 'sans,10'\nset output '{}'\n\
         set style data histograms\nset style histogram clustered gap 1\n\
         set style fill solid 0.85 border -1\nset ylabel 'thousand tokens'\nset yrange [0:*]\n\
         set key top left\nset grid ytics\nset multiplot layout 1,2\n{}{}unset multiplot\n",
        png.display(),
        plot("prompt tokens prefilled (lower is better)", &prefilled),
        plot("history re-prefilled (lower is better)", &history),
    );
    let mut child = Command::new("gnuplot")
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("gnuplot: {e} (make bench-affinity installs gnuplot-nox)"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .map_err(|e| e.to_string())?;
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("gnuplot: {}", String::from_utf8_lossy(&out.stderr)))
    }
}
