//! The router: turns a [`RoutePlan`] into the target(s) to try, and a target into a concrete
//! upstream (provider row, endpoint, credential).

pub mod breaker;
pub mod config;
pub mod strategy;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use plugin_sdk::headers::GwHeader;
use plugin_sdk::store::ProviderStore;
use plugin_sdk::{GatewayError, Principal, RoutePlan, Target};

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
            // A templated base URL is filled in per request, from the target's settings.
            if !table.contains_key(spec.id) && !spec.base_url.contains('{') {
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
                ("authorization", ["Bearer ", key].concat())
            }
            AuthStyle::Header(name) => (name, key.to_owned()),
            AuthStyle::SigV4 => return None,
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
    who: Option<&Principal>,
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
                let target = config_target(target, &settings, providers, who)?;
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

/// The target of a config's target node, with the settings it runs with. A saved provider is
/// one `who` may use: another workspace's is answered as an unknown slug. Its host is the one
/// saved with it (validation refuses a `custom_host` beside a saved provider).
pub fn config_target(
    target: &TargetRef,
    settings: &Settings,
    providers: &dyn ProviderStore,
    who: Option<&Principal>,
) -> Result<Target, GatewayError> {
    let mut out = match target {
        TargetRef::Provider {
            id,
            api_key,
            settings,
        } => Target {
            provider: id.clone(),
            api_key: api_key.clone(),
            settings: settings.clone(),
            ..Target::default()
        },
        TargetRef::Saved(slug) => {
            let record = providers.provider_for(slug, who).ok_or_else(|| {
                plugin_sdk::store::unknown_provider(GwHeader::CONFIG.primary, slug)
                    .with_code(config::CODE)
            })?;
            Target::from_record(&record)
        }
    };
    if let TargetRef::Provider { .. } = target {
        out.custom_host = settings.custom_host.clone();
    }
    out.override_params = settings.override_params.clone();
    out.cache = settings.cache.clone();
    out.forward_headers = settings
        .forward_headers
        .iter()
        .flatten()
        .map(|h| h.to_ascii_lowercase())
        .collect();
    Ok(out)
}

/// A templated base URL (`https://bedrock-runtime.{aws_region}.amazonaws.com`) with the target's
/// settings filled in. Values go into a host name, so only letters, digits and `-` are allowed.
fn fill_base_url(spec: &ProviderSpec, target: &Target) -> Result<String, GatewayError> {
    let mut url = String::with_capacity(spec.base_url.len() + 16);
    let mut rest = spec.base_url;
    while let Some(open) = rest.find('{') {
        let close = rest[open..]
            .find('}')
            .map(|c| open + c)
            .ok_or_else(|| GatewayError::internal(format!("bad base URL for {}", spec.id)))?;
        let name = &rest[open + 1..close];
        let header = format!("x-gw-{}", name.replace('_', "-"));
        let value = target.setting(name).ok_or_else(|| {
            GatewayError::invalid_param(
                header.clone(),
                format!("provider {} needs {header}", spec.id),
            )
        })?;
        if value.is_empty()
            || !value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return Err(GatewayError::invalid_param(
                header.clone(),
                format!("{header} may hold only letters, digits and '-', got {value:?}"),
            ));
        }
        url.push_str(&rest[..open]);
        url.push_str(value);
        rest = &rest[close + 1..];
    }
    url.push_str(rest);
    Ok(url)
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
        None => match endpoints.base_urls.get(spec.id) {
            Some(ep) => ep.clone(),
            None => endpoints.custom(&fill_base_url(spec, &target)?)?,
        },
    };
    if target.api_key.is_none()
        && !matches!(spec.auth, AuthStyle::OptionalBearer | AuthStyle::SigV4)
    {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn target(provider: &str, settings: &[(&str, &str)]) -> Target {
        Target {
            provider: provider.into(),
            api_key: Some("k".into()),
            settings: settings
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..Target::default()
        }
    }

    #[test]
    fn templated_base_urls_take_the_targets_settings() {
        let endpoints = Endpoints::new(&BTreeMap::new());
        let r = resolve(
            target("bedrock", &[("aws_region", "eu-west-3")]),
            &endpoints,
        )
        .unwrap();
        assert_eq!(
            r.endpoint.authority(),
            "bedrock-runtime.eu-west-3.amazonaws.com"
        );
        let r = resolve(
            target("azure-openai", &[("azure_resource_name", "my-res")]),
            &endpoints,
        )
        .unwrap();
        assert_eq!(r.endpoint.authority(), "my-res.openai.azure.com");
        assert_eq!(r.endpoint.base_path, "/openai");

        let e = resolve(target("vertex-ai", &[]), &endpoints).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("x-gw-vertex-region"));
        // A value that would change the host is refused.
        for bad in ["evil.com/x", "a.b", "", "x@y"] {
            let e = resolve(target("bedrock", &[("aws_region", bad)]), &endpoints).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("x-gw-aws-region"), "{bad}");
        }
    }

    #[test]
    fn sigv4_providers_need_no_key_and_send_none() {
        let endpoints = Endpoints::new(&BTreeMap::new());
        let mut t = target("bedrock", &[("aws_region", "us-east-1")]);
        t.api_key = None;
        let r = resolve(t, &endpoints).unwrap();
        assert!(r.auth_header().is_none());
    }
}
