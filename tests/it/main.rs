//! crossbar's integration tests: one binary, real HTTP on loopback, simulated llama-servers.

mod admin;
mod affinity;
mod apis;
mod blame;
mod broken;
mod dbfiles;
mod envelope;
mod exact;
mod examples;
mod front;
mod fuzz;
mod guard;
mod keys;
mod limits;
mod listing;
mod models;
mod paths;
mod placement;
mod proxy;
mod restart;
mod router;
mod rows;
mod signals;
mod store;
mod support;
mod upstream;
