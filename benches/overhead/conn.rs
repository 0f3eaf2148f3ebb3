//! The overhead benchmark's raw HTTP/1.1 client: one write per request, heads and chunked bodies
//! parsed by hand so the client's own cost stays small and visible. Panics on anything unexpected
//! (a benchmark, not a product path).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A raw HTTP/1.1 client connection (keep-alive unless the server says close).
pub struct Conn {
    r: BufReader<TcpStream>,
    /// A client key sent with every request (`Authorization: Bearer`), for crossbar.
    key: Option<&'static str>,
}

impl Conn {
    pub fn open(addr: SocketAddr) -> Conn {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_nodelay(true).expect("nodelay");
        s.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        Conn {
            r: BufReader::new(s),
            key: None,
        }
    }

    /// The socket, to write a request in pieces.
    pub fn stream(&mut self) -> &mut TcpStream {
        self.r.get_mut()
    }

    /// The same connection, sending `key` with every request.
    pub fn with_key(mut self, key: Option<&'static str>) -> Conn {
        self.key = key;
        self
    }

    pub fn send(&mut self, path: &str, body: &[u8]) {
        let auth = self.key.map_or(String::new(), |key| {
            format!("Authorization: Bearer {key}\r\n")
        });
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n\
             {auth}Content-Length: {}\r\n\r\n",
            body.len()
        );
        let mut msg = head.into_bytes();
        msg.extend_from_slice(body);
        self.r.get_mut().write_all(&msg).expect("send");
    }

    /// Sends one request and reads the whole answer: (status, server closes the connection).
    pub fn round_trip(&mut self, path: &str, body: &[u8]) -> (u16, bool) {
        self.send(path, body);
        let head = self.head();
        if head.chunked {
            while self.chunk().is_some() {}
        } else {
            let mut buf = vec![0; head.length.unwrap_or(0)];
            self.r.read_exact(&mut buf).expect("body");
        }
        (head.status, head.close)
    }

    pub fn head(&mut self) -> Head {
        let mut line = String::new();
        self.r.read_line(&mut line).expect("status line");
        let status = line.split(' ').nth(1).and_then(|s| s.parse().ok());
        let mut head = Head {
            status: status.unwrap_or_else(|| panic!("bad status line {line:?}")),
            chunked: false,
            length: None,
            close: false,
        };
        loop {
            line.clear();
            self.r.read_line(&mut line).expect("header");
            let Some((k, v)) = line.trim_end().split_once(':') else {
                return head;
            };
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().to_ascii_lowercase());
            match k.as_str() {
                "transfer-encoding" => head.chunked = v.contains("chunked"),
                "content-length" => head.length = v.parse().ok(),
                "connection" => head.close = v.contains("close"),
                _ => {}
            }
        }
    }

    /// One chunk of a chunked body, `None` at the last one.
    pub fn chunk(&mut self) -> Option<Vec<u8>> {
        let mut line = String::new();
        self.r.read_line(&mut line).expect("chunk size");
        let size = usize::from_str_radix(line.trim(), 16).expect("chunk size");
        let mut data = vec![0; size + 2];
        self.r.read_exact(&mut data).expect("chunk");
        data.truncate(size);
        (size > 0).then_some(data)
    }
}

pub struct Head {
    pub status: u16,
    pub chunked: bool,
    pub length: Option<usize>,
    pub close: bool,
}
