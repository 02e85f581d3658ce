//! The embedded stores: saved providers and configs declared in the YAML file.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use plugin_sdk::store::{ConfigStore, ProviderStore};
use plugin_sdk::ProviderRecord;

use crate::config::GatewayConfig;

/// Providers from the `providers:` list of the config file.
#[derive(Default)]
pub struct YamlProviders(HashMap<String, Arc<ProviderRecord>>);

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
pub struct YamlConfigs(HashMap<String, Arc<Value>>);

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
