//! `/v1/api-keys`: create (`{type}/{sub-type}`), list, get, update, delete, rotate, and fetch
//! the value an automatic rotation made (`{id}/rotated-key`).

use std::collections::BTreeSet;
use std::time::Duration;

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use utoipa::{IntoParams, ToSchema};

use super::openapi::{tag, EmptyObject, ErrorBody, ListEnvelope};
use super::{double_option, empty, list_envelope, AppState, Ctx, PathParams};
use crate::authz::{
    self, Access, Action, KeyKind, KeyUser, Op, OrgRole, Principal, Resource, WorkspaceRole,
};
use crate::error::{AdminError, Result};
use crate::store::{
    ApiKey, KeyChanges, KeyFilter, NewKey, OrganisationSettings, Store, MIN_KEY_TRANSITION_MS,
};
use crate::time::{self, Timestamp};
use crate::validate::{self, Metadata, Page, RateLimit, UsageLimitsInput};

/// The shortest and the default transition of a rotation: the old key works 30 more minutes.
const MIN_TRANSITION_MS: i64 = MIN_KEY_TRANSITION_MS;

/// `defaults` of a key: what requests made with it get unless they say otherwise.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = ApiKeyDefaults)]
struct KeyDefaults {
    /// Metadata of the requests made with the key (string values).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<BTreeMap<String, String>>)]
    metadata: Option<Metadata>,
    /// The config (slug or id) applied to each request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    config_id: Option<String>,
    /// Whether a request may name another config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    allow_config_override: Option<bool>,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum RotationPeriod {
    Weekly,
    Monthly,
}

/// `rotation_policy` of a key: when the control plane rotates it by itself. At
/// `next_rotation_at` the key gets a new raw value (fetched once with
/// `GET /v1/api-keys/{id}/rotated-key`), the old one working for the transition period, and
/// `next_rotation_at` moves one `rotation_period` on; without a period the key rotates once.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct RotationPolicy {
    /// `weekly` (7 days) or `monthly` (a calendar month); absent: rotate once.
    #[serde(default)]
    rotation_period: Option<RotationPeriod>,
    /// The next automatic rotation (RFC 3339); absent: none.
    #[serde(default)]
    #[schema(format = DateTime)]
    next_rotation_at: Option<String>,
    /// How long the old value works after an automatic rotation: at least and by default
    /// 1800000 (30 minutes).
    #[serde(default)]
    #[schema(minimum = 1800000)]
    key_transition_period_ms: Option<i64>,
}

/// A new key. Workspace keys need `workspace_id`; a workspace user key belongs to `user_id`
/// (default: the caller's user).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = CreateApiKey)]
struct CreateKey {
    /// 1 to 255 characters.
    name: String,
    /// What the key may do (`workspaces.list`, `logs.view`, ...): the scopes of its kind, and
    /// only those the caller holds.
    scopes: Vec<String>,
    /// At most 1024 characters.
    #[serde(default)]
    description: Option<String>,
    /// A workspace id or slug: required for workspace keys, refused for admin keys.
    #[serde(default)]
    workspace_id: Option<String>,
    /// The user a workspace user key belongs to (a UUID).
    #[serde(default)]
    user_id: Option<String>,
    #[serde(default)]
    rate_limits: Option<Vec<RateLimit>>,
    #[serde(default)]
    usage_limits: Option<UsageLimitsInput>,
    #[serde(default)]
    defaults: Option<KeyDefaults>,
    /// E-mail addresses alerted about the key's usage.
    #[serde(default)]
    alert_emails: Option<Vec<String>>,
    /// RFC 3339, in the future and within the organisation's maximum; absent: the
    /// organisation's default expiry; `null`: never (when the organisation has no maximum).
    #[serde(default, deserialize_with = "double_option")]
    #[schema(format = DateTime)]
    expires_at: Option<Option<String>>,
    #[serde(default)]
    rotation_policy: Option<RotationPolicy>,
}

