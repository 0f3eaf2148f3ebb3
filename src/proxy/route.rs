//! Which route a request names and which llama-server path it asks for. Pure: no I/O.
//!
//! The path is percent-decoded and checked ([`normalize`]) before anything looks at it, and what
//! goes upstream is cut from that checked form, so the allow-list sees exactly what the host gets.

use crate::config::Config;

use super::error::Mistake;
use super::ProxyError;

/// llama-server's native inference endpoints a client may reach besides `/v1/...`.
const NATIVE: &[&str] = &[
    "/health",
    "/props",
    "/completion",
    "/completions",
    "/infill",
    "/tokenize",
    "/detokenize",
    "/embedding",
    "/embeddings",
    "/rerank",
    "/reranking",
    "/apply-template",
];

/// First path segments that are API paths, not route names: `/chat/completions` is a client that
/// left the route (and `/v1`) out of its base URL, never a route called `chat`.
const API_WORDS: &[&str] = &[
    "chat",
    "completions",
    "embeddings",
    "models",
    "messages",
    "responses",
    "audio",
    "images",
    "moderations",
    "rerank",
    "reranking",
];

/// Paths llama-server answers without a slot: server metadata and the tokenizer (the conversation
/// APIs' token counts are `api::is_count`).
const METADATA: &[&str] = &[
    "/health",
    "/props",
    "/tokenize",
    "/detokenize",
    "/apply-template",
];

/// A request that uses no inference slot upstream and carries no conversation: a `GET`/`HEAD`
/// (`/v1/models`, `/health`, `/props`...), a CORS preflight `OPTIONS`, a tokenizer call or a token
/// count. It takes the route-level lease (fingerprint "") but no limiter slot.
pub fn is_metadata(method: &str, rest: &str) -> bool {
    matches!(method, "GET" | "HEAD" | "OPTIONS")
        || METADATA.contains(&rest)
        || crate::api::is_count(rest)
}

/// Splits a request path (without its query) into the route and the rest to forward upstream,
/// following the path form `/<route>/<rest>` or the `X-Crossbar-Route` header.
pub fn resolve(
    path: &str,
    header: Option<&str>,
    config: &Config,
) -> Result<(String, String), ProxyError> {
    let normalized = normalize(path)?;
    let path = normalized.as_str();
    let (first, after_first) = split_first(path);
    let (route, rest) = match header.map(str::trim).filter(|h| !h.is_empty()) {
        Some(named) => {
            if config.routes.contains_key(first) && first != named {
                return Err(ProxyError::ConflictingRoute);
            }
            // `/projA/v1/...` with the header naming projA too is the same request.
            let rest = if first == named { after_first } else { path };
            (named, rest)
        }
        None => {
            // `/v1/projA/v1/...`: the route after `/v1` (issue 48).
            let (second, _) = split_first(after_first);
            if first == "v1" && config.routes.contains_key(second) {
                return Err(ProxyError::BaseUrl {
                    route: second.to_string(),
                    mistake: Mistake::RouteAfterV1,
                });
            }
            let api_path = NATIVE.contains(&path) || API_WORDS.contains(&first);
            if first.is_empty() || first == "v1" || (api_path && !config.routes.contains_key(first))
            {
                return Err(ProxyError::MissingRoute {
                    routes: config.routes.keys().cloned().collect(),
                });
            }
            (first, after_first)
        }
    };
    if !config.routes.contains_key(route) {
        return Err(ProxyError::UnknownRoute {
            route: route.to_string(),
            routes: config.routes.keys().cloned().collect(),
        });
    }
    let rest = if rest.is_empty() { "/" } else { rest };
    // Caught before the allow-list, which would forward `/v1/v1/messages` (issue 48).
    if let Some(mistake) = repeated(rest, config) {
        return Err(ProxyError::BaseUrl {
            route: route.to_string(),
            mistake,
        });
    }
    if !allowed(rest) {
        // `/projA/chat/completions`: right route, base URL without its `/v1`.
        let (word, _) = split_first(rest);
        if API_WORDS.contains(&word) && allowed(&format!("/v1{rest}")) {
            return Err(ProxyError::MissingV1 {
                route: route.to_string(),
            });
        }
        return Err(ProxyError::NotFound);
    }
    Ok((route.to_string(), rest.to_string()))
}

