//! The HTTP API: an axum `Router` whose paths are the gateway's own (`/v1/...`).
//!
//! Every handler takes a [`Ctx`]: the authenticated principal (401 before anything else), the
//! request details the audit log records, and the body. Answers are 200 with JSON; errors are
//! [`AdminError`]s, turned into the reference's error body in one place.

mod api_keys;
mod audit_logs;
mod configs;
mod deployments;
mod guardrails;
mod integrations;
mod invites;
mod logs;
mod members;
pub mod openapi;
mod policies;
mod providers;
mod refusals;
mod settings;
mod users;
mod workspaces;

use std::collections::BTreeMap;
use std::net::IpAddr;

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::handler::Handler;
use axum::http::{Method, Uri};
use axum::routing::{on, MethodFilter, MethodRouter};
use axum::{Json, Router};
use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::{json, Value};

use crate::authz::Principal;
use crate::error::{AdminError, Result};
use crate::store::{Actor, RequestMeta, Store};
use crate::validate;

/// The largest request body the control plane reads.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// The client's address, set by whoever serves the router (the gateway puts the peer's
/// address here); recorded in the audit log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub Option<IpAddr>);

pub use refusals::{RouterOptions, DEFAULT_REFUSED_RECORDS_PER_SECOND};

#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    /// JWTs, when the data plane verifies them ([`RouterOptions::tokens`]).
    tokens: plugin_sdk::access::TokenSlot,
    /// The bound on records of refused calls ([`refusals`]).
    refusals: std::sync::Arc<refusals::RefusalAudit>,
}

/// One route of the control plane: a method, the path as the router mounts it, and its handler.
pub struct Route {
    pub method: Method,
    pub path: &'static str,
    handler: MethodRouter<AppState>,
}

