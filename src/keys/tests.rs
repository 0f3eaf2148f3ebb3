//! Client keys: where a key may come from, who it names, what it may do, and the brute-force
//! guard — each answer as a story, with its bounds.

use std::collections::BTreeMap;

use super::*;
use crate::config::ClientKey;

/// (name, key, routes, max_in_flight, tokens_per_day)
type Spec<'a> = (
    &'a str,
    &'a str,
    Option<&'a [&'a str]>,
    Option<usize>,
    Option<u64>,
);

fn config(keys: &[Spec<'_>]) -> Config {
    let mut config = Config::from_toml(
        "[hosts.a]\nurl = \"http://127.0.0.1:9\"\n[hosts.a.models.m]\n\
         [routes.projA]\nhosts = [\"a\"]\nmodel = \"m\"\n\
         [routes.projB]\nhosts = [\"a\"]\nmodel = \"m\"\n",
    )
    .unwrap();
    let mut all = BTreeMap::new();
    for (name, key, routes, max, budget) in keys {
        let hash: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        let client = ClientKey {
            name: name.to_string(),
            hash,
            routes: routes.map(|r| r.iter().map(|s| s.to_string()).collect()),
            max_in_flight: *max,
            tokens_per_day: *budget,
        };
        all.insert(name.to_string(), client);
    }
    config.keys = all;
    config
}

fn headers(pairs: &[(&str, &str)]) -> Headers {
    pairs.iter().copied().collect()
}

const PEER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 7));

#[test]
fn a_key_is_read_from_every_place_real_clients_put_it() {
    let c = config(&[("alice", "k-alice", None, None, None)]);
    let keys = Keys::default();
    for (name, value) in [
        ("Authorization", "Bearer k-alice"),
        ("authorization", "bearer  k-alice "),
        ("x-api-key", "k-alice"),
        ("api-key", "k-alice"),
    ] {
        let got = keys.identify(&c, &headers(&[(name, value)]), PEER, 0);
        assert_eq!(got, Ok(Some("alice".to_string())), "{name}: {value}");
    }
    // Two places agreeing are one key; disagreeing, or one header twice, are refused.
    let both = headers(&[
        ("Authorization", "Bearer k-alice"),
        ("x-api-key", "k-alice"),
    ]);
    assert_eq!(keys.identify(&c, &both, PEER, 0), Ok(Some("alice".into())));
    for (refused, why) in [
        (
            headers(&[("Authorization", "Bearer k-alice"), ("x-api-key", "k-bob")]),
            Denied::Unreadable,
        ),
        (
            headers(&[("x-api-key", "k-alice"), ("x-api-key", "k-alice")]),
            Denied::Unreadable,
        ),
        (
            headers(&[("Authorization", "Basic k-alice")]),
            Denied::Unreadable,
        ),
        (headers(&[("x-api-key", "k-nobody")]), Denied::UnknownKey),
        (headers(&[]), Denied::Unauthorized),
    ] {
        assert_eq!(
            keys.identify(&c, &refused, PEER, 0),
            Err(why),
            "{refused:?}"
        );
    }
    // No keys configured: open, as before.
    let open = config(&[]);
    assert_eq!(keys.identify(&open, &headers(&[]), PEER, 0), Ok(None));
}

#[test]
fn a_key_is_held_to_its_routes_its_requests_in_flight_and_its_days_tokens() {
    let c = config(&[("ci", "k-ci", Some(&["projB"]), Some(2), Some(1000))]);
    let keys = Arc::new(Keys::default());
    assert_eq!(
        keys.admit(&c, "ci", "projA", 0).unwrap_err(),
        Denied::Forbidden
    );
    let one = keys.admit(&c, "ci", "projB", 0).unwrap();
    let _two = keys.admit(&c, "ci", "projB", 0).unwrap();
    assert!(matches!(
        keys.admit(&c, "ci", "projB", 0),
        Err(Denied::TooMany { retry_after: 1, .. })
    ));
    drop(one);
    let three = keys.admit(&c, "ci", "projB", 0).unwrap();
    drop(three);
    // The day's budget: spent at 01:00 UTC, refused until midnight, afresh the next day.
    let hour = 3_600_000;
    for spent in [600, 400] {
        keys.admit(&c, "ci", "projB", hour)
            .unwrap()
            .settle(spent, hour);
    }
    match keys.admit(&c, "ci", "projB", hour) {
        Err(Denied::TooMany { retry_after, .. }) => assert_eq!(retry_after, 23 * 3600),
        other => panic!("{other:?}"),
    }
    assert_eq!(keys.usage(&c, hour), [("ci".to_string(), 1000, 1)]);
    assert!(keys.admit(&c, "ci", "projB", 24 * hour).is_ok());
    // What a restart reads back from today's rows counts too.
    keys.rebuild([("ci".to_string(), 5000)], 24 * hour);
    assert!(keys.admit(&c, "ci", "projB", 24 * hour).is_err());
}

