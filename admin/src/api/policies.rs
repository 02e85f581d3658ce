//! `/v1/policies/rate-limits` and `/v1/policies/usage-limits`: create, get, list, update,
//! archive (`DELETE`), and the entities of a policy; per-entity usage reset for usage limits.
//!
//! A policy belongs to one workspace: the request's `workspace_id` (id or slug), or the calling
//! workspace key's own workspace (an admin key must name one). Its `conditions` say which
//! requests it applies to, its `group_by` which counters it keeps (one per distinct value).

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use utoipa::openapi::schema::{AnyOfBuilder, ArrayBuilder, ObjectBuilder, OneOfBuilder, Type};
use utoipa::{IntoParams, ToSchema};

use super::openapi::{one_of, tag, Created, EmptyObject, ErrorBody, ListEnvelope};
use super::{double_option, empty, list_envelope, AppState, Ctx, PathParams};
use crate::authz::{self, Action, Op, Principal, Resource};
use crate::error::{AdminError, Result};
use crate::store::{
    Condition, EntityFilter, GroupBy, NewRateLimitsPolicy, NewUsageLimitsPolicy, PolicyFilter,
    PolicyStatus, RateLimitsChanges, RateLimitsPolicy, Store, UsageEntity, UsageLimitsChanges,
    UsageLimitsPolicy,
};
use crate::time;
use crate::validate::{self, Page, PeriodicReset, RateLimitType, RateUnit, UsageType};

/// Most conditions, and most `group_by` items, of one policy.
const MAX_ITEMS: usize = 32;
/// Longest condition value (and `excludes` item).
const MAX_VALUE: usize = 255;
/// Longest metadata name in a `metadata.<name>` key.
const MAX_METADATA_NAME: usize = 128;
/// Largest rate limit value.
const MAX_RATE: f64 = 1.0e15;

/// The condition and `group_by` keys, besides `metadata.<name>`.
const KEYS: &[&str] = &[
    "api_key",
    "workspace_id",
    "provider",
    "virtual_key",
    "config",
    "model",
];

/// Which policies: active ones (the default) or archived ones.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum StatusQuery {
    Active,
    Archived,
}

impl StatusQuery {
    fn status(s: Option<StatusQuery>) -> PolicyStatus {
        match s {
            None | Some(StatusQuery::Active) => PolicyStatus::Active,
            Some(StatusQuery::Archived) => PolicyStatus::Archived,
        }
    }
}

/// Which requests a policy applies to: `key` has `value` (`*`: any), except the `excludes`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = PolicyCondition)]
struct ConditionInput {
    #[schema(schema_with = key_schema)]
    key: String,
    /// 1 to 255 characters; `*` for any value. For `api_key`, a key's id; for
    /// `workspace_id`, the policy's own workspace (id or slug).
    value: String,
    /// A string or a list of strings.
    #[serde(default)]
    #[schema(schema_with = excludes_schema)]
    excludes: Option<Value>,
}

/// What a policy keeps one counter per distinct value of.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = PolicyGroupBy)]
struct GroupByInput {
    #[schema(schema_with = key_schema)]
    key: String,
}

/// A condition or `group_by` key: one of [`KEYS`], or `metadata.<name>`.
fn key_schema() -> AnyOfBuilder {
    AnyOfBuilder::new()
        .item(one_of(KEYS))
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some(r"^metadata\.\S{1,128}$")),
        )
        .description(Some(
            "One of api_key, workspace_id, provider, virtual_key, config, model, or metadata.<name>.",
        ))
}

/// `excludes`: a string or a list of strings.
fn excludes_schema() -> OneOfBuilder {
    let text = || ObjectBuilder::new().schema_type(Type::String);
    OneOfBuilder::new()
        .item(text())
        .item(ArrayBuilder::new().items(text()))
        .item(ObjectBuilder::new().schema_type(Type::Null))
        .description(Some(
            "Values the condition does not apply to: a string or a list of strings.",
        ))
}

/// A new rate limits policy.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = CreateRateLimitsPolicy)]
struct CreateRateLimits {
    #[serde(default)]
    name: Option<String>,
    /// 1 to 32, each key once.
    conditions: Vec<ConditionInput>,
    /// 1 to 32, each key once.
    group_by: Vec<GroupByInput>,
    #[serde(rename = "type")]
    kind: RateLimitType,
    unit: RateUnit,
    /// A whole number from 0 (nothing gets through) to 10^15.
    #[schema(minimum = 0, maximum = 1.0e15, multiple_of = 1)]
    value: f64,
    /// The workspace (id or slug) the policy belongs to; default: the calling workspace key's
    /// (an admin key must name one).
    #[serde(default)]
    workspace_id: Option<String>,
}

/// The fields to change; absent fields are kept.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = UpdateRateLimitsPolicy)]
struct UpdateRateLimits {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    unit: Option<RateUnit>,
    /// A whole number from 0 to 10^15.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 1.0e15, multiple_of = 1)]
    value: Option<f64>,
    /// Refused: a policy is archived with `DELETE`, never through an update.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(read_only)]
    status: Option<Option<Value>>,
}

