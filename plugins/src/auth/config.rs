//! The `auth` pipeline entry: its YAML shape and the checks made before it is built.

use std::path::PathBuf;

use jsonwebtoken::Algorithm;
use serde::{Deserialize, Deserializer};

use plugin_sdk::ConfigIssue;

/// The `auth` pipeline entry.
///
/// ```yaml
/// - kind: auth
///   required: true
///   jwt:
///     jwks_url: https://idp.example.com/.well-known/jwks.json
///     issuer: https://idp.example.com/
///     audience: ai-gateway
/// ```
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// Whether every request must carry credentials. `false`: a request with none goes on
    /// anonymously (local use, benchmarks); credentials that are sent are still checked.
    /// Default: true.
    #[serde(default = "yes")]
    pub required: bool,
    /// JWT authentication beside API keys. Default: off (API keys only).
    #[serde(default)]
    pub jwt: Option<JwtConfig>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            required: true,
            jwt: None,
        }
    }
}

fn yes() -> bool {
    true
}

/// A signature algorithm a JWT may use. Only asymmetric ones: a JWKS publishes public keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum JwtAlgorithm {
    RS256,
    ES256,
}

impl JwtAlgorithm {
    pub fn algorithm(self) -> Algorithm {
        match self {
            JwtAlgorithm::RS256 => Algorithm::RS256,
            JwtAlgorithm::ES256 => Algorithm::ES256,
        }
    }
}

/// `jwt:`: where the signing keys come from and what a token must say.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtConfig {
    /// A JWKS served over HTTP(S): fetched when the gateway starts (it refuses to start if the
    /// fetch fails), then every `refresh_secs` in the background. Exactly one of `jwks_url` and
    /// `jwks_file`.
    #[serde(default)]
    pub jwks_url: Option<String>,
    /// A JWKS file: read when the gateway starts and again on reload (SIGHUP).
    #[serde(default)]
    pub jwks_file: Option<PathBuf>,
    /// Seconds between two background fetches of `jwks_url`. Default: 300.
    #[serde(default = "default_refresh_secs")]
    pub refresh_secs: u64,
    /// The shortest time, in seconds, between two early fetches of `jwks_url` caused by tokens
    /// naming a key id the set does not hold (so that made-up ids cannot hammer the identity
    /// provider). Default: 30.
    #[serde(default = "default_min_refresh_secs")]
    pub min_refresh_secs: u64,
    /// The accepted `iss` (one string or a list); when set, tokens must carry it. `issuer`,
    /// `audience` or both must be set: without either, a token the identity provider minted
    /// for any other application would be taken.
    #[serde(default, deserialize_with = "one_or_many")]
    pub issuer: Option<Vec<String>>,
    /// The accepted `aud` (one string or a list); when set, tokens must carry one of them.
    /// See `issuer`: one of the two is required.
    #[serde(default, deserialize_with = "one_or_many")]
    pub audience: Option<Vec<String>>,
    /// Accepted signature algorithms. Default: `[RS256, ES256]`.
    #[serde(default = "default_algorithms")]
    pub algorithms: Vec<JwtAlgorithm>,
    /// Clock skew allowed on `exp` and `nbf`, in seconds. Default: 30.
    #[serde(default = "default_leeway_secs")]
    pub leeway_secs: u64,
    /// Which claims say what. Default: see [`ClaimsConfig`].
    #[serde(default)]
    pub claims: ClaimsConfig,
    /// The scopes of a token that carries no scopes claim (one or a list), e.g.
    /// `completions.write`. Default: none, so such a token has no rights (403).
    #[serde(default, deserialize_with = "one_or_many_or_none")]
    pub default_scopes: Vec<String>,
}

fn default_refresh_secs() -> u64 {
    300
}

fn default_min_refresh_secs() -> u64 {
    30
}

fn default_algorithms() -> Vec<JwtAlgorithm> {
    vec![JwtAlgorithm::RS256, JwtAlgorithm::ES256]
}

fn default_leeway_secs() -> u64 {
    30
}

/// The longest clock skew accepted in `leeway_secs`.
const MAX_LEEWAY_SECS: u64 = 600;

/// The names of the claims the plugin reads (top-level claim names, used as they are: a
/// name may contain dots or slashes, as namespaced custom claims do).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimsConfig {
    /// The workspace the token acts in. Default: `workspace_id`.
    #[serde(default = "claim_workspace_id")]
    pub workspace_id: String,
    /// The organisation. Default: `organisation_id`.
    #[serde(default = "claim_organisation_id")]
    pub organisation_id: String,
    /// The user; also names the token's rate-limit and budget counters. Default: `sub`.
    #[serde(default = "claim_user")]
    pub user: String,
    /// Where the scopes are, tried in order (one name or a list): a string is split on
    /// spaces, an array is taken as it is. Default: `[scope, scopes]`.
    #[serde(default = "claim_scopes", deserialize_with = "one_or_many_required")]
    pub scopes: Vec<String>,
    /// Optional rate limits: an array of `{type, unit, value}`. Default: `rate_limits`.
    #[serde(default = "claim_rate_limits")]
    pub rate_limits: String,
    /// Optional budgets: one usage limit object or an array of them. Default: `usage_limits`.
    #[serde(default = "claim_usage_limits")]
    pub usage_limits: String,
}

