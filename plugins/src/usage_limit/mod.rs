//! `usage_limit`: budgets (usage limits) enforced on the request path, with a reservation
//! before the provider call and a settlement after it, so that concurrent requests cannot
//! overspend.
//!
//! Which budgets a request is charged to (gathered in `on_request`, after auth and provider
//! selection):
//! - the [`Principal`]'s budgets: the API key's (`api_key:<id>`), the JWT's (`jwt:<sub>:<i>`)
//!   and the workspace's (`workspace:<id>:<i>`);
//! - every active usage limits policy of the caller's workspace whose conditions match, one
//!   counter per `group_by` value key (`policy:<id>` + `metadata._user:alice`);
//! - the budget of the saved provider the request goes through (`provider:<slug>`), read from
//!   the provider store ([`BuildCx::providers`]; saved through the control plane, YAML
//!   providers have none): in `on_request` when provider selection named it (`@slug`, a
//!   virtual key, or a config whose top level says `provider: "@slug"` / `virtual_key`), else
//!   in `on_route` for each attempt through a saved provider with a budget not held yet (see
//!   below); with it, the budgets the provider's organisation integration sets on its
//!   workspace (`integration:<id>:<workspace>:<i>`, `PUT /v1/integrations/{slug}/workspaces`),
//!   shared by the workspace's requests through every provider of that integration.
//!
//! Each budget counts `cost` (US dollars: through a saved provider, its integration's model
//! prices set through the control plane first; then the YAML's `prices`, then the shipped
//! [price table](crate::pricing)), `tokens` (prompt + completion as the provider reported
//! them) or `requests`, per reset period
//! ([`UsageLimit::period_at`]) and reset epoch: a new period or a manual reset starts a fresh
//! counter, seeded with what the control plane had counted so a restart forgets no spend.
//!
//! - `on_request`: reserves the request's estimate on all its budgets at once, or refuses with
//!   412 (`budget_exhausted`) naming the budget: 1 for `requests`; prompt characters / 4 plus
//!   `max_completion_tokens` / `max_tokens` (else `default_completion_tokens`) for `tokens`;
//!   that estimate priced for `cost`. A budget whose usage and reservations reach its limit
//!   refuses every request. The credit limit is read from the snapshot on every request, so
//!   raising it reactivates an exhausted budget at once.
//! - `on_route`: notes the saved provider (slug) the attempt goes through, for its prices;
//!   when that provider has a budget this request does not hold yet (a config target chosen by
//!   the router), reserves it there, or refuses the attempt with the same 412. In a fallback
//!   group that refusal is an attempt's failure like another (by default the next target is
//!   tried); under loadbalance or conditional routing it ends the request. A retry of the same
//!   target reserves nothing more: a provider's budget is held once per request.
//! - `on_response` / `on_chunk`: sets `cx.response.cost` from the reported usage.
//! - `on_log`: settles (actual minus reserved; a failed request's reservation is released,
//!   a cache hit costs no tokens; a provider's budget is charged only when the answer came
//!   through that provider, so a target given up for another, a cache hit or a refusal before
//!   the call costs it nothing), then hands the actual spend (`UsageCharge`) and any alert
//!   (`usage_limits.alert` when usage reaches `alert_threshold`, `usage_limits.exhausted` at
//!   the limit; once per period per budget per instance) to a background writer.
//!
//! Nothing settles at zero by accident:
//! - a 2xx answer without usage is charged its estimate (also when the store was down and
//!   nothing was held); a stream cut short (the client left, the provider dropped it or never
//!   reported final usage) is charged at least the prompt's estimate and the text it relayed
//!   (characters / 4);
//! - a passthrough request (its body is not read) reserves `default_completion_tokens` when it
//!   is a POST and is charged that unless its answer reports usage;
//! - under a `cost` budget, a model no price knows (and a passthrough request, which names
//!   none) is priced at `default_price`, or refused with 412 `model_unpriced` when there is
//!   none; an answer whose reported model has no price is charged its estimate. Both count
//!   in `gw_usage_limit_unpriced_total{when="request"|"answer"}`. Price models on their
//!   integration (`PUT /v1/integrations/{slug}/models`) or in `prices`.
//!
//! Counters live in-process or in Redis (`backend`); see `ledger.rs` and `redis.rs`. In Redis,
//! `on_request` defers its reservation to shared mode's admission, which checks the rate
//! limits and reserves the budgets in one script call ([`crate::limits::admission`]); `on_log`
//! queues the settlement, and a background task settles what is queued in one script call per
//! batch ([`crate::limits::batches`]), retried after 100 ms, 1 s and 5 s. Until its settlement
//! lands, a request's reservation keeps counting, so the requests sent meanwhile cannot
//! overspend (they may be refused early); in normal operation that is within 2 ms (a batch
//! gathering) and two Redis round trips of the answer, and at most about 10 s (the retries and their timeouts) before a
//! settlement is given up (`gw_usage_limit_backend_errors_total{op="settle"}`) and its
//! reservation stays held until the counter expires. A full queue (`queue_capacity`) drops the
//! settlement the same way (`gw_usage_limit_dropped_total{what="settlement"}`). When the
//! store cannot be reached, `on_backend_error` lets the request through unchecked (`allow`,
//! the default; its spend is still charged) or refuses it with a 500 (`refuse`).
//!
//! Metrics: `gw_usage_limit_rejections_total{scope}` (scope: api_key, workspace, jwt, policy,
//! provider, integration, other), `gw_usage_limit_alerts_total{event}` (alert, exhausted),
//! `gw_usage_limit_backend_errors_total{op}` (reserve, settle),
//! `gw_usage_limit_dropped_total{what}` (report, charge, event, settlement),
//! `gw_usage_limit_unpriced_total{when}` (request, answer).

mod config;
mod estimate;
mod ledger;
mod redis;
mod report;
#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use prometheus::{IntCounterVec, Opts};
use serde_json::json;
use tokio::sync::mpsc;

use plugin_sdk::access::{AccessStore, Budget, CountedUsage, PeriodicReset, UsageKind, UsageLimit};
use plugin_sdk::plugin::ResponseParts;
use plugin_sdk::sinks::{AuditEvent, UsageCharge};
use plugin_sdk::{
    BuildCx, Chunk, ConfigIssue, ErrorKind, Flow, GatewayError, Phases, Plugin, PluginFactory,
    Principal, ProviderStore, RequestCx, Route, RoutePlan, Target, Usage,
};