/// The fields to change; absent fields are kept, `null` clears those that can be cleared.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = UpdateApiKey)]
struct UpdateKey {
    #[serde(default)]
    name: Option<String>,
    #[serde(default, deserialize_with = "double_option")]
    description: Option<Option<String>>,
    #[serde(default)]
    scopes: Option<Vec<String>>,
    #[serde(default)]
    rate_limits: Option<Vec<RateLimit>>,
    #[serde(default, deserialize_with = "double_option")]
    usage_limits: Option<Option<UsageLimitsInput>>,
    #[serde(default)]
    defaults: Option<KeyDefaults>,
    #[serde(default)]
    alert_emails: Option<Vec<String>>,
    /// RFC 3339; `null`: never (when the organisation has no maximum).
    #[serde(default, deserialize_with = "double_option")]
    #[schema(format = DateTime)]
    expires_at: Option<Option<String>>,
    #[serde(default, deserialize_with = "double_option")]
    rotation_policy: Option<Option<RotationPolicy>>,
    /// `true` sets the key's usage back to zero.
    #[serde(default)]
    reset_usage: Option<bool>,
}

/// A rotation.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = RotateApiKey)]
struct RotateKey {
    /// How long the old key keeps working, in milliseconds: at least and by default 1800000
    /// (30 minutes).
    #[serde(default)]
    #[schema(minimum = 1800000)]
    key_transition_period_ms: Option<i64>,
}

// Described for the OpenAPI document only; the handler reads `CreateKey` or `RotateKey`.
/// The body of `POST /v1/api-keys/{id}/{action}`: a new key (`{type}/{sub-type}`) or a
/// rotation (`{id}/rotate`).
#[derive(Deserialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)] // described in the OpenAPI document, never built
#[schema(as = CreateOrRotateApiKey)]
enum CreateOrRotate {
    Create(Box<CreateKey>),
    Rotate(RotateKey),
}

/// `{id, key, object}`: the new key, shown this once.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)] // described in the OpenAPI document, never built
struct ApiKeyCreated {
    id: String,
    /// The raw key: keep it, it is not shown again.
    key: String,
    /// `api-key`.
    object: String,
}

/// `{id, key, rotated_at, key_transition_expires_at, object}`: the raw key an automatic
/// rotation made, handed out once.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)] // described in the OpenAPI document, never built
struct ApiKeyRotatedKey {
    id: String,
    /// The new raw key: keep it, it is not shown again.
    key: String,
    /// When the rotation happened (RFC 3339).
    #[schema(format = DateTime)]
    rotated_at: String,
    /// Until when the old key keeps working (RFC 3339).
    #[schema(format = DateTime)]
    key_transition_expires_at: Option<String>,
    /// `api-key`.
    object: String,
}

/// `{id, key, key_transition_expires_at, object}`: the new raw key of a rotated key.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)] // described in the OpenAPI document, never built
struct ApiKeyRotated {
    id: String,
    /// The new raw key.
    key: String,
    /// Until when the old key keeps working (RFC 3339).
    #[schema(format = DateTime)]
    key_transition_expires_at: String,
    /// `api-key`.
    object: String,
}

// Described for the OpenAPI document only (the handler answers JSON it builds).
/// The answer of `POST /v1/api-keys/{id}/{action}`.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)] // described in the OpenAPI document, never built
enum CreatedOrRotated {
    Created(ApiKeyCreated),
    Rotated(ApiKeyRotated),
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    /// Items per page: 0 to 100, default 50.
    #[serde(default)]
    #[param(minimum = 0, maximum = 100)]
    page_size: Option<i64>,
    /// The page, from 0.
    #[serde(default)]
    #[param(minimum = 0)]
    current_page: Option<i64>,
    /// Only the keys of this workspace (id or slug); a workspace key lists its own workspace's.
    #[serde(default)]
    workspace_id: Option<String>,
}

