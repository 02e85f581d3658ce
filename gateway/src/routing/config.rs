//! The routing config object (`x-gw-config`, or a saved config).
//!
//! This module reads the single-target form: `{provider, api_key, virtual_key, custom_host,
//! override_params}` at the top level, or a `targets` list with one entry.

use serde::Deserialize;
use serde_json::{Map, Value};

use plugin_sdk::{GatewayError, Target};

const CODE: &str = "AB01";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTarget {
    #[serde(default)]
    provider: Option<String>,
    #[serde(default)]
    api_key: Option<String>,
    #[serde(default)]
    custom_host: Option<String>,
    #[serde(default)]
    override_params: Option<Map<String, Value>>,
    #[serde(default)]
    targets: Option<Vec<Value>>,
    /// Only `{mode: single}` (or none) is meaningful for one target.
    #[serde(default, rename = "strategy")]
    _strategy: Option<Value>,
}

fn config_error(path: &str, message: impl Into<String>) -> GatewayError {
    let message = message.into();
    let text = if path.is_empty() {
        format!("invalid config: {message}")
    } else {
        format!("invalid config: {path}: {message}")
    };
    GatewayError::invalid_param("x-gw-config", text).with_code(CODE)
}

/// The one target of a single-target config.
pub fn single_target(config: &Value) -> Result<Target, GatewayError> {
    parse_target(config, "")
}

fn parse_target(value: &Value, path: &str) -> Result<Target, GatewayError> {
    let raw: RawTarget = serde_path_to_error::deserialize(value).map_err(|e| {
        let inner = e.path().to_string();
        let full = match (path, inner.as_str()) {
            (p, ".") => p.to_owned(),
            ("", i) => i.to_owned(),
            (p, i) => format!("{p}.{i}"),
        };
        config_error(&full, e.into_inner().to_string())
    })?;
    if let Some(targets) = &raw.targets {
        let prefix = |i: usize| {
            if path.is_empty() {
                format!("targets[{i}]")
            } else {
                format!("{path}.targets[{i}]")
            }
        };
        return match targets.as_slice() {
            [one] => {
                let mut t = parse_target(one, &prefix(0))?;
                if let Some(parent) = raw.override_params {
                    for (k, v) in parent {
                        t.override_params.entry(k).or_insert(v);
                    }
                }
                Ok(t)
            }
            [] => Err(config_error(&prefix(0), "targets must not be empty")),
            _ => Err(config_error(
                path,
                "this gateway build routes to one target per config",
            )),
        };
    }
    let provider = raw
        .provider
        .ok_or_else(|| config_error(path, "a target needs a provider"))?;
    Ok(Target {
        provider,
        api_key: raw.api_key,
        custom_host: raw.custom_host,
        override_params: raw.override_params.unwrap_or_default(),
        ..Target::default()
    })
}
