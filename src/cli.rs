//! The command line: `crossbar serve|check|status|leases|pin|unpin|release|drain|report|backup`.
//!
//! This module parses arguments, sets up logging (once, here), and runs a verb. Operator verbs talk
//! to the admin API (`ops`) or read the database (`report`). Errors come back to `main` as one
//! [`CliError`] and are printed once, as one line (or one line per config problem). What a command
//! prints goes out through [`emit`]: a reader that left (`crossbar status | head -1`) ends the
//! command quietly, never in a panic.

mod help;
mod hosts;
mod ops;
mod pinned;

use std::ffi::OsString;
use std::io::{ErrorKind, Write};
use std::path::PathBuf;
use std::time::Duration;

use lexopt::prelude::*;

use crate::config::{self, Config, ConfigError};
use crate::report;
use crate::server::Server;
use crate::store::{self, DbLock};

/// Where a config is looked for when `-c` is not given, in order.
pub const DEFAULT_CONFIGS: &[&str] = &["crossbar.toml", "/etc/crossbar/crossbar.toml"];

/// Why a command failed.
#[derive(Debug)]
pub enum CliError {
    Usage(String),
    Config(ConfigError),
    Failed(String),
    /// Whoever read the output went away (a closed pipe): not a failure, [`run`] ends quietly.
    Closed,
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CliError::Usage(msg) => write!(f, "{msg} (see crossbar --help)"),
            CliError::Config(err) => write!(f, "{err}"),
            CliError::Failed(msg) => write!(f, "{msg}"),
            CliError::Closed => write!(f, "stdout closed"),
        }
    }
}

impl std::error::Error for CliError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CliError::Config(err) => Some(err),
            _ => None,
        }
    }
}

impl From<lexopt::Error> for CliError {
    fn from(err: lexopt::Error) -> CliError {
        CliError::Usage(err.to_string())
    }
}

/// Parsed command line.
#[derive(Debug, Default)]
pub struct Args {
    pub command: String,
    pub positional: Vec<String>,
    pub config: Option<PathBuf>,
    pub admin: Option<String>,
    pub token: Option<String>,
    pub json: bool,
    pub off: bool,
    pub since: Option<Duration>,
    pub route: Option<String>,
    /// `report --by key`: one line per client key.
    pub by: Option<String>,
    /// `check --hosts`: ask each host what it runs (issue 47).
    pub hosts: bool,
    pub help: bool,
    pub version: bool,
}

impl Args {
    /// `-c FILE`, else the first of [`DEFAULT_CONFIGS`] that exists; the error names every path
    /// tried.
    pub fn config_path(&self) -> Result<PathBuf, CliError> {
        if let Some(path) = &self.config {
            return Ok(path.clone());
        }
        DEFAULT_CONFIGS
            .iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
            .ok_or_else(|| {
                CliError::Failed(format!(
                    "no config file: tried ./{} and {}; pass -c FILE{}",
                    DEFAULT_CONFIGS[0],
                    DEFAULT_CONFIGS[1],
                    if matches!(self.command.as_str(), "serve" | "check" | "report") {
                        ""
                    } else {
                        " or --admin ADDR"
                    }
                ))
            })
    }

    fn load_config(&self) -> Result<Config, CliError> {
        Config::load(&self.config_path()?).map_err(CliError::Config)
    }
}

/// Parses the arguments after the program name.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Args, CliError> {
    let mut parser = lexopt::Parser::from_args(args);
    let mut out = Args::default();
    while let Some(arg) = parser.next()? {
        match arg {
            Short('h') | Long("help") => out.help = true,
            Short('V') | Long("version") => out.version = true,
            Short('c') | Long("config") => out.config = Some(parser.value()?.into()),
            Long("admin") => out.admin = Some(parser.value()?.string()?),
            Long("token") => out.token = Some(parser.value()?.string()?),
            Long("json") => out.json = true,
            Long("hosts") => out.hosts = true,
            Long("off") => out.off = true,
            Long("route") => out.route = Some(parser.value()?.string()?),
            Long("by") => out.by = Some(parser.value()?.string()?),
            Long("since") => {
                let text = parser.value()?.string()?;
                out.since = Some(
                    config::parse_duration(&text)
                        .map_err(|e| CliError::Usage(format!("--since: {e}")))?,
                );
            }
            Value(value) if out.command.is_empty() => out.command = value.string()?,
            Value(value) => out.positional.push(value.string()?),
            _ => return Err(arg.unexpected().into()),
        }
    }
    Ok(out)
}

