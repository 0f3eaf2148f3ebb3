//! The test harness: simulated llama-servers and a real crossbar on loopback, plus a small HTTP
//! client that shows status, headers and body exactly as they arrived.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crossbar::config::Config;
use crossbar::server::Server;
use crossbar::sim::{Sim, SimConfig};
use crossbar::store::{Reader, RequestRow};
use serde_json::Value;

mod process;
mod refusal;
pub use process::{free_port, stderr_lines, wait_line};
pub use refusal::check_error;

/// A crossbar in front of named simulated hosts, with its own db in a fresh directory.
pub struct Harness {
    pub server: Option<Server>,
    pub sims: Vec<(String, Sim)>,
    pub dir: TempDir,
}

/// One host of a test setup: its name, how the sim behaves, and `parallel` in crossbar's config
/// (0: no `[hosts.NAME.models.m]` table at all, only the host's `url`: issue 47).
pub struct HostSpec {
    pub name: &'static str,
    pub sim: SimConfig,
    pub parallel: usize,
    pub weight: u32,
    /// More lines for its `[hosts.NAME]` table.
    pub config: &'static str,
}

/// A host's `config` that states nothing of its similarity and RAM cache: crossbar probes it at
/// first contact (issue 47). Every other host is given what its sim does, so that a test counts
/// only its own requests.
pub const LEARNED: &str = "# learned";

pub fn host(name: &'static str, parallel: usize) -> HostSpec {
    HostSpec {
        name,
        sim: SimConfig {
            slots: parallel,
            ..SimConfig::default()
        },
        parallel,
        weight: 1,
        config: "",
    }
}

/// A fresh directory under the system temp dir, unique per test, removed with its contents when
/// dropped (a test that panics leaves nothing behind either).
pub fn temp_dir() -> TempDir {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::SeqCst);
    let dir = std::env::temp_dir().join(format!("crossbar-it-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    TempDir(dir)
}

/// A test's own directory ([`temp_dir`]); reads as a [`Path`].
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Harness {
    /// Starts the sims and a crossbar with route `projA` over all hosts (model `m`), plus `extra`
    /// top-level config lines.
    pub fn start(hosts: Vec<HostSpec>, extra: &str) -> Harness {
        Harness::start_with(hosts, extra, "")
    }

    /// [`Harness::start`] with `route_extra` lines in `[routes.projA]`.
    pub fn start_with(hosts: Vec<HostSpec>, extra: &str, route_extra: &str) -> Harness {
        let dir = temp_dir();
        let sims: Vec<(String, Sim)> = hosts
            .iter()
            .map(|h| (h.name.to_string(), Sim::start(h.sim.clone())))
            .collect();
        let text = config_text(&dir, &hosts, &sims, extra) + route_extra + "\n";
        let config =
            Config::from_toml(&text).unwrap_or_else(|e| panic!("{:#?}\n{text}", e.lines()));
        let server = Server::start(config).unwrap();
        // Until a host is polled the chooser cannot know it has the model loaded, and a poll landing
        // mid-test could undo a test's own `mark_down`: every test starts after the first round.
        let gw = server.gateway().clone();
        wait_until("every host's first poll, acted on", || {
            hosts.iter().all(|h| gw.polls_seen(h.name) > 0)
        });
        Harness {
            server: Some(server),
            sims,
            dir,
        }
    }

    pub fn server(&self) -> &Server {
        self.server.as_ref().unwrap()
    }

    pub fn sim(&self, name: &str) -> &Sim {
        &self.sims.iter().find(|(n, _)| n == name).unwrap().1
    }

    pub fn addr(&self) -> SocketAddr {
        self.server().client_addr()
    }

    /// A second store handle on crossbar's db, as an operator's sqlite3 shell would have.
    pub fn db(&self) -> Reader {
        Reader::open(&self.dir.join("crossbar.db")).unwrap()
    }

    /// Fills the db (SQLite's page cap at the file's size) and sends new conversations until
    /// one is refused: that answer.
    pub fn fill_store(&self) -> Answer {
        self.limit_pages(Some(1));
        (0..400)
            .map(|i| {
                let id = format!("full{i}");
                self.post_with(
                    "/projA/v1/chat/completions",
                    &[("X-Session-Id", &id)],
                    &chat("hi", 0, false),
                )
            })
            .find(|a| a.status != 200)
            .expect("400 new conversations fitted in a full file")
    }

    /// Lifts [`Harness::fill_store`]'s cap.
    pub fn unfill_store(&self) {
        self.limit_pages(None);
    }

    fn limit_pages(&self, pages: Option<u32>) {
        let write = crossbar::store::Write::LimitPages(pages);
        self.server()
            .gateway()
            .store
            .submit(vec![write])
            .wait()
            .unwrap();
    }

    /// The accounting rows so far, oldest first.
    pub fn rows(&self) -> Vec<RequestRow> {
        self.db().requests_since(0, None).unwrap()
    }

    pub fn post(&self, path: &str, body: &Value) -> Answer {
        request(self.addr(), "POST", path, &[], body.to_string().as_bytes())
    }

    pub fn post_with(&self, path: &str, headers: &[(&str, &str)], body: &Value) -> Answer {
        request(
            self.addr(),
            "POST",
            path,
            headers,
            body.to_string().as_bytes(),
        )
    }

    /// Sends a POST on a new connection and returns the connection, answer unread.
    pub fn open_chat(&self, path: &str, body: &Value) -> Conn {
        self.open_chat_with(path, &[], body)
    }

    /// [`Harness::open_chat`] with `headers`.
    pub fn open_chat_with(&self, path: &str, headers: &[(&str, &str)], body: &Value) -> Conn {
        let mut conn = Conn::open(self.addr());
        conn.send("POST", path, headers, body.to_string().as_bytes());
        conn
    }

    pub fn get(&self, path: &str) -> Answer {
        request(self.addr(), "GET", path, &[], b"")
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            server.stop(Duration::from_secs(5));
        }
    }
}

