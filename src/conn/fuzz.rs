//! A seeded mutation runner for the request-head parser and the body readers (there is no nightly
//! toolchain for cargo-fuzz here). Each case takes a seed request, mutates it a few times, and feeds
//! it to the same code that serves sockets, whole and in small pieces. It checks that nothing
//! panics, that the split never changes the outcome, and what an accepted request promises: a path
//! target, a body of exactly its declared length, never more than the limit. Every accepted
//! target's path is handed to the caller, who checks what the layers above promise of it (the
//! integration test and `make fuzz` check routing's path normalisation; this layer knows no
//! routes). `make test` runs a few thousand cases; `make fuzz` runs the `fuzz_conn` example with
//! as many as asked.

use std::io::{self, Cursor, Read};
use std::time::{Duration, Instant};

use super::body::{self, BodyTiming};
use super::head::BodyKind;
use super::inbound::{Inbound, Wire};

/// Largest body a case may have (small, so a case stays fast).
const MAX_BODY: usize = 4096;

const SEEDS: &[&[u8]] = &[
    b"GET /projA/v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /projA/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
    b"POST /p/v1/x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5;a=b\r\nhello\r\n0\r\nT: 1\r\n\r\n",
    b"POST /p/v1/%2e%2e/slots HTTP/1.0\r\nContent-Length: 0\r\n\r\n",
    b"GET /p/v1/a%20b?x=1 HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n",
    b"\r\nPOST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabcGET / HTTP/1.1\r\nHost: h\r\n\r\n",
];

const TOKENS: &[&[u8]] = &[
    b"\r\n",
    b"\n",
    b"\r",
    b":",
    b" ",
    b"\t",
    b"0",
    b"f",
    b";",
    b"%",
    b"%2e",
    b"%2f",
    b"%00",
    b"..",
    b"\\",
    b"/",
    b"\x00",
    b"\x7f",
    b"\xff",
    b"chunked",
    b"Content-Length: ",
    b"Transfer-Encoding: ",
    b"99999999999999999999",
    b"HTTP/1.0",
    b"HTTP/1.1",
];

/// What a run saw.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    pub cases: u64,
    /// Cases whose head was accepted.
    pub heads: u64,
    /// Cases whose body was read whole as well.
    pub bodies: u64,
}

/// Runs `cases` mutated cases from `seed`, handing `accepted` the bytes and the target path of
/// every case whose head was accepted. Panics, naming the case's bytes, on a broken promise.
pub fn run(cases: u64, seed: u64, mut accepted: impl FnMut(&[u8], &str)) -> Report {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut report = Report::default();
    for _ in 0..cases {
        let input = mutate(&mut rng);
        let piece = 1 + rng.below(7) as usize;
        let whole = outcome(&input, usize::MAX);
        let split = outcome(&input, piece);
        assert_eq!(
            whole, split,
            "pieces of {piece} change the outcome of {input:?}"
        );
        report.cases += 1;
        if let Some(path) = &whole.3 {
            accepted(&input, path);
        }
        report.heads += u64::from(whole.0);
        report.bodies += u64::from(whole.1);
    }
    report
}

fn mutate(rng: &mut Rng) -> Vec<u8> {
    let mut input = SEEDS[rng.below(SEEDS.len() as u64) as usize].to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(input.len() as u64 + 1) as usize;
        match rng.below(6) {
            0 if !input.is_empty() => {
                let i = at.min(input.len() - 1);
                input[i] ^= 1 << rng.below(8);
            }
            1 => {
                let token = TOKENS[rng.below(TOKENS.len() as u64) as usize];
                input.splice(at..at, token.iter().copied());
            }
            2 => {
                let end = (at + rng.below(8) as usize).min(input.len());
                input.drain(at..end);
            }
            3 => {
                let end = (at + rng.below(16) as usize).min(input.len());
                let copy = input[at..end].to_vec();
                input.splice(at..at, copy);
            }
            4 => input.truncate(at),
            _ => {
                let other = SEEDS[rng.below(SEEDS.len() as u64) as usize];
                input.extend_from_slice(&other[rng.below(other.len() as u64) as usize..]);
            }
        }
    }
    input
}

/// (head accepted, body read, a description of everything decided, the accepted target's path)
/// for `input` arriving in pieces of at most `piece` bytes.
fn outcome(input: &[u8], piece: usize) -> (bool, bool, String, Option<String>) {
    let mut inb = Inbound::new(Pieces {
        data: Cursor::new(input.to_vec()),
        piece,
    });
    let far = Instant::now() + Duration::from_secs(60);
    let head = match inb.read_head(far) {
        Ok(head) => head,
        Err(err) => return (false, false, format!("{err:?}"), None),
    };
    assert!(head.target.starts_with('/'), "{input:?}: {head:?}");
    assert!(head.headers.len() <= super::MAX_HEADERS, "{input:?}");
    let path = head
        .target
        .split('?')
        .next()
        .unwrap_or_default()
        .to_string();
    let timing = BodyTiming {
        base: Duration::from_secs(60),
        min_rate: 1,
    };
    let read = body::read(&mut inb, head.body, MAX_BODY, timing);
    if let (Ok(body), BodyKind::Length(n)) = (&read, head.body) {
        assert_eq!(body.len() as u64, n, "{input:?}");
    }
    if let Ok(body) = &read {
        assert!(body.len() <= MAX_BODY, "{input:?}");
    }
    let ok = read.is_ok();
    (
        true,
        ok,
        format!("{head:?} {:?}", read.map_err(|e| e.to_string())),
        Some(path),
    )
}

/// An in-memory wire that hands out at most `piece` bytes per read.
#[derive(Debug)]
struct Pieces {
    data: Cursor<Vec<u8>>,
    piece: usize,
}

impl Read for Pieces {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf.len().min(self.piece);
        self.data.read(&mut buf[..n])
    }
}

impl Wire for Pieces {
    fn read_timeout(&mut self, _: Duration) -> io::Result<()> {
        Ok(())
    }
}

/// xorshift64*: enough randomness for mutations, reproducible from the seed.
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}
