//! Who may call the gateway and within which limits: the control plane's API keys, workspaces
//! and policies as the data plane reads them (an [`AccessStore`], an in-memory snapshot), and
//! the [`Principal`] the auth plugin attaches to a request for the plugins after it.
//!
//! The limit types deserialize from the control plane's JSON (`{type, unit, value}` and
//! `{credit_limit, type, alert_threshold, periodic_reset, ...}`), so the snapshot and a JWT's
//! claims read them the same way.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What a rate limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RateLimitKind {
    Requests,
    Tokens,
}

/// The window of a rate limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RateUnit {
    /// Per minute.
    Rpm,
    /// Per hour.
    Rph,
    /// Per day.
    Rpd,
}

impl RateUnit {
    /// The window length in seconds.
    pub fn window_secs(self) -> u64 {
        match self {
            RateUnit::Rpm => 60,
            RateUnit::Rph => 3_600,
            RateUnit::Rpd => 86_400,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RateUnit::Rpm => "rpm",
            RateUnit::Rph => "rph",
            RateUnit::Rpd => "rpd",
        }
    }
}

/// A rate limit set on a key, a workspace, a provider or in a JWT: `{type, unit, value}`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RateLimit {
    #[serde(rename = "type")]
    pub kind: RateLimitKind,
    pub unit: RateUnit,
    pub value: f64,
}

/// What a usage limit (budget) counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UsageKind {
    /// Cost in US dollars, from the price table.
    Cost,
    /// Prompt plus completion tokens as the provider reported them.
    Tokens,
    /// Requests.
    Requests,
}

/// When a budget's usage returns to zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PeriodicReset {
    Weekly,
    Monthly,
}

/// A usage limit (budget): `{credit_limit, type, alert_threshold, periodic_reset,
/// periodic_reset_days, next_usage_reset_at}`. Without a reset schedule the budget is for the
/// lifetime of its owner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageLimit {
    pub credit_limit: f64,
    #[serde(rename = "type", default = "UsageLimit::default_kind")]
    pub kind: UsageKind,
    #[serde(default)]
    pub alert_threshold: Option<f64>,
    #[serde(default)]
    pub periodic_reset: Option<PeriodicReset>,
    #[serde(default)]
    pub periodic_reset_days: Option<u32>,
    /// RFC 3339; the first reset, after which the schedule repeats.
    #[serde(default)]
    pub next_usage_reset_at: Option<String>,
}

impl UsageLimit {
    fn default_kind() -> UsageKind {
        UsageKind::Cost
    }

    /// The number of the reset period `now` falls in: usage counted in an earlier period no
    /// longer counts. Periods are UTC: every `periodic_reset_days` days since 1970-01-01,
    /// weeks from Monday, calendar months. With `next_usage_reset_at` the first period ends
    /// then and the schedule repeats from it. Without a schedule: always 0. An unreadable
    /// `next_usage_reset_at` is ignored (the control plane refuses one on input).
    pub fn period_at(&self, now: SystemTime) -> i64 {
        const DAY: i64 = 86_400;
        let now = unix_secs(now);
        let anchor = self
            .next_usage_reset_at
            .as_deref()
            .and_then(crate::time::parse_rfc3339);
        let length = match (self.periodic_reset_days, self.periodic_reset) {
            (Some(days), _) => i64::from(days.max(1)) * DAY,
            (None, Some(PeriodicReset::Weekly)) => 7 * DAY,
            (None, Some(PeriodicReset::Monthly)) => {
                return match anchor {
                    None => crate::time::month_index(now),
                    Some(a) if now < a => 0,
                    Some(a) => 1 + crate::time::whole_months_between(a, now),
                };
            }
            (None, None) => return 0,
        };
        match anchor {
            Some(a) if now < a => 0,
            Some(a) => 1 + (now - a).div_euclid(length),
            // Weeks start on Monday: 1970-01-05 was one.
            None if self.periodic_reset == Some(PeriodicReset::Weekly)
                && self.periodic_reset_days.is_none() =>
            {
                (now - 4 * DAY).div_euclid(length)
            }
            None => now.div_euclid(length),
        }
    }
}

