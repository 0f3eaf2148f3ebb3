//! A request placed by the chooser counts as arriving on its host until it takes its slot or its
//! place in line: the guard that says so on every way out of the request path.

use std::sync::Arc;

use super::Holdings;

/// A request placed by the chooser, counted as arriving on its host+model until this drops (when
/// it has its slot or its place in line, or gave up before): RAII, so no way out of the request
/// path leaks one.
#[derive(Debug)]
pub struct Arrival {
    holdings: Arc<Holdings>,
    host: String,
    model: String,
}

impl Arrival {
    /// The arrival [`Holdings::placed`] counted for a request on `host`+`model`.
    pub fn of(holdings: &Arc<Holdings>, host: &str, model: &str) -> Arrival {
        Arrival {
            holdings: holdings.clone(),
            host: host.to_string(),
            model: model.to_string(),
        }
    }
}

impl Drop for Arrival {
    fn drop(&mut self) {
        self.holdings.arrived(&self.host, &self.model);
    }
}
