//! `/v1/admin/workspaces/{id}/users`: add, list, get, change of role, removal. The admin key
//! manages every workspace's members; a workspace admin or manager (a workspace key) those of
//! their own workspace, a manager without giving or taking away the admin role.

use std::collections::BTreeSet;

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::openapi::{tag, EmptyObject, ErrorBody, ListEnvelope};
use super::{empty, list_envelope, AppState, Ctx, PathParams};
use crate::authz::{self, Action, Op, Resource, WorkspaceRole};
use crate::error::{AdminError, Result};
use crate::store::{Store, Workspace, WorkspaceMember};
use crate::validate::{self, Page};

/// A body that must be empty (or `{}`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NoFields {}

/// A role in a workspace.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
#[schema(as = WorkspaceRole)]
enum RoleInput {
    Admin,
    Manager,
    Member,
}

impl RoleInput {
    fn role(self) -> WorkspaceRole {
        match self {
            RoleInput::Admin => WorkspaceRole::Admin,
            RoleInput::Manager => WorkspaceRole::Manager,
            RoleInput::Member => WorkspaceRole::Member,
        }
    }
}

/// A user to add, and their role.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = WorkspaceMemberInput)]
struct MemberInput {
    /// The user's id (a UUID).
    id: String,
    role: RoleInput,
}

/// Users to add to the workspace: all or none.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = AddWorkspaceMembers)]
struct AddMembers {
    /// At least one, each user once.
    users: Vec<MemberInput>,
}

/// A member's new role.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = UpdateWorkspaceMember)]
struct UpdateMember {
    role: RoleInput,
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
    /// Only members with this role.
    #[serde(default)]
    #[param(inline)]
    role: Option<RoleInput>,
}

/// `POST /admin/workspaces/{id}/users` -> `{}`: all or none; 404 (AB02) for an unknown user,
/// 409 for one who is already a member.
#[utoipa::path(
    post,
    path = "/v1/admin/workspaces/{id}/users",
    operation_id = "addWorkspaceMembers",
    tag = tag::MEMBERS,
    summary = "Add users to a workspace",
    description = "All or none, in one transaction. Audited as one action: `create` for one \
        user, `bulk_create` naming every user in `resource_ids` for several.",
    params(
        ("id" = String, Path, description = "The workspace's id or slug."),
    ),
    request_body = AddMembers,
    responses(
        (status = 200, description = "Added.", body = EmptyObject),
        (status = 400, description = "An invalid body.", body = ErrorBody),
        (status = 404, description = "No such workspace (AB08), or no such user (AB02).", body = ErrorBody),
        (status = 409, description = "A user is already a member.", body = ErrorBody),
    )
)]
pub async fn add(
    State(app): State<AppState>,
    PathParams(ws): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let body: AddMembers = ctx.json()?;
    if body.users.is_empty() {
        return Err(AdminError::field("users", "must list at least one user"));
    }
    let mut members = Vec::new();
    let mut seen = BTreeSet::new();
    for (i, m) in body.users.iter().enumerate() {
        let id = validate::uuid(&format!("users[{i}].id"), &m.id)?;
        if !seen.insert(id.clone()) {
            return Err(AdminError::field(
                &format!("users[{i}].id"),
                "names a user listed earlier",
            ));
        }
        members.push((id, m.role.role()));
    }
    let ws = authorised(&app.store, &ctx, &ws, Op::Create).await?;
    for (_, role) in &members {
        authz::may_set_workspace_role(&ctx.principal, None, Some(*role))?;
    }
    app.store.add_members(ctx.actor(), &ws, &members).await?;
    Ok(empty())
}

/// `GET /admin/workspaces/{id}/users`: `page_size`, `current_page`, `role`.
#[utoipa::path(
    get,
    path = "/v1/admin/workspaces/{id}/users",
    operation_id = "listWorkspaceMembers",
    tag = tag::MEMBERS,
    summary = "List a workspace's members",
    params(
        ("id" = String, Path, description = "The workspace's id or slug."),
        ListQuery,
    ),
    responses(
        (status = 200, description = "A page of members.", body = ListEnvelope),
        (status = 400, description = "An invalid query.", body = ErrorBody),
        (status = 404, description = "No such workspace.", body = ErrorBody),
    )
)]
pub async fn list(
    State(app): State<AppState>,
    PathParams(ws): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let q: ListQuery = ctx.query()?;
    let page = Page::new(q.page_size, q.current_page)?;
    let ws = authorised(&app.store, &ctx, &ws, Op::List).await?;
    let (total, list) = app
        .store
        .members(&ws.id, q.role.map(RoleInput::role), page)
        .await?;
    Ok(list_envelope(
        total,
        list.iter().map(WorkspaceMember::to_json).collect(),
    ))
}

