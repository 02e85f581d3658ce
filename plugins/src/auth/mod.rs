//! `auth`: who is calling, checked first in the pipeline (`on_request`, LLM routes and
//! passthrough alike).
//!
//! **API keys** (`x-gw-api-key`, or `x-portkey-api-key`): the raw key's SHA-256 digest is
//! looked up in the control plane's snapshot ([`AccessStore`]) and compared with the stored
//! digest in constant time. An unknown key is a 401, an expired one (status `expired`, or
//! `expires_at` passed) a 401 that says so; an `exhausted` key passes (the budget plugin
//! answers 412). A call needs the scope `completions.write`; a key created without scopes has
//! its kind's default rights, which include it; otherwise a key without it is a 403 naming it.
//!
//! **JWT** (with `jwt:` configured): a token in `x-gw-api-key` (told apart from a key by its
//! shape: three base64url segments) or, when that header is absent, in
//! `Authorization: Bearer <JWT>` — which is then removed from the request's headers so that
//! provider selection does not take it for the provider's key. The token is verified against
//! the JWKS (see [`jwt`] and [`jwks`]) and its `iss` or `aud` (the config must name one);
//! its claims give the workspace, organisation, user, scopes (a token without a scopes claim
//! has `default_scopes`, none by default, so it is a 403) and optional limits. Every refused token is a 401 with the reason and an
//! `auth.jwt_rejected` audit event, written by a background task (a full queue drops events
//! and counts them; the request never waits for the database).
//!
//! **What it attaches**: a [`Principal`] in the request's extensions (workspace, key id, user,
//! scopes, rate limits and budgets with their counter ids); the key's then the workspace's
//! default metadata merged into `cx.gw.metadata` (over the request's own values: limits are
//! keyed on metadata, so what the credential sets the caller cannot change; a JWT's user is
//! its `_user`); their default
//! `config_id` as `cx.gw.config` when the request chose no provider itself (a request that
//! does while the default says `allow_config_override: false` is a 403. The workspace's default
//! guardrails are the `guardrails` plugin's to run: it reads them through the principal.
//!
//! Without credentials: a 401, unless `required: false`, when the request goes on anonymously
//! (no principal). Credentials that are sent are checked either way.
//!
//! Metrics: `gw_auth_requests_total{method="api_key|jwt|none", outcome="ok|unauthorized|
//! forbidden|error"}`, `gw_auth_jwks_refresh_total{outcome="ok|error"}`,
//! `gw_auth_audit_events_total{outcome="queued|written|failed|dropped"}`. Key ids and users are
//! never labels, and neither keys nor tokens are ever logged.

pub mod api_key;
mod background;
pub mod config;
pub mod jwks;
pub mod jwt;
pub mod ring_verify;

#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use prometheus::{IntCounterVec, Opts};
use serde_json::json;

use plugin_sdk::access::{
    AuthMethod, Budget, CountedUsage, Defaults, ScopedRateLimit, TokenIdentity, TokenRefusal,
    TokenRequest, TokenVerifier, WorkspaceRecord,
};
use plugin_sdk::sinks::AuditEvent;
use plugin_sdk::{
    AccessStore, BuildCx, ConfigIssue, ErrorKind, Flow, GatewayError, Phases, Plugin,
    PluginFactory, Principal, RequestCx,
};

use config::AuthConfig;
use jwt::{Failure, JwtAuth};

/// The plugin's counters, registered in the gateway's registry.
#[derive(Clone)]
pub struct AuthMetrics {
    /// `gw_auth_requests_total{method, outcome}`.
    pub requests: IntCounterVec,
    /// `gw_auth_jwks_refresh_total{outcome}`.
    pub jwks_refresh: IntCounterVec,
    /// `gw_auth_audit_events_total{outcome}`.
    pub audit: IntCounterVec,
    /// `gw_auth_jwt_cache_total{outcome="hit"|"miss"}`: tokens found verified, or verified.
    pub jwt_cache: IntCounterVec,
}

