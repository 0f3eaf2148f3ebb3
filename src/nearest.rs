//! "Did you mean": the known name nearest to a mistyped one — `pararell` → `parallel` for config
//! keys, `tital` → `titan` for an operator verb's host, `/proja` → `projA` for a client's route.
//! Pure.

/// The name in `known` nearest to `word` when it is close enough to be a typo: the same but for
/// case, or an edit distance (case ignored) of at most 3 and under half the known name's length.
/// Among equally near names, the one nearer with case counted wins, then the first.
pub fn nearest<'a>(word: &str, known: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let lower = word.to_lowercase();
    known
        .into_iter()
        .map(|k| (distance(&lower, &k.to_lowercase()), distance(word, k), k))
        .filter(|(d, _, k)| *d <= 3 && *d * 2 < k.chars().count())
        .min_by_key(|(d, exact, _)| (*d, *exact))
        .map(|(_, _, k)| k)
}

/// Levenshtein distance over chars.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diagonal + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typo_gets_the_nearest_name_and_a_stranger_none() {
        let hosts = ["titan", "mini", "titan2"];
        for (word, want) in [
            ("tital", Some("titan")),
            ("TITAN", Some("titan")),
            ("mni", Some("mini")),
            ("titan22", Some("titan2")),
            ("zzz", None),
            ("m", None),
        ] {
            assert_eq!(nearest(word, hosts), want, "{word}");
        }
        assert_eq!(nearest("proja", ["projA", "projB"]), Some("projA"));
        assert_eq!(nearest("projA", ["proja", "projA"]), Some("projA"));
        assert_eq!(nearest("x", []), None);
    }
}
