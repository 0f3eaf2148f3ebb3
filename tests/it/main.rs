//! crossbar's integration tests: one binary, real HTTP on loopback, simulated llama-servers.

mod examples;
mod proxy;
mod signals;
mod support;
