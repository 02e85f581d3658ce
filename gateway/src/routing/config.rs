//! The routing config object (`x-gw-config`, a saved config, or a key's default): raw serde
//! types validated into a [`RoutingConfig`] tree (never the reverse).
//!
//! Validation reports every problem in the AB01 family with the path of the offending field,
//! written as the config's own JSON path (`targets[1].weight must be >= 0`). Nodes are addressed
//! in response headers as `config`, `config.targets[1]`, `config.targets[1].targets[0]`.

use std::collections::HashSet;

use regex::Regex;
use serde::Deserialize;
use serde_json::{Map, Value};

use plugin_sdk::headers::GwHeader;
use plugin_sdk::GatewayError;

use crate::providers::table;
use crate::upstream::Endpoint;

/// The error family of config validation failures.
pub const CODE: &str = "AB01";

/// Statuses retried when `retry.on_status_codes` is absent.
pub const DEFAULT_RETRY_STATUSES: &[u16] = &[429, 500, 502, 503, 504];

/// The most attempts a retry may ask for.
pub const MAX_RETRY_ATTEMPTS: u32 = 10;

/// A validated routing config.
#[derive(Debug, Clone)]
pub struct RoutingConfig {
    pub root: Node,
}

/// One node of the tree: a target, or a group of nodes with a strategy.
#[derive(Debug, Clone)]
pub struct Node {
    /// `config`, `config.targets[1]`, ... (the value of `x-gw-last-used-option-index`).
    pub path: String,
    pub name: Option<String>,
    /// Load-balancing weight. Default 1; 0 is never chosen.
    pub weight: f64,
    pub settings: Settings,
    pub kind: NodeKind,
}

#[derive(Debug, Clone)]
pub enum NodeKind {
    Target(TargetRef),
    Group {
        strategy: Strategy,
        targets: Vec<Node>,
    },
}

/// Where a target node sends requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetRef {
    /// A provider id with an optional key.
    Provider {
        id: String,
        api_key: Option<String>,
        /// Provider settings given on the target (`aws_region`, `azure_deployment_id`...).
        settings: Vec<(String, String)>,
    },
    /// A saved provider (`provider: "@slug"` or `virtual_key: "slug"`).
    Saved(String),
}

/// The settings a node may carry. Inheritance: `override_params` merge (the child wins);
/// `retry` and `cache` are the child's own when it has one (replacing the parent's whole, no
/// merge), else the parent's; `request_timeout`, `custom_host`, `forward_headers`, `cb_config`
/// and the hooks are inherited when the child leaves them unset.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    pub override_params: Map<String, Value>,
    pub retry: Option<Retry>,
    pub request_timeout_ms: Option<u64>,
    pub custom_host: Option<String>,
    pub forward_headers: Option<Vec<String>>,
    pub cache: Option<Cache>,
    pub circuit_breaker: Option<CircuitBreaker>,
    pub before_request_hooks: Option<Value>,
    pub after_request_hooks: Option<Value>,
}