impl AuthMetrics {
    fn register(registry: &prometheus::Registry) -> Result<AuthMetrics, String> {
        let requests = IntCounterVec::new(
            Opts::new(
                "gw_auth_requests_total",
                "Requests authenticated, by credential and outcome",
            ),
            &["method", "outcome"],
        )
        .map_err(|e| e.to_string())?;
        let jwks_refresh = IntCounterVec::new(
            Opts::new(
                "gw_auth_jwks_refresh_total",
                "Loads of the JWT signing keys (JWKS), by outcome",
            ),
            &["outcome"],
        )
        .map_err(|e| e.to_string())?;
        let audit = IntCounterVec::new(
            Opts::new(
                "gw_auth_audit_events_total",
                "Audit events of refused JWTs, by what became of them",
            ),
            &["outcome"],
        )
        .map_err(|e| e.to_string())?;
        let jwt_cache = IntCounterVec::new(
            Opts::new(
                "gw_auth_jwt_cache_total",
                "JWTs found among the verified ones (hit) or verified (miss)",
            ),
            &["outcome"],
        )
        .map_err(|e| e.to_string())?;
        for c in [&requests, &jwks_refresh, &audit, &jwt_cache] {
            registry.register(Box::new(c.clone())).map_err(|e| {
                format!("cannot register the auth metrics (is `auth` listed twice?): {e}")
            })?;
        }
        Ok(AuthMetrics {
            requests,
            jwks_refresh,
            audit,
            jwt_cache,
        })
    }
}

pub struct Auth {
    required: bool,
    access: Arc<dyn AccessStore>,
    jwt: Option<Arc<JwtAuth>>,
    metrics: AuthMetrics,
}

pub struct AuthFactory;

impl PluginFactory for AuthFactory {
    const KIND: &'static str = "auth";
    const SUMMARY: &'static str =
        "Checks x-gw-api-key (or a JWT) and attaches the caller's workspace, defaults and limits; first in the pipeline";
    const EXAMPLE: &'static str = "- kind: auth
  required: true            # false: requests without credentials go on anonymously
  # jwt:                    # JWTs beside API keys (in x-gw-api-key or Authorization: Bearer)
  #   jwks_url: https://idp.example.com/.well-known/jwks.json   # or jwks_file: ./jwks.json
  #   refresh_secs: 300
  #   issuer: https://idp.example.com/   # issuer, audience or both are required
  #   audience: ai-gateway
  #   algorithms: [RS256, ES256]
  #   leeway_secs: 30
  #   claims: {workspace_id: workspace_id, user: sub, scopes: [scope, scopes]}
  #   default_scopes: []      # of a token without a scopes claim: none (403) unless listed";
    type Config = AuthConfig;

    fn validate(config: &Self::Config) -> Vec<ConfigIssue> {
        config::validate(config)
    }

    fn build(config: Self::Config, cx: &BuildCx) -> Result<Arc<dyn Plugin>, String> {
        Ok(Arc::new(Auth::build(config, cx)?))
    }
}

plugin_sdk::register_plugin!(AuthFactory);

/// The credential a request presents.
enum Credential {
    ApiKey(String),
    Jwt(String),
    None,
}

fn unauthorized(message: impl Into<String>) -> GatewayError {
    GatewayError::new(ErrorKind::Unauthorized, message)
}

fn forbidden(message: impl Into<String>) -> GatewayError {
    GatewayError::new(ErrorKind::Forbidden, message)
}

impl Auth {
    pub fn build(config: AuthConfig, cx: &BuildCx) -> Result<Auth, String> {
        let metrics = AuthMetrics::register(&cx.metrics)?;
        let jwt = match &config.jwt {
            Some(jwt) => Some(Arc::new(JwtAuth::build(jwt, cx.sink.clone(), &metrics)?)),
            None => None,
        };
        if let Some(jwt) = &jwt {
            // The control plane verifies tokens with the same keys and claims.
            cx.tokens.set(Arc::new(ControlPlaneTokens(jwt.clone())));
        }
        Ok(Auth {
            required: config.required,
            access: cx.access.clone(),
            jwt,
            metrics,
        })
    }

