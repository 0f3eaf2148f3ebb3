//! crossbar: a sticky, cache-aware gateway in front of llama.cpp `llama-server` hosts.
//!
//! See `docs/ARCHITECTURE.md` for the bird's-eye view and the codemap.

pub mod choose;
pub mod config;
pub mod fingerprint;
pub mod health;
pub mod lease;
pub mod limiter;
pub mod sim;
pub mod store;
pub mod tee;
