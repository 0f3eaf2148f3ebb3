//! An in-process fake llama-server for crossbar's integration tests, `make demo` and the
//! cache-affinity benchmark: faithful wire shapes (see the project's `shared/llama-server.md`), a simulated
//! per-slot prompt cache with a bounded RAM cache, simulated prefill/decode cost, injectable faults,
//! lock-step streaming and observable events so tests synchronise without sleeping.
//!
//! Owns: the listener and its threads (all joined on `stop`/`Drop`), the request record and stats.
//! Must not: pick ports other than the one it is given, panic on anything a client sends, or hold a
//! lock while writing to a socket (waits for slots, permits and faults use condvars).
//! Submodules: `http` (wire), `server` (shared state, threads), `cache` (slot choice, pure),
//! `respond` (routing, metadata endpoints, token counts), `generate` (completions and streams),
//! `answer` (shapes), `render` (the prompt text of each API's body), `oneshot` (the other APIs'
//! counts, embeddings, rerank).

mod answer;
mod cache;
mod generate;
mod http;
mod oneshot;
mod render;
mod respond;
mod router;
mod server;
#[cfg(test)]
mod tests;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Receiver;
use parking_lot::{Condvar, Mutex};

use server::{listen, Conns, Control, Listener, PoolState, Record, Shared};

/// What the simulated server looks like and costs.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Reported as `/props` `model_alias` and `/v1/models` `data[0].id`, and as every answer's `model`.
    pub alias: String,
    /// Total context; each slot gets `n_ctx / slots` (the per-slot context the server reports).
    pub n_ctx: u64,
    /// llama-server's automatic `-np` with `-c 0`: one KV cache of the model's training context
    /// (`n_ctx`, reported as `n_ctx_train`) that every slot may fill, so each reports all of it.
    pub unified_kv: bool,
    /// `total_slots` (llama-server `-np`).
    pub slots: usize,
    /// Simulated cost per prompt token that is not in the cache (0 = instant).
    pub prefill_us_per_token: u64,
    /// Simulated cost per generated token.
    pub decode_us_per_token: u64,
    /// Slots prefilling at once share one compute budget, as llama-server's do (each of `k`
    /// goes at 1/`k` of the speed, a batch of 2,048 tokens at a time); off, each prefills at
    /// full speed whatever the others do.
    pub prefill_shared: bool,
    /// The generated text stays in its slot as the client sends it back (true), or as tokens
    /// the prompt's tokenizer does not reproduce (false), so a conversation's next turn prefills
    /// its last reply again. A real model's replies mostly tokenize back the same; the tiny test
    /// model's did in 3 turns of 29, and its next turns prefilled 37 tokens beyond their new text
    /// on average, where these sims prefill 4–5 (docs/BENCHMARKS.md, "The sims' replies").
    pub replies_kept: bool,
    /// Bounded RAM prompt cache (`--cache-ram`) in tokens; 0 = none.
    pub ram_cache_tokens: u64,
    /// `--slot-prompt-similarity` (default 0.10); 0 = choose idle slots by LRU only.
    pub slot_prompt_similarity: f64,
    /// When set, everything but `/health`, `/models`, `/v1/models` needs this key.
    pub api_key: Option<String>,
    /// Router mode: `(model id, status.value)` listed at `GET /models` and `GET /v1/models`; a
    /// request names its model and loads it when it is not loaded (see `sim/router.rs`).
    pub router_models: Option<Vec<(String, String)>>,
    /// Router mode's `--models-max`: models loaded at once (0 = no limit).
    pub models_max: usize,
    /// Tokens generated when the request sets no `max_tokens`/`n_predict` (then it ends as "stop").
    pub default_max_tokens: u64,
    /// The simulated model's own end of answer: at most this many tokens, ending as "stop"
    /// (`end_turn`), however many the request allows. A client that treats "length" as an error
    /// (Claude Code) needs one (issue 48's client test); `None`: never.
    pub eos_after: Option<u64>,
    /// Which token-count endpoints the server has (older builds lack some).
    pub counts: Counts,
}

/// The token-count endpoints a simulated server answers, by the build it plays. All of them count
/// the way the server counts prompt tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counts {
    /// b11434: `/v1/chat/completions/input_tokens`, `/apply-template` and `/tokenize`.
    Exact,
    /// A build before the count endpoints: `/apply-template` and `/tokenize` only.
    Template,
    /// None of them (404): a host that cannot count.
    None,
    /// All of them, answering 500: a build whose counting is broken.
    Failing,
}

impl Default for SimConfig {
    fn default() -> SimConfig {
        SimConfig {
            alias: "sim-model".to_string(),
            n_ctx: 8192,
            unified_kv: false,
            slots: 2,
            prefill_us_per_token: 0,
            prefill_shared: false,
            decode_us_per_token: 0,
            replies_kept: true,
            ram_cache_tokens: 0,
            slot_prompt_similarity: cache::SIMILARITY,
            api_key: None,
            router_models: None,
            default_max_tokens: 8,
            eos_after: None,
            counts: Counts::Exact,
            models_max: 0,
        }
    }
}