use crate::limits::matching::{in_workspace, matches, value_key, Subject};
use crate::pricing::{self, Price, PriceTable};

pub use config::{Backend, OnBackendError, UsageLimitConfig};
pub use ledger::{Hold, Ledger, MemoryLedger, Reserve, Settle};
pub use redis::RedisLedger;

use crate::limits::admission::Admission;
use crate::limits::batches::Batches;
use crate::limits::redis::{hash_tag, org_tag, tag_of};

use ledger::EPSILON;
use report::Report;

/// What the plugin reads the time from (tests move it).
pub type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// Extra time an unused counter is kept after its period could have ended.
const TTL_MARGIN: Duration = Duration::from_secs(86_400);
const DAY: u64 = 86_400;
/// A lifetime budget's counter is dropped after this many days without a request.
const LIFETIME_IDLE_DAYS: u64 = 30;

/// Budget events already sent by this instance are remembered this long at most.
const NOTIFIED_FOR: Duration = Duration::from_secs(40 * DAY);

pub struct UsageLimitFactory;

impl PluginFactory for UsageLimitFactory {
    const KIND: &'static str = "usage_limit";
    const SUMMARY: &'static str =
        "Enforces budgets (cost, tokens, requests) of keys, workspaces and usage limits policies: reserve, 412, settle";
    const EXAMPLE: &'static str = "- kind: usage_limit\n  backend: auto   # memory | redis (GW_REDIS_URL)\n  default_completion_tokens: 1024\n  prices:\n    - {provider: openai, model: gpt-4o, input_per_million: 2.5, output_per_million: 10}";
    type Config = UsageLimitConfig;

    fn validate(config: &Self::Config) -> Vec<ConfigIssue> {
        config.issues()
    }

    fn build(config: Self::Config, cx: &BuildCx) -> Result<Arc<dyn Plugin>, String> {
        let plugin = UsageLimitPlugin::start(config, cx, Arc::new(SystemTime::now))?;
        Ok(Arc::new(plugin))
    }
}

plugin_sdk::register_plugin!(UsageLimitFactory);

#[derive(Clone)]
struct Metrics {
    rejections: IntCounterVec,
    alerts: IntCounterVec,
    backend_errors: IntCounterVec,
    dropped: IntCounterVec,
    unpriced: IntCounterVec,
}

impl Metrics {
    fn register(registry: &prometheus::Registry) -> Result<Metrics, String> {
        let counter = |name: &str, help: &str, label: &str| {
            IntCounterVec::new(Opts::new(name, help), &[label]).map_err(|e| e.to_string())
        };
        let m = Metrics {
            rejections: counter(
                "gw_usage_limit_rejections_total",
                "Requests refused with 412 because a budget is exhausted",
                "scope",
            )?,
            alerts: counter(
                "gw_usage_limit_alerts_total",
                "Budgets that reached their alert threshold or their limit",
                "event",
            )?,
            backend_errors: counter(
                "gw_usage_limit_backend_errors_total",
                "Budget counter operations that failed (Redis unreachable...)",
                "op",
            )?,
            dropped: counter(
                "gw_usage_limit_dropped_total",
                "Settled usage or budget events not delivered to the control plane",
                "what",
            )?,
            unpriced: counter(
                "gw_usage_limit_unpriced_total",
                "Requests (refused, or priced at default_price) and answers under a cost budget whose model no price knew",
                "when",
            )?,
        };
        for c in [
            &m.rejections,
            &m.alerts,
            &m.backend_errors,
            &m.dropped,
            &m.unpriced,
        ] {
            registry.register(Box::new(c.clone())).map_err(|e| {
                format!("cannot register metrics (is `usage_limit` listed twice?): {e}")
            })?;
        }
        Ok(m)
    }
}

/// What the request path and the settlement tasks share.
struct Shared {
    ledger: Arc<dyn Ledger>,
    metrics: Metrics,
    /// Budget events (and unpriced-model warnings) this instance already sent.
    notified: moka::sync::Cache<String, ()>,
    /// `None` once dropped (see the `Drop`).
    reports: Option<mpsc::Sender<Report>>,
    /// Wakes the writer once [`Shared::wake_at`] reports wait (it also wakes on its own tick).
    wake: Arc<tokio::sync::Notify>,
    wake_at: usize,
    /// When a store failure was last logged (seconds since the epoch).
    last_warned: AtomicU64,
    /// Reports handed to the writer and not yet sent: the process waits for them at exit.
    in_flight: Arc<AtomicUsize>,
}

impl Drop for Shared {
    /// Closes the queue, then wakes the writer: it sends what is left and stops.
    fn drop(&mut self) {
        drop(self.reports.take());
        self.wake.notify_one();
    }
}

impl Shared {
    /// Hands a report to the writer without waiting; a full queue drops it (counted).
    fn hand_over(&self, report: Report) {
        if report.is_empty() {
            return;
        }
        let Some(reports) = &self.reports else {
            return;
        };
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        match reports.try_send(report) {
            Ok(()) => {
                if reports.max_capacity() - reports.capacity() >= self.wake_at
                    || crate::limits::batches::draining()
                {
                    self.wake.notify_one();
                }
            }
            Err(e) => {
                self.in_flight.fetch_sub(1, Ordering::SeqCst);
                self.metrics.dropped.with_label_values(&["report"]).inc();
                tracing::warn!(target: "gateway::usage_limit", error = %e,
                    "the usage limit queue is full; settled usage dropped");
            }
        }
    }

