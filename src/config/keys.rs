//! Client keys in the config (issue 25): `[keys.NAME]` with the SHA-256 of the key (never the key),
//! the routes it may use, and its optional limits. Checked here with every problem named by its
//! key; the request path's use of them is `crate::keys`.

use std::collections::BTreeMap;

use super::raw::RawKey;
use super::validate::valid_name;
use super::{Problem, Route};

/// One client key as the config gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientKey {
    pub name: String,
    /// SHA-256 of the key's bytes.
    pub hash: [u8; 32],
    /// The routes it may use; `None`: all.
    pub routes: Option<Vec<String>>,
    /// Its requests in flight at once, queued ones included.
    pub max_in_flight: Option<usize>,
    /// Prompt plus completion tokens per UTC day.
    pub tokens_per_day: Option<u64>,
}

impl ClientKey {
    pub fn allows(&self, route: &str) -> bool {
        self.routes
            .as_ref()
            .is_none_or(|r| r.iter().any(|x| x == route))
    }
}

pub(super) fn validate_keys(
    raw: BTreeMap<String, RawKey>,
    routes: &BTreeMap<String, Route>,
    problems: &mut Vec<Problem>,
) -> BTreeMap<String, ClientKey> {
    let mut keys = BTreeMap::new();
    let mut seen: BTreeMap<[u8; 32], String> = BTreeMap::new();
    for (name, raw) in raw {
        let key = format!("keys.{name}");
        if !valid_name(&name) {
            problems.push(Problem::new(
                &key,
                "key names use only letters, digits, '-' and '_'",
            ));
        }
        let hash = match raw.hash.as_deref().map(parse_hash) {
            None => {
                problems.push(Problem::new(
                    format!("{key}.hash"),
                    "is missing; `crossbar key new NAME` prints one",
                ));
                [0; 32]
            }
            Some(Err(msg)) => {
                problems.push(Problem::new(format!("{key}.hash"), msg));
                [0; 32]
            }
            Some(Ok(hash)) => {
                if let Some(other) = seen.insert(hash, name.clone()) {
                    problems.push(Problem::new(
                        format!("{key}.hash"),
                        format!("is the same as keys.{other}.hash: each key needs its own"),
                    ));
                }
                hash
            }
        };
        for route in raw.routes.iter().flatten() {
            if !routes.contains_key(route) {
                problems.push(Problem::new(
                    format!("{key}.routes"),
                    format!("unknown route {route:?}"),
                ));
            }
        }
        if raw.max_in_flight == Some(0) {
            problems.push(Problem::new(
                format!("{key}.max_in_flight"),
                "must be at least 1; leave it out for no limit",
            ));
        }
        if raw.tokens_per_day == Some(0) {
            problems.push(Problem::new(
                format!("{key}.tokens_per_day"),
                "must be at least 1; leave it out for no limit",
            ));
        }
        let client = ClientKey {
            name: name.clone(),
            hash,
            routes: raw.routes,
            max_in_flight: raw.max_in_flight,
            tokens_per_day: raw.tokens_per_day,
        };
        keys.insert(name, client);
    }
    keys
}

/// `sha256:` and 64 hex digits.
fn parse_hash(text: &str) -> Result<[u8; 32], String> {
    let hex = text
        .strip_prefix("sha256:")
        .ok_or("must start with sha256: (the SHA-256 of the key, never the key itself)")?;
    if hex.len() != 64 {
        return Err(format!(
            "has {} hex digits after sha256:, not 64",
            hex.len()
        ));
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
            .map_err(|_| "holds a character that is not a hex digit".to_string())?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    const BASE: &str = "[hosts.a]\nurl = \"http://127.0.0.1:9\"\n[hosts.a.models.m]\n\
                        [routes.projA]\nhosts = [\"a\"]\nmodel = \"m\"\n";
    const HASH: &str = "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    fn problems(keys: &str) -> Vec<String> {
        match Config::from_toml(&format!("{BASE}{keys}")) {
            Ok(_) => Vec::new(),
            Err(err) => err.lines(),
        }
    }

    #[test]
    fn every_key_problem_is_named_by_its_key() {
        let ok =
            format!("[keys.alice]\nhash = \"{HASH}\"\nroutes = [\"projA\"]\nmax_in_flight = 2\n");
        assert_eq!(problems(&ok), Vec::<String>::new());
        let cfg = Config::from_toml(&format!("{BASE}{ok}")).unwrap();
        assert!(cfg.keys["alice"].allows("projA") && !cfg.keys["alice"].allows("projB"));
        let bad = format!(
            "[keys.\"bad name\"]\nhash = \"{HASH}x\"\n[keys.b]\nhash = \"9f86\"\n\
             [keys.c]\nhash = \"{HASH}\"\nroutes = [\"nope\"]\nmax_in_flight = 0\ntokens_per_day = 0\n\
             [keys.d]\nhash = \"{HASH}\"\n[keys.e]\n[keys.f]\nhash = \"plain-key\"\n"
        );
        let lines = problems(&bad);
        for want in [
            "keys.bad name: key names use only letters, digits, '-' and '_'",
            "keys.bad name.hash: has 65 hex digits after sha256:, not 64",
            "keys.b.hash: must start with sha256: (the SHA-256 of the key, never the key itself)",
            "keys.c.routes: unknown route \"nope\"",
            "keys.c.max_in_flight: must be at least 1; leave it out for no limit",
            "keys.c.tokens_per_day: must be at least 1; leave it out for no limit",
            "keys.d.hash: is the same as keys.c.hash: each key needs its own",
            "keys.e.hash: is missing; `crossbar key new NAME` prints one",
            "keys.f.hash: must start with sha256: (the SHA-256 of the key, never the key itself)",
        ] {
            assert!(
                lines.iter().any(|l| l == want),
                "{want:?} not in {lines:#?}"
            );
        }
    }
}