fn route<H, T>(method: Method, path: &'static str, handler: H) -> Route
where
    H: Handler<T, AppState>,
    T: 'static,
{
    // The table uses GET, POST, PUT and DELETE, which all have a filter.
    let filter = MethodFilter::try_from(method.clone())
        .unwrap_or_else(|_| panic!("no method filter for {method} {path}"));
    Route {
        method,
        path,
        handler: on(filter, handler),
    }
}

/// Every route of the control plane, in one table: [`router`] mounts exactly these, and the
/// OpenAPI document ([`openapi::ApiDoc`]) describes each of them. A new route goes here, and
/// its handler gets a `#[utoipa::path]` listed in `ApiDoc`; the control-plane tests compare
/// this table with the document and fail on a route that is not documented.
pub fn routes() -> Vec<Route> {
    use Method as M;
    vec![
        route(M::GET, "/v1/openapi.json", openapi::serve),
        route(M::GET, "/v1/api-keys", api_keys::list),
        route(M::GET, "/v1/api-keys/{id}", api_keys::get),
        route(M::PUT, "/v1/api-keys/{id}", api_keys::update),
        route(M::DELETE, "/v1/api-keys/{id}", api_keys::delete),
        route(
            M::GET,
            "/v1/api-keys/{id}/rotated-key",
            api_keys::rotated_key,
        ),
        // `{type}/{sub-type}` to create, `{id}/rotate` to rotate: one pattern, as the router
        // wants one parameter name per position.
        route(
            M::POST,
            "/v1/api-keys/{id}/{action}",
            api_keys::create_or_rotate,
        ),
        route(
            M::POST,
            "/v1/api-keys/{id}/{action}/bulk",
            api_keys::create_many,
        ),
        route(M::POST, "/v1/admin/workspaces", workspaces::create),
        route(M::GET, "/v1/admin/workspaces", workspaces::list),
        route(M::GET, "/v1/admin/workspaces/{id}", workspaces::get),
        route(M::PUT, "/v1/admin/workspaces/{id}", workspaces::update),
        route(M::DELETE, "/v1/admin/workspaces/{id}", workspaces::delete),
        route(M::POST, "/v1/admin/workspaces/{id}/users", members::add),
        route(M::GET, "/v1/admin/workspaces/{id}/users", members::list),
        route(
            M::GET,
            "/v1/admin/workspaces/{id}/users/{user_id}",
            members::get,
        ),
        route(
            M::PUT,
            "/v1/admin/workspaces/{id}/users/{user_id}",
            members::update,
        ),
        route(
            M::DELETE,
            "/v1/admin/workspaces/{id}/users/{user_id}",
            members::delete,
        ),
        route(
            M::GET,
            "/v1/admin/workspaces/{id}/settings",
            settings::get_workspace,
        ),
        route(
            M::PUT,
            "/v1/admin/workspaces/{id}/settings",
            settings::update_workspace,
        ),
        route(M::GET, "/v1/admin/settings", settings::get_organisation),
        route(M::PUT, "/v1/admin/settings", settings::update_organisation),
        route(M::GET, "/v1/admin/users", users::list),
        route(M::GET, "/v1/admin/users/{id}", users::get),
        route(M::PUT, "/v1/admin/users/{id}", users::update),
        route(M::DELETE, "/v1/admin/users/{id}", users::delete),
        route(M::POST, "/v1/admin/users/invites", invites::create),
        route(M::GET, "/v1/admin/users/invites", invites::list),
        route(M::GET, "/v1/admin/users/invites/{id}", invites::get),
        route(M::DELETE, "/v1/admin/users/invites/{id}", invites::delete),
        route(
            M::POST,
            "/v1/admin/users/invites/{id}/resend",
            invites::resend,
        ),
        route(
            M::POST,
            "/v1/admin/users/invites/{id}/accept",
            invites::accept,
        ),
        route(M::POST, "/v1/deployments", deployments::create),
        route(M::GET, "/v1/deployments", deployments::list),
        route(M::GET, "/v1/deployments/{id}", deployments::get),
        route(M::PUT, "/v1/deployments/{id}", deployments::update),
        route(M::DELETE, "/v1/deployments/{id}", deployments::delete),
        route(M::GET, "/v1/audit-logs", audit_logs::list),
        route(M::GET, "/v1/logs", logs::list),
        route(M::POST, "/v1/logs", logs::insert),
        route(M::POST, "/v1/logs/exports", logs::create_export),
        route(M::GET, "/v1/logs/exports", logs::list_exports),
        route(M::GET, "/v1/logs/exports/{id}", logs::get_export),
        route(M::PUT, "/v1/logs/exports/{id}", logs::update_export),
        route(M::POST, "/v1/logs/exports/{id}/start", logs::start_export),
        route(M::POST, "/v1/logs/exports/{id}/cancel", logs::cancel_export),
        route(
            M::GET,
            "/v1/logs/exports/{id}/download",
            logs::download_export,
        ),
        route(M::GET, "/v1/logs/{id}", logs::get),
        route(M::POST, "/v1/configs", configs::create),
        route(M::GET, "/v1/configs", configs::list),
        route(M::GET, "/v1/configs/{slug}", configs::get),
        route(M::PUT, "/v1/configs/{slug}", configs::update),
        route(M::DELETE, "/v1/configs/{slug}", configs::delete),
        route(M::GET, "/v1/configs/{slug}/versions", configs::versions),
        route(M::POST, "/v1/guardrails", guardrails::create),
        route(M::GET, "/v1/guardrails", guardrails::list),
        route(M::GET, "/v1/guardrails/{id}", guardrails::get),
        route(M::PUT, "/v1/guardrails/{id}", guardrails::update),
        route(M::DELETE, "/v1/guardrails/{id}", guardrails::delete),
        route(M::POST, "/v1/integrations", integrations::create),
        route(M::GET, "/v1/integrations", integrations::list),
        route(M::GET, "/v1/integrations/{slug}", integrations::get),
        route(M::PUT, "/v1/integrations/{slug}", integrations::update),
        route(M::DELETE, "/v1/integrations/{slug}", integrations::delete),
        route(
            M::GET,
            "/v1/integrations/{slug}/workspaces",
            integrations::workspaces,
        ),
        route(
            M::PUT,
            "/v1/integrations/{slug}/workspaces",
            integrations::update_workspaces,
        ),
        route(
            M::GET,
            "/v1/integrations/{slug}/models",
            integrations::models,
        ),
        route(
            M::PUT,
            "/v1/integrations/{slug}/models",
            integrations::update_models,
        ),
        route(M::POST, "/v1/providers", providers::create),
        route(M::POST, "/v1/providers/bulk", providers::create_many),
        route(M::GET, "/v1/providers", providers::list),
        route(M::GET, "/v1/providers/{slug}", providers::get),
        route(M::PUT, "/v1/providers/{slug}", providers::update),
        route(M::DELETE, "/v1/providers/{slug}", providers::delete),
        route(M::POST, "/v1/virtual-keys", providers::create_virtual_key),
        route(M::GET, "/v1/virtual-keys", providers::list_virtual_keys),
        route(
            M::GET,
            "/v1/virtual-keys/{slug}",
            providers::get_virtual_key,
        ),
        route(
            M::PUT,
            "/v1/virtual-keys/{slug}",
            providers::update_virtual_key,
        ),
        route(
            M::DELETE,
            "/v1/virtual-keys/{slug}",
            providers::delete_virtual_key,
        ),
        route(
            M::POST,
            "/v1/policies/rate-limits",
            policies::create_rate_limits,
        ),
        route(
            M::GET,
            "/v1/policies/rate-limits",
            policies::list_rate_limits,
        ),
        route(
            M::GET,
            "/v1/policies/rate-limits/{id}",
            policies::get_rate_limits,
        ),
        route(
            M::PUT,
            "/v1/policies/rate-limits/{id}",
            policies::update_rate_limits,
        ),
        route(
            M::DELETE,
            "/v1/policies/rate-limits/{id}",
            policies::delete_rate_limits,
        ),
        route(
            M::GET,
            "/v1/policies/rate-limits/{id}/entities",
            policies::rate_limits_entities,
        ),
        route(
            M::POST,
            "/v1/policies/usage-limits",
            policies::create_usage_limits,
        ),
        route(
            M::GET,
            "/v1/policies/usage-limits",
            policies::list_usage_limits,
        ),
        route(
            M::GET,
            "/v1/policies/usage-limits/{id}",
            policies::get_usage_limits,
        ),
        route(
            M::PUT,
            "/v1/policies/usage-limits/{id}",
            policies::update_usage_limits,
        ),
        route(
            M::DELETE,
            "/v1/policies/usage-limits/{id}",
            policies::delete_usage_limits,
        ),
        route(
            M::GET,
            "/v1/policies/usage-limits/{id}/entities",
            policies::usage_limits_entities,
        ),
        route(
            M::PUT,
            "/v1/policies/usage-limits/{id}/entities/{entity}/reset",
            policies::reset_usage_limits_entity,
        ),
    ]
}

/// The control plane's routes: those of [`routes`], with the default [`RouterOptions`]. The
/// paths the gateway sends here are listed in [`crate::CONTROL_PLANE_PREFIXES`].
pub fn router(store: Store) -> Router {
    router_with(store, RouterOptions::default())
}

/// The control plane's routes, built with `options`. Every routed call answered 401 or 403 is
/// recorded in the audit log, within the bound of `options` ([`refusals`]).
pub fn router_with(store: Store, options: RouterOptions) -> Router {
    let state = AppState {
        store,
        tokens: options.tokens.clone(),
        refusals: std::sync::Arc::new(refusals::RefusalAudit::new(
            options.refused_records_per_second,
        )),
    };
    // One `MethodRouter` per path: the router refuses a path mounted twice.
    let mut by_path: BTreeMap<&'static str, MethodRouter<AppState>> = BTreeMap::new();
    for r in routes() {
        let merged = match by_path.remove(r.path) {
            // `merge` panics when both handle one method: a route listed twice.
            Some(existing) => existing.merge(r.handler),
            None => r.handler,
        };
        by_path.insert(r.path, merged);
    }
    by_path
        .into_iter()
        .fold(Router::new(), |router, (path, handler)| {
            router.route(path, handler)
        })
        // Routed calls only: the fallbacks below answer without a key.
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            refusals::audit,
        ))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