/// Runs a command; returns what `main` should exit with. A reader of the output that went away
/// (`| head -1`) is success: the command ends quietly, as `cat` would (issue 27).
pub fn run(args: impl IntoIterator<Item = OsString>) -> Result<(), CliError> {
    match run_command(args) {
        Err(CliError::Closed) => Ok(()),
        done => done,
    }
}

/// Writes what a command prints to stdout, all of it, and flushes it. A closed pipe is
/// [`CliError::Closed`]; `println!` would panic there (exit 101, a panic message).
pub(crate) fn emit(text: &str) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == ErrorKind::BrokenPipe => Err(CliError::Closed),
        Err(err) => Err(CliError::Failed(format!("cannot write to stdout: {err}"))),
    }
}

fn run_command(args: impl IntoIterator<Item = OsString>) -> Result<(), CliError> {
    let args = parse(args)?;
    if args.version {
        return emit(&format!("crossbar {}\n", crate::version::describe()));
    }
    if args.help || args.command.is_empty() {
        match help::command(&args.command) {
            Some(text) if args.help => emit(&text)?,
            _ => emit(&help::global())?,
        }
        return if args.help {
            Ok(())
        } else {
            Err(CliError::Usage("no command given".into()))
        };
    }
    let expect = |n: usize, names: &str| {
        if args.positional.len() == n {
            Ok(())
        } else {
            Err(CliError::Usage(format!("{} takes {names}", args.command)))
        }
    };
    match args.command.as_str() {
        "serve" => expect(0, "no arguments").and_then(|_| serve(&args)),
        "check" => expect(0, "no arguments").and_then(|_| check(&args)),
        "status" => expect(0, "no arguments").and_then(|_| ops::status(&args)),
        "leases" => expect(0, "no arguments").and_then(|_| ops::leases(&args)),
        "pin" => expect(2, "ROUTE HOST").and_then(|_| ops::pin(&args)),
        "unpin" => expect(1, "ROUTE").and_then(|_| ops::unpin(&args)),
        "release" => expect(1, "ROUTE").and_then(|_| ops::release(&args)),
        "drain" => expect(1, "HOST").and_then(|_| ops::drain(&args)),
        "backup" => expect(1, "FILE").and_then(|_| backup(&args)),
        "report" => expect(0, "no arguments").and_then(|_| {
            let config = args.load_config()?;
            let since = args.since.unwrap_or(Duration::from_secs(24 * 3600));
            let by_key = match args.by.as_deref() {
                None => false,
                Some("key") => true,
                Some(other) => {
                    return Err(CliError::Usage(format!("--by {other}: only --by key")));
                }
            };
            let text = report::run(&config.db, since, args.route.as_deref(), args.json, by_key)
                .map_err(|e| CliError::Failed(crate::logfmt::chain(&e)))?;
            emit(&text)
        }),
        "key" => match args.positional.first().map(String::as_str) {
            Some("new") => expect(2, "new NAME").and_then(|_| new_key(&args.positional[1])),
            _ => Err(CliError::Usage("key takes new NAME".to_string())),
        },
        other => Err(CliError::Usage(format!("unknown command {other:?}"))),
    }
}

