//! Where a request should go, as decided by provider selection.

use std::fmt;
use std::sync::Arc;

use serde_json::{Map, Value};

use crate::store::ProviderRecord;

/// One upstream choice: a provider (by id, from the gateway's provider table) with the
/// credentials and overrides to use.
#[derive(Clone, Default)]
pub struct Target {
    /// Provider id from the provider table (`openai`, `groq`, `anthropic`...).
    pub provider: String,
    /// The provider credential. Never logged: `Debug` redacts it.
    pub api_key: Option<String>,
    /// A base URL that replaces the provider's default one.
    pub custom_host: Option<String>,
    /// The slug of the saved provider this target came from (`@slug` / virtual key).
    pub slug: Option<String>,
    /// Body fields to set on the request (`model`, `temperature`...), the target's value winning.
    pub override_params: Map<String, Value>,
    /// Provider-specific settings (Azure resource, AWS region...), by name.
    pub settings: Vec<(String, String)>,
    /// Client headers (lower-case names) forwarded to this target, besides those named by
    /// `x-gw-forward-headers`.
    pub forward_headers: Vec<String>,
    /// The cache settings of the config node this target came from (`cache: {mode, max_age}`);
    /// `None` when the node has none or headers chose the target.
    pub cache: Option<CacheSettings>,
}

/// How answers of a config node are cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheMode {
    /// Exact match of the canonical request.
    Simple,
    /// Similar prompts (not served by the built-in cache: treated as a miss).
    Semantic,
}

/// A config node's `cache` object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheSettings {
    pub mode: CacheMode,
    /// Time to live in seconds; `None`: the cache plugin's default.
    pub max_age_secs: Option<u64>,
}

impl Target {
    /// A provider setting by name (`azure_deployment_id`, `aws_region`, `vertex_project_id`...).
    pub fn setting(&self, name: &str) -> Option<&str> {
        self.settings
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Adds the settings it lacks from `defaults` (the request's `x-gw-aws-region`... headers):
    /// a target's own settings win.
    pub fn fill_settings(&mut self, defaults: &[(String, String)]) {
        for (k, v) in defaults {
            if self.setting(k).is_none() {
                self.settings.push((k.clone(), v.clone()));
            }
        }
    }

    /// The target a saved provider stands for: its provider, key, host and settings.
    pub fn from_record(record: &ProviderRecord) -> Target {
        Target {
            provider: record.provider.clone(),
            api_key: record.api_key.clone(),
            custom_host: record.custom_host.clone(),
            slug: Some(record.slug.clone()),
            settings: record
                .settings
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            ..Target::default()
        }
    }
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("provider", &self.provider)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("custom_host", &self.custom_host)
            .field("slug", &self.slug)
            .field("override_params", &self.override_params)
            .finish()
    }
}

/// The routing decision handed from provider selection to the router.
#[derive(Debug, Clone)]
pub enum RoutePlan {
    /// Headers named one provider (ways 1, 2 and 4 of provider selection).
    Single(Target),
    /// A routing config object (way 3): inline JSON or a saved config, validated by the router.
    Config(Arc<Value>),
}

/// The slugs of the saved providers a routing config names (`provider: "@slug"`,
/// `virtual_key: "slug"`), at any depth of its `targets`, read from the raw JSON so that they
/// can be checked before anything else looks at the request.
pub fn saved_slugs(config: &Value) -> Vec<&str> {
    let mut out = Vec::new();
    let mut stack = vec![config];
    while let Some(node) = stack.pop() {
        if let Some(slug) = node
            .get("provider")
            .and_then(Value::as_str)
            .and_then(|p| p.strip_prefix('@'))
        {
            out.push(slug);
        }
        if let Some(slug) = node.get("virtual_key").and_then(Value::as_str) {
            out.push(slug);
        }
        if let Some(targets) = node.get("targets").and_then(Value::as_array) {
            stack.extend(targets);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saved_slugs_are_found_at_any_depth() {
        let config = serde_json::json!({"strategy": {"mode": "fallback"}, "targets": [
            {"provider": "@a"},
            {"strategy": {"mode": "loadbalance"}, "targets": [
                {"virtual_key": "b"}, {"provider": "openai", "api_key": "k"},
                {"targets": [{"provider": "@c"}]}]}]});
        let mut slugs = saved_slugs(&config);
        slugs.sort_unstable();
        assert_eq!(slugs, ["a", "b", "c"]);
        assert_eq!(
            saved_slugs(&serde_json::json!({"provider": "@top"})),
            ["top"]
        );
    }
}
