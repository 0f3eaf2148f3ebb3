//! The floor of the design card's shape, measured beside crossbar and nginx: a bare blocking
//! relay with one thread per client connection, each with its own kept-alive upstream connection,
//! that frames requests and answers by `Content-Length` and does nothing else — no routing, lease,
//! slot, tee, accounting row or log line, no allocation per request. What it adds over `direct` is
//! what any thread-per-connection proxy on std pays in system calls and context switches, so
//! crossbar, built that way (a fixed worker pool, blocking reads), cannot add less.
//!
//! Bench-only: it trusts both peers (no limits, no timeouts) and its threads end with the process.

use std::io::{self, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;

/// A running relay.
pub struct Bare {
    pub addr: SocketAddr,
}

/// Starts relaying every connection made to the returned address to `upstream`.
pub fn start(upstream: SocketAddr) -> Bare {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the bare relay");
    let addr = listener.local_addr().expect("its address");
    thread::Builder::new()
        .name("bare-accept".into())
        .spawn(move || {
            for client in listener.incoming().flatten() {
                thread::spawn(move || relay(client, upstream));
            }
        })
        .expect("start the bare relay");
    Bare { addr }
}

/// Request, answer, request, answer... until either side closes.
fn relay(client: TcpStream, upstream: SocketAddr) -> io::Result<()> {
    let up = TcpStream::connect(upstream)?;
    client.set_nodelay(true)?;
    up.set_nodelay(true)?;
    let (mut to_client, mut to_up) = (client.try_clone()?, up.try_clone()?);
    let (mut requests, mut answers) = (Framed::new(client), Framed::new(up));
    while let Some(request) = requests.next()? {
        to_up.write_all(request)?;
        let Some(answer) = answers.next()? else {
            return Ok(());
        };
        to_client.write_all(answer)?;
    }
    Ok(())
}

/// HTTP/1.1 messages read off a socket whole: a head, then its `Content-Length` body.
struct Framed {
    sock: TcpStream,
    buf: Vec<u8>,
    /// Bytes read into `buf`, and how many of them the last message returned took.
    have: usize,
    used: usize,
}

impl Framed {
    fn new(sock: TcpStream) -> Framed {
        Framed {
            sock,
            buf: vec![0; 16 << 10],
            have: 0,
            used: 0,
        }
    }

    /// The next whole message, or `None` when the peer closed between messages.
    fn next(&mut self) -> io::Result<Option<&[u8]>> {
        self.buf.copy_within(self.used..self.have, 0);
        self.have -= self.used;
        self.used = 0;
        let head = loop {
            if let Some(end) = self.buf[..self.have]
                .windows(4)
                .position(|w| w == b"\r\n\r\n")
            {
                break end + 4;
            }
            if !self.fill()? {
                return Ok(None);
            }
        };
        let whole = head + content_length(&self.buf[..head]);
        while self.have < whole {
            if !self.fill()? {
                return Err(ErrorKind::UnexpectedEof.into());
            }
        }
        self.used = whole;
        Ok(Some(&self.buf[..whole]))
    }

    /// One read more; false at end of stream.
    fn fill(&mut self) -> io::Result<bool> {
        if self.have == self.buf.len() {
            self.buf.resize(self.buf.len() * 2, 0);
        }
        let n = self.sock.read(&mut self.buf[self.have..])?;
        self.have += n;
        Ok(n > 0)
    }
}

/// The head's `Content-Length`, 0 when it has none.
fn content_length(head: &[u8]) -> usize {
    let name = b"content-length:";
    (head.split(|b| *b == b'\n'))
        .find(|line| line.len() > name.len() && line[..name.len()].eq_ignore_ascii_case(name))
        .and_then(|line| {
            std::str::from_utf8(&line[name.len()..])
                .ok()?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0)
}
