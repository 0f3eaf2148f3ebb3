//! The count calls' bounds: the deadline, turns per host, endpoints per API, `/tokenize` answers.

use super::*;

impl Counter {
    fn start_now(&self, host: &str) -> Option<CountPermit<'_>> {
        self.start(host, Instant::now())
    }
}
use std::net::TcpListener;
use std::time::Duration;

/// A host on a loopback listener that accepts (the kernel's backlog does) and never answers;
/// the listener must be kept for as long as the host is asked.
pub(super) fn silent_host(name: &str) -> (TcpListener, Host) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let host = Host {
        name: name.into(),
        url: format!("http://{}", listener.local_addr().unwrap()),
        weight: 1,
        api_key: None,
        ctx: None,
        kv_tokens: None,
        slot_prompt_similarity: 0.1,
        pin_slots: false,
        models: Default::default(),
        upstream: Default::default(),
    };
    (listener, host)
}

#[test]
fn a_host_that_does_not_answer_in_time_cannot_count() {
    let (listener, host) = silent_host("hung");
    // Accepts (the kernel's backlog does) and never answers.
    let agent = ureq::Agent::new_with_defaults();
    let started = Instant::now();
    let deadline = started + Duration::from_millis(200);
    let body = br#"{"messages":[{"role":"user","content":"hi"}]}"#;
    let counted = exact(&agent, &host, "/v1/chat/completions", body, None, deadline);
    assert_eq!(counted, None);
    let took = started.elapsed();
    // It waited for the host until the deadline: ureq's timers count whole milliseconds from its
    // own start, so the wait may end a fraction of one early (199.4 ms seen on a busy machine).
    assert!(took >= Duration::from_millis(190), "{took:?}");
    assert!(
        took < Duration::from_secs(3),
        "the deadline bounds the wait: {took:?}"
    );
    drop(listener);
}

#[test]
fn a_request_waits_for_a_turn_until_its_deadline_then_goes_without() {
    let counter = Counter::new(ureq::Agent::new_with_defaults());
    let held: Vec<_> = (0..PER_HOST)
        .map(|_| counter.start_now("a").unwrap())
        .collect();
    let started = Instant::now();
    assert!(counter
        .start("a", started + Duration::from_millis(20))
        .is_none());
    assert!(started.elapsed() >= Duration::from_millis(20));
    assert_eq!(counter.waiting(), 0);
    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            counter
                .start("a", Instant::now() + Duration::from_secs(30))
                .is_some()
        });
        let give_up = Instant::now() + Duration::from_secs(10);
        while counter.waiting() == 0 {
            assert!(Instant::now() < give_up, "the waiter never started waiting");
            std::thread::yield_now();
        }
        drop(held);
        assert!(waiter.join().unwrap(), "a returned permit wakes the waiter");
    });
}

#[test]
fn each_host_counts_for_at_most_per_host_requests_and_a_permit_comes_back_on_drop() {
    let counter = Counter::new(ureq::Agent::new_with_defaults());
    let mut held: Vec<_> = (0..PER_HOST)
        .map(|_| counter.start_now("a").expect("under the bound"))
        .collect();
    assert!(counter.start_now("a").is_none(), "at the bound");
    let other = counter
        .start_now("b")
        .expect("another host has its own bound");
    held.pop();
    let again = counter.start_now("a").expect("a permit came back");
    assert!(counter.start_now("a").is_none());
    drop((again, other));
    assert_eq!(counter.in_flight.lock().len(), 1, "b is gone, a holds one");
    drop(held);
    assert!(
        counter.in_flight.lock().is_empty(),
        "no host is left without a call"
    );
}

#[test]
fn each_api_names_its_count_endpoint() {
    let path = |rest| match count_call(rest) {
        Some(CountCall::Endpoint { path, .. }) => path,
        other => panic!("{rest}: {other:?}"),
    };
    assert_eq!(
        path("/v1/chat/completions"),
        "/v1/chat/completions/input_tokens"
    );
    assert_eq!(path("/v1/messages"), "/v1/messages/count_tokens");
    assert_eq!(path("/v1/responses"), "/v1/responses/input_tokens");
    assert_eq!(count_call("/completion"), Some(CountCall::Prompt));
    assert_eq!(count_call("/v1/completions"), Some(CountCall::Prompt));
    for uncounted in ["/v1/embeddings", "/infill", "/v1/models", "/tokenize"] {
        assert_eq!(count_call(uncounted), None, "{uncounted}");
    }
}

#[test]
fn token_lists_are_counted_at_every_split() {
    let answer = br#"{"tokens":[128000, 9906,1917 ,0]}"#;
    for split in 0..answer.len() {
        let (a, b) = answer.split_at(split);
        assert_eq!(count_tokens(a.chain(b)), Some(4), "split at {split}");
    }
    assert_eq!(count_tokens(&br#"{"tokens":[]}"#[..]), Some(0));
    assert_eq!(count_tokens(&br#"{"tokens":[1,2"#[..]), None, "cut short");
    let pieces = br#"{"tokens":[{"id":1,"piece":"a"}]}"#;
    assert_eq!(count_tokens(&pieces[..]), None);
    assert_eq!(count_tokens(&b"<html>"[..]), None);
}
