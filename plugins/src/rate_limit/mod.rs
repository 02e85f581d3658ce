//! `rate_limit`: refuses requests beyond the caller's rate limits with a 429.
//!
//! Runs in `on_request`, after `auth` (which puts the [`Principal`] in the request's extensions)
//! and `provider_select` (whose plan `provider`, `virtual_key` and `model@provider` conditions
//! read). The limits that apply to a request are:
//!
//! - the Principal's `rate_limits`: the API key's (or the JWT's) and its workspace's, each with
//!   its counter id (`api_key:<id>:<n>`, `workspace:<id>:<n>`, `jwt:<subject>:<n>`);
//! - every active rate limits policy of the request's workspace whose `conditions` match the
//!   request (see [`crate::limits::matching`]), counted per `group_by` combination: counter
//!   `policy:<policy id>:<value key>`. A `group_by` key the request has no value for counts
//!   as the empty value (every such request shares that counter);
//! - the own `rate_limits` of the saved provider the request goes through, read from the
//!   provider store ([`BuildCx::providers`]; saved through the control plane, YAML providers
//!   have none): counters `provider:<slug>:<n>`, shared by every caller of that provider.
//!   Checked in `on_request` when provider selection named the provider (`@slug`, a virtual
//!   key, or a config whose top level says `provider: "@slug"` / `virtual_key`); otherwise in
//!   `on_route`, for each attempt through a saved provider whose limits this request has not
//!   been counted against yet (a config target chosen by the router). With them, the limits
//!   the provider's organisation integration sets on its workspace
//!   (`PUT /v1/integrations/{slug}/workspaces`): counters `integration:<id>:<workspace>:<n>`,
//!   shared by the workspace's requests through every provider of that integration. A refusal there is an
//!   attempt's failure: a fallback group tries its next target (by default), loadbalance and
//!   conditional routing answer the 429. A provider's limits count a request once, however
//!   many attempts (retries) go through it, and its token limits are charged only when the
//!   answer came through it.
//!
//! Each counter is a sliding window (`rpm`, `rph`, `rpd`; see [`crate::limits::window`]), so a
//! limit cannot be doubled at a window edge. A `requests` limit is checked and charged 1 at
//! once; a `tokens` limit refuses while its window is spent and is charged the provider's
//! reported usage (prompt + completion tokens) in `on_log`, in the background. All the
//! request's counters are checked and charged together: if one refuses, none is charged.
//! A request refused by a later plugin or the provider still counted as a request.
//!
//! A refusal is a 429 with `retry-after` (whole seconds, at least 1: when every refusing
//! window would allow the request again) and a body naming the limit:
//! `{"error":{"message":"Rate limit exceeded: policy <name or id> allows 10 requests per
//! minute","type":"rate_limit_error","param":null,"code":"rate_limit_exceeded"}}`.
//!
//! Counters live in process ([`memory::MemoryCounters`]) or in Redis
//! ([`redis::RedisCounters`], one atomic script per request, shared by every instance); see
//! [`RateLimitConfig`]. When the backend fails, `on_backend_error` lets the request through
//! (default) or refuses it with a 429 whose code is `rate_limit_backend_unavailable`; errors are
//! counted and logged (the first, then one in [`LOG_EVERY`]).
//!
//! Metrics (no ids in labels):
//! - `gw_rate_limit_checks_total{outcome="allowed|limited|error"}`: checks of requests that had
//!   at least one limit (plus one per `on_route` check of a provider's limits);
//! - `gw_rate_limit_rejections_total{scope="policy|api_key|workspace|jwt|provider|integration|other"}`:
//!   429s by the kind of limit that refused;
//! - `gw_rate_limit_backend_errors_total{op="check|charge"}`.

pub mod config;
pub mod counters;
pub mod memory;
pub mod redis;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwapOption;
use async_trait::async_trait;
use prometheus::{IntCounter, IntCounterVec, Opts};

use plugin_sdk::access::{RateLimit, RateLimitKind, RateLimitPolicy, RateUnit};
use plugin_sdk::{
    AccessStore, BuildCx, ConfigIssue, ErrorKind, Flow, GatewayError, Phases, Plugin,
    PluginFactory, Principal, ProviderStore, RequestCx, Target,
};