/// A new usage limits policy.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = CreateUsageLimitsPolicy)]
struct CreateUsageLimits {
    #[serde(default)]
    name: Option<String>,
    /// 1 to 32, each key once.
    conditions: Vec<ConditionInput>,
    /// 1 to 32, each key once.
    group_by: Vec<GroupByInput>,
    #[serde(rename = "type")]
    kind: UsageType,
    /// Dollars (`cost`) or tokens (`tokens`), at least 0.
    #[schema(minimum = 0)]
    credit_limit: f64,
    /// At least 0 and below `credit_limit`.
    #[serde(default)]
    #[schema(minimum = 0)]
    alert_threshold: Option<f64>,
    #[serde(default)]
    periodic_reset: Option<PeriodicReset>,
    /// 1 to 365; not with `periodic_reset`.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 365)]
    periodic_reset_days: Option<i64>,
    /// RFC 3339, in the future.
    #[serde(default)]
    #[schema(format = DateTime)]
    next_usage_reset_at: Option<String>,
    /// The workspace (id or slug) the policy belongs to; default: the calling workspace key's
    /// (an admin key must name one).
    #[serde(default)]
    workspace_id: Option<String>,
}

/// The fields to change; absent fields are kept, `null` clears the optional ones.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = UpdateUsageLimitsPolicy)]
struct UpdateUsageLimits {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    #[schema(minimum = 0)]
    credit_limit: Option<f64>,
    #[serde(default, deserialize_with = "double_option")]
    #[schema(minimum = 0)]
    alert_threshold: Option<Option<f64>>,
    #[serde(default, deserialize_with = "double_option")]
    periodic_reset: Option<Option<PeriodicReset>>,
    #[serde(default, deserialize_with = "double_option")]
    #[schema(minimum = 1, maximum = 365)]
    periodic_reset_days: Option<Option<i64>>,
    /// RFC 3339, in the future.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(format = DateTime)]
    next_usage_reset_at: Option<Option<String>>,
    /// Sets the usage of the entity with this value key back to zero.
    #[serde(default)]
    reset_usage_for_value: Option<String>,
    /// Refused: a policy is archived with `DELETE`, never through an update.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(read_only)]
    status: Option<Option<Value>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NoBody {}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct GetQuery {
    /// Default `active`.
    #[serde(default)]
    #[param(inline)]
    status: Option<StatusQuery>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct GetUsageQuery {
    /// Default `active`.
    #[serde(default)]
    #[param(inline)]
    status: Option<StatusQuery>,
    /// With `value_key_usage_map`: the usage of each entity.
    #[serde(default)]
    include_usage: Option<bool>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ListRateQuery {
    /// A workspace id or slug; a workspace key lists its own workspace's.
    #[serde(default)]
    workspace_id: Option<String>,
    /// Default `active`.
    #[serde(default)]
    #[param(inline)]
    status: Option<StatusQuery>,
    #[serde(default, rename = "type")]
    #[param(inline)]
    kind: Option<RateLimitType>,
    #[serde(default)]
    #[param(inline)]
    unit: Option<RateUnit>,
    /// Items per page: 0 to 100, default 50.
    #[serde(default)]
    #[param(minimum = 0, maximum = 100)]
    page_size: Option<i64>,
    /// The page, from 0.
    #[serde(default)]
    #[param(minimum = 0)]
    current_page: Option<i64>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ListUsageQuery {
    /// A workspace id or slug; a workspace key lists its own workspace's.
    #[serde(default)]
    workspace_id: Option<String>,
    /// Default `active`.
    #[serde(default)]
    #[param(inline)]
    status: Option<StatusQuery>,
    #[serde(default, rename = "type")]
    #[param(inline)]
    kind: Option<UsageType>,
    /// Items per page: 0 to 100, default 50.
    #[serde(default)]
    #[param(minimum = 0, maximum = 100)]
    page_size: Option<i64>,
    /// The page, from 0.
    #[serde(default)]
    #[param(minimum = 0)]
    current_page: Option<i64>,
}

#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum EntityStatus {
    Active,
    Exhausted,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct EntitiesQuery {
    #[serde(default)]
    #[param(inline)]
    status: Option<EntityStatus>,
    /// Part of the value key.
    #[serde(default)]
    search: Option<String>,
    /// Items per page: 0 to 100, default 50.
    #[serde(default)]
    #[param(minimum = 0, maximum = 100)]
    page_size: Option<i64>,
    /// The page, from 0.
    #[serde(default)]
    #[param(minimum = 0)]
    current_page: Option<i64>,
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

// ----- rate limits policies -----

/// `POST /policies/rate-limits`.
#[utoipa::path(
    post,
    path = "/v1/policies/rate-limits",
    operation_id = "createRateLimitsPolicy",
    tag = tag::RATE_LIMITS,
    summary = "Create a rate limits policy",
    request_body = CreateRateLimits,
    responses(
        (status = 200, description = "The new policy (`object`: `policy_rate_limits`).", body = Created),
        (status = 400, description = "An invalid body.", body = ErrorBody),
        (status = 404, description = "No workspace, or no API key, named in the body (AB02).", body = ErrorBody),
    )
)]
pub async fn create_rate_limits(State(app): State<AppState>, ctx: Ctx) -> Result<Json<Value>> {
    let body: CreateRateLimits = ctx.json()?;
    let name = optional_name(body.name)?;
    let conditions = conditions(body.conditions)?;
    let group_by = group_by(body.group_by)?;
    let value = rate_value("value", body.value)?;
    let workspace_id = policy_workspace(&app.store, &ctx, body.workspace_id.as_deref()).await?;
    authz::allowed(
        &ctx.principal,
        &Action::new(Resource::Policies, Op::Create),
        Some(&workspace_id),
    )?;
    let conditions =
        resolve_conditions(&app.store, &ctx.principal, &workspace_id, conditions).await?;
    let new = NewRateLimitsPolicy {
        workspace_id,
        name,
        conditions,
        group_by,
        kind: body.kind,
        unit: body.unit,
        value,
    };
    let id = app
        .store
        .create_rate_limits_policy(ctx.actor(), &new)
        .await?;
    Ok(Json(json!({"id": id, "object": "policy_rate_limits"})))
}

/// `GET /policies/rate-limits/{id}?status=active|archived` (default active).
#[utoipa::path(
    get,
    path = "/v1/policies/rate-limits/{id}",
    operation_id = "getRateLimitsPolicy",
    tag = tag::RATE_LIMITS,
    summary = "Get a rate limits policy",
    params(
        ("id" = String, Path, description = "The policy's id (a UUID)."),
        GetQuery,
    ),
    responses(
        (status = 200, description = "The policy.", body = Object),
        (status = 400, description = "A malformed id or an invalid query.", body = ErrorBody),
        (status = 404, description = "No such policy with this status.", body = ErrorBody),
    )
)]
pub async fn get_rate_limits(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let q: GetQuery = ctx.query()?;
    let status = StatusQuery::status(q.status);
    let policy = rate_policy(&app.store, &ctx.principal, &id, Op::Read, Some(status)).await?;
    Ok(Json(policy.to_json(true)))
}

/// `GET /policies/rate-limits`.
#[utoipa::path(
    get,
    path = "/v1/policies/rate-limits",
    operation_id = "listRateLimitsPolicies",
    tag = tag::RATE_LIMITS,
    summary = "List rate limits policies",
    params(ListRateQuery),
    responses(
        (status = 200, description = "A page of policies.", body = ListEnvelope),
        (status = 400, description = "An invalid query.", body = ErrorBody),
        (status = 404, description = "No workspace `workspace_id` (AB02).", body = ErrorBody),
    )
)]
pub async fn list_rate_limits(State(app): State<AppState>, ctx: Ctx) -> Result<Json<Value>> {
    let q: ListRateQuery = ctx.query()?;
    let page = Page::new(q.page_size, q.current_page)?;
    let workspace_id =
        list_workspace(&app.store, &ctx.principal, q.workspace_id.as_deref()).await?;
    let filter = PolicyFilter {
        workspace_id,
        status: StatusQuery::status(q.status),
        kind: q.kind.map(|k| text_of(&k)),
        unit: q.unit.map(|u| text_of(&u)),
    };
    let (total, list) = app
        .store
        .rate_limits_policies(&ctx.principal.organisation_id, &filter, page)
        .await?;
    Ok(list_envelope(
        total,
        list.iter().map(|p| p.to_json(false)).collect(),
    ))
}

