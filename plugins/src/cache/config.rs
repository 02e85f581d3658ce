//! The `cache` pipeline entry, as written in the YAML.
//!
//! ```yaml
//! - kind: cache
//!   default: {mode: simple, max_age: 600}   # targets without `cache` settings; default: none
//!   default_max_age: 604800                 # seconds, when a node's cache has no max_age
//!   backend: auto                           # auto | memory | redis
//!   max_bytes: 67108864                     # memory backend: total size bound
//!   max_entry_bytes: 8388608                # larger answers are not stored
//!   eviction: tiny_lfu                      # memory backend: tiny_lfu | lru
//!   key_prefix: "gw:cache:"                 # redis backend: key prefix
//!   redis_timeout_ms: 250                   # redis backend: bound of one command
//! ```

use serde::Deserialize;

use plugin_sdk::target::{CacheMode, CacheSettings};
use plugin_sdk::ConfigIssue;

/// One week: how long an answer is kept when neither the config node nor the plugin's
/// `default` names a `max_age`.
pub const DEFAULT_MAX_AGE_SECS: u64 = 7 * 24 * 3600;
/// Ten years: any longer `max_age` (in a request's config too) is cut to this, so that expiry
/// arithmetic cannot overflow.
pub const MAX_AGE_CAP_SECS: u64 = 10 * 365 * 24 * 3600;
/// 64 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 64 * 1024 * 1024;
/// 8 MiB.
pub const DEFAULT_MAX_ENTRY_BYTES: u64 = 8 * 1024 * 1024;
/// One entry's weight must fit the memory backend's 32-bit weigher; 1 GiB is far above any
/// sensible answer.
pub const MAX_ENTRY_BYTES_CAP: u64 = 1024 * 1024 * 1024;

/// `simple` or `semantic`, as a config node writes it.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ModeConfig {
    /// Exact match of the canonical request.
    Simple,
    /// Not served by this cache: treated as a miss and never stored (one warning is logged).
    Semantic,
}

/// The `default` cache settings for targets whose config node has none.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DefaultCacheConfig {
    pub mode: ModeConfig,
    /// Seconds an answer is kept. Default: `default_max_age`.
    #[serde(default)]
    pub max_age: Option<u64>,
}

impl DefaultCacheConfig {
    pub fn settings(&self) -> CacheSettings {
        CacheSettings {
            mode: match self.mode {
                ModeConfig::Simple => CacheMode::Simple,
                ModeConfig::Semantic => CacheMode::Semantic,
            },
            max_age_secs: self.max_age,
        }
    }
}

/// Where answers are kept.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    /// Redis when the gateway has `GW_REDIS_URL`, else in-process memory.
    #[default]
    Auto,
    /// In-process memory, even when Redis is configured (each instance has its own cache).
    Memory,
    /// Redis (`GW_REDIS_URL` is then required): instances share one cache.
    Redis,
}

/// How the memory backend chooses what to drop when it is full.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum EvictionChoice {
    /// Least recently used entries go first, but a new entry is admitted only if it is likely
    /// to be asked for more often than what it would push out (a scan of one-off prompts does
    /// not flush the popular answers).
    #[default]
    TinyLfu,
    /// Plain least-recently-used: every new entry is admitted.
    Lru,
}

