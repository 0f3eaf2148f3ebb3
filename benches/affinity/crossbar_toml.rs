//! crossbar's config for one run, as TOML text: one route over every host, each host either as
//! docs/OPERATIONS.md configures it (its `parallel` and `slot_prompt_similarity` mirroring how the
//! host runs) or given only its `url` (issue 47: crossbar is to read the rest from the host), plus
//! the lines the flags add (`--crossbar-host-extra`, `--pin-slots`, `--crossbar-route-extra`).
//!
//! Pure: strings in, text out, and crossbar's verdict on the text (`parse`) as a `Config` or one
//! line for the front end's row: a host form this build refuses (url-only hosts and `exclusive`
//! until issue 47's config work lands) ends that row, never the run. It starts nothing.
//! tests/it/affinity.rs compiles it in, so what each flag puts in the config is checked without a
//! run.

use std::fmt::Write as _;
use std::path::Path;

use crossbar::config::Config;

/// How each host's table is written (`--crossbar-hosts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostForm {
    /// `url`, `slot_prompt_similarity` and a models table with `parallel`: as the operator mirrors
    /// the hosts today (the default).
    Configured,
    /// `url` alone (and the extra lines): what crossbar must learn from the host itself.
    UrlOnly,
}

impl HostForm {
    pub fn parse(name: &str) -> Option<HostForm> {
        match name {
            "configured" => Some(HostForm::Configured),
            "url-only" => Some(HostForm::UrlOnly),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            HostForm::Configured => "configured",
            HostForm::UrlOnly => "url-only",
        }
    }
}

/// Everything but the hosts that shapes the text.
#[derive(Debug, Clone, Copy)]
pub struct Form<'a> {
    pub hosts: HostForm,
    /// TOML lines for every host's table (after its `url`, before its models table).
    pub host_extra: &'a str,
    /// TOML lines ending the route's table, which is the config's last: callers may append more.
    pub route_extra: &'a str,
    /// Slots per host (`parallel`) and the hosts' `--slot-prompt-similarity`, for `Configured`.
    pub slots: usize,
    pub similarity: f64,
}

/// The config: hosts `h0`, `h1`, ... at `urls`, one route `bench` over them serving `model`, the
/// database at `db`, a health poll every second, loopback listeners on ports the OS picks.
pub fn config_text(urls: &[String], model: &str, db: &Path, form: &Form) -> String {
    let mut t = format!(
        "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ndb = {db:?}\nworkers = 32\n\
         queue_max = 64\nhealth_interval = \"1s\"\n"
    );
    for (i, url) in urls.iter().enumerate() {
        let _ = writeln!(t, "[hosts.h{i}]\nurl = \"{url}\"");
        if form.hosts == HostForm::Configured {
            let _ = writeln!(t, "slot_prompt_similarity = {}", form.similarity);
        }
        lines(&mut t, form.host_extra);
        if form.hosts == HostForm::Configured {
            let _ = writeln!(t, "[hosts.h{i}.models.{model}]\nparallel = {}", form.slots);
        }
    }
    let names: Vec<String> = (0..urls.len()).map(|i| format!("\"h{i}\"")).collect();
    let _ = writeln!(
        t,
        "[routes.bench]\nhosts = [{}]\nmodel = \"{model}\"",
        names.join(", ")
    );
    lines(&mut t, form.route_extra);
    t
}

/// Every host's extra lines from the flags: each `--crossbar-host-extra` value, then
/// `pin_slots = true` for `--pin-slots`.
pub fn host_lines(extra: &[String], pin_slots: bool) -> String {
    let mut lines: String = extra.iter().map(|l| format!("{}\n", l.trim())).collect();
    if pin_slots {
        lines.push_str("pin_slots = true\n");
    }
    lines
}

/// crossbar's config from `text`, or why it refused it, in one line naming the form.
pub fn parse(text: &str, form: &Form) -> Result<Config, String> {
    Config::from_toml(text).map_err(|e| {
        let why = e.to_string().lines().collect::<Vec<_>>().join(" ");
        format!(
            "crossbar rejected its config (hosts {}): {why}",
            describe(form)
        )
    })
}

/// A short name for the form, for the table's notes: `url-only`, `configured +exclusive = true`.
pub fn describe(form: &Form) -> String {
    let extra: Vec<&str> = (form.host_extra.lines())
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    match extra.is_empty() {
        true => form.hosts.name().to_string(),
        false => format!("{} +{}", form.hosts.name(), extra.join(" +")),
    }
}

fn lines(t: &mut String, extra: &str) {
    for line in extra.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let _ = writeln!(t, "{line}");
    }
}
