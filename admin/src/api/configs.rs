//! `/v1/configs`: create, list, get, update (each update a new version), delete, and the
//! versions of a config. Configs are named by slug (`pc-xxxxx-xxxxxx`) or id; the data plane
//! serves them to `x-gw-config: <slug>` (or the id).

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Deserializer};
use serde_json::{json, Value};
use utoipa::{IntoParams, ToSchema};

use super::openapi::{tag, EmptyObject, ErrorBody, ListEnvelope};
use super::{empty, list_envelope, AppState, Ctx, PathParams};
use crate::authz::{self, Action, Op, Principal, Resource};
use crate::error::{AdminError, Result};
use crate::store::audit::redact;
use crate::store::{config_secrets, Config, ConfigChanges, ConfigFilter, NewConfig, Store};
use crate::validate::{self, Page};

/// `isDefault`: a boolean, or the integers 0 and 1.
fn bool_or_int<'de, D: Deserializer<'de>>(de: D) -> std::result::Result<Option<bool>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Flag {
        Bool(bool),
        Int(i64),
    }
    match Option::<Flag>::deserialize(de)? {
        None => Ok(None),
        Some(Flag::Bool(b)) => Ok(Some(b)),
        Some(Flag::Int(0)) => Ok(Some(false)),
        Some(Flag::Int(1)) => Ok(Some(true)),
        Some(Flag::Int(n)) => Err(serde::de::Error::custom(format!(
            "must be true, false, 0 or 1, got {n}"
        ))),
    }
}

/// A new config.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateConfig {
    /// 1 to 255 characters.
    name: String,
    /// The routing config: a JSON object the gateway's config validator accepts. Its secrets
    /// (`api_key`, the AWS and Vertex credentials, the `headers` of hook checks) are stored
    /// encrypted and shown masked.
    #[schema(value_type = Object)]
    config: Value,
    /// Whether this is the workspace's default config: `true`, `false`, `0` or `1` (also
    /// spelled `is_default`). Default `false`.
    #[serde(
        default,
        rename = "isDefault",
        alias = "is_default",
        deserialize_with = "bool_or_int"
    )]
    is_default: Option<bool>,
    /// A workspace id or slug; default: the calling workspace key's workspace, else the
    /// organisation's `default` workspace.
    #[serde(default)]
    workspace_id: Option<String>,
}

/// The changes: a new version. At least one field.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct UpdateConfig {
    #[serde(default)]
    name: Option<String>,
    /// The new routing config (a JSON object). A secret sent back as the mask the API showed
    /// (`sk*******cd`) keeps the stored one.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    config: Option<Value>,
    /// `true`, `false`, `0` or `1` (also spelled `is_default`).
    #[serde(
        default,
        rename = "isDefault",
        alias = "is_default",
        deserialize_with = "bool_or_int"
    )]
    is_default: Option<bool>,
}

