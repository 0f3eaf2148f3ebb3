//! The hosts one run plays against: in-process simulated llama-servers (the default), or real
//! `llama-server` processes when `--llama-server BIN --model GGUF` are given (a checked reality run;
//! nothing of llama.cpp is part of this repository).
//!
//! A sim reports its own work (prefilled and cached tokens, completions, failed attempts included).
//! A real server is asked over its `/metrics` (`--metrics`) for `llamacpp:tokens_predicted_total`,
//! which with a fixed reply length counts its completions; its prefilled and cached tokens are then
//! the clients' sums of `timings` (successful turns only).

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crossbar::sim::{Fault, Sim, SimConfig};
use parking_lot::Mutex;

use crate::workload::MODEL;

/// Bytes a token of a slot state takes in llama-server's RAM prompt cache with the test model
/// (tiny-llama3: 2 layers, 2 KV heads of 16, f16, plus its cell metadata), measured on b11434:
/// a 3,502-token prompt saved as 0.895 MiB. `--cache-ram` is sized from it so a real server holds
/// as many tokens as a sim (an earlier guess of 512 bytes gave the real servers 1.9x the sims').
const STATE_BYTES_PER_TOKEN: u64 = 268;

/// Where real servers come from.
#[derive(Debug, Clone)]
pub struct Real {
    pub binary: PathBuf,
    pub model: PathBuf,
}

/// What every host of a run is started with.
#[derive(Debug, Clone, Copy)]
pub struct Setup {
    pub slots: usize,
    pub slot_ctx: u64,
    pub prefill_us: u64,
    pub decode_us: u64,
    /// Sims keep a reply in its slot for the next turn (`SimConfig::replies_kept`).
    pub replies_kept: bool,
    /// Sims' slots share one prefill budget (`SimConfig::prefill_shared`).
    pub prefill_shared: bool,
    pub ram_cache_tokens: u64,
    pub similarity: f64,
    /// Tokens every reply has (a real server's completions are counted by it).
    pub reply_tokens: u64,
}

pub enum Host {
    Sim(Sim),
    Real {
        child: Mutex<Child>,
        addr: SocketAddr,
        reply_tokens: u64,
        /// Completions counted when it was killed (its `/metrics` is gone after that).
        final_count: Mutex<Option<u64>>,
    },
}

/// A sim's own prompt totals.
#[derive(Debug, Clone, Copy, Default)]
pub struct Work {
    pub prompt_n: u64,
    pub cache_n: u64,
}

impl Host {
    pub fn start(setup: &Setup, real: Option<&Real>) -> Result<Host, String> {
        let Some(real) = real else {
            return Ok(Host::Sim(Sim::start(SimConfig {
                alias: MODEL.to_string(),
                n_ctx: setup.slot_ctx * setup.slots as u64,
                slots: setup.slots,
                prefill_us_per_token: setup.prefill_us,
                decode_us_per_token: setup.decode_us,
                replies_kept: setup.replies_kept,
                prefill_shared: setup.prefill_shared,
                ram_cache_tokens: setup.ram_cache_tokens,
                slot_prompt_similarity: setup.similarity,
                ..SimConfig::default()
            })));
        };
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        // The same tokens as a sim's RAM cache, at the test model's size of a slot state (see
        // `STATE_BYTES_PER_TOKEN`), rounded to llama-server's whole MiB.
        let ram_mib = ((setup.ram_cache_tokens * STATE_BYTES_PER_TOKEN + (1 << 19)) >> 20).max(1);
        let child = Command::new(&real.binary)
            .args([
                "-m",
                &real.model.display().to_string(),
                "--host",
                "127.0.0.1",
            ])
            .args(["--port", &port.to_string(), "-a", MODEL, "--metrics"])
            .args(["-c", &(setup.slot_ctx * setup.slots as u64).to_string()])
            .args([
                "-np",
                &setup.slots.to_string(),
                "--cache-ram",
                &ram_mib.to_string(),
            ])
            .args(["--slot-prompt-similarity", &setup.similarity.to_string()])
            .stdout(Stdio::null())
            .stderr(log_to(port))
            .spawn()
            .map_err(|e| format!("{}: {e}", real.binary.display()))?;
        let host = Host::Real {
            child: Mutex::new(child),
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            reply_tokens: setup.reply_tokens.max(1),
            final_count: Mutex::new(None),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while ureq::get(format!("{}/health", host.url())).call().is_err() {
            if Instant::now() > deadline {
                return Err("llama-server did not become healthy within 60 s".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(host)
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr())
    }

    pub fn addr(&self) -> SocketAddr {
        match self {
            Host::Sim(sim) => sim.addr(),
            Host::Real { addr, .. } => *addr,
        }
    }

    /// The host dies: connections refused from now on, open ones reset.
    pub fn kill(&self) {
        match self {
            Host::Sim(sim) => sim.set_fault(Fault::Refuse),
            Host::Real {
                child, final_count, ..
            } => {
                let count = self.completions();
                *final_count.lock() = Some(count);
                let mut child = child.lock();
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }

    /// Completions run so far.
    pub fn completions(&self) -> u64 {
        match self {
            Host::Sim(sim) => sim.stats().completions,
            Host::Real {
                final_count,
                reply_tokens,
                ..
            } => {
                if let Some(n) = *final_count.lock() {
                    return n;
                }
                let metrics = ureq::get(format!("{}/metrics", self.url()))
                    .call()
                    .ok()
                    .and_then(|r| r.into_body().read_to_string().ok())
                    .unwrap_or_default();
                let predicted = metrics
                    .lines()
                    .find_map(|l| l.strip_prefix("llamacpp:tokens_predicted_total "))
                    .and_then(|v| v.trim().parse::<f64>().ok())
                    .unwrap_or(0.0);
                predicted as u64 / reply_tokens
            }
        }
    }

    /// Pinned requests that found their slot at work (a sim counts them; on b11434 each one
    /// corrupts the answer running there); `None` for a real server, which cannot say.
    pub fn pinned_busy(&self) -> Option<u64> {
        match self {
            Host::Sim(sim) => Some(sim.stats().pinned_busy),
            Host::Real { .. } => None,
        }
    }

    /// The host's own totals; `None` for a real server (the clients' sums stand in).
    pub fn work(&self) -> Option<Work> {
        match self {
            Host::Sim(sim) => {
                let s = sim.stats();
                Some(Work {
                    prompt_n: s.prompt_n,
                    cache_n: s.cache_n,
                })
            }
            Host::Real { .. } => None,
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Host::Real { child, .. } = self {
            let mut child = child.lock();
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Where a real server's log goes: a file per port under `$AFFINITY_HOST_LOGS` when set (to read
/// its slot choices and prompt-cache loads after a run), else nowhere.
fn log_to(port: u16) -> Stdio {
    let Some(dir) = std::env::var_os("AFFINITY_HOST_LOGS") else {
        return Stdio::null();
    };
    let path = std::path::Path::new(&dir).join(format!("llama-{port}.log"));
    std::fs::File::create(path).map_or_else(|_| Stdio::null(), Stdio::from)
}