/// What a base URL that carries too much does to the path after the route (issue 48): the
/// Anthropic SDK given `…/projA/v1` sends `/v1/v1/messages`; a client given a whole endpoint's URL
/// repeats it (`/v1/chat/completions/chat/completions`); a route named twice.
fn repeated(rest: &str, config: &Config) -> Option<Mistake> {
    if rest == "/v1/v1" || rest.starts_with("/v1/v1/") {
        return Some(Mistake::V1Twice);
    }
    // `/projA/v1/...` or `/v1/projA/v1/...` after the route: a route named again, then `/v1`.
    let named_again = |path: &str| {
        let (first, after) = split_first(path);
        config.routes.contains_key(first) && (after == "/v1" || after.starts_with("/v1/"))
    };
    let tail = rest.strip_prefix("/v1").filter(|t| t.starts_with('/'));
    if named_again(rest) || tail.is_some_and(named_again) {
        return Some(Mistake::RouteTwice);
    }
    let tail = tail?;
    let half = tail.len() / 2;
    let twice = |a: &str, b: &str| a.len() > 1 && a == b && a.starts_with('/');
    let endpoint_twice =
        (tail.len() % 2 == 0 && tail.is_char_boundary(half) && twice(&tail[..half], &tail[half..]))
            || tail
                .find("/v1/")
                .is_some_and(|i| twice(&tail[..i], &tail[i + 3..]));
    endpoint_twice.then_some(Mistake::EndpointTwice)
}

/// What routing promises of any path a head may carry (the fuzz runner's callers check it): one
/// [`normalize`] accepts is in its own canonical form — normalising it again changes nothing —
/// and holds no dot segment. `Err` says which promise broke.
pub fn check_normal(path: &str) -> Result<(), String> {
    let Ok(normal) = normalize(path) else {
        return Ok(());
    };
    if normalize(&normal).as_deref() != Ok(normal.as_str()) {
        return Err(format!("{normal:?} is not its own normal form"));
    }
    if normal.split('/').any(|s| s == "." || s == "..") {
        return Err(format!("{normal:?} keeps a dot segment"));
    }
    Ok(())
}

/// Percent-decodes a request path (without its query) and re-encodes it in one canonical form, or
/// refuses it (spec §2): a `.` or `..` segment, a backslash (raw or encoded), an encoded `/`, NUL or
/// another control byte, or a `%` not followed by two hex digits. The upstream's URL parser would
/// otherwise resolve `/projA/v1/%2e%2e/slots` to `/slots` after the allow-list said yes (issue 10).
pub fn normalize(path: &str) -> Result<String, ProxyError> {
    let bad = |what: &str| Err(ProxyError::BadRequest(format!("path: {what}")));
    if !path.starts_with('/') {
        return bad("must start with /");
    }
    let raw = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut segment_start = 0;
    let mut i = 0;
    while i < raw.len() {
        let (byte, encoded) = if raw[i] == b'%' {
            let hex = |b: u8| (b as char).to_digit(16);
            match (
                raw.get(i + 1).and_then(|&b| hex(b)),
                raw.get(i + 2).and_then(|&b| hex(b)),
            ) {
                (Some(hi), Some(lo)) => {
                    i += 3;
                    ((hi * 16 + lo) as u8, true)
                }
                _ => return bad("bad percent-encoding"),
            }
        } else {
            i += 1;
            (raw[i - 1], false)
        };
        match byte {
            b'/' if encoded => return bad("encoded /"),
            b'\\' => return bad("backslash"),
            0 => return bad("NUL byte"),
            b if b < 0x20 || b == 0x7f => return bad("control byte"),
            b'/' => {
                if is_dot_segment(&out[segment_start..]) {
                    return bad("dot segment");
                }
                out.push('/');
                segment_start = out.len();
            }
            b if plain(b) => out.push(b as char),
            b => out.push_str(&format!("%{b:02X}")),
        }
    }
    if is_dot_segment(&out[segment_start..]) {
        return bad("dot segment");
    }
    Ok(out)
}

/// `.` or `..`, in the re-encoded form (a decoded `.` is written back as `.`).
fn is_dot_segment(segment: &str) -> bool {
    segment == "." || segment == ".."
}