use crate::limits::admission::Admission;
use crate::limits::matching::{in_workspace, matches, value_key, Subject};
use crate::limits::redis::{hash_tag, org_tag, RedisConn};
pub use config::{Backend, OnBackendError, RateLimitConfig};
pub use counters::{CounterError, CounterSpec, Counters, Decision};

/// Backend errors are logged the first time, then once in this many.
pub const LOG_EVERY: u64 = 100;

pub struct RateLimitFactory;

impl PluginFactory for RateLimitFactory {
    const KIND: &'static str = "rate_limit";
    const SUMMARY: &'static str =
        "Enforces key, workspace and policy rate limits (requests or tokens per minute, hour, day) with 429";
    const EXAMPLE: &'static str = "- kind: rate_limit\n  backend: auto            # memory | redis (auto: redis when GW_REDIS_URL is set)\n  on_backend_error: allow  # or deny\n  max_counters: 1000000";
    type Config = RateLimitConfig;

    fn validate(config: &Self::Config) -> Vec<ConfigIssue> {
        config.issues()
    }

    fn build(config: Self::Config, cx: &BuildCx) -> Result<Arc<dyn Plugin>, String> {
        Ok(Arc::new(RateLimiter::new(&config, cx)?))
    }
}

plugin_sdk::register_plugin!(RateLimitFactory);

/// The kind of limit a counter belongs to (the `scope` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    Policy,
    ApiKey,
    Workspace,
    Jwt,
    Provider,
    Integration,
    Other,
}

impl Scope {
    const ALL: [Scope; 7] = [
        Scope::Policy,
        Scope::ApiKey,
        Scope::Workspace,
        Scope::Jwt,
        Scope::Provider,
        Scope::Integration,
        Scope::Other,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Scope::Policy => "policy",
            Scope::ApiKey => "api_key",
            Scope::Workspace => "workspace",
            Scope::Jwt => "jwt",
            Scope::Provider => "provider",
            Scope::Integration => "integration",
            Scope::Other => "other",
        }
    }

    /// The scope of a Principal's counter, from its id's prefix.
    fn of_id(id: &str) -> Scope {
        match id.split_once(':').map(|(p, _)| p) {
            Some("api_key") => Scope::ApiKey,
            Some("workspace") => Scope::Workspace,
            Some("jwt") => Scope::Jwt,
            Some("provider") => Scope::Provider,
            Some("integration") => Scope::Integration,
            _ => Scope::Other,
        }
    }
}

/// Where one of a request's limits came from.
#[derive(Debug, Clone, Copy)]
enum Source {
    /// A limit with a scoped counter id: the Principal's own (`api_key:`, `workspace:`,
    /// `jwt:`) or a saved provider's (`provider:<slug>:<n>`).
    Principal(Scope),
    /// A policy, by its index in the [`PolicyIndex`].
    Policy(usize),
}

/// The active policies, by workspace; rebuilt when the access store hands out a new list.
struct PolicyIndex {
    policies: Arc<[RateLimitPolicy]>,
    by_workspace: HashMap<String, Vec<usize>>,
}

impl PolicyIndex {
    fn new(policies: Arc<[RateLimitPolicy]>) -> PolicyIndex {
        let mut by_workspace: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, p) in policies.iter().enumerate() {
            by_workspace
                .entry(p.workspace_id.clone())
                .or_default()
                .push(i);
        }
        PolicyIndex {
            policies,
            by_workspace,
        }
    }
}

/// The limits of one request: counters to check, and where each came from.
struct Applicable {
    /// The hash tag every counter id of the request starts with (see [`Applicable::of`]).
    tag: String,
    specs: Vec<CounterSpec>,
    sources: Vec<(Source, RateLimit)>,
    index: Option<Arc<PolicyIndex>>,
    /// The saved provider whose limits (its own, its integration's) were added.
    provider: Option<String>,
}

impl Applicable {
    /// No limits yet for the request of `who`. Every counter id starts with the hash tag of
    /// the organisation that owns the counter ([`org_tag`]): the caller's, which also owns
    /// the saved providers it may use, so in a Redis Cluster a request's counters share one
    /// slot and one script call checks them all.
    fn of(who: Option<&Principal>) -> Applicable {
        let tag = org_tag(who.and_then(|p| p.organisation_id.as_deref()));
        Applicable {
            tag: hash_tag(tag),
            specs: Vec::new(),
            sources: Vec::new(),
            index: None,
            provider: None,
        }
    }