async fn not_found(method: Method, uri: Uri) -> AdminError {
    AdminError::not_found(format!("no control-plane endpoint {method} {}", uri.path()))
}

async fn method_not_allowed(method: Method, uri: Uri) -> AdminError {
    AdminError::new(
        crate::error::ErrorKind::MethodNotAllowed,
        format!("{} does not take {method}", uri.path()),
    )
}

/// One authenticated control-plane request.
pub struct Ctx {
    pub principal: Principal,
    pub meta: RequestMeta,
    pub uri: Uri,
    pub body: Bytes,
}

impl Ctx {
    pub fn actor(&self) -> Actor<'_> {
        Actor {
            principal: &self.principal,
            request: &self.meta,
        }
    }

    /// The body as `T` (unknown fields refused, problems named by path).
    pub fn json<T: DeserializeOwned>(&self) -> Result<T> {
        validate::json(&self.body)
    }

    /// The query as `T`.
    pub fn query<T: DeserializeOwned>(&self) -> Result<T> {
        validate::query(&self.uri)
    }
}

/// The header carrying the key (`x-portkey-api-key` is read too, as on the data plane).
const API_KEY_HEADERS: [&str; 2] = ["x-gw-api-key", "x-portkey-api-key"];

impl FromRequest<AppState> for Ctx {
    type Rejection = AdminError;

