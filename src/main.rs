//! The `crossbar` binary: everything lives in the library; this prints the one error line.

fn main() {
    if let Err(err) = crossbar::cli::run(std::env::args_os().skip(1)) {
        crossbar::cli::print_error(&err);
        std::process::exit(1);
    }
}
