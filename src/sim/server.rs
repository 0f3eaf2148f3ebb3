//! The server side of the simulator: state shared between the `Sim` handle and its threads, the
//! accept loop and the per-connection loop, and the waits (slots, lock-step permits, simulated
//! work, `Hang`) that all end when the simulator stops.
//!
//! Must not: hold any lock while reading or writing a socket; nest locks.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use parking_lot::{Condvar, Mutex};

use super::{
    cache, http, respond, router, Fault, Received, SimConfig, SimEvent, SimStats, SEEN_KEPT,
};

/// State shared by the handle and the server threads. Locks are never nested.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) cfg: SimConfig,
    pub(super) addr: SocketAddr,
    pub(super) control: Mutex<Control>,
    /// Notified when the fault, lock-step permits or `stopping` change.
    pub(super) control_cv: Condvar,
    pub(super) pool: Mutex<PoolState>,
    /// Notified when a slot is freed or the pool closes.
    pub(super) pool_cv: Condvar,
    pub(super) record: Mutex<Record>,
    /// Router mode's models and what is loaded; `None` for a single-model server.
    pub(super) router: Option<Mutex<router::Router>>,
    pub(super) conns: Mutex<Conns>,
    pub(super) events_tx: Sender<SimEvent>,
    pub(super) events_rx: Receiver<SimEvent>,
    /// Events are only queued once someone asked for the receiver.
    pub(super) observed: AtomicBool,
    pub(super) stopping: AtomicBool,
    /// Slots prefilling now (`SimConfig::prefill_shared`).
    pub(super) prefilling: AtomicUsize,
}

/// Prompt tokens one decode takes at most: llama-server's default `--batch-size`.
const PREFILL_BATCH: u64 = 2048;

/// Invariant: `permits` only matters while `lockstep`; it is reset when lock-step is switched off.
#[derive(Debug)]
pub(super) struct Control {
    pub(super) fault: Fault,
    pub(super) lockstep: bool,
    pub(super) permits: usize,
    /// Token-count and tokenizer requests wait while this is set (`Sim::hold_counts`).
    pub(super) counts_held: bool,
    /// Requests naming their slot wait before taking it while this is set (`Sim::hold_pinned`).
    pub(super) pinned_held: bool,
}

/// Invariant: once `closed`, no slot is handed out (waiters give up). `models` holds a router's
/// per-model pools (each model is its own child process with its own slots and cache), only for
/// models the router lists; a single-model server uses `pool`.
#[derive(Debug)]
pub(super) struct PoolState {
    pub(super) pool: cache::Pool,
    pub(super) models: BTreeMap<String, cache::Pool>,
    pub(super) closed: bool,
    /// Tasks started since the process did, as llama-server numbers them from 0; and the last
    /// task each slot of `pool` ran (`/slots` `id_task`).
    pub(super) tasks: u64,
    pub(super) slot_tasks: Vec<Option<u64>>,
}

impl PoolState {
    /// The pool of `model` on a router (created with the server's slots on first use), else the
    /// server's own.
    fn of(&mut self, model: Option<&str>, cfg: &SimConfig) -> &mut cache::Pool {
        match model {
            Some(model) => self.models.entry(model.to_string()).or_insert_with(|| {
                cache::Pool::new(cfg.slots, cfg.ram_cache_tokens)
                    .with_similarity(cfg.slot_prompt_similarity)
            }),
            None => &mut self.pool,
        }
    }
}

/// Invariant: `seen` holds at most `SEEN_KEPT` entries.
#[derive(Debug, Default)]
pub(super) struct Record {
    pub(super) stats: SimStats,
    pub(super) seen: VecDeque<Received>,
}

/// Invariant: every connection thread is in `threads` until joined; `open` holds a handle to each
/// live socket so shutdown and `Refuse` can reset them.
#[derive(Debug, Default)]
pub(super) struct Conns {
    pub(super) next_id: u64,
    pub(super) open: HashMap<u64, TcpStream>,
    pub(super) threads: Vec<JoinHandle<()>>,
}