/// `PUT /policies/rate-limits/{id}`: `name`, `unit`, `value`; a `status` is refused.
#[utoipa::path(
    put,
    path = "/v1/policies/rate-limits/{id}",
    operation_id = "updateRateLimitsPolicy",
    tag = tag::RATE_LIMITS,
    summary = "Update a rate limits policy",
    params(
        ("id" = String, Path, description = "The policy's id (a UUID)."),
    ),
    request_body = UpdateRateLimits,
    responses(
        (status = 200, description = "Updated.", body = EmptyObject),
        (status = 400, description = "A malformed id or an invalid body.", body = ErrorBody),
        (status = 404, description = "No such active policy.", body = ErrorBody),
    )
)]
pub async fn update_rate_limits(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let body: UpdateRateLimits = ctx.json()?;
    refuse_status(&body.status)?;
    let changes = RateLimitsChanges {
        name: body.name.map(|n| validate::name("name", &n)).transpose()?,
        unit: body.unit,
        value: body.value.map(|v| rate_value("value", v)).transpose()?,
    };
    let policy = rate_policy(
        &app.store,
        &ctx.principal,
        &id,
        Op::Update,
        Some(PolicyStatus::Active),
    )
    .await?;
    app.store
        .update_rate_limits_policy(ctx.actor(), &policy, &changes)
        .await?;
    Ok(empty())
}

/// `DELETE /policies/rate-limits/{id}`: archives the policy.
#[utoipa::path(
    delete,
    path = "/v1/policies/rate-limits/{id}",
    operation_id = "deleteRateLimitsPolicy",
    tag = tag::RATE_LIMITS,
    summary = "Archive a rate limits policy",
    params(
        ("id" = String, Path, description = "The policy's id (a UUID)."),
    ),
    responses(
        (status = 200, description = "Archived.", body = EmptyObject),
        (status = 400, description = "A malformed id, or a body with fields.", body = ErrorBody),
        (status = 404, description = "No such active policy.", body = ErrorBody),
    )
)]
pub async fn delete_rate_limits(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let _: NoBody = ctx.json()?;
    let policy = rate_policy(
        &app.store,
        &ctx.principal,
        &id,
        Op::Delete,
        Some(PolicyStatus::Active),
    )
    .await?;
    app.store
        .archive_rate_limits_policy(ctx.actor(), &policy)
        .await?;
    Ok(empty())
}

