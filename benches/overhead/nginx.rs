//! nginx as the second front end of the overhead benchmark, configured the way people run it in
//! front of an HTTP upstream: `upstream` with `keepalive`, HTTP/1.1 to the upstream with the
//! `Connection` header cleared, `worker_processes auto` (Debian's default), no access log. A child
//! process on a loopback port (`nginx_proc`), stopped on drop. `make bench` installs Debian's nginx
//! when it is missing.

use std::net::SocketAddr;
use std::path::Path;

#[path = "../nginx_proc.rs"]
mod nginx_proc;

pub use nginx_proc::Nginx;

/// Starts nginx proxying every path to `upstream`.
pub fn start(upstream: SocketAddr, dir: &Path) -> Result<Nginx, String> {
    Nginx::start(dir.join("nginx"), "auto", |port| {
        format!(
            "    upstream sim {{\n        server {upstream};\n        keepalive 64;\n    }}\n\
             server {{\n        listen 127.0.0.1:{port};\n        keepalive_requests 100000;\n\
                 location / {{\n            proxy_pass http://sim;\n\
                     proxy_http_version 1.1;\n            proxy_set_header Connection \"\";\n\
                     proxy_buffering off;\n            proxy_read_timeout 1h;\n        }}\n    }}\n"
        )
    })
}
