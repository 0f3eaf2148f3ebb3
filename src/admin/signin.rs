//! The status page's sign-in when `admin_token` is set (issue 27): `GET /signin` (and `GET /` from a
//! browser that is not signed in) shows a form; `POST /signin` checks the token it sends and
//! answers 303 to `/` with a session cookie (`session`); `POST /signout` ends the session. The
//! token travels only in a POST body: never in a URL, never in a log line. Both POSTs keep the
//! admin listener's Origin check; the page itself has no scripts.

use std::time::Instant;

use subtle::ConstantTimeEq;

use super::{guard, Answer};
use crate::conn::{BodyError, Request};
use crate::sessions as session;
use crate::state::Gateway;

/// A sign-in form's body is one field.
const MAX_FORM: usize = 4096;

/// Answers `/signin` and `/signout`; `None` for every other path.
pub(super) fn handle(
    gw: &Gateway,
    request: &mut Request<'_>,
    method: &str,
    path: &str,
) -> Option<Answer> {
    Some(match (method, path) {
        ("GET" | "HEAD", "/signin") => match gw.config().admin_token {
            Some(_) => form(200, ""),
            None => see_other(),
        },
        ("POST", "/signin") => sign_in(gw, request),
        ("POST", "/signout") => sign_out(gw, request),
        (_, "/signin" | "/signout") => Answer::error(405, "method not allowed"),
        _ => return None,
    })
}

/// What a browser that is not signed in gets for the page (`GET /` with `Accept: text/html`): the
/// form, as a 401. Scripts and `curl` keep the JSON 401.
pub(super) fn instead_of_page(
    gw: &Gateway,
    request: &Request<'_>,
    method: &str,
    path: &str,
) -> Option<Answer> {
    let browser = request
        .header("Accept")
        .is_some_and(|a| a.contains("text/html"));
    let page = matches!(method, "GET" | "HEAD") && path == "/";
    (browser && page && gw.config().admin_token.is_some()).then(|| form(401, ""))
}

fn sign_in(gw: &Gateway, request: &mut Request<'_>) -> Answer {
    let config = gw.config();
    let Some(token) = config.admin_token.as_deref() else {
        return Answer::error(
            404,
            "no admin_token is set: the status page needs no sign-in",
        );
    };
    if let Err(refused) = guard::same_origin(request) {
        return refused;
    }
    let form_typed = (request.header("Content-Type"))
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| {
            v.trim()
                .eq_ignore_ascii_case("application/x-www-form-urlencoded")
        });
    if !form_typed {
        return Answer::error(415, "sign in with the form at /signin");
    }
    let body = match request.read_body(MAX_FORM) {
        Ok(body) => body,
        Err(BodyError::TooLarge) => return Answer::error(413, "body too large"),
        Err(err) => return Answer::error(400, format!("cannot read the body: {err}")),
    };
    let given = session::form_token(&body).unwrap_or_default();
    if !bool::from(given.as_slice().ct_eq(token.as_bytes())) {
        super::throttle::failed(gw, request);
        return form(401, "That is not this gateway's admin token.");
    }
    match gw.sessions.open(Instant::now()) {
        Ok(id) => {
            log::info!("admin signed in sessions={}", gw.sessions.len());
            let mut answer = see_other();
            answer
                .headers
                .push(("Set-Cookie", session::set_cookie(&id)));
            answer
        }
        Err(err) => Answer::error(
            500,
            format!("cannot make a session id from /dev/urandom: {err}"),
        ),
    }
}

fn sign_out(gw: &Gateway, request: &Request<'_>) -> Answer {
    if let Err(refused) = guard::same_origin(request) {
        return refused;
    }
    for id in session::cookies(request.headers()) {
        gw.sessions.close(id);
    }
    log::info!("admin signed out sessions={}", gw.sessions.len());
    let mut answer = see_other();
    answer.headers.push(("Set-Cookie", session::clear_cookie()));
    answer
}

/// The status page, with a sign-out button behind a token: reached there, it was signed in (or
/// sent the token), and the button is the page's one action.
pub(super) fn page(gw: &Gateway, html: String) -> String {
    if gw.config().admin_token.is_none() {
        return html;
    }
    let button = "<form method=post action=/signout style=\"float:right\">\
                  <button type=submit>Sign out</button></form>";
    html.replacen("<body>", &format!("<body>{button}"), 1)
}

/// 303 to the status page.
fn see_other() -> Answer {
    let mut answer = Answer::json(303, serde_json::json!({ "location": "/" }));
    answer.headers.push(("Location", "/".to_string()));
    answer
}

/// The sign-in page, with `problem` (already HTML) under the form.
fn form(status: u16, problem: &str) -> Answer {
    let problem = if problem.is_empty() {
        String::new()
    } else {
        format!("<p class=down>{problem}</p>")
    };
    let body = format!(
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>crossbar: sign in</title>\
         <style>{}</style></head><body><h1>crossbar</h1>\
         <p>This gateway's admin API has a token (<code>admin_token</code>). Enter it to see the \
         status page; the browser keeps a session cookie for {} hours, never the token.</p>\
         <form method=post action=/signin><label>admin token \
         <input type=password name=token autocomplete=current-password autofocus required></label> \
         <button type=submit>Sign in</button></form>{problem}</body></html>",
        crate::page::STYLE,
        session::LIFETIME.as_secs() / 3600
    );
    Answer::html(status, body)
}
