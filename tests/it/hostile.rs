//! Issue 46, hostile clients (round three): what one client can do to the others. A client may
//! not name the slot inside a host, nor hide from crossbar what the host will read in its body,
//! nor make a healthy host look failing;
//! whole bodies waiting for a busy host hold neither the body budget nor every worker; one
//! client's new conversations evict its own leases, not everyone's; a key's conversations are
//! its own.

mod bodies;
mod budget;
mod heads;
mod leases;
mod slots;
mod strangers;
