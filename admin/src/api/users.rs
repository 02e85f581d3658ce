//! `/v1/admin/users`: list, get, change of role, removal (admin key only). The owner's role
//! never changes and the owner is never removed: both are refused with 403.

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::Value;

use super::{empty, list_envelope, AppState, Ctx, PathParams};
use crate::authz::{self, Action, Op, OrgRole, Resource};
use crate::error::{AdminError, Result};
use crate::store::{OrgUser, Store, UserFilter};
use crate::validate::{self, Page};

/// The longest e-mail address (and e-mail filter).
pub(super) const MAX_EMAIL: usize = 320;

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum RoleFilter {
    Owner,
    Admin,
    Member,
}

/// A role a user can be given: the owner is made once, by the first start.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum GivenRole {
    Admin,
    Member,
}

impl GivenRole {
    pub(super) fn role(self) -> OrgRole {
        match self {
            GivenRole::Admin => OrgRole::Admin,
            GivenRole::Member => OrgRole::Member,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ListQuery {
    #[serde(default)]
    page_size: Option<i64>,
    #[serde(default)]
    current_page: Option<i64>,
    #[serde(default)]
    role: Option<RoleFilter>,
    #[serde(default)]
    email: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdateUser {
    role: GivenRole,
}

/// `pageSize` and `currentPage` (the users and invites lists spell them so), checked like
/// every other page.
pub(super) fn camel_page(size: Option<i64>, number: Option<i64>) -> Result<Page> {
    Page::new(size, number).map_err(|e| {
        AdminError::validation(e.message.replacen("page_size", "pageSize", 1).replacen(
            "current_page",
            "currentPage",
            1,
        ))
    })
}

/// An e-mail filter: a part of the address, at most 320 characters.
pub(super) fn email_filter(email: Option<String>) -> Result<Option<String>> {
    if let Some(e) = &email {
        validate::max_len("email", e, MAX_EMAIL)?;
    }
    Ok(email.filter(|e| !e.is_empty()))
}

/// `GET /admin/users`: `pageSize`, `currentPage`, `role`, `email` (any part, any case).
pub async fn list(State(app): State<AppState>, ctx: Ctx) -> Result<Json<Value>> {
    let q: ListQuery = ctx.query()?;
    let page = camel_page(q.page_size, q.current_page)?;
    authz::allowed(
        &ctx.principal,
        &Action::new(Resource::OrganisationUsers, Op::List),
        None,
    )?;
    let filter = UserFilter {
        role: q.role.map(|r| match r {
            RoleFilter::Owner => OrgRole::Owner,
            RoleFilter::Admin => OrgRole::Admin,
            RoleFilter::Member => OrgRole::Member,
        }),
        email: email_filter(q.email)?,
    };
    let (total, users) = app
        .store
        .users(&ctx.principal.organisation_id, &filter, page)
        .await?;
    Ok(list_envelope(
        total,
        users.iter().map(OrgUser::to_json).collect(),
    ))
}

/// `GET /admin/users/{userId}`.
pub async fn get(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let user = authorised(&app.store, &ctx, &id, Op::Read).await?;
    Ok(Json(user.to_json()))
}

/// `PUT /admin/users/{userId}`: `role` admin or member.
pub async fn update(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let body: UpdateUser = ctx.json()?;
    let user = authorised(&app.store, &ctx, &id, Op::Update).await?;
    if user.role == OrgRole::Owner {
        return Err(AdminError::forbidden(
            "the organisation's owner keeps the owner role",
        ));
    }
    app.store
        .change_user_role(ctx.actor(), &user, body.role.role())
        .await?;
    Ok(empty())
}

/// `DELETE /admin/users/{userId}`: the user's workspace user keys and memberships go too.
pub async fn delete(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let _: super::members::NoFields = ctx.json()?;
    let user = authorised(&app.store, &ctx, &id, Op::Delete).await?;
    if user.role == OrgRole::Owner {
        return Err(AdminError::forbidden(
            "the organisation's owner cannot be removed",
        ));
    }
    app.store.delete_user(ctx.actor(), &user).await?;
    Ok(empty())
}

/// The user of the path when the caller may do `op` to users: 403 first, then 400 for a
/// malformed id and 404 for none.
async fn authorised(store: &Store, ctx: &Ctx, id: &str, op: Op) -> Result<OrgUser> {
    let p = &ctx.principal;
    authz::allowed(p, &Action::new(Resource::OrganisationUsers, op), None)?;
    let id = validate::uuid("userId", id)?;
    store
        .org_user(&p.organisation_id, &id)
        .await?
        .ok_or_else(|| AdminError::not_found(format!("no user {id}")))
}
