//! Who may use the admin API, decided from the head alone (before any body is read). With an
//! `admin_token`: whoever presents it, or a browser signed in with it (issue 27's session cookie).
//! Without one, and for a signed-in browser too: only requests a web page on another site cannot
//! make a browser send — the DNS-rebinding and cross-site-form cases of issue 10.

use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use subtle::ConstantTimeEq;

use super::Answer;
use crate::conn::Request;
use crate::sessions as session;
use crate::state::Gateway;

/// Who may use the admin API. With a token: whoever presents it (constant-time compare), or a
/// browser with a live session, held to the checks below but the `Host` one (its cookie is sent
/// only to the name it signed in on). Without a token, only what a browser page on another site
/// cannot forge: a `Host` naming this listener or `localhost` (DNS rebinding), no foreign
/// `Origin`, and `Content-Type: application/json` on a POST (a plain HTML form cannot send it).
pub(super) fn guard(gw: &Gateway, request: &Request<'_>) -> Result<(), Answer> {
    let config = gw.config();
    if let Some(token) = config.admin_token.as_deref() {
        let expected = format!("Bearer {token}");
        let mut sent = request.headers().all("Authorization");
        let (first, second) = (sent.next(), sent.next());
        // Two of them: which one counts is a guess a proxy in front may make differently (issue 24).
        if second.is_some() {
            return Err(Answer::error(400, "two Authorization headers"));
        }
        if first.is_none() && signed_in(gw, request) {
            return same_origin(request).and_then(|()| json_post(request));
        }
        let given = first.is_some_and(|v| bool::from(v.as_bytes().ct_eq(expected.as_bytes())));
        if first.is_some() && !given {
            super::throttle::failed(gw, request);
        }
        return if given {
            Ok(())
        } else {
            Err(Answer::error(
                401,
                "missing or wrong admin token: send Authorization: Bearer <admin_token>, or sign \
                 in at /signin in a browser",
            ))
        };
    }
    let host = request.header("Host").unwrap_or("");
    if !own_host(host, request.local_addr()) {
        return Err(Answer::error(403, not_own_host(host, request.local_addr())));
    }
    same_origin(request)?;
    json_post(request)
}

/// Whether the request carries the cookie of a live sign-in session.
fn signed_in(gw: &Gateway, request: &Request<'_>) -> bool {
    let now = Instant::now();
    session::cookies(request.headers()).any(|id| gw.sessions.check(id, now))
}

/// A browser's `Origin`, when it sends one, must be this listener as the request's `Host` names it.
pub(super) fn same_origin(request: &Request<'_>) -> Result<(), Answer> {
    let host = request.header("Host").unwrap_or("");
    if let Some(origin) = request.header("Origin") {
        let same = origin
            .strip_prefix("http://")
            .is_some_and(|o| o.eq_ignore_ascii_case(host));
        if !same {
            return Err(Answer::error(403, "cross-site request refused"));
        }
    }
    Ok(())
}

/// A POST must say `Content-Type: application/json`, which a plain HTML form cannot send.
fn json_post(request: &Request<'_>) -> Result<(), Answer> {
    let json = request
        .header("Content-Type")
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if request.method() == "POST" && !json {
        return Err(Answer::error(415, "Content-Type must be application/json"));
    }
    Ok(())
}

/// The 403 for a foreign `Host`, saying which address to use instead (issue 27).
fn not_own_host(host: &str, local: Option<SocketAddr>) -> String {
    let host: String = host.chars().take(100).collect();
    let use_ = local.map_or("the admin_listen address".to_string(), |local| {
        format!("http://{local}/ or http://localhost:{}/", local.port())
    });
    format!(
        "Host {host:?} is not this admin listener: without an admin_token it answers only \
         requests addressed to {use_} (so a web page elsewhere cannot reach it); use that \
         address, or set admin_token in the config to reach it by another name or a tunnel"
    )
}

/// Whether a `Host` header names this listener: `localhost` or the address the client connected
/// to, with or without the port.
fn own_host(host: &str, local: Option<SocketAddr>) -> bool {
    let (name, port) = match host.strip_prefix('[') {
        Some(bracketed) => match bracketed.split_once(']') {
            Some((name, "")) => (name, None),
            Some((name, rest)) => match rest.strip_prefix(':') {
                Some(port) => (name, Some(port)),
                None => return false,
            },
            None => return false,
        },
        None => match host.rsplit_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        },
    };
    let Some(local) = local else {
        return false;
    };
    if port.is_some_and(|p| p != local.port().to_string()) {
        return false;
    }
    name.eq_ignore_ascii_case("localhost")
        || name.parse::<IpAddr>().is_ok_and(|ip| ip == local.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_names_this_listener_by_its_address_or_localhost() {
        let v4: SocketAddr = "127.0.0.1:8081".parse().unwrap();
        let v6: SocketAddr = "[::1]:8081".parse().unwrap();
        for (host, local, want) in [
            ("127.0.0.1:8081", v4, true),
            ("127.0.0.1", v4, true),
            ("localhost:8081", v4, true),
            ("LOCALHOST", v4, true),
            ("127.0.0.1:9999", v4, false),
            ("evil.example:8081", v4, false),
            ("127.0.0.2:8081", v4, false),
            ("", v4, false),
            ("[::1]:8081", v6, true),
            ("[::1]", v6, true),
            ("[::1]x", v6, false),
            ("[::1:8081", v6, false),
        ] {
            assert_eq!(own_host(host, Some(local)), want, "{host} on {local}");
        }
        assert!(!own_host("localhost", None));
    }
}