/// `GET /policies/rate-limits/{id}/entities`: the entities the policy's conditions name (API
/// keys and workspaces resolved to their names), of an active or archived policy. A rate limit
/// keeps no stored counters, so these are what the policy is tied to, not what it has counted.
#[utoipa::path(
    get,
    path = "/v1/policies/rate-limits/{id}/entities",
    operation_id = "listRateLimitsPolicyEntities",
    tag = tag::RATE_LIMITS,
    summary = "List the entities of a rate limits policy",
    description = "The entities the policy's conditions name (API keys and workspaces with their names), of an active or archived policy.",
    params(
        ("id" = String, Path, description = "The policy's id (a UUID)."),
        PageQuery,
    ),
    responses(
        (status = 200, description = "A page of entities.", body = ListEnvelope),
        (status = 400, description = "A malformed id or an invalid query.", body = ErrorBody),
        (status = 404, description = "No such policy.", body = ErrorBody),
    )
)]
pub async fn rate_limits_entities(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let q: PageQuery = ctx.query()?;
    let page = Page::new(q.page_size, q.current_page)?;
    let p = &ctx.principal;
    let policy = rate_policy(&app.store, p, &id, Op::Read, None).await?;
    let mut entities = Vec::new();
    for c in &policy.conditions {
        entities.push(condition_entity(&app.store, p, c).await?);
    }
    let total = entities.len() as i64;
    let data = entities
        .into_iter()
        .skip(usize::try_from(page.offset()).unwrap_or(usize::MAX))
        .take(usize::try_from(page.size).unwrap_or(0))
        .collect();
    Ok(list_envelope(total, data))
}

// ----- usage limits policies -----

/// `POST /policies/usage-limits`.
#[utoipa::path(
    post,
    path = "/v1/policies/usage-limits",
    operation_id = "createUsageLimitsPolicy",
    tag = tag::USAGE_LIMITS,
    summary = "Create a usage limits policy",
    request_body = CreateUsageLimits,
    responses(
        (status = 200, description = "The new policy (`object`: `policy_usage_limits`).", body = Created),
        (status = 400, description = "An invalid body.", body = ErrorBody),
        (status = 404, description = "No workspace, or no API key, named in the body (AB02).", body = ErrorBody),
    )
)]
pub async fn create_usage_limits(State(app): State<AppState>, ctx: Ctx) -> Result<Json<Value>> {
    let body: CreateUsageLimits = ctx.json()?;
    let name = optional_name(body.name)?;
    let conditions = conditions(body.conditions)?;
    let group_by = group_by(body.group_by)?;
    let credit_limit = amount("credit_limit", body.credit_limit)?;
    let alert_threshold = body
        .alert_threshold
        .map(|t| amount("alert_threshold", t))
        .transpose()?;
    let periodic_reset_days = body.periodic_reset_days.map(reset_days).transpose()?;
    let next_usage_reset_at = body
        .next_usage_reset_at
        .as_deref()
        .map(next_reset)
        .transpose()?;
    let workspace_id = policy_workspace(&app.store, &ctx, body.workspace_id.as_deref()).await?;
    let draft = UsageLimitsPolicy {
        id: String::new(),
        organisation_id: ctx.principal.organisation_id.clone(),
        workspace_id,
        name,
        conditions: Vec::new(),
        group_by,
        kind: body.kind,
        credit_limit,
        alert_threshold,
        periodic_reset: body.periodic_reset,
        periodic_reset_days,
        next_usage_reset_at,
        status: "active".into(),
        created_at: String::new(),
        last_updated_at: String::new(),
    };
    draft.check()?;
    authz::allowed(
        &ctx.principal,
        &Action::new(Resource::Policies, Op::Create),
        Some(&draft.workspace_id),
    )?;
    let conditions =
        resolve_conditions(&app.store, &ctx.principal, &draft.workspace_id, conditions).await?;
    let new = NewUsageLimitsPolicy {
        workspace_id: draft.workspace_id,
        name: draft.name,
        conditions,
        group_by: draft.group_by,
        kind: draft.kind,
        credit_limit: draft.credit_limit,
        alert_threshold: draft.alert_threshold,
        periodic_reset: draft.periodic_reset,
        periodic_reset_days: draft.periodic_reset_days,
        next_usage_reset_at: draft.next_usage_reset_at,
    };
    let id = app
        .store
        .create_usage_limits_policy(ctx.actor(), &new)
        .await?;
    Ok(Json(json!({"id": id, "object": "policy_usage_limits"})))
}

/// `GET /policies/usage-limits/{id}?status=...&include_usage=true`.
#[utoipa::path(
    get,
    path = "/v1/policies/usage-limits/{id}",
    operation_id = "getUsageLimitsPolicy",
    tag = tag::USAGE_LIMITS,
    summary = "Get a usage limits policy",
    params(
        ("id" = String, Path, description = "The policy's id (a UUID)."),
        GetUsageQuery,
    ),
    responses(
        (status = 200, description = "The policy.", body = Object),
        (status = 400, description = "A malformed id or an invalid query.", body = ErrorBody),
        (status = 404, description = "No such policy with this status.", body = ErrorBody),
    )
)]
pub async fn get_usage_limits(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let q: GetUsageQuery = ctx.query()?;
    let status = StatusQuery::status(q.status);
    let policy = usage_policy(&app.store, &ctx.principal, &id, Op::Read, Some(status)).await?;
    let mut out = policy.to_json(true);
    if q.include_usage.unwrap_or(false) {
        out["value_key_usage_map"] =
            Value::Object(app.store.usage_limits_entity_map(&policy).await?);
    }
    Ok(Json(out))
}