    /// Finds the credential: `x-gw-api-key` (a key, or a JWT when JWT is on and it has a
    /// JWT's shape), else a JWT in `Authorization: Bearer`, which is taken out of the
    /// headers.
    fn credential(&self, cx: &mut RequestCx) -> Credential {
        if let Some(value) = cx.gw.api_key.as_deref() {
            return if self.jwt.is_some() && jwt::looks_like_jwt(value) {
                Credential::Jwt(value.to_owned())
            } else {
                Credential::ApiKey(value.to_owned())
            };
        }
        if self.jwt.is_none() {
            return Credential::None;
        }
        let token = cx
            .headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim())
            .filter(|token| jwt::looks_like_jwt(token))
            .map(str::to_owned);
        match token {
            Some(token) => {
                // It authenticates the caller: it is not the provider's key.
                cx.headers.remove(http::header::AUTHORIZATION);
                Credential::Jwt(token)
            }
            None => Credential::None,
        }
    }

    fn authenticate_key(&self, cx: &mut RequestCx, raw: &str) -> Result<(), GatewayError> {
        // Read before the lookups: hooks built from newer data under an older version are
        // rebuilt at the next version, never the reverse.
        let presented = api_key::digest(raw);
        let unknown = || {
            unauthorized(
                "invalid API key: x-gw-api-key is not a key of this gateway (unknown or revoked)",
            )
        };
        let (key, stored) = self
            .access
            .api_key_with_digest(&presented)
            .ok_or_else(unknown)?;
        if !api_key::digests_equal(&presented, &stored) {
            return Err(unknown());
        }
        if api_key::is_expired(&key, SystemTime::now()) {
            return Err(unauthorized("the API key has expired"));
        }
        if !api_key::grants(
            &key.scopes,
            api_key::kind_calls_gateway(key.kind),
            api_key::GATEWAY_SCOPE,
        ) {
            return Err(forbidden(format!(
                "the API key lacks the scope {}, which calls to the gateway need",
                api_key::GATEWAY_SCOPE
            )));
        }
        let workspace = match &key.workspace_id {
            Some(id) => Some(
                self.access
                    .workspace(id)
                    .ok_or_else(|| unauthorized("the API key's workspace no longer exists"))?,
            ),
            None => None,
        };

        let mut rate_limits: Vec<ScopedRateLimit> = key
            .rate_limits
            .iter()
            .enumerate()
            .map(|(i, limit)| ScopedRateLimit {
                id: format!("api_key:{}:{i}", key.id),
                limit: *limit,
            })
            .collect();
        let mut budgets: Vec<Budget> = key
            .usage_limits
            .iter()
            .map(|limit| Budget {
                id: format!("api_key:{}", key.id),
                limit: limit.clone(),
                counted: key.counted,
            })
            .collect();
        if let Some(ws) = &workspace {
            add_workspace_limits(ws, &mut rate_limits, &mut budgets);
        }
        apply_defaults(cx, Some(&*key.defaults), workspace.as_deref())?;
        cx.extensions.insert(Principal {
            method: AuthMethod::ApiKey(key.kind),
            organisation_id: Some(key.organisation_id.to_string()),
            workspace_id: key.workspace_id.as_deref().map(str::to_owned),
            api_key_id: Some(key.id.to_string()),
            user_id: key.user_id.as_deref().map(str::to_owned),
            scopes: key.scopes.to_vec(),
            rate_limits,
            budgets,
        });
        Ok(())
    }

    async fn authenticate_jwt(
        &self,
        jwt: &JwtAuth,
        cx: &mut RequestCx,
        token: &str,
    ) -> Result<(), GatewayError> {
        let checked = match jwt.check(token).await {
            Ok(c) => c,
            Err((failure, kid)) => return Err(self.refuse_jwt(jwt, cx, failure, kid)),
        };
        let identity = &*checked.identity;
        // A token's rights are its scopes (or `default_scopes`): none means none.
        if !api_key::grants(&identity.scopes, false, api_key::GATEWAY_SCOPE) {
            let failure = Failure::MissingScope(api_key::GATEWAY_SCOPE.to_owned());
            return Err(self.refuse_jwt(jwt, cx, failure, checked.kid.clone()));
        }
        // A workspace the snapshot does not know (a deployment without a control plane) still
        // names the caller; it only brings no defaults or limits.
        let workspace = identity
            .workspace_id
            .as_deref()
            .and_then(|id| self.access.workspace(id));
        if let (Some(ws), Some(org)) = (&workspace, &identity.organisation_id) {
            if ws.organisation_id != *org {
                let failure = Failure::BadClaim {
                    claim: jwt.claim_names().workspace_id.clone(),
                    problem: "names a workspace of another organisation".into(),
                };
                return Err(self.refuse_jwt(jwt, cx, failure, checked.kid.clone()));
            }
        }
        let subject = identity.user.clone().unwrap_or_default();
        let mut rate_limits: Vec<ScopedRateLimit> = identity
            .rate_limits
            .iter()
            .enumerate()
            .map(|(i, limit)| ScopedRateLimit {
                id: format!("jwt:{subject}:{i}"),
                limit: *limit,
            })
            .collect();
        let mut budgets: Vec<Budget> = identity
            .usage_limits
            .iter()
            .enumerate()
            .map(|(i, limit)| Budget {
                id: format!("jwt:{subject}:{i}"),
                limit: limit.clone(),
                counted: CountedUsage::default(),
            })
            .collect();
        if let Some(ws) = &workspace {
            add_workspace_limits(ws, &mut rate_limits, &mut budgets);
        }
        apply_defaults(cx, None, workspace.as_deref())?;
        // The token names its user: policies grouped by `metadata._user` count it, whatever
        // the request's metadata says.
        if let Some(user) = &identity.user {
            cx.gw.metadata.insert("_user".to_owned(), user.clone());
        }
        cx.extensions.insert(Principal {
            method: AuthMethod::Jwt,
            organisation_id: identity
                .organisation_id
                .clone()
                .or_else(|| workspace.as_ref().map(|w| w.organisation_id.clone())),
            // The workspace's id as the snapshot knows it: ownership compares ids.
            workspace_id: workspace
                .as_ref()
                .map(|w| w.id.clone())
                .or_else(|| identity.workspace_id.clone()),
            api_key_id: None,
            user_id: identity.user.clone(),
            scopes: identity.scopes.clone(),
            rate_limits,
            budgets,
        });
        Ok(())
    }

    /// The answer to a refused token (401; 403 for a valid token without the gateway's scope),
    /// with its audit event queued.
    fn refuse_jwt(
        &self,
        jwt: &JwtAuth,
        cx: &RequestCx,
        failure: Failure,
        kid: Option<String>,
    ) -> GatewayError {
        let message = failure.message();
        let status = if matches!(failure, Failure::MissingScope(_)) {
            403
        } else {
            401
        };
        let ip = cx.client_ip.map(|ip| ip.to_string());
        let at = TokenRequest {
            method: cx.method.as_str(),
            uri: &cx.path,
            request_id: &cx.trace_id,
            client_ip: ip.as_deref(),
        };
        jwt.audit()
            .send(refusal_event(&failure, kid, status, at, cx.route.as_str()));
        if status == 403 {
            forbidden(message)
        } else {
            unauthorized(format!("invalid JWT: {message}"))
        }
    }
}