    /// Counts a counter store failure and logs it, at most every 10 seconds.
    fn warn_backend(&self, op: &str, error: &str) {
        self.metrics.backend_errors.with_label_values(&[op]).inc();
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let last = self.last_warned.load(Ordering::Relaxed);
        if now >= last + 10
            && self
                .last_warned
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(target: "gateway::usage_limit", op, error,
                "budget counters unavailable");
        }
    }

    /// What a reservation's outcome does: what each budget of `applied` holds, or the 412
    /// of the first budget that has no room. A store failure holds nothing (`allow`) or is a
    /// 500 (`refuse`).
    fn conclude_reserve(
        &self,
        on_error: OnBackendError,
        applied: &[Applied],
        amounts: &[f64],
        outcome: Result<Reserve, String>,
    ) -> Result<Vec<f64>, GatewayError> {
        match outcome {
            Ok(Reserve::Held) => Ok(amounts.to_vec()),
            Ok(Reserve::Refused { index, used, held }) => {
                let a = &applied[index];
                self.metrics
                    .rejections
                    .with_label_values(&[a.owner.scope])
                    .inc();
                Err(a.refusal(used, held, amounts[index]))
            }
            Ok(Reserve::Full { max_counters }) => {
                self.metrics.rejections.with_label_values(&["other"]).inc();
                Err(GatewayError::new(
                    ErrorKind::BudgetExhausted,
                    format!(
                        "Usage limit could not be counted: the gateway's budget counters are \
                         full ({max_counters}); raise the usage_limit plugin's max_counters"
                    ),
                )
                .with_code("budget_counters_full"))
            }
            Err(e) => {
                self.warn_backend("reserve", &e);
                match on_error {
                    // Unchecked, but its spend is still settled and charged.
                    OnBackendError::Allow => Ok(vec![0.0; amounts.len()]),
                    OnBackendError::Refuse => Err(GatewayError::internal(
                        "budgets cannot be checked: the usage limit store is unavailable",
                    )),
                }
            }
        }
    }

    /// True the first time `key` is seen (per instance, for [`NOTIFIED_FOR`] at most).
    fn first_time(&self, key: String) -> bool {
        let mut first = false;
        self.notified.get_with(key, || first = true);
        first
    }
}

/// The budgets plugin.
pub struct UsageLimitPlugin {
    shared: Arc<Shared>,
    access: Arc<dyn AccessStore>,
    /// Saved providers, for their own budgets.
    providers: Arc<dyn ProviderStore>,
    prices: PriceTable,
    /// The price of what no price row knows (`default_price`); `None`: refuse under cost budgets.
    default_price: Option<Price>,
    default_completion_tokens: u64,
    on_backend_error: OnBackendError,
    key_prefix: String,
    /// Redis settlements waiting for the background task (`None` for an in-process ledger).
    settlements: Option<Batches<SettleJob>>,
    clock: Clock,
}

impl UsageLimitPlugin {
    /// Builds the plugin and starts its background thread (a small runtime that runs the
    /// writer, the Redis connection and Redis settlements; it ends when the plugin is dropped).
    pub fn start(config: UsageLimitConfig, cx: &BuildCx, clock: Clock) -> Result<Self, String> {
        let metrics = Metrics::register(&cx.metrics)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the usage limit runtime: {e}"))?;
        let handle = runtime.handle().clone();
        let ledger: Arc<dyn Ledger> = match (config.backend, cx.redis_url.as_deref()) {
            (Backend::Memory, _) | (Backend::Auto, None) => {
                Arc::new(MemoryLedger::with_max_counters(config.max_counters))
            }
            (Backend::Auto | Backend::Redis, Some(url)) => Arc::new(RedisLedger::new(url)?),
            (Backend::Redis, None) => {
                return Err("backend: redis needs GW_REDIS_URL (the gateway's redis_url)".into())
            }
        };
        let (tx, rx) = mpsc::channel(config.queue_capacity);
        let wake = Arc::new(tokio::sync::Notify::new());
        let in_flight = Arc::new(AtomicUsize::new(0));
        crate::limits::batches::track(&in_flight, Some(&wake));
        let writer = report::run(
            rx,
            wake.clone(),
            in_flight.clone(),
            cx.sink.clone(),
            metrics.dropped.clone(),
            Duration::from_millis(config.flush_interval_ms),
            config.queue_capacity,
        );
        std::thread::Builder::new()
            .name("gw-usage-limit".into())
            .spawn(move || runtime.block_on(writer))
            .map_err(|e| format!("cannot start the usage limit thread: {e}"))?;
        tracing::debug!(target: "gateway::usage_limit", backend = ledger.name(), "budgets enforced");
        let shared = Arc::new(Shared {
            ledger,
            metrics,
            notified: moka::sync::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(NOTIFIED_FOR)
                .build(),
            reports: Some(tx),
            wake,
            wake_at: (config.queue_capacity / 4).max(1),
            last_warned: AtomicU64::new(0),
            in_flight,
        });
        // The task holds `shared` until the plugin drops the queue and it is written out.
        let settlements = shared.ledger.redis().is_some().then(|| {
            let (shared, prefix) = (shared.clone(), config.key_prefix.clone());
            Batches::start(&handle, config.queue_capacity, move |jobs| {
                settle_batch(shared.clone(), prefix.clone(), jobs)
            })
        });
        Ok(UsageLimitPlugin {
            shared,
            access: cx.access.clone(),
            providers: cx.providers.clone(),
            prices: PriceTable::shipped().with_overrides(&config.prices),
            default_price: config.default_price.map(|p| p.price()),
            default_completion_tokens: config.default_completion_tokens,
            on_backend_error: config.on_backend_error,
            key_prefix: config.key_prefix,
            settlements,
            clock,
        })
    }

    /// Every budget that applies to the request, with its counter for `now`.
    fn applicable(&self, cx: &RequestCx, now: SystemTime) -> Vec<Applied> {
        let mut out: Vec<Applied> = Vec::new();
        let principal = cx.extensions.get::<Principal>();
        if let Some(p) = principal {
            let tag = org_tag(p.organisation_id.as_deref());
            for b in &p.budgets {
                out.push(self.applied_budget(b, Some(p), tag, now));
            }
        }
        let subject = Subject::of(cx);
        // The saved provider that provider selection named (`virtual_key` is its slug).
        if let Some(slug) = subject.virtual_key {
            out.extend(self.provider_budgets(slug, principal, now));
        }
        let policies = self.access.usage_limit_policies();
        if !policies.is_empty() {
            for policy in policies.iter() {
                if !in_workspace(&policy.workspace_id, &subject)
                    || !matches(&policy.conditions, &subject)
                {
                    continue;
                }
                let vk = value_key(&policy.group_by, &subject);
                let counted = policy.usage.get(&vk).copied().unwrap_or_default();
                let mut label = match &policy.name {
                    Some(name) if !name.is_empty() => format!("usage limits policy {name:?}"),
                    _ => format!("usage limits policy {}", policy.id),
                };
                if !vk.is_empty() {
                    label.push_str(&format!(" for {vk}"));
                }
                out.push(self.applied(
                    CounterName {
                        tag: org_tag(Some(&policy.organisation_id)),
                        budget_id: format!("policy:{}", policy.id),
                        value_key: vk,
                    },
                    &policy.limit,
                    counted,
                    now,
                    Owner {
                        scope: "policy",
                        label: label.into(),
                        resource_type: "usage_limits_policy",
                        resource_id: policy.id.clone(),
                        organisation_id: Some(policy.organisation_id.clone()),
                        workspace_id: Some(policy.workspace_id.clone()),
                    },
                ));
            }
        }
        // Counter ids are unique by construction; a duplicate would reserve twice. A request
        // meets a handful of budgets at most, so a scan beats building a set.
        let mut i = 0;
        while i < out.len() {
            if out[..i].iter().any(|a| a.key == out[i].key) {
                out.remove(i);
            } else {
                i += 1;
            }
        }
        out
    }

