//! The gateway's YAML file: raw serde types ([`raw`]) validated into [`GatewayConfig`] (never the
//! reverse). Layering: built-in defaults, then the file (with `${VAR}` / `${VAR:-default}`
//! expanded from the environment), then command-line flags and `GW_*` environment variables
//! ([`Overrides`]), then validation, which reports every problem with its YAML path.

mod env;
pub mod raw;

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use plugin_sdk::egress::{self, EgressPolicy, TrustedHost};
use plugin_sdk::{ConfigIssue, PluginDescriptor, ProviderRecord};

use crate::providers::table;
use crate::routing::config::RoutingConfig;
use crate::upstream::{Endpoint, UpstreamTimeouts};

/// The control plane's database when none is configured: a SQLite file in the working folder.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://gateway.db";

/// The default request body limit: 32 MiB, room for long contexts and inline images.
pub const DEFAULT_MAX_BODY_BYTES: usize = 32 * 1024 * 1024;
/// `max_answer_bytes` when the file does not say.
pub const DEFAULT_MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;

/// A validated gateway configuration.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    pub listen: SocketAddr,
    /// The control plane's own address (`admin_listen`), served beside `listen`. Default: none.
    pub admin_listen: Option<SocketAddr>,
    /// Whether `listen` also serves the control plane's paths (`admin_on_main_listener`);
    /// when false they answer 404 there. Default: true.
    pub admin_on_main_listener: bool,
    /// Worker threads of the proxy service.
    pub threads: usize,
    pub max_body_bytes: usize,
    /// The largest whole (non-stream) answer read from a provider (`max_answer_bytes`); a larger
    /// one is a 502. Default: 64 MiB.
    pub max_answer_bytes: usize,
    pub upstream: UpstreamTimeouts,
    /// How long shutdown waits for in-flight requests and streams.
    pub drain_timeout: Duration,
    pub database_url: String,
    /// The control plane's first admin key (`GW_BOOTSTRAP_ADMIN_KEY`; never read from the file).
    pub bootstrap_admin_key: Option<Secret>,
    /// The key that encrypts stored provider secrets (`GW_SECRET_KEY`, base64 of 32 bytes;
    /// never read from the file). Required with PostgreSQL.
    pub secret_key: Option<Secret>,
    pub redis_url: Option<String>,
    pub log: String,
    pub providers: Vec<ProviderRecord>,
    /// Default base URLs replaced per provider id.
    pub provider_base_urls: BTreeMap<String, Endpoint>,
    /// Saved routing configs by id.
    pub configs: BTreeMap<String, Value>,
    pub pipeline: Vec<PipelineEntry>,
    /// The hosts that may resolve to internal addresses: `egress.trusted_hosts`,
    /// `GW_TRUSTED_CUSTOM_HOSTS`, and every host the file itself names (`provider_base_urls`,
    /// `providers[].custom_host`). Every other upstream host must resolve to a public address.
    pub egress: EgressPolicy,
    /// `compat.reference_response_headers`: answers carry the `x-portkey-*` names of the
    /// gateway's response headers too. Default: true.
    pub reference_response_headers: bool,
}

/// One validated pipeline entry.
#[derive(Clone)]
pub struct PipelineEntry {
    pub kind: String,
    /// The entry without its `kind`.
    pub config: Value,
    pub descriptor: &'static PluginDescriptor,
}

impl fmt::Debug for PipelineEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PipelineEntry")
            .field("kind", &self.kind)
            .field("config", &self.config)
            .finish()
    }
}

/// Settings from the command line and `GW_*` variables, which win over the file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub listen: Option<String>,
    /// `--admin-listen` / `GW_ADMIN_LISTEN`; an empty value leaves the file's setting.
    pub admin_listen: Option<String>,
    pub database_url: Option<String>,
    pub bootstrap_admin_key: Option<Secret>,
    pub secret_key: Option<Secret>,
    pub redis_url: Option<String>,
    pub log: Option<String>,
    /// `GW_TRUSTED_CUSTOM_HOSTS`: comma-separated hosts, added to `egress.trusted_hosts`.
    pub trusted_custom_hosts: Option<String>,
}

