//! What one client may take of what all share, and what waiting requests may hold (issue 46).

use super::*;

/// Issue 46: what requests waiting for a slot may hold, and one client's share of it and of the
/// leases; each default follows from what it shares, each mistake is named by its key.
#[test]
fn a_clients_shares_default_from_what_they_share_and_are_checked_issue_46() {
    let cfg = Config::from_toml(MINIMAL).unwrap();
    let waiting = crate::limiter::Waiting {
        total: 32,
        per_client: 16,
        bytes: 256 << 20,
        bytes_per_client: 128 << 20,
    };
    assert_eq!((cfg.waiting, cfg.max_leases_per_client), (waiting, 10_000));
    let cfg = Config::from_toml(&format!("workers = 10\nmax_leases = 50\n{MINIMAL}")).unwrap();
    assert_eq!((cfg.waiting.total, cfg.waiting.per_client), (5, 2));
    assert_eq!(cfg.max_leases_per_client, 5);
    for (line, problem) in [
        (
            "queue_max_total = 64",
            "queue_max_total: must be less than workers (64): each request waiting for a slot \
             holds a worker, and the rest serve requests that need no wait",
        ),
        ("queue_max_total = 0", "queue_max_total: must be at least 1"),
        (
            "queue_max_per_client = 33",
            "queue_max_per_client: must be at most queue_max_total (32)",
        ),
        (
            "queue_body_mib = 0",
            "queue_body_mib: must be at least 1 (MiB)",
        ),
        (
            "max_leases_per_client = 100001",
            "max_leases_per_client: must be at most max_leases (100000)",
        ),
        (
            "max_leases_per_client = 0",
            "max_leases_per_client: must be at least 1",
        ),
        (
            "queue_body_mib_per_client = 300",
            "queue_body_mib_per_client: must be at most queue_body_mib (256)",
        ),
    ] {
        check_problem(&format!("{line}\n{MINIMAL}"), problem);
    }
    // One worker: whoever waits holds it, there is nothing to keep aside.
    let cfg = Config::from_toml(&format!("workers = 1\n{MINIMAL}")).unwrap();
    assert_eq!(cfg.waiting.total, 1);
    let warned = |text: &str| {
        let cfg = Config::from_toml(text).unwrap();
        cfg.warnings.iter().any(|w| w.starts_with("workers ("))
    };
    assert!(!warned(MINIMAL));
    assert!(warned(&format!("workers = 4\n{MINIMAL}")));
}
