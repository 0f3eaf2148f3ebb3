//! crossbar's integration tests: one binary, real HTTP on loopback, simulated llama-servers.

mod admin;
mod guard;
mod proxy;
mod support;
