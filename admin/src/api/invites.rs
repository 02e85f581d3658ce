//! `/v1/admin/users/invites`: invite, list, get, cancel (`DELETE`), resend (admin key only), and
//! accept. Accepting is not part of the reference's public API: `POST .../{id}/accept` takes
//! the token of the invite link instead of an API key (the invited person has none yet).

use std::net::IpAddr;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, Uri};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use utoipa::{IntoParams, ToSchema};

use super::openapi::{tag, EmptyObject, ErrorBody, ListEnvelope};
use super::users::{camel_page, email_filter, GivenRole};
use super::{empty, list_envelope, AppState, ClientAddr, Ctx, PathParams, MAX_BODY_BYTES};
use crate::authz::{self, Action, KeyKind, Op, Resource};
use crate::error::{AdminError, ErrorKind, Result};
use crate::store::{Invite, InviteFilter, InviteWorkspace, NewInvite, RequestMeta, Store};
use crate::validate;

#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum WorkspaceRoleInput {
    Admin,
    Member,
    Manager,
}

impl WorkspaceRoleInput {
    fn as_str(self) -> &'static str {
        match self {
            WorkspaceRoleInput::Admin => "admin",
            WorkspaceRoleInput::Member => "member",
            WorkspaceRoleInput::Manager => "manager",
        }
    }
}

/// A workspace the invited user joins, and their role there.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = InviteWorkspace)]
struct WorkspaceInput {
    /// The workspace's id or slug.
    id: String,
    #[schema(inline)]
    role: WorkspaceRoleInput,
}

/// The workspace user keys made for the user when they accept.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = InviteKeyDetails)]
struct KeyDetails {
    /// The keys' scopes (workspace user key scopes).
    scopes: Vec<String>,
}

/// An invitation.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateInvite {
    /// The invited address.
    #[schema(format = Email)]
    email: String,
    role: GivenRole,
    workspaces: Vec<WorkspaceInput>,
    /// With it, accepting makes the user a key in each workspace.
    #[serde(default)]
    workspace_api_key_details: Option<KeyDetails>,
}

#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum StatusFilter {
    Pending,
    Cancelled,
    Accepted,
    Expired,
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
    role: Option<GivenRole>,
    /// Any part of the address, any case.
    #[serde(default)]
    email: Option<String>,
    #[serde(default)]
    #[param(inline)]
    status: Option<StatusFilter>,
}

