//! How built-in plugins describe and register themselves.
//!
//! A plugin crate implements [`PluginFactory`] for a type and calls
//! [`register_plugin!`](crate::register_plugin). The gateway then finds it by its `kind` when it
//! loads the pipeline YAML, and `gateway plugins list` prints its summary and example.
//!
//! Loading a pipeline entry happens in two steps: [`PluginDescriptor::check`] (pure: deserialize
//! the config with unknown fields refused, then [`PluginFactory::validate`]) and
//! [`PluginDescriptor::build`] (may have side effects: register metrics, open files).

use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::access::AccessStore;
use crate::plugin::Plugin;
use crate::sinks::SharedSink;
use crate::store::{ConfigStore, ProviderStore};

/// What a plugin may use while it is built.
#[derive(Clone)]
pub struct BuildCx {
    pub providers: Arc<dyn ProviderStore>,
    pub configs: Arc<dyn ConfigStore>,
    /// The gateway's metrics registry, served at `GET /metrics`.
    pub metrics: prometheus::Registry,
    /// The control plane's keys, workspaces and policies.
    pub access: Arc<dyn AccessStore>,
    /// Where audit events, settled usage and request logs go.
    pub sink: SharedSink,
    /// `GW_REDIS_URL`: counters and cache shared by several instances. `None`: in-process.
    pub redis_url: Option<String>,
    /// The hosts the operator trusts to be internal; every other host a plugin reaches for a
    /// request (a webhook, a URL check) must resolve to a public address.
    pub egress: crate::egress::EgressPolicy,
    /// Where a plugin that verifies JWTs (`auth` with `jwt:`) offers its verifier to the
    /// control plane.
    pub tokens: crate::access::TokenSlot,
}

impl BuildCx {
    /// A build context with empty stores, a fresh registry, no control plane and no Redis
    /// (unit tests, benchmarks).
    pub fn standalone() -> BuildCx {
        BuildCx {
            providers: Arc::new(crate::store::EmptyStore),
            configs: Arc::new(crate::store::EmptyStore),
            metrics: prometheus::Registry::new(),
            access: Arc::new(crate::access::NoAccess),
            sink: Arc::new(crate::sinks::Discard),
            redis_url: None,
            egress: crate::egress::EgressPolicy::default(),
            tokens: crate::access::TokenSlot::default(),
        }
    }
}

/// A problem in a plugin's config, with the path of the field inside the plugin's entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigIssue {
    /// Dotted path relative to the plugin entry (`max_age`, `checks[0].id`); empty for the entry.
    pub path: String,
    pub message: String,
}

impl ConfigIssue {
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigIssue {
            path: path.into(),
            message: message.into(),
        }
    }
}

/// Implemented by each built-in plugin type to describe and build it.
pub trait PluginFactory {
    /// The `kind` that selects this plugin in the pipeline YAML.
    const KIND: &'static str;
    /// One line for `gateway plugins list`.
    const SUMMARY: &'static str;
    /// An example pipeline entry, as YAML.
    const EXAMPLE: &'static str;
    /// The plugin's config; it should refuse unknown fields (`#[serde(deny_unknown_fields)]`).
    type Config: DeserializeOwned;

    /// Checks the config beyond its shape (ranges, combinations). Pure. Default: no checks.
    fn validate(_config: &Self::Config) -> Vec<ConfigIssue> {
        Vec::new()
    }

    /// Builds the plugin from a valid config.
    fn build(config: Self::Config, cx: &BuildCx) -> Result<Arc<dyn Plugin>, String>;
}

/// Builds a plugin from the config of its pipeline entry.
type BuildFn = fn(&Value, &BuildCx) -> Result<Arc<dyn Plugin>, Vec<ConfigIssue>>;

/// A registered plugin kind.
pub struct PluginDescriptor {
    pub kind: &'static str,
    pub summary: &'static str,
    pub example: &'static str,
    check: fn(&Value) -> Result<(), Vec<ConfigIssue>>,
    build: BuildFn,
}

inventory::collect!(PluginDescriptor);

impl PluginDescriptor {
    /// The descriptor of a factory; used by [`register_plugin!`](crate::register_plugin).
    pub const fn of<F: PluginFactory + 'static>() -> Self {
        PluginDescriptor {
            kind: F::KIND,
            summary: F::SUMMARY,
            example: F::EXAMPLE,
            check: check_config::<F>,
            build: build_plugin::<F>,
        }
    }

    /// Every registered plugin kind, sorted by kind.
    pub fn all() -> Vec<&'static PluginDescriptor> {
        let mut all: Vec<_> = inventory::iter::<PluginDescriptor>.into_iter().collect();
        all.sort_by_key(|d| d.kind);
        all
    }

    /// The registered plugin of this kind.
    pub fn find(kind: &str) -> Option<&'static PluginDescriptor> {
        inventory::iter::<PluginDescriptor>
            .into_iter()
            .find(|d| d.kind == kind)
    }

    /// Validates a config (the entry without its `kind`) without building anything.
    pub fn check(&self, config: &Value) -> Result<(), Vec<ConfigIssue>> {
        (self.check)(config)
    }

    /// Validates and builds the plugin.
    pub fn build(&self, config: &Value, cx: &BuildCx) -> Result<Arc<dyn Plugin>, Vec<ConfigIssue>> {
        (self.build)(config, cx)
    }
}

fn parse_config<F: PluginFactory>(config: &Value) -> Result<F::Config, Vec<ConfigIssue>> {
    let parsed: F::Config = serde_path_to_error::deserialize(config).map_err(|e| {
        let path = e.path().to_string();
        let path = if path == "." { String::new() } else { path };
        vec![ConfigIssue::new(path, e.into_inner().to_string())]
    })?;
    let issues = F::validate(&parsed);
    if issues.is_empty() {
        Ok(parsed)
    } else {
        Err(issues)
    }
}

fn check_config<F: PluginFactory>(config: &Value) -> Result<(), Vec<ConfigIssue>> {
    parse_config::<F>(config).map(|_| ())
}

fn build_plugin<F: PluginFactory>(
    config: &Value,
    cx: &BuildCx,
) -> Result<Arc<dyn Plugin>, Vec<ConfigIssue>> {
    let parsed = parse_config::<F>(config)?;
    F::build(parsed, cx).map_err(|message| vec![ConfigIssue::new("", message)])
}

/// Registers a [`PluginFactory`] so that the pipeline loader and `gateway plugins list` find it.
///
/// ```ignore
/// plugin_sdk::register_plugin!(RequestLogFactory);
/// ```
#[macro_export]
macro_rules! register_plugin {
    ($factory:ty) => {
        $crate::inventory::submit! {
            $crate::registry::PluginDescriptor::of::<$factory>()
        }
    };
}