impl Settings {
    /// The settings a child node runs with: its own, over what it inherits from `parent`.
    pub fn inherit(&self, parent: &Settings) -> Settings {
        let mut override_params = parent.override_params.clone();
        for (k, v) in &self.override_params {
            override_params.insert(k.clone(), v.clone());
        }
        Settings {
            override_params,
            // The child's own when it has one (replacing the parent's whole), else the parent's.
            retry: self.retry.clone().or_else(|| parent.retry.clone()),
            cache: self.cache.clone().or_else(|| parent.cache.clone()),
            // A group's breaker settings apply to each of its targets.
            circuit_breaker: self
                .circuit_breaker
                .clone()
                .or_else(|| parent.circuit_breaker.clone()),
            request_timeout_ms: self.request_timeout_ms.or(parent.request_timeout_ms),
            custom_host: self
                .custom_host
                .clone()
                .or_else(|| parent.custom_host.clone()),
            forward_headers: self
                .forward_headers
                .clone()
                .or_else(|| parent.forward_headers.clone()),
            before_request_hooks: self
                .before_request_hooks
                .clone()
                .or_else(|| parent.before_request_hooks.clone()),
            after_request_hooks: self
                .after_request_hooks
                .clone()
                .or_else(|| parent.after_request_hooks.clone()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retry {
    pub attempts: u32,
    /// Default: [`DEFAULT_RETRY_STATUSES`].
    pub on_status_codes: Vec<u16>,
    pub use_retry_after_header: bool,
}

/// A node's `cache` settings, as the cache plugin reads them from the target.
pub use plugin_sdk::target::{CacheMode, CacheSettings as Cache};

#[derive(Debug, Clone, PartialEq)]
pub struct CircuitBreaker {
    pub failure_threshold: Option<u32>,
    pub failure_threshold_percentage: Option<f64>,
    pub minimum_requests: u32,
    pub cooldown_interval_ms: u64,
    pub failure_status_codes: Vec<u16>,
}

#[derive(Debug, Clone)]
pub enum Strategy {
    Single,
    /// Go on to the next target on these statuses (any non-2xx when `None`).
    Fallback {
        on_status_codes: Option<Vec<u16>>,
    },
    /// Weighted random; with `sticky`, the same values of these request fields go to the same
    /// target while it is healthy.
    LoadBalance {
        sticky: Option<Vec<String>>,
    },
    /// The first condition that matches names the target; else `default`.
    Conditional {
        conditions: Vec<Condition>,
        default: Option<String>,
    },
}

#[derive(Debug, Clone)]
pub struct Condition {
    pub query: Query,
    /// The `name` of a target of the same group.
    pub then: String,
}

/// A condition over the request: `metadata.<k>`, `params.<k>` (the body) and `url.pathname`.
#[derive(Debug, Clone)]
pub enum Query {
    All(Vec<Query>),
    Any(Vec<Query>),
    Field { field: String, op: Op },
}

#[derive(Debug, Clone)]
pub enum Op {
    Eq(Value),
    Ne(Value),
    Gt(f64),
    Gte(f64),
    Lt(f64),
    Lte(f64),
    In(Vec<Value>),
    Nin(Vec<Value>),
    Regex(Regex),
}

// ---------------------------------------------------------------------------------------------
// Raw types, as written.

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNode {
    #[serde(default)]
    strategy: Option<RawStrategy>,
    #[serde(default)]
    targets: Option<Vec<Value>>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    provider: Option<String>,
    #[serde(default)]
    api_key: Option<String>,
    #[serde(default)]
    virtual_key: Option<String>,
    #[serde(default)]
    custom_host: Option<String>,
    #[serde(default)]
    weight: Option<f64>,
    #[serde(default)]
    override_params: Option<Map<String, Value>>,
    #[serde(default)]
    retry: Option<RawRetry>,
    #[serde(default)]
    request_timeout: Option<u64>,
    #[serde(default)]
    cache: Option<RawCache>,
    #[serde(default)]
    forward_headers: Option<Vec<String>>,
    #[serde(default)]
    cb_config: Option<RawCircuitBreaker>,
    #[serde(default)]
    azure_resource_name: Option<String>,
    #[serde(default)]
    azure_deployment_id: Option<String>,
    #[serde(default)]
    azure_api_version: Option<String>,
    #[serde(default)]
    azure_model_name: Option<String>,
    #[serde(default)]
    vertex_project_id: Option<String>,
    #[serde(default)]
    vertex_region: Option<String>,
    #[serde(default)]
    aws_access_key_id: Option<String>,
    #[serde(default)]
    aws_secret_access_key: Option<String>,
    #[serde(default)]
    aws_session_token: Option<String>,
    #[serde(default)]
    aws_region: Option<String>,
    #[serde(default, alias = "input_guardrails")]
    before_request_hooks: Option<Value>,
    #[serde(default, alias = "output_guardrails")]
    after_request_hooks: Option<Value>,
}

impl RawNode {
    /// The provider settings written on the node, as (name, value).
    fn provider_settings(&self) -> Vec<(String, String)> {
        [
            ("azure_resource_name", &self.azure_resource_name),
            ("azure_deployment_id", &self.azure_deployment_id),
            ("azure_api_version", &self.azure_api_version),
            ("azure_model_name", &self.azure_model_name),
            ("vertex_project_id", &self.vertex_project_id),
            ("vertex_region", &self.vertex_region),
            ("aws_access_key_id", &self.aws_access_key_id),
            ("aws_secret_access_key", &self.aws_secret_access_key),
            ("aws_session_token", &self.aws_session_token),
            ("aws_region", &self.aws_region),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| (k.to_owned(), v.clone())))
        .collect()
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStrategy {
    mode: String,
    #[serde(default)]
    on_status_codes: Option<Vec<u16>>,
    #[serde(default)]
    conditions: Option<Vec<RawCondition>>,
    #[serde(default)]
    default: Option<String>,
    #[serde(default)]
    sticky: Option<RawSticky>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSticky {
    hash_fields: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCondition {
    query: Value,
    then: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRetry {
    attempts: u32,
    #[serde(default)]
    on_status_codes: Option<Vec<u16>>,
    #[serde(default)]
    use_retry_after_header: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCache {
    mode: String,
    #[serde(default)]
    max_age: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCircuitBreaker {
    #[serde(default)]
    failure_threshold: Option<u32>,
    #[serde(default)]
    failure_threshold_percentage: Option<f64>,
    #[serde(default)]
    minimum_requests: Option<u32>,
    /// Milliseconds.
    #[serde(default)]
    cooldown_interval: Option<u64>,
    #[serde(default)]
    failure_status_codes: Option<Vec<u16>>,
}

// ---------------------------------------------------------------------------------------------
// Validation.

/// One validation problem: the JSON path in the config and what is wrong there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{} {}", self.path, self.message)
        }
    }
}

impl RoutingConfig {
    /// Validates a config, reporting every problem.
    pub fn parse(value: &Value) -> Result<RoutingConfig, Vec<ConfigProblem>> {
        let mut problems = Vec::new();
        let root = parse_node(value, "", "config", &mut problems);
        if let Some(root) = &root {
            check_saved_hosts(root, None, &mut problems);
        }
        match root {
            Some(root) if problems.is_empty() => Ok(RoutingConfig { root }),
            _ => Err(problems),
        }
    }

    /// Validates a config for a request: the problems become one 400 in the AB01 family.
    pub fn parse_for_request(value: &Value) -> Result<RoutingConfig, GatewayError> {
        RoutingConfig::parse(value).map_err(|problems| {
            let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
            GatewayError::invalid_param(
                GwHeader::CONFIG.primary,
                format!("invalid config: {}", text.join("; ")),
            )
            .with_code(CODE)
        })
    }
}

/// A saved provider's key goes only to the host saved with it: a target naming a saved provider
/// may not set `custom_host` nor inherit one. `inherited` is the JSON path of the nearest
/// ancestor's `custom_host`.
fn check_saved_hosts(node: &Node, inherited: Option<&str>, problems: &mut Vec<ConfigProblem>) {
    let path = node
        .path
        .strip_prefix("config")
        .unwrap_or(&node.path)
        .trim_start_matches('.');
    let own = node
        .settings
        .custom_host
        .as_ref()
        .map(|_| join(path, "custom_host"));
    let host_at = own.as_deref().or(inherited);
    match &node.kind {
        NodeKind::Target(TargetRef::Saved(_)) => {
            if let Some(at) = host_at {
                problem(
                    problems,
                    at.to_owned(),
                    format!(
                        "{} names a saved provider, whose key goes only to the host saved with \
                         it: remove custom_host, or use a provider id with an api_key of its own",
                        if path.is_empty() { "the config" } else { path }
                    ),
                );
            }
        }
        NodeKind::Target(TargetRef::Provider { .. }) => {}
        NodeKind::Group { targets, .. } => {
            for child in targets {
                check_saved_hosts(child, host_at, problems);
            }
        }
    }
}

fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_owned()
    } else if field.starts_with('[') {
        format!("{path}{field}")
    } else {
        format!("{path}.{field}")
    }
}

fn problem(problems: &mut Vec<ConfigProblem>, path: String, message: impl Into<String>) {
    problems.push(ConfigProblem {
        path,
        message: message.into(),
    });
}

fn check_statuses(codes: &[u16], path: String, problems: &mut Vec<ConfigProblem>) {
    if let Some(bad) = codes.iter().find(|c| !(100..=599).contains(*c)) {
        problem(
            problems,
            path,
            format!("must hold HTTP statuses (100-599), got {bad}"),
        );
    }
}

/// Parses one node; `path` is its JSON path (`targets[1]`), `index` its header form
/// (`config.targets[1]`).
fn parse_node(
    value: &Value,
    path: &str,
    index: &str,
    problems: &mut Vec<ConfigProblem>,
) -> Option<Node> {
    if !value.is_object() {
        problem(problems, path.to_owned(), "must be an object");
        return None;
    }
    let raw: RawNode = match serde_path_to_error::deserialize(value) {
        Ok(raw) => raw,
        Err(e) => {
            let inner = e.path().to_string();
            let at = if inner == "." {
                path.to_owned()
            } else {
                join(path, &inner)
            };
            problem(problems, at, e.into_inner().to_string());
            return None;
        }
    };

    let weight = raw.weight.unwrap_or(1.0);
    if !(weight >= 0.0 && weight.is_finite()) {
        problem(problems, join(path, "weight"), "must be >= 0");
    }
    let settings = parse_settings(&raw, path, problems);

    let target_ref = match (&raw.provider, &raw.virtual_key) {
        (Some(_), Some(_)) => {
            problem(
                problems,
                join(path, "virtual_key"),
                "cannot be used together with provider",
            );
            None
        }
        (Some(p), None) => match p.strip_prefix('@') {
            Some(slug) if !slug.is_empty() => Some(TargetRef::Saved(slug.to_owned())),
            Some(_) => {
                problem(
                    problems,
                    join(path, "provider"),
                    "@ must be followed by a slug",
                );
                None
            }
            None if table::find(p).is_some() => Some(TargetRef::Provider {
                id: p.clone(),
                api_key: raw.api_key.clone(),
                settings: raw.provider_settings(),
            }),
            None => {
                problem(
                    problems,
                    join(path, "provider"),
                    format!(
                        "unknown provider {p:?}; known providers: {}",
                        table::known_ids()
                    ),
                );
                None
            }
        },
        (None, Some(vk)) if !vk.is_empty() => Some(TargetRef::Saved(vk.clone())),
        (None, Some(_)) => {
            problem(problems, join(path, "virtual_key"), "must not be empty");
            None
        }
        (None, None) => None,
    };
    if raw.api_key.is_some()
        && !matches!(target_ref, Some(TargetRef::Provider { .. }))
        && raw.provider.is_none()
    {
        problem(problems, join(path, "api_key"), "needs a provider");
    }

    let kind = match (raw.targets, target_ref) {
        (Some(_), Some(_)) => {
            problem(
                problems,
                join(path, "targets"),
                "a node has either targets or a provider, not both",
            );
            return None;
        }
        (Some(targets), None) => {
            let strategy_path = join(path, "strategy");
            if targets.is_empty() {
                problem(problems, join(path, "targets"), "must not be empty");
            }
            let children: Vec<Node> = targets
                .iter()
                .enumerate()
                .filter_map(|(i, t)| {
                    parse_node(
                        t,
                        &join(path, &format!("targets[{i}]")),
                        &format!("{index}.targets[{i}]"),
                        problems,
                    )
                })
                .collect();
            let strategy = parse_strategy(
                raw.strategy,
                &strategy_path,
                &children,
                targets.len(),
                problems,
            )?;
            NodeKind::Group {
                strategy,
                targets: children,
            }
        }
        (None, Some(target)) => {
            if raw.strategy.is_some() {
                problem(problems, join(path, "strategy"), "needs targets");
            }
            NodeKind::Target(target)
        }
        (None, None) => {
            problem(
                problems,
                path.to_owned(),
                "needs a provider (a provider id or @slug), a virtual_key, or targets",
            );
            return None;
        }
    };
    Some(Node {
        path: index.to_owned(),
        name: raw.name,
        weight,
        settings,
        kind,
    })
}

fn parse_settings(raw: &RawNode, path: &str, problems: &mut Vec<ConfigProblem>) -> Settings {
    let retry = raw.retry.as_ref().map(|r| {
        if r.attempts > MAX_RETRY_ATTEMPTS {
            problem(
                problems,
                join(path, "retry.attempts"),
                format!("must be at most {MAX_RETRY_ATTEMPTS}"),
            );
        }
        let codes = r
            .on_status_codes
            .clone()
            .unwrap_or_else(|| DEFAULT_RETRY_STATUSES.to_vec());
        check_statuses(&codes, join(path, "retry.on_status_codes"), problems);
        Retry {
            attempts: r.attempts,
            on_status_codes: codes,
            use_retry_after_header: r.use_retry_after_header.unwrap_or(false),
        }
    });
    if raw.request_timeout == Some(0) {
        problem(
            problems,
            join(path, "request_timeout"),
            "must be at least 1 millisecond",
        );
    }
    if let Some(host) = &raw.custom_host {
        if let Err(e) = Endpoint::parse(host) {
            problem(problems, join(path, "custom_host"), e);
        }
    }
    let cache = raw.cache.as_ref().and_then(|c| {
        let mode = match c.mode.as_str() {
            "simple" => CacheMode::Simple,
            "semantic" => CacheMode::Semantic,
            other => {
                problem(
                    problems,
                    join(path, "cache.mode"),
                    format!("must be simple or semantic, got {other:?}"),
                );
                return None;
            }
        };
        if c.max_age == Some(0) {
            problem(
                problems,
                join(path, "cache.max_age"),
                "must be at least 1 second",
            );
        }
        Some(Cache {
            mode,
            max_age_secs: c.max_age,
        })
    });
    let circuit_breaker = raw.cb_config.as_ref().map(|cb| {
        if cb.failure_threshold.is_none() && cb.failure_threshold_percentage.is_none() {
            problem(
                problems,
                join(path, "cb_config"),
                "needs failure_threshold or failure_threshold_percentage",
            );
        }
        if cb.failure_threshold == Some(0) {
            problem(
                problems,
                join(path, "cb_config.failure_threshold"),
                "must be at least 1",
            );
        }
        if let Some(p) = cb.failure_threshold_percentage {
            if !(p > 0.0 && p <= 100.0) {
                problem(
                    problems,
                    join(path, "cb_config.failure_threshold_percentage"),
                    "must be between 0 (exclusive) and 100",
                );
            }
        }
        if cb.cooldown_interval == Some(0) {
            problem(
                problems,
                join(path, "cb_config.cooldown_interval"),
                "must be at least 1 millisecond",
            );
        }
        let codes = cb
            .failure_status_codes
            .clone()
            .unwrap_or_else(|| (500..=599).collect());
        check_statuses(
            &codes,
            join(path, "cb_config.failure_status_codes"),
            problems,
        );
        CircuitBreaker {
            failure_threshold: cb.failure_threshold,
            failure_threshold_percentage: cb.failure_threshold_percentage,
            minimum_requests: cb.minimum_requests.unwrap_or(1),
            cooldown_interval_ms: cb.cooldown_interval.unwrap_or(30_000),
            failure_status_codes: codes,
        }
    });
    Settings {
        override_params: raw.override_params.clone().unwrap_or_default(),
        retry,
        request_timeout_ms: raw.request_timeout,
        custom_host: raw.custom_host.clone(),
        forward_headers: raw.forward_headers.clone(),
        cache,
        circuit_breaker,
        before_request_hooks: raw.before_request_hooks.clone(),
        after_request_hooks: raw.after_request_hooks.clone(),
    }
}

fn parse_strategy(
    raw: Option<RawStrategy>,
    path: &str,
    children: &[Node],
    count: usize,
    problems: &mut Vec<ConfigProblem>,
) -> Option<Strategy> {
    let Some(raw) = raw else {
        if count > 1 {
            problem(
                problems,
                path.to_owned(),
                "is required when there are several targets",
            );
        }
        return Some(Strategy::Single);
    };
    if let Some(codes) = &raw.on_status_codes {
        check_statuses(codes, join(path, "on_status_codes"), problems);
    }
    let sticky_given = raw.sticky.is_some();
    let names: HashSet<&str> = children.iter().filter_map(|c| c.name.as_deref()).collect();
    let strategy = match raw.mode.as_str() {
        "single" => {
            if count > 1 {
                problem(
                    problems,
                    join(path, "mode"),
                    "single takes exactly one target",
                );
            }
            Strategy::Single
        }
        "fallback" => Strategy::Fallback {
            on_status_codes: raw.on_status_codes,
        },
        "loadbalance" => {
            if !children.is_empty() && children.iter().all(|c| c.weight == 0.0) {
                problem(
                    problems,
                    path.to_owned(),
                    "loadbalance needs a target with a weight above 0",
                );
            }
            let sticky = raw.sticky.map(|s| {
                if s.hash_fields.is_empty() {
                    problem(
                        problems,
                        join(path, "sticky.hash_fields"),
                        "must not be empty",
                    );
                }
                for (i, f) in s.hash_fields.iter().enumerate() {
                    if !is_request_field(f) {
                        problem(
                            problems,
                            join(path, &format!("sticky.hash_fields[{i}]")),
                            format!(
                                "must be metadata.<key>, params.<key> or url.pathname, got {f:?}"
                            ),
                        );
                    }
                }
                s.hash_fields
            });
            Strategy::LoadBalance { sticky }
        }
        "conditional" => {
            let mut seen = HashSet::new();
            for c in children {
                if let Some(n) = c.name.as_deref() {
                    if !seen.insert(n) {
                        problem(
                            problems,
                            join(&c.path, "name"),
                            format!("{n:?} is used twice"),
                        );
                    }
                }
            }
            let conditions = raw.conditions.unwrap_or_default();
            if conditions.is_empty() {
                problem(
                    problems,
                    join(path, "conditions"),
                    "must not be empty for conditional",
                );
            }
            let parsed = conditions
                .into_iter()
                .enumerate()
                .filter_map(|(i, c)| {
                    let at = join(path, &format!("conditions[{i}]"));
                    if !names.contains(c.then.as_str()) {
                        problem(
                            problems,
                            join(&at, "then"),
                            format!("names no target: {:?}", c.then),
                        );
                    }
                    parse_query(&c.query, &join(&at, "query"), problems).map(|query| Condition {
                        query,
                        then: c.then,
                    })
                })
                .collect();
            if let Some(d) = &raw.default {
                if !names.contains(d.as_str()) {
                    problem(
                        problems,
                        join(path, "default"),
                        format!("names no target: {d:?}"),
                    );
                }
            }
            Strategy::Conditional {
                conditions: parsed,
                default: raw.default,
            }
        }
        other => {
            problem(
                problems,
                join(path, "mode"),
                format!("must be single, fallback, loadbalance or conditional, got {other:?}"),
            );
            return None;
        }
    };
    if sticky_given && !matches!(strategy, Strategy::LoadBalance { .. }) {
        problem(
            problems,
            join(path, "sticky"),
            "applies to loadbalance only",
        );
    }
    Some(strategy)
}

fn is_request_field(field: &str) -> bool {
    field == "url.pathname"
        || field
            .strip_prefix("metadata.")
            .is_some_and(|k| !k.is_empty())
        || field.strip_prefix("params.").is_some_and(|k| !k.is_empty())
}

/// Parses a query object: several keys are an implicit `$and`; `$and` / `$or` take lists;
/// a field maps to a literal (`$eq`) or to an operator object.
fn parse_query(value: &Value, path: &str, problems: &mut Vec<ConfigProblem>) -> Option<Query> {
    let Value::Object(map) = value else {
        problem(problems, path.to_owned(), "must be an object");
        return None;
    };
    let mut parts = Vec::new();
    for (key, v) in map {
        let at = join(path, key);
        match key.as_str() {
            "$and" | "$or" => {
                let Value::Array(items) = v else {
                    problem(problems, at, "must be a list of queries");
                    continue;
                };
                let subs: Vec<Query> = items
                    .iter()
                    .enumerate()
                    .filter_map(|(i, q)| parse_query(q, &join(&at, &format!("[{i}]")), problems))
                    .collect();
                parts.push(if key == "$and" {
                    Query::All(subs)
                } else {
                    Query::Any(subs)
                });
            }
            field if is_request_field(field) => match v {
                Value::Object(ops) if ops.keys().any(|k| k.starts_with('$')) => {
                    for (op, operand) in ops {
                        if let Some(op) = parse_op(op, operand, &join(&at, op), problems) {
                            parts.push(Query::Field {
                                field: field.to_owned(),
                                op,
                            });
                        }
                    }
                }
                literal => parts.push(Query::Field {
                    field: field.to_owned(),
                    op: Op::Eq(literal.clone()),
                }),
            },
            other => problem(
                problems,
                at,
                format!("{other:?} is not metadata.<key>, params.<key>, url.pathname, $and or $or"),
            ),
        }
    }
    Some(if parts.len() == 1 {
        parts.remove(0)
    } else {
        Query::All(parts)
    })
}

fn parse_op(
    op: &str,
    operand: &Value,
    path: &str,
    problems: &mut Vec<ConfigProblem>,
) -> Option<Op> {
    let number = |problems: &mut Vec<ConfigProblem>| {
        let n = operand.as_f64();
        if n.is_none() {
            problem(problems, path.to_owned(), "must be a number");
        }
        n
    };
    let list = |problems: &mut Vec<ConfigProblem>| match operand {
        Value::Array(items) => Some(items.clone()),
        _ => {
            problem(problems, path.to_owned(), "must be a list");
            None
        }
    };
    Some(match op {
        "$eq" => Op::Eq(operand.clone()),
        "$ne" => Op::Ne(operand.clone()),
        "$gt" => Op::Gt(number(problems)?),
        "$gte" => Op::Gte(number(problems)?),
        "$lt" => Op::Lt(number(problems)?),
        "$lte" => Op::Lte(number(problems)?),
        "$in" => Op::In(list(problems)?),
        "$nin" => Op::Nin(list(problems)?),
        "$regex" => {
            let Some(pattern) = operand.as_str() else {
                problem(
                    problems,
                    path.to_owned(),
                    "must be a regular expression string",
                );
                return None;
            };
            match Regex::new(pattern) {
                Ok(re) => Op::Regex(re),
                Err(e) => {
                    problem(
                        problems,
                        path.to_owned(),
                        format!("is not a valid regular expression: {e}"),
                    );
                    return None;
                }
            }
        }
        other => {
            problem(
                problems,
                path.to_owned(),
                format!(
                    "unknown operator {other:?}; use $eq $ne $gt $gte $lt $lte $in $nin $regex"
                ),
            );
            return None;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn problems(v: Value) -> Vec<String> {
        RoutingConfig::parse(&v)
            .err()
            .unwrap_or_default()
            .into_iter()
            .map(|p| p.to_string())
            .collect()
    }

    #[test]
    fn a_full_config_parses_into_a_tree_with_header_paths() {
        let c = RoutingConfig::parse(&json!({
            "strategy": {"mode": "fallback", "on_status_codes": [429, 503]},
            "request_timeout": 5000,
            "override_params": {"temperature": 0.2},
            "targets": [
                {"provider": "openai", "api_key": "k", "retry": {"attempts": 3}},
                {"strategy": {"mode": "loadbalance", "sticky": {"hash_fields": ["metadata.user"]}},
                 "targets": [
                    {"provider": "@groq-prod", "weight": 0.7},
                    {"virtual_key": "vk-2", "weight": 0.3, "override_params": {"model": "m"}}
                 ]}
            ]
        }))
        .unwrap();
        let NodeKind::Group { strategy, targets } = &c.root.kind else {
            panic!()
        };
        assert!(
            matches!(strategy, Strategy::Fallback { on_status_codes: Some(c) } if c == &vec![429, 503])
        );
        assert_eq!(c.root.path, "config");
        assert_eq!(targets[1].path, "config.targets[1]");
        let NodeKind::Group { targets: inner, .. } = &targets[1].kind else {
            panic!()
        };
        assert_eq!(inner[1].path, "config.targets[1].targets[1]");
        assert!(
            matches!(&inner[0].kind, NodeKind::Target(TargetRef::Saved(s)) if s == "groq-prod")
        );
        assert_eq!(inner[0].weight, 0.7);
        let retry = targets[0].settings.retry.clone().unwrap();
        assert_eq!(retry.on_status_codes, DEFAULT_RETRY_STATUSES);
        // Inheritance: params merge with the child winning; timeout inherited.
        let child = inner[1].settings.inherit(&c.root.settings);
        assert_eq!(
            child.override_params,
            json!({"temperature": 0.2, "model": "m"})
                .as_object()
                .unwrap()
                .clone()
        );
        assert_eq!(child.request_timeout_ms, Some(5000));
        assert!(child.retry.is_none());
    }

    #[test]
    fn every_problem_is_reported_with_its_path() {
        let found = problems(json!({
            "strategy": {"mode": "conditional",
                "conditions": [
                    {"query": {"metadata.tier": {"$eq": "paid"}}, "then": "fast"},
                    {"query": {"params.n": {"$gt": "x"}}, "then": "nowhere"},
                    {"query": {"headers.x": 1}, "then": "fast"}
                ],
                "default": "missing"},
            "targets": [
                {"name": "fast", "provider": "openai"},
                {"name": "slow", "provider": "not-a-provider", "weight": -1},
                {"provider": "openai", "retry": {"attempts": 50, "on_status_codes": [999]}},
                {"provider": "openai", "cache": {"mode": "fuzzy"}, "request_timeout": 0},
                {"targets": []},
                {"provider": "openai", "colour": "red"}
            ]
        }));
        for want in [
            "strategy.conditions[1].then names no target",
            "strategy.conditions[1].query.params.n.$gt must be a number",
            "strategy.conditions[2].query.headers.x",
            "strategy.default names no target",
            "targets[1].provider unknown provider",
            "targets[1].weight must be >= 0",
            "targets[2].retry.attempts must be at most 10",
            "targets[2].retry.on_status_codes must hold HTTP statuses",
            "targets[3].cache.mode must be simple or semantic",
            "targets[3].request_timeout must be at least 1",
            "targets[4].targets must not be empty",
            "targets[5].colour unknown field",
        ] {
            assert!(
                found.iter().any(|f| f.starts_with(want)),
                "{want:?} not in {found:#?}"
            );
        }
    }

    #[test]
    fn shape_rules() {
        assert!(problems(json!({"provider": "openai"})).is_empty());
        assert!(problems(json!({"provider": "@prod"})).is_empty());
        assert!(problems(json!({"virtual_key": "vk"})).is_empty());
        let p = problems(json!({"api_key": "k"}));
        assert!(p.iter().any(|p| p.contains("needs a provider")), "{p:?}");
        let p = problems(json!({"targets": [{"provider": "openai"}, {"provider": "groq"}]}));
        assert_eq!(p, ["strategy is required when there are several targets"]);
        let p = problems(
            json!({"strategy": {"mode": "roundrobin"}, "targets": [{"provider": "openai"}]}),
        );
        assert!(
            p[0].starts_with("strategy.mode must be single, fallback"),
            "{p:?}"
        );
        let p = problems(
            json!({"strategy": {"mode": "loadbalance"}, "targets": [{"provider": "openai", "weight": 0}]}),
        );
        assert!(p[0].contains("weight above 0"), "{p:?}");
        let p = problems(
            json!({"strategy": {"mode": "fallback", "sticky": {"hash_fields": ["metadata.u"]}}, "targets": [{"provider": "openai"}]}),
        );
        assert_eq!(p, ["strategy.sticky applies to loadbalance only"]);
        let p = problems(json!({"provider": "openai", "targets": [{"provider": "groq"}]}));
        assert!(p[0].contains("either targets or a provider"), "{p:?}");
        let p = problems(
            json!({"strategy": {"mode": "conditional", "conditions": [{"query": {"metadata.a": {"$regex": "("}}, "then": "x"}]}, "targets": [{"name": "x", "provider": "openai"}]}),
        );
        assert!(p[0].contains("not a valid regular expression"), "{p:?}");
        assert_eq!(problems(json!([1])), ["must be an object"]);
    }

    #[test]
    fn a_request_gets_one_400_in_the_ab01_family() {
        let err = RoutingConfig::parse_for_request(&json!({"strategy": {"mode": "loadbalance"}, "targets": [{"provider": "openai", "weight": -2}]})).unwrap_err();
        assert_eq!(err.status().as_u16(), 400);
        assert_eq!(err.code.as_deref(), Some("AB01"));
        assert_eq!(err.param.as_deref(), Some("x-gw-config"));
        assert!(
            err.message.contains("targets[0].weight must be >= 0"),
            "{}",
            err.message
        );
    }
}