/// `POST /api-keys/{type}/{sub-type}` or `POST /api-keys/{id}/rotate`.
#[utoipa::path(
    post,
    path = "/v1/api-keys/{id}/{action}",
    operation_id = "createOrRotateApiKey",
    tag = tag::API_KEYS,
    summary = "Create a key, or rotate one",
    description = "`POST /v1/api-keys/{type}/{sub-type}` creates a key: `organisation/service` \
        (an admin key), `workspace/service` or `workspace/user`; the body is a `CreateApiKey`. \
        `POST /v1/api-keys/{id}/rotate` gives the key `id` a new raw key, the old one working for \
        the transition period; the body is a `RotateApiKey`.",
    params(
        ("id" = String, Path, description = "`organisation` or `workspace` to create; a key's id (UUID) to rotate."),
        ("action" = String, Path, description = "`service` or `user` to create; `rotate` to rotate."),
    ),
    request_body(content = CreateOrRotate, description = "`CreateApiKey` to create, `RotateApiKey` to rotate."),
    responses(
        (status = 200, description = "The new key, or the rotated key's new raw key.", body = CreatedOrRotated),
        (status = 400, description = "An invalid body, an unknown key type, an expired key.", body = ErrorBody),
        (status = 404, description = "No such key to rotate (AB08), or no workspace or user named in the body (AB02).", body = ErrorBody),
        (status = 409, description = "The user has as many keys in the workspace as the settings allow.", body = ErrorBody),
    )
)]
pub async fn create_or_rotate(
    State(app): State<AppState>,
    PathParams((first, second)): PathParams<(String, String)>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    if second == "rotate" && first != "organisation" && first != "workspace" {
        return rotate(&app.store, &ctx, &first).await;
    }
    let kind = key_kind(&first, &second)?;
    create(&app.store, &ctx, kind).await
}

/// The kind of key a create path names (`{type}/{sub-type}`), or a 400 listing the kinds.
fn key_kind(first: &str, second: &str) -> Result<KeyKind> {
    KeyKind::from_path(first, second).ok_or_else(|| {
        AdminError::validation(format!(
            "unknown key type {first}/{second}: use organisation/service, workspace/service or workspace/user"
        ))
    })
}

async fn create(store: &Store, ctx: &Ctx, kind: KeyKind) -> Result<Json<Value>> {
    let key = new_key(store, ctx, kind, ctx.json()?).await?;
    let (id, raw) = store.create_api_key(ctx.actor(), &key).await?;
    Ok(Json(json!({"id": id, "key": raw, "object": "api-key"})))
}

/// The most keys one `POST /v1/api-keys/{type}/{sub-type}/bulk` creates.
pub const MAX_BULK_KEYS: usize = 1000;

/// The body of `POST /v1/api-keys/{type}/{sub-type}/bulk`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = CreateApiKeys)]
struct CreateKeys {
    /// 1 to 1000 keys, each as `POST /v1/api-keys/{type}/{sub-type}` takes it.
    keys: Vec<CreateKey>,
}

/// `{object: "list", total, data: [{id, key, object}]}`: the new keys, in the order asked,
/// shown this once.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)] // described in the OpenAPI document, never built
struct ApiKeysCreated {
    /// `list`.
    object: String,
    total: usize,
    data: Vec<ApiKeyCreated>,
}