/// A slot held by one request; freed (holding `text`) on `finish` or drop, so a client hanging up
/// or an early return cannot leak it.
#[derive(Debug)]
pub(super) struct SlotLease<'a> {
    pub(super) shared: &'a Shared,
    /// The router model whose pool the slot is in; `None` on a single-model server.
    pub(super) model: Option<String>,
    pub(super) slot: usize,
    pub(super) cache_n: u64,
    /// Prompt plus generated text so far: what the slot's cache holds afterwards.
    pub(super) text: Vec<u8>,
    /// Its prompt's length in `text`.
    pub(super) prompt_len: usize,
    pub(super) done: bool,
}

impl SlotLease<'_> {
    /// A generated token's text, added to what the slot will hold: as the client gets it, or
    /// (`replies_kept` off) after a byte no rendered prompt has, so the next turn matches the
    /// slot up to its prompt only and prefills the reply again.
    pub(super) fn generated(&mut self, token: &str) {
        if !self.shared.cfg.replies_kept && self.text.len() == self.prompt_len {
            self.text.push(0);
        }
        self.text.extend_from_slice(token.as_bytes());
    }

    pub(super) fn finish(&mut self) {
        if !self.done {
            self.done = true;
            let text = std::mem::take(&mut self.text);
            let cfg = &self.shared.cfg;
            (self.shared.pool.lock())
                .of(self.model.as_deref(), cfg)
                .put_back(self.slot, text);
            self.shared.pool_cv.notify_all();
        }
    }
}

impl Drop for SlotLease<'_> {
    fn drop(&mut self) {
        self.finish();
    }
}

impl Shared {
    pub(super) fn per_slot_ctx(&self) -> u64 {
        if self.cfg.unified_kv {
            return self.cfg.n_ctx;
        }
        self.cfg.n_ctx / self.cfg.slots.max(1) as u64
    }

    /// Router mode: loads `model` if needed (an eviction empties the prompt cache); false when
    /// the router has no such model. Always true for a single-model server.
    pub(super) fn load_model(&self, model: &str) -> bool {
        let Some(router) = &self.router else {
            return true;
        };
        let load = router.lock().load(model);
        match load {
            router::Load::Unknown => false,
            router::Load::Ready => true,
            router::Load::Loaded { evicted } => {
                // An evicted model's process is gone, and its cache with it.
                let mut pools = self.pool.lock();
                for gone in &evicted {
                    if let Some(pool) = pools.models.get_mut(gone) {
                        pool.forget();
                    }
                }
                self.emit(SimEvent::Loaded {
                    model: model.to_string(),
                    evicted,
                });
                true
            }
        }
    }

    pub(super) fn fault(&self) -> Fault {
        self.control.lock().fault
    }

    pub(super) fn emit(&self, ev: SimEvent) {
        if self.observed.load(Ordering::SeqCst) {
            let _ = self.events_tx.send(ev);
        }
    }

    pub(super) fn record_request(&self, seen: Received) {
        let mut r = self.record.lock();
        r.stats.requests += 1;
        if r.seen.len() == SEEN_KEPT {
            r.seen.pop_front();
        }
        r.seen.push_back(seen);
    }

    pub(super) fn record_work(&self, prompt_n: u64, cache_n: u64, predicted_n: u64) {
        let mut r = self.record.lock();
        r.stats.completions += 1;
        r.stats.prompt_n += prompt_n;
        r.stats.cache_n += cache_n;
        r.stats.predicted_n += predicted_n;
    }

    pub(super) fn record_gone(&self, path: &str) {
        self.record.lock().stats.cancelled += 1;
        self.emit(SimEvent::ClientGone {
            path: path.to_string(),
        });
    }