/// Bytes a path segment may hold unencoded (RFC 3986 `pchar` minus `%`).
fn plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@".contains(&b)
}

/// `/projA/v1/chat` → (`projA`, `/v1/chat`).
fn split_first(path: &str) -> (&str, &str) {
    let trimmed = path.strip_prefix('/').unwrap_or(path);
    match trimmed.find('/') {
        Some(i) => (&trimmed[..i], &trimmed[i..]),
        None => (trimmed, ""),
    }
}

fn allowed(rest: &str) -> bool {
    (rest.starts_with("/v1/") && !rest.contains("/../")) || NATIVE.contains(&rest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::Shape;

    fn config() -> Config {
        Config::from_toml(
            r#"
            [hosts.titan]
            url = "http://10.0.0.1:8080"
            [hosts.titan.models.qwen]
            [routes.projA]
            hosts = ["titan"]
            model = "qwen"
            [routes.projB]
            hosts = ["titan"]
            model = "qwen"
            "#,
        )
        .unwrap()
    }

    #[test]
    fn metadata_is_what_needs_no_slot() {
        for (method, rest, want) in [
            ("GET", "/v1/models", true),
            ("HEAD", "/health", true),
            ("GET", "/props", true),
            ("POST", "/tokenize", true),
            ("POST", "/apply-template", true),
            ("OPTIONS", "/v1/chat/completions", true),
            ("POST", "/v1/chat/completions/input_tokens", true),
            ("POST", "/v1/messages/count_tokens", true),
            ("POST", "/v1/responses/input_tokens", true),
            ("POST", "/v1/chat/completions", false),
            ("POST", "/completion", false),
            ("POST", "/v1/embeddings", false),
        ] {
            assert_eq!(is_metadata(method, rest), want, "{method} {rest}");
        }
    }

    #[track_caller]
    fn check(path: &str, header: Option<&str>, expected: Result<(&str, &str), &str>) {
        let got = resolve(path, header, &config());
        match (got, expected) {
            (Ok((route, rest)), Ok((r, p))) => assert_eq!((route.as_str(), rest.as_str()), (r, p)),
            (Err(err), Err(msg)) => assert_eq!(err.to_string(), msg),
            (got, expected) => panic!("{path} {header:?}: got {got:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn path_names_the_route() {
        check(
            "/projA/v1/chat/completions",
            None,
            Ok(("projA", "/v1/chat/completions")),
        );
        check("/projA/completion", None, Ok(("projA", "/completion")));
        check("/projA/health", None, Ok(("projA", "/health")));
        check("/projB/v1/models", None, Ok(("projB", "/v1/models")));
    }

    #[test]
    fn header_names_the_route_and_the_path_is_the_rest() {
        check(
            "/v1/chat/completions",
            Some("projA"),
            Ok(("projA", "/v1/chat/completions")),
        );
        check("/props", Some("projB"), Ok(("projB", "/props")));
        check(
            "/projA/v1/models",
            Some("projA"),
            Ok(("projA", "/v1/models")),
        );
    }

    #[test]
    fn route_errors() {
        check("/v1/chat/completions", None, Err("missing route"));
        check("/", None, Err("missing route"));
        check("/health", None, Err("missing route"));
        check("/projB/v1/models", Some("projA"), Err("conflicting route"));
        check("/nope/v1/models", None, Err("unknown route"));
        check("/v1/models", Some("nope"), Err("unknown route"));
    }

    /// Issue 13: each addressing mistake says how to fix it.
    #[track_caller]
    fn check_hint(path: &str, error: &str, mentions: &[&str]) {
        let err = resolve(path, None, &config()).expect_err(path);
        let body = err.body(Shape::OpenAi);
        assert_eq!(body["error"]["code"], error, "{path}: {body}");
        let hint = body["error"]["hint"].as_str().unwrap_or_default();
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(message, format!("{error}: {hint}"), "{path}: {body}");
        for word in mentions {
            assert!(
                hint.contains(word),
                "{path}: {hint:?} should mention {word:?}"
            );
        }
    }

    #[test]
    fn addressing_mistakes_say_how_to_fix_them() {
        let shape = "http://<gateway>/<route>/v1";
        check_hint(
            "/v1/chat/completions",
            "missing route",
            &["projA, projB", shape, "X-Crossbar-Route"],
        );
        // Not a route called `chat`: the client left route and `/v1` out.
        check_hint(
            "/chat/completions",
            "missing route",
            &["projA, projB", shape],
        );
        check_hint("/models", "missing route", &["projA, projB"]);
        check_hint(
            "/projC/v1/chat/completions",
            "unknown route",
            &["\"projC\"", "projA, projB"],
        );
        check_hint(
            "/projA/chat/completions",
            "not found",
            &["ends in /v1", "/projA/v1"],
        );
        check_hint("/projA/slots", "not found", &["/<route>/v1/"]);
        assert_eq!(
            resolve("/projC/v1/models", None, &config())
                .unwrap_err()
                .body(Shape::OpenAi)["error"]["route"],
            "projC"
        );
    }

    /// Issue 48: a base URL that carries what the client adds itself is caught before the
    /// allow-list (which forwarded `/v1/v1/messages`), with the route it meant.
    #[test]
    fn a_base_url_with_too_much_in_it_is_named_issue_48() {
        for (path, mistake) in [
            ("/projA/v1/v1/messages", Mistake::V1Twice),
            ("/projA/v1/v1", Mistake::V1Twice),
            ("/projA/projA/v1/models", Mistake::RouteTwice),
            ("/projA/v1/projA/v1/chat/completions", Mistake::RouteTwice),
            ("/projA/projB/v1/models", Mistake::RouteTwice),
            (
                "/projA/v1/chat/completions/chat/completions",
                Mistake::EndpointTwice,
            ),
            ("/projA/v1/responses/v1/responses", Mistake::EndpointTwice),
            ("/v1/projA/v1/chat/completions", Mistake::RouteAfterV1),
        ] {
            let got = resolve(path, None, &config());
            let want = ProxyError::BaseUrl {
                route: "projA".into(),
                mistake,
            };
            assert_eq!(got, Err(want), "{path}");
        }
        let header = resolve("/v1/v1/messages", Some("projB"), &config());
        assert!(matches!(header, Err(ProxyError::BaseUrl { route, .. }) if route == "projB"));
        // Paths that only look alike are what they were.
        for path in [
            "/projA/v1/chat/completions",
            "/projA/v1/v1beta",
            "/projA/v1/models/projA",
        ] {
            assert!(resolve(path, None, &config()).is_ok(), "{path}");
        }
        check("/projA/v1x/v1/models", None, Err("not found"));
    }

    #[test]
    fn only_inference_paths_are_forwarded() {
        for rest in ["/slots", "/metrics", "/", "/v1", "/slots/0?action=erase"] {
            check(&format!("/projA{rest}"), None, Err("not found"));
        }
    }

    /// Issue 10: the allow-list was checked before the path was decoded, so these reached the host
    /// as `/slots`, `/` and `/slots/0`.
    #[test]
    fn dot_segments_backslashes_encoded_slashes_and_nul_are_bad_requests_issue_10() {
        for path in [
            "/projA/v1/%2e%2e/slots",
            "/projA/v1/%2E%2E/slots",
            "/projA/v1/..",
            "/projA/v1/../slots",
            "/projA/v1/./chat/completions",
            "/projA/v1/.%2e/slots",
            "/projA/v1/..\\slots",
            "/projA/v1/%5cslots",
            "/projA/v1%2fslots",
            "/projA/v1/%2F..%2Fslots",
            "/projA/v1/chat%00",
            "/projA/v1/chat%0a",
            "/projA/v1/chat%zz",
            "/projA/v1/chat%4",
            "/%2e%2e/projA/v1/models",
        ] {
            check(path, None, Err("bad request"));
        }
    }

    #[test]
    fn the_rest_is_the_decoded_path_in_one_canonical_encoding() {
        check("/projA/v1/%6dodels", None, Ok(("projA", "/v1/models")));
        check("/%70rojA/v1/models", None, Ok(("projA", "/v1/models")));
        check("/projA/v1/a%20b", None, Ok(("projA", "/v1/a%20b")));
        check("/projA/v1/a%25b", None, Ok(("projA", "/v1/a%25b")));
        check("/projA/v1/...", None, Ok(("projA", "/v1/...")));
        check("/projA/v1/%3F", None, Ok(("projA", "/v1/%3F")));
        check("/projA/%73lots", None, Err("not found"));
    }
}
