//! Issue 10: the seeded mutation runner over the request-head parser, the body readers and the
//! path check, at a size `make test` can afford (`make fuzz` runs it long).

#[test]
fn mutated_requests_never_panic_and_parse_the_same_in_any_pieces_issue_10() {
    let report = crossbar::conn::fuzz::run(3000, 10);
    assert_eq!(report.cases, 3000);
    // The mutations must leave enough requests whole for the body readers to be exercised.
    assert!(report.heads > 300, "{report:?}");
    assert!(report.bodies > 100, "{report:?}");
}