/// `GET /policies/usage-limits`.
#[utoipa::path(
    get,
    path = "/v1/policies/usage-limits",
    operation_id = "listUsageLimitsPolicies",
    tag = tag::USAGE_LIMITS,
    summary = "List usage limits policies",
    params(ListUsageQuery),
    responses(
        (status = 200, description = "A page of policies.", body = ListEnvelope),
        (status = 400, description = "An invalid query.", body = ErrorBody),
        (status = 404, description = "No workspace `workspace_id` (AB02).", body = ErrorBody),
    )
)]
pub async fn list_usage_limits(State(app): State<AppState>, ctx: Ctx) -> Result<Json<Value>> {
    let q: ListUsageQuery = ctx.query()?;
    let page = Page::new(q.page_size, q.current_page)?;
    let workspace_id =
        list_workspace(&app.store, &ctx.principal, q.workspace_id.as_deref()).await?;
    let filter = PolicyFilter {
        workspace_id,
        status: StatusQuery::status(q.status),
        kind: q.kind.map(|k| text_of(&k)),
        unit: None,
    };
    let (total, list) = app
        .store
        .usage_limits_policies(&ctx.principal.organisation_id, &filter, page)
        .await?;
    Ok(list_envelope(
        total,
        list.iter().map(|p| p.to_json(false)).collect(),
    ))
}

/// `PUT /policies/usage-limits/{id}`.
#[utoipa::path(
    put,
    path = "/v1/policies/usage-limits/{id}",
    operation_id = "updateUsageLimitsPolicy",
    tag = tag::USAGE_LIMITS,
    summary = "Update a usage limits policy",
    params(
        ("id" = String, Path, description = "The policy's id (a UUID)."),
    ),
    request_body = UpdateUsageLimits,
    responses(
        (status = 200, description = "Updated.", body = EmptyObject),
        (status = 400, description = "A malformed id or an invalid body.", body = ErrorBody),
        (status = 404, description = "No such active policy.", body = ErrorBody),
    )
)]
pub async fn update_usage_limits(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let body: UpdateUsageLimits = ctx.json()?;
    refuse_status(&body.status)?;
    let changes = UsageLimitsChanges {
        name: body.name.map(|n| validate::name("name", &n)).transpose()?,
        credit_limit: body
            .credit_limit
            .map(|c| amount("credit_limit", c))
            .transpose()?,
        alert_threshold: body
            .alert_threshold
            .map(|t| t.map(|t| amount("alert_threshold", t)).transpose())
            .transpose()?,
        periodic_reset: body.periodic_reset,
        periodic_reset_days: body
            .periodic_reset_days
            .map(|d| d.map(reset_days).transpose())
            .transpose()?,
        next_usage_reset_at: body
            .next_usage_reset_at
            .map(|t| t.as_deref().map(next_reset).transpose())
            .transpose()?,
        reset_usage_for_value: body
            .reset_usage_for_value
            .map(|v| {
                if v.is_empty() {
                    Err(AdminError::field(
                        "reset_usage_for_value",
                        "must not be empty",
                    ))
                } else {
                    validate::max_len("reset_usage_for_value", &v, 2048).map(|()| v)
                }
            })
            .transpose()?,
    };
    changes.check()?;
    let policy = usage_policy(
        &app.store,
        &ctx.principal,
        &id,
        Op::Update,
        Some(PolicyStatus::Active),
    )
    .await?;
    app.store
        .update_usage_limits_policy(ctx.actor(), &policy, &changes)
        .await?;
    Ok(empty())
}

/// `DELETE /policies/usage-limits/{id}`: archives the policy.
#[utoipa::path(
    delete,
    path = "/v1/policies/usage-limits/{id}",
    operation_id = "deleteUsageLimitsPolicy",
    tag = tag::USAGE_LIMITS,
    summary = "Archive a usage limits policy",
    params(
        ("id" = String, Path, description = "The policy's id (a UUID)."),
    ),
    responses(
        (status = 200, description = "Archived.", body = EmptyObject),
        (status = 400, description = "A malformed id, or a body with fields.", body = ErrorBody),
        (status = 404, description = "No such active policy.", body = ErrorBody),
    )
)]
pub async fn delete_usage_limits(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let _: NoBody = ctx.json()?;
    let policy = usage_policy(
        &app.store,
        &ctx.principal,
        &id,
        Op::Delete,
        Some(PolicyStatus::Active),
    )
    .await?;
    app.store
        .archive_usage_limits_policy(ctx.actor(), &policy)
        .await?;
    Ok(empty())
}

/// `GET /policies/usage-limits/{id}/entities`: what the policy has counted, per value key;
/// filters `status` (active|exhausted), `search` (part of the value key), paging.
#[utoipa::path(
    get,
    path = "/v1/policies/usage-limits/{id}/entities",
    operation_id = "listUsageLimitsPolicyEntities",
    tag = tag::USAGE_LIMITS,
    summary = "List the entities of a usage limits policy",
    description = "What the policy has counted, per value key.",
    params(
        ("id" = String, Path, description = "The policy's id (a UUID)."),
        EntitiesQuery,
    ),
    responses(
        (status = 200, description = "A page of entities with their usage.", body = ListEnvelope),
        (status = 400, description = "A malformed id or an invalid query.", body = ErrorBody),
        (status = 404, description = "No such policy.", body = ErrorBody),
    )
)]
pub async fn usage_limits_entities(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let q: EntitiesQuery = ctx.query()?;
    let page = Page::new(q.page_size, q.current_page)?;
    if let Some(s) = &q.search {
        validate::max_len("search", s, MAX_VALUE)?;
    }
    let policy = usage_policy(&app.store, &ctx.principal, &id, Op::Read, None).await?;
    let filter = EntityFilter {
        status: q.status.map(|s| match s {
            EntityStatus::Active => "active".to_owned(),
            EntityStatus::Exhausted => "exhausted".to_owned(),
        }),
        search: q.search,
    };
    let (total, list) = app
        .store
        .usage_limits_entities(&policy, &filter, page)
        .await?;
    Ok(list_envelope(
        total,
        list.iter().map(UsageEntity::to_json).collect(),
    ))
}

