//! Operator verbs that talk to a running crossbar's admin API and print what changed.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Value};

use super::{emit, Args, CliError};
use crate::table::{header, kilo, table, text};

/// Where the admin API is and how to authenticate, from flags first, then the config.
struct Admin {
    base: String,
    token: Option<String>,
    /// Where the token came from, for a 401's hint: `--token` or the config's `admin_token`.
    token_from: &'static str,
    agent: ureq::Agent,
}

impl Admin {
    fn from(args: &Args) -> Result<Admin, CliError> {
        // --admin makes the config optional; without it the config names the address.
        let (configured, config_token) = match (&args.admin, args.load_config()) {
            (_, Ok(config)) => (
                format!("http://{}", reachable(config.admin_listen)),
                config.admin_token,
            ),
            (Some(_), Err(_)) => (String::new(), None),
            (None, Err(err)) => return Err(err),
        };
        let base = match &args.admin {
            Some(addr) => admin_base(addr),
            None => configured,
        };
        let token_from = if args.token.is_some() {
            "--token"
        } else {
            "admin_token in the config"
        };
        let token = args.token.clone().or(config_token);
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(10)))
            .max_redirects(0)
            .build();
        let agent = ureq::Agent::new_with_config(config);
        Ok(Admin {
            base,
            token,
            token_from,
            agent,
        })
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, CliError> {
        let url = format!("{}{path}", self.base);
        let mut request = ureq::http::Request::builder().method(method).uri(url);
        if let Some(token) = &self.token {
            request = request.header("Authorization", format!("Bearer {token}"));
        }
        let body = match body {
            Some(body) => {
                request = request.header("Content-Type", "application/json");
                body.to_string()
            }
            None => String::new(),
        };
        let unreachable = |err: &dyn std::fmt::Display| {
            CliError::Failed(format!(
                "cannot reach the admin API at {}: {err}",
                self.base
            ))
        };
        let request = request.body(body).map_err(|e| unreachable(&e))?;
        let response = self.agent.run(request).map_err(|e| unreachable(&e))?;
        let status = response.status().as_u16();
        let answer = response
            .into_body()
            .into_with_config()
            .limit(MAX_ANSWER)
            .read_to_vec()
            .map_err(|e| e.to_string())
            .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).map_err(|e| e.to_string()));
        match (status, answer) {
            (200..=299, Ok(value)) => Ok(value),
            (200..=299, Err(e)) => Err(CliError::Failed(format!(
                "bad answer from {}: {e}",
                self.base
            ))),
            (code, answer) => {
                // The admin API's `{"error": "..."}`, or the connection layer's refusal (`503
                // busy`...) in OpenAI's envelope, `{"error": {"message": "..."}}` (issue 27).
                let message = (answer.ok())
                    .and_then(|v| {
                        let error = &v["error"];
                        error
                            .as_str()
                            .or(error["message"].as_str())
                            .map(str::to_string)
                    })
                    .unwrap_or_else(|| "no details".to_string());
                Err(CliError::Failed(format!(
                    "{code}: {message}{}",
                    self.hint(code)
                )))
            }
        }
    }
}

impl Admin {
    /// How to fix a refusal the CLI can help with (issue 27): the token for a 401.
    fn hint(&self, code: u16) -> String {
        match (code, &self.token) {
            (401, None) => "; this crossbar has an admin_token: pass --token TOKEN, or -c the \
                            config that sets it"
                .to_string(),
            (401, Some(_)) => format!(
                "; the token sent (from {}) is not the running crossbar's admin_token: pass the \
                 right one with --token TOKEN",
                self.token_from
            ),
            _ => String::new(),
        }
    }
}

/// The largest admin answer read: the lease list of a busy gateway is a few MiB at most.
const MAX_ANSWER: u64 = 64 << 20;

