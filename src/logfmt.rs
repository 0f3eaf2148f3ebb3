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
        if is_bare(self.0) {
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

/// Whether `s` goes out bare: non-empty, and only printable ASCII that cannot end a value, start
/// a key or open a quote. Checked byte by byte: any byte of a non-ASCII character fails it.
fn is_bare(s: &str) -> bool {
    !s.is_empty()
        && (s.bytes()).all(|b| b.is_ascii_graphic() && !matches!(b, b'"' | b'\\' | b'=' | b'\''))
}

/// A `key=value` line built by appending, for the one line per request: each value is copied in
/// as [`val`] displays it, each number written by `itoa`. The same line through `write!` cost
/// twice the instructions, the formatting machinery's per argument (issue 26).
#[derive(Debug)]
pub struct Fields(String);

impl Fields {
    pub fn with_capacity(bytes: usize) -> Fields {
        Fields(String::with_capacity(bytes))
    }

    /// ` key=` (no space before the first key).
    fn key(&mut self, key: &str) -> &mut String {
        if !self.0.is_empty() {
            self.0.push(' ');
        }
        self.0.push_str(key);
        self.0.push('=');
        &mut self.0
    }

    /// `key=value`, `value` through [`val`]'s rule.
    pub fn val(&mut self, key: &str, value: &str) -> &mut Fields {
        let out = self.key(key);
        if is_bare(value) {
            out.push_str(value);
        } else {
            // Quoted and escaped, rarely: writing into a `String` cannot fail.
            let _ = fmt::Write::write_fmt(out, format_args!("{}", Val(value)));
        }
        self
    }

    /// `key=token` for a value crossbar itself chose from a fixed set (`lease=new`), not escaped.
    pub fn token(&mut self, key: &str, token: &str) -> &mut Fields {
        self.key(key).push_str(token);
        self
    }

    /// `key=n`.
    pub fn number(&mut self, key: &str, n: impl itoa::Integer) -> &mut Fields {
        self.key(key).push_str(itoa::Buffer::new().format(n));
        self
    }

    /// `key=n`, or `key=-` when the count is unknown.
    pub fn count(&mut self, key: &str, n: Option<i64>) -> &mut Fields {
        match n {
            Some(n) => self.number(key, n),
            None => self.token(key, "-"),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::{val, Fields};

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

    #[test]
    fn a_line_of_fields_reads_as_val_writes_it() {
        let mut line = Fields::with_capacity(8);
        line.val("route", "projB")
            .token("lease", "new")
            .val("model", "say \"hi\" = x")
            .number("status", 200u16)
            .number("total_ms", -3i64)
            .count("prompt", Some(12))
            .count("cached", None)
            .val("err", "");
        assert_eq!(
            line.as_str(),
            format!(
                "route=projB lease=new model={} status=200 total_ms=-3 prompt=12 cached=- err=\"\"",
                val("say \"hi\" = x")
            )
        );
        assert_eq!(
            line.as_str(),
            "route=projB lease=new model=\"say \\\"hi\\\" = x\" status=200 total_ms=-3 prompt=12 \
             cached=- err=\"\""
        );
    }
}
