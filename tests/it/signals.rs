//! The real `crossbar serve` process and its signals (issue 6): SIGTERM lets a stream in flight
//! finish, records it and exits 0; SIGHUP puts a valid new config in force (leases kept) and
//! refuses an invalid one, naming the key, while the old config keeps serving. Also what the
//! process writes (`lines`): every line splits into key=value pairs, and a client cannot forge one.
//!
//! Each test runs the built binary as a child against in-process sims. A child needs fixed
//! addresses, so free loopback ports are found by binding `127.0.0.1:0` and letting go; the
//! "crossbar listening" log line says when it is up. Log lines arrive over a channel.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crossbar::sim::{Sim, SimConfig, SimEvent};
use crossbar::store::Reader;
use crossbeam_channel::{Receiver, RecvTimeoutError};

use crate::support::{
    chat, free_port, request, stderr_lines, temp_dir, wait_event, wait_line, Answer, Conn, TempDir,
};

const CHAT: &str = "/projA/v1/chat/completions";

mod lines;
mod lock;

/// A `crossbar serve` child process; killed on drop if still running.
struct Crossbar {
    child: Child,
    /// Every stderr line, in order, as the child wrote it.
    log: Receiver<String>,
    /// Lines already taken from `log`, for failure messages.
    seen: Vec<String>,
    addr: SocketAddr,
    config: PathBuf,
    /// Removed when dropped, after the child is gone (fields drop after `drop`).
    dir: TempDir,
}

impl Crossbar {
    /// Writes the config made by `config(listen, admin, db)` and starts `crossbar serve` on it.
    fn start(config: impl Fn(&str) -> String) -> Crossbar {
        let dir = temp_dir();
        let addr = free_port();
        let head = format!(
            "listen = \"{addr}\"\nadmin_listen = \"{}\"\ndb = {:?}\nworkers = 4\n\
             health_interval = \"1s\"\nshutdown_grace = \"10s\"\n",
            free_port(),
            dir.join("crossbar.db"),
        );
        let path = dir.join("crossbar.toml");
        std::fs::write(&path, config(&head)).unwrap();
        let (child, log) = spawn_serve(&path);
        let mut crossbar = Crossbar {
            child,
            log,
            seen: Vec::new(),
            addr,
            config: path,
            dir,
        };
        crossbar.wait_log("crossbar listening");
        crossbar
    }

    /// Starts `crossbar serve` again on the same config (after the first one ended).
    fn respawn(&mut self) {
        let (child, log) = spawn_serve(&self.config);
        self.child = child;
        self.log = log;
        self.wait_log("crossbar listening");
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success(), "kill -{name} failed");
    }

    /// Waits (up to 10 s) for a log line containing `needle`; returns it.
    #[track_caller]
    fn wait_log(&mut self, needle: &str) -> String {
        wait_line(&self.log, &mut self.seen, needle)
    }

    /// Waits (up to 10 s) for the process to exit.
    #[track_caller]
    fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "crossbar did not exit");
            // Not synchronisation: there is no channel for a child's exit; poll it.
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The rest of the log once the process has exited.
    fn drain_log(&mut self) -> Vec<String> {
        loop {
            match self.log.recv_timeout(Duration::from_secs(5)) {
                Ok(line) => self.seen.push(line),
                Err(RecvTimeoutError::Disconnected | RecvTimeoutError::Timeout) => {
                    return self.seen.clone()
                }
            }
        }
    }

    fn post(&self, path: &str, body: &serde_json::Value) -> Answer {
        request(self.addr, "POST", path, &[], body.to_string().as_bytes())
    }

    fn db(&self) -> Reader {
        Reader::open(&self.dir.join("crossbar.db")).unwrap()
    }
}

