//! A request's header lines: every name and value in one buffer, so a head costs two allocations
//! however many lines it has (a `String` per name and per value was a tenth of a request's
//! allocations, issue 26). Read-only once parsed, apart from being moved whole.

/// Header lines in the order sent. Names as sent (compare them ignoring ASCII case), values
/// trimmed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers {
    text: String,
    /// Per line: where its name starts, where its name ends (its value starts) and where its value
    /// ends, in `text`.
    lines: Vec<[u32; 3]>,
}

impl Headers {
    /// Room for `lines` lines of `bytes` bytes in all.
    pub fn with_capacity(lines: usize, bytes: usize) -> Headers {
        Headers {
            text: String::with_capacity(bytes),
            lines: Vec::with_capacity(lines),
        }
    }

    /// Appends a line. A head is at most [`super::MAX_HEAD`] bytes, far inside `u32`.
    pub fn push(&mut self, name: &str, value: &str) {
        let at = |text: &String| u32::try_from(text.len()).unwrap_or(u32::MAX);
        let start = at(&self.text);
        self.text.push_str(name);
        let split = at(&self.text);
        self.text.push_str(value);
        self.lines.push([start, split, at(&self.text)]);
    }

    /// `(name, value)` of every line, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> + '_ {
        let part = |from: u32, to: u32| self.text.get(from as usize..to as usize).unwrap_or("");
        (self.lines.iter()).map(move |&[start, split, end]| (part(start, split), part(split, end)))
    }

    /// The first value of the header `name` (ignoring ASCII case).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.all(name).next()
    }

    /// Every value of the header `name` (ignoring ASCII case), in order.
    pub fn all<'h, 'n>(&'h self, name: &'n str) -> impl Iterator<Item = &'h str> + use<'h, 'n> {
        (self.iter())
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    }

    pub fn len(&self) -> usize {
        self.lines.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }
}

impl<'a> FromIterator<(&'a str, &'a str)> for Headers {
    fn from_iter<I: IntoIterator<Item = (&'a str, &'a str)>>(lines: I) -> Headers {
        let mut headers = Headers::default();
        for (name, value) in lines {
            headers.push(name, value);
        }
        headers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_come_back_in_order_and_are_found_ignoring_case() {
        let h: Headers = [
            ("Host", "x"),
            ("Cookie", "a=1"),
            ("cookie", "b=2"),
            ("X-Empty", ""),
        ]
        .into_iter()
        .collect();
        assert_eq!(h.len(), 4);
        assert_eq!(
            h.iter().collect::<Vec<_>>(),
            [
                ("Host", "x"),
                ("Cookie", "a=1"),
                ("cookie", "b=2"),
                ("X-Empty", "")
            ]
        );
        assert_eq!(h.get("HOST"), Some("x"));
        assert_eq!(h.all("COOKIE").collect::<Vec<_>>(), ["a=1", "b=2"]);
        assert_eq!(h.get("x-empty"), Some(""));
        assert_eq!(h.get("absent"), None);
        assert!(Headers::default().is_empty());
    }
}