/// `PUT /policies/usage-limits/{id}/entities/{entityId}/reset`: the entity's usage back to zero
/// (active again). `entityId` is the entity's id or its value key.
#[utoipa::path(
    put,
    path = "/v1/policies/usage-limits/{id}/entities/{entity}/reset",
    operation_id = "resetUsageLimitsPolicyEntity",
    tag = tag::USAGE_LIMITS,
    summary = "Reset an entity's usage",
    description = "The entity's usage back to zero (active again).",
    params(
        ("id" = String, Path, description = "The policy's id (a UUID)."),
        ("entity" = String, Path, description = "The entity's id or its value key."),
    ),
    responses(
        (status = 200, description = "Reset.", body = EmptyObject),
        (status = 400, description = "A malformed id, or a body with fields.", body = ErrorBody),
        (status = 404, description = "No such active policy, or no such entity.", body = ErrorBody),
    )
)]
pub async fn reset_usage_limits_entity(
    State(app): State<AppState>,
    PathParams((id, entity)): PathParams<(String, String)>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let _: NoBody = ctx.json()?;
    validate::max_len("entityId", &entity, 2048)?;
    let policy = usage_policy(
        &app.store,
        &ctx.principal,
        &id,
        Op::Update,
        Some(PolicyStatus::Active),
    )
    .await?;
    app.store
        .reset_usage_limits_entity(ctx.actor(), &policy, &entity)
        .await?;
    Ok(empty())
}

// ----- shared -----

/// The rate limits policy of the path, when the caller may do `op` to it: 400 for a malformed
/// id, 404 when there is none (or none with `status`), 403 without the right.
async fn rate_policy(
    store: &Store,
    p: &Principal,
    id: &str,
    op: Op,
    status: Option<PolicyStatus>,
) -> Result<RateLimitsPolicy> {
    let id = validate::uuid("id", id)?;
    let policy = store
        .rate_limits_policy(&p.organisation_id, &id)
        .await?
        .filter(|pol| status.is_none_or(|s| pol.status == s.as_str()))
        .ok_or_else(|| not_found("rate limits", &id, status))?;
    authz::allowed(
        p,
        &Action::new(Resource::Policies, op),
        Some(&policy.workspace_id),
    )?;
    Ok(policy)
}

async fn usage_policy(
    store: &Store,
    p: &Principal,
    id: &str,
    op: Op,
    status: Option<PolicyStatus>,
) -> Result<UsageLimitsPolicy> {
    let id = validate::uuid("id", id)?;
    let policy = store
        .usage_limits_policy(&p.organisation_id, &id)
        .await?
        .filter(|pol| status.is_none_or(|s| pol.status == s.as_str()))
        .ok_or_else(|| not_found("usage limits", &id, status))?;
    authz::allowed(
        p,
        &Action::new(Resource::Policies, op),
        Some(&policy.workspace_id),
    )?;
    Ok(policy)
}

fn not_found(kind: &str, id: &str, status: Option<PolicyStatus>) -> AdminError {
    match status {
        Some(s) => AdminError::not_found(format!(
            "policy not found: no {} {kind} policy {id}",
            s.as_str()
        )),
        None => AdminError::not_found(format!("policy not found: no {kind} policy {id}")),
    }
}

/// The workspace a new policy belongs to: the one named (id or slug; 404 AB02 when there is
/// none), or the calling workspace key's own. An admin key must name one.
async fn policy_workspace(store: &Store, ctx: &Ctx, given: Option<&str>) -> Result<String> {
    let p = &ctx.principal;
    match given {
        Some(ws) => resolve_workspace(store, &p.organisation_id, "workspace_id", ws).await,
        None => p.workspace_id().map(str::to_owned).ok_or_else(|| {
            AdminError::field(
                "workspace_id",
                "is required with an admin key: name the workspace (id or slug) the policy belongs to",
            )
        }),
    }
}

/// The workspace a listing is confined to, when the caller may list there: the one named, a
/// workspace key's own, or the whole organisation for an admin key.
async fn list_workspace(
    store: &Store,
    p: &Principal,
    given: Option<&str>,
) -> Result<Option<String>> {
    let workspace_id = match given {
        Some(ws) => Some(resolve_workspace(store, &p.organisation_id, "workspace_id", ws).await?),
        None => p.workspace_id().map(str::to_owned),
    };
    authz::allowed(
        p,
        &Action::new(Resource::Policies, Op::List),
        workspace_id.as_deref(),
    )?;
    Ok(workspace_id)
}

async fn resolve_workspace(
    store: &Store,
    org: &str,
    field: &str,
    id_or_slug: &str,
) -> Result<String> {
    Ok(store
        .workspace(org, id_or_slug)
        .await?
        .ok_or_else(|| AdminError::reference(format!("{field}: no workspace {id_or_slug:?}")))?
        .id)
}

fn refuse_status(status: &Option<Option<Value>>) -> Result<()> {
    if status.is_some() {
        return Err(AdminError::field(
            "status",
            "cannot be updated: DELETE archives a policy",
        ));
    }
    Ok(())
}

fn optional_name(name: Option<String>) -> Result<Option<String>> {
    name.map(|n| validate::name("name", &n)).transpose()
}

