//! The body as the host reads it: every trick that once made crossbar read a key otherwise.

use super::*;

#[track_caller]
fn check_has(body: &[u8], name: &str, want: Option<bool>) {
    assert_eq!(has(body, name), want, "{}", String::from_utf8_lossy(body));
}

#[test]
fn a_key_is_read_with_its_escapes_decoded_issue_46() {
    for body in [
        &br#"{"id_slot":0}"#[..],
        br#"{"id\u005fslot":0}"#,
        br#"{"\u0069\u0064\u005F\u0073\u006c\u006f\u0074":0}"#,
        br#"{"model":"m",  "id_slot" : null}"#,
    ] {
        check_has(body, "id_slot", Some(true));
    }
    for body in [
        &br#"{"id_slot ":0}"#[..],
        br#"{"Id_slot":0}"#,
        br#"{"id_slot\/":0}"#,
        br#"{"messages":[{"id_slot":0}],"x":"\"id_slot\":0"}"#,
        b"{}",
    ] {
        check_has(body, "id_slot", Some(false));
    }
}

#[test]
fn of_a_key_given_twice_the_last_one_counts_issue_46() {
    let body = br#"{"model":"a","x":1,"mod\u0065l":"b"}"#;
    assert_eq!(last(body, "model").unwrap().unwrap().get(), r#""b""#);
    let spans = spans(body, "model").unwrap();
    let values: Vec<&[u8]> = spans.iter().map(|s| &body[s.clone()]).collect();
    assert_eq!(values, [&b"\"a\""[..], b"\"b\""]);
    let body = br#"{"prompt":"x","prompt":null}"#;
    assert_eq!(last(body, "prompt").unwrap().unwrap().get(), "null");
}

#[test]
fn a_byte_order_mark_is_skipped_as_the_host_skips_it_issue_46() {
    let body = b"\xEF\xBB\xBF {\"id_slot\":1}";
    check_has(body, "id_slot", Some(true));
    assert_eq!(open(body), Some(4));
    // Only a whole mark, only at the very start: the host refuses the rest.
    check_has(b"\xEF\xBB{\"id_slot\":1}", "id_slot", None);
    check_has(b" \xEF\xBB\xBF{\"id_slot\":1}", "id_slot", None);
    assert_eq!(open(b"\xEF\xBB{}"), None);
}

#[test]
fn what_is_not_one_object_has_no_members() {
    for body in [
        &b""[..],
        b"[1]",
        b"\"id_slot\"",
        b"{\"id_slot\":0",
        b"{\"id_slot\":0} {}",
        b"{\"id_slot\":0}x",
        b"{\"a\":\"\\ud800\",\"id_slot\":0",
    ] {
        check_has(body, "id_slot", None);
    }
    assert_eq!(open(b" \n{}"), Some(2));
    assert_eq!(open(b"[{}]"), None);
}

/// The host's parser has no depth limit; a value crossbar skips must not stop the reader either,
/// or a member after it would be missed.
#[test]
fn a_member_after_a_deeply_nested_value_is_still_seen() {
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let body = format!(r#"{{"junk":{deep},"id_slot":3}}"#);
    check_has(body.as_bytes(), "id_slot", Some(true));
    let many = vec!["0"; 1 << 16].join(",");
    let body = format!(r#"{{"a":[{many}],"b":{{"c":1e999}},"id\u005fslot":3}}"#);
    check_has(body.as_bytes(), "id_slot", Some(true));
}