/// `POST /api-keys/{type}/{sub-type}/bulk`.
#[utoipa::path(
    post,
    path = "/v1/api-keys/{id}/{action}/bulk",
    operation_id = "createApiKeys",
    tag = tag::API_KEYS,
    summary = "Create many keys of one type",
    description = "`POST /v1/api-keys/{type}/{sub-type}/bulk` creates up to 1000 keys of one \
        type in one transaction: all of them, or none when one item is refused (the error names \
        it: `keys[3].scopes: ...`). One audit record (`bulk_create`) lists their ids in \
        `resource_ids`. The raw keys are shown this once.",
    params(
        ("id" = String, Path, description = "`organisation` or `workspace`."),
        ("action" = String, Path, description = "`service` or `user`."),
    ),
    request_body = CreateKeys,
    responses(
        (status = 200, description = "The new keys, in the order asked.", body = ApiKeysCreated),
        (status = 400, description = "An invalid body or item, an unknown key type, no keys or more than 1000.", body = ErrorBody),
        (status = 404, description = "No workspace or user named in an item (AB02).", body = ErrorBody),
        (status = 409, description = "A user would have more keys in the workspace than the settings allow.", body = ErrorBody),
    )
)]
pub async fn create_many(
    State(app): State<AppState>,
    PathParams((first, second)): PathParams<(String, String)>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let body: CreateKeys = ctx.json()?;
    let kind = key_kind(&first, &second)?;
    validate::bulk_size("keys", body.keys.len(), MAX_BULK_KEYS)?;
    let mut keys = Vec::with_capacity(body.keys.len());
    for (i, item) in body.keys.into_iter().enumerate() {
        let key = new_key(&app.store, &ctx, kind, item)
            .await
            .map_err(|e| e.within(&format!("keys[{i}]")))?;
        keys.push(key);
    }
    let made = app.store.create_api_keys(ctx.actor(), &keys).await?;
    let data: Vec<Value> = made
        .into_iter()
        .map(|(id, key)| json!({"id": id, "key": key, "object": "api-key"}))
        .collect();
    Ok(Json(
        json!({"object": "list", "total": data.len(), "data": data}),
    ))
}

/// A key to create from a `CreateKey` body: validated, its references resolved, and the
/// caller's right to make it checked.
async fn new_key(store: &Store, ctx: &Ctx, kind: KeyKind, body: CreateKey) -> Result<NewKey> {
    let p = &ctx.principal;
    let org = &p.organisation_id;
    let name = validate::name("name", &body.name)?;
    let scopes = authz::check_scopes(kind, &body.scopes).map_err(AdminError::validation)?;

    let workspace_id = match (kind.is_workspace(), &body.workspace_id) {
        (true, None) => {
            return Err(AdminError::field(
                "workspace_id",
                "is required for workspace keys",
            ))
        }
        (true, Some(ws)) => Some(resolve_workspace(store, org, ws).await?),
        (false, Some(_)) => {
            return Err(AdminError::field(
                "workspace_id",
                "an admin key belongs to the organisation, not to a workspace",
            ))
        }
        (false, None) => None,
    };
    let user_id = match kind {
        KeyKind::WorkspaceUser => {
            let user = match &body.user_id {
                Some(u) => validate::uuid("user_id", u)?,
                None => p.user_id.clone().ok_or_else(|| {
                    AdminError::field("user_id", "is required: the calling key acts for no user")
                })?,
            };
            Some(user)
        }
        _ if body.user_id.is_some() => {
            return Err(AdminError::field(
                "user_id",
                "only workspace user keys belong to a user",
            ))
        }
        _ => None,
    };

    authz::allowed(
        p,
        &Action::new(Resource::ApiKeys(kind), Op::Create).owned_by(user_id.as_deref()),
        workspace_id.as_deref(),
    )?;
    authz::may_grant(p, &scopes)?;

    if let (Some(user), Some(ws)) = (&user_id, &workspace_id) {
        if store.user(org, user).await?.is_none() {
            return Err(AdminError::reference(format!(
                "user_id: no user {user} in the organisation"
            )));
        }
        let key_user = store.key_user(org, ws, user).await?;
        match key_user {
            Some(u) if u.workspace_role().is_some() => authz::may_act_for_user(p, &u)?,
            _ => {
                return Err(AdminError::field(
                    "user_id",
                    format!("the user {user} is not a member of the workspace"),
                ))
            }
        }
    }
    let settings = store.organisation_settings(org).await?;
    let expires_at = expiry(&settings, body.expires_at.as_ref(), true)?;
    let defaults = defaults(
        store,
        org,
        workspace_id.as_deref(),
        body.defaults.unwrap_or_default(),
    )
    .await?;
    Ok(NewKey {
        kind,
        name,
        description: validate::description(body.description)?,
        workspace_id,
        user_id,
        created_by_user_id: p.user_id.clone(),
        scopes,
        rate_limits: validate::rate_limits("rate_limits", body.rate_limits.unwrap_or_default())?,
        usage_limits: body
            .usage_limits
            .map(|u| validate::usage_limits("usage_limits", u))
            .transpose()?,
        defaults,
        alert_emails: alert_emails(body.alert_emails.unwrap_or_default())?,
        rotation_policy: body.rotation_policy.map(rotation_policy).transpose()?,
        expires_at: expires_at.flatten(),
    })
}