/// A misbehaviour to inject; `Fault::None` restores normal service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    None,
    /// 503 `Loading model` on every path, `/health` included.
    Loading,
    /// Requests are read but never answered (until the fault changes, then the connection closes).
    Hang,
    /// 200 with a body that is not JSON on `/props` and `/v1/models`.
    Garbage,
    /// The process is "dead": listener closed (connections refused) and open connections reset.
    /// The next other fault re-binds the same port.
    Refuse,
    /// Streams are cut (connection closed) after this many events; non-streamed inference is
    /// closed without an answer.
    DieMidStream {
        after_events: usize,
    },
    /// Inference paths answer this status with llama-server's error envelope.
    Status(u16),
    /// Non-streamed answers send their head (with the full `Content-Length`) and only this many
    /// bytes of the body, then close. Streams are not affected.
    CutBody {
        after_bytes: usize,
    },
    /// Streams send this many events, then the size line and half of the next event's chunk, then
    /// close: the chunked body breaks off inside a chunk. Non-streamed answers are not affected.
    CutMidChunk {
        after_events: usize,
    },
    /// Inference POSTs are answered this status on their head alone, and the connection closed
    /// with the body unread (llama-server answers a model still loading, a wrong key or a head it
    /// cannot read so): a large body's write then fails after the answer is there to read.
    Early {
        status: u16,
    },
    /// Streams send this many events, then end the chunked body cleanly (`0\r\n\r\n`) without the
    /// rest: well framed, but no `[DONE]` or native `stop`. Non-streamed answers are not affected.
    EndEarly {
        after_events: usize,
    },
}

/// Something observable happened; receive with [`Sim::events`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SimEvent {
    /// A request was read (before faults apply).
    Request { path: String },
    /// The `index`-th (0-based) SSE event of a stream was written.
    EventSent { index: usize },
    /// The client went away mid-answer; generation stopped and the slot was freed.
    ClientGone { path: String },
    /// Router mode: a model was loaded (on a request for it, or `/props?model=`), evicting others.
    Loaded { model: String, evicted: Vec<String> },
    /// An inference answer was completely written.
    Finished {
        path: String,
        prompt_n: u64,
        cache_n: u64,
    },
}

/// A request as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    pub method: String,
    /// Path and query.
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Received {
    /// First header with this name (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        crate::wire::header(&self.headers, name)
    }
}

/// Running totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Every request read, health and metadata polls included.
    pub requests: u64,
    /// Completions that got a slot and ran (to the end or until the client left).
    pub completions: u64,
    /// Prompt tokens evaluated (not from cache).
    pub prompt_n: u64,
    /// Prompt tokens reused from the cache.
    pub cache_n: u64,
    pub predicted_n: u64,
    /// Answers abandoned because the client went away.
    pub cancelled: u64,
    /// Requests whose `id_slot` named a busy slot. They wait here; on b11434 the slot's state is
    /// reloaded under the running generation first, corrupting that answer: a gateway that pins
    /// must keep this at 0.
    pub pinned_busy: u64,
}

/// Requests kept for [`Sim::requests`]; older ones are dropped (long benchmark runs).
const SEEN_KEPT: usize = 4096;

/// A running fake llama-server. Stops (joining every thread) on [`Sim::stop`] or drop.
#[derive(Debug)]
pub struct Sim {
    shared: Arc<Shared>,
    listener: Mutex<Option<Listener>>,
}

impl Sim {
    /// Starts on `127.0.0.1:0`. Panics only if the loopback interface cannot be bound.
    pub fn start(cfg: SimConfig) -> Sim {
        Sim::start_on("127.0.0.1:0", cfg).expect("sim: cannot bind 127.0.0.1:0")
    }

