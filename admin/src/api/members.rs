//! `/v1/admin/workspaces/{id}/users`: add, list, get, change of role, removal. The admin key
//! manages every workspace's members; a workspace admin or manager (a workspace key) those of
//! their own workspace, a manager without giving or taking away the admin role.

use std::collections::BTreeSet;

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::Value;

use super::{empty, list_envelope, AppState, Ctx, PathParams};
use crate::authz::{self, Action, Op, Resource, WorkspaceRole};
use crate::error::{AdminError, Result};
use crate::store::{Store, Workspace, WorkspaceMember};
use crate::validate::{self, Page};

/// A body that must be empty (or `{}`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NoFields {}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MemberInput {
    id: String,
    role: RoleInput,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AddMembers {
    users: Vec<MemberInput>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdateMember {
    role: RoleInput,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    #[serde(default)]
    page_size: Option<i64>,
    #[serde(default)]
    current_page: Option<i64>,
    #[serde(default)]
    role: Option<RoleInput>,
}

/// `POST /admin/workspaces/{id}/users` -> `{}`: all or none; 404 (AB02) for an unknown user,
/// 409 for one who is already a member.
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
pub async fn get(
    State(app): State<AppState>,
    PathParams((ws, user)): PathParams<(String, String)>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let (_, member) = authorised_member(&app.store, &ctx, &ws, &user, Op::Read).await?;
    Ok(Json(member.to_json()))
}

/// `PUT /admin/workspaces/{id}/users/{userId}`: `role`.
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