/// `GET /api-keys`: the keys the caller may list, masked.
#[utoipa::path(
    get,
    path = "/v1/api-keys",
    operation_id = "listApiKeys",
    tag = tag::API_KEYS,
    summary = "List keys",
    description = "The keys the caller may list, masked, newest first. A workspace member lists only their own user keys.",
    params(ListQuery),
    responses(
        (status = 200, description = "A page of keys (each as `GET /v1/api-keys/{id}` answers).", body = ListEnvelope),
        (status = 400, description = "An invalid query.", body = ErrorBody),
        (status = 404, description = "No workspace `workspace_id` (AB02).", body = ErrorBody),
    )
)]
pub async fn list(State(app): State<AppState>, ctx: Ctx) -> Result<Json<Value>> {
    let q: ListQuery = ctx.query()?;
    let page = Page::new(q.page_size, q.current_page)?;
    let p = &ctx.principal;
    let workspace_id = match &q.workspace_id {
        Some(ws) => Some(resolve_workspace(&app.store, &p.organisation_id, ws).await?),
        None => p.workspace_id().map(str::to_owned),
    };
    // Workspace members list only their own user keys.
    let own_only = matches!(
        p.access,
        Access::Workspace {
            role: WorkspaceRole::Member,
            ..
        }
    );
    let owner = if own_only { p.user_id.as_deref() } else { None };
    let mut kinds = Vec::new();
    let mut denied = None;
    for kind in KeyKind::ALL {
        let action = Action::new(Resource::ApiKeys(kind), Op::List).owned_by(owner);
        match authz::allowed(p, &action, workspace_id.as_deref()) {
            Ok(()) => kinds.push(kind),
            Err(d) => denied = denied.or(Some(d)),
        }
    }
    if kinds.is_empty() {
        return Err(denied.expect("a refusal for each kind").into());
    }
    let filter = KeyFilter {
        workspace_id,
        kinds,
        user_id: owner.map(str::to_owned),
    };
    let (total, keys) = app
        .store
        .api_keys(&p.organisation_id, &filter, page)
        .await?;
    Ok(list_envelope(
        total,
        keys.iter().map(ApiKey::to_json).collect(),
    ))
}

/// `GET /api-keys/{id}`.
#[utoipa::path(
    get,
    path = "/v1/api-keys/{id}",
    operation_id = "getApiKey",
    tag = tag::API_KEYS,
    summary = "Get a key",
    params(
        ("id" = String, Path, description = "The key's id (a UUID)."),
    ),
    responses(
        (status = 200, description = "The key, masked.", body = Object),
        (status = 400, description = "A malformed id.", body = ErrorBody),
        (status = 404, description = "No such key.", body = ErrorBody),
    )
)]
pub async fn get(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let key = authorised_key(&app.store, &ctx.principal, &id, Op::Read).await?;
    Ok(Json(key.to_json()))
}