/// `GET /admin/workspaces/{id}/users/{userId}`.
#[utoipa::path(
    get,
    path = "/v1/admin/workspaces/{id}/users/{user_id}",
    operation_id = "getWorkspaceMember",
    tag = tag::MEMBERS,
    summary = "Get a workspace member",
    params(
        ("id" = String, Path, description = "The workspace's id or slug."),
        ("user_id" = String, Path, description = "The user's id (a UUID)."),
    ),
    responses(
        (status = 200, description = "The member.", body = Object),
        (status = 400, description = "A malformed user id.", body = ErrorBody),
        (status = 404, description = "No such workspace, or the user is not a member.", body = ErrorBody),
    )
)]
pub async fn get(
    State(app): State<AppState>,
    PathParams((ws, user)): PathParams<(String, String)>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let (_, member) = authorised_member(&app.store, &ctx, &ws, &user, Op::Read).await?;
    Ok(Json(member.to_json()))
}

/// `PUT /admin/workspaces/{id}/users/{userId}`: `role`.
#[utoipa::path(
    put,
    path = "/v1/admin/workspaces/{id}/users/{user_id}",
    operation_id = "updateWorkspaceMember",
    tag = tag::MEMBERS,
    summary = "Change a member's role",
    params(
        ("id" = String, Path, description = "The workspace's id or slug."),
        ("user_id" = String, Path, description = "The user's id (a UUID)."),
    ),
    request_body = UpdateMember,
    responses(
        (status = 200, description = "Updated.", body = EmptyObject),
        (status = 400, description = "A malformed user id or an invalid body.", body = ErrorBody),
        (status = 404, description = "No such workspace, or the user is not a member.", body = ErrorBody),
    )
)]
pub async fn update(
    State(app): State<AppState>,
    PathParams((ws, user)): PathParams<(String, String)>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let body: UpdateMember = ctx.json()?;
    let (_, member) = authorised_member(&app.store, &ctx, &ws, &user, Op::Update).await?;
    let role = body.role.role();
    authz::may_set_workspace_role(&ctx.principal, Some(member.role), Some(role))?;
    app.store
        .change_member_role(ctx.actor(), &member, role)
        .await?;
    Ok(empty())
}

/// `DELETE /admin/workspaces/{id}/users/{userId}`: the member's user keys in the workspace go
/// too.
#[utoipa::path(
    delete,
    path = "/v1/admin/workspaces/{id}/users/{user_id}",
    operation_id = "deleteWorkspaceMember",
    tag = tag::MEMBERS,
    summary = "Remove a member",
    description = "The member's user keys in the workspace go too.",
    params(
        ("id" = String, Path, description = "The workspace's id or slug."),
        ("user_id" = String, Path, description = "The user's id (a UUID)."),
    ),
    responses(
        (status = 200, description = "Removed.", body = EmptyObject),
        (status = 400, description = "A malformed user id, or a body with fields.", body = ErrorBody),
        (status = 404, description = "No such workspace, or the user is not a member.", body = ErrorBody),
    )
)]
pub async fn delete(
    State(app): State<AppState>,
    PathParams((ws, user)): PathParams<(String, String)>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let _: NoFields = ctx.json()?;
    let (_, member) = authorised_member(&app.store, &ctx, &ws, &user, Op::Delete).await?;
    authz::may_set_workspace_role(&ctx.principal, Some(member.role), None)?;
    app.store.delete_member(ctx.actor(), &member).await?;
    Ok(empty())
}

/// The workspace of the path (id or slug) when the caller may do `op` to its members. A
/// workspace key learns nothing of other workspaces: 403 whether or not they exist.
async fn authorised(store: &Store, ctx: &Ctx, id_or_slug: &str, op: Op) -> Result<Workspace> {
    let p = &ctx.principal;
    let action = Action::new(Resource::WorkspaceUsers, op);
    match store.workspace(&p.organisation_id, id_or_slug).await? {
        Some(ws) => {
            authz::allowed(p, &action, Some(&ws.id))?;
            Ok(ws)
        }
        None => {
            // No workspace: refused as "another workspace" to a workspace key, and as usual
            // to an admin key without the right; a 404 for the others.
            authz::allowed(p, &action, p.workspace_id().map(|_| ""))?;
            Err(AdminError::not_found(format!(
                "no workspace {id_or_slug:?}"
            )))
        }
    }
}

async fn authorised_member(
    store: &Store,
    ctx: &Ctx,
    ws: &str,
    user: &str,
    op: Op,
) -> Result<(Workspace, WorkspaceMember)> {
    let ws = authorised(store, ctx, ws, op).await?;
    let user = validate::uuid("userId", user)?;
    let member = store.member(&ws.id, &user).await?.ok_or_else(|| {
        AdminError::not_found(format!("the user {user} is not a member of the workspace"))
    })?;
    Ok((ws, member))
}