/// The acceptance of an invite.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = AcceptInvite)]
struct AcceptBody {
    /// The invite link's token (here or in the query).
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    first_name: Option<String>,
    #[serde(default)]
    last_name: Option<String>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct AcceptQuery {
    /// The invite link's token (here or in the body).
    #[serde(default)]
    token: Option<String>,
}

/// `{id, invite_link}`: the new invite.
#[derive(ToSchema)]
#[allow(dead_code)] // described in the OpenAPI document, never built
struct InviteCreated {
    id: String,
    /// The link the invited person follows to accept.
    invite_link: String,
}

/// `{inviteLink}`: the new link.
#[derive(ToSchema)]
#[allow(dead_code)] // described in the OpenAPI document, never built
struct InviteResent {
    #[schema(rename = "inviteLink")]
    invite_link: String,
}

/// `POST /admin/users/invites` -> `{id, invite_link}`. 409 (AB07) when the address already
/// belongs to the organisation or has a pending invite.
#[utoipa::path(
    post,
    path = "/v1/admin/users/invites",
    operation_id = "createInvite",
    tag = tag::INVITES,
    summary = "Invite a user",
    request_body = CreateInvite,
    responses(
        (status = 200, description = "The invite, and the link to send.", body = InviteCreated),
        (status = 400, description = "An invalid body.", body = ErrorBody),
        (status = 404, description = "A workspace of the body does not exist (AB02).", body = ErrorBody),
        (status = 409, description = "The address belongs to the organisation, or has a pending invite.", body = ErrorBody),
    )
)]
pub async fn create(
    State(app): State<AppState>,
    headers: HeaderMap,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let body: CreateInvite = ctx.json()?;
    let p = &ctx.principal;
    authz::allowed(
        p,
        &Action::new(Resource::OrganisationUsers, Op::Create),
        None,
    )?;
    let email = validate::email("email", body.email.trim())?.to_lowercase();
    let mut workspaces: Vec<InviteWorkspace> = Vec::new();
    for (i, w) in body.workspaces.iter().enumerate() {
        let field = format!("workspaces[{i}].id");
        if w.id.is_empty() {
            return Err(AdminError::field(&field, "must not be empty"));
        }
        validate::max_len(&field, &w.id, validate::MAX_NAME)?;
        let ws = app
            .store
            .workspace(&p.organisation_id, &w.id)
            .await?
            .ok_or_else(|| AdminError::reference(format!("{field}: no workspace {:?}", w.id)))?;
        if workspaces.iter().any(|x| x.id == ws.id) {
            return Err(AdminError::field(
                &field,
                "names a workspace listed earlier",
            ));
        }
        workspaces.push(InviteWorkspace {
            id: ws.id,
            role: w.role.as_str().to_owned(),
        });
    }
    let scopes = match body.workspace_api_key_details {
        None => None,
        Some(details) => {
            let scopes = authz::check_scopes(KeyKind::WorkspaceUser, &details.scopes)
                .map_err(|m| AdminError::validation(format!("workspace_api_key_details.{m}")))?;
            authz::may_grant(p, &scopes)?;
            if workspaces.is_empty() {
                return Err(AdminError::field(
                    "workspace_api_key_details",
                    "the keys are made in the invite's workspaces: list at least one",
                ));
            }
            Some(scopes)
        }
    };
    let new = NewInvite {
        email,
        role: body.role.role(),
        workspaces,
        scopes,
    };
    let (id, token) = app.store.create_invite(ctx.actor(), &new).await?;
    Ok(Json(json!({
        "id": id,
        "invite_link": invite_link(&headers, &id, &token),
    })))
}

/// `GET /admin/users/invites`: `pageSize`, `currentPage`, `role`, `email` (any part, any
/// case), `status`.
#[utoipa::path(
    get,
    path = "/v1/admin/users/invites",
    operation_id = "listInvites",
    tag = tag::INVITES,
    summary = "List invites",
    params(ListQuery),
    responses(
        (status = 200, description = "A page of invites.", body = ListEnvelope),
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
    let filter = InviteFilter {
        role: q.role.map(GivenRole::role),
        email: email_filter(q.email)?,
        status: q.status.map(|s| {
            match s {
                StatusFilter::Pending => "pending",
                StatusFilter::Cancelled => "cancelled",
                StatusFilter::Accepted => "accepted",
                StatusFilter::Expired => "expired",
            }
            .to_owned()
        }),
    };
    let (total, list) = app
        .store
        .invites(&ctx.principal.organisation_id, &filter, page)
        .await?;
    Ok(list_envelope(
        total,
        list.iter().map(Invite::to_json).collect(),
    ))
}

/// `GET /admin/users/invites/{id}`.
#[utoipa::path(
    get,
    path = "/v1/admin/users/invites/{id}",
    operation_id = "getInvite",
    tag = tag::INVITES,
    summary = "Get an invite",
    params(
        ("id" = String, Path, description = "The invite's id (a UUID)."),
    ),
    responses(
        (status = 200, description = "The invite.", body = Object),
        (status = 400, description = "A malformed id.", body = ErrorBody),
        (status = 404, description = "No such invite.", body = ErrorBody),
    )
)]
pub async fn get(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let invite = authorised(&app.store, &ctx, &id, Op::Read).await?;
    Ok(Json(invite.to_json()))
}