impl Drop for Crossbar {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `crossbar serve -c path` as a child, its stderr lines on a channel.
fn spawn_serve(path: &Path) -> (Child, Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_crossbar"))
        .args(["serve", "-c"])
        .arg(path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot run the crossbar binary");
    let log = stderr_lines(&mut child);
    (child, log)
}

fn sim() -> Sim {
    Sim::start(SimConfig {
        slots: 1,
        ..SimConfig::default()
    })
}

fn host_text(name: &str, sim: &Sim) -> String {
    format!(
        "[hosts.{name}]\nurl = \"{}\"\nslot_prompt_similarity = 0.1\nram_cache = false\n[hosts.{name}.models.m]\nparallel = 1\n",
        sim.url()
    )
}

#[track_caller]
fn check_ok(answer: &Answer, host: &str, lease: &str) {
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("X-Crossbar-Host"), Some(host));
    assert_eq!(answer.header("X-Crossbar-Lease"), Some(lease));
}

#[test]
fn sigterm_lets_a_stream_in_flight_finish_records_it_and_exits_0() {
    let titan = sim();
    let events = titan.events();
    titan.set_lockstep(true);
    let mut crossbar = Crossbar::start(|head| {
        format!(
            "{head}{}[routes.projA]\nhosts = [\"titan\"]\nmodel = \"m\"\n",
            host_text("titan", &titan)
        )
    });
    let mut conn = Conn::open(crossbar.addr);
    conn.send(
        "POST",
        CHAT,
        &[],
        chat("hi", 0, true).to_string().as_bytes(),
    );
    wait_event(
        &events,
        "the stream reaches the host",
        |e| matches!(e, SimEvent::Request { path } if path.contains("chat")),
    );

    crossbar.signal("TERM");
    crossbar.wait_log("signal received signal=TERM");
    crossbar.wait_log("stopping grace_s=");
    titan.release(1000);

    let answer = conn.read_answer();
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert!(
        answer.text().trim_end().ends_with("data: [DONE]"),
        "the stream was cut: {}",
        answer.text()
    );
    let status = crossbar.wait_exit();
    let log = crossbar.drain_log();
    assert_eq!(status.code(), Some(0), "{}", log.join("\n"));
    // Lines leave through their own thread (issue 12): the stream's request line and the last
    // line are on stderr when the process has exited, in order.
    let at = |needle: &str| log.iter().position(|l| l.contains(needle));
    let (request, stopped) = (at("api=chat host=titan lease=new"), at("] stopped"));
    assert!(
        request.is_some() && stopped.is_some() && request < stopped,
        "{}",
        log.join("\n")
    );
    let rows = crossbar.db().requests_since(0, None).unwrap();
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert_eq!(rows[0].status, 200);
    assert!(rows[0].streamed);
    assert_eq!(rows[0].err, "");
    assert_eq!(rows[0].completion_tokens, Some(4), "{rows:#?}");
}

#[test]
fn sighup_applies_a_valid_config_keeping_leases_and_refuses_an_invalid_one() {
    let (titan, mini) = (sim(), sim());
    let hosts = format!("{}{}", host_text("titan", &titan), host_text("mini", &mini));
    let route_a = "[routes.projA]\nhosts = [\"titan\", \"mini\"]\nmodel = \"m\"\n";
    let mut crossbar = Crossbar::start(|head| format!("{head}{hosts}{route_a}"));
    let head = std::fs::read_to_string(&crossbar.config).unwrap();
    let conversation = chat("keep me where my cache is", 0, false);
    let first = crossbar.post(CHAT, &conversation);
    assert_eq!(first.status, 200, "{}", first.text());
    let leased = first.header("X-Crossbar-Host").unwrap().to_string();
    let body_b = chat("project b", 0, false);
    assert_eq!(
        crossbar.post("/projB/v1/chat/completions", &body_b).status,
        404,
        "projB is not configured yet"
    );

    // A valid config adding route projB over mini only.
    let route_b = "[routes.projB]\nhosts = [\"mini\"]\nmodel = \"m\"\n";
    rewrite(&crossbar.config, &format!("{head}{route_b}"));
    crossbar.signal("HUP");
    crossbar.wait_log("config reloaded");
    check_ok(
        &crossbar.post("/projB/v1/chat/completions", &body_b),
        "mini",
        "new",
    );
    check_ok(&crossbar.post(CHAT, &conversation), &leased, "reused");

    // An invalid one: a route naming a host that does not exist, and a bad type.
    let broken = format!("{head}{route_b}[routes.projC]\nhosts = [\"nope\"]\nmodel = \"m\"\n");
    rewrite(&crossbar.config, &broken);
    crossbar.signal("HUP");
    let refused = crossbar.wait_log("config reload refused");
    assert!(refused.contains("routes.projC"), "{refused}");
    assert!(refused.contains("[ERROR]"), "{refused}");
    // The old config (with projB, without projC) still serves; the lease is still there.
    check_ok(
        &crossbar.post("/projB/v1/chat/completions", &body_b),
        "mini",
        "reused",
    );
    check_ok(&crossbar.post(CHAT, &conversation), &leased, "reused");
    let projc = crossbar.post("/projC/v1/chat/completions", &body_b);
    assert_eq!(projc.status, 404, "{}", projc.text());

    // Text that is not TOML at all is refused the same way.
    rewrite(&crossbar.config, &format!("{head}workers = = 3\n"));
    crossbar.signal("HUP");
    crossbar.wait_log("config reload refused");
    check_ok(&crossbar.post(CHAT, &conversation), &leased, "reused");

    crossbar.signal("TERM");
    let status = crossbar.wait_exit();
    let log = crossbar.drain_log();
    assert_eq!(status.code(), Some(0), "{}", log.join("\n"));
    // Issue 13: at start one line per host with its state, slots and context; every line splits
    // into a kind and key=value pairs.
    for host in ["titan", "mini"] {
        let start = format!("host up host={host} ctx=");
        assert!(
            log.iter()
                .any(|l| l.contains(&start) && l.contains(" slots=")),
            "no {start:?} line in\n{}",
            log.join("\n")
        );
    }
    for line in &log {
        lines::check_splits(line);
    }
}

/// Issue 48: a refused SIGHUP used to show only in the log; `crossbar status`, `/admin/status`,
/// the page and `/metrics` all said nothing. And which build serves: the start-up line and the
/// status name the commit.
#[test]
fn a_refused_reload_shows_in_the_status_the_page_and_the_metrics_issue_48() {
    let titan = sim();
    let hosts = host_text("titan", &titan);
    let route = "[routes.projA]\nhosts = [\"titan\"]\nmodel = \"m\"\n";
    let mut crossbar = Crossbar::start(|head| format!("{head}{hosts}{route}"));
    let listening = (crossbar.seen.iter())
        .find(|l| l.contains("crossbar listening"))
        .cloned()
        .unwrap();
    let commit = crossbar::version::commit_token();
    assert!(
        listening.contains(&format!(
            " version={} commit={commit}",
            crossbar::version::VERSION
        )),
        "{listening}"
    );
    let admin: SocketAddr = (listening.split_whitespace())
        .find_map(|w| w.strip_prefix("admin="))
        .and_then(|a| a.parse().ok())
        .unwrap();
    let status = || request(admin, "GET", "/admin/status", &[], b"").json();
    assert_eq!(status()["last_reload"], serde_json::Value::Null);
    assert_eq!(
        status()["build"]["commit"],
        serde_json::json!(crossbar::version::commit())
    );

    let head = std::fs::read_to_string(&crossbar.config).unwrap();
    rewrite(
        &crossbar.config,
        &format!("{head}[routes.projC]\nhosts = [\"mni\"]\nmodel = \"m\"\n"),
    );
    crossbar.signal("HUP");
    crossbar.wait_log("config reload refused");
    crate::support::wait_until("the status has the refused reload", || {
        status()["last_reload"]["applied"] == false
    });
    let reload = &status()["last_reload"];
    let problems = reload["problems"].to_string();
    assert!(problems.contains("routes.projC.hosts"), "{reload}");
    let cli = Command::new(env!("CARGO_BIN_EXE_crossbar"))
        .args(["status", "--admin", &admin.to_string()])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&cli.stdout);
    assert!(
        cli.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&cli.stderr)
    );
    assert!(
        out.contains("LAST RELOAD REFUSED") && out.contains("routes.projC.hosts"),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "serving: crossbar {}",
            crossbar::version::describe()
        )),
        "{out}"
    );
    let page = request(admin, "GET", "/", &[], b"").text();
    assert!(page.contains("last reload refused"), "{page}");
    let metrics = request(admin, "GET", "/metrics", &[], b"").text();
    assert!(
        metrics.contains("crossbar_config_last_reload_successful 0"),
        "{metrics}"
    );
    assert!(
        metrics.contains("crossbar_config_reloads_total{result=\"refused\"} 1"),
        "{metrics}"
    );

    // Fixed and reloaded: applied.
    rewrite(&crossbar.config, &head);
    crossbar.signal("HUP");
    crossbar.wait_log("config reloaded");
    crate::support::wait_until("the status has the applied reload", || {
        status()["last_reload"]["applied"] == true
    });
    let metrics = request(admin, "GET", "/metrics", &[], b"").text();
    assert!(
        metrics.contains("crossbar_config_last_reload_successful 1"),
        "{metrics}"
    );
}

/// Replaces the file whole, as an editor or a config tool would.
fn rewrite(path: &Path, text: &str) {
    let tmp = path.with_extension("toml.new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}
