//! The YAML file as written. Every struct refuses unknown fields so that a typo is an error
//! rather than a silently ignored setting.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGatewayConfig {
    /// Address to listen on. Default: `127.0.0.1:8787`. `GW_LISTEN` overrides.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// A second address serving the control plane's paths (`/v1/admin/...`, `/v1/api-keys`...)
    /// and nothing else, so that it can sit on a private interface. Default: none.
    /// `GW_ADMIN_LISTEN` overrides.
    #[serde(default)]
    pub admin_listen: Option<String>,
    /// Whether `listen` serves the control plane's paths too. Default: true; `false` (which
    /// needs `admin_listen`) answers them 404 there, as any path the gateway does not serve.
    #[serde(default)]
    pub admin_on_main_listener: Option<bool>,
    /// Proxy worker threads. Default: one per core.
    #[serde(default)]
    pub threads: Option<usize>,
    /// Largest request body accepted on LLM routes; larger is a 413. Default: 32 MiB.
    #[serde(default)]
    pub max_body_bytes: Option<usize>,
    /// Largest whole (non-stream) answer read from a provider; larger is a 502. Default: 64 MiB.
    #[serde(default)]
    pub max_answer_bytes: Option<usize>,
    #[serde(default)]
    pub upstream: RawUpstream,
    #[serde(default)]
    pub shutdown: RawShutdown,
    #[serde(default)]
    pub egress: RawEgress,
    #[serde(default)]
    pub compat: RawCompat,
    /// Control-plane database. Default: `sqlite://gateway.db`. `GW_DATABASE_URL` overrides.
    #[serde(default)]
    pub database_url: Option<String>,
    /// Redis for counters shared by several instances. Default: none (in-process).
    /// `GW_REDIS_URL` overrides.
    #[serde(default)]
    pub redis_url: Option<String>,
    /// Log filter (`info`, `debug`, `gateway=debug`...), plus `json` for JSON lines.
    /// Default: `info`. `GW_LOG` overrides.
    #[serde(default)]
    pub log: Option<String>,
    /// Saved providers, addressed as `x-gw-provider: @slug` or `x-gw-virtual-key: slug`.
    #[serde(default)]
    pub providers: Vec<Value>,
    /// Base URLs that replace a provider's default one, by provider id (an egress proxy, a
    /// regional endpoint, a local stand-in). Default: none.
    #[serde(default)]
    pub provider_base_urls: BTreeMap<String, String>,
    /// Saved routing configs, addressed as `x-gw-config: <id>`.
    #[serde(default)]
    pub configs: Vec<RawSavedConfig>,
    /// The plugins, in order. Default: provider_select, request_log, metrics.
    #[serde(default)]
    pub pipeline: Option<Vec<Value>>,
}

fn default_listen() -> String {
    "127.0.0.1:8787".to_owned()
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    /// Default: 10000.
    pub connect_timeout_ms: Option<u64>,
    /// Longest wait for one read from the provider. Default: 600000.
    pub read_timeout_ms: Option<u64>,
    /// Default: 60000.
    pub write_timeout_ms: Option<u64>,
    /// How long idle provider connections stay pooled. Default: 90000.
    pub idle_timeout_ms: Option<u64>,
}

/// Compatibility with clients built for the reference product.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCompat {
    /// Whether answers also carry `x-portkey-trace-id`, `x-portkey-provider`,
    /// `x-portkey-cache-status`, `x-portkey-retry-attempt-count` and
    /// `x-portkey-last-used-option-index` beside the `x-gw-*` ones. Default: true.
    pub reference_response_headers: Option<bool>,
}

/// Which hosts named by requests or the control plane (custom hosts, integrations' hosts,
/// webhook and URL checks) may resolve to internal addresses.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEgress {
    /// Hosts trusted to be internal: `host` (every port) or `host:port`. Default: none.
    /// `GW_TRUSTED_CUSTOM_HOSTS` (comma-separated) adds to them.
    #[serde(default)]
    pub trusted_hosts: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawShutdown {
    /// How long Ctrl-C / SIGTERM waits for in-flight requests and streams. Default: 30.
    pub drain_timeout_secs: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawProvider {
    pub slug: String,
    /// Provider id from the provider table (`openai`, `groq`...).
    pub provider: String,
    /// The provider credential; empty means "use the client's Authorization header".
    #[serde(default)]
    pub api_key: Option<String>,
    #[serde(default)]
    pub custom_host: Option<String>,
    /// Provider-specific settings (Azure resource name, AWS region...).
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSavedConfig {
    pub id: String,
    pub config: Value,
}