    fn push(&mut self, id: String, limit: RateLimit, source: Source) {
        let id = format!("{}{id}", self.tag);
        self.push_id(id, limit, source);
    }

    /// Adds a counter whose id already carries its tag.
    fn push_id(&mut self, id: String, limit: RateLimit, source: Source) {
        // A limit of no number cannot be enforced; the control plane refuses one on input.
        if !limit.value.is_finite() || self.specs.iter().any(|s| s.id == id) {
            return;
        }
        self.specs.push(CounterSpec {
            id,
            window_secs: limit.unit.window_secs(),
            limit: limit.value,
            cost: match limit.kind {
                RateLimitKind::Requests => 1,
                RateLimitKind::Tokens => 0,
            },
        });
        self.sources.push((source, limit));
    }

    /// Takes out the counters with these ids.
    fn remove(&mut self, ids: &[String]) {
        let mut i = 0;
        while i < self.specs.len() {
            if ids.contains(&self.specs[i].id) {
                self.specs.remove(i);
                self.sources.remove(i);
            } else {
                i += 1;
            }
        }
    }

    /// Who set the limit, for the refusal's message.
    fn who(&self, i: usize) -> String {
        match self.sources[i].0 {
            Source::Principal(Scope::ApiKey) => "the API key's rate limit".to_owned(),
            Source::Principal(Scope::Workspace) => "the workspace's rate limit".to_owned(),
            Source::Principal(Scope::Jwt) => "the token's rate limit".to_owned(),
            Source::Principal(Scope::Provider) => "the provider's rate limit".to_owned(),
            Source::Principal(Scope::Integration) => {
                "the integration's rate limit for this workspace".to_owned()
            }
            Source::Principal(_) => "a rate limit".to_owned(),
            Source::Policy(p) => {
                let policy = self.index.as_ref().map(|ix| &ix.policies[p]);
                let name = policy.and_then(|p| p.name.as_deref().filter(|n| !n.trim().is_empty()));
                format!(
                    "policy {}",
                    name.or(policy.map(|p| p.id.as_str())).unwrap_or("?")
                )
            }
        }
    }

    fn scope(&self, i: usize) -> Scope {
        match self.sources[i].0 {
            Source::Principal(s) => s,
            Source::Policy(_) => Scope::Policy,
        }
    }
}

/// Token limits to charge once the response's usage is known.
#[derive(Debug, Clone)]
struct TokenCharges(Vec<TokenCharge>);

#[derive(Debug, Clone)]
struct TokenCharge {
    id: String,
    window_secs: u64,
    /// A saved provider's limit: charged only when the answer came through this slug.
    through: Option<String>,
}

/// The saved providers whose own limits this request was counted against (once per request).
#[derive(Debug, Clone, Default)]
struct ProvidersCounted(Vec<String>);

/// The integration limits (counter ids) this request was counted against: once per request,
/// whichever providers of the integration its attempts go through.
#[derive(Debug, Clone, Default)]
struct IntegrationsCounted(Vec<String>);

/// The saved provider (slug) of the last upstream attempt.
#[derive(Debug, Clone)]
struct RoutedThrough(Option<String>);

/// The slug of a saved provider's counter id, `{<tag>}provider:<slug>:<n>`.
fn provider_of_id(id: &str) -> Option<&str> {
    let untagged = match id.strip_prefix('{') {
        Some(rest) => rest.split_once('}').map_or(id, |(_, after)| after),
        None => id,
    };
    let rest = untagged.strip_prefix("provider:")?;
    rest.rsplit_once(':').map(|(slug, _)| slug)
}

struct RateMetrics {
    allowed: IntCounter,
    limited: IntCounter,
    error: IntCounter,
    rejections: IntCounterVec,
    check_errors: IntCounter,
    charge_errors: IntCounter,
}

