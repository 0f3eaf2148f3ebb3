use super::*;
use std::sync::{Arc, Mutex};

/// A writer whose bytes the test can read back after it was moved into a `BodyWriter`.
#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Sink {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

fn headers(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn chunked_body_frames_each_write_and_ends_with_the_last_chunk() {
    let sink = Sink::default();
    let hs = headers(&[("Content-Type", "text/event-stream")]);
    let mut w =
        BodyWriter::start(Box::new(sink.clone()), false, 200, &hs, Framing::Chunked).unwrap();
    w.write(b"data: 1\n\n").unwrap();
    assert!(
        sink.text().ends_with("9\r\ndata: 1\n\n\r\n"),
        "{}",
        sink.text()
    );
    w.write(b"").unwrap();
    w.write(b"data: [DONE]\n\n").unwrap();
    w.finish().unwrap();
    assert_eq!(
        sink.text(),
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n\
         9\r\ndata: 1\n\n\r\ne\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"
    );
}

#[test]
fn aborted_chunked_body_never_ends_with_the_last_chunk() {
    let sink = Sink::default();
    let mut w =
        BodyWriter::start(Box::new(sink.clone()), false, 200, NONE, Framing::Chunked).unwrap();
    w.write(b"data: 1\n\n").unwrap();
    w.abort();
    assert!(!sink.text().contains("0\r\n\r\n"), "{}", sink.text());
    assert!(sink
        .text()
        .ends_with("!crossbar: upstream failed mid-body\r\n\r\n"));
}

#[test]
fn fixed_body_carries_its_length_and_head_only_sends_none() {
    let sink = Sink::default();
    send(Box::new(sink.clone()), false, false, 404, NONE, b"{}").unwrap();
    assert_eq!(
        sink.text(),
        "HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}"
    );
    let sink = Sink::default();
    send(Box::new(sink.clone()), true, true, 200, NONE, b"{}").unwrap();
    assert_eq!(sink.text(), "HTTP/1.0 200 OK\r\n\r\n");
}

#[test]
fn hop_by_hop_headers_include_those_named_by_connection() {
    let tokens = connection_tokens(Some("close, X-Private"));
    assert_eq!(tokens, ["close", "X-Private"]);
    for name in [
        "Connection",
        "Keep-Alive",
        "Transfer-Encoding",
        "TE",
        "Upgrade",
        "X-Private",
    ] {
        assert!(is_hop_by_hop(name, &tokens), "{name}");
    }
    for name in ["Content-Type", "X-Accel-Buffering", "Authorization"] {
        assert!(!is_hop_by_hop(name, &tokens), "{name}");
    }
}

/// A writer that keeps each write apart, to show what went out together.
#[derive(Clone, Default)]
struct Writes(Arc<Mutex<Vec<String>>>);

impl Write for Writes {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let text = String::from_utf8_lossy(buf).into_owned();
        self.0.lock().unwrap().push(text);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Writes {
    fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

/// A chunked 200 whose head waits for its body.
fn held<'a>(out: &Writes, broken: &'a AtomicBool) -> BodyWriter<'a> {
    let by = Tracked {
        broken,
        persist: Persist::Unsaid,
    };
    BodyWriter::start_tracked(
        Box::new(out.clone()),
        by,
        false,
        200,
        NONE,
        Framing::Chunked,
        HeadOut::WithBody,
    )
    .unwrap()
}

/// No headers of the caller's own.
const NONE: &[(&str, &str)] = &[];

#[test]
fn the_head_says_whether_the_connection_stays_open_once() {
    let answer = |persist, http10, headers: &[(&str, &str)]| {
        let (out, broken) = (Writes::default(), AtomicBool::new(false));
        let by = Tracked {
            broken: &broken,
            persist,
        };
        send_tracked(
            Box::new(out.clone()),
            Some(by),
            http10,
            false,
            200,
            headers,
            b"ok",
        )
        .unwrap();
        out.all().concat()
    };
    let typed = [("Content-Type", "text/plain")];
    assert_eq!(
        answer(Persist::KeepAlive(5), false, &typed),
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nKeep-Alive: timeout=5\r\n\
         Content-Length: 2\r\n\r\nok"
    );
    assert_eq!(
        answer(Persist::Close, false, &[]),
        "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
    );
    // A close-delimited body's framing says it already: once, not twice.
    let (out, broken) = (Writes::default(), AtomicBool::new(false));
    let by = Tracked {
        broken: &broken,
        persist: Persist::Close,
    };
    let w = BodyWriter::start_tracked(
        Box::new(out.clone()),
        by,
        true,
        200,
        NONE,
        Framing::UntilClose,
        HeadOut::Now,
    );
    w.unwrap().finish().unwrap();
    let head = out.all().concat();
    assert_eq!(head.matches("Connection: close").count(), 1, "{head}");
}

#[test]
fn issue12_a_whole_answer_goes_out_in_one_write_head_body_and_end() {
    let (out, broken) = (Writes::default(), AtomicBool::new(false));
    let mut w = held(&out, &broken);
    assert!(out.all().is_empty(), "the head waits for the body");
    w.hold(b"{}").unwrap();
    assert!(out.all().is_empty(), "the last piece waits for the end");
    w.finish().unwrap();
    assert_eq!(
        out.all(),
        ["HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"]
    );
}

#[test]
fn issue12_a_held_head_leaves_with_the_first_piece_and_only_the_last_piece_waits() {
    let (out, broken) = (Writes::default(), AtomicBool::new(false));
    let mut w = held(&out, &broken);
    w.write(b"ab").unwrap();
    w.write(b"cd").unwrap();
    w.hold(b"ef").unwrap();
    w.finish().unwrap();
    assert_eq!(
        out.all(),
        [
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n",
            "2\r\ncd\r\n",
            "2\r\nef\r\n0\r\n\r\n",
        ]
    );
}

#[test]
fn issue12_an_abort_sends_what_was_held_then_the_break() {
    let (out, broken) = (Writes::default(), AtomicBool::new(false));
    let mut w = held(&out, &broken);
    w.hold(b"ab").unwrap();
    w.abort();
    let all = out.all().concat();
    assert!(all.starts_with("HTTP/1.1 200 OK\r\n"), "{all}");
    assert!(all.contains("2\r\nab\r\n"), "{all}");
    assert!(all.ends_with("!crossbar: upstream failed mid-body\r\n\r\n"));
    assert!(!all.contains("0\r\n\r\n"), "{all}");
    assert!(broken.load(Ordering::Relaxed));
}

/// Issue 45: a break mid-body goes out as a tail too (once the row is in, by whoever commits it):
/// the bytes are what `abort` would write — what was held, then the spoiled chunk line — and the
/// connection is marked to close after them.
#[test]
fn a_broken_end_is_the_bytes_an_abort_would_write() {
    let (out, broken) = (Writes::default(), AtomicBool::new(false));
    let mut w = held(&out, &broken);
    w.hold(b"ab").unwrap();
    let end = String::from_utf8(w.into_broken_end()).unwrap();
    assert!(end.contains("2\r\nab\r\n"), "{end}");
    assert!(end.ends_with("!crossbar: upstream failed mid-body\r\n\r\n"));
    assert!(!end.contains("0\r\n\r\n"), "{end}");
    assert!(
        broken.load(Ordering::Relaxed),
        "the connection closes after it"
    );
}

#[test]
fn header_text_is_borrowed_when_utf8_and_marks_odd_bytes_otherwise() {
    for valid in ["text/event-stream", "", "naïve 🦙"] {
        assert!(
            matches!(text(valid.as_bytes()), Cow::Borrowed(t) if t == valid),
            "{valid}"
        );
    }
    assert_eq!(text(b"caf\xe9 ok"), "caf\u{fffd} ok");
    assert_eq!(text(b"\xff\xfe"), "\u{fffd}\u{fffd}");
}
