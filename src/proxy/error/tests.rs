//! Issue 27: every refusal in the envelope of the client's API, its words kept as `code`.

use serde_json::{json, Value};

use super::*;

/// The error object of `err`'s answer in `shape`, checked to be that envelope and to carry the
/// status's kind, `code` and a message starting with the code.
#[track_caller]
fn error_of(err: &ProxyError, shape: Shape, kind: &str) -> Value {
    let body = err.body(shape);
    let error = match shape {
        Shape::OpenAi => {
            assert_eq!(body.as_object().map(|o| o.len()), Some(1), "{body}");
            body["error"].clone()
        }
        Shape::Anthropic => {
            assert_eq!(body.as_object().map(|o| o.len()), Some(2), "{body}");
            assert_eq!(body["type"], "error", "{body}");
            body["error"].clone()
        }
    };
    assert_eq!(error["type"], kind, "{body}");
    assert_eq!(error["code"], err.to_string(), "{body}");
    let message = error["message"].as_str().unwrap_or_default();
    assert!(message.starts_with(&format!("{err}: ")), "{body}");
    assert!(message.len() > err.to_string().len() + 10, "{body}");
    error
}

#[test]
fn issue27_each_refusal_has_its_status_kind_and_a_message_in_both_envelopes() {
    let routes = vec!["projA".to_string(), "projB".to_string()];
    let table = [
        (
            ProxyError::MissingRoute {
                routes: routes.clone(),
            },
            400,
            "invalid_request_error",
        ),
        (ProxyError::ConflictingRoute, 400, "invalid_request_error"),
        (
            ProxyError::BadBody("bad chunk".into()),
            400,
            "invalid_request_error",
        ),
        (
            ProxyError::BadRequest("path: dot segment".into()),
            400,
            "invalid_request_error",
        ),
        (
            ProxyError::PromptTooLarge {
                estimate: 5000,
                exact: None,
                max: 4096,
            },
            400,
            "invalid_request_error",
        ),
        (
            ProxyError::UnknownRoute {
                route: "x".into(),
                routes,
            },
            404,
            "not_found_error",
        ),
        (ProxyError::NotFound, 404, "not_found_error"),
        (
            ProxyError::MissingV1 {
                route: "projA".into(),
            },
            404,
            "not_found_error",
        ),
        (
            ProxyError::BaseUrl {
                route: "projA".into(),
                mistake: Mistake::V1Twice,
            },
            404,
            "not_found_error",
        ),
        (ProxyError::Unauthorized, 401, "authentication_error"),
        (ProxyError::UnknownKey, 401, "authentication_error"),
        (ProxyError::UnreadableKey, 401, "authentication_error"),
        (
            ProxyError::ModelNotFound {
                model: "x".into(),
                served: vec!["m".into()],
            },
            404,
            "not_found_error",
        ),
        (ProxyError::BodyTimeout, 408, "invalid_request_error"),
        (ProxyError::BodyTooLarge, 413, "request_too_large"),
        (
            ProxyError::HeadTooLarge("why"),
            431,
            "invalid_request_error",
        ),
        (ProxyError::UriTooLong, 414, "invalid_request_error"),
        (ProxyError::Internal("boom".into()), 500, "api_error"),
        (
            ProxyError::Upstream {
                host: "titan".into(),
                detail: "reset".into(),
                refused: false,
            },
            502,
            "api_error",
        ),
        (
            ProxyError::NoHealthyHost(Vec::new()),
            503,
            "overloaded_error",
        ),
        (
            ProxyError::PinnedDown("titan".into()),
            503,
            "overloaded_error",
        ),
        (ProxyError::QueueFull, 503, "overloaded_error"),
        (ProxyError::QueueTimeout, 503, "overloaded_error"),
        (ProxyError::ShuttingDown, 503, "overloaded_error"),
        (ProxyError::StoreUnavailable, 503, "overloaded_error"),
    ];
    for (err, status, kind) in &table {
        assert_eq!(err.status(), *status, "{err}");
        let openai = error_of(err, Shape::OpenAi, kind);
        let anthropic = error_of(err, Shape::Anthropic, kind);
        // The same object, but for a base URL's shape (issue 48: below).
        if openai["hint"]
            .as_str()
            .is_none_or(|h| !h.contains("base URL"))
        {
            assert_eq!(openai, anthropic, "the same error object in both envelopes");
        }
    }
}

