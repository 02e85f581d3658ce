//! `/v1/admin/workspaces`: create, list, get, update, delete (by id or slug).

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::openapi::{tag, EmptyObject, ErrorBody, ListEnvelope};
use super::{double_option, empty, list_envelope, AppState, Ctx, PathParams};
use crate::authz::{self, Action, Op, Resource, WorkspaceRole};
use crate::error::{AdminError, Result};
use crate::store::{NewWorkspace, Store, Workspace, WorkspaceChanges, WorkspaceFilter};
use crate::validate::{self, Metadata, Page, RateLimit, UsageLimits, UsageLimitsInput};

/// `defaults` of a workspace: what its requests get unless they say otherwise.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct WorkspaceDefaults {
    /// Metadata of the workspace's requests (string values).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<BTreeMap<String, String>>)]
    metadata: Option<Metadata>,
    /// The guardrails (ids) checking the workspace's requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    input_guardrails: Option<Vec<String>>,
    /// The guardrails (ids) checking the workspace's responses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    output_guardrails: Option<Vec<String>>,
}

#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum RoleInput {
    Admin,
    Manager,
    Member,
}

/// A first member of a new workspace.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = NewWorkspaceMember)]
struct MemberInput {
    /// The user's id (a UUID).
    id: String,
    #[schema(inline)]
    role: RoleInput,
}

/// A new workspace.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateWorkspace {
    /// 1 to 255 characters.
    name: String,
    /// 1 to 255 of `a-z A-Z 0-9 _ -`, not a UUID; made from the name when absent (not in the
    /// reference).
    #[serde(default)]
    #[schema(pattern = "^[a-zA-Z0-9_-]+$")]
    slug: Option<String>,
    /// At most 1024 characters.
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    defaults: Option<WorkspaceDefaults>,
    /// Its first members.
    #[serde(default)]
    users: Option<Vec<MemberInput>>,
    #[serde(default)]
    usage_limits: Option<Vec<UsageLimitsInput>>,
    #[serde(default)]
    rate_limits: Option<Vec<RateLimit>>,
}

/// The fields to change; absent fields are kept.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct UpdateWorkspace {
    #[serde(default)]
    name: Option<String>,
    /// `null` removes it.
    #[serde(default, deserialize_with = "double_option")]
    description: Option<Option<String>>,
    /// Replaces the defaults.
    #[serde(default)]
    defaults: Option<WorkspaceDefaults>,
    /// Replaces the usage limits.
    #[serde(default)]
    usage_limits: Option<Vec<UsageLimitsInput>>,
    /// Replaces the rate limits.
    #[serde(default)]
    rate_limits: Option<Vec<RateLimit>>,
}

/// Options of a deletion.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct DeleteWorkspace {
    /// Delete it with its API keys, configs, integrations and providers (otherwise 409 while
    /// any remain).
    #[serde(default)]
    force_delete: Option<bool>,
}

#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum Status {
    Active,
    Archived,
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
    /// Part of the name.
    #[serde(default)]
    name: Option<String>,
    /// The whole name.
    #[serde(default)]
    exact_name: Option<String>,
    #[serde(default)]
    #[param(inline)]
    status: Option<Status>,
}

/// `POST /admin/workspaces`.
#[utoipa::path(
    post,
    path = "/v1/admin/workspaces",
    operation_id = "createWorkspace",
    tag = tag::WORKSPACES,
    summary = "Create a workspace",
    request_body = CreateWorkspace,
    responses(
        (status = 200, description = "The new workspace.", body = Object),
        (status = 400, description = "An invalid body.", body = ErrorBody),
        (status = 404, description = "A user of `users` does not exist (AB02).", body = ErrorBody),
        (status = 409, description = "The slug is taken.", body = ErrorBody),
    )
)]
pub async fn create(State(app): State<AppState>, ctx: Ctx) -> Result<Json<Value>> {
    let body: CreateWorkspace = ctx.json()?;
    authz::allowed(
        &ctx.principal,
        &Action::new(Resource::Workspaces, Op::Create),
        None,
    )?;
    let name = validate::name("name", &body.name)?;
    let slug = match &body.slug {
        Some(s) => slug(s)?,
        None => slug_from(&name),
    };
    let mut members = Vec::new();
    for (i, m) in body.users.unwrap_or_default().into_iter().enumerate() {
        let id = validate::uuid(&format!("users[{i}].id"), &m.id)?;
        let role = match m.role {
            RoleInput::Admin => WorkspaceRole::Admin,
            RoleInput::Manager => WorkspaceRole::Manager,
            RoleInput::Member => WorkspaceRole::Member,
        };
        members.push((id, role));
    }
    let new = NewWorkspace {
        slug,
        name,
        description: validate::description(body.description)?,
        defaults: defaults(body.defaults.unwrap_or_default())?,
        usage_limits: usage_limits(body.usage_limits.unwrap_or_default())?,
        rate_limits: validate::rate_limits("rate_limits", body.rate_limits.unwrap_or_default())?,
        members,
    };
    let ws = app.store.create_workspace(ctx.actor(), &new).await?;
    Ok(Json(ws.to_json()))
}

