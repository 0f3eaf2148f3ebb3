//! Values in `key=value` log lines. Owns the one rule that keeps a log line one line and its
//! keys unforgeable: a value goes out bare when it is non-empty and made only of safe
//! characters, else double-quoted with `"`, `\` and control characters escaped. Every value that
//! can come from a client or an upstream (model names, error messages, paths) goes through it.
//! Must not do I/O or decide what is logged.

use std::fmt;

/// `s` cut to at most `max` bytes, on a char boundary: what a client or host sent sizes no line.
pub fn cut(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// An error and its sources, joined with ": ": the whole story on one line (the CLI's error
/// line, log values). Pass the result through [`val`] when it goes into a `key=value` line.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        next = cause.source();
    }
    out
}

/// Displays `s` as a log value: bare if safe, else quoted and escaped. An empty value is `""`.
pub fn val(s: &str) -> Val<'_> {
    Val(s)
}

/// A log value; see [`val`].
#[derive(Debug, Clone, Copy)]
pub struct Val<'a>(&'a str);

impl fmt::Display for Val<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.0.is_empty() && self.0.chars().all(is_safe) {
            return f.write_str(self.0);
        }
        f.write_str("\"")?;
        for c in self.0.chars() {
            match c {
                '"' => f.write_str("\\\"")?,
                '\\' => f.write_str("\\\\")?,
                '\n' => f.write_str("\\n")?,
                '\r' => f.write_str("\\r")?,
                '\t' => f.write_str("\\t")?,
                c if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}') => {
                    write!(f, "\\u{{{:x}}}", c as u32)?
                }
                c => write!(f, "{c}")?,
            }
        }
        f.write_str("\"")
    }
}

/// Printable ASCII that cannot end a value, start a key or open a quote.
fn is_safe(c: char) -> bool {
    c.is_ascii_graphic() && !matches!(c, '"' | '\\' | '=' | '\'')
}

#[cfg(test)]
mod tests {
    use super::val;

    #[track_caller]
    fn check(input: &str, expected: &str) {
        assert_eq!(val(input).to_string(), expected);
    }

    #[test]
    fn plain_values_stay_bare() {
        check("qwen-coder", "qwen-coder");
        check(
            "Qwen2.5-7B-Instruct-Q4_K_M.gguf",
            "Qwen2.5-7B-Instruct-Q4_K_M.gguf",
        );
        check("127.0.0.1:8080", "127.0.0.1:8080");
        check("/admin/pin", "/admin/pin");
        check("-", "-");
    }

    #[test]
    fn empty_is_quoted() {
        check("", "\"\"");
    }

    #[test]
    fn spaces_and_equals_are_quoted() {
        check("pinned host down", "\"pinned host down\"");
        check("a=b", "\"a=b\"");
        check("it's", "\"it's\"");
    }

    #[test]
    fn newlines_quotes_and_backslashes_are_escaped() {
        check(
            "x\n2026-11-29 [INFO] route=projB status=200",
            "\"x\\n2026-11-29 [INFO] route=projB status=200\"",
        );
        check("say \"hi\"", "\"say \\\"hi\\\"\"");
        check("a\\b", "\"a\\\\b\"");
        check("cr\rtab\t", "\"cr\\rtab\\t\"");
        check("bell\u{7}del\u{7f}", "\"bell\\u{7}del\\u{7f}\"");
        check("ünïcode", "\"ünïcode\"");
    }

    #[test]
    fn output_is_always_one_line() {
        for s in ["\n", "\r\n", "\u{2028}", "a\u{85}b", "\u{0}"] {
            let out = val(s).to_string();
            assert!(!out.contains('\n') && !out.contains('\r'), "{out:?}");
            assert!(
                !out.chars().any(|c| c.is_control() || c == '\u{2028}'),
                "{out:?}"
            );
        }
    }
}
