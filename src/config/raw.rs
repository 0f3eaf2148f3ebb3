//! Stage one of config loading: the file exactly as serde sees it, every key optional so that
//! validation (`validate.rs`) can name each missing or bad one. No defaults and no checks here;
//! `suggest.rs` reads the known keys from these types for "did you mean".

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

#[derive(Debug, Deserialize)]
pub(super) struct RawConfig {
    pub(super) listen: Option<String>,
    pub(super) admin_listen: Option<String>,
    pub(super) admin_token: Option<String>,
    pub(super) db: Option<PathBuf>,
    pub(super) workers: Option<usize>,
    pub(super) lease_idle: Option<String>,
    pub(super) max_leases: Option<usize>,
    pub(super) max_leases_per_client: Option<usize>,
    pub(super) keep_requests: Option<String>,
    pub(super) keep_events: Option<String>,
    pub(super) health_interval: Option<String>,
    pub(super) health_fall: Option<u32>,
    pub(super) health_rise: Option<u32>,
    pub(super) queue_max: Option<usize>,
    pub(super) queue_max_total: Option<usize>,
    pub(super) queue_max_per_client: Option<usize>,
    pub(super) queue_body_mib: Option<u64>,
    pub(super) queue_body_mib_per_client: Option<u64>,
    pub(super) queue_timeout: Option<String>,
    pub(super) connect_timeout: Option<String>,
    pub(super) first_byte_timeout: Option<String>,
    pub(super) shutdown_grace: Option<String>,
    pub(super) client_header_timeout: Option<String>,
    pub(super) client_body_timeout: Option<String>,
    pub(super) client_body_min_rate: Option<u64>,
    pub(super) client_body_buffer_mib: Option<u64>,
    pub(super) keepalive_idle: Option<String>,
    pub(super) client_write_timeout: Option<String>,
    pub(super) accept_queue: Option<usize>,
    pub(super) max_connections_per_peer: Option<usize>,
    pub(super) max_body_readers_per_peer: Option<usize>,
    pub(super) log_level: Option<String>,
    #[serde(default)]
    pub(super) hosts: BTreeMap<String, RawHost>,
    #[serde(default)]
    pub(super) routes: BTreeMap<String, RawRoute>,
    #[serde(default)]
    pub(super) keys: BTreeMap<String, RawKey>,
}

#[derive(Debug, Deserialize)]
pub(super) struct RawKey {
    pub(super) hash: Option<String>,
    pub(super) routes: Option<Vec<String>>,
    pub(super) max_in_flight: Option<usize>,
    pub(super) tokens_per_day: Option<u64>,
}

#[derive(Debug, Deserialize)]
pub(super) struct RawHost {
    pub(super) url: Option<String>,
    pub(super) weight: Option<u32>,
    pub(super) api_key: Option<String>,
    pub(super) ctx: Option<u64>,
    pub(super) kv_tokens: Option<u64>,
    pub(super) slot_prompt_similarity: Option<f64>,
    /// Retired by issue 47 for `exclusive`: read as `exclusive = true`, warned about.
    pub(super) pin_slots: Option<bool>,
    pub(super) exclusive: Option<bool>,
    pub(super) ram_cache: Option<bool>,
    #[serde(default)]
    pub(super) models: BTreeMap<String, RawModel>,
}

#[derive(Debug, Deserialize)]
pub(super) struct RawModel {
    pub(super) parallel: Option<i64>,
    pub(super) upstream: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(super) struct RawRoute {
    #[serde(default)]
    pub(super) hosts: Vec<String>,
    pub(super) model: Option<String>,
    /// Retired by issue 23 (placement spreads new conversations): read, ignored, warned about.
    pub(super) spread_new: Option<bool>,
    pub(super) move_when_busy: Option<bool>,
}