fn unix_secs(t: SystemTime) -> i64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    }
}

/// What the control plane has counted against one budget (or one entity of a policy).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CountedUsage {
    pub current_usage: f64,
    /// The [`UsageLimit::period_at`] the usage was counted in; usage of an earlier period
    /// than the current one counts as zero.
    pub period: i64,
    /// Bumped by each manual reset (`reset_usage`, an entity reset): the data plane's
    /// counters are per epoch, so a reset starts them from zero at once.
    pub reset_epoch: i64,
}

impl CountedUsage {
    /// The usage that still counts in `period`.
    pub fn in_period(&self, period: i64) -> f64 {
        if self.period == period {
            self.current_usage
        } else {
            0.0
        }
    }
}

/// One budget a request is charged against, with the stable id of its counter:
/// `api_key:<id>`, `workspace:<id>:<index>`, `provider:<slug>`, or
/// `policy:<id>` with the entity's value key (see [`UsageLimitPolicy`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    pub id: String,
    pub limit: UsageLimit,
    /// What the control plane had counted when the snapshot was taken (the counters start
    /// from it, so a restart does not forget spend).
    pub counted: CountedUsage,
}

/// One rate limit a request counts against, with the stable id of its counter:
/// `api_key:<id>:<index>`, `workspace:<id>:<index>`, `jwt:<subject>:<index>`,
/// `provider:<slug>:<index>`.
#[derive(Debug, Clone, PartialEq)]
pub struct ScopedRateLimit {
    pub id: String,
    pub limit: RateLimit,
}

/// Kinds of API key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KeyKind {
    OrganisationService,
    WorkspaceService,
    WorkspaceUser,
}

impl KeyKind {
    pub fn as_str(self) -> &'static str {
        match self {
            KeyKind::OrganisationService => "organisation-service",
            KeyKind::WorkspaceService => "workspace-service",
            KeyKind::WorkspaceUser => "workspace-user",
        }
    }
}

/// The state of an API key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyStatus {
    Active,
    Exhausted,
    Expired,
}

/// Defaults a key or workspace applies to each request it makes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Defaults {
    /// Metadata added to the request's `x-gw-metadata` (the request's own values win).
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// A saved config used when the request sends none.
    #[serde(default)]
    pub config_id: Option<String>,
    /// Whether a request may send its own `x-gw-config` when `config_id` is set. Default: yes.
    #[serde(default)]
    pub allow_config_override: Option<bool>,
    /// Workspace guardrails (`input_guardrails`/`before_request_hooks`...), as the routing
    /// config writes them.
    #[serde(default)]
    pub input_guardrails: Vec<Value>,
    #[serde(default)]
    pub output_guardrails: Vec<Value>,
}

/// An API key as the data plane sees it. Held once per key in every snapshot, so what many keys
/// repeat (their organisation's and workspace's ids, a scope list, defaults) is shared rather
/// than copied: a snapshot of 100,000 keys of one workspace holds those values once.
#[derive(Debug, Clone)]
pub struct ApiKeyRecord {
    pub id: Arc<str>,
    pub organisation_id: Arc<str>,
    /// `None` for an organisation (admin) key.
    pub workspace_id: Option<Arc<str>>,
    pub user_id: Option<Arc<str>>,
    pub kind: KeyKind,
    pub status: KeyStatus,
    pub expires_at: Option<SystemTime>,
    pub scopes: Arc<[String]>,
    pub defaults: Arc<Defaults>,
    pub rate_limits: Vec<RateLimit>,
    pub usage_limits: Option<UsageLimit>,
    /// Usage the control plane has counted against `usage_limits`.
    pub counted: CountedUsage,
}

