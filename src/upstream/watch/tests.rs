//! The watched transport's writes: a request's head waits for its body and leaves with it, a
//! body bigger than the buffer still goes out whole and in order, and nothing waits for input
//! with bytes held.

use ureq::unversioned::transport::{Buffers, LazyBuffers, NextTimeout, Transport};
use ureq::Error;

use super::{Exchange, Watched};

/// A transport that keeps each write apart, as the socket would have seen them; after
/// `refuse_after` writes, each is refused as a broken pipe (the host closed).
#[derive(Debug)]
struct Wire {
    buffers: LazyBuffers,
    writes: Vec<Vec<u8>>,
    awaited: usize,
    refuse_after: usize,
    refused: usize,
}

impl Transport for Wire {
    fn buffers(&mut self) -> &mut dyn Buffers {
        &mut self.buffers
    }

    fn transmit_output(&mut self, amount: usize, _: NextTimeout) -> Result<(), Error> {
        if self.writes.len() >= self.refuse_after {
            self.refused += 1;
            let pipe = std::io::Error::from(std::io::ErrorKind::BrokenPipe);
            return Err(Error::Io(pipe));
        }
        let sent = self.buffers.output()[..amount].to_vec();
        self.writes.push(sent);
        Ok(())
    }

    fn await_input(&mut self, _: NextTimeout) -> Result<bool, Error> {
        self.awaited += 1;
        Ok(false)
    }

    fn is_open(&mut self) -> bool {
        true
    }
}

fn watched(output: usize) -> Watched<Wire> {
    Watched {
        inner: Wire {
            buffers: LazyBuffers::new(1024, output),
            writes: Vec::new(),
            awaited: 0,
            refuse_after: usize::MAX,
            refused: 0,
        },
        held: Vec::new(),
    }
}

/// What ureq does: fill the output buffer, then transmit that much of it.
fn write(t: &mut Watched<Wire>, bytes: &[u8]) {
    t.buffers().output()[..bytes.len()].copy_from_slice(bytes);
    t.transmit_output(bytes.len(), NextTimeout::default())
        .unwrap();
}

#[test]
fn issue12_a_request_head_leaves_in_one_write_with_its_body() {
    let exchange = Exchange::start(None);
    let mut t = watched(1024);
    exchange.body_follows(true);
    write(
        &mut t,
        b"POST /v1/chat HTTP/1.1\r\ncontent-length: 2\r\n\r\n",
    );
    assert!(t.inner.writes.is_empty(), "the head waits for its body");
    write(&mut t, b"{}");
    assert_eq!(
        t.inner.writes,
        [b"POST /v1/chat HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}".to_vec()]
    );
    // Only the attempt's first write waits: the next request's head goes out at once.
    write(&mut t, b"GET /health HTTP/1.1\r\n\r\n");
    assert_eq!(t.inner.writes.len(), 2);
}

#[test]
fn issue12_a_head_and_body_bigger_than_the_buffer_go_out_whole_and_in_order() {
    let exchange = Exchange::start(None);
    let mut t = watched(64);
    exchange.body_follows(true);
    let head = [b'h'; 40];
    let body = [b'b'; 60];
    write(&mut t, &head);
    write(&mut t, &body);
    let sent: Vec<u8> = t.inner.writes.concat();
    assert_eq!(sent, [&head[..], &body[..]].concat());
    assert!(t.inner.writes.iter().all(|w| w.len() <= 64));
    assert_eq!(
        t.inner.writes.len(),
        2,
        "as few writes as the buffer allows"
    );
}

#[test]
fn issue12_nothing_waits_for_an_answer_with_a_head_held() {
    let exchange = Exchange::start(None);
    let mut t = watched(1024);
    exchange.body_follows(true);
    write(&mut t, b"POST / HTTP/1.1\r\ncontent-length: 0\r\n\r\n");
    assert!(t.inner.writes.is_empty());
    // A body that never came (ureq had nothing to send): the head goes before the wait.
    let _ = t.await_input(NextTimeout::default());
    assert_eq!(t.inner.writes.len(), 1);
    assert_eq!(t.inner.awaited, 1);
}

#[test]
fn issue12_without_a_body_to_follow_every_write_goes_out_at_once() {
    let exchange = Exchange::start(None);
    let mut t = watched(1024);
    exchange.body_follows(false);
    write(&mut t, b"GET /v1/models HTTP/1.1\r\n\r\n");
    assert_eq!(t.inner.writes.len(), 1);
}

/// Issue 46: a host that answers a head alone and closes (llama-server's 400 for a head it cannot
/// read) resets the connection under the body's write. The write is not the failure: the rest of
/// the body is dropped, ureq goes on to read the answer, and the connection is never pooled.
#[test]
fn a_write_refused_as_closed_drops_the_rest_and_leaves_the_answer_to_be_read_issue_46() {
    let exchange = Exchange::start(None);
    let mut t = watched(1024);
    t.inner.refuse_after = 1;
    exchange.body_follows(false);
    write(
        &mut t,
        b"POST /completion HTTP/1.1\r\ncontent-length: 8\r\n\r\n",
    );
    write(&mut t, b"body");
    write(&mut t, b"more");
    assert_eq!(t.inner.writes.len(), 1);
    assert_eq!(t.inner.refused, 1, "nothing is written after the refusal");
    assert!(t.await_input(NextTimeout::default()).is_ok());
    assert!(
        !t.is_open(),
        "a connection cut under a write is never pooled"
    );
    // Here it answered nothing: a pooled connection the host had closed, sent again on a fresh
    // one as before.
    assert!(exchange.retryable());
}