/// `GET /admin/workspaces`.
#[utoipa::path(
    get,
    path = "/v1/admin/workspaces",
    operation_id = "listWorkspaces",
    tag = tag::WORKSPACES,
    summary = "List workspaces",
    params(ListQuery),
    responses(
        (status = 200, description = "A page of workspaces.", body = ListEnvelope),
        (status = 400, description = "An invalid query.", body = ErrorBody),
    )
)]
pub async fn list(State(app): State<AppState>, ctx: Ctx) -> Result<Json<Value>> {
    let q: ListQuery = ctx.query()?;
    let page = Page::new(q.page_size, q.current_page)?;
    authz::allowed(
        &ctx.principal,
        &Action::new(Resource::Workspaces, Op::List),
        None,
    )?;
    let filter = WorkspaceFilter {
        name: q.name,
        exact_name: q.exact_name,
        status: q.status.map(|s| match s {
            Status::Active => "active".to_owned(),
            Status::Archived => "archived".to_owned(),
        }),
    };
    let (total, list) = app
        .store
        .workspaces(&ctx.principal.organisation_id, &filter, page)
        .await?;
    Ok(list_envelope(
        total,
        list.iter().map(Workspace::to_json).collect(),
    ))
}

/// `GET /admin/workspaces/{id}`: the workspace and its members.
#[utoipa::path(
    get,
    path = "/v1/admin/workspaces/{id}",
    operation_id = "getWorkspace",
    tag = tag::WORKSPACES,
    summary = "Get a workspace",
    description = "The workspace and its members.",
    params(
        ("id" = String, Path, description = "The workspace's id or slug."),
    ),
    responses(
        (status = 200, description = "The workspace, with `users`.", body = Object),
        (status = 404, description = "No such workspace.", body = ErrorBody),
    )
)]
pub async fn get(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let ws = authorised(&app.store, &ctx, &id, Op::Read).await?;
    let members = app.store.workspace_members(&ws.id).await?;
    let mut out = ws.to_json();
    out["users"] = members.iter().map(|m| m.to_json(&ws.id)).collect();
    Ok(Json(out))
}

/// `PUT /admin/workspaces/{id}`.
#[utoipa::path(
    put,
    path = "/v1/admin/workspaces/{id}",
    operation_id = "updateWorkspace",
    tag = tag::WORKSPACES,
    summary = "Update a workspace",
    params(
        ("id" = String, Path, description = "The workspace's id or slug."),
    ),
    request_body = UpdateWorkspace,
    responses(
        (status = 200, description = "Updated.", body = EmptyObject),
        (status = 400, description = "An invalid body.", body = ErrorBody),
        (status = 404, description = "No such workspace.", body = ErrorBody),
    )
)]
pub async fn update(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let body: UpdateWorkspace = ctx.json()?;
    let ws = authorised(&app.store, &ctx, &id, Op::Update).await?;
    let changes = WorkspaceChanges {
        name: body.name.map(|n| validate::name("name", &n)).transpose()?,
        description: body.description.map(validate::description).transpose()?,
        defaults: body.defaults.map(defaults).transpose()?,
        usage_limits: body.usage_limits.map(usage_limits).transpose()?,
        rate_limits: body
            .rate_limits
            .map(|r| validate::rate_limits("rate_limits", r))
            .transpose()?,
    };
    app.store
        .update_workspace(ctx.actor(), &ws, &changes)
        .await?;
    Ok(empty())
}