    /// The budgets of the saved provider `slug`, when the provider store knows it: its own,
    /// and those its organisation integration sets on its workspace. Their counters carry
    /// the tag of the provider's owner ([`org_tag`]), as every caller of the provider counts
    /// on them, and are charged only what is spent through `slug`.
    fn provider_budgets(
        &self,
        slug: &str,
        who: Option<&Principal>,
        now: SystemTime,
    ) -> Vec<Applied> {
        let Some(record) = self.providers.provider_for(slug, who) else {
            return Vec::new();
        };
        let own = record.usage_limits.clone().map(|limit| Budget {
            id: format!("provider:{slug}"),
            limit,
            counted: record.counted,
        });
        let integration = record.integration_limits.iter().flat_map(|l| &l.budgets);
        let tag = org_tag(record.owner.as_ref().map(|o| o.organisation_id.as_str()));
        own.iter()
            .chain(integration)
            .map(|b| {
                let mut applied = self.applied_budget(b, who, tag, now);
                applied.through = Some(slug.to_owned());
                applied
            })
            .collect()
    }

    /// A budget with a stable id (`api_key:`, `workspace:`, `jwt:`, `provider:`...), owned
    /// (for events) by the caller's organisation and workspace when there is a caller.
    fn applied_budget(
        &self,
        b: &Budget,
        p: Option<&Principal>,
        tag: &str,
        now: SystemTime,
    ) -> Applied {
        let (scope, rest) = b.id.split_once(':').unwrap_or(("other", b.id.as_str()));
        // `workspace:<id>:<index>`, `jwt:<subject>:<index>`: the owner without the index;
        // `integration:<id>:<workspace>:<index>`: the integration.
        let owner_id = match scope {
            "workspace" | "jwt" => rest.rsplit_once(':').map_or(rest, |(id, _)| id),
            "integration" => rest.split_once(':').map_or(rest, |(id, _)| id),
            _ => rest,
        };
        let (scope, label, resource_type) = match scope {
            "api_key" => ("api_key", "the API key's budget".into(), "api_key"),
            "workspace" => ("workspace", "the workspace's budget".into(), "workspace"),
            "jwt" => ("jwt", "the token's budget".into(), "jwt"),
            "provider" => (
                "provider",
                format!("the provider @{owner_id}'s budget").into(),
                "provider",
            ),
            "policy" => (
                "policy",
                format!("usage limits policy {owner_id}").into(),
                "usage_limits_policy",
            ),
            "integration" => (
                "integration",
                "the integration's budget for this workspace".into(),
                "integration",
            ),
            _ => ("other", format!("budget {}", b.id).into(), "budget"),
        };
        self.applied(
            CounterName {
                tag,
                budget_id: b.id.clone(),
                value_key: String::new(),
            },
            &b.limit,
            b.counted,
            now,
            Owner {
                scope,
                label,
                resource_type,
                resource_id: owner_id.to_owned(),
                organisation_id: p.and_then(|p| p.organisation_id.clone()),
                workspace_id: p.and_then(|p| p.workspace_id.clone()),
            },
        )
    }

    fn applied(
        &self,
        name: CounterName<'_>,
        limit: &UsageLimit,
        counted: CountedUsage,
        now: SystemTime,
        owner: Owner,
    ) -> Applied {
        let CounterName {
            tag,
            budget_id,
            value_key,
        } = name;
        let period = limit.period_at(now);
        // In a Redis Cluster a request's budgets share its organisation's slot.
        let key = format!(
            "{}{}{}:{}:{}:{}",
            self.key_prefix,
            hash_tag(tag),
            budget_id,
            period,
            counted.reset_epoch,
            value_key
        );
        Applied {
            seed: counted.in_period(period),
            budget_id,
            value_key,
            kind: limit.kind,
            credit_limit: limit.credit_limit,
            alert_threshold: limit.alert_threshold,
            period,
            reset_epoch: counted.reset_epoch,
            key,
            ttl: ttl_of(limit),
            owner: Arc::new(owner),
            through: None,
        }
    }

    /// The holds of `amounts` on `applied` (same order).
    fn holds(applied: &[Applied], amounts: &[f64]) -> Vec<Hold> {
        applied
            .iter()
            .zip(amounts)
            .map(|(a, &amount)| Hold {
                key: a.key.clone(),
                seed: a.seed,
                amount,
                limit: a.credit_limit,
                ttl: a.ttl,
            })
            .collect()
    }

    /// Reserves `amounts` on `applied` (same order) all at once, now: see
    /// [`Shared::conclude_reserve`].
    async fn reserve(
        &self,
        applied: &[Applied],
        amounts: &[f64],
    ) -> Result<Vec<f64>, GatewayError> {
        let holds = UsageLimitPlugin::holds(applied, amounts);
        let outcome = self.shared.ledger.reserve(&holds).await;
        self.shared
            .conclude_reserve(self.on_backend_error, applied, amounts, outcome)
    }

    /// The price of the answer's usage: the saved provider the answer came through, the
    /// provider and the model the provider reported.
    fn price_answer(&self, cx: &RequestCx, usage: Usage) -> Option<f64> {
        let planned = planned_target(cx);
        let slug = match cx.extensions.get::<Through>() {
            Some(Through(slug)) => slug.as_deref(),
            None => planned.and_then(|t| t.slug.as_deref()),
        };
        let provider = cx
            .response
            .provider
            .as_deref()
            .or(planned.map(|t| t.provider.as_str()))
            .unwrap_or_default();
        let model = cx
            .response
            .model
            .as_deref()
            .or_else(|| planned.and_then(target_model))
            .or(cx.requested_model());
        if let Some(price) = self.price_or_default(slug, provider, model, "answer") {
            return Some(price.cost(usage));
        }
        let model = model.unwrap_or("(none named)");
        if self
            .shared
            .first_time(format!("unpriced|{provider}|{model}"))
        {
            tracing::warn!(target: "gateway::usage_limit", provider, model,
                "no price for the model the provider reported: cost budgets are charged the request's estimate (price it in the usage_limit plugin's `prices` or `default_price`)");
        }
        None
    }

