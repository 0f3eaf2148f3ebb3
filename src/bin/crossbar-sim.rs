//! `crossbar-sim`: runs one simulated llama-server (`crossbar::sim`) until the process is killed —
//! for `make demo`, `make soak` and by-hand experiments. Flags are parsed with lexopt; errors are one
//! line + exit 2. With `--faults-from-stdin` it reads fault commands (`fault hang`, `fault none`, ...)
//! one per line and answers each on stdout, so another process can inject the library's faults.
//!
//! Must not: do anything the library cannot do in-process (tests use the library directly).

use std::process::ExitCode;

use crossbar::sim::{Fault, Sim, SimConfig};

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
  --slot-prompt-similarity F
                           pick a slot by common prefix above this share, 0 = LRU only [default: 0.1]
  --api-key KEY            require this API key (Bearer or X-Api-Key)
  --max-tokens N           tokens generated when a request sets no limit [default: 8]
  --eos-after N            the model ends its answer (stop) after N tokens, whatever the request
                           allows, as a real model's end of text would [default: never]
  --router-models LIST     router mode: the models it knows, comma-separated, each NAME or
                           NAME=STATE (a llama-server state: loaded, unloaded, ...; default
                           unloaded); a request loads the model it names [default: off]
  --models-max N           router mode: models loaded at once, 0 = no limit [default: 0]
  --faults-from-stdin      read fault commands from stdin, one per line, each answered on stdout
                           with `fault set NAME` or `fault error: ...`; exit when stdin closes:
                             fault none | hang | refuse | loading | garbage
                             fault die-mid-stream N | cut-mid-chunk N | end-early N | cut-body N
                             fault status CODE
  -h, --help               print this help
";

