//! Where `serve`'s log lines go: formatted on the caller's thread (simplelog), written to stderr by
//! a thread of their own, so a request never waits on a terminal, a pipe or journald.
//!
//! simplelog writes one line as many small pieces (the time alone in seven); on an unbuffered
//! stderr that was about 24 `write` calls per request line, each under the logger's lock (issue
//! 12). [`LogSink`] is the writer simplelog gets: it gathers the pieces of a line and queues the
//! whole line; the `log-writer` thread gathers a burst's lines for a few milliseconds and writes
//! them in one `write`, so a busy gateway pays neither a `write` nor a wake-up per line.
//!
//! Every line is kept, in the order the lines were finished (they are queued under simplelog's
//! lock): a full queue makes the caller wait for the writer rather than drop a line. A flush
//! (`log::logger().flush()`, which `serve` calls on every way out) waits until everything queued
//! before it is written, at most [`FLUSH_WAIT`].

use std::io::{self, Write};
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, Sender};

/// Lines queued for the writer thread before a caller waits.
const QUEUE: usize = 4096;
/// Most bytes the writer gathers for one `write`.
const BATCH: usize = 64 << 10;
/// How long the writer gathers lines after the first of a burst: while it gathers, queuing a
/// line wakes nobody (no system call on the request path), and a line reaches stderr at most
/// this late.
const LINGER: Duration = Duration::from_millis(5);
/// Longest a flush waits for the writer.
const FLUSH_WAIT: Duration = Duration::from_secs(5);

#[derive(Debug)]
enum Msg {
    Line(Vec<u8>),
    Flush(Sender<()>),
}

/// The `Write` handed to simplelog: whole lines go to the writer thread.
#[derive(Debug)]
pub struct LogSink {
    queue: Sender<Msg>,
    /// The line being formatted.
    line: Vec<u8>,
}

impl LogSink {
    /// Starts the writer thread over `out`.
    pub fn start(out: impl Write + Send + 'static) -> io::Result<LogSink> {
        let (queue, lines) = bounded(QUEUE);
        std::thread::Builder::new()
            .name("log-writer".into())
            .spawn(move || write_lines(&lines, out))?;
        Ok(LogSink {
            queue,
            line: Vec::with_capacity(256),
        })
    }

    fn send_line(&mut self) -> io::Result<()> {
        let line = std::mem::replace(&mut self.line, Vec::with_capacity(256));
        (self.queue.send(Msg::Line(line))).map_err(|_| io::Error::other("log writer gone"))
    }
}

impl Write for LogSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.line.extend_from_slice(buf);
        if buf.ends_with(b"\n") {
            self.send_line()?;
        }
        Ok(buf.len())
    }

    /// Queues any unfinished line, then waits until the writer has written everything before.
    fn flush(&mut self) -> io::Result<()> {
        if !self.line.is_empty() {
            self.send_line()?;
        }
        let (done, written) = bounded(1);
        let gone = |_| io::Error::other("log writer gone");
        self.queue.send(Msg::Flush(done)).map_err(gone)?;
        written
            .recv_timeout(FLUSH_WAIT)
            .map_err(|_| io::Error::other("log writer did not flush in time"))
    }
}

/// The writer thread: idle, it waits for a line; then it gathers for [`LINGER`] (at once when a
/// flush is asked) and writes what queued in one `write`. Ends when the sink is dropped.
fn write_lines(lines: &Receiver<Msg>, mut out: impl Write) {
    let mut batch = Vec::with_capacity(BATCH);
    let mut flushes = Vec::new();
    while let Ok(first) = lines.recv() {
        let asked = matches!(first, Msg::Flush(_));
        take(first, &mut batch, &mut flushes);
        if !asked {
            std::thread::sleep(LINGER);
        }
        while batch.len() < BATCH {
            match lines.try_recv() {
                Ok(msg) => take(msg, &mut batch, &mut flushes),
                Err(_) => break,
            }
        }
        // A failed write (stderr closed) loses these lines and nothing else: the next batch
        // tries again.
        let _ = out.write_all(&batch).and_then(|()| out.flush());
        batch.clear();
        for done in flushes.drain(..) {
            let _ = done.send(());
        }
    }
}

/// A line joins the batch; a flush is answered once the batch it came after is written.
fn take(msg: Msg, batch: &mut Vec<u8>, flushes: &mut Vec<Sender<()>>) {
    match msg {
        Msg::Line(line) => batch.extend_from_slice(&line),
        Msg::Flush(done) => flushes.push(done),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A stderr whose writes the test reads back, each apart.
    #[derive(Clone, Default)]
    struct Out(Arc<Mutex<Vec<Vec<u8>>>>);

    impl Write for Out {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().push(buf.to_vec());
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Out {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().concat()).unwrap()
        }
    }

    #[test]
    fn issue12_a_line_written_in_pieces_reaches_stderr_whole_and_flush_waits_for_it() {
        let out = Out::default();
        let mut sink = LogSink::start(out.clone()).unwrap();
        for piece in [
            "2026-11-30T12:00:00Z",
            " ",
            "[INFO]",
            " ",
            "route=a status=200",
            "\n",
        ] {
            sink.write_all(piece.as_bytes()).unwrap();
        }
        sink.flush().unwrap();
        assert_eq!(
            out.text(),
            "2026-11-30T12:00:00Z [INFO] route=a status=200\n"
        );
        assert!(
            out.0.lock().unwrap().iter().all(|w| w.ends_with(b"\n")),
            "no write holds part of a line"
        );
    }

    #[test]
    fn issue12_every_line_is_kept_in_order_and_a_flush_comes_after_them_all() {
        let out = Out::default();
        let mut sink = LogSink::start(out.clone()).unwrap();
        // More lines than the queue holds: the writer is never waited for, nothing is dropped.
        let n = QUEUE * 3;
        for i in 0..n {
            writeln!(sink, "line {i}").unwrap();
        }
        sink.flush().unwrap();
        let text = out.text();
        let got: Vec<&str> = text.lines().collect();
        assert_eq!(got.len(), n);
        assert!(got
            .iter()
            .enumerate()
            .all(|(i, l)| *l == format!("line {i}")));
        assert!(
            out.0.lock().unwrap().iter().all(|w| w.ends_with(b"\n")),
            "a write holds whole lines"
        );
    }

    #[test]
    fn issue12_an_unfinished_line_is_written_by_the_flush() {
        let out = Out::default();
        let mut sink = LogSink::start(out.clone()).unwrap();
        sink.write_all(b"no newline yet").unwrap();
        sink.flush().unwrap();
        assert_eq!(out.text(), "no newline yet");
    }
}
