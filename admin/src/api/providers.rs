//! `/v1/providers`: create, list, get, update, delete — an integration made usable in one
//! workspace, used in requests as `x-gw-provider: @slug`. And the legacy `/v1/virtual-keys`:
//! the same providers, created from `{name, provider, key, note}` (an integration is made for
//! each) and used as `x-gw-virtual-key: slug`.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use utoipa::{IntoParams, ToSchema};

use super::configs::{list_workspace, target_workspace};
use super::integrations::ai_provider_schema;
use super::integrations::{ai_provider, check_slug, query_with_tags, secret, slug_base, tags};
use super::openapi::{tag, CreatedWithSlug, EmptyObject, ErrorBody, ListEnvelope};
use super::{double_option, empty, list_envelope, AppState, Ctx, PathParams};
use crate::authz::{self, Action, Op, Principal, Resource};
use crate::error::{AdminError, Result};
use crate::keys;
use crate::store::{
    NewIntegration, NewProvider, Origin, Provider, ProviderChanges, ProviderFilter, Store,
};
use crate::time::{self, Timestamp};
use crate::validate::{self, Page, RateLimit, UsageLimitsInput};

/// A new provider: an integration made usable in a workspace, with its own limits.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateProvider {
    /// 1 to 255 characters.
    name: String,
    /// The integration (slug or id), enabled for the workspace.
    integration_id: String,
    /// A workspace id or slug; default: the calling workspace key's, else the organisation's
    /// `default` workspace.
    #[serde(default)]
    workspace_id: Option<String>,
    /// 1 to 255 of `a-z A-Z 0-9 _ -`, not a UUID; default: made from the name.
    #[serde(default)]
    #[schema(pattern = "^[a-zA-Z0-9_-]+$")]
    slug: Option<String>,
    #[serde(default)]
    note: Option<String>,
    #[serde(default)]
    usage_limits: Option<UsageLimitsInput>,
    #[serde(default)]
    rate_limits: Option<Vec<RateLimit>>,
    /// RFC 3339, in the future.
    #[serde(default)]
    #[schema(format = DateTime)]
    expires_at: Option<String>,
    /// At most 50; names 1 to 100 of `a-z A-Z 0-9 _ - . :`, values at most 255 characters.
    #[serde(default)]
    tags: Option<BTreeMap<String, String>>,
}

/// The fields to change; absent fields are kept, `null` clears the optional ones.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct UpdateProvider {
    #[serde(default)]
    name: Option<String>,
    #[serde(default, deserialize_with = "double_option")]
    note: Option<Option<String>>,
    #[serde(default, deserialize_with = "double_option")]
    usage_limits: Option<Option<UsageLimitsInput>>,
    #[serde(default)]
    rate_limits: Option<Vec<RateLimit>>,
    /// RFC 3339, in the future; `null`: never.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(format = DateTime)]
    expires_at: Option<Option<String>>,
    #[serde(default)]
    tags: Option<BTreeMap<String, String>>,
    /// `true` sets the provider's usage back to zero.
    #[serde(default)]
    reset_usage: Option<bool>,
}

#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum Status {
    Active,
    Exhausted,
    Expired,
}

/// The named parameters of the list; `tags[name]=value` filters are read beside them.
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
    /// A workspace id or slug; a workspace key lists its own workspace's.
    #[serde(default)]
    workspace_id: Option<String>,
    /// Only those of this integration (slug or id).
    #[serde(default)]
    integration_id: Option<String>,
    #[serde(default)]
    #[param(inline)]
    status: Option<Status>,
}

/// A new virtual key: an integration of the workspace holding the secret, and its provider.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateVirtualKey {
    /// 1 to 255 characters.
    name: String,
    #[schema(schema_with = ai_provider_schema)]
    provider: String,
    /// The provider's secret; stored encrypted, shown masked.
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    note: Option<String>,
    /// A workspace id or slug; default: the calling workspace key's, else the organisation's
    /// `default` workspace.
    #[serde(default)]
    workspace_id: Option<String>,
    /// 1 to 255 of `a-z A-Z 0-9 _ -`, not a UUID; default: made from the name.
    #[serde(default)]
    #[schema(pattern = "^[a-zA-Z0-9_-]+$")]
    slug: Option<String>,
    #[serde(default)]
    usage_limits: Option<UsageLimitsInput>,
    #[serde(default)]
    rate_limits: Option<Vec<RateLimit>>,
    /// RFC 3339, in the future.
    #[serde(default)]
    #[schema(format = DateTime)]
    expires_at: Option<String>,
}