/// `DELETE /admin/users/invites/{id}`: cancels the invite (its link stops working); 409 for an
/// invite already accepted or cancelled.
#[utoipa::path(
    delete,
    path = "/v1/admin/users/invites/{id}",
    operation_id = "deleteInvite",
    tag = tag::INVITES,
    summary = "Cancel an invite",
    description = "Its link stops working.",
    params(
        ("id" = String, Path, description = "The invite's id (a UUID)."),
    ),
    responses(
        (status = 200, description = "Cancelled.", body = EmptyObject),
        (status = 400, description = "A malformed id, or a body with fields.", body = ErrorBody),
        (status = 404, description = "No such invite.", body = ErrorBody),
        (status = 409, description = "The invite was already accepted or cancelled.", body = ErrorBody),
    )
)]
pub async fn delete(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let _: super::members::NoFields = ctx.json()?;
    let invite = authorised(&app.store, &ctx, &id, Op::Delete).await?;
    app.store.cancel_invite(ctx.actor(), &invite).await?;
    Ok(empty())
}

/// `POST /admin/users/invites/{id}/resend` -> `{inviteLink}`: a new link, valid for a new
/// week; the previous link stops working. A pending or expired invite only.
#[utoipa::path(
    post,
    path = "/v1/admin/users/invites/{id}/resend",
    operation_id = "resendInvite",
    tag = tag::INVITES,
    summary = "Resend an invite",
    description = "A new link, valid for a new week; the previous link stops working. A pending or expired invite only.",
    params(
        ("id" = String, Path, description = "The invite's id (a UUID)."),
    ),
    responses(
        (status = 200, description = "The new link.", body = InviteResent),
        (status = 400, description = "A malformed id, or a body with fields.", body = ErrorBody),
        (status = 404, description = "No such invite.", body = ErrorBody),
        (status = 409, description = "The invite was accepted or cancelled.", body = ErrorBody),
    )
)]
pub async fn resend(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    headers: HeaderMap,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let _: super::members::NoFields = ctx.json()?;
    let invite = authorised(&app.store, &ctx, &id, Op::Update).await?;
    let token = app.store.resend_invite(ctx.actor(), &invite).await?;
    Ok(Json(
        json!({"inviteLink": invite_link(&headers, &invite.id, &token)}),
    ))
}

/// `POST /admin/users/invites/{id}/accept`: no API key; the invite link's `token` (in the body
/// or the query), and optionally `first_name`, `last_name`. Answers the new user, with
/// `api_keys` (raw, shown this once) when the invite asked for workspace keys.
#[utoipa::path(
    post,
    path = "/v1/admin/users/invites/{id}/accept",
    operation_id = "acceptInvite",
    tag = tag::INVITES,
    summary = "Accept an invite",
    description = "Takes no API key: the invite link's `token` (in the body or the query). Answers the new user, with `api_keys` (raw, shown this once) when the invite asked for workspace keys.",
    security(()),
    params(
        ("id" = String, Path, description = "The invite's id (a UUID)."),
        AcceptQuery,
    ),
    request_body = AcceptBody,
    responses(
        (status = 200, description = "The new user.", body = Object),
        (status = 400, description = "A malformed id, an invalid body, no token.", body = ErrorBody),
        (status = 401, description = "The token does not match.", body = ErrorBody),
        (status = 404, description = "No such invite.", body = ErrorBody),
        (status = 409, description = "The invite was already accepted, cancelled or has expired, or the address is taken.", body = ErrorBody),
        (status = 413, description = "The body is larger than the control plane reads.", body = ErrorBody),
        (status = 500, description = "A fault of the gateway or its database.", body = ErrorBody),
    )
)]
pub async fn accept(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ClientAddr(client): ClientAddr,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    req: Request,
) -> Result<Json<Value>> {
    let body = axum::body::to_bytes(req.into_body(), MAX_BODY_BYTES)
        .await
        .map_err(|_| {
            AdminError::new(
                ErrorKind::PayloadTooLarge,
                format!("the request body is larger than {MAX_BODY_BYTES} bytes"),
            )
        })?;
    let query: AcceptQuery = validate::query(&uri)?;
    let b: AcceptBody = validate::json(&body)?;
    let id = validate::uuid("id", &id)?;
    let token = b
        .token
        .or(query.token)
        .ok_or_else(|| AdminError::field("token", "is required: the token of the invite link"))?;
    if token.is_empty() || token.len() > 512 {
        return Err(AdminError::unauthorized("the invite token does not match"));
    }
    let first_name = person_name("first_name", b.first_name)?;
    let last_name = person_name("last_name", b.last_name)?;
    let meta = request_meta(&method, &uri, &headers, client, &body);
    let accepted = app
        .store
        .accept_invite(&id, &token, first_name, last_name, &meta)
        .await?;
    let mut out = accepted.user.to_json();
    out["api_keys"] = accepted
        .keys
        .iter()
        .map(|(id, key, ws)| json!({"id": id, "key": key, "workspace_id": ws, "object": "api-key"}))
        .collect();
    Ok(Json(out))
}