/// A secret setting: its `Debug` form never shows the value.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Every problem found in a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigIssue>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, issue) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            if issue.path.is_empty() {
                write!(f, "{}", issue.message)?;
            } else {
                write!(f, "{}: {}", issue.path, issue.message)?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl GatewayConfig {
    /// Reads, expands and validates a config file.
    pub fn load(path: &Path, overrides: &Overrides) -> Result<GatewayConfig, ConfigErrors> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigErrors(vec![ConfigIssue::new(
                "",
                format!("cannot read {}: {e}", path.display()),
            )])
        })?;
        Self::from_yaml(&text, overrides)
    }

    /// Parses, expands and validates YAML text.
    pub fn from_yaml(text: &str, overrides: &Overrides) -> Result<GatewayConfig, ConfigErrors> {
        let yaml: serde_yaml_ng::Value = serde_yaml_ng::from_str(text)
            .map_err(|e| ConfigErrors(vec![ConfigIssue::new("", format!("invalid YAML: {e}"))]))?;
        let mut json = serde_json::to_value(yaml).map_err(|e| {
            ConfigErrors(vec![ConfigIssue::new("", format!("unsupported YAML: {e}"))])
        })?;
        if json.is_null() {
            json = Value::Object(Default::default());
        }
        let mut issues = Vec::new();
        env::expand(&mut json, "", &mut issues);
        if !issues.is_empty() {
            return Err(ConfigErrors(issues));
        }
        validate(json, overrides)
    }
}

