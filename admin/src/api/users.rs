//! `/v1/admin/users`: list, get, change of role, removal (admin key only). The owner's role
//! never changes and the owner is never removed: both are refused with 403.

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::openapi::{tag, EmptyObject, ErrorBody, ListEnvelope};
use super::{empty, list_envelope, AppState, Ctx, PathParams};
use crate::authz::{self, Action, Op, OrgRole, Resource};
use crate::error::{AdminError, Result};
use crate::store::{OrgUser, Store, UserFilter};
use crate::validate::{self, Page};

/// The longest e-mail address (and e-mail filter).
pub(super) const MAX_EMAIL: usize = 320;

#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum RoleFilter {
    Owner,
    Admin,
    Member,
}

/// A role a user can be given: the owner is made once, by the first start.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
#[schema(as = OrganisationRole)]
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

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
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
    #[serde(default)]
    #[param(inline)]
    role: Option<RoleFilter>,
    /// Any part of the address, any case.
    #[serde(default)]
    email: Option<String>,
}

/// A user's new role.
#[derive(Debug, Deserialize, ToSchema)]
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
#[utoipa::path(
    get,
    path = "/v1/admin/users",
    operation_id = "listUsers",
    tag = tag::USERS,
    summary = "List users",
    params(ListQuery),
    responses(
        (status = 200, description = "A page of users.", body = ListEnvelope),
        (status = 400, description = "An invalid query.", body = ErrorBody),
    )
)]
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
#[utoipa::path(
    get,
    path = "/v1/admin/users/{id}",
    operation_id = "getUser",
    tag = tag::USERS,
    summary = "Get a user",
    params(
        ("id" = String, Path, description = "The user's id (a UUID)."),
    ),
    responses(
        (status = 200, description = "The user.", body = Object),
        (status = 400, description = "A malformed id.", body = ErrorBody),
        (status = 404, description = "No such user.", body = ErrorBody),
    )
)]
pub async fn get(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let user = authorised(&app.store, &ctx, &id, Op::Read).await?;
    Ok(Json(user.to_json()))
}

/// `PUT /admin/users/{userId}`: `role` admin or member.
#[utoipa::path(
    put,
    path = "/v1/admin/users/{id}",
    operation_id = "updateUser",
    tag = tag::USERS,
    summary = "Change a user's role",
    params(
        ("id" = String, Path, description = "The user's id (a UUID)."),
    ),
    request_body = UpdateUser,
    responses(
        (status = 200, description = "Updated.", body = EmptyObject),
        (status = 400, description = "A malformed id or an invalid body.", body = ErrorBody),
        (status = 403, description = "The owner keeps the owner role, or the key lacks the right (AB03).", body = ErrorBody),
        (status = 404, description = "No such user.", body = ErrorBody),
    )
)]
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
#[utoipa::path(
    delete,
    path = "/v1/admin/users/{id}",
    operation_id = "deleteUser",
    tag = tag::USERS,
    summary = "Remove a user",
    description = "The user's workspace user keys and memberships go too.",
    params(
        ("id" = String, Path, description = "The user's id (a UUID)."),
    ),
    responses(
        (status = 200, description = "Removed.", body = EmptyObject),
        (status = 400, description = "A malformed id, or a body with fields.", body = ErrorBody),
        (status = 403, description = "The owner cannot be removed, or the key lacks the right (AB03).", body = ErrorBody),
        (status = 404, description = "No such user.", body = ErrorBody),
        (status = 409, description = "The user gained API keys while being removed; try again.", body = ErrorBody),
    )
)]
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
