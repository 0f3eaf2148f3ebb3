//! Small inline-SVG charts for the status page: one value per minute over the last hour, drawn as
//! bars or lines with their scale written on them. No script, no external asset. Pure text.

use std::fmt::Write;

const W: f64 = 280.0;
const H: f64 = 72.0;
/// Left and top margins; the plot is the rest, minus a bottom strip for the time axis.
const LEFT: f64 = 4.0;
const TOP: f64 = 14.0;
const BOTTOM: f64 = 12.0;

/// One series of a line chart: a value per minute (`None`: no data that minute), its colour and
/// its legend name.
pub struct Series<'a> {
    pub values: &'a [Option<f64>],
    pub color: &'static str,
    pub name: &'static str,
}

/// A bar chart of `values` (one per minute, oldest first) titled `title`.
pub fn bars(title: &str, values: &[f64], color: &str) -> String {
    let max = values.iter().copied().fold(0.0, f64::max);
    let mut out = frame(title, &format_scale(max, ""));
    let n = values.len().max(1) as f64;
    let step = (W - LEFT * 2.0) / n;
    for (i, v) in values.iter().enumerate() {
        if *v <= 0.0 || max <= 0.0 {
            continue;
        }
        let h = (H - TOP - BOTTOM) * v / max;
        let _ = write!(
            out,
            "<rect x='{:.1}' y='{:.1}' width='{:.1}' height='{:.1}' fill='{color}'/>",
            LEFT + i as f64 * step,
            H - BOTTOM - h,
            (step - 1.0).max(1.0),
            h
        );
    }
    out.push_str("</svg>");
    out
}

/// A line chart of one or more series over `0..=max` (`max` from the data when `None`); `unit`
/// follows the scale label. Minutes without data break the line.
pub fn lines(title: &str, series: &[Series<'_>], max: Option<f64>, unit: &str) -> String {
    let max = max.unwrap_or_else(|| {
        series
            .iter()
            .flat_map(|s| s.values.iter().flatten().copied())
            .fold(0.0, f64::max)
    });
    let mut out = frame(title, &format_scale(max, unit));
    let mut legend_x = W - LEFT;
    for s in series.iter().rev() {
        let _ = write!(
            out,
            "<text x='{legend_x:.0}' y='10' text-anchor='end' fill='{}'>{}</text>",
            s.color, s.name
        );
        legend_x -= 8.0 * s.name.len() as f64 + 6.0;
        let n = s.values.len().max(2) as f64;
        let step = (W - LEFT * 2.0) / (n - 1.0);
        let mut run = Vec::new();
        let flush = |run: &mut Vec<(f64, f64)>, out: &mut String| {
            match run.len() {
                0 => {}
                1 => {
                    let _ = write!(
                        out,
                        "<circle cx='{:.1}' cy='{:.1}' r='1.8' fill='{}'/>",
                        run[0].0, run[0].1, s.color
                    );
                }
                _ => {
                    let points: Vec<String> =
                        run.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
                    let _ = write!(
                        out,
                        "<polyline fill='none' stroke='{}' stroke-width='1.5' points='{}'/>",
                        s.color,
                        points.join(" ")
                    );
                }
            }
            run.clear();
        };
        for (i, v) in s.values.iter().enumerate() {
            match v {
                Some(v) if max > 0.0 => {
                    let y = H - BOTTOM - (H - TOP - BOTTOM) * (v / max).clamp(0.0, 1.0);
                    run.push((LEFT + i as f64 * step, y));
                }
                _ => flush(&mut run, &mut out),
            }
        }
        flush(&mut run, &mut out);
    }
    out.push_str("</svg>");
    out
}

/// The SVG head, the plot box, the title, the scale label and the time axis.
fn frame(title: &str, scale: &str) -> String {
    let mut out = String::with_capacity(2048);
    let _ = write!(
        out,
        "<svg xmlns='http://www.w3.org/2000/svg' width='{W}' height='{H}' viewBox='0 0 {W} {H}' \
         role='img' font-family='system-ui,sans-serif' font-size='10'><title>{title}</title>\
         <rect x='{LEFT}' y='{TOP}' width='{}' height='{}' fill='#fff' stroke='#e4e4e4'/>\
         <text x='{LEFT}' y='10' fill='#444'>{title} <tspan fill='#888'>max {scale}</tspan></text>\
         <text x='{LEFT}' y='{}' fill='#999'>−60 min</text>\
         <text x='{}' y='{}' text-anchor='end' fill='#999'>now</text>",
        W - LEFT * 2.0,
        H - TOP - BOTTOM,
        H - 2.0,
        W - LEFT,
        H - 2.0
    );
    out
}

/// `1.2k`, `35`, `0.4` with the unit after it.
fn format_scale(max: f64, unit: &str) -> String {
    let text = if max >= 10_000.0 {
        format!("{:.0}k", max / 1000.0)
    } else if max >= 1000.0 {
        format!("{:.1}k", max / 1000.0)
    } else if max >= 10.0 || max == 0.0 {
        format!("{max:.0}")
    } else {
        format!("{max:.1}")
    };
    format!("{text}{unit}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_scale_to_the_largest_value_and_skip_empty_minutes() {
        let svg = bars("requests", &[0.0, 2.0, 4.0], "#36c");
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert_eq!(svg.matches("<rect").count(), 1 + 2, "frame + two bars");
        assert!(svg.contains("max 4"));
    }

    #[test]
    fn lines_break_where_minutes_have_no_data() {
        let values = [Some(0.5), Some(1.0), None, Some(0.2)];
        let svg = lines(
            "cached",
            &[Series {
                values: &values,
                color: "#0a7",
                name: "share",
            }],
            Some(1.0),
            "",
        );
        assert_eq!(svg.matches("<polyline").count(), 1, "{svg}");
        assert_eq!(svg.matches("<circle").count(), 1, "{svg}");
    }

    #[test]
    fn scales_read_short() {
        assert_eq!(format_scale(12_345.0, " ms"), "12k ms");
        assert_eq!(format_scale(1_234.0, ""), "1.2k");
        assert_eq!(format_scale(0.25, ""), "0.2");
    }
}
