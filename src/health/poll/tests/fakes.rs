//! Fake hosts for the polling tests, all on 127.0.0.1:0: one answering from a table, one that
//! accepts and never answers, and the URL of a port nobody listens on.

use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::conn::{Pool, Request, Service, Settings};

use crossbeam_channel::{unbounded, Receiver};

/// How a fake host answers a path: (status, body).
pub type Answer = fn(&str) -> (u16, &'static str);

/// One request a fake host received: its path and Authorization header.
pub type Hit = (String, Option<String>);

/// A fake llama-server answering from a fixed table, reporting every request on `hits`. It is
/// served by crossbar's own connection layer, like crossbar's listeners.
pub struct Fake {
    pub url: String,
    pub hits: Receiver<Hit>,
    pool: Option<Pool>,
}

pub fn fake(answer: Answer) -> Fake {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a test server");
    let (tx, hits) = unbounded();
    let service = Service {
        name: "fake",
        handle: Box::new(move |request: &mut Request<'_>| {
            let auth = request.header("Authorization").map(str::to_string);
            let path = request.target().to_string();
            let (status, body) = answer(&path);
            let _ = tx.send((path, auth));
            let _ = request.send(status, &[] as &[(&str, &str)], body.as_bytes());
        }),
        refused: Box::new(|_| {}),
    };
    let pool = Pool::start(listener, 2, Settings::default(), service).expect("start a test server");
    Fake {
        url: format!("http://{}", pool.addr()),
        hits,
        pool: Some(pool),
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.stop(Instant::now() + Duration::from_secs(5));
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
