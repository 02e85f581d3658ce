//! The `usage_limit` plugin's YAML settings.
//!
//! ```yaml
//! - kind: usage_limit
//!   backend: auto                  # auto | memory | redis; default auto
//!   default_completion_tokens: 1024
//!   on_backend_error: allow        # allow | refuse; default allow
//!   key_prefix: "gw:budget:"
//!   queue_capacity: 10000
//!   flush_interval_ms: 1000
//!   default_price: {input_per_million: 10, output_per_million: 30}   # for unpriced models
//!   prices:                        # override the shipped price table
//!     - {provider: openai, model: gpt-4o, input_per_million: 2.5, output_per_million: 10}
//!     - {slug: my-azure, model: gpt-4o, input_per_million: 2.75, output_per_million: 11}
//! ```

use serde::Deserialize;

use plugin_sdk::ConfigIssue;

use crate::pricing::{Price, PriceOverride};

/// Where budget counters live.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Redis when the gateway has `GW_REDIS_URL`, else in-process.
    #[default]
    Auto,
    /// In-process counters: exact on one instance; instances do not share them.
    Memory,
    /// Redis (`GW_REDIS_URL`, required): every instance shares one counter per budget.
    Redis,
}

/// What a request meets when the counter store cannot be reached (Redis down).
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum OnBackendError {
    /// Let the request through unchecked (its spend is still charged to the control plane).
    #[default]
    Allow,
    /// Refuse it with a 500 (also written `deny`, as `rate_limit` spells it).
    #[serde(alias = "deny")]
    Refuse,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageLimitConfig {
    /// Counter store. Default: `auto`.
    #[serde(default)]
    pub backend: Backend,
    /// Completion tokens reserved for a request that sets neither `max_tokens` nor
    /// `max_completion_tokens`. Default: 1024.
    #[serde(default = "default_completion_tokens")]
    pub default_completion_tokens: u64,
    /// Default: `allow`.
    #[serde(default)]
    pub on_backend_error: OnBackendError,
    /// Prefix of the Redis keys (`<prefix>{<budget id>}:<period>:<epoch>:<value key>`).
    /// Default: `gw:budget:`.
    #[serde(default = "default_key_prefix")]
    pub key_prefix: String,
    /// Settlements (Redis) and control-plane charges waiting for the background writer;
    /// beyond it new ones are dropped and counted. Default: 10000.
    #[serde(default = "default_queue_capacity")]
    pub queue_capacity: usize,
    /// The in-process backend's bound on counters (one per budget, policy entity and period);
    /// past it, after expired counters are swept, a request that needs a new one is refused
    /// (412 `budget_counters_full`), whatever `on_backend_error` says: a full store is not a
    /// store that is down. Default: 1000000.
    #[serde(default = "default_max_counters")]
    pub max_counters: usize,
    /// How often settled usage is sent to the control plane, in milliseconds. Default: 1000.
    #[serde(default = "default_flush_interval_ms")]
    pub flush_interval_ms: u64,
    /// Price rows that replace or add to the shipped table. Default: none.
    #[serde(default)]
    pub prices: Vec<PriceOverride>,
    /// The price of a model no price row knows, and of passthrough requests (which name no
    /// model), under `cost` budgets. Default: none, so such a request is refused (412
    /// `model_unpriced`) when a cost budget applies to it, rather than spending for free.
    #[serde(default)]
    pub default_price: Option<DefaultPrice>,
}

/// `default_price`: US dollars per million tokens.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DefaultPrice {
    pub input_per_million: f64,
    pub output_per_million: f64,
}

impl DefaultPrice {
    pub fn price(self) -> Price {
        Price {
            input_per_million: self.input_per_million,
            output_per_million: self.output_per_million,
        }
    }
}

impl Default for UsageLimitConfig {
    fn default() -> Self {
        UsageLimitConfig {
            backend: Backend::Auto,
            default_completion_tokens: default_completion_tokens(),
            on_backend_error: OnBackendError::Allow,
            key_prefix: default_key_prefix(),
            queue_capacity: default_queue_capacity(),
            max_counters: default_max_counters(),
            flush_interval_ms: default_flush_interval_ms(),
            prices: Vec::new(),
            default_price: None,
        }
    }
}

fn default_completion_tokens() -> u64 {
    1024
}

fn default_key_prefix() -> String {
    "gw:budget:".into()
}

fn default_queue_capacity() -> usize {
    10_000
}

fn default_flush_interval_ms() -> u64 {
    1_000
}

fn default_max_counters() -> usize {
    super::ledger::DEFAULT_MAX_COUNTERS
}

impl UsageLimitConfig {
    /// Ranges and combinations; pure.
    pub fn issues(&self) -> Vec<ConfigIssue> {
        let mut issues = Vec::new();
        if self.max_counters == 0 {
            issues.push(ConfigIssue::new("max_counters", "must be at least 1"));
        }
        if self.default_completion_tokens > 1_000_000 {
            issues.push(ConfigIssue::new(
                "default_completion_tokens",
                format!(
                    "must be at most 1000000, got {}",
                    self.default_completion_tokens
                ),
            ));
        }
        if self.key_prefix.is_empty() {
            issues.push(ConfigIssue::new("key_prefix", "must not be empty"));
        }
        if self.queue_capacity == 0 || self.queue_capacity > 10_000_000 {
            issues.push(ConfigIssue::new(
                "queue_capacity",
                format!(
                    "must be between 1 and 10000000, got {}",
                    self.queue_capacity
                ),
            ));
        }
        if !(1..=3_600_000).contains(&self.flush_interval_ms) {
            issues.push(ConfigIssue::new(
                "flush_interval_ms",
                format!(
                    "must be between 1 and 3600000, got {}",
                    self.flush_interval_ms
                ),
            ));
        }
        for (i, row) in self.prices.iter().enumerate() {
            issues.extend(row.issues(&format!("prices[{i}]")));
        }
        if let Some(p) = self.default_price {
            for (field, x) in [
                ("input_per_million", p.input_per_million),
                ("output_per_million", p.output_per_million),
            ] {
                if !(x.is_finite() && x >= 0.0) {
                    issues.push(ConfigIssue::new(
                        format!("default_price.{field}"),
                        format!("must be a number of at least 0, got {x}"),
                    ));
                }
            }
        }
        issues
    }
}