    /// What a request is reserved for: its estimate ([`estimate::estimate`]); a passthrough
    /// request's body is not read, so a POST there reserves `default_completion_tokens`
    /// (other methods, which read or delete, none).
    fn estimate(&self, cx: &RequestCx) -> Usage {
        if cx.route == Route::Passthrough {
            return Usage {
                prompt_tokens: 0,
                completion_tokens: if cx.method == http::Method::POST {
                    self.default_completion_tokens
                } else {
                    0
                },
            };
        }
        estimate::estimate(&cx.request, self.default_completion_tokens)
    }

    /// The price of `model` (`None`: none is named), else `default_price`, counted in
    /// `gw_usage_limit_unpriced_total{when}`; `None` when neither is known.
    fn price_or_default(
        &self,
        slug: Option<&str>,
        provider: &str,
        model: Option<&str>,
        when: &str,
    ) -> Option<Price> {
        if let Some(price) = model.and_then(|m| self.price_of(slug, provider, m)) {
            return Some(price);
        }
        self.shared
            .metrics
            .unpriced
            .with_label_values(&[when])
            .inc();
        self.default_price
    }

    /// The cost of `usage` before the call, at the price of `model` (`None`: the request names
    /// none) or `default_price`; with neither, a 412 `model_unpriced`: under a cost budget
    /// nothing is spent for free. Zero usage (a passthrough GET) costs 0 and needs no price.
    fn cost_or_refuse(
        &self,
        slug: Option<&str>,
        provider: &str,
        model: Option<&str>,
        usage: Usage,
        cx: &RequestCx,
    ) -> Result<f64, GatewayError> {
        if usage.total() == 0 {
            return Ok(0.0);
        }
        if let Some(price) = self.price_or_default(slug, provider, model, "request") {
            return Ok(price.cost(usage));
        }
        let message = match model {
            Some(model) => format!(
                "a cost budget applies to this request, and no price is known for model \
                 {model:?}: price it on its integration or in the usage_limit plugin's \
                 `prices`, or set its `default_price`"
            ),
            None => format!(
                "a cost budget applies to this request, and {} names no model to price: set \
                 the usage_limit plugin's `default_price`",
                cx.path
            ),
        };
        Err(GatewayError::new(ErrorKind::BudgetExhausted, message).with_code("model_unpriced"))
    }

    /// The estimate's price, before the call: the planned target's prices (see
    /// [`UsageLimitPlugin::cost_or_refuse`]).
    fn price_estimate(&self, cx: &RequestCx, usage: Usage) -> Result<f64, GatewayError> {
        let planned = planned_target(cx);
        let model = planned.and_then(target_model).or(cx.requested_model());
        let slug = planned.and_then(|t| t.slug.as_deref());
        let provider = planned.map_or("", |t| t.provider.as_str());
        self.cost_or_refuse(slug, provider, model, usage, cx)
    }

    /// The price of `model` served by `provider`, through the saved provider `slug` if any:
    /// that provider's integration prices (set through the control plane) first, then the
    /// YAML's `prices` (its slug's rows, then its provider's), then the shipped table.
    fn price_of(&self, slug: Option<&str>, provider: &str, model: &str) -> Option<Price> {
        let listed = slug
            .and_then(|s| self.providers.provider(s))
            .and_then(|record| pricing::listed_price(&record.model_prices, model));
        listed.or_else(|| self.prices.price_for_target(slug, provider, model))
    }

    /// Sets `cx.response.cost` once the usage is known (again when it changes mid-stream).
    /// An answer whose cost the gateway waived (Provisioned Throughput) stays at 0.
    fn note_cost(&self, cx: &mut RequestCx) {
        let Some(usage) = cx.response.usage else {
            return;
        };
        if cx.response.cost_waived {
            cx.response.cost = Some(0.0);
            return;
        }
        if cx.extensions.get::<Priced>().is_some_and(|p| p.0 == usage) {
            return;
        }
        if let Some(cost) = self.price_answer(cx, usage) {
            cx.response.cost = Some(cost);
        }
        cx.extensions.insert(Priced(usage));
    }
}

/// Which counter a budget is: the tag of the organisation that owns it ([`org_tag`], its
/// counter's hash tag), the budget's id and the `group_by` value key (empty for none).
struct CounterName<'a> {
    tag: &'a str,
    budget_id: String,
    value_key: String,
}

/// Who a budget belongs to: for the 412 message, the metric's scope and audit events.
#[derive(Debug)]
struct Owner {
    scope: &'static str,
    /// How messages name the budget; the fixed ones are not copied per request.
    label: Cow<'static, str>,
    resource_type: &'static str,
    resource_id: String,
    organisation_id: Option<String>,
    workspace_id: Option<String>,
}

/// One budget that applies to a request, resolved for the current period.
#[derive(Debug, Clone)]
struct Applied {
    budget_id: String,
    value_key: String,
    kind: UsageKind,
    credit_limit: f64,
    alert_threshold: Option<f64>,
    period: i64,
    reset_epoch: i64,
    /// The counter: `<prefix>{<organisation>}<budget id>:<period>:<epoch>:<value key>`.
    key: String,
    seed: f64,
    ttl: Option<Duration>,
    owner: Arc<Owner>,
    /// A saved provider's budget: charged only when the answer came through this slug.
    through: Option<String>,
}

impl Applied {
    /// What `usage` (priced at `cost`) amounts to in this budget's unit.
    fn amount(&self, requests: f64, usage: Option<Usage>, cost: Option<f64>) -> f64 {
        match self.kind {
            UsageKind::Requests => requests,
            UsageKind::Tokens => usage.map_or(0.0, |u| u.total() as f64),
            UsageKind::Cost => cost.unwrap_or(0.0),
        }
    }