fn text_of<T: serde::Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(Value::String(s)) => s,
        _ => unreachable!("unit enums serialise as strings"),
    }
}

/// A rate limit: a whole number >= 0 (0 lets nothing through).
fn rate_value(field: &str, v: f64) -> Result<i64> {
    if !v.is_finite() || v < 0.0 || v.fract() != 0.0 || v > MAX_RATE {
        return Err(AdminError::field(
            field,
            format!("must be a whole number between 0 and {MAX_RATE:e}, got {v}"),
        ));
    }
    Ok(v as i64)
}

/// A credit limit or threshold: a number >= 0 (dollars for `cost`, tokens for `tokens`).
fn amount(field: &str, v: f64) -> Result<f64> {
    if !v.is_finite() || v < 0.0 {
        return Err(AdminError::field(
            field,
            format!("must be a number >= 0, got {v}"),
        ));
    }
    Ok(v)
}

fn reset_days(d: i64) -> Result<i64> {
    if !(1..=365).contains(&d) {
        return Err(AdminError::field(
            "periodic_reset_days",
            format!("must be between 1 and 365, got {d}"),
        ));
    }
    Ok(d)
}

/// `next_usage_reset_at`: an ISO 8601 (RFC 3339) time in the future, stored in UTC.
fn next_reset(t: &str) -> Result<String> {
    let at = validate::timestamp("next_usage_reset_at", t)?;
    if at <= time::now() {
        return Err(AdminError::field(
            "next_usage_reset_at",
            "must be in the future",
        ));
    }
    Ok(time::format(at))
}

/// A condition or `group_by` key: one of [`KEYS`] or `metadata.<name>`.
fn check_key(field: &str, key: &str) -> Result<()> {
    if KEYS.contains(&key) {
        return Ok(());
    }
    if let Some(name) = key.strip_prefix("metadata.") {
        let ok = !name.is_empty()
            && name.chars().count() <= MAX_METADATA_NAME
            && !name.chars().any(|c| c.is_whitespace() || c.is_control());
        if ok {
            return Ok(());
        }
        return Err(AdminError::field(
            field,
            format!(
                "a metadata key is metadata.<name> with a name of 1 to {MAX_METADATA_NAME} characters and no spaces, got {key:?}"
            ),
        ));
    }
    Err(AdminError::field(
        field,
        format!(
            "unknown key {key:?}; use one of {}, or metadata.<name>",
            KEYS.join(", ")
        ),
    ))
}

fn check_value(field: &str, v: &str) -> Result<()> {
    if v.is_empty() {
        return Err(AdminError::field(field, "must not be empty"));
    }
    validate::max_len(field, v, MAX_VALUE)
}

/// Checks the conditions one by one: a known key, each key once, a non-empty value, `excludes`
/// a string or a list of strings; `api_key` values are a key id or `*`.
fn conditions(list: Vec<ConditionInput>) -> Result<Vec<Condition>> {
    check_count("conditions", list.len())?;
    let mut out: Vec<Condition> = Vec::with_capacity(list.len());
    for (i, c) in list.into_iter().enumerate() {
        let at = |name: &str| format!("conditions[{i}].{name}");
        check_key(&at("key"), &c.key)?;
        if out.iter().any(|o| o.key == c.key) {
            return Err(AdminError::field(
                &at("key"),
                format!("{:?} repeats an earlier condition's key", c.key),
            ));
        }
        check_value(&at("value"), &c.value)?;
        let mut value = c.value;
        if c.key == "api_key" && value != "*" {
            value = validate::uuid(&at("value"), &value).map_err(|_| {
                AdminError::field(
                    &at("value"),
                    format!("must be an API key's id or *, got {value:?}"),
                )
            })?;
        }
        let excludes = match c.excludes {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(vec![s]),
            Some(Value::Array(items)) => Some(
                items
                    .into_iter()
                    .map(|v| match v {
                        Value::String(s) => Ok(s),
                        _ => Err(AdminError::field(&at("excludes"), "must hold only strings")),
                    })
                    .collect::<Result<Vec<_>>>()?,
            ),
            Some(_) => {
                return Err(AdminError::field(
                    &at("excludes"),
                    "must be a string or a list of strings",
                ))
            }
        };
        if let Some(ex) = &excludes {
            if ex.len() > MAX_ITEMS * 4 {
                return Err(AdminError::field(
                    &at("excludes"),
                    format!("must hold at most {} values", MAX_ITEMS * 4),
                ));
            }
            for (j, e) in ex.iter().enumerate() {
                check_value(&format!("conditions[{i}].excludes[{j}]"), e)?;
            }
        }
        out.push(Condition {
            key: c.key,
            value,
            excludes,
        });
    }
    Ok(out)
}

fn group_by(list: Vec<GroupByInput>) -> Result<Vec<GroupBy>> {
    check_count("group_by", list.len())?;
    let mut out: Vec<GroupBy> = Vec::with_capacity(list.len());
    for (i, g) in list.into_iter().enumerate() {
        let field = format!("group_by[{i}].key");
        check_key(&field, &g.key)?;
        if out.iter().any(|o| o.key == g.key) {
            return Err(AdminError::field(
                &field,
                format!("{:?} repeats an earlier group_by key", g.key),
            ));
        }
        out.push(GroupBy { key: g.key });
    }
    Ok(out)
}