fn main() -> ExitCode {
    match parse(std::env::args().skip(1)) {
        Ok(None) => {
            print!("{HELP}");
            ExitCode::SUCCESS
        }
        Ok(Some((listen, cfg, control))) => match Sim::start_on(&listen, cfg) {
            Ok(sim) => {
                println!("sim listening on {}", sim.url());
                if control {
                    // The controlling process holds stdin: when it closes (the controller ended,
                    // however it ended), nobody will stop this sim, so it stops itself.
                    obey_stdin(&sim);
                    return ExitCode::SUCCESS;
                }
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

/// Applies fault commands from stdin until it closes; each line gets one answer line on stdout.
/// Lines are bounded (a longer one is an error, not an allocation).
fn obey_stdin(sim: &Sim) {
    use std::io::{BufRead, Read, Write};
    let mut input = std::io::stdin().lock();
    let mut line = String::new();
    loop {
        line.clear();
        match (&mut input).take(256).read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let answer = match fault_command(line.trim()) {
            Ok(fault) => {
                sim.set_fault(fault);
                format!("fault set {}", line.trim().trim_start_matches("fault "))
            }
            Err(msg) => format!("fault error: {msg}"),
        };
        let mut out = std::io::stdout().lock();
        if writeln!(out, "{answer}")
            .and_then(|()| out.flush())
            .is_err()
        {
            return;
        }
    }
}

/// `fault NAME [N]` → the library's [`Fault`].
fn fault_command(line: &str) -> Result<Fault, String> {
    let mut words = line.split_whitespace();
    if words.next() != Some("fault") {
        return Err(format!("unknown command {line:?}"));
    }
    let name = words.next().unwrap_or("");
    let mut n = || -> Result<usize, String> {
        words
            .next()
            .and_then(|w| w.parse().ok())
            .ok_or(format!("fault {name} wants a whole number"))
    };
    Ok(match name {
        "none" => Fault::None,
        "hang" => Fault::Hang,
        "refuse" => Fault::Refuse,
        "loading" => Fault::Loading,
        "garbage" => Fault::Garbage,
        "die-mid-stream" => Fault::DieMidStream { after_events: n()? },
        "cut-mid-chunk" => Fault::CutMidChunk { after_events: n()? },
        "end-early" => Fault::EndEarly { after_events: n()? },
        "cut-body" => Fault::CutBody { after_bytes: n()? },
        "status" => {
            let code = n()?;
            let code = u16::try_from(code)
                .ok()
                .filter(|c| (100..600).contains(c))
                .ok_or("fault status wants an HTTP status code")?;
            Fault::Status(code)
        }
        _ => return Err(format!("unknown fault {name:?}")),
    })
}

/// What the flags ask for: the listen address, the simulated server, and `--faults-from-stdin`.
type Flags = (String, SimConfig, bool);

/// `Ok(None)` means `--help`.
fn parse(args: impl Iterator<Item = String>) -> Result<Option<Flags>, lexopt::Error> {
    use lexopt::prelude::*;
    let mut listen = "127.0.0.1:9001".to_string();
    let mut cfg = SimConfig::default();
    let mut control = false;
    let mut parser = lexopt::Parser::from_args(args);
    while let Some(arg) = parser.next()? {
        match arg {
            Short('h') | Long("help") => return Ok(None),
            Long("listen") => listen = parser.value()?.string()?,
            Long("alias") => cfg.alias = parser.value()?.string()?,
            Long("ctx") => cfg.n_ctx = number(&mut parser, "--ctx")?,
            Long("slots") => cfg.slots = number(&mut parser, "--slots")?,
            Long("prefill-us") => cfg.prefill_us_per_token = number(&mut parser, "--prefill-us")?,
            Long("decode-us") => cfg.decode_us_per_token = number(&mut parser, "--decode-us")?,
            Long("ram-cache-tokens") => {
                cfg.ram_cache_tokens = number(&mut parser, "--ram-cache-tokens")?
            }
            Long("slot-prompt-similarity") => {
                let text = parser.value()?.string()?;
                cfg.slot_prompt_similarity = text
                    .parse()
                    .ok()
                    .filter(|f: &f64| (0.0..=1.0).contains(f))
                    .ok_or(format!(
                        "--slot-prompt-similarity wants 0 to 1, got {text:?}"
                    ))?;
            }
            Long("api-key") => cfg.api_key = Some(parser.value()?.string()?),
            Long("max-tokens") => cfg.default_max_tokens = number(&mut parser, "--max-tokens")?,
            Long("eos-after") => cfg.eos_after = Some(number(&mut parser, "--eos-after")?),
            Long("router-models") => {
                cfg.router_models = Some(router_models(&parser.value()?.string()?)?);
            }
            Long("models-max") => cfg.models_max = number(&mut parser, "--models-max")?,
            Long("faults-from-stdin") => control = true,
            _ => return Err(arg.unexpected()),
        }
    }
    if cfg.slots == 0 {
        return Err("--slots must be at least 1".into());
    }
    if cfg.n_ctx < cfg.slots as u64 {
        return Err("--ctx must be at least --slots".into());
    }
    Ok(Some((listen, cfg, control)))
}

/// `a,b=loaded` as router models: `(id, state)`, unloaded unless a state is given.
fn router_models(list: &str) -> Result<Vec<(String, String)>, lexopt::Error> {
    list.split(',')
        .map(|item| {
            let (name, state) = item.split_once('=').unwrap_or((item, "unloaded"));
            let (name, state) = (name.trim(), state.trim());
            if name.is_empty() || state.is_empty() {
                return Err(format!(
                    "--router-models wants NAME or NAME=STATE items, got {item:?}"
                )
                .into());
            }
            Ok((name.to_string(), state.to_string()))
        })
        .collect()
}

/// The next value as a number; the error names the flag.
fn number<T: std::str::FromStr>(
    parser: &mut lexopt::Parser,
    flag: &str,
) -> Result<T, lexopt::Error> {
    use lexopt::ValueExt;
    let value = parser.value()?;
    let text = value.string()?;
    text.parse()
        .map_err(|_| format!("{flag} wants a whole number, got {text:?}").into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn router_models_are_names_with_an_optional_state() {
        let got = router_models("alpha, beta=loaded").unwrap();
        assert_eq!(
            got,
            [
                ("alpha".to_string(), "unloaded".to_string()),
                ("beta".to_string(), "loaded".to_string())
            ]
        );
        for bad in ["", "a,,b", "=loaded", "a="] {
            assert!(router_models(bad).is_err(), "{bad:?} was accepted");
        }
        let args = ["--router-models", "a,b", "--models-max", "1"].map(String::from);
        let (_, cfg, _) = parse(args.into_iter()).unwrap().unwrap();
        assert_eq!(cfg.router_models.map(|m| m.len()), Some(2));
        assert_eq!(cfg.models_max, 1);
    }

    #[test]
    fn fault_commands_name_the_librarys_faults_and_refuse_the_rest() {
        let ok = [
            ("fault none", Fault::None),
            ("fault hang", Fault::Hang),
            ("fault refuse", Fault::Refuse),
            ("fault loading", Fault::Loading),
            ("fault garbage", Fault::Garbage),
            (
                "fault die-mid-stream 2",
                Fault::DieMidStream { after_events: 2 },
            ),
            (
                "fault cut-mid-chunk 3",
                Fault::CutMidChunk { after_events: 3 },
            ),
            ("fault end-early 1", Fault::EndEarly { after_events: 1 }),
            ("fault cut-body 40", Fault::CutBody { after_bytes: 40 }),
            ("fault status 503", Fault::Status(503)),
        ];
        for (line, fault) in ok {
            assert_eq!(fault_command(line), Ok(fault), "{line}");
        }
        for bad in [
            "",
            "hang",
            "fault",
            "fault sleep",
            "fault die-mid-stream",
            "fault die-mid-stream -1",
            "fault status 99",
            "fault status 70000",
        ] {
            assert!(fault_command(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
