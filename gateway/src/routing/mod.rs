//! The router: turns a [`RoutePlan`] into the target(s) to try, and a target into a concrete
//! upstream (provider row, endpoint, credential).

pub mod breaker;
pub mod config;
pub mod strategy;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use plugin_sdk::headers::GwHeader;
use plugin_sdk::store::ProviderStore;
use plugin_sdk::{GatewayError, RoutePlan, Target};

use config::{Node, NodeKind, RoutingConfig, Settings, TargetRef};

use crate::providers::table::{self, AuthStyle, ProviderSpec};
use crate::upstream::Endpoint;

/// A target bound to its provider row and endpoint.
#[derive(Debug)]
pub struct ResolvedTarget {
    pub spec: &'static ProviderSpec,
    pub endpoint: Arc<Endpoint>,
    pub target: Target,
}

/// The endpoints of providers: the operator's base URLs, and the custom hosts seen in requests
/// and saved providers, parsed once. The cache of custom hosts is bounded (they come from
/// clients): when full it starts over.
pub struct Endpoints {
    base_urls: BTreeMap<String, Arc<Endpoint>>,
    custom: Mutex<HashMap<String, Arc<Endpoint>>>,
}

const CUSTOM_HOSTS_KEPT: usize = 1024;

impl Endpoints {
    pub fn new(base_urls: &BTreeMap<String, Endpoint>) -> Self {
        let mut table: BTreeMap<String, Arc<Endpoint>> = base_urls
            .iter()
            .map(|(id, ep)| (id.clone(), Arc::new(ep.clone())))
            .collect();
        for spec in table::PROVIDERS {
            if !table.contains_key(spec.id) {
                if let Ok(ep) = Endpoint::parse(spec.base_url) {
                    table.insert(spec.id.to_owned(), Arc::new(ep));
                }
            }
        }
        Endpoints {
            base_urls: table,
            custom: Mutex::new(HashMap::new()),
        }
    }

    fn custom(&self, url: &str) -> Result<Arc<Endpoint>, GatewayError> {
        if let Some(ep) = self.custom.lock().ok().and_then(|c| c.get(url).cloned()) {
            return Ok(ep);
        }
        let ep = Arc::new(Endpoint::parse_param(url, GwHeader::CUSTOM_HOST.primary)?);
        if let Ok(mut cache) = self.custom.lock() {
            if cache.len() >= CUSTOM_HOSTS_KEPT {
                cache.clear();
            }
            cache.insert(url.to_owned(), ep.clone());
        }
        Ok(ep)
    }
}

impl ResolvedTarget {
    /// The credential header the provider expects, if a key is to be sent.
    pub fn auth_header(&self) -> Option<(&'static str, String)> {
        let key = self.target.api_key.as_deref()?;
        Some(match self.spec.auth {
            AuthStyle::Bearer | AuthStyle::OptionalBearer => {
                ("authorization", format!("Bearer {key}"))
            }
            AuthStyle::Header(name) => (name, key.to_owned()),
        })
    }
}

/// The target a passthrough request goes to. Passthrough bodies stream through unread, so a
/// config routes them by selection only: `single`, `loadbalance` (weighted or sticky),
/// `conditional`, and for `fallback` the first target whose circuit breaker is not open.
/// Retries and fallback on a status need the body kept and apply to the first-class routes.
/// Returns the target and the config node it came from.
pub fn select_target(
    plan: &RoutePlan,
    providers: &dyn ProviderStore,
    facts: &strategy::RequestFacts<'_>,
    is_open: &dyn Fn(&Node) -> bool,
) -> Result<(Target, Option<String>), GatewayError> {
    let value = match plan {
        RoutePlan::Single(t) => return Ok((t.clone(), None)),
        RoutePlan::Config(value) => value,
    };
    let config = RoutingConfig::parse_for_request(value)?;
    let mut node = &config.root;
    let mut settings = node.settings.clone();
    loop {
        let (strategy, targets) = match &node.kind {
            NodeKind::Target(target) => {
                let target = config_target(target, &settings, providers)?;
                return Ok((target, Some(node.path.clone())));
            }
            NodeKind::Group { strategy, targets } => (strategy, targets),
        };
        let next = strategy::choose(strategy, targets, facts, is_open);
        let i = next.ok_or_else(|| {
            GatewayError::invalid_param(
                GwHeader::CONFIG.primary,
                format!("{}: no target matched the request", node.path),
            )
        })?;
        node = &targets[i];
        settings = node.settings.inherit(&settings);
    }
}

/// The target of a config's target node, with the settings it runs with.
pub fn config_target(
    target: &TargetRef,
    settings: &Settings,
    providers: &dyn ProviderStore,
) -> Result<Target, GatewayError> {
    let mut out = match target {
        TargetRef::Provider { id, api_key } => Target {
            provider: id.clone(),
            api_key: api_key.clone(),
            ..Target::default()
        },
        TargetRef::Saved(slug) => {
            let record = providers.provider(slug).ok_or_else(|| {
                GatewayError::invalid_param(
                    GwHeader::CONFIG.primary,
                    format!("no saved provider has the slug {slug:?}"),
                )
                .with_code(config::CODE)
            })?;
            Target::from_record(&record)
        }
    };
    if settings.custom_host.is_some() {
        out.custom_host = settings.custom_host.clone();
    }
    out.override_params = settings.override_params.clone();
    out.forward_headers = settings
        .forward_headers
        .iter()
        .flatten()
        .map(|h| h.to_ascii_lowercase())
        .collect();
    Ok(out)
}

/// Binds a target to its provider row and endpoint (its custom host, else the operator's base
/// URL for the provider, else the table's); unknown providers and bad hosts are 400s, a missing
/// key a 401, each saying what to send.
pub fn resolve(target: Target, endpoints: &Endpoints) -> Result<ResolvedTarget, GatewayError> {
    let spec = table::find(&target.provider).ok_or_else(|| {
        GatewayError::invalid_param(
            GwHeader::PROVIDER.primary,
            format!(
                "unknown provider {:?}; known providers: {}",
                target.provider,
                table::known_ids()
            ),
        )
    })?;
    let endpoint = match &target.custom_host {
        Some(host) => endpoints.custom(host)?,
        None => endpoints
            .base_urls
            .get(spec.id)
            .cloned()
            .ok_or_else(|| GatewayError::internal(format!("no base URL for {}", spec.id)))?,
    };
    if target.api_key.is_none() && spec.auth != AuthStyle::OptionalBearer {
        return Err(GatewayError::new(
            plugin_sdk::ErrorKind::Unauthorized,
            format!(
                "provider {} needs an API key: send Authorization: Bearer <provider key>, or use a saved provider with a key",
                spec.id
            ),
        ));
    }
    Ok(ResolvedTarget {
        spec,
        endpoint,
        target,
    })
}
