//! The HTTP API: an axum `Router` whose paths are the gateway's own (`/v1/...`).
//!
//! Every handler takes a [`Ctx`]: the authenticated principal (401 before anything else), the
//! request details the audit log records, and the body. Answers are 200 with JSON; errors are
//! [`AdminError`]s, turned into the reference's error body in one place.

mod api_keys;
mod audit_logs;
mod configs;
mod deployments;
mod integrations;
mod invites;
mod logs;
mod members;
mod policies;
mod providers;
mod settings;
mod users;
mod workspaces;

use std::net::IpAddr;

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::{Method, Uri};
use axum::routing::{get, post};
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

#[derive(Clone)]
pub struct AppState {
    pub store: Store,
}

/// The control plane's routes. The paths the gateway sends here are listed in
/// [`crate::CONTROL_PLANE_PREFIXES`].
pub fn router(store: Store) -> Router {
    Router::new()
        .route("/v1/api-keys", get(api_keys::list))
        .route(
            "/v1/api-keys/{id}",
            get(api_keys::get)
                .put(api_keys::update)
                .delete(api_keys::delete),
        )
        // `{type}/{sub-type}` to create, `{id}/rotate` to rotate: one pattern, as the router
        // wants one parameter name per position.
        .route(
            "/v1/api-keys/{id}/{action}",
            post(api_keys::create_or_rotate),
        )
        .route(
            "/v1/admin/workspaces",
            post(workspaces::create).get(workspaces::list),
        )
        .route(
            "/v1/admin/workspaces/{id}",
            get(workspaces::get)
                .put(workspaces::update)
                .delete(workspaces::delete),
        )
        .route(
            "/v1/admin/workspaces/{id}/users",
            post(members::add).get(members::list),
        )
        .route(
            "/v1/admin/workspaces/{id}/users/{user_id}",
            get(members::get)
                .put(members::update)
                .delete(members::delete),
        )
        .route(
            "/v1/admin/workspaces/{id}/settings",
            get(settings::get_workspace).put(settings::update_workspace),
        )
        .route(
            "/v1/admin/settings",
            get(settings::get_organisation).put(settings::update_organisation),
        )
        .route("/v1/admin/users", get(users::list))
        .route(
            "/v1/admin/users/{id}",
            get(users::get).put(users::update).delete(users::delete),
        )
        .route(
            "/v1/admin/users/invites",
            post(invites::create).get(invites::list),
        )
        .route(
            "/v1/admin/users/invites/{id}",
            get(invites::get).delete(invites::delete),
        )
        .route("/v1/admin/users/invites/{id}/resend", post(invites::resend))
        .route("/v1/admin/users/invites/{id}/accept", post(invites::accept))
        .route(
            "/v1/deployments",
            post(deployments::create).get(deployments::list),
        )
        .route(
            "/v1/deployments/{id}",
            get(deployments::get)
                .put(deployments::update)
                .delete(deployments::delete),
        )
        .route("/v1/audit-logs", get(audit_logs::list))
        .route("/v1/logs", get(logs::list).post(logs::insert))
        .route(
            "/v1/logs/exports",
            post(logs::create_export).get(logs::list_exports),
        )
        .route(
            "/v1/logs/exports/{id}",
            get(logs::get_export).put(logs::update_export),
        )
        .route("/v1/logs/exports/{id}/start", post(logs::start_export))
        .route("/v1/logs/exports/{id}/cancel", post(logs::cancel_export))
        .route("/v1/logs/exports/{id}/download", get(logs::download_export))
        .route("/v1/logs/{id}", get(logs::get))
        .route("/v1/configs", post(configs::create).get(configs::list))
        .route(
            "/v1/configs/{slug}",
            get(configs::get)
                .put(configs::update)
                .delete(configs::delete),
        )
        .route("/v1/configs/{slug}/versions", get(configs::versions))
        .route(
            "/v1/integrations",
            post(integrations::create).get(integrations::list),
        )
        .route(
            "/v1/integrations/{slug}",
            get(integrations::get)
                .put(integrations::update)
                .delete(integrations::delete),
        )
        .route(
            "/v1/integrations/{slug}/workspaces",
            get(integrations::workspaces).put(integrations::update_workspaces),
        )
        .route(
            "/v1/providers",
            post(providers::create).get(providers::list),
        )
        .route(
            "/v1/providers/{slug}",
            get(providers::get)
                .put(providers::update)
                .delete(providers::delete),
        )
        .route(
            "/v1/virtual-keys",
            post(providers::create_virtual_key).get(providers::list_virtual_keys),
        )
        .route(
            "/v1/virtual-keys/{slug}",
            get(providers::get_virtual_key)
                .put(providers::update_virtual_key)
                .delete(providers::delete_virtual_key),
        )
        .route(
            "/v1/policies/rate-limits",
            post(policies::create_rate_limits).get(policies::list_rate_limits),
        )
        .route(
            "/v1/policies/rate-limits/{id}",
            get(policies::get_rate_limits)
                .put(policies::update_rate_limits)
                .delete(policies::delete_rate_limits),
        )
        .route(
            "/v1/policies/rate-limits/{id}/entities",
            get(policies::rate_limits_entities),
        )
        .route(
            "/v1/policies/usage-limits",
            post(policies::create_usage_limits).get(policies::list_usage_limits),
        )
        .route(
            "/v1/policies/usage-limits/{id}",
            get(policies::get_usage_limits)
                .put(policies::update_usage_limits)
                .delete(policies::delete_usage_limits),
        )
        .route(
            "/v1/policies/usage-limits/{id}/entities",
            get(policies::usage_limits_entities),
        )
        .route(
            "/v1/policies/usage-limits/{id}/entities/{entity}/reset",
            axum::routing::put(policies::reset_usage_limits_entity),
        )
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(AppState { store })
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
        let raw = API_KEY_HEADERS
            .iter()
            .find_map(|h| parts.headers.get(*h))
            .map(|v| v.to_str().map(str::trim).unwrap_or(""))
            .ok_or_else(|| {
                AdminError::unauthorized("missing API key: send it in the x-gw-api-key header")
            })?;
        let principal = state.store.authenticate(raw).await?;
        let client = ClientAddr::from_request_parts(&mut parts, state)
            .await
            .unwrap_or(ClientAddr(None));
        let request_id = parts
            .headers
            .get("x-gw-trace-id")
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty() && v.len() <= 128)
            .map(str::to_owned)
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
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
