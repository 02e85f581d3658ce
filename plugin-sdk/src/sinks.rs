//! Where plugins send what the control plane keeps: audit events, settled budget usage and
//! request log records. The control plane implements these over its database; plugins call
//! them from background tasks or hand over without waiting, never on the request's path.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use serde_json::Value;

/// Something the audit log should record that did not come through the control plane's API
/// (a refused JWT, a budget reaching its alert threshold).
#[derive(Debug, Clone)]
pub struct AuditEvent {
    /// `auth.jwt_rejected`, `usage_limits.alert`, `usage_limits.exhausted`...
    pub action: String,
    /// `jwt`, `api_key`, `usage_limits_policy`, `workspace`...
    pub resource_type: String,
    pub resource_id: Option<String>,
    /// `None` when the organisation is not known (an unverifiable token): the control plane
    /// records it under the bootstrap organisation.
    pub organisation_id: Option<String>,
    pub workspace_id: Option<String>,
    pub user_id: Option<String>,
    pub method: String,
    pub uri: String,
    /// The request's trace id.
    pub request_id: String,
    pub status: u16,
    pub client_ip: Option<String>,
    /// Details (never secrets): the reason a token was refused, the budget's usage...
    pub details: Value,
}

/// Usage settled against one budget after a request: the control plane adds `amount` to the
/// budget's stored usage (marking it exhausted at its limit) so that the policy endpoints show
/// it and a restart starts from it.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageCharge {
    /// The budget's counter id (see [`crate::access::Budget::id`]).
    pub budget_id: String,
    /// For a usage limits policy, the entity's value key; else empty.
    pub value_key: String,
    pub amount: f64,
    /// The reset period the usage belongs to ([`crate::access::UsageLimit::period_at`]): a
    /// charge of a newer period than the stored one starts the stored usage over.
    pub period: i64,
    /// The budget's reset epoch when the usage was counted: a charge from before a manual
    /// reset is dropped.
    pub reset_epoch: i64,
}

/// One request as the log keeps it.
#[derive(Debug, Clone, Default)]
pub struct LogRecord {
    /// A new id per record (UUID).
    pub id: String,
    pub trace_id: String,
    pub span_id: Option<String>,
    pub parent_span_id: Option<String>,
    pub span_name: Option<String>,
    pub created_at: Option<SystemTime>,
    pub organisation_id: Option<String>,
    pub workspace_id: Option<String>,
    pub api_key_id: Option<String>,
    pub user_id: Option<String>,
    pub metadata: BTreeMap<String, String>,
    /// `chat.completions`, `embeddings`, `passthrough`...
    pub route: String,
    pub method: String,
    pub path: String,
    pub provider: Option<String>,
    pub model: Option<String>,
    pub status: u16,
    pub latency_ms: u64,
    pub upstream_latency_ms: Option<u64>,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// US dollars, from the price table; `None` when the model has no price.
    pub cost: Option<f64>,
    pub cache_status: Option<String>,
    pub retries: u32,
    /// The config node that answered (`config.targets[1]`).
    pub final_target: Option<String>,
    pub streamed: bool,
    pub error: Option<String>,
    /// Kept only when the logging plugin is configured to; secrets redacted.
    pub request_body: Option<String>,
    pub response_body: Option<String>,
}

/// The control plane's side of the plugins' background writers.
#[async_trait]
pub trait ControlPlaneSink: Send + Sync {
    /// Records audit events. Called from a background task.
    async fn audit(&self, events: Vec<AuditEvent>) -> Result<(), String>;
    /// Adds settled usage to the stored budgets. Called from a background task.
    async fn charge_usage(&self, charges: Vec<UsageCharge>) -> Result<(), String>;
    /// Writes one batch of request logs. Called from a background task.
    async fn write_logs(&self, records: Vec<LogRecord>) -> Result<(), String>;
}

/// A sink that keeps nothing (no control plane: the YAML-only tests and benchmarks).
#[derive(Debug, Default, Clone, Copy)]
pub struct Discard;

#[async_trait]
impl ControlPlaneSink for Discard {
    async fn audit(&self, _events: Vec<AuditEvent>) -> Result<(), String> {
        Ok(())
    }
    async fn charge_usage(&self, _charges: Vec<UsageCharge>) -> Result<(), String> {
        Ok(())
    }
    async fn write_logs(&self, _records: Vec<LogRecord>) -> Result<(), String> {
        Ok(())
    }
}

/// A shared sink.
pub type SharedSink = Arc<dyn ControlPlaneSink>;