/// `PUT /api-keys/{id}`.
#[utoipa::path(
    put,
    path = "/v1/api-keys/{id}",
    operation_id = "updateApiKey",
    tag = tag::API_KEYS,
    summary = "Update a key",
    params(
        ("id" = String, Path, description = "The key's id (a UUID)."),
    ),
    request_body = UpdateKey,
    responses(
        (status = 200, description = "Updated.", body = EmptyObject),
        (status = 400, description = "A malformed id or an invalid body.", body = ErrorBody),
        (status = 404, description = "No such key.", body = ErrorBody),
    )
)]
pub async fn update(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let body: UpdateKey = ctx.json()?;
    let p = &ctx.principal;
    let key = authorised_key(&app.store, p, &id, Op::Update).await?;
    let scopes = match &body.scopes {
        Some(s) => {
            let s = authz::check_scopes(key.kind, s).map_err(AdminError::validation)?;
            authz::may_grant(p, &s)?;
            Some(s)
        }
        None => None,
    };
    let settings = app.store.organisation_settings(&p.organisation_id).await?;
    let changes = KeyChanges {
        name: body.name.map(|n| validate::name("name", &n)).transpose()?,
        description: body.description.map(validate::description).transpose()?,
        scopes,
        rate_limits: body
            .rate_limits
            .map(|r| validate::rate_limits("rate_limits", r))
            .transpose()?,
        usage_limits: body
            .usage_limits
            .map(|u| {
                u.map(|u| validate::usage_limits("usage_limits", u))
                    .transpose()
            })
            .transpose()?,
        defaults: match body.defaults {
            Some(d) => Some(
                defaults(
                    &app.store,
                    &p.organisation_id,
                    key.workspace_id.as_deref(),
                    d,
                )
                .await?,
            ),
            None => None,
        },
        alert_emails: body.alert_emails.map(alert_emails).transpose()?,
        rotation_policy: body
            .rotation_policy
            .map(|r| r.map(rotation_policy).transpose())
            .transpose()?,
        expires_at: expiry(&settings, body.expires_at.as_ref(), false)?,
        reset_usage: body.reset_usage.unwrap_or(false),
    };
    app.store
        .update_api_key(ctx.actor(), &key, &changes)
        .await?;
    Ok(empty())
}

/// `DELETE /api-keys/{id}`: the key stops working at once.
#[utoipa::path(
    delete,
    path = "/v1/api-keys/{id}",
    operation_id = "deleteApiKey",
    tag = tag::API_KEYS,
    summary = "Delete a key",
    description = "The key stops working at once.",
    params(
        ("id" = String, Path, description = "The key's id (a UUID)."),
    ),
    responses(
        (status = 200, description = "Deleted.", body = EmptyObject),
        (status = 400, description = "A malformed id.", body = ErrorBody),
        (status = 404, description = "No such key.", body = ErrorBody),
    )
)]
pub async fn delete(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let key = authorised_key(&app.store, &ctx.principal, &id, Op::Delete).await?;
    app.store.delete_api_key(ctx.actor(), &key).await?;
    Ok(empty())
}

/// `GET /api-keys/{id}/rotated-key`: the raw key the last automatic rotation made, once.
#[utoipa::path(
    get,
    path = "/v1/api-keys/{id}/rotated-key",
    operation_id = "getRotatedApiKey",
    tag = tag::API_KEYS,
    summary = "Fetch the key an automatic rotation made",
    description = "The new raw key the key's `rotation_policy` gave it at its last automatic \
        rotation, handed out once (with the right to rotate the key): the answer clears it, so a \
        second call is a 404 until the next rotation, which replaces a key nobody fetched. A \
        manual rotation drops it too (its caller gets the new key).",
    params(
        ("id" = String, Path, description = "The key's id (a UUID)."),
    ),
    responses(
        (status = 200, description = "The new raw key.", body = ApiKeyRotatedKey),
        (status = 400, description = "A malformed id.", body = ErrorBody),
        (status = 404, description = "No such key, or no rotated key waiting (AB08).", body = ErrorBody),
    )
)]
pub async fn rotated_key(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let key = authorised_key(&app.store, &ctx.principal, &id, Op::Update).await?;
    let rotated = app
        .store
        .take_rotated_key(ctx.actor(), &key)
        .await?
        .ok_or_else(|| {
            AdminError::not_found(format!("no rotated key waiting for the key {}", key.id))
        })?;
    Ok(Json(json!({
        "id": rotated.id,
        "key": rotated.key,
        "rotated_at": rotated.rotated_at,
        "key_transition_expires_at": rotated.key_transition_expires_at,
        "object": "api-key",
    })))
}