/// `--admin` as an URL base: `127.0.0.1:8081` (the form `admin_listen` takes) gets `http://`.
fn admin_base(addr: &str) -> String {
    let addr = addr.trim().trim_end_matches('/');
    if addr.contains("://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    }
}

/// A wildcard listen address is reached on loopback.
fn reachable(addr: SocketAddr) -> SocketAddr {
    if addr.ip().is_unspecified() {
        SocketAddr::from(([127, 0, 0, 1], addr.port()))
    } else {
        addr
    }
}

pub fn status(args: &Args) -> Result<(), CliError> {
    let status = Admin::from(args)?.call("GET", "/admin/status", None)?;
    if args.json {
        return emit(&format!("{status:#}\n"));
    }
    let mut rows = vec![header(&[
        "HOST", "STATE", "CTX", "BUSY", "QUEUED", "LEASES", "HELD", "WARM", "LOADED", "URL",
    ])];
    for h in status["hosts"].as_array().into_iter().flatten() {
        let mut state = if h["healthy"].as_bool() == Some(true) {
            "up".to_string()
        } else {
            format!("down ({})", text(&h["reason"]))
        };
        if h["draining"].as_bool() == Some(true) {
            state.push_str(", draining");
        }
        let slots: u64 = h["models"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| m["parallel"].as_u64().unwrap_or(0))
            .sum();
        let mut loaded: Vec<String> = h["loaded"]
            .as_array()
            .into_iter()
            .flatten()
            .map(text)
            .collect();
        // A router: each configured model's state, and its own context when the host has none.
        let models: Vec<&Value> = h["models"].as_array().into_iter().flatten().collect();
        if models.iter().any(|m| m["state"].is_string()) {
            loaded = (models.iter())
                .map(|m| format!("{}:{}", text(&m["model"]), text(&m["state"])))
                .collect();
        }
        let mut ctxs: Vec<String> = (models.iter())
            .filter(|m| m["per_slot_ctx"].is_u64())
            .map(|m| text(&m["per_slot_ctx"]))
            .collect();
        ctxs.dedup();
        let ctx = match (h["per_slot_ctx"].is_u64(), ctxs.as_slice()) {
            (false, [one]) => one.clone(),
            (false, [_, _, ..]) => "per model".to_string(),
            _ => text(&h["per_slot_ctx"]),
        };
        // What placement sees (issue 23): tokens held against capacity, warm prompt families.
        let sum = |field: &str| {
            models
                .iter()
                .map(|m| m[field].as_u64().unwrap_or(0))
                .sum::<u64>()
        };
        let held = match sum("capacity") {
            0 => format!("{}/?", kilo(sum("held_tokens"))),
            cap => format!("{}/{}", kilo(sum("held_tokens")), kilo(cap)),
        };
        rows.push(vec![
            text(&h["name"]),
            state,
            ctx,
            format!("{}/{slots}", text(&h["in_flight"])),
            text(&h["queued"]),
            text(&h["leases"]),
            held,
            sum("warm_families").to_string(),
            loaded.join(","),
            text(&h["url"]),
        ]);
    }
    let mut out = table(&rows);
    out.push('\n');
    out.push_str(&learned_table(&status));
    if let Some(slots) = super::pinned::slots_table(&status) {
        out.push_str(&slots);
        out.push('\n');
    }
    let mut rows = vec![header(&["ROUTE", "MODEL", "PINNED", "LEASES", "HOSTS"])];
    for r in status["routes"].as_array().into_iter().flatten() {
        let hosts: Vec<String> = r["hosts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(text)
            .collect();
        rows.push(vec![
            text(&r["name"]),
            text(&r["model"]),
            text(&r["pinned"]),
            text(&r["leases"]),
            hosts.join(","),
        ]);
    }
    out.push_str(&table(&rows));
    let saved = &status["served_from_cache"];
    if let (Some(tokens), Some(seconds)) = (saved["tokens"].as_u64(), saved["seconds"].as_f64()) {
        out.push_str(&format!(
            "\nserved from cache: {tokens} prompt tokens (≈ {} of prefill at each host's measured \
             rate, from llama-server's timings) since crossbar started; every cache hit, also \
             those a host would have had without crossbar\n",
            crate::metrics::recent::in_words(seconds)
        ));
    }
    let store = &status["store"];
    if store["ok"].as_bool() == Some(false) {
        out.push_str(&format!(
            "\nSTORE FAILING since {} ms ago: {} (new conversations get 503 until a write succeeds)\n",
            crate::store::unix_ms(std::time::SystemTime::now())
                - store["since"].as_i64().unwrap_or(0),
            text(&store["cause"])
        ));
    }
    out.push_str(&keys_table(&status["keys"]));
    out.push_str(&last_reload(&status["last_reload"]));
    let build = &status["build"];
    if let Some(version) = build["version"].as_str() {
        let commit = match (build["commit"].as_str(), build["dirty"].as_bool()) {
            (Some(commit), Some(true)) => format!("commit {commit}, dirty"),
            (Some(commit), _) => format!("commit {commit}"),
            (None, _) => "unknown commit: built without git".to_string(),
        };
        out.push_str(&format!("serving: crossbar {version} ({commit})\n"));
    }
    emit(&out)
}

/// Today's spending per client key (issue 48), when the gateway has keys.
fn keys_table(keys: &Value) -> String {
    let Some(keys) = keys.as_array().filter(|k| !k.is_empty()) else {
        return String::new();
    };
    let mut rows = vec![header(&[
        "KEY",
        "TOKENS TODAY (UTC)",
        "TOKENS PER DAY",
        "IN FLIGHT",
        "MAX IN FLIGHT",
    ])];
    for k in keys {
        rows.push(vec![
            text(&k["name"]),
            text(&k["tokens_today"]),
            text(&k["tokens_per_day"]),
            text(&k["in_flight"]),
            text(&k["max_in_flight"]),
        ]);
    }
    format!("\n{}", table(&rows))
}

/// How the last config reload went (issue 48): a refused one said only in the log before.
fn last_reload(reload: &Value) -> String {
    let Some(at) = reload["at"].as_i64() else {
        return "\nlast reload: none since start\n".to_string();
    };
    let ago = (crate::store::unix_ms(std::time::SystemTime::now()) - at).max(0) / 1000;
    let lines = |field: &str, prefix: &str| -> String {
        (reload[field].as_array().into_iter().flatten())
            .map(|l| format!("  {prefix}{}\n", text(l)))
            .collect()
    };
    if reload["applied"].as_bool() == Some(true) {
        format!(
            "\nlast reload: applied {ago}s ago\n{}",
            lines("warnings", "warning: ")
        )
    } else {
        format!(
            "\nLAST RELOAD REFUSED {ago}s ago; the config before it keeps serving. Fix these, \
             `crossbar check`, reload again:\n{}",
            lines("problems", "")
        )
    }
}

pub fn leases(args: &Args) -> Result<(), CliError> {
    let leases = Admin::from(args)?.call("GET", "/admin/leases", None)?;
    if args.json {
        return emit(&format!("{leases:#}\n"));
    }
    let now = crate::store::unix_ms(std::time::SystemTime::now());
    let mut rows = vec![header(&["ROUTE", "CONVERSATION", "MODEL", "HOST", "IDLE"])];
    for l in leases["leases"].as_array().into_iter().flatten() {
        let fp = text(&l["fp"]);
        let fp = if fp == "-" {
            "(route)".to_string()
        } else {
            fp.chars().take(8).collect()
        };
        let idle_s = (now - l["last_used"].as_i64().unwrap_or(now)).max(0) / 1000;
        rows.push(vec![
            text(&l["route"]),
            fp,
            text(&l["model"]),
            text(&l["host"]),
            format!("{idle_s}s"),
        ]);
    }
    let mut out = table(&rows);
    for p in leases["pins"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "pin: {} -> {}\n",
            text(&p["route"]),
            text(&p["host"])
        ));
    }
    emit(&out)
}

