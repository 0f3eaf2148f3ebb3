//! The poller thread against a mix of fake hosts: one thread per host, so a hung host is marked
//! down after its timeout while a good one keeps its pace, every bad kind gets its reason, a
//! loading host comes up by the next poll, and `stop` joins every thread.

use std::sync::atomic::{AtomicBool, Ordering};

use super::*;

#[test]
fn the_poller_marks_each_bad_host_down_while_the_good_one_keeps_its_pace() {
    let (ok, slow, garbage, booting) = (
        fake(good),
        hung(),
        fake(|p| {
            if p == "/props" {
                (200, "{not json")
            } else {
                good(p)
            }
        }),
        fake(loading),
    );
    let hosts = vec![
        host("ok", &ok.url),
        host("slow", &slow.url),
        host("refused", &refusing_url()),
        host("garbage", &garbage.url),
        host("booting", &booting.url),
    ];
    let config: BTreeMap<_, _> = hosts.iter().map(|h| (h.name.clone(), h.clone())).collect();
    let health = Arc::new(Health::new(&config));
    let timeout = Duration::from_secs(1);
    let poller = Poller::start(
        Arc::clone(&health),
        Arc::new(Quiet),
        hosts,
        (Duration::from_millis(25), timeout),
    );

    // While the slow host's first poll hangs, the good host is polled again and again.
    slow.accepted
        .recv_timeout(BOUND)
        .expect("the slow host was asked");
    let _ = ok.hits.try_iter().count();
    let reason = |name: &str| health.get(name).and_then(|s| s.reason).map(|r| r.kind());
    crate::testwait::until("the slow host to be marked down", || {
        reason("slow").is_some()
    });
    let polls_meanwhile = ok.hits.try_iter().filter(|(p, _)| p == "/health").count();
    assert!(
        polls_meanwhile >= 3,
        "good host polled {polls_meanwhile} times during a {timeout:?} hang"
    );

    crate::testwait::until("every bad host to be marked down", || {
        ["refused", "garbage", "booting"]
            .iter()
            .all(|h| reason(h).is_some())
    });
    assert_eq!(reason("slow"), Some("unreachable"));
    assert_eq!(reason("refused"), Some("unreachable"));
    assert_eq!(reason("garbage"), Some("bad answer"));
    assert_eq!(reason("booting"), Some("loading"));
    let good_status = health.get("ok").unwrap();
    assert!(good_status.healthy);
    assert_eq!(good_status.per_slot_ctx, Some(2048));
    assert!(health.is_loaded("ok", "qwen-coder"));
    assert!(good_status.last_poll > 0);

    poller.stop();
    // Joined: no poll thread is left to ask the good host anything.
    let _ = ok.hits.try_iter().count();
    assert!(ok.hits.try_recv().is_err());
}

#[test]
fn a_host_coming_back_from_loading_is_marked_up_by_the_next_poll() {
    // Answers 503 until the test flips it, like llama-server while it loads its model.
    static READY: AtomicBool = AtomicBool::new(false);
    let server = fake(|p| {
        if READY.load(Ordering::SeqCst) {
            good(p)
        } else {
            loading(p)
        }
    });
    let hosts = vec![host("mini", &server.url)];
    let config: BTreeMap<_, _> = hosts.iter().map(|h| (h.name.clone(), h.clone())).collect();
    let health = Arc::new(Health::new(&config));
    let poller = Poller::start(
        Arc::clone(&health),
        Arc::new(Quiet),
        hosts,
        (Duration::from_millis(10), BOUND),
    );
    crate::testwait::until("mini to be loading", || {
        health.get("mini").unwrap().reason.map(|r| r.kind()) == Some("loading")
    });
    READY.store(true, Ordering::SeqCst);
    crate::testwait::until("mini to be up", || health.healthy("mini"));
    let status = health.get("mini").unwrap();
    assert!(status.since > 0 && status.since <= status.last_poll);
    poller.stop();
}

/// A poll hook that does nothing: these stories are about the health table alone.
struct Quiet;

impl crate::health::Watch for Quiet {
    fn in_flight(&self, _: &str) -> usize {
        0
    }

    fn polled(&self, _: &config::Host, _: Option<&crate::health::Seen>, _: usize) {}
}
