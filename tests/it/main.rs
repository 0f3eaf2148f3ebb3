//! crossbar's integration tests: one binary, real HTTP on loopback, simulated llama-servers.

mod admin;
mod examples;
mod guard;
mod proxy;
mod signals;
mod support;