/// The query of a listing of workspace-owned resources (configs, guardrails).
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct WorkspacePageQuery {
    /// Items per page: 0 to 100, default 50.
    #[serde(default)]
    #[param(minimum = 0, maximum = 100)]
    pub page_size: Option<i64>,
    /// The page, from 0.
    #[serde(default)]
    #[param(minimum = 0)]
    pub current_page: Option<i64>,
    /// Only this workspace's (id or slug); a workspace key lists its own workspace's.
    #[serde(default)]
    pub workspace_id: Option<String>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct PageQuery {
    /// Items per page: 0 to 100, default 50.
    #[serde(default)]
    #[param(minimum = 0, maximum = 100)]
    page_size: Option<i64>,
    /// The page, from 0.
    #[serde(default)]
    #[param(minimum = 0)]
    current_page: Option<i64>,
}

/// `{id, slug, version_id, object}`: the new config.
#[derive(ToSchema)]
#[allow(dead_code)] // described in the OpenAPI document, never built
struct ConfigCreated {
    id: String,
    /// What requests name it by (`x-gw-config`).
    slug: String,
    /// Its first version.
    version_id: String,
    /// `config`.
    object: String,
}

/// `POST /configs` -> `{id, slug, version_id}`.
#[utoipa::path(
    post,
    path = "/v1/configs",
    operation_id = "createConfig",
    tag = tag::CONFIGS,
    summary = "Create a config",
    request_body = CreateConfig,
    responses(
        (status = 200, description = "The new config.", body = ConfigCreated),
        (status = 400, description = "An invalid body, or a config the gateway refuses.", body = ErrorBody),
        (status = 404, description = "No workspace `workspace_id` (AB02).", body = ErrorBody),
        (status = 409, description = "The slug is taken.", body = ErrorBody),
    )
)]
pub async fn create(State(app): State<AppState>, mut ctx: Ctx) -> Result<Json<Value>> {
    mask_audited_body(&mut ctx);
    let body: CreateConfig = ctx.json()?;
    let p = &ctx.principal;
    let name = validate::name("name", &body.name)?;
    let config = config_body(&app.store, body.config)?;
    let workspace_id = target_workspace(&app.store, p, body.workspace_id.as_deref()).await?;
    authz::allowed(
        p,
        &Action::new(Resource::Configs, Op::Create),
        Some(&workspace_id),
    )?;
    let new = NewConfig {
        workspace_id,
        slug: config_slug(&name),
        name,
        config,
        is_default: body.is_default.unwrap_or(false),
    };
    let created = app.store.create_config(ctx.actor(), &new).await?;
    Ok(Json(json!({
        "id": created.id,
        "slug": created.slug,
        "version_id": created.version_id,
        "object": "config",
    })))
}

/// `GET /configs`: the configs the caller may list, newest first.
#[utoipa::path(
    get,
    path = "/v1/configs",
    operation_id = "listConfigs",
    tag = tag::CONFIGS,
    summary = "List configs",
    description = "The configs the caller may list, newest first.",
    params(WorkspacePageQuery),
    responses(
        (status = 200, description = "A page of configs.", body = ListEnvelope),
        (status = 400, description = "An invalid query.", body = ErrorBody),
        (status = 404, description = "No workspace `workspace_id` (AB02).", body = ErrorBody),
    )
)]
pub async fn list(State(app): State<AppState>, ctx: Ctx) -> Result<Json<Value>> {
    let q: WorkspacePageQuery = ctx.query()?;
    let page = Page::new(q.page_size, q.current_page)?;
    let p = &ctx.principal;
    let workspace_id = list_workspace(&app.store, p, q.workspace_id.as_deref()).await?;
    authz::allowed(
        p,
        &Action::new(Resource::Configs, Op::List),
        workspace_id.as_deref(),
    )?;
    let (total, list) = app
        .store
        .configs(&p.organisation_id, &ConfigFilter { workspace_id }, page)
        .await?;
    Ok(list_envelope(
        total,
        list.iter().map(Config::to_json).collect(),
    ))
}

/// `GET /configs/{slug}`.
#[utoipa::path(
    get,
    path = "/v1/configs/{slug}",
    operation_id = "getConfig",
    tag = tag::CONFIGS,
    summary = "Get a config",
    params(
        ("slug" = String, Path, description = "The config's slug (`pc-...`) or id."),
    ),
    responses(
        (status = 200, description = "The config, with its current version (secrets masked).", body = Object),
        (status = 404, description = "No such config.", body = ErrorBody),
    )
)]
pub async fn get(
    State(app): State<AppState>,
    PathParams(slug): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let config = authorised(&app.store, &ctx.principal, &slug, Op::Read).await?;
    Ok(Json(config.to_json()))
}

