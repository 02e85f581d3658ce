//! Stores a plugin may read. The embedded default is backed by the YAML file; the control plane
//! backs the same traits with its database snapshots. Lookups are synchronous and in memory:
//! nothing on the request path waits on a database.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use crate::access::{Budget, CountedUsage, Principal, RateLimit, ScopedRateLimit, UsageLimit};
use crate::error::GatewayError;

/// The workspace (and its organisation) that owns a provider or config saved through the
/// control plane. What the YAML file declares has no owner: the operator's, usable by every
/// caller.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Owner {
    pub organisation_id: String,
    pub workspace_id: String,
}

impl Owner {
    /// Whether `who` may use what this owner saved: a caller of the same workspace (a
    /// workspace key, a user key, a JWT naming the workspace), or an organisation (admin) key
    /// of the same organisation. A request without a caller (a pipeline without `auth`) may
    /// use nothing a workspace owns.
    pub fn admits(&self, who: Option<&Principal>) -> bool {
        let Some(who) = who else { return false };
        match who.workspace_id.as_deref() {
            Some(ws) => ws == self.workspace_id,
            None => who.organisation_id.as_deref() == Some(self.organisation_id.as_str()),
        }
    }
}

/// Whether `who` may use something with this owner (`None`: the operator's, open to all).
pub fn usable_by(owner: Option<&Owner>, who: Option<&Principal>) -> bool {
    owner.is_none_or(|o| o.admits(who))
}

/// The 400 for a saved provider that does not exist or that the caller may not use: one
/// message for both, wherever a slug is named (`param`), so that no answer tells them apart.
pub fn unknown_provider(param: &str, slug: &str) -> GatewayError {
    GatewayError::invalid_param(param, format!("no saved provider has the slug {slug:?}"))
}

/// A saved provider, addressed in requests as `x-gw-provider: @slug` or, the legacy way, as
/// `x-gw-virtual-key: slug`.
///
/// `Default` is an empty record (no slug, no limits): construction sites fill what they know
/// and leave the rest with `..ProviderRecord::default()`.
#[derive(Clone, Default)]
pub struct ProviderRecord {
    pub slug: String,
    /// Provider id from the provider table.
    pub provider: String,
    pub api_key: Option<String>,
    pub custom_host: Option<String>,
    /// Provider-specific settings (Azure resource name, AWS region...).
    pub settings: BTreeMap<String, String>,
    /// The provider's own rate limits, counted over every request that goes through it
    /// (counter ids `provider:<slug>:<index>`). Empty (the default, and always for providers
    /// declared in the YAML file): none.
    pub rate_limits: Vec<RateLimit>,
    /// The provider's own budget (counter id `provider:<slug>`). `None` (the default, and
    /// always for providers declared in the YAML file): none.
    pub usage_limits: Option<UsageLimit>,
    /// What the control plane has counted against `usage_limits` (zero by default).
    pub counted: CountedUsage,
    /// Per-model prices of the provider's integration, set through the control plane
    /// (`PUT /v1/integrations/{slug}/models`, the models with a `pricing_config`). Requests
    /// through this provider are priced by these first, before any price table. Empty (the
    /// default, and always for providers declared in the YAML file): none.
    pub model_prices: Vec<ModelPrice>,
    /// Who may use it (see [`Owner::admits`]); `None` (the default, and always for providers
    /// declared in the YAML file): every caller.
    pub owner: Option<Owner>,
    /// What the provider's organisation integration allows its workspace (see
    /// [`IntegrationLimits`]). `None` (the default, and for a workspace's own integration): no
    /// such limits.
    pub integration_limits: Option<Arc<IntegrationLimits>>,
}

/// The limits an organisation integration sets on one workspace's use of it
/// (`PUT /v1/integrations/{slug}/workspaces`: the workspace's own `rate_limits` and
/// `usage_limits`, else those of `global_workspace_access`), counted over every request of that
/// workspace through any provider of the integration. Counter ids:
/// `integration:<integration id>:<workspace id>:<index>`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct IntegrationLimits {
    pub rate_limits: Vec<ScopedRateLimit>,
    /// With what the control plane has counted against each.
    pub budgets: Vec<Budget>,
}

/// The price of one model through a saved provider, in US dollars per million tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelPrice {
    /// The model id as the integration lists it (`gpt-4o`; a dated id such as
    /// `gpt-4o-2024-08-06` is priced by its longest listed prefix, as in the price table).
    pub model: String,
    /// Per million input (prompt) tokens; finite and 0 or more.
    pub input_per_million: f64,
    /// Per million output (completion) tokens; finite and 0 or more.
    pub output_per_million: f64,
}

impl std::fmt::Debug for ProviderRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderRecord")
            .field("slug", &self.slug)
            .field("provider", &self.provider)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("custom_host", &self.custom_host)
            .field("rate_limits", &self.rate_limits)
            .field("usage_limits", &self.usage_limits)
            .field("counted", &self.counted)
            .field("model_prices", &self.model_prices)
            .field("owner", &self.owner)
            .field("integration_limits", &self.integration_limits)
            .finish()
    }
}

/// Saved providers by slug.
pub trait ProviderStore: Send + Sync {
    /// The provider saved under `slug`, whoever owns it. Requests look providers up with
    /// [`provider_for`](ProviderStore::provider_for).
    fn provider(&self, slug: &str) -> Option<Arc<ProviderRecord>>;

    /// The provider saved under `slug` if `who` may use it. One the caller may not use is
    /// `None`, exactly as a slug that does not exist: an answer must not tell them apart.
    fn provider_for(&self, slug: &str, who: Option<&Principal>) -> Option<Arc<ProviderRecord>> {
        self.provider(slug)
            .filter(|r| usable_by(r.owner.as_ref(), who))
    }
}

/// A saved routing config with its owner.
#[derive(Debug, Clone)]
pub struct SavedConfig {
    /// `None` for configs declared in the YAML file (usable by every caller).
    pub owner: Option<Owner>,
    pub body: Arc<Value>,
}

/// Saved routing configs by id or slug.
pub trait ConfigStore: Send + Sync {
    /// The body of the config saved under `id_or_slug`, whoever owns it.
    fn config(&self, id_or_slug: &str) -> Option<Arc<Value>>;

    /// The config with its owner. Default: the body of [`config`](ConfigStore::config), with no
    /// owner (a store of the operator's own configs).
    fn saved_config(&self, id_or_slug: &str) -> Option<SavedConfig> {
        self.config(id_or_slug)
            .map(|body| SavedConfig { owner: None, body })
    }

    /// The config's body if `who` may use it; else `None`, as for an unknown id.
    fn config_for(&self, id_or_slug: &str, who: Option<&Principal>) -> Option<Arc<Value>> {
        self.saved_config(id_or_slug)
            .filter(|c| usable_by(c.owner.as_ref(), who))
            .map(|c| c.body)
    }
}

/// A store with nothing in it.
#[derive(Debug, Default, Clone, Copy)]
pub struct EmptyStore;

impl ProviderStore for EmptyStore {
    fn provider(&self, _slug: &str) -> Option<Arc<ProviderRecord>> {
        None
    }
}

impl ConfigStore for EmptyStore {
    fn config(&self, _id_or_slug: &str) -> Option<Arc<Value>> {
        None
    }
}
