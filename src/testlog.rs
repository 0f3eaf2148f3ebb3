//! The unit tests' logger: every line at info and above, kept in memory with the name of the
//! thread that logged it, so a test can read the lines an operator would see. libtest runs each
//! test on a thread named after it, so a test reads only its own lines while others run beside it.

use std::sync::Once;

use parking_lot::Mutex;

static LINES: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());
static INSTALL: Once = Once::new();

struct Capture;

static CAPTURE: Capture = Capture;

impl log::Log for Capture {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::Level::Info
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            let thread = std::thread::current().name().unwrap_or("").to_string();
            let line = format!("{} {}", record.level(), record.args());
            LINES.lock().push((thread, line));
        }
    }

    fn flush(&self) {}
}

/// Starts keeping lines (once per test binary); call it before what is to be logged.
pub fn capture() {
    INSTALL.call_once(|| {
        if log::set_logger(&CAPTURE).is_ok() {
            log::set_max_level(log::LevelFilter::Info);
        }
    });
}

/// The lines logged so far on this thread, oldest first, as `LEVEL message`.
pub fn mine() -> Vec<String> {
    let me = std::thread::current().name().unwrap_or("").to_string();
    (LINES.lock().iter())
        .filter(|(thread, _)| *thread == me)
        .map(|(_, line)| line.clone())
        .collect()
}
