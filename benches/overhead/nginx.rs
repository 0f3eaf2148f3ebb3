//! nginx as the second front end of the overhead benchmark, configured the way people run it in
//! front of an HTTP upstream: `upstream` with `keepalive`, HTTP/1.1 to the upstream with the
//! `Connection` header cleared, `worker_processes auto` (Debian's default), no access log. A child process on a
//! loopback port, stopped on drop. `make bench` installs Debian's nginx when it is missing.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Nginx {
    child: Child,
    prefix: PathBuf,
    pub addr: SocketAddr,
}

impl Nginx {
    /// Starts nginx proxying every path to `upstream`; an error says why (not installed, ...).
    pub fn start(upstream: SocketAddr, dir: &Path) -> Result<Nginx, String> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let prefix = dir.join("nginx");
        std::fs::create_dir_all(&prefix).map_err(|e| e.to_string())?;
        let conf = prefix.join("nginx.conf");
        std::fs::write(&conf, config(upstream, port, &prefix)).map_err(|e| e.to_string())?;
        let binary =
            std::env::var_os("NGINX").map_or_else(|| "/usr/sbin/nginx".into(), PathBuf::from);
        let mut child = Command::new(binary)
            .arg("-p")
            .arg(&prefix)
            .arg("-c")
            .arg(&conf)
            .arg("-e")
            .arg(prefix.join("error.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run nginx (`make bench` installs it): {e}"))?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(addr).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                let log = std::fs::read_to_string(prefix.join("error.log")).unwrap_or_default();
                return Err(format!("nginx exited ({status}):\n{log}"));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return Err("nginx did not listen within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Nginx {
            child,
            prefix,
            addr,
        })
    }
}

impl Drop for Nginx {
    /// SIGTERM to the master: it stops its workers (a SIGKILL would orphan them).
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.prefix);
    }
}

fn config(upstream: SocketAddr, port: u16, prefix: &Path) -> String {
    let tmp = |name: &str| prefix.join(name).display().to_string();
    format!(
        "daemon off;\nworker_processes auto;\npid {pid};\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n    access_log off;\n\
             client_body_temp_path {body};\n    proxy_temp_path {proxy};\n\
             fastcgi_temp_path {fcgi};\n    uwsgi_temp_path {uwsgi};\n    scgi_temp_path {scgi};\n\
             upstream sim {{\n        server {upstream};\n        keepalive 64;\n    }}\n\
             server {{\n        listen 127.0.0.1:{port};\n        keepalive_requests 100000;\n\
                 location / {{\n            proxy_pass http://sim;\n\
                     proxy_http_version 1.1;\n            proxy_set_header Connection \"\";\n\
                     proxy_buffering off;\n            proxy_read_timeout 1h;\n        }}\n    }}\n}}\n",
        pid = tmp("nginx.pid"),
        body = tmp("body"),
        proxy = tmp("proxy"),
        fcgi = tmp("fastcgi"),
        uwsgi = tmp("uwsgi"),
        scgi = tmp("scgi"),
    )
}
