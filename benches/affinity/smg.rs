//! smg (SGLang's Shepherd Model Gateway, PyPI `smg` 1.13) as a front end (issue 47): a child
//! process started as ../shared/peers.md shows — `cache_aware` policy, only the workers' URLs —
//! on loopback ports the OS picked, ready once `/readiness` counts every worker healthy, and
//! stopped with SIGTERM (it drains for about 5 s) when dropped.
//!
//! Owns: the process, its log file (in the run's directory), and the `#` line of which branch of
//! its policy placed each request (from its Prometheus port). Must not: bind anything but
//! loopback (both listeners are given 127.0.0.1), let it fetch a tokenizer (it would ask the
//! Hugging Face hub for the model's name: `--disable-tokenizer-autoload`, `HF_HUB_OFFLINE=1`;
//! `cache_aware` over HTTP works on the request text and needs none), or signal anything but its
//! own child, by process id.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long smg may take to list every worker healthy (0.3–0.5 s measured), and to exit after
/// SIGTERM (5–7 s measured) before it is killed.
const READY_WITHIN: Duration = Duration::from_secs(30);
const EXIT_WITHIN: Duration = Duration::from_secs(15);

#[derive(Debug)]
pub struct Smg {
    child: Child,
    pub addr: SocketAddr,
    metrics: SocketAddr,
}

impl Smg {
    /// smg in front of `workers` (base URLs), its log at `dir/smg.log`; an error says why it could
    /// not run (not installed, exited, never ready) and leaves nothing running.
    pub fn start(workers: &[String], dir: &Path) -> Result<Smg, String> {
        let bin = binary();
        if !bin.exists() {
            return Err(format!(
                "{} not found (scripts/bench-affinity.sh installs smg 1.13 into a venv; SMG=path \
                 names another)",
                bin.display()
            ));
        }
        let (port, metrics_port) = (free_port()?, free_port()?);
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let log_path = dir.join("smg.log");
        let log =
            std::fs::File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
        let err_log = log.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new(&bin)
            .args(["launch", "--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--prometheus-host", "127.0.0.1"])
            .args(["--prometheus-port", &metrics_port.to_string()])
            .args(["--policy", "cache_aware", "--disable-tokenizer-autoload"])
            .arg("--worker-urls")
            .args(workers)
            .env("HF_HUB_OFFLINE", "1")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err_log)
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
        let mut smg = Smg {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            metrics: SocketAddr::from(([127, 0, 0, 1], metrics_port)),
        };
        smg.wait_ready(workers.len(), &log_path)?;
        Ok(smg)
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Until `/readiness` says `healthy_workers == n` (it listens before it has registered them).
    fn wait_ready(&mut self, n: usize, log: &Path) -> Result<(), String> {
        let agent = ureq::Agent::new_with_config(
            ureq::Agent::config_builder()
                .timeout_global(Some(Duration::from_secs(2)))
                .http_status_as_error(false)
                .build(),
        );
        let deadline = Instant::now() + READY_WITHIN;
        let mut last = String::from("no answer");
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("smg exited ({status}); {}", tail(log)));
            }
            if let Ok(r) = agent.get(format!("{}/readiness", self.url())).call() {
                last = r.into_body().read_to_string().unwrap_or_default();
                let healthy = serde_json::from_str::<Value>(&last)
                    .ok()
                    .and_then(|v| v["healthy_workers"].as_u64());
                if healthy == Some(n as u64) {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "smg not ready within {} s (last /readiness: {}); {}",
                    READY_WITHIN.as_secs(),
                    last.trim(),
                    tail(log)
                ));
            }
            // smg says nothing when it is ready: polling its readiness is the only signal.
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `#   smg: placed by tree_match 40, ...`: which branch of `cache_aware` placed each request.
    pub fn branches(&self) -> String {
        let agent = ureq::Agent::new_with_config(
            ureq::Agent::config_builder()
                .timeout_global(Some(Duration::from_secs(2)))
                .build(),
        );
        let text = agent
            .get(format!("http://{}/metrics", self.metrics))
            .call()
            .ok()
            .and_then(|r| r.into_body().read_to_string().ok())
            .unwrap_or_default();
        let counts: Vec<String> = text
            .lines()
            .filter_map(|l| l.strip_prefix("smg_cache_aware_policy_branch_total{branch=\""))
            .filter_map(|l| {
                let (branch, rest) = l.split_once("\"}")?;
                let n: f64 = rest.trim().parse().ok()?;
                Some(format!("{branch} {n:.0}"))
            })
            .collect();
        match counts.is_empty() {
            true => "#   smg: no cache_aware branch counts on its metrics port".to_string(),
            false => format!("#   smg: placed by {}", counts.join(", ")),
        }
    }
}

impl Drop for Smg {
    fn drop(&mut self) {
        // SIGTERM lets it drain and exit (5–7 s); std's `kill` is SIGKILL, the fallback.
        let termed = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        let deadline = Instant::now() + if termed { EXIT_WITHIN } else { Duration::ZERO };
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `$SMG`, else the venv scripts/bench-affinity.sh installs into.
fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("SMG") {
        return PathBuf::from(path);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".cache/smg-venv/bin/smg")
}

fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| e.to_string())
}

/// The log's last lines that say why, for an error message.
fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(3).collect();
    let lines: Vec<&str> = lines.into_iter().rev().collect();
    format!("log {}: {}", log.display(), lines.join(" | "))
}