/// The fields to change; absent fields are kept, `null` clears the optional ones.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct UpdateVirtualKey {
    #[serde(default)]
    name: Option<String>,
    /// A new secret (only for a virtual key made with `POST /v1/virtual-keys`).
    #[serde(default)]
    key: Option<String>,
    #[serde(default, deserialize_with = "double_option")]
    note: Option<Option<String>>,
    #[serde(default, deserialize_with = "double_option")]
    usage_limits: Option<Option<UsageLimitsInput>>,
    #[serde(default)]
    rate_limits: Option<Vec<RateLimit>>,
    /// RFC 3339, in the future; `null`: never.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(format = DateTime)]
    expires_at: Option<Option<String>>,
    /// `true` sets the usage back to zero.
    #[serde(default)]
    reset_usage: Option<bool>,
}

/// Providers (`/providers`) or their legacy name (`/virtual-keys`): the scopes and the shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Provider,
    VirtualKey,
}

impl Kind {
    fn resource(self) -> Resource {
        match self {
            Kind::Provider => Resource::Providers,
            Kind::VirtualKey => Resource::VirtualKeys,
        }
    }

    fn to_json(self, p: &Provider) -> Value {
        match self {
            Kind::Provider => p.to_json(),
            Kind::VirtualKey => p.to_virtual_key_json(),
        }
    }
}

/// `POST /providers` -> `{id, slug}`.
#[utoipa::path(
    post,
    path = "/v1/providers",
    operation_id = "createProvider",
    tag = tag::PROVIDERS,
    summary = "Create a provider",
    request_body = CreateProvider,
    responses(
        (status = 200, description = "The new provider (`object`: `provider`).", body = CreatedWithSlug),
        (status = 400, description = "An invalid body.", body = ErrorBody),
        (status = 404, description = "No such workspace, or no integration enabled for it (AB02).", body = ErrorBody),
        (status = 409, description = "The slug is taken.", body = ErrorBody),
    )
)]
pub async fn create(State(app): State<AppState>, ctx: Ctx) -> Result<Json<Value>> {
    let new = new_provider(&app.store, &ctx, ctx.json()?).await?;
    let id = app.store.create_provider(ctx.actor(), &new).await?;
    Ok(Json(
        json!({"id": id, "slug": new.slug, "object": "provider"}),
    ))
}

/// The most providers one `POST /v1/providers/bulk` creates.
pub const MAX_BULK_PROVIDERS: usize = 1000;

/// The body of `POST /v1/providers/bulk`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = CreateProviders)]
struct CreateProviders {
    /// 1 to 1000 providers, each as `POST /v1/providers` takes it.
    providers: Vec<CreateProvider>,
}

/// `POST /providers/bulk` -> `{object: "list", total, data: [{id, slug, object}]}`.
#[utoipa::path(
    post,
    path = "/v1/providers/bulk",
    operation_id = "createProviders",
    tag = tag::PROVIDERS,
    summary = "Create many providers",
    description = "Creates up to 1000 providers in one transaction: all of them, or none when \
        one item is refused (the error names it: `providers[2].integration_id: ...`). One audit \
        record (`bulk_create`) lists their ids in `resource_ids`. `bulk` is not a provider slug.",
    request_body = CreateProviders,
    responses(
        (status = 200, description = "The new providers, in the order asked.", body = ListEnvelope),
        (status = 400, description = "An invalid body or item, no providers or more than 1000.", body = ErrorBody),
        (status = 404, description = "No such workspace, or no integration enabled for it (AB02).", body = ErrorBody),
        (status = 409, description = "A slug is taken (or given twice).", body = ErrorBody),
    )
)]
pub async fn create_many(State(app): State<AppState>, ctx: Ctx) -> Result<Json<Value>> {
    let body: CreateProviders = ctx.json()?;
    validate::bulk_size("providers", body.providers.len(), MAX_BULK_PROVIDERS)?;
    let mut new = Vec::with_capacity(body.providers.len());
    for (i, item) in body.providers.into_iter().enumerate() {
        let provider = new_provider(&app.store, &ctx, item)
            .await
            .map_err(|e| e.within(&format!("providers[{i}]")))?;
        new.push(provider);
    }
    let ids = app.store.create_providers(ctx.actor(), &new).await?;
    let data: Vec<Value> = ids
        .iter()
        .zip(&new)
        .map(|(id, p)| json!({"id": id, "slug": p.slug, "object": "provider"}))
        .collect();
    Ok(Json(
        json!({"object": "list", "total": data.len(), "data": data}),
    ))
}