    fn unit(&self) -> &'static str {
        match self.kind {
            UsageKind::Cost => "USD",
            UsageKind::Tokens => "tokens",
            UsageKind::Requests => "requests",
        }
    }

    /// A number in this budget's unit, for messages.
    fn show(&self, x: f64) -> String {
        match self.kind {
            UsageKind::Cost => {
                let s = format!("{x:.6}");
                let s = s.trim_end_matches('0').trim_end_matches('.');
                if s.is_empty() || s == "-" {
                    "0".into()
                } else {
                    s.to_owned()
                }
            }
            _ => format!("{x:.0}"),
        }
    }

    /// The 412 for a request that does not fit.
    fn refusal(&self, used: f64, held: f64, estimate: f64) -> GatewayError {
        let mut message = format!(
            "Usage limit exceeded: {} has used {} of {} {}",
            self.owner.label,
            self.show(used),
            self.show(self.credit_limit),
            self.unit()
        );
        if held > EPSILON {
            message.push_str(&format!(
                " ({} more held by requests in flight)",
                self.show(held)
            ));
        }
        if used + held < self.credit_limit - EPSILON {
            message.push_str(&format!(
                ", and this request may need up to {} more",
                self.show(estimate)
            ));
        }
        GatewayError::new(ErrorKind::BudgetExhausted, message).with_code("budget_exhausted")
    }
}

/// How long an unused counter is kept: its period plus a day; a lifetime budget's for
/// [`LIFETIME_IDLE_DAYS`]. Expiry is safe: a counter made again starts from what the control
/// plane counted (every settlement is charged to it), and it ends any reservation whose
/// settlement was lost.
fn ttl_of(limit: &UsageLimit) -> Option<Duration> {
    let days = match (limit.periodic_reset_days, limit.periodic_reset) {
        (Some(days), _) => u64::from(days.max(1)),
        (None, Some(PeriodicReset::Weekly)) => 7,
        (None, Some(PeriodicReset::Monthly)) => 31,
        (None, None) => return Some(Duration::from_secs(LIFETIME_IDLE_DAYS * DAY)),
    };
    Some(Duration::from_secs(days * DAY) + TTL_MARGIN)
}

/// The single target provider selection chose, if it chose one.
fn planned_target(cx: &RequestCx) -> Option<&Target> {
    match &cx.plan {
        Some(RoutePlan::Single(t)) => Some(t),
        _ => None,
    }
}

/// A target's `override_params.model`.
fn target_model(t: &Target) -> Option<&str> {
    t.override_params.get("model").and_then(|m| m.as_str())
}

/// The request's reservation, for `on_log`: each budget (shared with the settlement, not
/// copied), what it holds, and the request's estimate in its unit (what an answer without
/// usage is charged, even when the store could not be reached and nothing was held).
#[derive(Debug, Clone)]
struct Reservation {
    items: Vec<(Arc<Applied>, f64, f64)>,
}

/// What each of `applied` is asked to hold for one request estimated at `usage`, priced at
/// `cost`.
fn amounts_of(applied: &[Applied], usage: Usage, cost: f64) -> Vec<f64> {
    applied
        .iter()
        .map(|a| a.amount(1.0, Some(usage), Some(cost)))
        .collect()
}

/// Budgets with what each holds and the estimate it was asked to hold.
fn held_items(
    applied: Vec<Applied>,
    reserved: Vec<f64>,
    amounts: &[f64],
) -> Vec<(Arc<Applied>, f64, f64)> {
    applied
        .into_iter()
        .zip(reserved)
        .zip(amounts)
        .map(|((a, r), e)| (Arc::new(a), r, *e))
        .collect()
}

/// The saved provider (slug) of the last upstream attempt.
#[derive(Debug, Clone)]
struct Through(Option<String>);

/// The usage `cx.response.cost` was last computed for.
#[derive(Debug, Clone, Copy)]
struct Priced(Usage);

/// One settlement: each budget and what settles it, in the same order.
struct Settlement {
    applied: Vec<Arc<Applied>>,
    settles: Vec<Settle>,
}

/// The request a budget event names. Built only when an event is raised, except where the
/// settlement outlives the request (a Redis ledger).
#[derive(Clone)]
struct Origin {
    method: String,
    uri: String,
    request_id: String,
    status: u16,
    user_id: Option<String>,
}

impl Origin {
    fn of(cx: &RequestCx, status: u16) -> Origin {
        Origin {
            method: cx.method.as_str().to_owned(),
            uri: cx.path.clone(),
            request_id: cx.trace_id.clone(),
            status,
            user_id: cx
                .extensions
                .get::<Principal>()
                .and_then(|p| p.user_id.clone()),
        }
    }
}

impl Settlement {
    /// The charges for the control plane and, when `used` (each counter after settling) is
    /// known, the alert and exhaustion events not sent yet, naming the request `origin` gives.
    fn report(&self, shared: &Shared, used: Option<&[f64]>, origin: &dyn Fn() -> Origin) -> Report {
        let mut report = Report::default();
        let mut named: Option<Origin> = None;
        for (i, (a, s)) in self.applied.iter().zip(&self.settles).enumerate() {
            if s.actual > 0.0 {
                report.charges.push(UsageCharge {
                    budget_id: a.budget_id.clone(),
                    value_key: a.value_key.clone(),
                    amount: s.actual,
                    period: a.period,
                    reset_epoch: a.reset_epoch,
                });
            }
            let Some(&now_used) = used.and_then(|u| u.get(i)) else {
                continue;
            };
            if let Some(threshold) = a.alert_threshold {
                if now_used >= threshold - EPSILON
                    && shared.first_time(format!("alert|{}|{threshold}", a.key))
                {
                    let o = named.get_or_insert_with(origin);
                    report
                        .events
                        .push(event(o, a, "usage_limits.alert", now_used));
                    shared.metrics.alerts.with_label_values(&["alert"]).inc();
                }
            }
            if now_used >= a.credit_limit - EPSILON
                && shared.first_time(format!("exhausted|{}|{}", a.key, a.credit_limit))
            {
                let o = named.get_or_insert_with(origin);
                report
                    .events
                    .push(event(o, a, "usage_limits.exhausted", now_used));
                shared
                    .metrics
                    .alerts
                    .with_label_values(&["exhausted"])
                    .inc();
            }
        }
        report
    }
}