    pub fn start_on(addr: &str, cfg: SimConfig) -> std::io::Result<Sim> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let (events_tx, events_rx) = crossbeam_channel::unbounded();
        let router = (cfg.router_models.as_ref())
            .map(|models| Mutex::new(router::Router::new(models, cfg.models_max)));
        let shared = Arc::new(Shared {
            pool: Mutex::new(PoolState {
                pool: cache::Pool::new(cfg.slots, cfg.ram_cache_tokens)
                    .with_similarity(cfg.slot_prompt_similarity),
                models: std::collections::BTreeMap::new(),
                closed: false,
                tasks: 0,
                slot_tasks: vec![None; cfg.slots.max(1)],
            }),
            cfg,
            addr,
            control: Mutex::new(Control {
                fault: Fault::None,
                lockstep: false,
                permits: 0,
                counts_held: false,
                pinned_held: false,
            }),
            control_cv: Condvar::new(),
            pool_cv: Condvar::new(),
            router,
            record: Mutex::new(Record::default()),
            conns: Mutex::new(Conns::default()),
            events_tx,
            events_rx,
            observed: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            prefilling: AtomicUsize::new(0),
        });
        let sim = Sim {
            listener: Mutex::new(Some(listen(&shared, listener)?)),
            shared,
        };
        Ok(sim)
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.shared.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// As if the process had restarted between two polls (issue 47): its slots and RAM cache are
    /// empty and its task ids start from 0 again. Requests in flight keep their slots.
    pub fn restart(&self) {
        let mut p = self.shared.pool.lock();
        let cfg = &self.shared.cfg;
        p.pool = cache::Pool::new(cfg.slots, cfg.ram_cache_tokens)
            .with_similarity(cfg.slot_prompt_similarity);
        p.models.clear();
        p.tasks = 0;
        p.slot_tasks = vec![None; cfg.slots.max(1)];
    }

    /// Switches the fault. `Refuse` returns once the port is closed; leaving it re-binds the port.
    pub fn set_fault(&self, f: Fault) {
        let was = std::mem::replace(&mut self.shared.control.lock().fault, f);
        self.shared.control_cv.notify_all();
        if f == Fault::Refuse && was != Fault::Refuse {
            self.stop_listening();
            self.shared.close_connections();
        } else if f != Fault::Refuse && self.listener.lock().is_none() {
            match TcpListener::bind(self.shared.addr).and_then(|l| listen(&self.shared, l)) {
                Ok(l) => *self.listener.lock() = Some(l),
                Err(e) => log::warn!("sim: cannot re-bind addr={} err={e}", self.shared.addr),
            }
        }
    }

    /// In lock-step mode every SSE event waits for a permit from [`Sim::release`].
    pub fn set_lockstep(&self, on: bool) {
        let mut c = self.shared.control.lock();
        c.lockstep = on;
        if !on {
            c.permits = 0;
        }
        self.shared.control_cv.notify_all();
    }

    /// Allows `n` more SSE events (lock-step mode).
    pub fn release(&self, n: usize) {
        self.shared.control.lock().permits += n;
        self.shared.control_cv.notify_all();
    }

    /// While on, token-count and tokenizer requests (`/tokenize`, `/apply-template`, `…/input_tokens`,
    /// `…/count_tokens`) are read (and reported as [`SimEvent::Request`]) but not answered; off lets
    /// them all go on.
    pub fn hold_counts(&self, on: bool) {
        self.shared.control.lock().counts_held = on;
        self.shared.control_cv.notify_all();
    }

    /// While on, a completion request that names its slot (`id_slot`) is read (and reported) but
    /// waits before taking a slot: llama-server tokenizing a large prompt before its task is
    /// launched, the window in which a request sent after it can be launched first.
    pub fn hold_pinned(&self, on: bool) {
        self.shared.control.lock().pinned_held = on;
        self.shared.control_cv.notify_all();
    }

    /// Events from now on (events are only recorded once this has been called).
    pub fn events(&self) -> Receiver<SimEvent> {
        self.shared.observed.store(true, Ordering::SeqCst);
        self.shared.events_rx.clone()
    }

    /// The most recent requests received (up to 4096), oldest first.
    pub fn requests(&self) -> Vec<Received> {
        self.shared.record.lock().seen.iter().cloned().collect()
    }

    /// Router mode: sets a model's status as a test wants it (`loading`, `unloaded`...).
    pub fn set_model_status(&self, model: &str, status: &str) {
        if let Some(router) = &self.shared.router {
            router.lock().set(model, status);
        }
    }

    pub fn stats(&self) -> SimStats {
        self.shared.record.lock().stats
    }

    /// Connections accepted so far (a client that reuses its connections makes few).
    pub fn connections(&self) -> u64 {
        self.shared.conns.lock().next_id
    }

    /// Stops serving and joins every thread.
    pub fn stop(self) {}

    fn stop_listening(&self) {
        let Some(l) = self.listener.lock().take() else {
            return;
        };
        l.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept; it sees the flag and drops the listener.
        let mut wake = self.shared.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(2));
        if l.thread.join().is_err() {
            log::error!("sim: accept thread panicked");
        }
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        {
            let _c = self.shared.control.lock();
            self.shared.control_cv.notify_all();
        }
        self.shared.pool.lock().closed = true;
        self.shared.pool_cv.notify_all();
        self.stop_listening();
        self.shared.close_connections();
        loop {
            let threads = std::mem::take(&mut self.shared.conns.lock().threads);
            if threads.is_empty() {
                break;
            }
            for t in threads {
                if t.join().is_err() {
                    log::error!("sim: connection thread panicked");
                }
            }
        }
    }
}
