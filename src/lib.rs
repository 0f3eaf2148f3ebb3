//! crossbar: a sticky, cache-aware gateway in front of llama.cpp `llama-server` hosts.
//!
//! See `docs/ARCHITECTURE.md` for the bird's-eye view and the codemap.

pub mod admin;
pub mod api;
pub mod choose;
pub mod cli;
pub mod clientid;
pub mod config;
pub mod conn;
pub mod envelope;
pub mod failures;
pub mod fasthash;
pub mod fingerprint;
pub mod health;
pub mod holdings;
pub mod keys;
pub mod learn;
pub mod lease;
pub mod limiter;
pub mod logfmt;
pub mod logsink;
pub(crate) mod members;
pub mod metrics;
pub mod nearest;
pub mod page;
pub mod proxy;
pub mod report;
pub mod server;
pub mod sessions;
pub mod sim;
pub mod slots;
pub mod state;
pub mod store;
pub mod table;
pub mod tee;
#[cfg(test)]
mod testlog;
#[cfg(test)]
mod testwait;
pub mod unrouted;
pub mod upstream;
pub mod version;
pub mod wire;
