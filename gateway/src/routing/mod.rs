//! The router: turns a [`RoutePlan`] into the target(s) to try, and a target into a concrete
//! upstream (provider row, endpoint, credential).

pub mod config;

use std::collections::BTreeMap;

use plugin_sdk::headers::GwHeader;
use plugin_sdk::{GatewayError, RoutePlan, Target};

use crate::providers::table::{self, AuthStyle, ProviderSpec};
use crate::upstream::Endpoint;

/// A target bound to its provider row and endpoint.
#[derive(Debug)]
pub struct ResolvedTarget {
    pub spec: &'static ProviderSpec,
    pub endpoint: Endpoint,
    pub target: Target,
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

/// The single target of a plan. Multi-target strategies are executed by [`config`].
pub fn plan_target(plan: &RoutePlan) -> Result<Target, GatewayError> {
    match plan {
        RoutePlan::Single(t) => Ok(t.clone()),
        RoutePlan::Config(value) => config::single_target(value),
    }
}

/// Binds a target to its provider row and endpoint (its custom host, else the operator's base
/// URL for the provider, else the table's); unknown providers and bad hosts are 400s, a missing
/// key a 401, each saying what to send.
pub fn resolve(
    target: Target,
    base_urls: &BTreeMap<String, Endpoint>,
) -> Result<ResolvedTarget, GatewayError> {
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
        Some(host) => Endpoint::parse_param(host, GwHeader::CUSTOM_HOST.primary)?,
        None => match base_urls.get(spec.id) {
            Some(ep) => ep.clone(),
            None => Endpoint::parse(spec.base_url).map_err(GatewayError::internal)?,
        },
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
