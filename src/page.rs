//! The status page at the admin listener's `/`: one self-contained HTML document (no scripts, no
//! external assets) rendered on the server from live state, refreshing itself every few seconds:
//! the "served from cache" headline, per-host charts of the last hour (inline SVG, `chart`), and
//! tables of hosts, routes, leases and recent requests.

mod chart;

use std::fmt::Write;

use crate::fingerprint;
use crate::metrics::HourView;
use crate::state::Gateway;

/// Seconds between the page's own refreshes.
const REFRESH_S: u32 = 5;
/// Recent requests shown.
const RECENT: usize = 20;

pub(crate) const STYLE: &str =
    "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}\
h1{font-size:1.3em;margin:0 0 .2em}h2{font-size:1.05em;margin:1.4em 0 .4em}\
table{border-collapse:collapse;background:#fff;box-shadow:0 0 0 1px #ddd;max-width:100%}\
th,td{padding:.3em .8em;text-align:left;border-bottom:1px solid #eee;white-space:nowrap}\
td.w{white-space:normal;overflow-wrap:anywhere;min-width:7em;max-width:26em}td.h{min-width:13em}\
th{white-space:normal}\
th{background:#f0f0f0;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}\
.up{color:#0a7a2f;font-weight:600}.down{color:#b3261e;font-weight:600}.warn{color:#9a6700}\
.muted{color:#777}code{font-size:.95em}\
.headline{font-size:1.25em;margin:.6em 0 .2em}.headline b{color:#0a5a8a}\
.host{display:flex;gap:.8em;align-items:flex-end;flex-wrap:wrap;margin:.4em 0 .9em}\
.host .name{min-width:11em}svg{background:#fff;box-shadow:0 0 0 1px #ddd}";