/// `POST /api-keys/{id}/rotate`: a new raw key; the old one works for the transition period.
async fn rotate(store: &Store, ctx: &Ctx, id: &str) -> Result<Json<Value>> {
    let body: RotateKey = ctx.json()?;
    let ms = body.key_transition_period_ms.unwrap_or(MIN_TRANSITION_MS);
    if ms < MIN_TRANSITION_MS {
        return Err(AdminError::field(
            "key_transition_period_ms",
            format!("must be >= {MIN_TRANSITION_MS} (30 minutes), got {ms}"),
        ));
    }
    let key = authorised_key(store, &ctx.principal, id, Op::Update).await?;
    if key.status == "expired" {
        return Err(AdminError::validation(
            "the key has expired: give it a new expires_at before rotating it",
        ));
    }
    let rotated = store
        .rotate_api_key(ctx.actor(), &key, Duration::from_millis(ms as u64))
        .await?;
    Ok(Json(json!({
        "id": rotated.id,
        "key": rotated.key,
        "key_transition_expires_at": rotated.key_transition_expires_at,
        "object": "api-key",
    })))
}

/// The key of the path, when the caller may do `op` to it: 400 for a malformed id, 404 for
/// none, 403 without the right. Changing a user key (update, rotate, fetch its rotated value)
/// acts for its user: a workspace caller may do it only for members at or below its own role
/// ([`authz::may_act_for_user`]).
async fn authorised_key(store: &Store, p: &Principal, id: &str, op: Op) -> Result<ApiKey> {
    let id = validate::uuid("id", id)?;
    let key = store
        .api_key(&p.organisation_id, &id)
        .await?
        .ok_or_else(|| AdminError::not_found(format!("no API key {id}")))?;
    authz::allowed(
        p,
        &Action::new(Resource::ApiKeys(key.kind), op).owned_by(key.user_id.as_deref()),
        key.workspace_id.as_deref(),
    )?;
    if op == Op::Update && !p.is_organisation_admin() {
        if let (Some(user), Some(ws)) = (&key.user_id, &key.workspace_id) {
            let key_user = store.key_user(&p.organisation_id, ws, user).await?;
            // A user who has left the organisation is nobody's to act for.
            let key_user = key_user.unwrap_or(KeyUser {
                org_role: OrgRole::Member,
                membership: None,
            });
            authz::may_act_for_user(p, &key_user)?;
        }
    }
    Ok(key)
}

/// A workspace id or slug of the request, as an id: 404 (AB02) when there is none.
async fn resolve_workspace(store: &Store, org: &str, id_or_slug: &str) -> Result<String> {
    Ok(store
        .workspace(org, id_or_slug)
        .await?
        .ok_or_else(|| AdminError::reference(format!("workspace_id: no workspace {id_or_slug:?}")))?
        .id)
}

/// `expires_at` within the organisation's bounds. Absent: the default expiry on creation (and
/// no change on update); `null`: never, which only an organisation without a maximum allows.
fn expiry(
    settings: &OrganisationSettings,
    requested: Option<&Option<String>>,
    creating: bool,
) -> Result<Option<Option<Timestamp>>> {
    let now = time::now();
    let days = |d: i64| chrono::Duration::days(d);
    match requested {
        None if creating => Ok(Some(
            settings.api_key_default_expiry_days.map(|d| now + days(d)),
        )),
        None => Ok(None),
        Some(None) => match settings.api_key_max_expiry_days {
            Some(max) => Err(AdminError::field(
                "expires_at",
                format!("keys must expire within {max} days (the organisation's maximum)"),
            )),
            None => Ok(Some(None)),
        },
        Some(Some(text)) => {
            let t = validate::timestamp("expires_at", text)?;
            if t <= now {
                return Err(AdminError::field("expires_at", "must be in the future"));
            }
            if let Some(max) = settings.api_key_max_expiry_days {
                if t > now + days(max) {
                    return Err(AdminError::field(
                        "expires_at",
                        format!("must be within {max} days (the organisation's maximum)"),
                    ));
                }
            }
            Ok(Some(Some(t)))
        }
    }
}

