//! Issue 10: the seeded mutation runner over the request-head parser, the body readers and the
//! path check, at a size `make test` can afford (`make fuzz` runs it long). The path check is
//! routing's and runs here, on every accepted head's path: `conn` knows no routes (issue 45).

#[test]
fn mutated_requests_never_panic_and_parse_the_same_in_any_pieces_issue_10() {
    let mut paths = 0;
    let report = crossbar::conn::fuzz::run(3000, 10, |input, path| {
        if let Err(broken) = crossbar::proxy::check_normal(path) {
            panic!("{broken}: {input:?}");
        }
        paths += 1;
    });
    assert_eq!(report.cases, 3000);
    assert_eq!(paths, report.heads, "every accepted head's path is checked");
    // The mutations must leave enough requests whole for the body readers to be exercised.
    assert!(report.heads > 300, "{report:?}");
    assert!(report.bodies > 100, "{report:?}");
}