    async fn from_request(req: Request, state: &AppState) -> Result<Ctx> {
        let (mut parts, body) = req.into_parts();
        let client = ClientAddr::from_request_parts(&mut parts, state)
            .await
            .unwrap_or(ClientAddr(None));
        let request_id = request_id(&parts.headers);
        let principal = authenticate(state, &parts, &request_id, client).await?;
        let body = axum::body::to_bytes(body, MAX_BODY_BYTES)
            .await
            .map_err(|_| {
                AdminError::new(
                    crate::error::ErrorKind::PayloadTooLarge,
                    format!("the request body is larger than {MAX_BODY_BYTES} bytes"),
                )
            })?;
        let uri = parts.uri.clone();
        let meta = RequestMeta {
            method: parts.method.to_string(),
            uri: uri
                .path_and_query()
                .map_or_else(|| uri.path().to_owned(), |p| p.to_string()),
            request_id,
            client_ip: client.0.map(|ip| ip.to_string()),
            body: None,
        }
        .with_body(&body);
        Ok(Ctx {
            principal,
            meta,
            uri,
            body,
        })
    }
}

/// The caller: an API key in `x-gw-api-key`; or, when the data plane verifies JWTs, a token
/// there or in `Authorization: Bearer`, which reads and lists its workspace's resources.
async fn authenticate(
    state: &AppState,
    parts: &http::request::Parts,
    request_id: &str,
    client: ClientAddr,
) -> Result<Principal> {
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .map(|v| v.to_str().map(str::trim).unwrap_or(""))
    };
    let presented = API_KEY_HEADERS.iter().find_map(|h| header(h));
    let verifier = state.tokens.get();
    let bearer = || {
        header("authorization")
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim())
    };
    let token = match (&verifier, presented) {
        (Some(v), Some(p)) if v.looks_like_token(p) => Some(p),
        (Some(v), None) => bearer().filter(|t| v.looks_like_token(t)),
        _ => None,
    };
    match (verifier, token) {
        (Some(verifier), Some(token)) => {
            let ip = client.0.map(|ip| ip.to_string());
            let uri = parts
                .uri
                .path_and_query()
                .map_or_else(|| parts.uri.path(), |p| p.as_str());
            let at = plugin_sdk::access::TokenRequest {
                method: parts.method.as_str(),
                uri,
                request_id,
                client_ip: ip.as_deref(),
            };
            let identity = verifier.verify(token, at).await.map_err(|refused| {
                if refused.status == 403 {
                    AdminError::forbidden(refused.message)
                } else {
                    AdminError::unauthorized(format!("invalid JWT: {}", refused.message))
                }
            })?;
            state.store.token_principal(&identity).await
        }
        _ => {
            let raw = presented.ok_or_else(|| {
                AdminError::unauthorized("missing API key: send it in the x-gw-api-key header")
            })?;
            state.store.authenticate(raw).await
        }
    }
}