fn validate(json: Value, overrides: &Overrides) -> Result<GatewayConfig, ConfigErrors> {
    let raw: raw::RawGatewayConfig = match serde_path_to_error::deserialize(&json) {
        Ok(raw) => raw,
        Err(_) => return Err(ConfigErrors(top_level_issues(&json))),
    };
    let mut issues = Vec::new();

    let listen_text = overrides.listen.clone().unwrap_or(raw.listen);
    let listen = match listen_text.parse::<SocketAddr>() {
        Ok(addr) => addr,
        Err(_) => {
            issues.push(ConfigIssue::new(
                "listen",
                format!("{listen_text:?} is not an address like 127.0.0.1:8787"),
            ));
            SocketAddr::from(([127, 0, 0, 1], 0))
        }
    };
    let admin_listen_text = overrides
        .admin_listen
        .clone()
        .filter(|a| !a.trim().is_empty())
        .or(raw.admin_listen);
    let admin_listen = match admin_listen_text {
        None => None,
        Some(text) => match text.parse::<SocketAddr>() {
            Ok(addr) if same_port(addr, listen) => {
                issues.push(ConfigIssue::new(
                    "admin_listen",
                    format!(
                        "{addr} must differ from listen ({listen}): the control plane's listener needs a port of its own"
                    ),
                ));
                None
            }
            Ok(addr) => Some(addr),
            Err(_) => {
                issues.push(ConfigIssue::new(
                    "admin_listen",
                    format!("{text:?} is not an address like 127.0.0.1:8788"),
                ));
                None
            }
        },
    };
    let admin_on_main_listener = raw.admin_on_main_listener.unwrap_or(true);
    if !admin_on_main_listener
        && admin_listen.is_none()
        && !issues.iter().any(|i| i.path == "admin_listen")
    {
        issues.push(ConfigIssue::new(
            "admin_on_main_listener",
            "false needs admin_listen: the control plane would be served nowhere",
        ));
    }
    let threads = match raw.threads {
        Some(0) => {
            issues.push(ConfigIssue::new("threads", "must be at least 1"));
            1
        }
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let max_body_bytes = match raw.max_body_bytes {
        Some(0) => {
            issues.push(ConfigIssue::new("max_body_bytes", "must be at least 1"));
            0
        }
        Some(n) => n,
        None => DEFAULT_MAX_BODY_BYTES,
    };
    let max_answer_bytes = match raw.max_answer_bytes {
        Some(0) => {
            issues.push(ConfigIssue::new("max_answer_bytes", "must be at least 1"));
            0
        }
        Some(n) => n,
        None => DEFAULT_MAX_ANSWER_BYTES,
    };
    let defaults = UpstreamTimeouts::default();
    let mut ms = |path: &str, value: Option<u64>, default: Duration| match value {
        Some(0) => {
            issues.push(ConfigIssue::new(path, "must be at least 1 millisecond"));
            default
        }
        Some(v) => Duration::from_millis(v),
        None => default,
    };
    let upstream = UpstreamTimeouts {
        connect: ms(
            "upstream.connect_timeout_ms",
            raw.upstream.connect_timeout_ms,
            defaults.connect,
        ),
        read: ms(
            "upstream.read_timeout_ms",
            raw.upstream.read_timeout_ms,
            defaults.read,
        ),
        write: ms(
            "upstream.write_timeout_ms",
            raw.upstream.write_timeout_ms,
            defaults.write,
        ),
        idle: ms(
            "upstream.idle_timeout_ms",
            raw.upstream.idle_timeout_ms,
            defaults.idle,
        ),
    };

    // Hosts the operator names (in the file or the environment) may be internal.
    let mut trusted: Vec<TrustedHost> = Vec::new();
    for (i, host) in raw.egress.trusted_hosts.iter().enumerate() {
        match TrustedHost::parse(host) {
            Ok(t) => trusted.push(t),
            Err(e) => issues.push(ConfigIssue::new(format!("egress.trusted_hosts[{i}]"), e)),
        }
    }
    if let Some(list) = &overrides.trusted_custom_hosts {
        match egress::parse_list(list) {
            Ok(hosts) => trusted.extend(hosts),
            Err(e) => issues.push(ConfigIssue::new(egress::TRUSTED_HOSTS_VAR, e)),
        }
    }

    let mut providers: Vec<ProviderRecord> = Vec::new();
    for (i, p) in raw.providers.into_iter().enumerate() {
        let path = format!("providers[{i}]");
        match serde_path_to_error::deserialize::<_, raw::RawProvider>(p) {
            Err(e) => issues.push(ConfigIssue::new(
                join_path(&path, &e.path().to_string()),
                e.into_inner().to_string(),
            )),
            Ok(p) => {
                if p.slug.is_empty() || p.slug.starts_with('@') {
                    issues.push(ConfigIssue::new(
                        format!("{path}.slug"),
                        "must be a non-empty name without a leading @",
                    ));
                }
                if providers.iter().any(|q| q.slug == p.slug) {
                    issues.push(ConfigIssue::new(
                        format!("{path}.slug"),
                        format!("{:?} is declared twice", p.slug),
                    ));
                }
                if table::find(&p.provider).is_none() {
                    issues.push(ConfigIssue::new(
                        format!("{path}.provider"),
                        format!(
                            "unknown provider {:?}; known providers: {}",
                            p.provider,
                            table::known_ids()
                        ),
                    ));
                }
                let custom_host = p.custom_host.filter(|h| !h.is_empty());
                if let Some(host) = &custom_host {
                    match Endpoint::parse(host) {
                        Ok(ep) => trusted.push(trusted_endpoint(&ep)),
                        Err(e) => issues.push(ConfigIssue::new(format!("{path}.custom_host"), e)),
                    }
                }
                providers.push(ProviderRecord {
                    slug: p.slug,
                    provider: p.provider,
                    api_key: p.api_key.filter(|k| !k.is_empty()),
                    custom_host,
                    settings: p.settings,
                    // The file declares no limits for a provider.
                    ..ProviderRecord::default()
                });
            }
        }
    }

    let mut provider_base_urls = BTreeMap::new();
    for (id, url) in raw.provider_base_urls {
        let path = format!("provider_base_urls.{id}");
        if table::find(&id).is_none() {
            issues.push(ConfigIssue::new(
                &path,
                format!(
                    "unknown provider {id:?}; known providers: {}",
                    table::known_ids()
                ),
            ));
        }
        match Endpoint::parse(&url) {
            Ok(ep) => {
                trusted.push(trusted_endpoint(&ep));
                provider_base_urls.insert(id, ep);
            }
            Err(e) => issues.push(ConfigIssue::new(path, e)),
        }
    }

    let mut configs = BTreeMap::new();
    for (i, c) in raw.configs.into_iter().enumerate() {
        if c.id.is_empty() {
            issues.push(ConfigIssue::new(
                format!("configs[{i}].id"),
                "must not be empty",
            ));
        } else if let Err(problems) = RoutingConfig::parse(&c.config) {
            issues.extend(problems.into_iter().map(|p| {
                ConfigIssue::new(
                    join_path(&format!("configs[{i}].config"), &p.path),
                    p.message,
                )
            }));
        } else if configs.insert(c.id.clone(), c.config).is_some() {
            issues.push(ConfigIssue::new(
                format!("configs[{i}].id"),
                format!("{:?} is declared twice", c.id),
            ));
        }
    }

    let pipeline_values = raw.pipeline.unwrap_or_else(default_pipeline);
    let mut pipeline = Vec::new();
    for (i, entry) in pipeline_values.into_iter().enumerate() {
        let path = format!("pipeline[{i}]");
        match pipeline_entry(entry) {
            Ok(e) => {
                if let Err(plugin_issues) = e.descriptor.check(&e.config) {
                    issues.extend(
                        plugin_issues
                            .into_iter()
                            .map(|x| ConfigIssue::new(join_path(&path, &x.path), x.message)),
                    );
                }
                pipeline.push(e);
            }
            Err(x) => issues.push(ConfigIssue::new(join_path(&path, &x.path), x.message)),
        }
    }

    let database_url = overrides
        .database_url
        .clone()
        .or(raw.database_url)
        .unwrap_or_else(|| DEFAULT_DATABASE_URL.to_owned());
    if admin::db::Backend::of_url(&database_url).is_none() {
        issues.push(ConfigIssue::new(
            "database_url",
            format!(
                "{:?} is not a database URL: use sqlite://FILE (or sqlite::memory:) or postgres://...",
                admin::db::redact_url(&database_url)
            ),
        ));
    }

    if !issues.is_empty() {
        return Err(ConfigErrors(issues));
    }
    Ok(GatewayConfig {
        listen,
        admin_listen,
        admin_on_main_listener,
        threads,
        max_body_bytes,
        max_answer_bytes,
        upstream,
        drain_timeout: Duration::from_secs(raw.shutdown.drain_timeout_secs.unwrap_or(30)),
        database_url,
        bootstrap_admin_key: overrides.bootstrap_admin_key.clone(),
        secret_key: overrides.secret_key.clone(),
        redis_url: overrides.redis_url.clone().or(raw.redis_url),
        log: overrides
            .log
            .clone()
            .or(raw.log)
            .unwrap_or_else(|| "info".to_owned()),
        providers,
        provider_base_urls,
        configs,
        pipeline,
        reference_response_headers: raw.compat.reference_response_headers.unwrap_or(true),
        egress: {
            let mut policy = EgressPolicy::default();
            for t in trusted {
                policy.trust(t);
            }
            policy
        },
    })
}

/// A host:port the file names, trusted as the operator's.
fn trusted_endpoint(ep: &Endpoint) -> TrustedHost {
    TrustedHost {
        host: ep.host.to_ascii_lowercase(),
        port: Some(ep.port),
    }
}

/// True when two listen addresses would take the same port: the same port (not 0, which picks
/// a free one) on the same address, or with either on every address (`0.0.0.0`, `[::]`).
fn same_port(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// One issue per bad top-level key (serde stops at the first): every field has a default, so
/// each key can be checked on its own.
fn top_level_issues(json: &Value) -> Vec<ConfigIssue> {
    let issue = |e: serde_path_to_error::Error<serde_json::Error>| {
        let path = e.path().to_string();
        ConfigIssue::new(
            if path == "." { String::new() } else { path },
            e.into_inner().to_string(),
        )
    };
    let Value::Object(map) = json else {
        return match serde_path_to_error::deserialize::<_, raw::RawGatewayConfig>(json) {
            Err(e) => vec![issue(e)],
            Ok(_) => Vec::new(),
        };
    };
    map.iter()
        .filter_map(|(key, value)| {
            let alone = Value::Object([(key.clone(), value.clone())].into_iter().collect());
            serde_path_to_error::deserialize::<_, raw::RawGatewayConfig>(&alone)
                .err()
                .map(issue)
        })
        .collect()
}

/// The pipeline used when the file has none: the same as `configs/gateway.yaml`'s. Requests
/// are authenticated, routed, limited, budgeted, cached, logged (to the database and as a
/// tracing line) and metered; each plugin with its defaults.
pub const DEFAULT_PIPELINE: [&str; 9] = [
    "log_store",
    "auth",
    "provider_select",
    "rate_limit",
    "usage_limit",
    "cache",
    // After the cache: answers are stored only once the output checks passed (responses run
    // the pipeline in reverse), and a refused answer is never stored.
    "guardrails",
    "request_log",
    "metrics",
];

fn default_pipeline() -> Vec<Value> {
    DEFAULT_PIPELINE
        .iter()
        .map(|k| serde_json::json!({ "kind": k }))
        .collect()
}

fn pipeline_entry(entry: Value) -> Result<PipelineEntry, ConfigIssue> {
    let Value::Object(mut map) = entry else {
        return Err(ConfigIssue::new(
            "",
            "a pipeline entry must be a mapping like {kind: request_log}",
        ));
    };
    let kind = match map.remove("kind") {
        Some(Value::String(kind)) => kind,
        Some(_) => return Err(ConfigIssue::new("kind", "must be a string")),
        None => {
            return Err(ConfigIssue::new(
                "kind",
                format!("missing; {}", registered_kinds()),
            ))
        }
    };
    let descriptor = PluginDescriptor::find(&kind).ok_or_else(|| {
        ConfigIssue::new(
            "kind",
            format!("unknown plugin kind {kind:?}; {}", registered_kinds()),
        )
    })?;
    Ok(PipelineEntry {
        kind,
        config: Value::Object(map),
        descriptor,
    })
}

fn registered_kinds() -> String {
    let kinds: Vec<_> = PluginDescriptor::all().iter().map(|d| d.kind).collect();
    format!("registered kinds: {}", kinds.join(", "))
}

fn join_path(prefix: &str, rest: &str) -> String {
    match rest {
        "" | "." => prefix.to_owned(),
        r if r.starts_with('[') => format!("{prefix}{r}"),
        r => format!("{prefix}.{r}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(yaml: &str) -> Result<GatewayConfig, ConfigErrors> {
        plugins::link();
        GatewayConfig::from_yaml(yaml, &Overrides::default())
    }

    fn paths(yaml: &str) -> Vec<String> {
        load(yaml)
            .unwrap_err()
            .0
            .into_iter()
            .map(|i| i.path)
            .collect()
    }

    #[test]
    fn an_empty_file_gets_the_defaults() {
        let c = load("").unwrap();
        assert_eq!(c.listen, "127.0.0.1:8787".parse().unwrap());
        assert_eq!(c.max_body_bytes, DEFAULT_MAX_BODY_BYTES);
        let kinds: Vec<_> = c.pipeline.iter().map(|p| p.kind.as_str()).collect();
        assert_eq!(kinds, DEFAULT_PIPELINE);
        // The shipped file runs the same pipeline.
        let shipped = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../configs/gateway.yaml"
        ))
        .unwrap();
        let shipped_kinds: Vec<&str> = shipped
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix("- kind: "))
            .map(str::trim)
            .collect();
        assert_eq!(shipped_kinds, DEFAULT_PIPELINE);
    }

    #[test]
    fn every_error_is_reported_with_its_path() {
        let yaml = r#"
listen: "nowhere"
providers:
  - {slug: a, provider: openai}
  - {slug: a, provider: not-a-provider, custom_host: "ftp://x"}
  - {slug: b, provider: groq, colour: red}
pipeline:
  - kind: provider_select
  - kind: no_such_plugin
  - kind: request_log
    level: loud
  - kind: metrics
    max_models: 0
  - {}
"#;
        let found = paths(yaml);
        for want in [
            "listen",
            "providers[1].slug",
            "providers[1].provider",
            "providers[1].custom_host",
            "providers[2].colour",
            "pipeline[1].kind",
            "pipeline[2].level",
            "pipeline[3].max_models",
            "pipeline[4].kind",
        ] {
            assert!(found.iter().any(|p| p == want), "{want} not in {found:?}");
        }
        let errors = load(yaml).unwrap_err();
        let text = errors.to_string();
        let kinds = text
            .lines()
            .find_map(|l| l.split_once("registered kinds: ").map(|(_, k)| k))
            .unwrap_or_else(|| panic!("no list of kinds in {text}"));
        for kind in ["auth", "cache", "metrics", "provider_select", "request_log"] {
            assert!(
                kinds.split(", ").any(|k| k == kind),
                "{kind} not in {kinds}"
            );
        }
        assert!(text.contains("colour"), "{text}");
    }

    #[test]
    fn unknown_top_level_fields_and_bad_yaml_are_refused() {
        assert_eq!(paths("listn: 1.2.3.4:5"), vec!["listn"]);
        let err = load("listen: [unclosed").unwrap_err();
        assert!(err.to_string().contains("invalid YAML"), "{err}");
        assert_eq!(
            paths("upstream: {connect_timeout_ms: 0}"),
            vec!["upstream.connect_timeout_ms"]
        );
    }

    #[test]
    fn every_bad_top_level_key_is_reported() {
        let found = paths("threads: many\nmax_body_byts: 1\nupstream: {raed_timeout_ms: 1}\nlisten: 127.0.0.1:1\n");
        assert_eq!(
            found,
            vec!["max_body_byts", "threads", "upstream.raed_timeout_ms"]
        );
        assert_eq!(paths("[1, 2]").len(), 1);
    }

    #[test]
    fn saved_routing_configs_are_validated_with_their_paths() {
        let found = paths("configs:\n  - id: pc-1\n    config: {strategy: {mode: loadbalance}, targets: [{provider: openai, weight: -1}]}\n");
        assert_eq!(found, vec!["configs[0].config.targets[0].weight"]);
    }

    #[test]
    fn the_database_url_must_name_a_supported_database() {
        assert_eq!(paths("database_url: mysql://h/db"), vec!["database_url"]);
        let c = load("database_url: postgres://u:p@h/db").unwrap();
        assert_eq!(c.database_url, "postgres://u:p@h/db");
        assert_eq!(load("").unwrap().database_url, DEFAULT_DATABASE_URL);
    }

    #[test]
    fn the_admin_listener_is_optional_and_needs_a_port_of_its_own() {
        let c = load("").unwrap();
        assert_eq!(c.admin_listen, None);
        assert!(c.admin_on_main_listener);
        let c = load(
            "listen: 127.0.0.1:8787\nadmin_listen: 127.0.0.1:8788\nadmin_on_main_listener: false",
        )
        .unwrap();
        assert_eq!(c.admin_listen, Some("127.0.0.1:8788".parse().unwrap()));
        assert!(!c.admin_on_main_listener);
        // Another interface on the same port is another address.
        assert!(load("listen: 127.0.0.1:8787\nadmin_listen: 127.0.0.2:8787").is_ok());
        for bad in [
            "listen: 127.0.0.1:8787\nadmin_listen: 127.0.0.1:8787",
            "listen: 0.0.0.0:8787\nadmin_listen: 127.0.0.1:8787",
            "listen: 127.0.0.1:8787\nadmin_listen: \"[::]:8787\"",
            "admin_listen: localhost",
            "admin_listen: 8788",
        ] {
            assert_eq!(paths(bad), vec!["admin_listen"], "{bad}");
        }
        let err = load("listen: 127.0.0.1:8787\nadmin_listen: 127.0.0.1:8787").unwrap_err();
        assert!(err.to_string().contains("must differ from listen"), "{err}");
        // Off the main listener, the control plane needs its own.
        assert_eq!(
            paths("admin_on_main_listener: false"),
            vec!["admin_on_main_listener"]
        );
        assert_eq!(
            paths("admin_on_main_listener: maybe"),
            vec!["admin_on_main_listener"]
        );
        // The environment's address wins; an empty one leaves the file's.
        let with = |admin: &str| {
            GatewayConfig::from_yaml(
                "admin_listen: 127.0.0.1:9001",
                &Overrides {
                    admin_listen: Some(admin.into()),
                    ..Default::default()
                },
            )
            .unwrap()
            .admin_listen
        };
        assert_eq!(
            with("127.0.0.1:9002"),
            Some("127.0.0.1:9002".parse().unwrap())
        );
        assert_eq!(with(""), Some("127.0.0.1:9001".parse().unwrap()));
    }

    #[test]
    fn overrides_win_over_the_file() {
        let c = GatewayConfig::from_yaml(
            "listen: 127.0.0.1:1\nlog: warn",
            &Overrides {
                listen: Some("0.0.0.0:9".into()),
                log: Some("debug".into()),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(c.listen, "0.0.0.0:9".parse().unwrap());
        assert_eq!(c.log, "debug");
    }
}
