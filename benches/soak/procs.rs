//! The processes under test: three `crossbar-sim` hosts (fault commands over stdin, killed and
//! revived on the same port) and `crossbar serve` (its log in a file, its ports read back from the
//! log, SIGHUP, SIGKILL and restart), plus `/proc` sampling of crossbar's threads, fds and memory.
//! Every child is owned and killed on drop, so a failing soak leaves nothing running.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

pub const SIM: &str = env!("CARGO_BIN_EXE_crossbar-sim");
pub const CROSSBAR: &str = env!("CARGO_BIN_EXE_crossbar");

/// One simulated llama-server process; `child` is `None` while it is killed.
#[derive(Debug)]
pub struct SimProc {
    pub name: String,
    pub port: u16,
    child: Option<(Child, ChildStdin, BufReader<ChildStdout>)>,
}

impl SimProc {
    /// Starts on a port the OS picks; the sim prints it.
    pub fn start(name: &str) -> io::Result<SimProc> {
        let (child, port) = spawn_sim("127.0.0.1:0")?;
        Ok(SimProc {
            name: name.to_string(),
            port,
            child: Some(child),
        })
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Sends `fault ARGS` and waits for the sim's answer.
    pub fn fault(&mut self, args: &str) -> io::Result<()> {
        let Some((_, stdin, stdout)) = self.child.as_mut() else {
            return Ok(());
        };
        writeln!(stdin, "fault {args}")?;
        stdin.flush()?;
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        if line.starts_with("fault set") {
            Ok(())
        } else {
            Err(io::Error::other(format!("sim {}: {line:?}", self.name)))
        }
    }

    /// SIGKILL: the host dies with its connections.
    pub fn kill(&mut self) {
        if let Some((mut child, _, _)) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts a fresh process on the same port (a few tries: the old socket may linger).
    pub fn revive(&mut self) -> io::Result<()> {
        let addr = format!("127.0.0.1:{}", self.port);
        let mut last = None;
        for _ in 0..50 {
            match spawn_sim(&addr) {
                Ok((child, _)) => {
                    self.child = Some(child);
                    return Ok(());
                }
                Err(e) => last = Some(e),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(last.unwrap_or_else(|| io::Error::other("sim did not start")))
    }
}

impl Drop for SimProc {
    fn drop(&mut self) {
        self.kill();
    }
}

type SimChild = (Child, ChildStdin, BufReader<ChildStdout>);

/// 2 slots of 64k context each, a simulated prefill and decode cost so slots are really held. A
/// stalled client's 40k-token stream (~7.6 MB) outgrows any socket buffer (tcp_wmem's 4 MiB).
fn spawn_sim(listen: &str) -> io::Result<(SimChild, u16)> {
    let mut child = Command::new(SIM)
        .args([
            "--listen", listen, "--alias", "qwen", "--ctx", "131072", "--slots", "2",
        ])
        .args([
            "--prefill-us",
            "20",
            "--decode-us",
            "500",
            "--max-tokens",
            "16",
        ])
        .args(["--ram-cache-tokens", "20000", "--faults-from-stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let stdin = child.stdin.take().expect("piped stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line)?;
    let port = line
        .trim()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .filter(|_| line.starts_with("sim listening on "));
    match port {
        Some(port) => Ok(((child, stdin, stdout), port)),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            Err(io::Error::other(format!("sim did not start on {listen}")))
        }
    }
}

/// One `crossbar serve` process.
#[derive(Debug)]
pub struct Crossbar {
    child: Child,
    pub pid: u32,
    pub client: SocketAddr,
    pub admin: SocketAddr,
}

impl Crossbar {
    /// Starts `crossbar serve -c config`, its stderr (the log) going to `log`; waits up to 10 s for
    /// the line naming the listeners.
    pub fn start(config: &Path, log: &Path) -> io::Result<Crossbar> {
        // BENCH_CROSSBAR: another build of the binary, to compare two builds in one setup.
        let binary = std::env::var_os("BENCH_CROSSBAR").unwrap_or_else(|| CROSSBAR.into());
        let child = Command::new(binary)
            .args(["serve", "-c"])
            .arg(config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(log)?)
            .spawn()?;
        let mut cb = Crossbar {
            pid: child.id(),
            child,
            client: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin: SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            if let Some(line) = text
                .lines()
                .find(|l| l.contains("listening") && l.contains("clients="))
            {
                let addr = |key: &str| {
                    line.split_whitespace()
                        .find_map(|w| w.strip_prefix(key))
                        .and_then(|a| a.parse().ok())
                };
                if let (Some(c), Some(a)) = (addr("clients="), addr("admin=")) {
                    (cb.client, cb.admin) = (c, a);
                    return Ok(cb);
                }
            }
            if let Ok(Some(status)) = cb.child.try_wait() {
                return Err(io::Error::other(format!(
                    "crossbar exited {status}:\n{text}"
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(io::Error::other(
            "crossbar did not log its listeners within 10 s",
        ))
    }

    /// Sends `sig` (`-HUP`, `-TERM`) with the shell's `kill` builtin: std sends only SIGKILL, and
    /// a minimal image may have no `/bin/kill`.
    pub fn signal(&self, sig: &str) {
        let command = format!("kill {sig} {}", self.pid);
        let _ = Command::new("sh").args(["-c", &command]).status();
    }

    pub fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then up to 10 s for a clean exit; `false` if it had to be killed.
    pub fn stop(&mut self) -> bool {
        self.signal("-TERM");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill();
        false
    }
}

impl Drop for Crossbar {
    fn drop(&mut self) {
        if !self.exited() {
            self.kill();
        }
    }
}

/// A process's threads, open fds and memory (KiB), from `/proc`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sample {
    pub threads: usize,
    pub fds: usize,
    pub rss_kib: u64,
    pub hwm_kib: u64,
}

pub fn sample(pid: u32) -> Option<Sample> {
    let count = |what: &str| {
        std::fs::read_dir(format!("/proc/{pid}/{what}"))
            .ok()
            .map(|d| d.count())
    };
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    Some(Sample {
        threads: count("task")?,
        fds: count("fd")?,
        rss_kib: kib("VmRSS:"),
        hwm_kib: kib("VmHWM:"),
    })
}

/// The idle level: threads and fds once two samples 300 ms apart agree (at most 5 s).
pub fn idle_level(pid: u32) -> Sample {
    let mut last = sample(pid).unwrap_or_default();
    for _ in 0..16 {
        std::thread::sleep(Duration::from_millis(300));
        let now = sample(pid).unwrap_or_default();
        if now.threads == last.threads && now.fds == last.fds {
            return now;
        }
        last = now;
    }
    last
}

/// A fresh directory for the db, config and logs.
pub fn temp_dir(seed: u64) -> PathBuf {
    let base = std::env::var_os("TMPDIR").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
    let dir = base.join(format!("crossbar-soak-{}-{seed}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create the soak's temp dir");
    dir
}

/// Lines of the file at `path` that contain `needle`.
pub fn count_lines(path: &Path, needle: &str) -> u64 {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().filter(|l| l.contains(needle)).count() as u64
}
