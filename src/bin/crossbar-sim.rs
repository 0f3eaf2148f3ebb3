//! `crossbar-sim`: runs one simulated llama-server (`crossbar::sim`) until the process is killed —
//! for `make demo` and by-hand experiments. Flags are parsed by hand; errors are one line + exit 2.
//!
//! Must not: do anything the library cannot do in-process (tests use the library directly).

use std::process::ExitCode;

use crossbar::sim::{Sim, SimConfig};

const HELP: &str = "\
crossbar-sim: a fake llama-server (simulated prompt cache and timings)

USAGE: crossbar-sim [OPTIONS]

OPTIONS:
  --listen ADDR            address to bind [default: 127.0.0.1:9001]
  --alias NAME             model alias reported by /props and /v1/models [default: sim-model]
  --ctx N                  total context; each slot gets N / slots [default: 8192]
  --slots N                parallel slots (-np) [default: 2]
  --prefill-us N           simulated microseconds per uncached prompt token [default: 0]
  --decode-us N            simulated microseconds per generated token [default: 0]
  --ram-cache-tokens N     RAM prompt cache size in tokens, 0 = none [default: 0]
  --api-key KEY            require this API key (Bearer or X-Api-Key)
  --max-tokens N           tokens generated when a request sets no limit [default: 8]
  -h, --help               print this help
";

fn main() -> ExitCode {
    match parse(std::env::args().skip(1)) {
        Ok(None) => {
            print!("{HELP}");
            ExitCode::SUCCESS
        }
        Ok(Some((listen, cfg))) => match Sim::start_on(&listen, cfg) {
            Ok(sim) => {
                println!("sim listening on {}", sim.url());
                // Serve until the process is killed (SIGTERM / Ctrl-C end it).
                loop {
                    std::thread::park();
                }
            }
            Err(e) => {
                eprintln!("crossbar-sim: cannot listen on {listen}: {e}");
                ExitCode::FAILURE
            }
        },
        Err(msg) => {
            eprintln!("crossbar-sim: {msg} (see --help)");
            ExitCode::from(2)
        }
    }
}

/// `Ok(None)` means `--help`.
fn parse(args: impl Iterator<Item = String>) -> Result<Option<(String, SimConfig)>, String> {
    let mut listen = "127.0.0.1:9001".to_string();
    let mut cfg = SimConfig::default();
    let mut args = args;
    while let Some(flag) = args.next() {
        if flag == "-h" || flag == "--help" {
            return Ok(None);
        }
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (flag.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        let number = |v: String| {
            v.parse::<u64>()
                .map_err(|_| format!("{name} wants a whole number, got {v:?}"))
        };
        match name.as_str() {
            "--listen" => listen = value()?,
            "--alias" => cfg.alias = value()?,
            "--ctx" => cfg.n_ctx = number(value()?)?,
            "--slots" => {
                cfg.slots = number(value()?)? as usize;
                if cfg.slots == 0 {
                    return Err("--slots must be at least 1".into());
                }
            }
            "--prefill-us" => cfg.prefill_us_per_token = number(value()?)?,
            "--decode-us" => cfg.decode_us_per_token = number(value()?)?,
            "--ram-cache-tokens" => cfg.ram_cache_tokens = number(value()?)?,
            "--api-key" => cfg.api_key = Some(value()?),
            "--max-tokens" => cfg.default_max_tokens = number(value()?)?,
            _ => return Err(format!("unknown flag {flag:?}")),
        }
    }
    if cfg.n_ctx < cfg.slots as u64 {
        return Err("--ctx must be at least --slots".into());
    }
    Ok(Some((listen, cfg)))
}