/// `crossbar key new NAME`: a fresh key, printed once, with the lines that put it in the config.
fn new_key(name: &str) -> Result<(), CliError> {
    if !config::valid_name(name) {
        return Err(CliError::Usage(format!(
            "key name {name:?}: use only letters, digits, '-' and '_'"
        )));
    }
    let (key, hash) = crate::keys::new_key()
        .map_err(|e| CliError::Failed(format!("no randomness from /dev/urandom: {e}")))?;
    emit(&format!(
        "key: {key}\n\nGive the key to its user; crossbar keeps only its hash. Add to crossbar.toml, \
         then reload (systemctl reload crossbar, or SIGHUP):\n\n[keys.{name}]\nhash = \"{hash}\"\n\
         # routes = [\"projA\"]        # default: every route\n\
         # max_in_flight = 4\n# tokens_per_day = 2000000\n"
    ))
}

/// `crossbar check`: prints `ok`, or every problem on its own line. A config that works but
/// leaves the admin API open beyond this machine gets a warning on stderr. A db whose directory
/// crossbar cannot write is a problem; a db a running crossbar holds is a note (checking before a
/// reload must keep working).
fn check(args: &Args) -> Result<(), CliError> {
    let config = args.load_config()?;
    let dir = match config.db.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if let Err(err) = writable(&dir) {
        return Err(CliError::Failed(format!(
            "db: directory {} is not writable ({err}); crossbar keeps its db, WAL and lock files there",
            dir.display()
        )));
    }
    let mut out = String::new();
    if let Some(pid) = DbLock::holder(&config.db) {
        let who = pid.map_or_else(String::new, |pid| format!(" (pid {pid})"));
        out.push_str(&format!(
            "note: database {} is in use by a running crossbar{who}; a reload (SIGHUP) keeps it\n",
            config.db.display()
        ));
    }
    out.push_str(&migration_note(&config.db)?);
    let mut warnings: String = (config.warnings.iter())
        .map(|w| format!("warning: {w}\n"))
        .collect();
    if !config.admin_listen.ip().is_loopback() && config.admin_token.is_none() {
        warnings.push_str(&format!(
            "warning: admin_listen {} is not loopback and no admin_token is set: anyone who can \
             reach it can pin, drain and read leases\n",
            config.admin_listen
        ));
    }
    if args.hosts {
        let asked = hosts::check(&config);
        let (warned, noted): (Vec<&str>, Vec<&str>) =
            asked.lines().partition(|l| l.starts_with("warning:"));
        warned
            .iter()
            .for_each(|w| warnings.push_str(&format!("{w}\n")));
        noted.iter().for_each(|n| out.push_str(&format!("{n}\n")));
    } else {
        out.push_str(
            "note: no host was asked (check --hosts reads each one's slots and probes its \
             similarity and RAM cache)\n",
        );
    }
    to_stderr(&warnings);
    out.push_str("ok\n");
    emit(&out)
}

/// What `serve` will do to the db's schema (issue 48: `check` said `ok` on a db it was about to
/// migrate): a note when it will migrate it, naming the way back; a db from a newer crossbar is a
/// problem, since `serve` refuses it. A missing db is created by `serve`; other errors are
/// `serve`'s to report.
fn migration_note(db: &std::path::Path) -> Result<String, CliError> {
    match store::Reader::open(db) {
        Err(store::StoreError::TooOld { found, known, .. }) => Ok(format!(
            "note: database {} has schema version {found}; `serve` will migrate it to version \
             {known} when it starts (migrations only add). An older crossbar cannot read it after \
             that: the way back is the backup taken before the upgrade (crossbar backup -c CONFIG \
             FILE; OPERATIONS.md, \"Upgrade, keeping the db\")\n",
            db.display()
        )),
        Err(err @ store::StoreError::TooNew { .. }) => Err(CliError::Failed(err.to_string())),
        _ => Ok(String::new()),
    }
}

/// Whether a file can be created in `dir` (the real test: permissions, read-only mounts, ACLs).
fn writable(dir: &std::path::Path) -> std::io::Result<()> {
    let probe = dir.join(format!(".crossbar-check-{}", std::process::id()));
    std::fs::File::create(&probe)?;
    std::fs::remove_file(&probe)
}

