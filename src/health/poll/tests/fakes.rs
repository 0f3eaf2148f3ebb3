//! Fake hosts for the polling tests, all on 127.0.0.1:0: one answering from a table, one that
//! accepts and never answers, and the URL of a port nobody listens on.

use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use crossbeam_channel::{unbounded, Receiver};

/// How a fake host answers a path: (status, body).
pub type Answer = fn(&str) -> (u16, &'static str);

/// One request a fake host received: its path and Authorization header.
pub type Hit = (String, Option<String>);

/// A fake llama-server answering from a fixed table, reporting every request on `hits`.
pub struct Fake {
    pub url: String,
    pub hits: Receiver<Hit>,
    server: Arc<tiny_http::Server>,
    thread: Option<thread::JoinHandle<()>>,
}

pub fn fake(answer: Answer) -> Fake {
    let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").expect("bind a test server"));
    let addr = server.server_addr().to_ip().expect("an IP address");
    let (tx, hits) = unbounded();
    let serving = Arc::clone(&server);
    let thread = thread::spawn(move || {
        while let Ok(request) = serving.recv() {
            let auth = request
                .headers()
                .iter()
                .find(|h| h.field.equiv("Authorization"))
                .map(|h| h.value.as_str().to_string());
            let path = request.url().to_string();
            let (status, body) = answer(&path);
            let _ = tx.send((path, auth));
            let _ =
                request.respond(tiny_http::Response::from_string(body).with_status_code(status));
        }
    });
    Fake {
        url: format!("http://{addr}"),
        hits,
        server,
        thread: Some(thread),
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A host that accepts connections and never answers; each accept is reported.
pub struct Hung {
    pub url: String,
    pub accepted: Receiver<()>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

pub fn hung() -> Hung {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a test listener");
    let addr = listener.local_addr().expect("a local address");
    let (tx, accepted) = unbounded();
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = Arc::clone(&stop);
    let thread = thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            if stopping.load(Ordering::SeqCst) {
                return;
            }
            held.extend(stream.ok());
            let _ = tx.send(());
        }
    });
    Hung {
        url: format!("http://{addr}"),
        accepted,
        stop,
        thread: Some(thread),
    }
}

impl Drop for Hung {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.url.trim_start_matches("http://"));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The URL of a port nobody listens on: bound, then released.
pub fn refusing_url() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a test listener");
    let addr = listener.local_addr().expect("a local address");
    drop(listener);
    format!("http://{addr}")
}