/// A provider to create from a `CreateProvider` body: validated, its integration found usable
/// in its workspace, and the caller's right to make it checked.
async fn new_provider(store: &Store, ctx: &Ctx, body: CreateProvider) -> Result<NewProvider> {
    let p = &ctx.principal;
    let name = validate::name("name", &body.name)?;
    let given_slug = body
        .slug
        .as_deref()
        .map(|s| check_slug("slug", s))
        .transpose()?;
    if given_slug.as_deref() == Some("bulk") {
        return Err(AdminError::field(
            "slug",
            "\"bulk\" is reserved (POST /v1/providers/bulk)",
        ));
    }
    let note = note(body.note)?;
    let usage_limits = body
        .usage_limits
        .map(|u| validate::usage_limits("usage_limits", u))
        .transpose()?;
    let rate_limits = validate::rate_limits("rate_limits", body.rate_limits.unwrap_or_default())?;
    let expires_at = body.expires_at.as_deref().map(expiry).transpose()?;
    let tags = tags("tags", body.tags.unwrap_or_default())?;
    let workspace_id = target_workspace(store, p, body.workspace_id.as_deref()).await?;
    authz::allowed(
        p,
        &Action::new(Resource::Providers, Op::Create),
        Some(&workspace_id),
    )?;
    let integration = store
        .integration(&p.organisation_id, &body.integration_id)
        .await?
        .filter(|i| i.status == "active");
    let integration = match integration {
        Some(i) if store.integration_usable_in(&i, &workspace_id).await? => i,
        Some(i) => {
            return Err(AdminError::reference(format!(
                "integration_id: the integration {} is not enabled for this workspace (PUT /integrations/{}/workspaces)",
                i.slug, i.slug
            )))
        }
        None => {
            return Err(AdminError::reference(format!(
                "integration_id: no integration {:?}",
                body.integration_id
            )))
        }
    };
    let slug = match given_slug {
        Some(s) => s,
        None => format!("{}-{}", slug_base(&name, "provider"), keys::random_hex(6)),
    };
    Ok(NewProvider {
        workspace_id,
        integration_id: integration.id,
        slug,
        name,
        note,
        usage_limits,
        rate_limits,
        expires_at,
        tags,
    })
}

/// `GET /providers`: filters `workspace_id`, `integration_id`, `status`, `tags[name]=value`.
#[utoipa::path(
    get,
    path = "/v1/providers",
    operation_id = "listProviders",
    tag = tag::PROVIDERS,
    summary = "List providers",
    params(
        ListQuery,
        ("tags" = Option<BTreeMap<String, String>>, Query, style = DeepObject, explode, description = "`tags[name]=value`: only those with each tag."),
    ),
    responses(
        (status = 200, description = "A page of providers.", body = ListEnvelope),
        (status = 400, description = "An invalid query.", body = ErrorBody),
        (status = 404, description = "No workspace `workspace_id`, or no integration `integration_id` (AB02).", body = ErrorBody),
    )
)]
pub async fn list(State(app): State<AppState>, ctx: Ctx) -> Result<Json<Value>> {
    list_as(&app.store, &ctx, Kind::Provider).await
}

/// `GET /providers/{slug}`.
#[utoipa::path(
    get,
    path = "/v1/providers/{slug}",
    operation_id = "getProvider",
    tag = tag::PROVIDERS,
    summary = "Get a provider",
    params(
        ("slug" = String, Path, description = "The provider's slug or id."),
    ),
    responses(
        (status = 200, description = "The provider.", body = Object),
        (status = 404, description = "No such provider.", body = ErrorBody),
    )
)]
pub async fn get(
    State(app): State<AppState>,
    PathParams(slug): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let provider = authorised(&app.store, &ctx.principal, &slug, Op::Read, Kind::Provider).await?;
    Ok(Json(provider.to_json()))
}

