//! What the real process writes: every log line splits into its kind and key=value pairs (issue
//! 13), and a client's text cannot forge a line.

use super::*;

/// Review finding: a body's `model` went into the request log line unescaped, so a newline in it
/// wrote a second, fake request line. It is quoted and escaped now: one request, one line.
#[test]
fn a_model_name_with_a_newline_stays_on_its_request_line() {
    let titan = sim();
    let mut crossbar = Crossbar::start(|head| {
        format!(
            "{head}{}[routes.projA]\nhosts = [\"titan\"]\nmodel = \"m\"\n",
            host_text("titan", &titan)
        )
    });
    let forged = "x\n2026-11-29T00:00:00.000Z [INFO] route=projB host=titan lease=new model=m \
                  fp=00000000 status=200";
    let mut body = chat("hi", 0, false);
    body["model"] = forged.into();
    crossbar.post(CHAT, &body);
    let line = crossbar.wait_log("route=projB");
    assert!(
        line.contains("route=projA") && line.contains("model=\"x\\n2026"),
        "the forged text made its own line: {line}"
    );
}

/// A log line is `TIME [LEVEL] kind words key=value key="quoted value" ...`: the kind is lowercase
/// words, and after it every token is a key=value pair (issue 13).
#[track_caller]
pub(super) fn check_splits(line: &str) {
    let mut rest = line
        .splitn(3, ' ')
        .nth(2)
        .unwrap_or_else(|| panic!("{line}"));
    let mut pairs = 0;
    while !rest.is_empty() {
        let end = rest.find(' ').unwrap_or(rest.len());
        let token = &rest[..end];
        match token.split_once('=') {
            None => {
                assert_eq!(pairs, 0, "a bare word after key=value pairs: {line}");
                assert!(
                    token.chars().all(|c| c.is_ascii_lowercase()),
                    "kind word {token:?}: {line}"
                );
                rest = rest[end..].trim_start();
            }
            Some((key, value)) => {
                pairs += 1;
                assert!(
                    !key.is_empty() && key.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                    "key {key:?}: {line}"
                );
                let after_key = &rest[key.len() + 1..];
                let len = if value.starts_with('"') {
                    // A quoted value runs to the next unescaped quote.
                    let bytes = after_key.as_bytes();
                    let mut i = 1;
                    while i < bytes.len() && bytes[i] != b'"' {
                        i += if bytes[i] == b'\\' { 2 } else { 1 };
                    }
                    assert!(i < bytes.len(), "unterminated quote: {line}");
                    i + 1
                } else {
                    assert!(!value.contains('"'), "stray quote: {line}");
                    value.len()
                };
                let next = &after_key[len..];
                assert!(
                    next.is_empty() || next.starts_with(' '),
                    "value of {key} runs on: {line}"
                );
                rest = next.trim_start();
            }
        }
    }
}