    /// Waits for an idle slot (llama-server defers, it never answers "busy"); `None` on shutdown.
    /// On a router, `model` names the model (and its own slots).
    pub(super) fn take_slot(
        &self,
        prompt: &[u8],
        use_cache: bool,
        model: Option<&str>,
        pinned: Option<usize>,
    ) -> Option<SlotLease<'_>> {
        let model = model.filter(|_| self.router.is_some());
        let mut p = self.pool.lock();
        let mut waited = false;
        loop {
            if p.closed {
                return None;
            }
            if let Some(t) = p.of(model, &self.cfg).try_take(prompt, use_cache, pinned) {
                if model.is_none() {
                    let task = p.tasks;
                    p.tasks += 1;
                    if let Some(last) = p.slot_tasks.get_mut(t.slot) {
                        *last = Some(task);
                    }
                }
                return Some(SlotLease {
                    shared: self,
                    model: model.map(String::from),
                    slot: t.slot,
                    cache_n: t.cache_n,
                    text: prompt.to_vec(),
                    prompt_len: prompt.len(),
                    done: false,
                });
            }
            if pinned.is_some() && !waited {
                self.record.lock().stats.pinned_busy += 1;
            }
            waited = true;
            self.pool_cv.wait(&mut p);
        }
    }

    pub(super) fn slots_busy(&self) -> Vec<bool> {
        self.pool.lock().pool.busy()
    }

    /// The last task each slot ran (`id_task`), `None` for a slot that ran none since start. As
    /// llama-server's `/slots` is itself a task (a metrics one), asking takes a task id.
    pub(super) fn slot_tasks(&self) -> Vec<Option<u64>> {
        let mut p = self.pool.lock();
        p.tasks += 1;
        p.slot_tasks.clone()
    }

    /// Simulated work: waits `d`, cut short by shutdown. Returns false when stopping.
    pub(super) fn pause(&self, d: Duration) -> bool {
        let deadline = Instant::now() + d;
        let mut c = self.control.lock();
        while !self.stopping.load(Ordering::SeqCst) {
            if d.is_zero() || self.control_cv.wait_until(&mut c, deadline).timed_out() {
                return true;
            }
        }
        false
    }

    /// Simulated prefill of `tokens`, a batch at a time; with `prefill_shared` each batch costs
    /// as many times its tokens as slots prefill at that moment. Returns the time it took, or
    /// `None` when stopping.
    pub(super) fn prefill(&self, tokens: u64) -> Option<Duration> {
        let per = self.cfg.prefill_us_per_token;
        if !self.cfg.prefill_shared {
            let took = Duration::from_micros(per.saturating_mul(tokens));
            return self.pause(took).then_some(took);
        }
        self.prefilling.fetch_add(1, Ordering::SeqCst);
        let (mut left, mut took) = (tokens, Duration::ZERO);
        let stopped = loop {
            if left == 0 {
                break false;
            }
            let batch = left.min(PREFILL_BATCH);
            let sharing = self.prefilling.load(Ordering::SeqCst).max(1) as u64;
            let d = Duration::from_micros(per.saturating_mul(batch).saturating_mul(sharing));
            if !self.pause(d) {
                break true;
            }
            (left, took) = (left - batch, took + d);
        };
        self.prefilling.fetch_sub(1, Ordering::SeqCst);
        (!stopped).then_some(took)
    }

    /// Simulated decode of one token ([`Shared::decode_us`]). Returns false when stopping.
    pub(super) fn decode_token(&self) -> bool {
        self.pause(Duration::from_micros(self.decode_us()))
    }

    /// What decoding one token costs now, µs. With `prefill_shared`, while another slot
    /// prefills, the token waits for that slot's batch: llama-server puts every generating slot's
    /// next token and up to a batch of prompt tokens into one decode, so a slot answering beside a
    /// long prefill makes a token a batch (measured on b11434: a slot's 1-token prompt took
    /// 713 ms beside a neighbour's 14k-token prefill).
    pub(super) fn decode_us(&self) -> u64 {
        let alone = self.cfg.decode_us_per_token;
        if self.cfg.prefill_shared && self.prefilling.load(Ordering::SeqCst) > 0 {
            alone.max(self.cfg.prefill_us_per_token.saturating_mul(PREFILL_BATCH))
        } else {
            alone
        }
    }

    /// In lock-step mode, takes one permit (waiting for it). Returns false when stopping.
    pub(super) fn permit(&self) -> bool {
        let mut c = self.control.lock();
        while !self.stopping.load(Ordering::SeqCst) {
            if !c.lockstep {
                return true;
            }
            if c.permits > 0 {
                c.permits -= 1;
                return true;
            }
            self.control_cv.wait(&mut c);
        }
        false
    }

    /// Holds a count or tokenizer request unanswered while a test holds them.
    pub(super) fn count_gate(&self) {
        let mut c = self.control.lock();
        while c.counts_held && !self.stopping.load(Ordering::SeqCst) {
            self.control_cv.wait(&mut c);
        }
    }

    /// Holds a request that names its slot before it takes it, while a test holds them.
    pub(super) fn pinned_gate(&self) {
        let mut c = self.control.lock();
        while c.pinned_held && !self.stopping.load(Ordering::SeqCst) {
            self.control_cv.wait(&mut c);
        }
    }

    /// Holds a request unanswered while the fault is `Hang`.
    pub(super) fn hang(&self) {
        let mut c = self.control.lock();
        while c.fault == Fault::Hang && !self.stopping.load(Ordering::SeqCst) {
            self.control_cv.wait(&mut c);
        }
    }

    pub(super) fn close_connections(&self) {
        for sock in self.conns.lock().open.values() {
            let _ = sock.shutdown(Shutdown::Both);
        }
    }
}