fn config_text(
    dir: &std::path::Path,
    hosts: &[HostSpec],
    sims: &[(String, Sim)],
    extra: &str,
) -> String {
    let mut text = format!(
        "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ndb = {:?}\n",
        dir.join("crossbar.db")
    );
    if !extra.contains("workers") {
        text.push_str("workers = 8\n");
    }
    if !extra.contains("health_interval") {
        text.push_str("health_interval = \"1s\"\n");
    }
    text.push_str(extra);
    text.push('\n');
    for (spec, (_, sim)) in hosts.iter().zip(sims) {
        let mut stated = String::new();
        if spec.config != LEARNED {
            if !spec.config.contains("slot_prompt_similarity") {
                let similarity = spec.sim.slot_prompt_similarity;
                stated.push_str(&format!("slot_prompt_similarity = {similarity}\n"));
            }
            if !spec.config.contains("ram_cache") {
                let ram = spec.sim.ram_cache_tokens > 0;
                stated.push_str(&format!("ram_cache = {ram}\n"));
            }
        }
        text.push_str(&format!(
            "[hosts.{name}]\nurl = \"{}\"\nweight = {}\n{}\n{stated}",
            sim.url(),
            spec.weight,
            spec.config,
            name = spec.name
        ));
        if spec.parallel > 0 {
            let (name, parallel) = (spec.name, spec.parallel);
            text.push_str(&format!("[hosts.{name}.models.m]\nparallel = {parallel}\n"));
        }
    }
    let names: Vec<String> = hosts.iter().map(|h| format!("{:?}", h.name)).collect();
    text.push_str(&format!(
        "[routes.projA]\nhosts = [{}]\nmodel = \"m\"\n",
        names.join(", ")
    ));
    text
}

/// A complete answer as the client saw it.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        crossbar::wire::header(&self.headers, name)
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// One request on a fresh connection, read to the end of its body.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Answer {
    let mut conn = Conn::open(addr);
    conn.send(method, path, headers, body);
    conn.read_answer()
}

/// A raw client connection, for keep-alive and streaming tests.
pub struct Conn {
    pub reader: BufReader<TcpStream>,
}

impl Conn {
    pub fn open(addr: SocketAddr) -> Conn {
        let stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        Conn {
            reader: BufReader::new(stream),
        }
    }