/// A workspace as the data plane sees it.
#[derive(Debug, Clone)]
pub struct WorkspaceRecord {
    pub id: String,
    pub slug: String,
    pub organisation_id: String,
    pub defaults: Defaults,
    pub rate_limits: Vec<RateLimit>,
    pub usage_limits: Vec<UsageLimit>,
    /// Usage counted per item of `usage_limits`, same order.
    pub counted: Vec<CountedUsage>,
}

/// One condition of a policy: `key` is `api_key`, `workspace_id`, `provider`, `virtual_key`,
/// `config`, `model` or `metadata.<name>`; `value` is `*` (any request that has the key), one
/// value, or several separated by commas (any of them); a value ending in `*` matches by
/// prefix. `excludes` lists values that never match.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Condition {
    pub key: String,
    pub value: String,
    #[serde(default)]
    pub excludes: Option<Vec<String>>,
}

/// The value key of one entity (counter) of a policy: its `group_by` keys with the request's
/// values, `key:value`, joined by `|` in the policy's `group_by` order
/// (`metadata._user:alice`, `api_key:<id>|model:gpt-4o`). A request without a value for a key
/// has the empty value there (`metadata._user:`), so all such requests share one counter. In a
/// value, `\` and `|` are escaped with a `\`, so that two different value tuples of one policy
/// never share a key. The data plane names the counters it charges with this, and the control
/// plane the entities it lists.
pub fn value_key<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut out = String::new();
    for (i, (key, value)) in pairs.into_iter().enumerate() {
        if i > 0 {
            out.push('|');
        }
        out.push_str(key);
        out.push(':');
        for c in value.chars() {
            if matches!(c, '\\' | '|') {
                out.push('\\');
            }
            out.push(c);
        }
    }
    out
}

/// A rate limits policy in force (status `active`).
#[derive(Debug, Clone)]
pub struct RateLimitPolicy {
    pub id: String,
    pub organisation_id: String,
    pub workspace_id: String,
    pub name: Option<String>,
    pub conditions: Vec<Condition>,
    /// The `group_by` keys, in order; each distinct combination of values has its own counter.
    pub group_by: Vec<String>,
    pub limit: RateLimit,
}

/// A usage limits policy in force (status `active`).
#[derive(Debug, Clone)]
pub struct UsageLimitPolicy {
    pub id: String,
    pub organisation_id: String,
    pub workspace_id: String,
    pub name: Option<String>,
    pub conditions: Vec<Condition>,
    pub group_by: Vec<String>,
    pub limit: UsageLimit,
    /// Usage the control plane has counted, by entity value key
    /// (`metadata._user:alice`, `api_key:<id>|model:gpt-4o`: `key:value` joined by `|`).
    pub usage: BTreeMap<String, CountedUsage>,
}

/// The control plane's keys, workspaces and policies, read on every request: lookups are in
/// memory (an immutable snapshot swapped when the control plane changes), never a query.
pub trait AccessStore: Send + Sync {
    /// The key whose SHA-256 digest is `digest`. A rotated key's previous value is found until
    /// its transition period ends.
    fn api_key(&self, digest: &[u8; 32]) -> Option<Arc<ApiKeyRecord>>;
    /// Like [`api_key`](AccessStore::api_key), with the stored digest the record was found
    /// under (the key's current one, or a rotated key's previous one), so that the auth plugin
    /// can compare it with the presented key's digest in constant time. Default: `api_key`,
    /// with `digest` itself standing for the stored one.
    fn api_key_with_digest(&self, digest: &[u8; 32]) -> Option<(Arc<ApiKeyRecord>, [u8; 32])> {
        self.api_key(digest).map(|record| (record, *digest))
    }
    fn workspace(&self, id: &str) -> Option<Arc<WorkspaceRecord>>;
    /// The active rate limits policies of every workspace.
    fn rate_limit_policies(&self) -> Arc<[RateLimitPolicy]>;
    /// The active usage limits policies of every workspace.
    fn usage_limit_policies(&self) -> Arc<[UsageLimitPolicy]>;
    /// Changes whenever anything above changes (plugins may cache what they derive from it).
    fn version(&self) -> i64;
    /// The guardrail saved through the control plane under `id_or_slug`, whoever owns it.
    /// Default: none (a store without saved guardrails).
    fn guardrail(&self, _id_or_slug: &str) -> Option<Arc<SavedGuardrail>> {
        None
    }
}