/// `PUT /providers/{slug}`.
#[utoipa::path(
    put,
    path = "/v1/providers/{slug}",
    operation_id = "updateProvider",
    tag = tag::PROVIDERS,
    summary = "Update a provider",
    params(
        ("slug" = String, Path, description = "The provider's slug or id."),
    ),
    request_body = UpdateProvider,
    responses(
        (status = 200, description = "Updated.", body = EmptyObject),
        (status = 400, description = "An invalid body.", body = ErrorBody),
        (status = 404, description = "No such provider.", body = ErrorBody),
    )
)]
pub async fn update(
    State(app): State<AppState>,
    PathParams(slug): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let body: UpdateProvider = ctx.json()?;
    let changes = ProviderChanges {
        name: body.name.map(|n| validate::name("name", &n)).transpose()?,
        note: body.note.map(note).transpose()?,
        usage_limits: usage_limits_change(body.usage_limits)?,
        rate_limits: body
            .rate_limits
            .map(|r| validate::rate_limits("rate_limits", r))
            .transpose()?,
        expires_at: expiry_change(body.expires_at)?,
        tags: body.tags.map(|t| tags("tags", t)).transpose()?,
        reset_usage: body.reset_usage.unwrap_or(false),
    };
    let provider = authorised(
        &app.store,
        &ctx.principal,
        &slug,
        Op::Update,
        Kind::Provider,
    )
    .await?;
    app.store
        .update_provider(ctx.actor(), &provider, &changes, None)
        .await?;
    Ok(empty())
}

/// `DELETE /providers/{slug}`.
#[utoipa::path(
    delete,
    path = "/v1/providers/{slug}",
    operation_id = "deleteProvider",
    tag = tag::PROVIDERS,
    summary = "Delete a provider",
    params(
        ("slug" = String, Path, description = "The provider's slug or id."),
    ),
    responses(
        (status = 200, description = "Deleted.", body = EmptyObject),
        (status = 404, description = "No such provider.", body = ErrorBody),
    )
)]
pub async fn delete(
    State(app): State<AppState>,
    PathParams(slug): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let provider = authorised(
        &app.store,
        &ctx.principal,
        &slug,
        Op::Delete,
        Kind::Provider,
    )
    .await?;
    app.store.delete_provider(ctx.actor(), &provider).await?;
    Ok(empty())
}

/// `POST /virtual-keys` -> `{id, slug}`: an integration of the workspace holding the key, and
/// its provider.
#[utoipa::path(
    post,
    path = "/v1/virtual-keys",
    operation_id = "createVirtualKey",
    tag = tag::VIRTUAL_KEYS,
    summary = "Create a virtual key",
    description = "An integration of the workspace holding the secret, and its provider.",
    request_body = CreateVirtualKey,
    responses(
        (status = 200, description = "The new virtual key (`object`: `virtual-key`).", body = CreatedWithSlug),
        (status = 400, description = "An invalid body.", body = ErrorBody),
        (status = 404, description = "No workspace `workspace_id` (AB02).", body = ErrorBody),
        (status = 409, description = "The slug is taken.", body = ErrorBody),
    )
)]
pub async fn create_virtual_key(State(app): State<AppState>, ctx: Ctx) -> Result<Json<Value>> {
    let body: CreateVirtualKey = ctx.json()?;
    let p = &ctx.principal;
    let org = &p.organisation_id;
    let name = validate::name("name", &body.name)?;
    let provider = ai_provider("provider", &body.provider)?;
    let key = body.key.as_deref().map(|k| secret("key", k)).transpose()?;
    let given_slug = body
        .slug
        .as_deref()
        .map(|s| check_slug("slug", s))
        .transpose()?;
    let note = note(body.note)?;
    let usage_limits = body
        .usage_limits
        .map(|u| validate::usage_limits("usage_limits", u))
        .transpose()?;
    let rate_limits = validate::rate_limits("rate_limits", body.rate_limits.unwrap_or_default())?;
    let expires_at = body.expires_at.as_deref().map(expiry).transpose()?;
    let workspace_id = target_workspace(&app.store, p, body.workspace_id.as_deref()).await?;
    authz::allowed(
        p,
        &Action::new(Resource::VirtualKeys, Op::Create),
        Some(&workspace_id),
    )?;
    let slug = match given_slug {
        Some(s) => s,
        None => format!("{}-{}", slug_base(&name, "vk"), keys::random_hex(6)),
    };
    let integration_slug = if app.store.integration(org, &slug).await?.is_none() {
        slug.clone()
    } else {
        format!("{slug}-{}", keys::random_hex(6))
    };
    let new = NewIntegration {
        workspace_id: Some(workspace_id.clone()),
        slug: integration_slug,
        name: name.clone(),
        ai_provider_id: provider,
        description: None,
        key,
        settings: Default::default(),
        secret_settings: BTreeMap::new(),
        tags: BTreeMap::new(),
        origin: Origin::VirtualKey,
        default_provider: Some(NewProvider {
            workspace_id,
            integration_id: String::new(),
            slug: slug.clone(),
            name,
            note,
            usage_limits,
            rate_limits,
            expires_at,
            tags: BTreeMap::new(),
        }),
    };
    let id = app.store.create_virtual_key(ctx.actor(), &new).await?;
    Ok(Json(
        json!({"id": id, "slug": slug, "object": "virtual-key"}),
    ))
}