    pub fn send(&mut self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) {
        // The Host a real client sends: the address it connected to. Bodies are JSON unless the
        // test says otherwise.
        let peer = self.reader.get_ref().peer_addr().unwrap();
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {peer}\r\nContent-Length: {}\r\n",
            body.len()
        );
        let typed = headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("Content-Type"));
        if !body.is_empty() && !typed {
            head.push_str("Content-Type: application/json\r\n");
        }
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        let stream = self.reader.get_mut();
        stream.write_all(head.as_bytes()).unwrap();
        stream.write_all(body).unwrap();
    }

    /// Reads a status line and headers.
    pub fn read_head(&mut self) -> (u16, Vec<(String, String)>) {
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        let status = line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {line:?}"));
        let mut headers = Vec::new();
        loop {
            line.clear();
            self.reader.read_line(&mut line).unwrap();
            let trimmed = line.trim_end();
            if trimmed.is_empty() {
                return (status, headers);
            }
            let (k, v) = trimmed.split_once(':').unwrap();
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }

    /// Reads one chunk of a chunked body: `Some(data)`, or `None` at the last chunk.
    pub fn read_chunk(&mut self) -> Option<Vec<u8>> {
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        let size = usize::from_str_radix(line.trim(), 16)
            .unwrap_or_else(|_| panic!("bad chunk line {line:?}"));
        let mut data = vec![0; size + 2];
        self.reader.read_exact(&mut data).unwrap();
        data.truncate(size);
        (size > 0).then_some(data)
    }

    pub fn read_answer(&mut self) -> Answer {
        let (status, headers) = self.read_head();
        let find = |name: &str| crossbar::wire::header(&headers, name).map(str::to_string);
        let body = if find("Transfer-Encoding").is_some_and(|v| v.contains("chunked")) {
            let mut body = Vec::new();
            while let Some(chunk) = self.read_chunk() {
                body.extend_from_slice(&chunk);
            }
            body
        } else if let Some(n) = find("Content-Length").and_then(|v| v.parse::<usize>().ok()) {
            let mut body = vec![0; n];
            self.reader.read_exact(&mut body).unwrap();
            body
        } else {
            let mut body = Vec::new();
            self.reader.read_to_end(&mut body).unwrap();
            body
        };
        Answer {
            status,
            headers,
            body,
        }
    }
}

/// A connection to `addr` from the loopback address `from` (another peer, as on a LAN).
pub fn connect_from(from: [u8; 4], addr: SocketAddr) -> Conn {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.bind(&SocketAddr::from((from, 0)).into()).unwrap();
    sock.connect(&addr.into()).unwrap();
    let sock: TcpStream = sock.into();
    sock.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    Conn {
        reader: BufReader::new(sock),
    }
}

/// Holds `host`'s only slot (model `m`, route `projA`) with a stream its sim sends in lockstep,
/// so nothing of it arrives until the test releases it; returns once the limiter counts the
/// stream in flight.
pub fn hold_slot(h: &Harness, host: &str) -> Conn {
    h.sim(host).set_lockstep(true);
    let conn = h.open_chat("/projA/v1/chat/completions", &chat("holder", 0, true));
    let gw = h.server().gateway().clone();
    wait_until("the holder has the slot", || {
        gw.limiter.in_flight(host, "m") == 1
    });
    conn
}

/// Drains `host` (`on`) or undrains it through the admin API.
#[track_caller]
pub fn drain(h: &Harness, host: &str, on: bool) {
    let body = serde_json::json!({"host": host, "on": on}).to_string();
    let answer = request(
        h.server().admin_addr(),
        "POST",
        "/admin/drain",
        &[],
        body.as_bytes(),
    );
    assert_eq!(answer.status, 200, "{}", answer.text());
}

/// Waits until `cond` holds, polling a condition the code under test changes; fails after 10 s.
#[track_caller]
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Waits for a sim event matching `pred`; fails after 10 s.
#[track_caller]
pub fn wait_event(
    events: &crossbeam_channel::Receiver<crossbar::sim::SimEvent>,
    what: &str,
    pred: impl Fn(&crossbar::sim::SimEvent) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match events.recv_deadline(deadline) {
            Ok(event) if pred(&event) => return,
            Ok(_) => {}
            Err(_) => panic!("timed out waiting until {what}"),
        }
    }
}

/// A chat body: a conversation with a system prompt, first user message `first`, and `turns`
/// more user/assistant exchanges.
pub fn chat(first: &str, turns: usize, stream: bool) -> Value {
    let mut messages = vec![
        serde_json::json!({"role": "system", "content": "You are a careful coding assistant."}),
        serde_json::json!({"role": "user", "content": first}),
    ];
    for i in 0..turns {
        messages.push(serde_json::json!({"role": "assistant", "content": format!("answer number {i} with some words")}));
        messages.push(serde_json::json!({"role": "user", "content": format!("follow-up question {i}, please go on")}));
    }
    serde_json::json!({"model": "m", "messages": messages, "stream": stream, "max_tokens": 4})
}