impl Default for ClaimsConfig {
    fn default() -> Self {
        ClaimsConfig {
            workspace_id: claim_workspace_id(),
            organisation_id: claim_organisation_id(),
            user: claim_user(),
            scopes: claim_scopes(),
            rate_limits: claim_rate_limits(),
            usage_limits: claim_usage_limits(),
        }
    }
}

fn claim_workspace_id() -> String {
    "workspace_id".into()
}
fn claim_organisation_id() -> String {
    "organisation_id".into()
}
fn claim_user() -> String {
    "sub".into()
}
fn claim_scopes() -> Vec<String> {
    vec!["scope".into(), "scopes".into()]
}
fn claim_rate_limits() -> String {
    "rate_limits".into()
}
fn claim_usage_limits() -> String {
    "usage_limits".into()
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl From<OneOrMany> for Vec<String> {
    fn from(v: OneOrMany) -> Self {
        match v {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

fn one_or_many<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    let value = Option::<OneOrMany>::deserialize(d)
        .map_err(|_| serde::de::Error::custom("expected a string or a list of strings"))?;
    Ok(value.map(Vec::from))
}

fn one_or_many_or_none<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(one_or_many(d)?.unwrap_or_default())
}

fn one_or_many_required<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    OneOrMany::deserialize(d)
        .map(Vec::from)
        .map_err(|_| serde::de::Error::custom("expected a string or a list of strings"))
}

/// The checks of [`PluginFactory::validate`](plugin_sdk::PluginFactory::validate): pure, every
/// problem with the path of its field.
pub fn validate(config: &AuthConfig) -> Vec<ConfigIssue> {
    let mut issues = Vec::new();
    let Some(jwt) = &config.jwt else {
        return issues;
    };
    match (&jwt.jwks_url, &jwt.jwks_file) {
        (Some(_), Some(_)) => issues.push(ConfigIssue::new(
            "jwt.jwks_file",
            "give jwks_url or jwks_file, not both",
        )),
        (None, None) => issues.push(ConfigIssue::new(
            "jwt",
            "give the signing keys: jwks_url (an HTTP(S) URL) or jwks_file (a path)",
        )),
        (Some(url), None) => {
            if let Err(message) = check_url(url) {
                issues.push(ConfigIssue::new("jwt.jwks_url", message));
            }
        }
        (None, Some(path)) => {
            if path.as_os_str().is_empty() {
                issues.push(ConfigIssue::new("jwt.jwks_file", "must not be empty"));
            }
        }
    }
    if jwt.refresh_secs == 0 {
        issues.push(ConfigIssue::new("jwt.refresh_secs", "must be at least 1"));
    }
    if jwt.min_refresh_secs == 0 {
        issues.push(ConfigIssue::new(
            "jwt.min_refresh_secs",
            "must be at least 1",
        ));
    }
    if jwt.algorithms.is_empty() {
        issues.push(ConfigIssue::new(
            "jwt.algorithms",
            "must name at least one of RS256, ES256",
        ));
    }
    if jwt.leeway_secs > MAX_LEEWAY_SECS {
        issues.push(ConfigIssue::new(
            "jwt.leeway_secs",
            format!("must be at most {MAX_LEEWAY_SECS} seconds"),
        ));
    }
    for (field, values) in [("issuer", &jwt.issuer), ("audience", &jwt.audience)] {
        match values {
            Some(v) if v.is_empty() => issues.push(ConfigIssue::new(
                format!("jwt.{field}"),
                "must name at least one value",
            )),
            Some(v) => {
                for (i, s) in v.iter().enumerate() {
                    if s.trim().is_empty() {
                        let path = if v.len() == 1 {
                            format!("jwt.{field}")
                        } else {
                            format!("jwt.{field}[{i}]")
                        };
                        issues.push(ConfigIssue::new(path, "must not be empty"));
                    }
                }
            }
            None => {}
        }
    }
    if jwt.issuer.is_none() && jwt.audience.is_none() {
        issues.push(ConfigIssue::new(
            "jwt.audience",
            "give audience or issuer (or both): without them, a token the identity provider \
             issued for any other application would be accepted",
        ));
    }
    if jwt.default_scopes.iter().any(|s| s.trim().is_empty()) {
        issues.push(ConfigIssue::new(
            "jwt.default_scopes",
            "must not hold an empty scope",
        ));
    }
    let c = &jwt.claims;
    for (field, name) in [
        ("workspace_id", &c.workspace_id),
        ("organisation_id", &c.organisation_id),
        ("user", &c.user),
        ("rate_limits", &c.rate_limits),
        ("usage_limits", &c.usage_limits),
    ] {
        if name.trim().is_empty() {
            issues.push(ConfigIssue::new(
                format!("jwt.claims.{field}"),
                "must name a claim",
            ));
        }
    }
    if c.scopes.is_empty() || c.scopes.iter().any(|s| s.trim().is_empty()) {
        issues.push(ConfigIssue::new(
            "jwt.claims.scopes",
            "must name one or more claims",
        ));
    }
    issues
}

fn check_url(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("not a URL: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!(
            "must be an http or https URL, got scheme {:?}",
            parsed.scheme()
        ));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err("must name a host".into());
    }
    Ok(())
}
