//! The SSE part of the overhead benchmark: the delay crossbar adds to each streamed event,
//! matched event by event against the same sim direct.

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crossbar::sim::{Sim, SimEvent};
use parking_lot::Mutex;

use crate::conn::Conn;
use crate::figures::Sample;
use crate::{chat_body, STREAM_RUNS, STREAM_TOKENS, STREAM_VIA};

pub struct EventFigures {
    pub direct_p50: f64,
    pub via_p50: f64,
    /// Per matched event: (through delay of event k) - (direct delay of event k), ms.
    pub added: Sample,
}

/// The delay crossbar adds to each SSE event.
///
/// Method: the slow sim emits `SimEvent::EventSent { index }` right after writing each event to
/// its socket; an observer thread timestamps those on receipt. The client timestamps each event
/// when its terminating blank line arrives. Delay of event k = arrival_k - sent_k. Streams run one
/// at a time, alternating direct and through crossbar, so the sim's events belong to the one
/// stream in flight. The observer's wake-up latency is in both sides' `sent_k` alike, so it cancels
/// in the difference; what remains is crossbar's read-from-upstream, tee and write-to-client per
/// event. Run i direct is matched with run i through, event k with event k; the figure is the p50
/// over all matched pairs. (Measuring arrival offsets relative to the first event instead would
/// cancel any constant per-event delay and report ~0 — not honest.)
pub fn stream_added(slow: &Sim, gw: SocketAddr, key: &'static str) -> EventFigures {
    let rx = slow.events();
    let sent: Arc<Mutex<Vec<(usize, Instant)>>> = Arc::default();
    let observer = {
        let sent = sent.clone();
        thread::spawn(move || {
            while let Ok(event) = rx.recv() {
                if let SimEvent::EventSent { index } = event {
                    sent.lock().push((index, Instant::now()));
                }
            }
        })
    };
    let direct_addr = slow.addr();
    let one = |addr: SocketAddr, path: &str| -> Vec<f64> {
        sent.lock().clear();
        let key = (addr == gw).then_some(key);
        let arrivals = stream_once(addr, path, key);
        // Let the observer drain the last events of this stream.
        let deadline = Instant::now() + Duration::from_secs(2);
        while sent.lock().len() < arrivals.len() && Instant::now() < deadline {
            thread::yield_now();
        }
        let sent = std::mem::take(&mut *sent.lock());
        arrivals
            .iter()
            .enumerate()
            .filter_map(|(k, at)| {
                let (_, s) = sent.iter().find(|(i, _)| *i == k)?;
                Some(signed_ms(*at, *s))
            })
            .collect()
    };
    one(direct_addr, "/v1/chat/completions");
    one(gw, STREAM_VIA);
    let (mut all_direct, mut all_via, mut added) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..STREAM_RUNS {
        let d = one(direct_addr, "/v1/chat/completions");
        let v = one(gw, STREAM_VIA);
        added.extend(d.iter().zip(&v).map(|(d, v)| v - d));
        all_direct.extend(d);
        all_via.extend(v);
    }
    let p50 = |ms: Vec<f64>| {
        Sample {
            ms,
            wall: Duration::from_secs(1),
            ticks: 0,
        }
        .p(50.0)
    };
    let figures = EventFigures {
        direct_p50: p50(all_direct),
        via_p50: p50(all_via),
        added: Sample {
            ms: added,
            wall: Duration::from_secs(1),
            ticks: 0,
        },
    };
    // Detached: the observer exits when the sim is dropped and its channel disconnects.
    drop(observer);
    figures
}

/// `arrival - sent` in ms, negative if the client saw it before the observer woke.
fn signed_ms(arrival: Instant, sent: Instant) -> f64 {
    match arrival.checked_duration_since(sent) {
        Some(d) => d.as_secs_f64() * 1e3,
        None => -(sent.duration_since(arrival).as_secs_f64() * 1e3),
    }
}

/// One streamed request on a fresh connection; the arrival time of each SSE event, in order.
fn stream_once(addr: SocketAddr, path: &str, key: Option<&'static str>) -> Vec<Instant> {
    let mut conn = Conn::open(addr).with_key(key);
    conn.send(path, &chat_body(0, true, STREAM_TOKENS));
    let head = conn.head();
    assert_eq!(head.status, 200, "{path}: stream failed");
    assert!(head.chunked, "{path}: stream is not chunked");
    let (mut pending, mut arrivals) = (Vec::new(), Vec::new());
    while let Some(data) = conn.chunk() {
        let now = Instant::now();
        pending.extend_from_slice(&data);
        while let Some(end) = pending.windows(2).position(|w| w == b"\n\n") {
            arrivals.push(now);
            pending.drain(..end + 2);
        }
    }
    arrivals
}
