//! Hostile answers: huge or mistyped bodies give exactly the fields crossbar reads (that the rest
//! is never built is the parser's design, not something these tests can see), keep at most
//! `MAX_TEXTS` strings per list, and fail only when they are not JSON or not the right top.

use super::*;

fn entries(body: &str) -> Vec<Entry> {
    let mut all = Vec::new();
    listing(body, &mut |e| all.push(e)).unwrap();
    all
}

#[test]
fn issue12_megabytes_of_unread_fields_still_give_the_fields_read() {
    // 2 MB of junk beside the two fields read: skipped by the parser, never built.
    let junk = format!("[{}0]", "[0,{\"a\":[1,2,3]},\"x\"],".repeat(80_000));
    let body = format!(
        r#"{{"junk":{junk},"default_generation_settings":{{"junk":{junk},"n_ctx":4096}},"total_slots":2}}"#
    );
    assert!(body.len() > 2 << 20);
    let got = props(&body).unwrap();
    assert_eq!((got.n_ctx, got.total_slots), (Some(4096), Some(2)));
}

#[test]
fn issue12_a_listing_of_a_million_empty_entries_is_read_to_its_last() {
    let body = format!(r#"{{"data":[{}{{"id":"last"}}]}}"#, "{},".repeat(1_000_000));
    let mut count = 0;
    let mut last = None;
    listing(&body, &mut |e| {
        count += 1;
        last = e.id;
    })
    .unwrap();
    assert_eq!((count, last.as_deref()), (1_000_001, Some("last")));
}

#[test]
fn issue12_a_field_of_the_wrong_shape_reads_as_absent() {
    let got = entries(
        r#"[0,"x",null,[1],{"id":5,"aliases":"x","status":7},{"id":"a","aliases":[1,"b",{}]}]"#,
    );
    assert_eq!(got.len(), 6);
    assert!(got[..4].iter().all(|e| *e == Entry::default()));
    // A status of any shape is a status (router mode), with no value.
    assert_eq!(
        got[4],
        Entry {
            id: None,
            aliases: vec![],
            status: Some(Status::default()),
            ctx_train: None,
        }
    );
    assert_eq!(got[5].id.as_deref(), Some("a"));
    assert_eq!(got[5].aliases, ["b"]);
    // A training context is a count, or nothing.
    let got = entries(
        r#"[{"id":"a","meta":{"n_ctx_train":131072}},{"id":"b","meta":{"n_ctx_train":"x"}},{"id":"c","meta":3}]"#,
    );
    let trained: Vec<Option<u64>> = got.iter().map(|e| e.ctx_train).collect();
    assert_eq!(trained, [Some(131072), None, None]);
    let got =
        props(r#"{"default_generation_settings":[1,2],"total_slots":-3,"max_instances":2.5}"#);
    assert_eq!(got.unwrap(), Props::default());
}

#[test]
fn issue12_a_list_keeps_at_most_max_texts_strings() {
    let aliases: Vec<String> = (0..5 * MAX_TEXTS).map(|i| format!("\"a{i}\"")).collect();
    let got = entries(&format!(r#"[{{"aliases":[{}]}}]"#, aliases.join(",")));
    assert_eq!(got[0].aliases.len(), MAX_TEXTS);
    assert_eq!(got[0].aliases.last().map(String::as_str), Some("a1023"));
}

#[test]
fn issue12_only_not_json_or_the_wrong_top_is_an_error() {
    assert!(matches!(props("[0,0,0]"), Err(ParseError::Shape(_))));
    assert!(matches!(props("{} trailing"), Err(ParseError::Json(_))));
    assert!(matches!(props("{\"a\":"), Err(ParseError::Json(_))));
    let mut none = |_: Entry| {};
    assert!(matches!(
        listing(r#"{"data":{"id":"a"}}"#, &mut none),
        Err(ParseError::Shape(_))
    ));
    assert!(matches!(listing("7", &mut none), Err(ParseError::Shape(_))));
    assert!(listing("[]", &mut none).is_ok());
}