impl RateMetrics {
    fn register(registry: &prometheus::Registry) -> Result<RateMetrics, String> {
        let checks = IntCounterVec::new(
            Opts::new(
                "gw_rate_limit_checks_total",
                "Requests whose rate limits were checked, by outcome",
            ),
            &["outcome"],
        )
        .map_err(|e| e.to_string())?;
        let rejections = IntCounterVec::new(
            Opts::new(
                "gw_rate_limit_rejections_total",
                "Requests refused with 429 by a rate limit, by the kind of limit",
            ),
            &["scope"],
        )
        .map_err(|e| e.to_string())?;
        let backend_errors = IntCounterVec::new(
            Opts::new(
                "gw_rate_limit_backend_errors_total",
                "Rate limit counter backend failures, by operation",
            ),
            &["op"],
        )
        .map_err(|e| e.to_string())?;
        for c in [&checks, &rejections, &backend_errors] {
            registry.register(Box::new(c.clone())).map_err(|e| {
                format!("cannot register rate limit metrics (is `rate_limit` listed twice?): {e}")
            })?;
        }
        // Every label value exists from the start, so a dashboard sees zeros, not gaps.
        for s in Scope::ALL {
            rejections.with_label_values(&[s.as_str()]);
        }
        Ok(RateMetrics {
            allowed: checks.with_label_values(&["allowed"]),
            limited: checks.with_label_values(&["limited"]),
            error: checks.with_label_values(&["error"]),
            rejections,
            check_errors: backend_errors.with_label_values(&["check"]),
            charge_errors: backend_errors.with_label_values(&["charge"]),
        })
    }
}

/// What the request path and the background charges share.
struct Shared {
    counters: Arc<dyn Counters>,
    metrics: RateMetrics,
    errors: AtomicU64,
}

impl Shared {
    /// Counts a backend error and logs the first and then one in [`LOG_EVERY`].
    fn backend_error(&self, op: &'static str, e: &CounterError) {
        match op {
            "check" => self.metrics.check_errors.inc(),
            _ => self.metrics.charge_errors.inc(),
        }
        let n = self.errors.fetch_add(1, Ordering::Relaxed) + 1;
        if n == 1 || n.is_multiple_of(LOG_EVERY) {
            tracing::warn!(
                target: "gateway::rate_limit",
                backend = self.counters.name(),
                op,
                errors_so_far = n,
                error = %e,
                "rate limit backend error (logged once per {LOG_EVERY})"
            );
        }
    }
}

/// The `rate_limit` plugin.
pub struct RateLimiter {
    shared: Arc<Shared>,
    access: Arc<dyn AccessStore>,
    /// Saved providers, for their own limits.
    providers: Arc<dyn ProviderStore>,
    on_error: OnBackendError,
    index: ArcSwapOption<PolicyIndex>,
}

impl RateLimiter {
    /// Builds the plugin with the backend its config (and `cx.redis_url`) chooses. Opens no
    /// connection: Redis is connected on first use.
    pub fn new(config: &RateLimitConfig, cx: &BuildCx) -> Result<RateLimiter, String> {
        let use_redis = match config.backend {
            Backend::Memory => false,
            Backend::Redis => true,
            Backend::Auto => cx.redis_url.is_some(),
        };
        // Token charges given up in the background are counted once the metrics exist.
        let lost_to: Arc<OnceLock<Weak<Shared>>> = Arc::default();
        let counters: Arc<dyn Counters> = if use_redis {
            let url = cx.redis_url.as_deref().ok_or(
                "backend: redis needs the gateway's Redis URL (GW_REDIS_URL), and none is set",
            )?;
            let conn = RedisConn::shared(url, Duration::from_millis(config.redis_timeout_ms))?;
            let slot = lost_to.clone();
            Arc::new(redis::RedisCounters::new(
                conn,
                config.redis_prefix.clone(),
                move |e| {
                    if let Some(shared) = slot.get().and_then(Weak::upgrade) {
                        shared.backend_error("charge", e);
                    }
                },
            )?)
        } else {
            Arc::new(memory::MemoryCounters::new(config.max_counters))
        };
        let limiter = RateLimiter::with_counters(config, cx, counters)?;
        let _ = lost_to.set(Arc::downgrade(&limiter.shared));
        Ok(limiter)
    }

    /// Builds the plugin over the given counters (tests, embedders).
    pub fn with_counters(
        config: &RateLimitConfig,
        cx: &BuildCx,
        counters: Arc<dyn Counters>,
    ) -> Result<RateLimiter, String> {
        Ok(RateLimiter {
            shared: Arc::new(Shared {
                counters,
                metrics: RateMetrics::register(&cx.metrics)?,
                errors: AtomicU64::new(0),
            }),
            access: cx.access.clone(),
            providers: cx.providers.clone(),
            on_error: config.on_backend_error,
            index: ArcSwapOption::empty(),
        })
    }

