//! The stores plugins read: saved providers and configs declared in the YAML file, and those
//! saved through the control plane (its published snapshot, kept current as they change).
//! The file's come first: a provider or config the operator declared cannot be replaced by one
//! created through the API under the same slug.

use std::sync::Arc;

use serde_json::Value;

use plugin_sdk::store::{ConfigStore, ProviderStore, SavedConfig};
use plugin_sdk::{FastMap, ProviderRecord};

use crate::config::GatewayConfig;
use crate::routing::config::RoutingConfig;

/// Providers from the `providers:` list of the config file.
#[derive(Default)]
pub struct YamlProviders(FastMap<String, Arc<ProviderRecord>>);

impl YamlProviders {
    pub fn from_config(config: &GatewayConfig) -> Self {
        YamlProviders(
            config
                .providers
                .iter()
                .map(|p| (p.slug.clone(), Arc::new(p.clone())))
                .collect(),
        )
    }
}

impl ProviderStore for YamlProviders {
    fn provider(&self, slug: &str) -> Option<Arc<ProviderRecord>> {
        self.0.get(slug).cloned()
    }
}

/// Configs from the `configs:` list of the config file.
#[derive(Default)]
pub struct YamlConfigs(FastMap<String, Arc<Value>>);

impl YamlConfigs {
    pub fn from_config(config: &GatewayConfig) -> Self {
        YamlConfigs(
            config
                .configs
                .iter()
                .map(|(id, c)| (id.clone(), Arc::new(c.clone())))
                .collect(),
        )
    }
}

impl ConfigStore for YamlConfigs {
    fn config(&self, id_or_slug: &str) -> Option<Arc<Value>> {
        self.0.get(id_or_slug).cloned()
    }
}

/// Two stores, the first one asked first: `FileFirst(yaml, control_plane_snapshot)`.
pub struct FileFirst<A, B>(pub A, pub B);

impl<A: ProviderStore, B: ProviderStore> ProviderStore for FileFirst<A, B> {
    fn provider(&self, slug: &str) -> Option<Arc<ProviderRecord>> {
        self.0.provider(slug).or_else(|| self.1.provider(slug))
    }
}

impl<A: ConfigStore, B: ConfigStore> ConfigStore for FileFirst<A, B> {
    fn config(&self, id_or_slug: &str) -> Option<Arc<Value>> {
        self.0
            .config(id_or_slug)
            .or_else(|| self.1.config(id_or_slug))
    }

    // Each store's own: the control plane's configs carry their owner.
    fn saved_config(&self, id_or_slug: &str) -> Option<SavedConfig> {
        self.0
            .saved_config(id_or_slug)
            .or_else(|| self.1.saved_config(id_or_slug))
    }
}

/// The check the control plane runs on configs before saving them: the router's own
/// validation, so a saved config is one requests can use.
pub fn saved_config_check() -> admin::ConfigCheck {
    admin::ConfigCheck::new(|value| {
        RoutingConfig::parse(value).map(|_| ()).map_err(|problems| {
            problems
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        })
    })
}

/// The check the control plane runs on guardrails before saving them: the guardrails plugin's
/// own validation, so a saved guardrail is one requests can run.
pub fn saved_guardrail_check() -> admin::ConfigCheck {
    admin::ConfigCheck::new(plugins::guardrails::saved::check_saved)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;
    use crate::providers::table;

    /// The control plane keeps its own list of the provider ids `ai_provider_id` may name
    /// (it does not depend on the gateway): it must be this table's.
    #[test]
    fn the_control_plane_knows_every_provider_id() {
        let table: Vec<&str> = table::PROVIDERS.iter().map(|p| p.id).collect();
        assert_eq!(admin::store::AI_PROVIDER_IDS, table.as_slice());
    }

    struct One(&'static str, &'static str);

    impl ProviderStore for One {
        fn provider(&self, slug: &str) -> Option<Arc<ProviderRecord>> {
            (slug == self.0).then(|| {
                Arc::new(ProviderRecord {
                    slug: slug.into(),
                    provider: self.1.into(),
                    api_key: None,
                    custom_host: None,
                    settings: BTreeMap::new(),
                    ..ProviderRecord::default()
                })
            })
        }
    }

    impl ConfigStore for One {
        fn config(&self, id: &str) -> Option<Arc<Value>> {
            (id == self.0).then(|| Arc::new(json!({"provider": self.1})))
        }
    }

    #[test]
    fn the_file_wins_then_the_control_plane_answers() {
        let both = FileFirst(One("prod", "openai"), One("prod", "groq"));
        assert_eq!(both.provider("prod").unwrap().provider, "openai");
        assert_eq!(both.config("prod").unwrap()["provider"], "openai");
        let stored = FileFirst(One("file", "openai"), One("api", "groq"));
        assert_eq!(stored.provider("api").unwrap().provider, "groq");
        assert_eq!(stored.config("api").unwrap()["provider"], "groq");
        assert!(stored.provider("none").is_none());
        assert!(stored.config("none").is_none());
    }

    #[test]
    fn saved_configs_get_the_routers_validation() {
        let check = saved_config_check();
        assert!((check.0)(&json!({"provider": "openai"})).is_ok());
        let err = (check.0)(
            &json!({"strategy": {"mode": "fallback"}, "targets": [{"provider": "nope"}]}),
        )
        .unwrap_err();
        assert!(err.contains("targets[0].provider"), "{err}");
    }
}
