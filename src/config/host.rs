//! A `[hosts.NAME]` table validated into a [`Host`]: its URL, key, overrides and models.

use std::collections::BTreeMap;

use super::raw::RawHost;
use super::validate::valid_name;
use super::{Host, Problem};

pub(super) fn validate_host(
    name: &str,
    raw: RawHost,
    problems: &mut Vec<Problem>,
    warnings: &mut Vec<String>,
) -> Host {
    let key = format!("hosts.{name}");
    if !valid_name(name) {
        problems.push(Problem::new(
            &key,
            "host names use only letters, digits, '-' and '_'",
        ));
    }
    let url = match raw.url {
        None => {
            problems.push(Problem::new(format!("{key}.url"), "is missing"));
            String::new()
        }
        Some(url) => check_url(&url).unwrap_or_else(|msg| {
            problems.push(Problem::new(format!("{key}.url"), msg));
            url
        }),
    };
    if raw.api_key.as_ref().is_some_and(|k| k.len() > MAX_API_KEY) {
        problems.push(Problem::new(
            format!("{key}.api_key"),
            format!("is longer than {MAX_API_KEY} bytes"),
        ));
    }
    if raw
        .slot_prompt_similarity
        .is_some_and(|s| !(0.0..=1.0).contains(&s))
    {
        problems.push(Problem::new(
            format!("{key}.slot_prompt_similarity"),
            "must be from 0 to 1, as llama-server's --slot-prompt-similarity",
        ));
    }
    if raw.kv_tokens == Some(0) {
        problems.push(Problem::new(
            format!("{key}.kv_tokens"),
            "must be at least 1 token; leave it out to use slots x per-slot context",
        ));
    }
    if raw.weight == Some(0) {
        problems.push(Problem::new(format!("{key}.weight"), "must be at least 1"));
    }
    if raw.ctx == Some(0) {
        problems.push(Problem::new(
            format!("{key}.ctx"),
            "must be at least 1 token",
        ));
    }
    let mut upstream = BTreeMap::new();
    let models: BTreeMap<String, Option<usize>> = raw
        .models
        .into_iter()
        .map(|(model, m)| {
            match m.upstream {
                Some(name) if name.is_empty() => problems.push(Problem::new(
                    format!("{key}.models.{model}.upstream"),
                    "is empty; leave it out to use the model's own name",
                )),
                Some(name) => {
                    upstream.insert(model.clone(), name);
                }
                None => {}
            }
            let parallel = m.parallel.map(|parallel| {
                if parallel < 1 {
                    problems.push(Problem::new(
                        format!("{key}.models.{model}.parallel"),
                        format!("is {parallel}; a host has at least 1 slot"),
                    ));
                }
                usize::try_from(parallel.max(1)).unwrap_or(usize::MAX)
            });
            (model, parallel)
        })
        .collect();
    if raw.pin_slots.is_some() {
        warnings.push(format!(
            "hosts.{name}.pin_slots is retired: write `exclusive = true` when nothing but \
             crossbar talks to the host, and crossbar pins its slots itself{}",
            if raw.pin_slots == Some(true) {
                " (read as exclusive = true)"
            } else {
                ""
            }
        ));
    }
    Host {
        name: name.to_string(),
        url,
        weight: raw.weight.unwrap_or(1),
        api_key: raw.api_key.filter(|k| !k.is_empty()),
        ctx: raw.ctx,
        kv_tokens: raw.kv_tokens,
        slot_prompt_similarity: raw.slot_prompt_similarity,
        exclusive: raw.exclusive.or(raw.pin_slots).unwrap_or(false),
        ram_cache: raw.ram_cache,
        implied: models.is_empty(),
        models,
        upstream,
    }
}

/// Longest host URL and host `api_key`: with them, what crossbar adds to a client's head fits
/// the upstream client's room for it (`proxy::upstream::HEAD_ROOM`).
pub const MAX_URL: usize = 1024;
pub const MAX_API_KEY: usize = 4096;

/// Checks an upstream base URL and returns it without a trailing slash.
pub(super) fn check_url(url: &str) -> Result<String, String> {
    if url.len() > MAX_URL {
        return Err(format!("is longer than {MAX_URL} bytes"));
    }
    let rest = match url.split_once("://") {
        Some(("http", rest)) => rest,
        Some(("https", _)) => {
            return Err(format!(
                "{url:?}: https is not supported; put llama-server on http"
            ))
        }
        _ => return Err(format!("{url:?} is not an http:// URL")),
    };
    let authority = rest.split('/').next().unwrap_or("");
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) if !authority.ends_with(']') => (host, Some(port)),
        _ => (authority, None),
    };
    if host.is_empty() || host.contains(['@', ' ', '?', '#']) {
        return Err(format!("{url:?} has no valid host name"));
    }
    if let Some(port) = port {
        if port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(format!("{url:?} has a bad port {port:?}"));
        }
    }
    if rest.contains(['?', '#']) {
        return Err(format!("{url:?} must not carry a query or fragment"));
    }
    let url = url.trim_end_matches('/');
    // Clients' paths already start with /v1; a base ending in it would ask for /v1/v1/... (issue 13).
    if let Some(base) = url.strip_suffix("/v1") {
        return Err(format!(
            "{url:?} ends in /v1; crossbar adds the /v1/... of each request itself: use {base:?}"
        ));
    }
    Ok(url.to_string())
}