    /// The backend's name (`memory`, `redis`).
    pub fn backend(&self) -> &'static str {
        self.shared.counters.name()
    }

    /// The active policies by workspace, rebuilt only when the store's list changed (the
    /// store hands out the same `Arc` until then).
    fn policies(&self) -> Option<Arc<PolicyIndex>> {
        let policies = self.access.rate_limit_policies();
        if policies.is_empty() {
            return None;
        }
        if let Some(cached) = self.index.load().as_ref() {
            if Arc::ptr_eq(&cached.policies, &policies) {
                return Some(cached.clone());
            }
        }
        let built = Arc::new(PolicyIndex::new(policies));
        self.index.store(Some(built.clone()));
        Some(built)
    }

    /// The limits that apply to this request.
    fn applicable(&self, cx: &RequestCx) -> Applicable {
        let mut out = Applicable::of(cx.extensions.get::<Principal>());
        if let Some(p) = cx.extensions.get::<Principal>() {
            for rl in &p.rate_limits {
                out.push(
                    rl.id.clone(),
                    rl.limit,
                    Source::Principal(Scope::of_id(&rl.id)),
                );
            }
        }
        let subject = Subject::of(cx);
        // The saved provider that provider selection named (`virtual_key` is its slug).
        if let Some(slug) = subject.virtual_key {
            self.push_provider(&mut out, slug, cx.extensions.get::<Principal>());
        }
        let Some(workspace) = subject.workspace_id else {
            return out;
        };
        let Some(index) = self.policies() else {
            return out;
        };
        for &i in index.by_workspace.get(workspace).into_iter().flatten() {
            let policy = &index.policies[i];
            if !in_workspace(&policy.workspace_id, &subject)
                || !matches(&policy.conditions, &subject)
            {
                continue;
            }
            let key = value_key(&policy.group_by, &subject);
            out.push(
                format!("policy:{}:{}", policy.id, key),
                policy.limit,
                Source::Policy(i),
            );
        }
        out.index = Some(index);
        out
    }

    /// Adds the own limits of the saved provider `slug`, and those its organisation
    /// integration sets on its workspace, if the provider store knows it.
    fn push_provider(&self, out: &mut Applicable, slug: &str, who: Option<&Principal>) {
        let Some(record) = self.providers.provider_for(slug, who) else {
            return;
        };
        // Tagged with the provider's owner: every caller of the provider counts on it.
        let owner = record.owner.as_ref().map(|o| o.organisation_id.as_str());
        let tag = hash_tag(org_tag(owner));
        for (i, limit) in record.rate_limits.iter().enumerate() {
            out.push_id(
                format!("{tag}provider:{slug}:{i}"),
                *limit,
                Source::Principal(Scope::Provider),
            );
        }
        for limit in record
            .integration_limits
            .iter()
            .flat_map(|l| &l.rate_limits)
        {
            out.push_id(
                format!("{tag}{}", limit.id),
                limit.limit,
                Source::Principal(Scope::Integration),
            );
        }
        out.provider = Some(slug.to_owned());
    }

    /// Checks and charges `applicable` (not empty) now: see [`conclude`].
    async fn enforce(
        &self,
        cx: &mut RequestCx,
        applicable: Applicable,
    ) -> Result<Flow, GatewayError> {
        let result = self
            .shared
            .counters
            .check_and_charge(&applicable.specs, now_ms())
            .await;
        conclude(&self.shared, self.on_error, cx, applicable, result)?;
        Ok(Flow::Continue)
    }

    /// Leaves the check of `applicable` (not empty) to shared mode's admission, which
    /// `usage_limit` may join (see [`crate::limits::admission`]).
    async fn defer(
        &self,
        cx: &mut RequestCx,
        redis: &redis::RedisCounters,
        applicable: Applicable,
    ) -> Result<Flow, GatewayError> {
        let now = now_ms();
        let call = redis.prepare(&applicable.specs, now);
        let (shared, on_error) = (self.shared.clone(), self.on_error);
        let mut admission = Admission::join(cx, redis.conn()).await?;
        admission.set_rate(
            call,
            Box::new(move |cx, reply| {
                let result = reply.map_err(CounterError).and_then(|reply| {
                    redis::RedisCounters::decision(&applicable.specs, now, &reply)
                });
                conclude(&shared, on_error, cx, applicable, result)
            }),
        );
        cx.deferred = Some(Box::new(admission));
        Ok(Flow::Continue)
    }
}