#[test]
fn issue27_crossbars_fields_stay_inside_the_error_object() {
    let err = ProxyError::ModelNotFound {
        model: "made-up".into(),
        served: vec!["m".into(), "n".into()],
    };
    let hint = "no host of this route serves \"made-up\"; name one of: m, n";
    assert_eq!(
        err.body(Shape::OpenAi),
        json!({"error": {"message": format!("model_not_found: {hint}"), "type": "not_found_error",
                         "code": "model_not_found", "hint": hint, "model": "made-up",
                         "served": ["m", "n"]}})
    );
    let err = ProxyError::PromptTooLarge {
        estimate: 5000,
        exact: Some(4200),
        max: 4096,
    };
    let error = error_of(&err, Shape::Anthropic, "invalid_request_error");
    assert_eq!(
        (&error["estimate"], &error["exact"], &error["max"]),
        (&json!(5000), &json!(4200), &json!(4096))
    );
    assert!(
        error["message"].as_str().unwrap().contains("4200 tokens"),
        "{error}"
    );
    let err = ProxyError::Upstream {
        host: "titan".into(),
        detail: "10.0.0.1:8080: connection reset".into(),
        refused: false,
    };
    let error = error_of(&err, Shape::OpenAi, "api_error");
    assert_eq!(error["host"], "titan");
    assert!(
        !error.to_string().contains("10.0.0.1"),
        "upstream detail stays in the log: {error}"
    );
    let err = ProxyError::Internal("lease table: poisoned".into());
    let error = error_of(&err, Shape::OpenAi, "api_error");
    assert!(!error.to_string().contains("poisoned"), "{error}");
}

/// Issue 48: an Anthropic SDK's base URL is `http://<gateway>/<route>` (it adds `/v1/messages`),
/// an OpenAI SDK's `http://<gateway>/<route>/v1`: each hint names its client's.
#[test]
fn each_api_is_told_its_own_base_url_issue_48() {
    let routes = vec!["projA".to_string()];
    for (err, openai, anthropic) in [
        (
            ProxyError::MissingRoute {
                routes: routes.clone(),
            },
            "use http://<gateway>/<route>/v1 as the base URL",
            "use http://<gateway>/<route> as the base URL",
        ),
        (
            ProxyError::UnknownRoute {
                route: "projB".into(),
                routes,
            },
            "use http://<gateway>/<route>/v1 as the base URL",
            "use http://<gateway>/<route> as the base URL",
        ),
        (
            ProxyError::BaseUrl {
                route: "projA".into(),
                mistake: Mistake::V1Twice,
            },
            "the path has /v1 twice: use http://<gateway>/projA/v1 as the base URL",
            "the path has /v1 twice: use http://<gateway>/projA as the base URL; the Anthropic SDK",
        ),
    ] {
        let hint = |shape| {
            err.body(shape)["error"]["hint"]
                .as_str()
                .unwrap()
                .to_string()
        };
        assert!(
            hint(Shape::OpenAi).contains(openai),
            "{}",
            hint(Shape::OpenAi)
        );
        assert!(
            hint(Shape::Anthropic).contains(anthropic),
            "{}",
            hint(Shape::Anthropic)
        );
        assert!(
            !hint(Shape::Anthropic).contains("/v1 as"),
            "{}",
            hint(Shape::Anthropic)
        );
    }
}

/// Issue 48: someone who sent a key is not told to send one; nothing is said of the keys known.
#[test]
fn a_wrong_key_is_not_told_to_send_one_issue_48() {
    let message = |err: ProxyError| err.body(Shape::OpenAi)["error"]["message"].to_string();
    assert!(message(ProxyError::Unauthorized).contains("needs a client key: send it as"));
    let wrong = message(ProxyError::UnknownKey);
    assert!(wrong.contains("not one this gateway knows"), "{wrong}");
    assert!(!wrong.contains("send it as"), "{wrong}");
    let unreadable = message(ProxyError::UnreadableKey);
    assert!(unreadable.contains("send one key, once"), "{unreadable}");
}

/// Issue 48: SDKs show the message, not `Retry-After`: the wait is in the message.
#[test]
fn a_429_says_how_long_to_wait_issue_48() {
    let err = ProxyError::TooManyRequests {
        retry_after: 3600,
        why: "this key's tokens_per_day are spent; they start afresh at 00:00 UTC",
    };
    let error = error_of(&err, Shape::OpenAi, "rate_limit_error");
    assert_eq!(
        error["message"],
        "too many requests: this key's tokens_per_day are spent; they start afresh at 00:00 UTC; \
         retry in 3600 s (Retry-After)"
    );
}