/// `DELETE /admin/workspaces/{id}`: 409 while API keys remain, unless `force_delete`.
#[utoipa::path(
    delete,
    path = "/v1/admin/workspaces/{id}",
    operation_id = "deleteWorkspace",
    tag = tag::WORKSPACES,
    summary = "Delete a workspace",
    params(
        ("id" = String, Path, description = "The workspace's id or slug."),
    ),
    request_body(content = DeleteWorkspace, description = "Optional."),
    responses(
        (status = 200, description = "Deleted.", body = EmptyObject),
        (status = 400, description = "An invalid body.", body = ErrorBody),
        (status = 404, description = "No such workspace.", body = ErrorBody),
        (status = 409, description = "API keys, configs, integrations or providers remain (without `force_delete`).", body = ErrorBody),
    )
)]
pub async fn delete(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let body: DeleteWorkspace = ctx.json()?;
    let ws = authorised(&app.store, &ctx, &id, Op::Delete).await?;
    app.store
        .delete_workspace(ctx.actor(), &ws, body.force_delete.unwrap_or(false))
        .await?;
    Ok(empty())
}

/// The workspace of the path (id or slug) when the caller may do `op` to it.
async fn authorised(store: &Store, ctx: &Ctx, id_or_slug: &str, op: Op) -> Result<Workspace> {
    let p = &ctx.principal;
    // Refuse workspace keys before saying whether the workspace exists.
    authz::allowed(p, &Action::new(Resource::Workspaces, op), None)?;
    let ws = store
        .workspace(&p.organisation_id, id_or_slug)
        .await?
        .ok_or_else(|| AdminError::not_found(format!("no workspace {id_or_slug:?}")))?;
    authz::allowed(p, &Action::new(Resource::Workspaces, op), Some(&ws.id))?;
    Ok(ws)
}

/// A slug given by the client: 1 to 255 of `a-z A-Z 0-9 _ -`, and not a UUID (paths take
/// either).
fn slug(s: &str) -> Result<String> {
    validate::max_len("slug", s, validate::MAX_NAME)?;
    if s.is_empty()
        || !s
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(AdminError::field(
            "slug",
            format!("must be 1 to 255 of a-z, A-Z, 0-9, _ and -, got {s:?}"),
        ));
    }
    if validate::is_uuid(s) {
        return Err(AdminError::field("slug", "must not be a UUID"));
    }
    Ok(s.to_owned())
}

/// A slug from a name: its letters and digits in lowercase, dashes between words, and a random
/// suffix (`ws-team-a-3f9c2e`).
fn slug_from(name: &str) -> String {
    super::generated_slug("ws", 40, name)
}

fn defaults(d: WorkspaceDefaults) -> Result<Value> {
    for (field, list) in [
        ("defaults.input_guardrails", &d.input_guardrails),
        ("defaults.output_guardrails", &d.output_guardrails),
    ] {
        for (i, g) in list.iter().flatten().enumerate() {
            validate::max_len(&format!("{field}[{i}]"), g, validate::MAX_NAME)?;
            if g.is_empty() {
                return Err(AdminError::field(
                    &format!("{field}[{i}]"),
                    "must not be empty",
                ));
            }
        }
    }
    Ok(serde_json::to_value(d).expect("defaults serialise"))
}

fn usage_limits(list: Vec<UsageLimitsInput>) -> Result<Vec<UsageLimits>> {
    list.into_iter()
        .enumerate()
        .map(|(i, u)| validate::usage_limits(&format!("usage_limits[{i}]"), u))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs() {
        let s = slug_from("Team A / Research");
        assert!(s.starts_with("ws-team-a-research-"), "{s}");
        assert_eq!(s.len(), "ws-team-a-research-".len() + 6);
        assert!(slug_from("***").starts_with("ws-"));
        assert!(slug("team_a-1").is_ok());
        assert!(slug("team a").is_err());
        assert!(slug("").is_err());
        assert!(slug("5f0c7f1e-1d7a-4b8e-9d6e-0a1b2c3d4e5f").is_err());
    }
}