/// The audit event `action` of budget `a`, now at `used`, raised by the request `o`.
fn event(o: &Origin, a: &Applied, action: &str, used: f64) -> AuditEvent {
    AuditEvent {
        action: action.into(),
        resource_type: a.owner.resource_type.into(),
        resource_id: Some(a.owner.resource_id.clone()),
        organisation_id: a.owner.organisation_id.clone(),
        workspace_id: a.owner.workspace_id.clone(),
        user_id: o.user_id.clone(),
        method: o.method.clone(),
        uri: o.uri.clone(),
        request_id: o.request_id.clone(),
        status: o.status,
        client_ip: None,
        details: json!({
            "budget_id": a.budget_id,
            // `entity`, not `value_key`: the audit log redacts fields named like `*key`.
            "entity": a.value_key,
            "type": a.unit(),
            "current_usage": used,
            "credit_limit": a.credit_limit,
            "alert_threshold": a.alert_threshold,
            "period": a.period,
            "reset_epoch": a.reset_epoch,
        }),
    }
}

/// One request's settlement, waiting for the background task.
struct SettleJob {
    settlement: Settlement,
    origin: Origin,
}

/// Settles a batch of requests in one script call (one round trip), retrying a failure; then
/// hands each one's charges and events to the report writer. The settlements of one counter
/// are summed into one (a busy budget is settled once per batch, not once per request); each
/// request's events see the counter as the whole batch left it. The batch's token makes a
/// retry after a lost reply change nothing.
async fn settle_batch(shared: Arc<Shared>, key_prefix: String, jobs: Vec<SettleJob>) {
    let mut summed: Vec<Settle> = Vec::new();
    // For each job's settlement, in order, the index of its counter in `summed`.
    let mut at: Vec<usize> = Vec::new();
    for s in jobs.iter().flat_map(|j| &j.settlement.settles) {
        match summed.iter().position(|t| t.key == s.key) {
            Some(i) => {
                summed[i].actual += s.actual;
                summed[i].reserved += s.reserved;
                at.push(i);
            }
            None => {
                at.push(summed.len());
                summed.push(s.clone());
            }
        }
    }
    // One call for the batch; in a Redis Cluster one per hash tag (the keys of one call must
    // share a slot), each with a token of that tag.
    let cluster = shared.ledger.redis().is_some_and(|r| r.conn().is_cluster());
    let mut groups: Vec<(&str, Vec<usize>)> = Vec::new();
    for (i, s) in summed.iter().enumerate() {
        let tag = if cluster { tag_of(&s.key) } else { "" };
        match groups.iter_mut().find(|(t, _)| *t == tag) {
            Some((_, members)) => members.push(i),
            None => groups.push((tag, vec![i])),
        }
    }
    let mut result: Result<Vec<f64>, String> = Ok(vec![0.0; summed.len()]);
    for (tag, members) in &groups {
        let token = match *tag {
            "" => format!("{key_prefix}settled:{}", uuid::Uuid::new_v4()),
            tag => format!(
                "{key_prefix}{}settled:{}",
                hash_tag(tag),
                uuid::Uuid::new_v4()
            ),
        };
        let items: Vec<Settle> = members.iter().map(|&i| summed[i].clone()).collect();
        let mut settled = shared.ledger.settle(&token, &items).await;
        for wait in SETTLE_RETRIES {
            if settled.is_ok() {
                break;
            }
            tokio::time::sleep(wait).await;
            settled = shared.ledger.settle(&token, &items).await;
        }
        match (settled, &mut result) {
            (Ok(used), Ok(all)) => {
                for (&i, u) in members.iter().zip(used) {
                    all[i] = u;
                }
            }
            (Err(e), _) => result = Err(e),
            (Ok(_), Err(_)) => {}
        }
    }
    let used = match result {
        Ok(used) => Some(used),
        Err(e) => {
            shared
                .metrics
                .backend_errors
                .with_label_values(&["settle"])
                .inc();
            tracing::error!(target: "gateway::usage_limit", error = %e, requests = jobs.len(),
                "budget settlements failed; their reservations stay until the counters expire");
            None
        }
    };
    let mut next = at.into_iter();
    for job in &jobs {
        let mine: Option<Vec<f64>> = used.as_ref().map(|used| {
            (&mut next)
                .take(job.settlement.settles.len())
                .map(|i| used.get(i).copied().unwrap_or(0.0))
                .collect()
        });
        let report = job
            .settlement
            .report(&shared, mine.as_deref(), &|| job.origin.clone());
        shared.hand_over(report);
    }
}

/// Waits before each retry of a Redis settlement (a lost one would hold its reservation
/// until the counter expires).
const SETTLE_RETRIES: [Duration; 3] = [
    Duration::from_millis(100),
    Duration::from_secs(1),
    Duration::from_secs(5),
];