/// `GET /virtual-keys`: the providers, in the legacy shape.
#[utoipa::path(
    get,
    path = "/v1/virtual-keys",
    operation_id = "listVirtualKeys",
    tag = tag::VIRTUAL_KEYS,
    summary = "List virtual keys",
    params(
        ListQuery,
        ("tags" = Option<BTreeMap<String, String>>, Query, style = DeepObject, explode, description = "`tags[name]=value`: only those with each tag."),
    ),
    description = "The providers, in the legacy shape.",
    responses(
        (status = 200, description = "A page of virtual keys.", body = ListEnvelope),
        (status = 400, description = "An invalid query.", body = ErrorBody),
        (status = 404, description = "No workspace `workspace_id`, or no integration `integration_id` (AB02).", body = ErrorBody),
    )
)]
pub async fn list_virtual_keys(State(app): State<AppState>, ctx: Ctx) -> Result<Json<Value>> {
    list_as(&app.store, &ctx, Kind::VirtualKey).await
}

/// `GET /virtual-keys/{slug}`.
#[utoipa::path(
    get,
    path = "/v1/virtual-keys/{slug}",
    operation_id = "getVirtualKey",
    tag = tag::VIRTUAL_KEYS,
    summary = "Get a virtual key",
    params(
        ("slug" = String, Path, description = "The virtual key's (provider's) slug or id."),
    ),
    responses(
        (status = 200, description = "The virtual key.", body = Object),
        (status = 404, description = "No such virtual key.", body = ErrorBody),
    )
)]
pub async fn get_virtual_key(
    State(app): State<AppState>,
    PathParams(slug): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let provider = authorised(
        &app.store,
        &ctx.principal,
        &slug,
        Op::Read,
        Kind::VirtualKey,
    )
    .await?;
    Ok(Json(provider.to_virtual_key_json()))
}

/// `PUT /virtual-keys/{slug}`: the provider's fields, and `key`, which replaces the secret of
/// its integration.
#[utoipa::path(
    put,
    path = "/v1/virtual-keys/{slug}",
    operation_id = "updateVirtualKey",
    tag = tag::VIRTUAL_KEYS,
    summary = "Update a virtual key",
    description = "The provider's fields, and `key`, which replaces the secret of its integration.",
    params(
        ("slug" = String, Path, description = "The virtual key's (provider's) slug or id."),
    ),
    request_body = UpdateVirtualKey,
    responses(
        (status = 200, description = "Updated.", body = EmptyObject),
        (status = 400, description = "An invalid body, or a `key` for a provider of a shared integration.", body = ErrorBody),
        (status = 404, description = "No such virtual key.", body = ErrorBody),
    )
)]
pub async fn update_virtual_key(
    State(app): State<AppState>,
    PathParams(slug): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let body: UpdateVirtualKey = ctx.json()?;
    let key = body.key.as_deref().map(|k| secret("key", k)).transpose()?;
    let changes = ProviderChanges {
        name: body.name.map(|n| validate::name("name", &n)).transpose()?,
        note: body.note.map(note).transpose()?,
        usage_limits: usage_limits_change(body.usage_limits)?,
        rate_limits: body
            .rate_limits
            .map(|r| validate::rate_limits("rate_limits", r))
            .transpose()?,
        expires_at: expiry_change(body.expires_at)?,
        tags: None,
        reset_usage: body.reset_usage.unwrap_or(false),
    };
    let provider = authorised(
        &app.store,
        &ctx.principal,
        &slug,
        Op::Update,
        Kind::VirtualKey,
    )
    .await?;
    if key.is_some() && provider.integration_origin != "virtual_key" {
        // The key belongs to an integration other providers may share: change it there.
        return Err(AdminError::field(
            "key",
            format!(
                "the provider {} uses the integration {}: change its key with PUT /integrations/{}",
                provider.slug, provider.integration_slug, provider.integration_slug
            ),
        ));
    }
    app.store
        .update_provider(ctx.actor(), &provider, &changes, key.as_deref())
        .await?;
    Ok(empty())
}