/// Applies the outcome of the check of `applicable`: a 429 when a counter refused (or the
/// backend failed and `on_error` denies); else notes its token limits for `on_log` and the
/// providers it counted.
fn conclude(
    shared: &Shared,
    on_error: OnBackendError,
    cx: &mut RequestCx,
    applicable: Applicable,
    result: Result<Decision, CounterError>,
) -> Result<(), GatewayError> {
    let metrics = &shared.metrics;
    match result {
        Ok(Decision::Allowed) => metrics.allowed.inc(),
        Ok(Decision::Limited {
            spec,
            retry_after_secs,
        }) => {
            metrics.limited.inc();
            metrics
                .rejections
                .with_label_values(&[applicable.scope(spec).as_str()])
                .inc();
            let message = format!(
                "Rate limit exceeded: {} allows {}",
                applicable.who(spec),
                rate_text(&applicable.sources[spec].1)
            );
            return Err(GatewayError::new(
                ErrorKind::RateLimited {
                    retry_after_secs: retry_after_secs.max(1),
                },
                message,
            )
            .with_code("rate_limit_exceeded"));
        }
        Ok(Decision::Full { max_counters }) => {
            metrics.limited.inc();
            metrics.rejections.with_label_values(&["other"]).inc();
            return Err(GatewayError::new(
                ErrorKind::RateLimited {
                    retry_after_secs: 60,
                },
                format!(
                    "Rate limit could not be counted: the gateway's rate limit counters are full \
                     ({max_counters}); raise the rate_limit plugin's max_counters"
                ),
            )
            .with_code("rate_limit_counters_full"));
        }
        Err(e) => {
            metrics.error.inc();
            shared.backend_error("check", &e);
            if on_error == OnBackendError::Deny {
                return Err(GatewayError::new(
                    ErrorKind::RateLimited {
                        retry_after_secs: 1,
                    },
                    "Rate limit could not be checked (the counter store is unavailable); \
                         retry shortly",
                )
                .with_code("rate_limit_backend_unavailable"));
            }
        }
    }
    let mut counted: Vec<String> = Vec::new();
    let mut integrations: Vec<String> = Vec::new();
    let mut tokens: Vec<TokenCharge> = Vec::new();
    for (i, spec) in applicable.specs.into_iter().enumerate() {
        let through = match applicable.sources[i].0 {
            Source::Principal(Scope::Provider) => provider_of_id(&spec.id).map(str::to_owned),
            Source::Principal(Scope::Integration) => {
                integrations.push(spec.id.clone());
                applicable.provider.clone()
            }
            _ => None,
        };
        if let Some(slug) = &through {
            if !counted.contains(slug) {
                counted.push(slug.clone());
            }
        }
        if spec.cost == 0 {
            tokens.push(TokenCharge {
                id: spec.id,
                window_secs: spec.window_secs,
                through,
            });
        }
    }
    if !counted.is_empty() {
        match cx.extensions.get_mut::<ProvidersCounted>() {
            Some(c) => c.0.extend(counted),
            None => {
                cx.extensions.insert(ProvidersCounted(counted));
            }
        }
    }
    if !integrations.is_empty() {
        match cx.extensions.get_mut::<IntegrationsCounted>() {
            Some(c) => c.0.extend(integrations),
            None => {
                cx.extensions.insert(IntegrationsCounted(integrations));
            }
        }
    }
    if !tokens.is_empty() {
        match cx.extensions.get_mut::<TokenCharges>() {
            Some(t) => t.0.extend(tokens),
            None => {
                cx.extensions.insert(TokenCharges(tokens));
            }
        }
    }
    Ok(())
}

/// Milliseconds since the Unix epoch by the gateway's clock.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A limit's value as written: `10`, `2.5`.
fn number(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        format!("{x}")
    }
}