pub fn pin(args: &Args) -> Result<(), CliError> {
    let (route, host) = (&args.positional[0], &args.positional[1]);
    let answer = post(args, "/admin/pin", json!({ "route": route, "host": host }))?;
    emit(&format!(
        "pinned {route} to {host}; dropped {} leases on other hosts\n",
        text(&answer["dropped"])
    ))?;
    if let Some(warning) = answer["warning"].as_str() {
        super::to_stderr(&format!("warning: {warning}\n"));
    }
    Ok(())
}

pub fn unpin(args: &Args) -> Result<(), CliError> {
    let route = &args.positional[0];
    let answer = post(args, "/admin/unpin", json!({ "route": route }))?;
    emit(&if answer["was_pinned"].as_bool() == Some(true) {
        format!("unpinned {route}; its leases stay where they are\n")
    } else {
        format!("{route} was not pinned; nothing changed\n")
    })
}

pub fn release(args: &Args) -> Result<(), CliError> {
    let route = &args.positional[0];
    let answer = post(args, "/admin/release", json!({ "route": route }))?;
    emit(&format!(
        "released {route}: dropped {} leases\n",
        text(&answer["dropped"])
    ))
}

pub fn drain(args: &Args) -> Result<(), CliError> {
    let host = &args.positional[0];
    let on = !args.off;
    let answer = post(args, "/admin/drain", json!({ "host": host, "on": on }))?;
    let leases = text(&answer["leases"]);
    emit(&match (on, answer["changed"].as_bool() == Some(true)) {
        (true, true) => format!("draining {host}: no new leases; {leases} leases remain on it\n"),
        (true, false) => format!("{host} was already draining; {leases} leases remain on it\n"),
        (false, true) => format!("{host} takes new leases again ({leases} leases on it)\n"),
        (false, false) => format!("{host} was not draining; nothing changed\n"),
    })
}

/// What crossbar learned of each host that llama-server reports in no endpoint (issue 47), with
/// where each fact comes from, and what the host says against the config.
fn learned_table(status: &Value) -> String {
    let mut rows = vec![header(&[
        "HOST",
        "SIMILARITY",
        "RAM CACHE",
        "PINNING",
        "COLD",
        "RESTARTS",
        "BUILD",
    ])];
    let mut notes = Vec::new();
    for h in status["hosts"].as_array().into_iter().flatten() {
        let l = &h["learned"];
        if l.is_null() {
            continue;
        }
        rows.push(vec![
            text(&h["name"]),
            text(&l["similarity"]),
            text(&l["ram_cache"]),
            text(&l["pinning"]),
            text(&l["colds"]),
            text(&l["restarts"]),
            text(&l["build"]),
        ]);
        for note in l["notes"].as_array().into_iter().flatten() {
            notes.push(format!("warning: {}\n", text(note)));
        }
    }
    let mut out = table(&rows);
    for note in notes {
        out.push_str(&note);
    }
    out.push('\n');
    out
}

/// One operator change: a POST to the admin API.
fn post(args: &Args, path: &str, body: Value) -> Result<Value, CliError> {
    Admin::from(args)?.call("POST", path, Some(body))
}
