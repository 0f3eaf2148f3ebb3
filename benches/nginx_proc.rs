//! One nginx child process for the benchmarks that measure against it (`make bench`,
//! `make bench-affinity`): a prefix directory holding its config, pid and temp paths, a free
//! loopback port, a wait until it listens, and a stop with `-s stop` so its workers go too (a
//! signal to the master alone can leave a worker holding the port). Each benchmark writes only its
//! own `upstream` and `server` blocks.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct Nginx {
    child: Child,
    prefix: PathBuf,
    pub addr: SocketAddr,
}

impl Nginx {
    /// Starts nginx in `prefix` with `worker_processes` and the `http` block's own lines from
    /// `blocks(port)`; an error says why (not installed, a bad config, never listened).
    pub fn start(
        prefix: PathBuf,
        worker_processes: &str,
        blocks: impl FnOnce(u16) -> String,
    ) -> Result<Nginx, String> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        std::fs::create_dir_all(&prefix).map_err(|e| format!("{}: {e}", prefix.display()))?;
        let conf = prefix.join("nginx.conf");
        let text = config(&prefix, worker_processes, &blocks(port));
        std::fs::write(&conf, text).map_err(|e| format!("{}: {e}", conf.display()))?;
        let child = Command::new(binary())
            .arg("-p")
            .arg(&prefix)
            .arg("-c")
            .arg(&conf)
            .arg("-e")
            .arg(prefix.join("error.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run nginx (the make target installs it): {e}"))?;
        let mut nginx = Nginx {
            child,
            prefix,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(nginx.addr).is_err() {
            if let Ok(Some(status)) = nginx.child.try_wait() {
                let log = std::fs::read_to_string(nginx.prefix.join("error.log"));
                return Err(format!(
                    "nginx exited ({status}):\n{}",
                    log.unwrap_or_default()
                ));
            }
            if Instant::now() > deadline {
                return Err("nginx did not listen within 10 s".into());
            }
            // nginx says nothing when it listens: polling its port is the only signal there is.
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(nginx)
    }
}

impl Nginx {
    /// The master's process id (its workers are its children).
    #[allow(dead_code)]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let stopped = Command::new(binary())
            .arg("-p")
            .arg(&self.prefix)
            .arg("-c")
            .arg(self.prefix.join("nginx.conf"))
            .arg("-s")
            .arg("stop")
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !stopped {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.prefix);
    }
}

fn binary() -> PathBuf {
    std::env::var_os("NGINX").map_or_else(|| "/usr/sbin/nginx".into(), PathBuf::from)
}

/// Foreground, no access log, every temp path inside `prefix` (nginx's defaults need root).
fn config(prefix: &Path, worker_processes: &str, blocks: &str) -> String {
    let tmp = |name: &str| prefix.join(name).display().to_string();
    format!(
        "daemon off;\nworker_processes {worker_processes};\npid {pid};\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n    access_log off;\n\
             client_body_temp_path {body};\n    proxy_temp_path {proxy};\n\
             fastcgi_temp_path {fcgi};\n    uwsgi_temp_path {uwsgi};\n    scgi_temp_path {scgi};\n\
         {blocks}}}\n",
        pid = tmp("nginx.pid"),
        body = tmp("body"),
        proxy = tmp("proxy"),
        fcgi = tmp("fastcgi"),
        uwsgi = tmp("uwsgi"),
        scgi = tmp("scgi"),
    )
}