fn person_name(field: &str, value: Option<String>) -> Result<Option<String>> {
    match value.map(|v| v.trim().to_owned()) {
        Some(v) if v.is_empty() => Ok(None),
        Some(v) => {
            validate::max_len(field, &v, validate::MAX_NAME)?;
            Ok(Some(v))
        }
        None => Ok(None),
    }
}

/// What the audit log records of an acceptance: the path without its query (which may hold
/// the token) and the body with the token redacted.
fn request_meta(
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    client: Option<IpAddr>,
    body: &[u8],
) -> RequestMeta {
    let request_id = headers
        .get("x-gw-trace-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128)
        .map(str::to_owned)
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    RequestMeta {
        method: method.to_string(),
        uri: uri.path().to_owned(),
        request_id,
        client_ip: client.map(|ip| ip.to_string()),
        body: None,
    }
    .with_body(body)
}

/// The invite of the path when the caller may do `op` to users: 403 first, then 400 for a
/// malformed id and 404 for none.
async fn authorised(store: &Store, ctx: &Ctx, id: &str, op: Op) -> Result<Invite> {
    let p = &ctx.principal;
    authz::allowed(p, &Action::new(Resource::OrganisationUsers, op), None)?;
    let id = validate::uuid("id", id)?;
    store
        .invite(&p.organisation_id, &id)
        .await?
        .ok_or_else(|| AdminError::not_found(format!("no invite {id}")))
}

/// The link the invited person follows: the accept endpoint with the token, on the host the
/// admin called (`https` behind a proxy that says so), or a path when the host is unknown.
fn invite_link(headers: &HeaderMap, id: &str, token: &str) -> String {
    let path = format!("/v1/admin/users/invites/{id}/accept?token={token}");
    let host = headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| {
            !h.is_empty()
                && h.len() <= 255
                && h.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'))
        });
    match host {
        Some(host) => {
            let https = headers
                .get("x-forwarded-proto")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.eq_ignore_ascii_case("https"));
            let scheme = if https { "https" } else { "http" };
            format!("{scheme}://{host}{path}")
        }
        None => path,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_use_the_called_host() {
        let mut h = HeaderMap::new();
        assert_eq!(
            invite_link(&h, "i", "t"),
            "/v1/admin/users/invites/i/accept?token=t"
        );
        h.insert(http::header::HOST, "gw.example.com:8787".parse().unwrap());
        assert_eq!(
            invite_link(&h, "i", "t"),
            "http://gw.example.com:8787/v1/admin/users/invites/i/accept?token=t"
        );
        h.insert("x-forwarded-proto", "https".parse().unwrap());
        assert!(invite_link(&h, "i", "t").starts_with("https://gw.example.com:8787/"));
        h.insert(http::header::HOST, "evil.com/x?".parse().unwrap());
        assert!(invite_link(&h, "i", "t").starts_with("/v1/"));
    }
}
