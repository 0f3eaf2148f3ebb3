//! The running gateway: listeners, the fixed worker pool, and the background threads.
//!
//! [`Server::start`] opens the store, binds both listeners and starts every thread; [`Server::stop`]
//! stops taking requests, lets in-flight ones finish within the grace period and joins everything.
//! Every thread here is owned and joinable. The listeners' accept threads and workers are `conn`'s
//! (a panic while serving one request becomes a 500 for that request; the worker lives on).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::{bounded, RecvTimeoutError, Sender};
use parking_lot::Mutex;

use crate::admin;
use crate::config::Config;
use crate::conn::{Pool, Request, Service};
use crate::health::Poller;
use crate::proxy;
use crate::state::Gateway;
use crate::store::{unix_ms, DbLock, LockError, Store, StoreError, Write};

/// Threads serving the admin listener: operators and scrapers, never many at once.
const ADMIN_WORKERS: usize = 2;
/// Longest a health poll may take, so one hung host is noticed quickly.
const POLL_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Debug)]
pub enum StartError {
    /// Another crossbar serves from the same database.
    Lock(LockError),
    Store(StoreError),
    Bind {
        what: &'static str,
        addr: SocketAddr,
        detail: String,
    },
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Store(err) => write!(f, "{err}"),
            StartError::Lock(err) => write!(f, "{err}"),
            StartError::Bind { what, addr, detail } => {
                write!(f, "cannot listen for {what} on {addr}: {detail}")
            }
        }
    }
}

impl std::error::Error for StartError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            // Display already says the wrapped error; its causes follow it.
            StartError::Store(err) => err.source(),
            StartError::Lock(err) => err.source(),
            StartError::Bind { .. } => None,
        }
    }
}

/// A started gateway. Dropping it without [`Server::stop`] leaves its threads running.
pub struct Server {
    gateway: Arc<Gateway>,
    client: Pool,
    admin: Pool,
    sweeper: Option<(Sender<()>, JoinHandle<()>)>,
    poller: Mutex<Option<Poller>>,
    /// Held for the server's life: one database, one gateway. Declared last, dropped last.
    _lock: DbLock,
}

impl Server {
    /// Opens the store, loads the leases, binds the listeners and starts all threads. A start that
    /// fails removes the db files it created (issue 27): a mistyped `listen` leaves no empty db
    /// and lock file behind.
    pub fn start(config: Config) -> Result<Server, StartError> {
        warn_about(&config);
        let fresh = Fresh::note(&config.db);
        let lock = DbLock::acquire(&config.db).map_err(StartError::Lock)?;
        let (gateway, client, admin) = match open(config) {
            Ok(parts) => parts,
            Err(err) => {
                // The store is closed by now; the lock is still held while its files go.
                fresh.remove();
                return Err(err);
            }
        };
        let sweeper = Some(start_sweeper(gateway.clone()));
        let poller = Mutex::new(Some(start_poller(&gateway)));
        log::info!(
            "crossbar listening clients={} admin={} version={} commit={}",
            client.addr(),
            admin.addr(),
            crate::version::VERSION,
            crate::version::commit_token()
        );
        Ok(Server {
            gateway,
            client,
            admin,
            sweeper,
            poller,
            _lock: lock,
        })
    }

    pub fn client_addr(&self) -> SocketAddr {
        self.client.addr()
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin.addr()
    }

    /// The client listener's open connections and what its poller holds.
    pub fn client_connections(&self) -> crate::conn::Counts {
        self.client.counts()
    }

    pub fn gateway(&self) -> &Arc<Gateway> {
        &self.gateway
    }

