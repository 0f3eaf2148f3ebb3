//! The front ends under comparison, each started in front of the same simulated hosts:
//! crossbar (in-process, as `crossbar serve` runs it), nginx round-robin and nginx `least_conn`
//! (Debian's nginx as a child process, configured the way people proxy llama-server: HTTP/1.1,
//! buffering off, default passive health checks and retries), and the oracle, which sends each
//! conversation straight to a fixed host and, when that host fails, moves it once to the next.

use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crossbar::config::Config;
use crossbar::server::Server;
use parking_lot::Mutex;

use crate::hosts::Host;
use crate::workload::{Target, MODEL};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Crossbar,
    RoundRobin,
    LeastConn,
    Oracle,
}

impl Kind {
    /// In run order: the oracle first, so every later row can show its ratio to it.
    pub const ALL: [Kind; 4] = [
        Kind::Oracle,
        Kind::Crossbar,
        Kind::RoundRobin,
        Kind::LeastConn,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Crossbar => "crossbar",
            Kind::RoundRobin => "nginx-rr",
            Kind::LeastConn => "nginx-lc",
            Kind::Oracle => "oracle",
        }
    }
}

/// A started front end; stops on drop.
pub enum Running {
    Crossbar(Option<Box<Server>>, String),
    /// nginx's master process, its prefix directory (config, pid file, logs) and the base URL.
    Nginx(Child, PathBuf, String),
    Oracle(Mutex<Vec<usize>>, Vec<String>),
}

impl Running {
    pub fn start(kind: Kind, hosts: &[Host], slots: usize, dir: &Path) -> Result<Running, String> {
        match kind {
            Kind::Crossbar => {
                let text = crossbar_config(hosts, slots, dir);
                let config = Config::from_toml(&text).map_err(|e| format!("{e}\n{text}"))?;
                let server = Server::start(config).map_err(|e| e.to_string())?;
                let base = format!("http://{}/bench", server.client_addr());
                Ok(Running::Crossbar(Some(Box::new(server)), base))
            }
            Kind::RoundRobin | Kind::LeastConn => start_nginx(kind, hosts, dir),
            Kind::Oracle => {
                let urls: Vec<String> = hosts.iter().map(Host::url).collect();
                Ok(Running::Oracle(Mutex::new(Vec::new()), urls))
            }
        }
    }
}

impl Target for Running {
    fn base(&self, conv: usize) -> String {
        match self {
            Running::Crossbar(_, base) | Running::Nginx(_, _, base) => base.clone(),
            Running::Oracle(moved, urls) => {
                let shift = moved.lock().iter().filter(|&&c| c == conv).count();
                urls[(conv + shift) % urls.len()].clone()
            }
        }
    }

    fn failed(&self, conv: usize) {
        if let Running::Oracle(moved, _) = self {
            moved.lock().push(conv);
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        match self {
            Running::Crossbar(server, _) => {
                if let Some(s) = server.take() {
                    s.stop(Duration::from_secs(5));
                }
            }
            Running::Nginx(child, prefix, _) => {
                // `-s stop` makes the master stop its worker too; killing the master alone would
                // leave the worker running, still holding the port.
                let stopped = Command::new(nginx_binary())
                    .arg("-p")
                    .arg(&*prefix)
                    .arg("-c")
                    .arg(prefix.join("nginx.conf"))
                    .arg("-s")
                    .arg("stop")
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
                if !stopped {
                    let _ = child.kill();
                }
                let _ = child.wait();
            }
            Running::Oracle(..) => {}
        }
    }
}

/// crossbar as an operator would set it up for these hosts: one route over all of them, the
/// hosts' real slot counts, a health poll every second.
pub fn crossbar_config(hosts: &[Host], slots: usize, dir: &Path) -> String {
    let db = dir.join("crossbar.db");
    let _ = std::fs::remove_file(&db);
    let mut t = format!(
        "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ndb = {db:?}\nworkers = 32\n\
         queue_max = 64\nhealth_interval = \"1s\"\n"
    );
    let names: Vec<String> = (0..hosts.len()).map(|i| format!("\"h{i}\"")).collect();
    for (i, h) in hosts.iter().enumerate() {
        let _ = write!(
            t,
            "[hosts.h{i}]\nurl = \"{}\"\n[hosts.h{i}.models.{MODEL}]\nparallel = {slots}\n",
            h.url()
        );
    }
    let _ = write!(
        t,
        "[routes.bench]\nhosts = [{}]\nmodel = \"{MODEL}\"\n",
        names.join(", ")
    );
    t
}

fn start_nginx(kind: Kind, hosts: &[Host], dir: &Path) -> Result<Running, String> {
    let port = free_port()?;
    let prefix = dir.join(kind.name());
    std::fs::create_dir_all(&prefix).map_err(|e| format!("{}: {e}", prefix.display()))?;
    let conf = prefix.join("nginx.conf");
    std::fs::write(&conf, nginx_config(kind, hosts, port, &prefix))
        .map_err(|e| format!("{}: {e}", conf.display()))?;
    let mut child = Command::new(nginx_binary())
        .arg("-p")
        .arg(&prefix)
        .arg("-c")
        .arg(&conf)
        .arg("-e")
        .arg(prefix.join("error.log"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run nginx (make bench-affinity installs it): {e}"))?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(addr).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(prefix.join("error.log")).unwrap_or_default();
            return Err(format!("nginx exited ({status}):\n{log}"));
        }
        if Instant::now() > deadline {
            drop(Running::Nginx(child, prefix, String::new()));
            return Err("nginx did not start listening within 10 s".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(Running::Nginx(child, prefix, format!("http://{addr}")))
}

/// What a homelab puts in front of llama-server: streaming-safe proxying, long reads, and nginx's
/// defaults for failures (`max_fails=1 fail_timeout=10s`, retry the next server on errors).
fn nginx_config(kind: Kind, hosts: &[Host], port: u16, prefix: &Path) -> String {
    let balance = if kind == Kind::LeastConn {
        "least_conn;"
    } else {
        ""
    };
    let servers: String = hosts
        .iter()
        .map(|h| format!("        server {};\n", h.addr()))
        .collect();
    let tmp = |name: &str| prefix.join(name).display().to_string();
    format!(
        "daemon off;\nworker_processes 1;\npid {pid};\n\
         events {{ worker_connections 1024; }}\n\
         http {{\n    access_log off;\n\
             client_body_temp_path {body};\n    proxy_temp_path {proxy};\n\
             fastcgi_temp_path {fcgi};\n    uwsgi_temp_path {uwsgi};\n    scgi_temp_path {scgi};\n\
             upstream llama {{\n        {balance}\n{servers}    }}\n\
             server {{\n        listen 127.0.0.1:{port};\n\
                 location / {{\n            proxy_pass http://llama;\n\
                     proxy_http_version 1.1;\n            proxy_set_header Connection \"\";\n\
                     proxy_buffering off;\n            proxy_read_timeout 1h;\n\
                     add_header X-Upstream $upstream_addr;\n        }}\n    }}\n}}\n",
        pid = tmp("nginx.pid"),
        body = tmp("body"),
        proxy = tmp("proxy"),
        fcgi = tmp("fastcgi"),
        uwsgi = tmp("uwsgi"),
        scgi = tmp("scgi"),
    )
}

fn nginx_binary() -> PathBuf {
    std::env::var_os("NGINX")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/sbin/nginx"))
}

/// A port the kernel just handed out; nginx cannot report the one it picked for `:0`.
fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    l.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}