/// Renders the page.
pub fn render(gw: &Gateway, now: i64) -> String {
    let config = gw.config();
    let snapshot = gw.leases.snapshot();
    let per_host = gw.leases.per_host();
    let slots = gw.limiter.snapshot();
    let mut out = String::with_capacity(16 * 1024);
    let _ = write!(
        out,
        "<!doctype html><html lang=en><head><meta charset=utf-8>\
         <meta http-equiv=refresh content={REFRESH_S}><title>crossbar</title><style>{STYLE}</style></head><body>\
         <h1>crossbar</h1><div class=muted>{} hosts · {} routes · {} leases · refreshes every {REFRESH_S}s · \
         crossbar {}{}</div>",
        config.hosts.len(),
        config.routes.len(),
        snapshot.len(),
        esc(&crate::version::describe()),
        reloaded(gw, now)
    );
    refused_reload(gw, now, &mut out);
    let store = gw.store.status();
    if !store.ok {
        let _ = write!(
            out,
            "<p><span class=down>store failing</span> since {}: {} — new conversations get 503 \
             until a write succeeds</p>",
            esc(&ago(now - store.since)),
            esc(&store.cause)
        );
    }
    let hours: Vec<(&str, HourView)> = config
        .hosts
        .keys()
        .map(|h| (h.as_str(), gw.metrics.hour(h, now)))
        .collect();
    headline(&mut out, &hours);

    out.push_str(
        "<h2>Hosts</h2><table><tr><th>host</th><th>state</th><th>per-slot ctx</th><th>models loaded</th>\
         <th>slots busy / total</th><th>queued</th><th>leases</th><th>tokens held / capacity</th>\
         <th>warm prompt families</th></tr>",
    );
    for host in config.hosts.values() {
        let status = gw.health.get(&host.name);
        let state = match &status {
            Some(s) if s.healthy => "<span class=up>up</span>".to_string(),
            Some(s) => format!(
                "<span class=down>down</span> {}",
                esc(&s.reason.as_ref().map_or(String::new(), |r| r.to_string()))
            ),
            None => "<span class=muted>unknown</span>".to_string(),
        };
        let state = if gw.drains.contains(&host.name) {
            format!("{state} <span class=warn>draining</span>")
        } else {
            state
        };
        let mine: Vec<_> = slots.iter().filter(|s| s.host == host.name).collect();
        let busy: usize = mine.iter().map(|s| s.in_flight).sum();
        let total: usize = (host.models.keys()).map(|m| gw.seats(&host.name, m)).sum();
        let queued: usize = mine.iter().map(|s| s.queued).sum();
        let pinned = (host.models.keys())
            .filter_map(|m| gw.pinned_slots(host, m))
            .map(|m| format!(" <span class=muted>{}</span>", m.summary()))
            .collect::<String>();
        let ctx = gw
            .health
            .per_slot_ctx(&host.name)
            .map_or("?".to_string(), |c| c.to_string());
        // A router: each model with its state and its own per-slot context.
        let loaded = match status {
            Some(s) if s.router => (s.models.iter())
                .map(|m| {
                    let name = m.names.first().map_or("?", String::as_str);
                    let ctx = m.per_slot_ctx.map_or("?".to_string(), |c| c.to_string());
                    format!("{name} {} (ctx {ctx})", m.state)
                })
                .collect::<Vec<_>>()
                .join(", "),
            Some(s) => s.loaded.join(", "),
            None => String::new(),
        };
        let leases = per_host.get(&host.name).copied().unwrap_or(0);
        // What placement sees (issue 23), summed over the host's models.
        let (mut held, mut capacity, mut warm) = (0, 0, Vec::new());
        for model in host.models.keys() {
            let (h, c) = gw.held(&host.name, model);
            (held, capacity) = (held + h, capacity + c);
            warm.extend(gw.holdings.warm_on(&host.name, model));
        }
        let capacity = if capacity == 0 {
            "?".to_string()
        } else {
            group(capacity)
        };
        let families = (warm.iter().take(4))
            .map(|(f, tokens)| format!("{} ({} tok)", f.hex(), group(*tokens)))
            .collect::<Vec<_>>()
            .join(", ");
        let more = warm.len().saturating_sub(4);
        let families = if more > 0 {
            format!("{families} +{more}")
        } else {
            families
        };
        let _ = write!(
            out,
            "<tr><td class=\"w h\"><b>{}</b><br><span class=muted>{}</span></td><td class=w>{state}</td><td class=n>{ctx}</td>\
             <td class=w>{}</td><td class=n>{busy} / {total}{pinned}</td><td class=n>{queued}</td><td class=n>{leases}</td>\
             <td class=n>{} / {capacity}</td><td class=w>{}</td></tr>",
            esc(&host.name),
            esc(&host.url),
            esc(&loaded),
            group(held),
            esc(&families)
        );
    }
    out.push_str("</table>");
    last_hour(&mut out, &hours);

    out.push_str("<h2>Routes</h2><table><tr><th>route</th><th>candidates</th><th>model</th><th>pinned to</th><th>leases</th></tr>");
    let pins = gw.leases.pins();
    for route in config.routes.values() {
        let pin = pins
            .iter()
            .find(|(r, _)| r == &route.name)
            .map_or("", |(_, h)| h.as_str());
        let leases = snapshot
            .iter()
            .filter(|l| l.key.route == route.name)
            .count();
        let _ = write!(
            out,
            "<tr><td><b>{}</b></td><td>{}</td><td>{}</td><td>{}</td><td class=n>{leases}</td></tr>",
            esc(&route.name),
            esc(&route.hosts.join(", ")),
            esc(&route.model),
            esc(pin)
        );
    }
    out.push_str("</table>");

    out.push_str("<h2>Leases</h2><table><tr><th>route</th><th>conversation</th><th>model</th><th>host</th><th>idle</th></tr>");
    for lease in snapshot.iter().take(200) {
        let fp = if lease.key.fp.is_empty() {
            "(route)"
        } else {
            fingerprint::short(&lease.key.fp)
        };
        let _ = write!(
            out,
            "<tr><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td class=n>{}</td></tr>",
            esc(&lease.key.route),
            esc(fp),
            esc(&lease.key.model),
            esc(&lease.host),
            ago(now - lease.last_used)
        );
    }
    out.push_str("</table>");

    api_table(gw, &mut out);
    keys_table(gw, now, &mut out);

    recent_requests(gw, now, &mut out);
    out.push_str("</body></html>\n");
    out
}