#[async_trait]
impl Plugin for UsageLimitPlugin {
    fn kind(&self) -> &'static str {
        UsageLimitFactory::KIND
    }

    fn phases(&self) -> Phases {
        Phases::REQUEST | Phases::ROUTE | Phases::RESPONSE | Phases::CHUNK | Phases::LOG
    }

    /// A Redis ledger reserves in the same script call as the rate limit's check.
    fn joins_deferred(&self) -> bool {
        self.shared.ledger.redis().is_some()
    }

    async fn on_request(&self, cx: &mut RequestCx) -> Result<Flow, GatewayError> {
        let now = (self.clock)();
        let applied = self.applicable(cx, now);
        if applied.is_empty() {
            return Ok(Flow::Continue);
        }
        let usage = self.estimate(cx);
        let cost = if applied.iter().any(|a| a.kind == UsageKind::Cost) {
            self.price_estimate(cx, usage)?
        } else {
            0.0
        };
        let amounts = amounts_of(&applied, usage, cost);
        if let Some(redis) = self.shared.ledger.redis() {
            // Joins the rate limit's check in one round trip (see limits::admission).
            let call = RedisLedger::prepare(&UsageLimitPlugin::holds(&applied, &amounts));
            let (shared, on_error) = (self.shared.clone(), self.on_backend_error);
            let mut admission = Admission::join(cx, redis.conn()).await?;
            admission.set_budget(
                call,
                Box::new(move |cx, reply| {
                    let outcome = reply
                        .and_then(|reply| RedisLedger::outcome(applied.len(), &reply))
                        .map_err(|e| format!("Redis budget reservation failed: {e}"));
                    let reserved =
                        shared.conclude_reserve(on_error, &applied, &amounts, outcome)?;
                    cx.extensions.insert(Reservation {
                        items: held_items(applied, reserved, &amounts),
                    });
                    Ok(())
                }),
            );
            cx.deferred = Some(Box::new(admission));
            return Ok(Flow::Continue);
        }
        let reserved = self.reserve(&applied, &amounts).await?;
        cx.extensions.insert(Reservation {
            items: held_items(applied, reserved, &amounts),
        });
        Ok(Flow::Continue)
    }

    async fn on_route(
        &self,
        cx: &mut RequestCx,
        target: &mut Target,
    ) -> Result<Flow, GatewayError> {
        cx.extensions.insert(Through(target.slug.clone()));
        let Some(slug) = target.slug.as_deref() else {
            return Ok(Flow::Continue);
        };
        // Each held once per request: provider selection named this provider, or an earlier
        // attempt (a retry, another provider of the same integration) held it. One held for
        // another provider of the integration is now spent through this one.
        let mut applied =
            self.provider_budgets(slug, cx.extensions.get::<Principal>(), (self.clock)());
        if let Some(held) = cx.extensions.get_mut::<Reservation>() {
            applied.retain(|a| {
                let Some(item) = held.items.iter_mut().find(|(h, _, _)| h.key == a.key) else {
                    return true;
                };
                if item.0.through != a.through {
                    Arc::make_mut(&mut item.0).through = a.through.clone();
                }
                false
            });
        }
        if applied.is_empty() {
            return Ok(Flow::Continue);
        }
        let usage = self.estimate(cx);
        let cost = if applied.iter().any(|a| a.kind == UsageKind::Cost) {
            let model = target_model(target).or(cx.requested_model());
            self.cost_or_refuse(Some(slug), &target.provider, model, usage, cx)?
        } else {
            0.0
        };
        let amounts = amounts_of(&applied, usage, cost);
        let reserved = self.reserve(&applied, &amounts).await?;
        let items = applied
            .into_iter()
            .zip(reserved)
            .zip(amounts)
            .map(|((a, r), amount)| (Arc::new(a), r, amount));
        match cx.extensions.get_mut::<Reservation>() {
            Some(r) => r.items.extend(items),
            None => {
                cx.extensions.insert(Reservation {
                    items: items.collect(),
                });
            }
        }
        Ok(Flow::Continue)
    }

    async fn on_response(
        &self,
        cx: &mut RequestCx,
        _response: &mut ResponseParts,
    ) -> Result<Flow, GatewayError> {
        self.note_cost(cx);
        Ok(Flow::Continue)
    }

    fn on_chunk(&self, cx: &mut RequestCx, _chunk: &mut Chunk) -> Result<Flow, GatewayError> {
        self.note_cost(cx);
        Ok(Flow::Continue)
    }

    fn on_log(&self, cx: &RequestCx) {
        let Some(reservation) = cx.extensions.get::<Reservation>() else {
            return;
        };
        let status = cx.response.status.unwrap_or(0);
        let succeeded = (200..300).contains(&status);
        // A cached answer cost no tokens; it is still a request.
        let cache_hit = cx
            .response
            .cache_status
            .is_some_and(|s| s.eq_ignore_ascii_case("hit"));
        let mut usage = if cache_hit { None } else { cx.response.usage };
        // A stream that ended without the provider's final usage (the client left, the
        // provider dropped it or does not report usage) is charged at least the prompt's
        // estimate and the text it relayed.
        let cut_short = cx.response.usage.is_none() || cx.response.error.is_some();
        if succeeded && !cache_hit && cx.response.streamed && cut_short {
            let reported = usage.unwrap_or_default();
            usage = Some(Usage {
                prompt_tokens: reported.prompt_tokens.max(self.estimate(cx).prompt_tokens),
                completion_tokens: reported
                    .completion_tokens
                    .max(cx.response.relayed_text_chars.div_ceil(4)),
            });
        }
        // Any other answer without usage (or whose model has no price, under a cost budget)
        // is charged what was reserved for it: nothing settles at zero by accident.
        let unmeasured = succeeded && !cache_hit && usage.is_none();
        // `note_cost` priced this usage already when it saw the answer; an unpriced model
        // is not looked up a second time.
        let priced = cx
            .extensions
            .get::<Priced>()
            .is_some_and(|p| Some(p.0) == usage);
        let cost = usage.and_then(|u| match cx.response.cost {
            Some(cost) => Some(cost),
            None if priced => None,
            None => self.price_answer(cx, u),
        });
        let requests = if succeeded { 1.0 } else { 0.0 };
        let through = cx.extensions.get::<Through>().and_then(|t| t.0.as_deref());
        let settlement = Settlement {
            applied: reservation
                .items
                .iter()
                .map(|(a, _, _)| a.clone())
                .collect(),
            settles: reservation
                .items
                .iter()
                .map(|(a, reserved, estimate)| {
                    // A provider's budget counts only what was spent through it.
                    let spent_here = a.through.as_deref().is_none_or(|s| through == Some(s));
                    let unpriced = a.kind == UsageKind::Cost && cost.is_none();
                    Settle {
                        key: a.key.clone(),
                        seed: a.seed,
                        actual: match spent_here {
                            false => 0.0,
                            true if succeeded && !cache_hit && (unmeasured || unpriced) => {
                                estimate.max(a.amount(requests, usage, cost))
                            }
                            true => a.amount(requests, usage, cost),
                        },
                        reserved: *reserved,
                        ttl: a.ttl,
                    }
                })
                .collect(),
        };
        if let Some(result) = self.shared.ledger.settle_now(&settlement.settles) {
            let used = match result {
                Ok(used) => Some(used),
                Err(e) => {
                    self.shared.warn_backend("settle", &e);
                    None
                }
            };
            let report =
                settlement.report(&self.shared, used.as_deref(), &|| Origin::of(cx, status));
            self.shared.hand_over(report);
            return;
        }
        let job = SettleJob {
            settlement,
            origin: Origin::of(cx, status),
        };
        match &self.settlements {
            Some(queue) if queue.send(job) => {}
            _ => {
                self.shared
                    .metrics
                    .dropped
                    .with_label_values(&["settlement"])
                    .inc();
                tracing::warn!(target: "gateway::usage_limit",
                    "the settlement queue is full; the reservation stays until its counter expires");
            }
        }
    }
}
