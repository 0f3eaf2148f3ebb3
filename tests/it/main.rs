//! crossbar's integration tests: one binary, real HTTP on loopback, simulated llama-servers.

mod proxy;
mod signals;
mod support;