/// The request's id in the audit log: its `x-gw-trace-id` (1 to 128 characters), else a new
/// UUID.
fn request_id(headers: &http::HeaderMap) -> String {
    headers
        .get("x-gw-trace-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128)
        .map(str::to_owned)
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string())
}

impl<S: Send + Sync> FromRequestParts<S> for ClientAddr {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _state: &S,
    ) -> std::result::Result<ClientAddr, Self::Rejection> {
        Ok(parts
            .extensions
            .get::<ClientAddr>()
            .copied()
            .unwrap_or(ClientAddr(None)))
    }
}

/// The path's parameters, with the router's rejection as a control-plane error.
pub struct PathParams<T>(pub T);

impl<T, S> FromRequestParts<S> for PathParams<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = AdminError;

    async fn from_request_parts(parts: &mut http::request::Parts, state: &S) -> Result<Self> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| PathParams(p.0))
            .map_err(|e| AdminError::validation(format!("invalid path: {}", e.body_text())))
    }
}

/// A slug from a name: `prefix-`, the name's letters and digits in lowercase (about
/// `max_base` of them) with dashes between words, and a random suffix (`ws-team-a-3f9c2e`).
pub(crate) fn generated_slug(prefix: &str, max_base: usize, name: &str) -> String {
    let mut base = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            base.push(c.to_ascii_lowercase());
        } else if !base.is_empty() && !base.ends_with('-') {
            base.push('-');
        }
        if base.len() >= max_base {
            break;
        }
    }
    let base = base.trim_end_matches('-');
    if base.is_empty() {
        format!("{prefix}-{}", crate::keys::random_hex(6))
    } else {
        format!("{prefix}-{base}-{}", crate::keys::random_hex(6))
    }
}

/// `{prefix}-` + five letters or digits of the name (random ones when it has fewer) + `-` + six
/// random hex digits, as the reference names configs and guardrails: `pc-fallb-3f9c2e`.
pub(crate) fn short_slug(prefix: &str, name: &str) -> String {
    let mut head: String = name
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .take(5)
        .collect();
    if head.len() < 5 {
        head.push_str(&crate::keys::random_hex(5 - head.len()));
    }
    format!("{prefix}-{head}-{}", crate::keys::random_hex(6))
}

/// `{object: "list", total, data}`.
pub fn list_envelope(total: i64, data: Vec<Value>) -> Json<Value> {
    Json(json!({"object": "list", "total": total, "data": data}))
}

/// `{}`: the answer to an update or a delete.
pub fn empty() -> Json<Value> {
    Json(json!({}))
}

/// For fields where `null` and absent differ: absent is `None`, `null` is `Some(None)`.
pub fn double_option<'de, T, D>(de: D) -> std::result::Result<Option<Option<T>>, D::Error>
where
    T: Deserialize<'de>,
    D: Deserializer<'de>,
{
    Option::<T>::deserialize(de).map(Some)
}