/// `crossbar backup FILE`: copies the db (while serve runs, too) and verifies the copy.
fn backup(args: &Args) -> Result<(), CliError> {
    let config = args.load_config()?;
    // Every db error names an absolute path (issue 27), the copy's too.
    let dest = PathBuf::from(&args.positional[0]);
    let dest = std::path::absolute(&dest).unwrap_or(dest);
    let report =
        store::backup(&config.db, &dest).map_err(|e| CliError::Failed(crate::logfmt::chain(&e)))?;
    emit(&format!(
        "backup ok: {} (schema {}, {} leases, {} requests, integrity_check {})\n",
        report.path.display(),
        report.schema,
        report.leases,
        report.requests,
        report.integrity
    ))
}

/// `crossbar serve`: runs until SIGTERM or SIGINT; SIGHUP re-reads the config. Every line logged
/// is on stderr before it returns, whichever way it ends.
fn serve(args: &Args) -> Result<(), CliError> {
    let served = serve_until_stopped(args);
    log::logger().flush();
    served
}

fn serve_until_stopped(args: &Args) -> Result<(), CliError> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

    let path = args.config_path()?;
    let config = Config::load(&path).map_err(CliError::Config)?;
    init_logging(config.log_level);
    log::info!(
        "config loaded path={}",
        crate::logfmt::val(&path.display().to_string())
    );
    // Register before starting so a signal during start-up is not lost.
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])
        .map_err(|e| CliError::Failed(format!("cannot handle signals: {e}")))?;
    let server = Server::start(config).map_err(|e| CliError::Failed(crate::logfmt::chain(&e)))?;
    for signal in signals.forever() {
        if signal != SIGHUP {
            log::info!(
                "signal received signal={}",
                if signal == SIGTERM { "TERM" } else { "INT" }
            );
            break;
        }
        match Config::load(&path) {
            Ok(new) => {
                log::set_max_level(new.log_level);
                server.reload(new);
            }
            Err(err) => {
                let problems = err.problems();
                for line in &problems {
                    log::error!(
                        "config reload refused kept=old problem={}",
                        crate::logfmt::val(line)
                    );
                }
                server.reload_refused(&problems);
            }
        }
    }
    let grace = server.gateway().config().shutdown_grace;
    server.stop(grace);
    Ok(())
}

/// Plain lines on stderr: time, level, message. Only crossbar's own messages. (Public so `make
/// bench` can measure with the logger `serve` runs: `BENCH_LOG=1`.)
pub fn init_logging(level: log::LevelFilter) {
    let config = simplelog::ConfigBuilder::new()
        .set_time_format_rfc3339()
        .set_target_level(log::LevelFilter::Off)
        .set_thread_level(log::LevelFilter::Off)
        .set_location_level(log::LevelFilter::Off)
        .add_filter_allow_str("crossbar")
        .build();
    // Lines leave through their own thread (`logsink`); should it not start, straight to stderr.
    let out: Box<dyn std::io::Write + Send> = match crate::logsink::LogSink::start(std::io::stderr())
    {
        Ok(sink) => Box::new(sink),
        Err(_) => Box::new(std::io::stderr()),
    };
    let logger = simplelog::WriteLogger::new(log::LevelFilter::Trace, config, out);
    if log::set_boxed_logger(logger).is_ok() {
        log::set_max_level(level);
    }
}

/// Prints an error the way every command does: one line per problem on stderr.
pub fn print_error(err: &CliError) {
    match err {
        CliError::Closed => {}
        CliError::Config(err) => to_stderr(
            &err.lines()
                .iter()
                .map(|l| format!("{l}\n"))
                .collect::<String>(),
        ),
        other => to_stderr(&format!("crossbar: {other}\n")),
    }
}

/// Writes `text` to stderr. A stderr nobody reads any more has no one to tell (`eprintln!` would
/// panic there).
fn to_stderr(text: &str) {
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}