/// The last [`RECENT`] rows, with what makes stickiness visible (issue 48): each request's
/// conversation, where it was placed and why (`sticky` is its own lease), and its client key.
fn recent_requests(gw: &Gateway, now: i64, out: &mut String) {
    let keyed = !gw.config().keys.is_empty();
    let _ = write!(
        out,
        "<h2>Recent requests</h2><table><tr><th>when</th><th>route</th><th>api</th>{}\
         <th>conversation</th><th>host</th><th>placed</th><th>status</th><th>queued ms</th>\
         <th>ttfb ms</th><th>total ms</th><th>prompt</th><th>cached</th><th>cached share</th>\
         <th>completion</th></tr>",
        if keyed { "<th>key</th>" } else { "" }
    );
    match gw.store.recent_requests(RECENT) {
        Ok(rows) => {
            for row in rows {
                let share = match (row.prompt_tokens, row.cached_tokens) {
                    (Some(p), Some(c)) if p > 0 => format!("{:.0}%", c as f64 * 100.0 / p as f64),
                    _ => "-".to_string(),
                };
                let tokens = |t: Option<i64>| t.map_or("-".to_string(), |n| n.to_string());
                let class = if row.status >= 400 { " class=down" } else { "" };
                let dash = |s: &str| {
                    if s.is_empty() {
                        "-".to_string()
                    } else {
                        esc(s)
                    }
                };
                let key = if keyed {
                    format!("<td>{}</td>", dash(&row.key))
                } else {
                    String::new()
                };
                let _ = write!(
                    out,
                    "<tr><td>{} ago</td><td>{}</td><td>{}</td>{key}<td><code>{}</code></td><td>{}</td>\
                     <td>{}</td><td{class}>{}</td><td class=n>{}</td>\
                     <td class=n>{}</td><td class=n>{}</td><td class=n>{}</td><td class=n>{}</td><td class=n>{share}</td>\
                     <td class=n>{}</td></tr>",
                    ago(now - row.started),
                    dash(&row.route),
                    dash(&row.api),
                    dash(fingerprint::short(&row.fp)),
                    dash(&row.host),
                    dash(&row.placed),
                    row.status,
                    row.queued_ms,
                    row.ttfb_ms,
                    row.total_ms,
                    tokens(row.prompt_tokens),
                    tokens(row.cached_tokens),
                    tokens(row.completion_tokens)
                );
            }
        }
        Err(err) => {
            let _ = write!(
                out,
                "<tr><td colspan=16 class=down>cannot read requests: {}</td></tr>",
                esc(&err.to_string())
            );
        }
    }
    out.push_str(
        "</table><div class=muted>placed: <b>sticky</b> the conversation's own lease (its host \
         holds its cache); <b>family</b>, <b>inherit</b>, <b>least-loaded</b> a new conversation \
         placed there; <b>ctx</b>, <b>busy</b>, <b>unhealthy</b> moved; <b>pinned</b> the \
         route's pin; <b>none</b> metadata (no lease)</div>",
    );
}

/// How the last config reload went (issue 48): a refused one in red with its problems, since
/// the old config keeps serving and the log was the only place that said so.
fn reloaded(gw: &Gateway, now: i64) -> String {
    match gw.metrics.last_reload() {
        None => " · no reload since start".to_string(),
        Some(r) if r.applied => format!(" · last reload applied {} ago", ago(now - r.at)),
        Some(_) => String::new(),
    }
}

/// The refused reload's line of [`reloaded`].
fn refused_reload(gw: &Gateway, now: i64, out: &mut String) {
    if let Some(r) = gw.metrics.last_reload().filter(|r| !r.applied) {
        let _ = write!(
            out,
            "<p><span class=down>last reload refused</span> {} ago; the config before it keeps \
             serving: {}</p>",
            ago(now - r.at),
            esc(&r.problems.join("; "))
        );
    }
}

/// Requests and tokens per API since start: the same prompt/cached/completion meaning for all.
fn api_table(gw: &Gateway, out: &mut String) {
    out.push_str(
        "<h2>APIs</h2><table><tr><th>api</th><th>requests</th><th>prompt</th><th>cached</th>\
         <th>cached share</th><th>completion</th></tr>",
    );
    for (api, t) in gw.metrics.api_totals() {
        let share = if t.prompt > 0 {
            format!("{:.0}%", t.cached as f64 * 100.0 / t.prompt as f64)
        } else {
            "-".to_string()
        };
        let _ = write!(
            out,
            "<tr><td>{}</td><td class=n>{}</td><td class=n>{}</td><td class=n>{}</td>\
             <td class=n>{share}</td><td class=n>{}</td></tr>",
            // Rows an older crossbar kept of requests refused before routing have none.
            esc(if api == "-" {
                "(refused before routing)"
            } else {
                &api
            }),
            t.requests,
            t.prompt,
            t.cached,
            t.completion
        );
    }
    out.push_str("</table>");
}