    /// Puts a new, already validated config in force. Listener addresses, the worker count and
    /// the connection layer's limits only change with a restart; everything else changes now,
    /// leases kept.
    pub fn reload(&self, config: Config) {
        warn_about(&config);
        let old = self.gateway.config();
        let mut warnings = config.warnings.clone();
        if config.listen != old.listen
            || config.admin_listen != old.admin_listen
            || config.workers != old.workers
            || config.front != old.front
        {
            log::warn!(
                "config reload needs a restart keys=listen,admin_listen,workers,client_limits"
            );
            warnings.push(
                "listen, admin_listen, workers and the client connection limits change only at \
                 a restart"
                    .to_string(),
            );
        }
        let now = unix_ms(SystemTime::now());
        self.gateway.apply_config(config, now);
        // Issue 48: the status, the page and `/metrics` say how the last reload went.
        self.gateway.metrics.observe_reload_applied(now, &warnings);
        let mut poller = self.poller.lock();
        if let Some(old) = poller.take() {
            old.stop();
        }
        *poller = Some(start_poller(&self.gateway));
        log::info!("config reloaded");
    }

    /// A reload was refused for `problems` (the config did not load): the old config serves on,
    /// and the status, the page and `/metrics` say so (issue 48).
    pub fn reload_refused(&self, problems: &[String]) {
        let now = unix_ms(SystemTime::now());
        self.gateway.metrics.observe_reload_refused(now, problems);
    }

    /// Stops taking requests, gives in-flight ones up to `grace` to finish, then joins every
    /// thread. Accounting rows are written by each request as it ends, so none is pending after.
    pub fn stop(mut self, grace: Duration) {
        log::info!("stopping grace_s={}", grace.as_secs());
        // Waiters for a slot will not get one now; they are answered 503.
        self.gateway.limiter.close();
        let deadline = Instant::now() + grace;
        let running = self.client.stop(deadline);
        if running > 0 {
            log::warn!("stopping grace over requests_left={running}");
        }
        self.admin
            .stop(deadline.max(Instant::now() + Duration::from_secs(1)));
        if let Some((stop, handle)) = self.sweeper.take() {
            drop(stop);
            let _ = handle.join();
        }
        if let Some(poller) = self.poller.lock().take() {
            poller.stop();
        }
        self.gateway.leases.flush_touches();
        // The store closes before the last line (its WAL is copied into the db, which can take
        // seconds), then the lock goes: `stopped` is the last thing the process does (issue 27).
        drop(self.gateway);
        drop(self._lock);
        log::info!("stopped");
    }
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("client_addr", &self.client.addr())
            .field("admin_addr", &self.admin.addr())
            .finish_non_exhaustive()
    }
}

/// Opens the store, binds both listeners and starts a pool on each. On an error everything it
/// opened is closed again.
fn open(config: Config) -> Result<(Arc<Gateway>, Pool, Pool), StartError> {
    let store = Store::open(&config.db).map_err(StartError::Store)?;
    let bind = |what, addr: SocketAddr| {
        listener(addr).map_err(|err| StartError::Bind {
            what,
            addr,
            detail: err.to_string(),
        })
    };
    let client_listener = bind("clients", config.listen)?;
    let admin_listener = bind("the admin API", config.admin_listen)?;
    let (workers, settings) = (config.workers, config.front);
    let gateway = Arc::new(Gateway::new(config, store).map_err(StartError::Store)?);
    let service = |name, handle: fn(&Gateway, &mut Request<'_>)| {
        let (gw, counted) = (gateway.clone(), gateway.clone());
        Service {
            name,
            handle: Box::new(move |request| handle(&gw, request)),
            refused: Box::new(move |why| counted.metrics.observe_refused(name, why.as_str())),
        }
    };
    let start = |listener, workers, service, addr| {
        Pool::start(listener, workers, settings, service).map_err(|err| StartError::Bind {
            what: "workers",
            addr,
            detail: err.to_string(),
        })
    };
    let listen = (gateway.config().listen, gateway.config().admin_listen);
    let client = start(
        client_listener,
        workers,
        service("clients", proxy::handle),
        listen.0,
    )?;
    let admin = match start(
        admin_listener,
        ADMIN_WORKERS,
        service("admin", admin::handle),
        listen.1,
    ) {
        Ok(admin) => admin,
        Err(err) => {
            // Its workers hold the gateway, and with it the store.
            client.stop(Instant::now());
            return Err(err);
        }
    };
    Ok((gateway, client, admin))
}

/// The db's files that did not exist before a start: the db, its WAL and shared memory, its lock.
#[derive(Debug)]
struct Fresh(Vec<PathBuf>);

