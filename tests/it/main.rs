//! crossbar's integration tests: one binary, real HTTP on loopback, simulated llama-servers.

mod admin;
mod affinity;
mod apis;
mod broken;
mod examples;
mod guard;
mod limits;
mod models;
mod proxy;
mod restart;
mod signals;
mod support;