/// Today's use per client key (issue 25), by its configured name, never the key.
fn keys_table(gw: &Gateway, now: i64, out: &mut String) {
    let config = gw.config();
    if config.keys.is_empty() {
        return;
    }
    out.push_str(
        "<h2>Client keys today (UTC)</h2><table><tr><th>key</th><th>tokens</th>\
         <th>tokens per day</th><th>in flight</th><th>max in flight</th></tr>",
    );
    for (name, spent, running) in gw.keys.usage(&config, now) {
        let key = &config.keys[&name];
        let limit = |n: Option<String>| n.unwrap_or_else(|| "-".to_string());
        let _ = write!(
            out,
            "<tr><td>{}</td><td class=n>{}</td><td class=n>{}</td><td class=n>{running}</td>\
             <td class=n>{}</td></tr>",
            esc(&name),
            group(spent),
            limit(key.tokens_per_day.map(group)),
            limit(key.max_in_flight.map(|n| n.to_string()))
        );
    }
    out.push_str("</table>");
}

/// "served from cache: N prompt tokens (≈ M minutes of prefill at each host's measured rate)".
/// Issue 48: it was "prefill saved", which read as what crossbar saved; it counts every cache
/// hit, those a host would have had without crossbar too. What crossbar adds needs the same
/// traffic sent without it (the demo does, and the affinity benchmark), which a live gateway
/// cannot measure: the page says what it counts instead.
fn headline(out: &mut String, hours: &[(&str, HourView)]) {
    let views: Vec<HourView> = hours.iter().map(|(_, h)| h.clone()).collect();
    let (tokens, seconds) = crate::metrics::recent::saved(&views);
    let unmeasured: Vec<&str> = hours
        .iter()
        .filter(|(_, h)| h.cached_total > 0 && h.prefill_rate.is_none())
        .map(|(name, _)| *name)
        .collect();
    let _ = write!(
        out,
        "<div class=headline>served from cache: <b>{} prompt tokens</b> (≈ <b>{}</b> of prefill at \
         each host's measured rate, from llama-server's <code>timings</code>)</div>\
         <div class=muted>every prompt token the hosts reused from their caches since crossbar \
         started: all cache hits, also those a host would have had without crossbar (a turn that \
         reached its host by chance, a shared system prompt)",
        group(tokens),
        crate::metrics::recent::in_words(seconds)
    );
    if !unmeasured.is_empty() {
        let _ = write!(
            out,
            "; no prefill rate measured yet for {}",
            esc(&unmeasured.join(", "))
        );
    }
    out.push_str("</div>");
}

/// Per host: requests, cached-token share and TTFB p50/p95 per minute over the last hour.
fn last_hour(out: &mut String, hours: &[(&str, HourView)]) {
    out.push_str("<h2>Last hour, per minute</h2>");
    for (name, hour) in hours {
        let requests: Vec<f64> = hour.minutes.iter().map(|m| m.requests as f64).collect();
        let share: Vec<Option<f64>> = hour
            .minutes
            .iter()
            .map(|m| m.cached_share.map(|s| s * 100.0))
            .collect();
        let p50: Vec<Option<f64>> = hour.minutes.iter().map(|m| m.ttfb_p50_ms).collect();
        let p95: Vec<Option<f64>> = hour.minutes.iter().map(|m| m.ttfb_p95_ms).collect();
        let rate = hour
            .prefill_rate
            .map_or("prefill rate not measured yet".to_string(), |r| {
                format!("prefill {r:.0} tokens/s")
            });
        let _ = write!(
            out,
            "<div class=host><div class=name><b>{}</b><br><span class=muted>cached {} tokens ≈ {}<br>{rate}</span></div>{}{}{}</div>",
            esc(name),
            group(hour.cached_total),
            crate::metrics::recent::in_words(hour.saved_seconds().unwrap_or(0.0)),
            chart::bars("requests / min", &requests, "#3a6fd8"),
            chart::lines(
                "cached share",
                &[chart::Series { values: &share, color: "#0a7a2f", name: "%" }],
                Some(100.0),
                "%"
            ),
            chart::lines(
                "TTFB",
                &[
                    chart::Series { values: &p50, color: "#3a6fd8", name: "p50" },
                    chart::Series { values: &p95, color: "#c2410c", name: "p95" },
                ],
                None,
                " ms"
            ),
        );
    }
}

/// `1234567` → `1,234,567`.
fn group(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A short human duration for a millisecond span: `4s`, `12m`, `3h`.
fn ago(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        _ => format!("{}h", s / 3600),
    }
}

/// Escapes text for HTML element content and attribute values.
fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped() {
        assert_eq!(
            esc("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }

    #[test]
    fn big_numbers_are_grouped() {
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(1_234_567), "1,234,567");
    }

    #[test]
    fn ages_read_naturally() {
        assert_eq!(ago(4_000), "4s");
        assert_eq!(ago(12 * 60_000), "12m");
        assert_eq!(ago(3 * 3_600_000), "3h");
        assert_eq!(ago(-5), "0s");
    }
}