/// The `cache` plugin's config.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheConfig {
    /// Cache settings for targets whose config node has no `cache` object (requests routed by
    /// headers included). Default: none, such requests are not cached (`DISABLED`).
    #[serde(default)]
    pub default: Option<DefaultCacheConfig>,
    /// Seconds an answer is kept when its settings name no `max_age`. Default: 604800 (a week).
    #[serde(default = "default_max_age")]
    pub default_max_age: u64,
    /// Where answers are kept. Default: `auto` (Redis when `GW_REDIS_URL` is set, else memory).
    #[serde(default)]
    pub backend: BackendChoice,
    /// Memory backend: the most bytes of answers kept. Default: 64 MiB.
    #[serde(default = "default_max_bytes")]
    pub max_bytes: u64,
    /// Answers (or whole streams) larger than this are not stored. Default: 8 MiB.
    #[serde(default = "default_max_entry_bytes")]
    pub max_entry_bytes: u64,
    /// Memory backend: the eviction policy. Default: `tiny_lfu`.
    #[serde(default)]
    pub eviction: EvictionChoice,
    /// Redis backend: the prefix of every key. Default: `gw:cache:`.
    #[serde(default = "default_key_prefix")]
    pub key_prefix: String,
    /// Redis backend: how long one command (or connecting) may take before the lookup counts
    /// as a miss. Default: 250 ms.
    #[serde(default = "default_redis_timeout_ms")]
    pub redis_timeout_ms: u64,
}

fn default_max_age() -> u64 {
    DEFAULT_MAX_AGE_SECS
}

fn default_max_bytes() -> u64 {
    DEFAULT_MAX_BYTES
}

fn default_max_entry_bytes() -> u64 {
    DEFAULT_MAX_ENTRY_BYTES
}

fn default_key_prefix() -> String {
    "gw:cache:".to_owned()
}

fn default_redis_timeout_ms() -> u64 {
    250
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            default: None,
            default_max_age: DEFAULT_MAX_AGE_SECS,
            backend: BackendChoice::Auto,
            max_bytes: DEFAULT_MAX_BYTES,
            max_entry_bytes: DEFAULT_MAX_ENTRY_BYTES,
            eviction: EvictionChoice::TinyLfu,
            key_prefix: default_key_prefix(),
            redis_timeout_ms: default_redis_timeout_ms(),
        }
    }
}

impl CacheConfig {
    /// Checks ranges and combinations; each issue names its field.
    pub fn issues(&self) -> Vec<ConfigIssue> {
        let mut issues = Vec::new();
        if let Some(d) = &self.default {
            if d.max_age == Some(0) {
                issues.push(ConfigIssue::new(
                    "default.max_age",
                    "must be at least 1 second (leave `default` out to not cache)",
                ));
            }
            if d.max_age.is_some_and(|a| a > MAX_AGE_CAP_SECS) {
                issues.push(ConfigIssue::new(
                    "default.max_age",
                    format!("must be at most {MAX_AGE_CAP_SECS} seconds (ten years)"),
                ));
            }
        }
        if !(1..=MAX_AGE_CAP_SECS).contains(&self.default_max_age) {
            issues.push(ConfigIssue::new(
                "default_max_age",
                format!("must be between 1 and {MAX_AGE_CAP_SECS} seconds"),
            ));
        }
        if self.max_bytes < 1024 {
            issues.push(ConfigIssue::new("max_bytes", "must be at least 1024"));
        }
        if !(1..=MAX_ENTRY_BYTES_CAP).contains(&self.max_entry_bytes) {
            issues.push(ConfigIssue::new(
                "max_entry_bytes",
                format!("must be between 1 and {MAX_ENTRY_BYTES_CAP}"),
            ));
        } else if self.backend == BackendChoice::Memory && self.max_entry_bytes > self.max_bytes {
            issues.push(ConfigIssue::new(
                "max_entry_bytes",
                "must not exceed max_bytes: such an entry could never be kept",
            ));
        }
        if self.key_prefix.is_empty()
            || self.key_prefix.len() > 128
            || self
                .key_prefix
                .chars()
                .any(|c| c.is_whitespace() || c.is_control())
        {
            issues.push(ConfigIssue::new(
                "key_prefix",
                "must be 1 to 128 characters without spaces or control characters",
            ));
        }
        if !(1..=60_000).contains(&self.redis_timeout_ms) {
            issues.push(ConfigIssue::new(
                "redis_timeout_ms",
                "must be between 1 and 60000",
            ));
        }
        issues
    }
}
