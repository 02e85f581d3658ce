//! The `rate_limit` pipeline entry.

use serde::Deserialize;

use plugin_sdk::ConfigIssue;

/// Where the counters live.
#[derive(Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Redis when the gateway has a Redis URL (`GW_REDIS_URL`), else in process. The default.
    #[default]
    Auto,
    /// In this process only: exact for one instance; several instances each count apart.
    Memory,
    /// In Redis, shared by every instance; needs `GW_REDIS_URL`.
    Redis,
}

/// What to do with a request whose limits cannot be checked (Redis unreachable or slow, the
/// in-process store full).
#[derive(Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum OnBackendError {
    /// Let it through (fail open): an outage of Redis does not stop traffic. The default.
    #[default]
    Allow,
    /// Refuse it with a 429 and `retry-after: 1` (fail closed).
    Deny,
}

/// `- kind: rate_limit`: enforces the rate limits of the caller's API key (or JWT) and
/// workspace, and every active rate limits policy of its workspace that matches the request.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitConfig {
    /// `auto` (default), `memory` or `redis`.
    #[serde(default)]
    pub backend: Backend,
    /// `allow` (default) or `deny`.
    #[serde(default)]
    pub on_backend_error: OnBackendError,
    /// Live counters the in-process backend keeps at most (one per key limit, per policy and
    /// group_by value; roughly 150 bytes each). Past it, a request that needs a new counter is
    /// refused (429 `rate_limit_counters_full`), whatever `on_backend_error` says: a full store
    /// is not a store that is down. Default: 1,000,000.
    #[serde(default = "default_max_counters")]
    pub max_counters: usize,
    /// Prefix of the Redis keys. Default: `gw:rl:`.
    #[serde(default = "default_redis_prefix")]
    pub redis_prefix: String,
    /// How long a Redis call may take before it counts as a backend error, in milliseconds.
    /// Default: 500.
    #[serde(default = "default_redis_timeout_ms")]
    pub redis_timeout_ms: u64,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        RateLimitConfig {
            backend: Backend::default(),
            on_backend_error: OnBackendError::default(),
            max_counters: default_max_counters(),
            redis_prefix: default_redis_prefix(),
            redis_timeout_ms: default_redis_timeout_ms(),
        }
    }
}

fn default_max_counters() -> usize {
    1_000_000
}

fn default_redis_prefix() -> String {
    "gw:rl:".to_owned()
}

fn default_redis_timeout_ms() -> u64 {
    500
}

/// Largest `max_counters`: beyond it a typo is more likely than a need.
const MAX_COUNTERS: usize = 100_000_000;

impl RateLimitConfig {
    /// Checks the values beyond their types (pure).
    pub fn issues(&self) -> Vec<ConfigIssue> {
        let mut issues = Vec::new();
        if self.max_counters == 0 || self.max_counters > MAX_COUNTERS {
            issues.push(ConfigIssue::new(
                "max_counters",
                format!("must be between 1 and {MAX_COUNTERS}"),
            ));
        }
        let prefix_ok = !self.redis_prefix.is_empty()
            && self.redis_prefix.len() <= 64
            && !self
                .redis_prefix
                .chars()
                .any(|c| c.is_whitespace() || c.is_control());
        if !prefix_ok {
            issues.push(ConfigIssue::new(
                "redis_prefix",
                "must be 1 to 64 characters without spaces",
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
