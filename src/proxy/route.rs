//! Which route a request names and which llama-server path it asks for. Pure: no I/O.

use crate::config::Config;

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

/// Paths llama-server answers without a slot: server metadata and the tokenizer.
const METADATA: &[&str] = &[
    "/health",
    "/props",
    "/tokenize",
    "/detokenize",
    "/apply-template",
];

/// A request that uses no inference slot upstream and carries no conversation: a `GET`/`HEAD`
/// (`/v1/models`, `/health`, `/props`...), a tokenizer call or an API's token count
/// (`/v1/messages/count_tokens`...). It takes no lease and no limiter slot.
pub fn is_metadata(method: &str, rest: &str) -> bool {
    method == "GET" || method == "HEAD" || METADATA.contains(&rest) || crate::api::is_count(rest)
}

/// Splits a request path (without its query) into the route and the rest to forward upstream,
/// following the path form `/<route>/<rest>` or the `X-Crossbar-Route` header.
pub fn resolve(
    path: &str,
    header: Option<&str>,
    config: &Config,
) -> Result<(String, String), ProxyError> {
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
            if first.is_empty() || first == "v1" || NATIVE.contains(&path) {
                return Err(ProxyError::MissingRoute);
            }
            (first, after_first)
        }
    };
    if !config.routes.contains_key(route) {
        return Err(ProxyError::UnknownRoute(route.to_string()));
    }
    let rest = if rest.is_empty() { "/" } else { rest };
    if !allowed(rest) {
        return Err(ProxyError::NotFound);
    }
    Ok((route.to_string(), rest.to_string()))
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
            ("POST", "/v1/chat/completions", false),
            ("POST", "/completion", false),
            ("POST", "/v1/embeddings", false),
            ("POST", "/v1/messages/count_tokens", true),
            ("POST", "/v1/responses/input_tokens", true),
            ("POST", "/v1/chat/completions/input_tokens", true),
            ("POST", "/v1/messages", false),
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

    #[test]
    fn only_inference_paths_are_forwarded() {
        for rest in [
            "/slots",
            "/metrics",
            "/",
            "/v1",
            "/slots/0?action=erase",
            "/v1/../slots",
        ] {
            check(&format!("/projA{rest}"), None, Err("not found"));
        }
    }
}
