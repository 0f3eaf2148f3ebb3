//! Writes to a client under one deadline per write (issue 24, `client_write_timeout`). A socket's
//! write timeout bounds each `send` on its own, so a client that reads a little now and then (a
//! byte a second) made every partial write restart the clock and held its slot for many times the
//! timeout. Here a write that is still partial when the timeout has passed since it began fails
//! with `TimedOut`: partial progress does not restart the clock.

use std::io::{self, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// A client socket whose `write_all` must complete within `timeout` of its start.
#[derive(Debug)]
pub(super) struct Deadlined<'s> {
    sock: &'s TcpStream,
    /// The socket's own write timeout: what each `send` may block, and the whole write's bound.
    timeout: Duration,
}

impl<'s> Deadlined<'s> {
    pub(super) fn new(sock: &'s TcpStream, timeout: Duration) -> Deadlined<'s> {
        Deadlined { sock, timeout }
    }
}

impl Write for Deadlined<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self.sock).write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        (&*self.sock).flush()
    }

    /// One `send` for the usual whole write; after a partial one, the socket's timeout is cut to
    /// what is left of this write's deadline (and set back after).
    fn write_all(&mut self, mut buf: &[u8]) -> io::Result<()> {
        let started = Instant::now();
        let mut cut = false;
        let result = loop {
            match (&*self.sock).write(buf) {
                Ok(0) => break Err(io::ErrorKind::WriteZero.into()),
                Ok(n) if n == buf.len() => break Ok(()),
                Ok(n) => buf = &buf[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => break Err(e),
            }
            let left = self.timeout.saturating_sub(started.elapsed());
            if left.is_zero() {
                break Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "client_write_timeout passed with the write still partial",
                ));
            }
            cut = true;
            let _ = self.sock.set_write_timeout(Some(left));
        };
        if cut {
            let _ = self.sock.set_write_timeout(Some(self.timeout));
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::net::TcpListener;
    use std::thread;

    use super::*;

    /// A reader that takes 64 KiB every 150 ms: every `send` makes progress within a 200 ms socket
    /// timeout, so a plain `write_all` of 8 MiB would go on for about 20 s. Under one deadline it
    /// fails soon after 200 ms.
    #[test]
    fn a_client_that_reads_a_little_now_and_then_cannot_stretch_a_write_issue_24() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let timeout = Duration::from_millis(200);
        server.set_write_timeout(Some(timeout)).unwrap();
        let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
        let reader = thread::spawn(move || {
            let mut client = client;
            let mut buf = vec![0; 64 << 10];
            while let Err(crossbeam_channel::RecvTimeoutError::Timeout) =
                stopped.recv_timeout(Duration::from_millis(150))
            {
                if client.read(&mut buf).unwrap_or(0) == 0 {
                    return;
                }
            }
        });
        let started = Instant::now();
        let result = Deadlined::new(&server, timeout).write_all(&vec![b'x'; 8 << 20]);
        let took = started.elapsed();
        drop(stop);
        reader.join().unwrap();
        let err = result.expect_err("the write must not outlive its deadline");
        assert!(
            matches!(
                err.kind(),
                io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
            ),
            "{err:?}"
        );
        assert!(took < Duration::from_secs(2), "took {took:?}");
        // The socket's own timeout is back for the next write.
        assert_eq!(server.write_timeout().unwrap(), Some(timeout));
    }
}