#[test]
fn more_than_ten_failures_a_minute_shut_an_address_out_even_with_a_right_key() {
    let c = config(&[("alice", "k-alice", None, None, None)]);
    let keys = Keys::default();
    let wrong = headers(&[("x-api-key", "guess")]);
    let right = headers(&[("x-api-key", "k-alice")]);
    for t in 0..=MAX_FAILURES as i64 {
        assert_eq!(keys.identify(&c, &wrong, PEER, t), Err(Denied::UnknownKey));
    }
    assert!(matches!(
        keys.identify(&c, &right, PEER, 20),
        Err(Denied::TooMany {
            retry_after: 60,
            ..
        })
    ));
    // Another address is not held to it; this one is let in a minute later.
    let other: IpAddr = [10, 0, 0, 8].into();
    assert_eq!(
        keys.identify(&c, &right, other, 20),
        Ok(Some("alice".into()))
    );
    assert_eq!(
        keys.identify(&c, &right, PEER, 20 + WINDOW_MS),
        Ok(Some("alice".into()))
    );
    // The table of addresses is bounded.
    for i in 0..(PEERS as u32 + 10) {
        let ip = IpAddr::V4(std::net::Ipv4Addr::from(0x0b00_0000 + i));
        let _ = keys.identify(&c, &wrong, ip, 100);
    }
    assert!(keys.inner.lock().peers.len() <= PEERS);
}

#[test]
fn a_new_key_is_random_and_its_hash_is_what_the_config_takes() {
    let (key, hash) = new_key().unwrap();
    let (other, _) = new_key().unwrap();
    assert_ne!(key, other);
    assert!(key.starts_with("cb-") && key.len() == 3 + 64, "{key}");
    let c = Config::from_toml(&format!(
        "[hosts.a]\nurl = \"http://127.0.0.1:9\"\n[hosts.a.models.m]\n\
         [routes.projA]\nhosts = [\"a\"]\nmodel = \"m\"\n[keys.me]\nhash = \"{hash}\"\n"
    ))
    .unwrap();
    let keys = Keys::default();
    let sent = headers(&[("Authorization", &format!("Bearer {key}"))]);
    assert_eq!(keys.identify(&c, &sent, PEER, 0), Ok(Some("me".into())));
}

/// Issue 46: 10 requests at once spent 803 tokens of a 200-token budget, as admission looked
/// only at what was spent. Each reserves what it may spend; while the reservations of those in
/// flight reach the budget the next is refused for a second, and at its end what a request spent
/// replaces what it reserved.
#[test]
fn requests_in_flight_reserve_what_they_may_spend_of_the_days_tokens_issue_46() {
    let c = config(&[("ci", "k-ci", None, None, Some(200))]);
    let keys = Arc::new(Keys::default());
    let want = || Reserved {
        prompt: 30,
        output: 50,
    };
    let mut running = Vec::new();
    let mut refused = 0;
    for _ in 0..10 {
        match keys.admit(&c, "ci", "projA", 0) {
            Ok(admitted) => match admitted.reserve(&c, want, 0) {
                Ok(()) => running.push(admitted),
                Err(Denied::TooMany { retry_after, why }) => {
                    assert_eq!(retry_after, 1, "{why}");
                    refused += 1;
                }
                Err(other) => panic!("{other:?}"),
            },
            Err(Denied::TooMany { retry_after: 1, .. }) => refused += 1,
            Err(other) => panic!("{other:?}"),
        }
    }
    // 0, 80 and 160 are under 200: three run, seven wait their turn.
    assert_eq!((running.len(), refused), (3, 7));
    assert_eq!(running[0].reserved(), want());
    for admitted in running.drain(..) {
        admitted.settle(60, 0);
    }
    assert_eq!(keys.usage(&c, 0), [("ci".to_string(), 180, 0)]);
    // 180 spent, nothing reserved: one more may run, and may spend its reservation.
    let last = keys.admit(&c, "ci", "projA", 0).unwrap();
    last.reserve(&c, want, 0).unwrap();
    drop(last);
    assert_eq!(
        keys.usage(&c, 0),
        [("ci".to_string(), 180, 0)],
        "a drop spends nothing"
    );
    let spent = keys.admit(&c, "ci", "projA", 0).unwrap();
    spent.settle(20, 0);
    assert!(matches!(
        keys.admit(&c, "ci", "projA", 0),
        Err(Denied::TooMany {
            retry_after: 86_400,
            ..
        })
    ));
}