pub(super) fn listen(shared: &Arc<Shared>, listener: TcpListener) -> std::io::Result<Listener> {
    let stop = Arc::new(AtomicBool::new(false));
    let (sh, st) = (Arc::clone(shared), Arc::clone(&stop));
    let thread = std::thread::Builder::new()
        .name("sim-accept".into())
        .spawn(move || accept_loop(&sh, &listener, &st))?;
    Ok(Listener { thread, stop })
}

fn accept_loop(shared: &Arc<Shared>, listener: &TcpListener, stop: &AtomicBool) {
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) || shared.stopping.load(Ordering::SeqCst) {
            break;
        }
        let Ok(sock) = conn else { continue };
        let Ok(handle) = sock.try_clone() else {
            continue;
        };
        let mut conns = shared.conns.lock();
        conns.threads.retain(|t| !t.is_finished());
        let id = conns.next_id;
        conns.next_id += 1;
        let sh = Arc::clone(shared);
        let spawned = std::thread::Builder::new()
            .name("sim-conn".into())
            .spawn(move || serve_connection(&sh, sock, id));
        match spawned {
            Ok(t) => {
                conns.open.insert(id, handle);
                conns.threads.push(t);
            }
            Err(e) => log::warn!("sim: cannot spawn connection thread err={e}"),
        }
    }
}

fn serve_connection(shared: &Shared, sock: TcpStream, id: u64) {
    if let Ok(read_half) = sock.try_clone() {
        let mut reader = crate::conn::Inbound::new(read_half);
        loop {
            match http::read_request(&mut reader, &sock, |m, p| respond::early(shared, m, p)) {
                Ok(req) => {
                    let keep = respond::handle(shared, &sock, &req);
                    if !(keep && req.keep_alive) {
                        break;
                    }
                }
                Err(http::ReadError::Bad(status, msg)) => {
                    respond::reply_error(&sock, status, &msg, false);
                    break;
                }
                Err(http::ReadError::Io(e)) => {
                    log::debug!("sim: connection read failed err={e}");
                    break;
                }
                Err(http::ReadError::Closed) => break,
            }
        }
    }
    let _ = sock.shutdown(Shutdown::Both);
    shared.conns.lock().open.remove(&id);
}

#[derive(Debug)]
pub(super) struct Listener {
    pub(super) thread: JoinHandle<()>,
    pub(super) stop: Arc<AtomicBool>,
}
