//! The floor of the design card's shape, measured beside crossbar and nginx: a bare blocking
//! relay with one thread per client connection, each with its own kept-alive upstream connection,
//! that frames requests and answers by `Content-Length` and does nothing else — no routing, lease,
//! slot, tee, accounting row or log line, no allocation per request. What it adds over `direct` is
//! what any thread-per-connection proxy on std pays in system calls and context switches, so
//! crossbar, built that way (a fixed worker pool, blocking reads), cannot add less.
//!
//! It runs in a child process of its own (the bench binary again, `--bare-relay UPSTREAM`), as
//! crossbar and nginx do, so its CPU per request is read from `/proc` the same way and a profiler
//! can attach to it alone (`--load CLIENTS SECS bare`).
//!
//! Bench-only: it trusts both peers (no limits, no timeouts) and its threads end with the process.

use std::io::{self, BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::thread;

/// A running relay in its child process, killed on drop.
pub struct Bare {
    pub addr: SocketAddr,
    child: Child,
}

impl Bare {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Bare {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the relay to `upstream` in a child process and waits for its address.
pub fn spawn(upstream: SocketAddr) -> Bare {
    let exe = std::env::current_exe().expect("the bench binary's path");
    let mut child = Command::new(exe)
        .args(["--bench", "--bare-relay", &upstream.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the bare relay's process");
    let out = child.stdout.take().expect("its stdout");
    let mut line = String::new();
    BufReader::new(out)
        .read_line(&mut line)
        .expect("the bare relay says its address");
    let addr = line
        .trim()
        .strip_prefix("addr=")
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("the bare relay's first line is its address, not {line:?}"));
    Bare { addr, child }
}

/// The child's side of [`spawn`]: relays until killed.
pub fn serve(upstream: &str) -> ! {
    let addr = start(
        upstream
            .parse()
            .expect("--bare-relay UPSTREAM is an address"),
    );
    println!("addr={addr}");
    let _ = io::stdout().flush();
    loop {
        thread::park();
    }
}

/// Starts relaying every connection made to the returned address to `upstream`.
fn start(upstream: SocketAddr) -> SocketAddr {
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
    addr
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