/// The audit event of a refused token (`auth.jwt_rejected`), without the token.
fn refusal_event(
    failure: &Failure,
    kid: Option<String>,
    status: u16,
    at: TokenRequest<'_>,
    route: &str,
) -> AuditEvent {
    AuditEvent {
        action: "auth.jwt_rejected".into(),
        resource_type: "jwt".into(),
        resource_id: kid.clone(),
        organisation_id: None,
        workspace_id: None,
        user_id: None,
        method: at.method.to_owned(),
        uri: at.uri.to_owned(),
        request_id: at.request_id.to_owned(),
        status,
        client_ip: at.client_ip.map(str::to_owned),
        details: json!({
            "reason": failure.code(),
            "message": failure.message(),
            "kid": kid,
            "route": route,
        }),
    }
}

/// The control plane's view of the plugin's JWTs: the same keys, checks and claims; a
/// refusal is audited as on the data plane (route `control_plane`). No scope is required
/// here: the control plane decides what the token's scopes allow.
struct ControlPlaneTokens(Arc<JwtAuth>);

#[async_trait]
impl TokenVerifier for ControlPlaneTokens {
    fn looks_like_token(&self, credential: &str) -> bool {
        jwt::looks_like_jwt(credential)
    }

    async fn verify(
        &self,
        token: &str,
        at: TokenRequest<'_>,
    ) -> Result<TokenIdentity, TokenRefusal> {
        let jwt = &self.0;
        match jwt.check(token).await {
            Ok(checked) => {
                let identity = &*checked.identity;
                Ok(TokenIdentity {
                    organisation_id: identity.organisation_id.clone(),
                    workspace_id: identity.workspace_id.clone(),
                    user: identity.user.clone(),
                    scopes: identity.scopes.clone(),
                })
            }
            Err((failure, kid)) => {
                jwt.audit()
                    .send(refusal_event(&failure, kid, 401, at, "control_plane"));
                Err(TokenRefusal {
                    status: 401,
                    message: failure.message(),
                })
            }
        }
    }
}