/// A guardrail saved through the control plane (`/v1/guardrails`): a hook that routing
/// configs, workspace defaults and the pipeline's YAML name by its slug or id.
#[derive(Debug, Clone)]
pub struct SavedGuardrail {
    pub id: String,
    pub slug: String,
    /// The workspace that owns it: only its callers (and its organisation's admin keys) may
    /// name it in their configs ([`crate::store::usable_by`]).
    pub owner: crate::store::Owner,
    /// The hook in the shape `before_request_hooks` items take (`type`, `checks`, `deny`,
    /// `async`, `on_fail`, `on_success`), its secrets in clear.
    pub hook: Value,
}

/// An access store with nothing in it: every key is unknown.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoAccess;

impl AccessStore for NoAccess {
    fn api_key(&self, _digest: &[u8; 32]) -> Option<Arc<ApiKeyRecord>> {
        None
    }
    fn workspace(&self, _id: &str) -> Option<Arc<WorkspaceRecord>> {
        None
    }
    fn rate_limit_policies(&self) -> Arc<[RateLimitPolicy]> {
        Arc::from(Vec::new())
    }
    fn usage_limit_policies(&self) -> Arc<[UsageLimitPolicy]> {
        Arc::from(Vec::new())
    }
    fn version(&self) -> i64 {
        0
    }
}

/// How a request proved who it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthMethod {
    ApiKey(KeyKind),
    Jwt,
}

/// The authenticated caller of one request, put in `RequestCx::extensions` by the auth plugin
/// and read by the limit, cache, guardrail and logging plugins.
#[derive(Debug, Clone)]
pub struct Principal {
    pub method: AuthMethod,
    pub organisation_id: Option<String>,
    pub workspace_id: Option<String>,
    /// The API key's id (`None` under JWT).
    pub api_key_id: Option<String>,
    /// The user the key belongs to, or the JWT's subject.
    pub user_id: Option<String>,
    pub scopes: Vec<String>,
    /// The key's (or JWT's) rate limits and the workspace's, with their counter ids.
    pub rate_limits: Vec<ScopedRateLimit>,
    /// Key-level (or JWT) budgets and the workspace's, with their counter ids.
    pub budgets: Vec<Budget>,
}

/// What a verified bearer token (a JWT) says about its bearer, as the control plane reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenIdentity {
    pub organisation_id: Option<String>,
    pub workspace_id: Option<String>,
    /// The token's subject (not a user of the control plane).
    pub user: Option<String>,
    pub scopes: Vec<String>,
}

/// A refused token: 401, or 403 for a valid token that may not do this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRefusal {
    pub status: u16,
    pub message: String,
}

/// Where a token was presented, recorded with its refusal in the audit log.
#[derive(Debug, Clone, Copy)]
pub struct TokenRequest<'a> {
    pub method: &'a str,
    pub uri: &'a str,
    pub request_id: &'a str,
    pub client_ip: Option<&'a str>,
}

/// Verifies bearer tokens for the control plane with the data plane's `jwt:` settings (the
/// `auth` plugin provides one when it has them), auditing refusals as the data plane does.
#[async_trait::async_trait]
pub trait TokenVerifier: Send + Sync {
    /// Whether a credential has a token's shape (an API key does not).
    fn looks_like_token(&self, credential: &str) -> bool;
    async fn verify(
        &self,
        token: &str,
        at: TokenRequest<'_>,
    ) -> Result<TokenIdentity, TokenRefusal>;
}