impl Fresh {
    fn note(db: &Path) -> Fresh {
        let beside = |suffix: &str| {
            let mut name = db.as_os_str().to_os_string();
            name.push(suffix);
            PathBuf::from(name)
        };
        let files = ["", "-wal", "-shm", ".lock"].into_iter().map(beside);
        Fresh(files.filter(|path| !path.exists()).collect())
    }

    /// Removes those that exist now. Only while this process holds the lock: no other crossbar
    /// can have opened them.
    fn remove(self) {
        for path in self.0 {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => log::warn!(
                    "cannot remove what a failed start created file={} error={}",
                    crate::logfmt::val(&path.display().to_string()),
                    crate::logfmt::val(&err.to_string())
                ),
            }
        }
    }
}

/// A listening socket whose accepted connections have Nagle off (Linux copies TCP_NODELAY from
/// the listener to each accepted socket; `conn` sets it on each as well). Answers go out as small
/// flushed writes — a head, then each SSE event — and with Nagle on, a write behind an
/// unacknowledged one waits for the client's delayed ACK, up to 40 ms.
fn listener(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_tcp_nodelay(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

fn spawn(name: String, f: impl FnOnce() + Send + 'static) -> JoinHandle<()> {
    thread::Builder::new()
        .name(name)
        .spawn(f)
        .expect("the OS refused to start a thread")
}

/// Writes touched leases' `last_used` behind, expires idle leases often enough that none outlives
/// `lease_idle` by more than a second, and every [`PRUNE_EVERY`] deletes a small batch of
/// accounting rows and events older than `keep_requests` / `keep_events`.
fn start_sweeper(gateway: Arc<Gateway>) -> (Sender<()>, JoinHandle<()>) {
    let (stop, stopped) = bounded::<()>(0);
    let handle = spawn("lease-sweeper".to_string(), move || {
        let mut next_prune = Instant::now();
        loop {
            let idle = gateway.config().lease_idle;
            let every = (idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
            match stopped.recv_timeout(every) {
                Err(RecvTimeoutError::Timeout) => {}
                _ => return,
            }
            let now = unix_ms(SystemTime::now());
            gateway.leases.flush_touches();
            if gateway.leases.expire_idle(now) > 0 {
                gateway.prune_last_prompt();
            }
            if Instant::now() >= next_prune {
                next_prune = Instant::now() + PRUNE_EVERY;
                prune(&gateway, now);
            }
        }
    });
    (stop, handle)
}

/// Rows pruned per table per round: small, so a round is one short transaction.
const PRUNE_BATCH: usize = 500;
const PRUNE_EVERY: Duration = Duration::from_secs(10);

fn prune(gateway: &Gateway, now: i64) {
    let config = gateway.config();
    let before =
        |keep: Duration| now.saturating_sub(i64::try_from(keep.as_millis()).unwrap_or(i64::MAX));
    let writes = vec![
        Write::PruneRequests {
            before: before(config.keep_requests),
            limit: PRUNE_BATCH,
        },
        Write::PruneEvents {
            before: before(config.keep_events),
            limit: PRUNE_BATCH,
        },
    ];
    // Not waited for: the writer thread commits it. A failure is the store's to log (once per
    // burst); the next round tries again.
    drop(gateway.store.submit(writes));
}

fn start_poller(gateway: &Arc<Gateway>) -> Poller {
    let config = gateway.config();
    // In doubt since just before now: the poller's first `/slots`, about to start, clears it.
    let before = crate::slots::now_us() - 1;
    for host in config.hosts.values() {
        gateway.prepare_slots(host, before);
    }
    let timeout = POLL_TIMEOUT.min(config.health_interval.max(Duration::from_millis(200)));
    Poller::start(
        gateway.health.clone(),
        gateway.clone(),
        config.hosts.values().cloned().collect(),
        (config.health_interval, timeout),
    )
}

/// Logs what the config does that the operator probably did not mean (`Config::warnings`).
fn warn_about(config: &Config) {
    for warning in &config.warnings {
        log::warn!("config warning={}", crate::logfmt::val(warning));
    }
}