fn check_count(field: &str, n: usize) -> Result<()> {
    if n == 0 {
        return Err(AdminError::field(field, "must hold at least one item"));
    }
    if n > MAX_ITEMS {
        return Err(AdminError::field(
            field,
            format!("must hold at most {MAX_ITEMS} items, got {n}"),
        ));
    }
    Ok(())
}

/// Checks what the conditions name against the database: an `api_key` condition names a key
/// of the organisation that can reach the policy's workspace (404 AB02 when there is none); a
/// `workspace_id` condition names the policy's own workspace (by id or slug, stored as its id).
async fn resolve_conditions(
    store: &Store,
    p: &Principal,
    workspace_id: &str,
    mut list: Vec<Condition>,
) -> Result<Vec<Condition>> {
    for (i, c) in list.iter_mut().enumerate() {
        let field = format!("conditions[{i}].value");
        if c.value == "*" {
            continue;
        }
        match c.key.as_str() {
            "api_key" => {
                let key = store
                    .api_key(&p.organisation_id, &c.value)
                    .await?
                    .ok_or_else(|| {
                        AdminError::reference(format!("{field}: no API key {}", c.value))
                    })?;
                if key
                    .workspace_id
                    .as_deref()
                    .is_some_and(|ws| ws != workspace_id)
                {
                    return Err(AdminError::field(
                        &field,
                        "the API key belongs to another workspace, where this policy never applies",
                    ));
                }
            }
            "workspace_id" => {
                let ws = resolve_workspace(store, &p.organisation_id, &field, &c.value).await?;
                if ws != workspace_id {
                    return Err(AdminError::field(
                        &field,
                        "a policy applies only in its own workspace; name that one or *",
                    ));
                }
                c.value = ws;
            }
            _ => {}
        }
    }
    Ok(list)
}

/// One entity a condition names: its value key, and for API keys and workspaces the id and
/// name of what it names (`null` for a wildcard, or for something deleted since).
async fn condition_entity(store: &Store, p: &Principal, c: &Condition) -> Result<Value> {
    let (kind, resolved) = match c.key.as_str() {
        "api_key" => {
            let found = if c.value == "*" {
                None
            } else {
                store
                    .api_key(&p.organisation_id, &c.value)
                    .await?
                    .map(|k| (k.id, k.name))
            };
            ("api_key", found)
        }
        "workspace_id" => {
            let found = if c.value == "*" {
                None
            } else {
                store
                    .workspace(&p.organisation_id, &c.value)
                    .await?
                    .map(|w| (w.id, w.name))
            };
            ("workspace", found)
        }
        k if k.starts_with("metadata.") => ("metadata", None),
        k => (k, None),
    };
    let (id, name) = match resolved {
        Some((id, name)) => (Some(id), Some(name)),
        None => (None, None),
    };
    let mut v = json!({
        "value_key": crate::store::value_key([(c.key.as_str(), c.value.as_str())]),
        "key": c.key,
        "value": c.value,
        "type": kind,
        "id": id,
        "name": name,
    });
    if let Some(ex) = &c.excludes {
        v["excludes"] = json!(ex);
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(key: &str, value: &str) -> ConditionInput {
        ConditionInput {
            key: key.into(),
            value: value.into(),
            excludes: None,
        }
    }

    #[test]
    fn keys_are_checked() {
        for ok in KEYS
            .iter()
            .copied()
            .chain(["metadata._user", "metadata.team"])
        {
            assert!(check_key("k", ok).is_ok(), "{ok}");
        }
        for bad in [
            "colour",
            "metadata.",
            "metadata.a b",
            "API_KEY",
            "organisation",
        ] {
            assert!(check_key("k", bad).is_err(), "{bad}");
        }
        let err = conditions(vec![cond("model", "gpt-*"), cond("team", "a")]).unwrap_err();
        assert!(
            err.message
                .starts_with("conditions[1].key: unknown key \"team\""),
            "{err}"
        );
        let err = conditions(vec![cond("model", "a"), cond("model", "b")]).unwrap_err();
        assert!(err.message.starts_with("conditions[1].key:"), "{err}");
        let err = conditions(vec![cond("api_key", "k1")]).unwrap_err();
        assert_eq!(
            err.message,
            "conditions[0].value: must be an API key's id or *, got \"k1\""
        );
        assert!(conditions(vec![])
            .unwrap_err()
            .message
            .starts_with("conditions: must hold"));
        let with_excludes = ConditionInput {
            excludes: Some(json!("admin")),
            ..cond("metadata._user", "*")
        };
        assert_eq!(
            conditions(vec![with_excludes]).unwrap()[0].excludes,
            Some(vec!["admin".to_owned()])
        );
        let bad_excludes = ConditionInput {
            excludes: Some(json!([1])),
            ..cond("metadata._user", "*")
        };
        assert_eq!(
            conditions(vec![bad_excludes]).unwrap_err().message,
            "conditions[0].excludes: must hold only strings"
        );
    }

    #[test]
    fn numbers_are_checked() {
        assert_eq!(rate_value("value", 100.0).unwrap(), 100);
        assert_eq!(rate_value("value", 0.0).unwrap(), 0);
        assert!(rate_value("value", 1.5).is_err());
        assert!(rate_value("value", -1.0).is_err());
        assert!(amount("credit_limit", 12.5).is_ok());
        assert!(amount("credit_limit", -0.1).is_err());
        assert!(reset_days(0).is_err());
        assert!(reset_days(365).is_ok());
        assert!(next_reset("2020-01-01T00:00:00Z").is_err());
        assert!(next_reset("tomorrow").is_err());
    }
}