/// `PUT /configs/{slug}`: a new version with the changes.
#[utoipa::path(
    put,
    path = "/v1/configs/{slug}",
    operation_id = "updateConfig",
    tag = tag::CONFIGS,
    summary = "Update a config",
    description = "Each update makes a new version. A secret of the config sent back as the \
        mask the API showed keeps the stored secret.",
    params(
        ("slug" = String, Path, description = "The config's slug (`pc-...`) or id."),
    ),
    request_body = UpdateConfig,
    responses(
        (status = 200, description = "Updated.", body = EmptyObject),
        (status = 400, description = "An invalid body, nothing to update, a config the gateway refuses, or a masked secret that matches none stored.", body = ErrorBody),
        (status = 404, description = "No such config.", body = ErrorBody),
    )
)]
pub async fn update(
    State(app): State<AppState>,
    PathParams(slug): PathParams<String>,
    mut ctx: Ctx,
) -> Result<Json<Value>> {
    mask_audited_body(&mut ctx);
    let body: UpdateConfig = ctx.json()?;
    // The validator sees the body once masks sent back are replaced by the stored secrets
    // (in the store, with the current version).
    if body.config.as_ref().is_some_and(|c| !c.is_object()) {
        return Err(AdminError::field("config", "must be a JSON object"));
    }
    let changes = ConfigChanges {
        name: body.name.map(|n| validate::name("name", &n)).transpose()?,
        config: body.config,
        is_default: body.is_default,
    };
    if changes.name.is_none() && changes.config.is_none() && changes.is_default.is_none() {
        return Err(AdminError::validation(
            "nothing to update: send name, config or isDefault",
        ));
    }
    let config = authorised(&app.store, &ctx.principal, &slug, Op::Update).await?;
    let version_id = app
        .store
        .update_config(ctx.actor(), &config, &changes)
        .await?;
    tracing::debug!(config = %config.slug, version = %version_id, "config updated");
    Ok(empty())
}

/// `DELETE /configs/{slug}`.
#[utoipa::path(
    delete,
    path = "/v1/configs/{slug}",
    operation_id = "deleteConfig",
    tag = tag::CONFIGS,
    summary = "Delete a config",
    params(
        ("slug" = String, Path, description = "The config's slug (`pc-...`) or id."),
    ),
    responses(
        (status = 200, description = "Deleted.", body = EmptyObject),
        (status = 404, description = "No such config.", body = ErrorBody),
    )
)]
pub async fn delete(
    State(app): State<AppState>,
    PathParams(slug): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let config = authorised(&app.store, &ctx.principal, &slug, Op::Delete).await?;
    app.store.delete_config(ctx.actor(), &config).await?;
    Ok(empty())
}

/// `GET /configs/{slug}/versions`: newest first.
#[utoipa::path(
    get,
    path = "/v1/configs/{slug}/versions",
    operation_id = "listConfigVersions",
    tag = tag::CONFIGS,
    summary = "List a config's versions",
    description = "Newest first.",
    params(
        ("slug" = String, Path, description = "The config's slug (`pc-...`) or id."),
        PageQuery,
    ),
    responses(
        (status = 200, description = "A page of versions.", body = ListEnvelope),
        (status = 400, description = "An invalid query.", body = ErrorBody),
        (status = 404, description = "No such config.", body = ErrorBody),
    )
)]
pub async fn versions(
    State(app): State<AppState>,
    PathParams(slug): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let q: PageQuery = ctx.query()?;
    let page = Page::new(q.page_size, q.current_page)?;
    let config = authorised(&app.store, &ctx.principal, &slug, Op::Read).await?;
    let (total, list) = app.store.config_versions(&config.id, page).await?;
    Ok(list_envelope(
        total,
        list.iter().map(|v| v.to_json(&config.version_id)).collect(),
    ))
}

/// The config of the path (slug or id) when the caller may do `op` to it.
async fn authorised(store: &Store, p: &Principal, slug: &str, op: Op) -> Result<Config> {
    let config = store
        .config(&p.organisation_id, slug)
        .await?
        .ok_or_else(|| AdminError::not_found(format!("no config {slug:?}")))?;
    authz::allowed(
        p,
        &Action::new(Resource::Configs, op),
        Some(&config.workspace_id),
    )?;
    Ok(config)
}