/// `10 requests per minute`, `1 token per hour`.
fn rate_text(limit: &RateLimit) -> String {
    let one = limit.value == 1.0;
    let what = match (limit.kind, one) {
        (RateLimitKind::Requests, false) => "requests",
        (RateLimitKind::Requests, true) => "request",
        (RateLimitKind::Tokens, false) => "tokens",
        (RateLimitKind::Tokens, true) => "token",
    };
    let per = match limit.unit {
        RateUnit::Rpm => "minute",
        RateUnit::Rph => "hour",
        RateUnit::Rpd => "day",
    };
    format!("{} {what} per {per}", number(limit.value))
}

#[async_trait]
impl Plugin for RateLimiter {
    fn kind(&self) -> &'static str {
        RateLimitFactory::KIND
    }

    fn phases(&self) -> Phases {
        Phases::REQUEST | Phases::ROUTE | Phases::LOG
    }

    async fn on_request(&self, cx: &mut RequestCx) -> Result<Flow, GatewayError> {
        let applicable = self.applicable(cx);
        if applicable.specs.is_empty() {
            return Ok(Flow::Continue);
        }
        match self.shared.counters.redis() {
            Some(redis) => self.defer(cx, redis, applicable).await,
            None => self.enforce(cx, applicable).await,
        }
    }

    /// Counts the attempt against its saved provider's own limits, unless this request was
    /// already counted against them (provider selection named it, or an earlier attempt).
    async fn on_route(
        &self,
        cx: &mut RequestCx,
        target: &mut Target,
    ) -> Result<Flow, GatewayError> {
        cx.extensions.insert(RoutedThrough(target.slug.clone()));
        let Some(slug) = target.slug.as_deref() else {
            return Ok(Flow::Continue);
        };
        let mut applicable = Applicable::of(cx.extensions.get::<Principal>());
        self.push_provider(&mut applicable, slug, cx.extensions.get::<Principal>());
        // An integration's limits counted for an earlier attempt (through this provider or
        // another of the integration's) are not counted again; its token limits are now spent
        // through this one.
        if let Some(IntegrationsCounted(ids)) = cx.extensions.get::<IntegrationsCounted>() {
            let ids = ids.clone();
            applicable.remove(&ids);
            if let Some(TokenCharges(charges)) = cx.extensions.get_mut::<TokenCharges>() {
                for c in charges.iter_mut().filter(|c| ids.contains(&c.id)) {
                    c.through = Some(slug.to_owned());
                }
            }
        }
        if cx
            .extensions
            .get::<ProvidersCounted>()
            .is_some_and(|c| c.0.iter().any(|s| s == slug))
        {
            return Ok(Flow::Continue);
        }
        if applicable.specs.is_empty() {
            return Ok(Flow::Continue);
        }
        self.enforce(cx, applicable).await
    }

    fn on_log(&self, cx: &RequestCx) {
        let Some(TokenCharges(charges)) = cx.extensions.get::<TokenCharges>() else {
            return;
        };
        let total = cx.response.usage.map(|u| u.total()).unwrap_or(0);
        if total == 0 {
            return;
        }
        let through = cx
            .extensions
            .get::<RoutedThrough>()
            .and_then(|t| t.0.as_deref());
        // A provider's token limit counts only what was spent through it.
        let charges: Vec<TokenCharge> = charges
            .iter()
            .filter(|c| c.through.as_deref().is_none_or(|s| through == Some(s)))
            .cloned()
            .collect();
        if charges.is_empty() {
            return;
        }
        let now = now_ms();
        if let Some(redis) = self.shared.counters.redis() {
            // Queued for the background thread, many per round trip.
            for c in &charges {
                if !redis.charge_later(&c.id, c.window_secs, total, now) {
                    self.shared.backend_error(
                        "charge",
                        &CounterError("the token charge queue is full".to_owned()),
                    );
                }
            }
            return;
        }
        let shared = self.shared.clone();
        // on_log must not block: the charge runs on a task.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    for c in charges {
                        if let Err(e) = shared
                            .counters
                            .charge(&c.id, c.window_secs, total, now)
                            .await
                        {
                            shared.backend_error("charge", &e);
                        }
                    }
                });
            }
            Err(_) => shared.backend_error(
                "charge",
                &CounterError("no async runtime to charge token usage on".to_owned()),
            ),
        }
    }
}
