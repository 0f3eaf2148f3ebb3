//! The `crossbar` binary: everything lives in the library; this prints the one error line.
//!
//! Its allocator is jemalloc (issue 26): glibc's malloc and free were a tenth of crossbar's
//! instructions per request, and musl's, in the static binary users run, is slower still under
//! many threads (ripgrep's musl builds use jemalloc for the same reason).

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    if let Err(err) = crossbar::cli::run(std::env::args_os().skip(1)) {
        crossbar::cli::print_error(&err);
        std::process::exit(1);
    }
}