/// A key's `defaults`: its `config_id` names a config the key may use, one of its workspace
/// (a workspace key) or of its organisation (an admin key). A config elsewhere is refused
/// exactly as an unknown one, so the answer does not tell that it exists.
async fn defaults(
    store: &Store,
    org: &str,
    workspace_id: Option<&str>,
    d: KeyDefaults,
) -> Result<Value> {
    if let Some(c) = &d.config_id {
        validate::max_len("defaults.config_id", c, validate::MAX_NAME)?;
        let usable = store
            .config(org, c)
            .await?
            .is_some_and(|config| workspace_id.is_none_or(|ws| config.workspace_id == ws));
        if !usable {
            return Err(AdminError::field(
                "defaults.config_id",
                format!("no config {c:?}"),
            ));
        }
    }
    Ok(serde_json::to_value(d).expect("defaults serialise"))
}

fn alert_emails(emails: Vec<String>) -> Result<Vec<String>> {
    let mut seen = BTreeSet::new();
    for (i, e) in emails.iter().enumerate() {
        validate::email(&format!("alert_emails[{i}]"), e)?;
        if !seen.insert(e.to_lowercase()) {
            return Err(AdminError::field(
                &format!("alert_emails[{i}]"),
                "repeats an earlier address",
            ));
        }
    }
    Ok(emails)
}

fn rotation_policy(r: RotationPolicy) -> Result<Value> {
    if let Some(ms) = r.key_transition_period_ms {
        if ms < MIN_TRANSITION_MS {
            return Err(AdminError::field(
                "rotation_policy.key_transition_period_ms",
                format!("must be >= {MIN_TRANSITION_MS} (30 minutes), got {ms}"),
            ));
        }
    }
    let next = match &r.next_rotation_at {
        Some(t) => Some(time::format(validate::timestamp(
            "rotation_policy.next_rotation_at",
            t,
        )?)),
        None => None,
    };
    Ok(json!({
        "rotation_period": r.rotation_period,
        "next_rotation_at": next,
        "key_transition_period_ms": r.key_transition_period_ms,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_is_bounded_by_the_organisation() {
        let s = OrganisationSettings::default();
        let created = expiry(&s, None, true).unwrap().unwrap().unwrap();
        let in_a_year = time::now() + chrono::Duration::days(365);
        assert!((created - in_a_year).num_seconds().abs() < 5);
        assert_eq!(expiry(&s, None, false).unwrap(), None);
        let never = Some(None);
        assert!(expiry(&s, never.as_ref(), true)
            .unwrap_err()
            .message
            .contains("within 730 days"));
        let far = Some(Some(time::format(
            time::now() + chrono::Duration::days(731),
        )));
        assert!(expiry(&s, far.as_ref(), true).is_err());
        let past = Some(Some("2020-01-01T00:00:00Z".to_owned()));
        assert_eq!(
            expiry(&s, past.as_ref(), true).unwrap_err().message,
            "expires_at: must be in the future"
        );
        let unbounded = OrganisationSettings {
            api_key_default_expiry_days: None,
            api_key_max_expiry_days: None,
            ..OrganisationSettings::default()
        };
        assert_eq!(expiry(&unbounded, None, true).unwrap(), Some(None));
        assert_eq!(
            expiry(&unbounded, never.as_ref(), true).unwrap(),
            Some(None)
        );
    }
}