/// The audit log keeps the request's body: its config's secrets are masked there as they are
/// when the config is read (beside the usual redaction of secret-like names).
fn mask_audited_body(ctx: &mut Ctx) {
    let Ok(mut body) = serde_json::from_slice::<Value>(&ctx.body) else {
        return;
    };
    if let Some(config) = body.get_mut("config") {
        *config = config_secrets::masked(config);
    }
    ctx.meta.body = Some(redact(body));
}

/// A config body: a JSON object the data plane's validator accepts.
fn config_body(store: &Store, config: Value) -> Result<Value> {
    if !config.is_object() {
        return Err(AdminError::field("config", "must be a JSON object"));
    }
    store
        .check_config(&config)
        .map_err(|problem| AdminError::field("config", problem))?;
    Ok(config)
}

/// `pc-` + five letters or digits of the name + `-` + six random hex digits: `pc-fallb-3f9c2e`.
fn config_slug(name: &str) -> String {
    super::short_slug("pc", name)
}

/// The workspace a new resource goes to: the one named (id or slug; AB02 when none), else the
/// calling workspace key's, else (an admin key) the organisation's `default` workspace.
pub(super) async fn target_workspace(
    store: &Store,
    p: &Principal,
    given: Option<&str>,
) -> Result<String> {
    if let Some(ws) = given {
        return resolve_workspace(store, &p.organisation_id, ws).await;
    }
    if let Some(ws) = p.workspace_id() {
        return Ok(ws.to_owned());
    }
    match store.workspace(&p.organisation_id, "default").await? {
        Some(ws) => Ok(ws.id),
        None => Err(AdminError::field(
            "workspace_id",
            "is required: the organisation has no default workspace",
        )),
    }
}

/// The workspace a listing is limited to: the one named, else the calling workspace key's,
/// else none (an admin key lists across the organisation).
pub(super) async fn list_workspace(
    store: &Store,
    p: &Principal,
    given: Option<&str>,
) -> Result<Option<String>> {
    match given {
        Some(ws) => Ok(Some(
            resolve_workspace(store, &p.organisation_id, ws).await?,
        )),
        None => Ok(p.workspace_id().map(str::to_owned)),
    }
}

/// A workspace id or slug of the request, as an id: 404 (AB02) when there is none.
pub(super) async fn resolve_workspace(
    store: &Store,
    org: &str,
    id_or_slug: &str,
) -> Result<String> {
    Ok(store
        .workspace(org, id_or_slug)
        .await?
        .ok_or_else(|| AdminError::reference(format!("workspace_id: no workspace {id_or_slug:?}")))?
        .id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_look_like_the_reference() {
        let s = config_slug("Fallback config");
        assert!(s.starts_with("pc-fallb-"), "{s}");
        assert_eq!(s.len(), "pc-xxxxx-xxxxxx".len());
        let s = config_slug("a!");
        assert!(s.starts_with("pc-a"), "{s}");
        assert_eq!(s.len(), "pc-xxxxx-xxxxxx".len());
        assert!(s[3..8].chars().all(|c| c.is_ascii_alphanumeric()));
    }

    #[test]
    fn is_default_takes_booleans_and_0_or_1() {
        let body = |v: Value| validate::json::<CreateConfig>(v.to_string().as_bytes());
        for (v, want) in [(json!(true), true), (json!(0), false), (json!(1), true)] {
            let got = body(json!({"name": "n", "config": {}, "isDefault": v})).unwrap();
            assert_eq!(got.is_default, Some(want));
        }
        let err = body(json!({"name": "n", "config": {}, "isDefault": 2})).unwrap_err();
        assert!(err.message.starts_with("isDefault:"), "{}", err.message);
        let err = body(json!({"name": "n", "config": {}, "colour": 2})).unwrap_err();
        assert!(
            err.message.starts_with("colour: unknown field"),
            "{}",
            err.message
        );
    }
}