/// `DELETE /virtual-keys/{slug}`: the provider, and the integration made for it.
#[utoipa::path(
    delete,
    path = "/v1/virtual-keys/{slug}",
    operation_id = "deleteVirtualKey",
    tag = tag::VIRTUAL_KEYS,
    summary = "Delete a virtual key",
    description = "The provider, and the integration made for it.",
    params(
        ("slug" = String, Path, description = "The virtual key's (provider's) slug or id."),
    ),
    responses(
        (status = 200, description = "Deleted.", body = EmptyObject),
        (status = 404, description = "No such virtual key.", body = ErrorBody),
    )
)]
pub async fn delete_virtual_key(
    State(app): State<AppState>,
    PathParams(slug): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let provider = authorised(
        &app.store,
        &ctx.principal,
        &slug,
        Op::Delete,
        Kind::VirtualKey,
    )
    .await?;
    app.store.delete_provider(ctx.actor(), &provider).await?;
    Ok(empty())
}

async fn list_as(store: &Store, ctx: &Ctx, kind: Kind) -> Result<Json<Value>> {
    let (q, tag_filter): (ListQuery, _) = query_with_tags(&ctx.uri)?;
    let page = Page::new(q.page_size, q.current_page)?;
    let p = &ctx.principal;
    let workspace_id = list_workspace(store, p, q.workspace_id.as_deref()).await?;
    authz::allowed(
        p,
        &Action::new(kind.resource(), Op::List),
        workspace_id.as_deref(),
    )?;
    let integration_id = match &q.integration_id {
        Some(i) => Some(
            store
                .integration(&p.organisation_id, i)
                .await?
                .ok_or_else(|| {
                    AdminError::reference(format!("integration_id: no integration {i:?}"))
                })?
                .id,
        ),
        None => None,
    };
    let filter = ProviderFilter {
        workspace_id,
        integration_id,
        status: q.status.map(|s| {
            match s {
                Status::Active => "active",
                Status::Exhausted => "exhausted",
                Status::Expired => "expired",
            }
            .to_owned()
        }),
        tags: tag_filter,
    };
    let (total, list) = store.providers(&p.organisation_id, &filter, page).await?;
    Ok(list_envelope(
        total,
        list.iter().map(|p| kind.to_json(p)).collect(),
    ))
}

/// The provider of the path (slug or id) when the caller may do `op` to it.
async fn authorised(
    store: &Store,
    p: &Principal,
    slug: &str,
    op: Op,
    kind: Kind,
) -> Result<Provider> {
    let what = match kind {
        Kind::Provider => "provider",
        Kind::VirtualKey => "virtual key",
    };
    let provider = store
        .provider(&p.organisation_id, slug)
        .await?
        .ok_or_else(|| AdminError::not_found(format!("no {what} {slug:?}")))?;
    authz::allowed(
        p,
        &Action::new(kind.resource(), op),
        Some(&provider.workspace_id),
    )?;
    Ok(provider)
}

fn note(n: Option<String>) -> Result<Option<String>> {
    if let Some(n) = &n {
        validate::max_len("note", n, validate::MAX_DESCRIPTION)?;
    }
    Ok(n)
}

/// An `expires_at` in the future.
fn expiry(text: &str) -> Result<Timestamp> {
    let t = validate::timestamp("expires_at", text)?;
    if t <= time::now() {
        return Err(AdminError::field("expires_at", "must be in the future"));
    }
    Ok(t)
}

fn expiry_change(e: Option<Option<String>>) -> Result<Option<Option<Timestamp>>> {
    e.map(|e| e.as_deref().map(expiry).transpose()).transpose()
}

fn usage_limits_change(
    u: Option<Option<UsageLimitsInput>>,
) -> Result<Option<Option<crate::validate::UsageLimits>>> {
    u.map(|u| {
        u.map(|u| validate::usage_limits("usage_limits", u))
            .transpose()
    })
    .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_is_in_the_future() {
        assert!(expiry("2020-01-01T00:00:00Z").is_err());
        assert!(expiry("soon").is_err());
        let later = time::format(time::now() + chrono::Duration::days(1));
        assert!(expiry(&later).is_ok());
        assert_eq!(expiry_change(Some(None)).unwrap(), Some(None));
        assert_eq!(expiry_change(None).unwrap(), None);
    }
}
