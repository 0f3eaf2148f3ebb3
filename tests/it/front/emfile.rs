//! Issue 10: when file descriptors ran out, tiny_http's accept thread exited and the client port
//! stayed dead while the process lived. A real `crossbar serve` child with a low descriptor limit
//! is flooded with connections until accept fails, then the flood ends: the failure is logged
//! once, and the port serves again.

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

use crossbar::sim::{Sim, SimConfig};
use crossbeam_channel::Receiver;

use crate::support::{chat, free_port, request, stderr_lines, temp_dir, wait_line};

/// A `crossbar serve` child; killed on drop.
struct Serve {
    child: Child,
    log: Receiver<String>,
    seen: Vec<String>,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Serve {
    #[track_caller]
    fn wait_log(&mut self, needle: &str) {
        wait_line(&self.log, &mut self.seen, needle);
    }
}

#[test]
fn the_listener_survives_running_out_of_file_descriptors_issue_10() {
    let sim = Sim::start(SimConfig {
        slots: 1,
        ..SimConfig::default()
    });
    let dir = temp_dir();
    let addr = free_port();
    let config = format!(
        "listen = \"{addr}\"\nadmin_listen = \"{}\"\ndb = {:?}\nworkers = 2\nhealth_interval = \"60s\"\n\
         [hosts.titan]\nurl = \"{}\"\nslot_prompt_similarity = 0.1\nram_cache = false\n[hosts.titan.models.m]\nparallel = 1\n\
         [routes.projA]\nhosts = [\"titan\"]\nmodel = \"m\"\n",
        free_port(),
        dir.join("crossbar.db"),
        sim.url()
    );
    let path = dir.join("crossbar.toml");
    std::fs::write(&path, config).unwrap();
    let mut child = Command::new("sh")
        .args(["-c", "ulimit -n 64 && exec \"$0\" serve -c \"$1\""])
        .arg(env!("CARGO_BIN_EXE_crossbar"))
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot run the crossbar binary");
    let log = stderr_lines(&mut child);
    let mut crossbar = Serve {
        child,
        log,
        seen: Vec::new(),
    };
    crossbar.wait_log("crossbar listening");
    // The host is polled up before the flood, and not again during it: a poll that finds no
    // descriptor marks the host down (rightly), which is not what this test is about.
    crossbar.wait_log("host up host=titan");
    // Idle connections hold descriptors until crossbar has none left to accept with.
    let flood: Vec<TcpStream> = (0..80).map(|_| TcpStream::connect(addr).unwrap()).collect();
    crossbar.wait_log("accept failed listener=clients");
    drop(flood);
    crossbar.wait_log("accept works again listener=clients");
    let body = chat("after the flood", 0, false).to_string();
    let answer = request(
        addr,
        "POST",
        "/projA/v1/chat/completions",
        &[],
        body.as_bytes(),
    );
    assert_eq!(answer.status, 200, "{}", answer.text());
    let failures = crossbar
        .seen
        .iter()
        // The admin listener's accept may meet the same empty descriptor table (its own line).
        .filter(|l| l.contains("accept failed listener=clients"))
        .count();
    assert_eq!(
        failures,
        1,
        "one line per burst:\n{}",
        crossbar.seen.join("\n")
    );
    let _ = std::fs::remove_dir_all(&dir);
}