/// Adds the workspace's rate limits (`workspace:<id>:<i>`) and budgets (`workspace:<id>:<i>`,
/// with the usage the control plane counted for each).
fn add_workspace_limits(
    ws: &WorkspaceRecord,
    rate_limits: &mut Vec<ScopedRateLimit>,
    budgets: &mut Vec<Budget>,
) {
    rate_limits.extend(
        ws.rate_limits
            .iter()
            .enumerate()
            .map(|(i, limit)| ScopedRateLimit {
                id: format!("workspace:{}:{i}", ws.id),
                limit: *limit,
            }),
    );
    budgets.extend(ws.usage_limits.iter().enumerate().map(|(i, limit)| Budget {
        id: format!("workspace:{}:{i}", ws.id),
        limit: limit.clone(),
        counted: ws.counted.get(i).copied().unwrap_or_default(),
    }));
}

/// Applies the key's then the workspace's defaults: metadata (the key's values win over the
/// workspace's, both over the request's: limits are keyed on them, so a caller must not choose
/// them), and the default config when the request chose no provider itself.
fn apply_defaults(
    cx: &mut RequestCx,
    key: Option<&Defaults>,
    workspace: Option<&WorkspaceRecord>,
) -> Result<(), GatewayError> {
    let layers: Vec<&Defaults> = key
        .into_iter()
        .chain(workspace.map(|w| &w.defaults))
        .collect();
    for d in layers.iter().rev() {
        for (k, v) in &d.metadata {
            cx.gw.metadata.insert(k.clone(), v.clone());
        }
    }
    let Some(config_id) = layers.iter().find_map(|d| d.config_id.as_deref()) else {
        return Ok(());
    };
    let may_override = layers
        .iter()
        .find_map(|d| d.allow_config_override)
        .unwrap_or(true);
    let gw = &cx.gw;
    let chosen = if gw.config.is_some() {
        Some("x-gw-config")
    } else if gw.provider.is_some() {
        Some("x-gw-provider")
    } else if gw.virtual_key.is_some() {
        Some("x-gw-virtual-key")
    } else if gw.custom_host.is_some() {
        Some("x-gw-custom-host")
    } else {
        None
    };
    match chosen {
        None => cx.gw.config = Some(config_id.to_owned()),
        Some(header) if !may_override => {
            return Err(forbidden(format!(
                "requests with this credential go through its default config, which does not \
                 allow overriding it: remove {header}"
            )))
        }
        // The request's own choice wins.
        Some(_) => {}
    }
    Ok(())
}

impl Auth {
    fn count(&self, method: &str, result: &Result<(), GatewayError>) {
        let outcome = match result {
            Ok(()) => "ok",
            Err(e) => match e.kind {
                ErrorKind::Unauthorized => "unauthorized",
                ErrorKind::Forbidden => "forbidden",
                _ => "error",
            },
        };
        self.metrics
            .requests
            .with_label_values(&[method, outcome])
            .inc();
    }
}

#[async_trait]
impl Plugin for Auth {
    fn kind(&self) -> &'static str {
        AuthFactory::KIND
    }

    fn phases(&self) -> Phases {
        Phases::REQUEST
    }

    /// Credentials are headers: a request is authenticated before its body is read.
    fn reads_body(&self) -> bool {
        false
    }

    async fn on_request(&self, cx: &mut RequestCx) -> Result<Flow, GatewayError> {
        let (method, result) = match self.credential(cx) {
            Credential::ApiKey(raw) => ("api_key", self.authenticate_key(cx, &raw)),
            Credential::Jwt(token) => match &self.jwt {
                Some(jwt) => ("jwt", self.authenticate_jwt(jwt, cx, &token).await),
                None => ("jwt", Err(GatewayError::internal("JWT is not configured"))),
            },
            Credential::None if self.required => (
                "none",
                Err(unauthorized(if self.jwt.is_some() {
                    "missing credentials: send x-gw-api-key: <API key or JWT>, or \
                     Authorization: Bearer <JWT>"
                } else {
                    "missing credentials: send x-gw-api-key: <API key>"
                })),
            ),
            Credential::None => ("none", Ok(())),
        };
        self.count(method, &result);
        result.map(|()| Flow::Continue)
    }

    fn reload(&self) -> Result<(), String> {
        match &self.jwt {
            Some(jwt) => jwt.reload(),
            None => Ok(()),
        }
    }
}
