//! One pooled agent per host (issue 26). ureq purges an agent's pool on every connect and every
//! return, comparing pool keys over all its idle connections once per host among them; with one
//! agent for every host that was about 7 % of crossbar's CPU at 32 clients (docs/BENCHMARKS.md).
//! Per host, a pool holds only that host's connections, and a purge is one pass over them.

use parking_lot::RwLock;
use ureq::config::Config as AgentConfig;
use ureq::unversioned::transport::{Connector, TcpConnector};
use ureq::Agent;

use super::literal::Literal;
use super::settings;
use super::watch::Watch;
use crate::config::Config;
use crate::fasthash::HashMap;

/// The agents of forwarded requests, one per configured host: [`super::agent_config`]'s settings
/// plus a pool of at most one idle connection per worker, whose transports are watched for the
/// running [`super::Exchange`].
#[derive(Debug)]
pub struct Pools {
    settings: AgentConfig,
    agents: RwLock<HashMap<String, Agent>>,
}

impl Pools {
    pub fn new(config: &Config) -> Pools {
        let pools = Pools {
            settings: settings(config, config.workers.max(1)),
            agents: RwLock::default(),
        };
        pools.set_hosts(config.hosts.keys().map(String::as_str));
        pools
    }

    /// The agent for `host`. A host a reload removed while its request was on its way gets an
    /// agent of its own, without a pool to share.
    pub fn get(&self, host: &str) -> Agent {
        if let Some(agent) = self.agents.read().get(host) {
            return agent.clone();
        }
        self.agent()
    }

    /// At a reload: an agent for each new host; hosts kept keep theirs, with their idle
    /// connections; removed hosts' agents go with their last request.
    pub fn set_hosts<'h>(&self, hosts: impl Iterator<Item = &'h str>) {
        let mut agents = self.agents.write();
        let kept = hosts
            .map(|host| {
                let agent = agents.remove(host).unwrap_or_else(|| self.agent());
                (host.to_string(), agent)
            })
            .collect();
        *agents = kept;
    }

    fn agent(&self) -> Agent {
        Agent::with_parts(
            self.settings.clone(),
            TcpConnector::default().chain(Watch),
            Literal::default(),
        )
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::Pools;
    use crate::config::Config;

    /// A keep-alive HTTP server on loopback that answers `ok` to every request: its address and
    /// how many connections it accepted.
    fn server() -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                count.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(conn.try_clone().unwrap());
                    let mut out = conn;
                    loop {
                        let mut line = String::new();
                        // A head ends with an empty line; its requests carry no body.
                        loop {
                            line.clear();
                            match reader.read_line(&mut line) {
                                Ok(0) | Err(_) => return,
                                Ok(_) if line == "\r\n" => break,
                                Ok(_) => {}
                            }
                        }
                        let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                        if out.write_all(answer).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, accepted)
    }

    fn config(hosts: &[(&str, &str)]) -> Config {
        let mut text = String::new();
        for (name, addr) in hosts {
            text.push_str(&format!(
                "[hosts.{name}]\nurl = \"http://{addr}/\"\n[hosts.{name}.models.m]\nparallel = 2\n"
            ));
        }
        let names: Vec<_> = hosts.iter().map(|(n, _)| format!("\"{n}\"")).collect();
        text.push_str(&format!(
            "[routes.r]\nhosts = [{}]\nmodel = \"m\"\n",
            names.join(", ")
        ));
        Config::from_toml(&text).unwrap()
    }

    fn call(pools: &Pools, host: &str, addr: &str) {
        let _exchange = crate::upstream::Exchange::start(None);
        let response = pools
            .get(host)
            .get(format!("http://{addr}/"))
            .call()
            .unwrap();
        let mut body = String::new();
        response
            .into_body()
            .into_reader()
            .read_to_string(&mut body)
            .unwrap();
        assert_eq!(body, "ok");
    }

    #[test]
    fn issue26_a_reload_keeps_a_kept_hosts_idle_connections_and_a_removed_host_gets_its_own_agent()
    {
        let ((a, a_conns), (b, b_conns)) = (server(), server());
        let pools = Pools::new(&config(&[("a", &a), ("b", &b)]));
        call(&pools, "a", &a);
        call(&pools, "a", &a);
        call(&pools, "b", &b);
        assert_eq!(
            a_conns.load(Ordering::SeqCst),
            1,
            "a's second call reuses its connection"
        );
        assert_eq!(b_conns.load(Ordering::SeqCst), 1);
        // A reload that keeps a keeps its idle connection.
        pools.set_hosts(["a", "c"].into_iter());
        call(&pools, "a", &a);
        assert_eq!(a_conns.load(Ordering::SeqCst), 1);
        // b was removed: a request still on its way there gets an agent of its own.
        call(&pools, "b", &b);
        assert_eq!(b_conns.load(Ordering::SeqCst), 2);
    }
}
