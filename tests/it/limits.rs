//! What a client may send: a body over 16 MiB is refused whether or not it declares its length;
//! a body that cannot be read is the client's error, not crossbar's.

use std::io::Write;

use crate::support::{host, Conn, Harness};

#[test]
fn a_chunked_body_over_16_mib_is_refused_without_a_length_to_go_by() {
    let h = Harness::start(vec![host("titan", 1)], "");
    let mut conn = Conn::open(h.addr());
    let mut writer = conn.reader.get_ref().try_clone().unwrap();
    // The writer may be cut off once crossbar has answered: its errors are expected, not checked.
    let sender = std::thread::spawn(move || {
        let head = "POST /projA/v1/chat/completions HTTP/1.1\r\nHost: crossbar\r\n\
                    Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
        let piece = vec![b' '; 1 << 20];
        let mut chunk = format!("{:x}\r\n", piece.len()).into_bytes();
        chunk.extend_from_slice(&piece);
        chunk.extend_from_slice(b"\r\n");
        let _ = writer.write_all(head.as_bytes());
        for _ in 0..17 {
            if writer.write_all(&chunk).is_err() {
                return;
            }
        }
        let _ = writer.write_all(b"0\r\n\r\n");
    });
    let answer = conn.read_answer();
    assert_eq!(answer.status, 413, "{}", answer.text());
    assert_eq!(answer.error()["code"], "body too large");
    let _ = sender.join();
    assert!(
        h.sim("titan").requests().iter().all(|r| r.method != "POST"),
        "nothing was forwarded"
    );
    let rows = h.rows();
    assert_eq!(rows.last().map(|r| r.status), Some(413), "{rows:#?}");
}

#[test]
fn a_malformed_chunked_body_is_a_400_not_an_internal_error() {
    let h = Harness::start(vec![host("titan", 1)], "");
    let mut conn = Conn::open(h.addr());
    conn.reader
        .get_mut()
        .write_all(
            b"POST /projA/v1/chat/completions HTTP/1.1\r\nHost: crossbar\r\n\
              Transfer-Encoding: chunked\r\n\r\nzz\r\nnot hex\r\n0\r\n\r\n",
        )
        .unwrap();
    let answer = conn.read_answer();
    assert_eq!(answer.status, 400, "{}", answer.text());
    assert_eq!(answer.error()["code"], "unreadable body");
    let row = h.rows().into_iter().last().expect("a row");
    assert_eq!(row.status, 400);
    assert!(row.err.starts_with("unreadable body: "), "{}", row.err);
}
