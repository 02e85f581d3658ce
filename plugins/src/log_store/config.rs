//! The `log_store` pipeline entry and its checks.

use serde::Deserialize;

use plugin_sdk::ConfigIssue;

/// Records queued before new ones are dropped. Default: 10 000.
const DEFAULT_QUEUE_CAPACITY: usize = 10_000;
/// Records per write. Default: 200.
const DEFAULT_BATCH_SIZE: usize = 200;
/// Longest wait before a partial batch is written. Default: 500 ms.
const DEFAULT_FLUSH_INTERVAL_MS: u64 = 500;
/// Bytes kept of each body. Default: 64 KiB.
const DEFAULT_MAX_BODY_BYTES: usize = 64 * 1024;

const MAX_QUEUE_CAPACITY: usize = 1_000_000;
const MAX_BATCH_SIZE: usize = 10_000;
const MAX_FLUSH_INTERVAL_MS: u64 = 60_000;
/// Room for the truncation marker, so a truncated body still shows some of itself.
pub(crate) const MIN_MAX_BODY_BYTES: usize = 64;
const MAX_MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// `- kind: log_store`: every request's record, written to the control plane's database in
/// batches by a background writer.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogStoreConfig {
    /// Records waiting for the writer, at most (1 to 1 000 000). When the queue is full a new
    /// record is dropped (and counted), never waited for. Default: 10 000.
    #[serde(default = "default_queue_capacity")]
    pub queue_capacity: usize,
    /// Records per write to the database (1 to 10 000, at most `queue_capacity`).
    /// Default: 200.
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// The longest a record waits for its batch to fill before it is written anyway, in
    /// milliseconds (1 to 60 000). Default: 500.
    #[serde(default = "default_flush_interval_ms")]
    pub flush_interval_ms: u64,
    /// Whether request and response bodies are kept, with secret JSON fields redacted and each
    /// cut at `max_body_bytes`. Default: false.
    #[serde(default)]
    pub bodies: bool,
    /// Bytes kept of each body when `bodies` is on (64 to 16 MiB). Default: 65 536. The queue
    /// may then hold up to `queue_capacity * 2 * max_body_bytes` bytes of bodies.
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: usize,
}

impl Default for LogStoreConfig {
    fn default() -> Self {
        LogStoreConfig {
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            batch_size: DEFAULT_BATCH_SIZE,
            flush_interval_ms: DEFAULT_FLUSH_INTERVAL_MS,
            bodies: false,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        }
    }
}

fn default_queue_capacity() -> usize {
    DEFAULT_QUEUE_CAPACITY
}

fn default_batch_size() -> usize {
    DEFAULT_BATCH_SIZE
}

fn default_flush_interval_ms() -> u64 {
    DEFAULT_FLUSH_INTERVAL_MS
}

fn default_max_body_bytes() -> usize {
    DEFAULT_MAX_BODY_BYTES
}

/// The range checks of [`LogStoreConfig`] (pure).
pub fn validate(config: &LogStoreConfig) -> Vec<ConfigIssue> {
    let mut issues = Vec::new();
    if !(1..=MAX_QUEUE_CAPACITY).contains(&config.queue_capacity) {
        issues.push(ConfigIssue::new(
            "queue_capacity",
            format!(
                "must be between 1 and {MAX_QUEUE_CAPACITY}, got {}",
                config.queue_capacity
            ),
        ));
    }
    if !(1..=MAX_BATCH_SIZE).contains(&config.batch_size) {
        issues.push(ConfigIssue::new(
            "batch_size",
            format!(
                "must be between 1 and {MAX_BATCH_SIZE}, got {}",
                config.batch_size
            ),
        ));
    } else if config.queue_capacity >= 1 && config.batch_size > config.queue_capacity {
        issues.push(ConfigIssue::new(
            "batch_size",
            format!(
                "must not exceed queue_capacity ({}), got {}",
                config.queue_capacity, config.batch_size
            ),
        ));
    }
    if !(1..=MAX_FLUSH_INTERVAL_MS).contains(&config.flush_interval_ms) {
        issues.push(ConfigIssue::new(
            "flush_interval_ms",
            format!(
                "must be between 1 and {MAX_FLUSH_INTERVAL_MS}, got {}",
                config.flush_interval_ms
            ),
        ));
    }
    if !(MIN_MAX_BODY_BYTES..=MAX_MAX_BODY_BYTES).contains(&config.max_body_bytes) {
        issues.push(ConfigIssue::new(
            "max_body_bytes",
            format!(
                "must be between {MIN_MAX_BODY_BYTES} and {MAX_MAX_BODY_BYTES}, got {}",
                config.max_body_bytes
            ),
        ));
    }
    issues
}