/// The token verifier the control plane uses, set by the plugin that has one when the pipeline
/// is built (and replaced when it is rebuilt). Empty: the control plane takes API keys only.
#[derive(Clone, Default)]
pub struct TokenSlot(Arc<std::sync::RwLock<Option<Arc<dyn TokenVerifier>>>>);

impl TokenSlot {
    pub fn set(&self, verifier: Arc<dyn TokenVerifier>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Some(verifier);
    }

    pub fn get(&self) -> Option<Arc<dyn TokenVerifier>> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl std::fmt::Debug for TokenSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "TokenSlot({})",
            if self.get().is_some() { "set" } else { "empty" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(text: &str) -> SystemTime {
        let secs = crate::time::parse_rfc3339(text).expect("valid time");
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs as u64)
    }

    fn limit(reset: Option<PeriodicReset>, days: Option<u32>, first: Option<&str>) -> UsageLimit {
        UsageLimit {
            credit_limit: 10.0,
            kind: UsageKind::Cost,
            alert_threshold: None,
            periodic_reset: reset,
            periodic_reset_days: days,
            next_usage_reset_at: first.map(str::to_string),
        }
    }

    #[test]
    fn without_a_schedule_there_is_one_period() {
        let l = limit(None, None, None);
        assert_eq!(l.period_at(at("2026-01-01T00:00:00Z")), 0);
        assert_eq!(l.period_at(at("2030-06-01T00:00:00Z")), 0);
    }

    #[test]
    fn monthly_periods_are_calendar_months() {
        let l = limit(Some(PeriodicReset::Monthly), None, None);
        let jan = l.period_at(at("2026-01-31T23:59:59Z"));
        assert_eq!(l.period_at(at("2026-02-01T00:00:00Z")), jan + 1);
        assert_eq!(l.period_at(at("2026-01-01T00:00:00Z")), jan);
        assert_eq!(jan, 56 * 12);
    }

    #[test]
    fn weekly_periods_start_on_monday() {
        let l = limit(Some(PeriodicReset::Weekly), None, None);
        // 2026-11-22 is a Sunday, 2026-11-23 a Monday.
        let sunday = l.period_at(at("2026-11-22T23:59:59Z"));
        assert_eq!(l.period_at(at("2026-11-23T00:00:00Z")), sunday + 1);
        assert_eq!(l.period_at(at("2026-11-17T00:00:00Z")), sunday);
    }

    #[test]
    fn the_first_reset_starts_the_schedule() {
        let l = limit(None, Some(3), Some("2026-12-01T12:00:00Z"));
        assert_eq!(l.period_at(at("2026-11-30T00:00:00Z")), 0);
        assert_eq!(l.period_at(at("2026-12-01T12:00:00Z")), 1);
        assert_eq!(l.period_at(at("2026-12-04T11:59:59Z")), 1);
        assert_eq!(l.period_at(at("2026-12-04T12:00:00Z")), 2);
        let m = limit(
            Some(PeriodicReset::Monthly),
            None,
            Some("2026-01-15T00:00:00+02:00"),
        );
        assert_eq!(m.period_at(at("2026-01-14T21:59:59Z")), 0);
        assert_eq!(m.period_at(at("2026-01-14T22:00:00Z")), 1);
        assert_eq!(m.period_at(at("2026-02-14T21:59:59Z")), 1);
        assert_eq!(m.period_at(at("2026-02-14T22:00:00Z")), 2);
    }

    #[test]
    fn counted_usage_of_an_old_period_is_zero() {
        let c = CountedUsage {
            current_usage: 4.5,
            period: 3,
            reset_epoch: 0,
        };
        assert_eq!(c.in_period(3), 4.5);
        assert_eq!(c.in_period(4), 0.0);
    }
}
