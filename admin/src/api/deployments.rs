//! `/v1/deployments`: create, list (filter `type`), get, update, delete (by id or slug), with
//! the admin key and the `deployments.*` scopes (also spelled `deployments:*`).

use std::collections::BTreeSet;

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{Map, Value};
use utoipa::{IntoParams, ToSchema};

use super::openapi::{tag, EmptyObject, ErrorBody, ListEnvelope};
use super::{double_option, empty, list_envelope, AppState, Ctx, PathParams};
use crate::authz::{self, Action, Op, Resource};
use crate::error::{AdminError, Result};
use crate::store::{Deployment, DeploymentChanges, NewDeployment, Store};
use crate::validate::{self, Page};

/// The longest deployment slug.
const MAX_SLUG: usize = 50;
/// The most workspaces a deployment may be restricted to.
const MAX_WORKSPACES: usize = 1000;

/// What a deployment serves.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
enum DeploymentType {
    Production,
    NonProduction,
}

impl DeploymentType {
    fn as_str(self) -> &'static str {
        match self {
            DeploymentType::Production => "production",
            DeploymentType::NonProduction => "non-production",
        }
    }
}

/// A new deployment.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateDeployment {
    /// 1 to 255 characters.
    name: String,
    /// 1 to 50 of `a-z A-Z 0-9 _ -`, not a UUID; default: made from the name.
    #[serde(default)]
    #[schema(pattern = "^[a-zA-Z0-9_-]{1,50}$")]
    slug: Option<String>,
    /// Default `non-production`.
    #[serde(default, rename = "type")]
    kind: Option<DeploymentType>,
    /// Free-form settings of the deployment.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    deployment_config: Option<Map<String, Value>>,
    /// The workspaces (ids or slugs) it serves, at least one; absent or `null`: every
    /// workspace.
    #[serde(default)]
    workspace_restrictions: Option<Vec<String>>,
}

/// The fields to change; absent fields are kept.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct UpdateDeployment {
    #[serde(default)]
    name: Option<String>,
    /// 1 to 50 of `a-z A-Z 0-9 _ -`, not a UUID.
    #[serde(default)]
    #[schema(pattern = "^[a-zA-Z0-9_-]{1,50}$")]
    slug: Option<String>,
    #[serde(default, rename = "type")]
    kind: Option<DeploymentType>,
    /// Replaces the settings.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    deployment_config: Option<Map<String, Value>>,
    /// `null` lifts the restriction (every workspace).
    #[serde(default, deserialize_with = "double_option")]
    workspace_restrictions: Option<Option<Vec<String>>>,
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
    /// Only deployments of this type.
    #[serde(default, rename = "type")]
    #[param(inline)]
    kind: Option<DeploymentType>,
}

/// `POST /deployments` -> the deployment. `type` defaults to `non-production`; without
/// `workspace_restrictions` (or with `null`) it serves every workspace.
#[utoipa::path(
    post,
    path = "/v1/deployments",
    operation_id = "createDeployment",
    tag = tag::DEPLOYMENTS,
    summary = "Create a deployment",
    request_body = CreateDeployment,
    responses(
        (status = 200, description = "The new deployment.", body = Object),
        (status = 400, description = "An invalid body.", body = ErrorBody),
        (status = 404, description = "A workspace of `workspace_restrictions` does not exist (AB02).", body = ErrorBody),
        (status = 409, description = "The slug is taken, or the organisation has as many deployments of the type as its settings allow (`deployments_production_max`, `deployments_non_production_max`).", body = ErrorBody),
    )
)]
pub async fn create(State(app): State<AppState>, ctx: Ctx) -> Result<Json<Value>> {
    let body: CreateDeployment = ctx.json()?;
    let p = &ctx.principal;
    authz::allowed(p, &Action::new(Resource::Deployments, Op::Create), None)?;
    let name = validate::name("name", &body.name)?;
    let slug = match &body.slug {
        Some(s) => slug(s)?,
        None => slug_from(&name),
    };
    let workspaces = match body.workspace_restrictions {
        Some(list) => Some(resolve_workspaces(&app.store, &p.organisation_id, &list).await?),
        None => None,
    };
    let new = NewDeployment {
        slug,
        name,
        kind: body
            .kind
            .unwrap_or(DeploymentType::NonProduction)
            .as_str()
            .to_owned(),
        config: Value::Object(body.deployment_config.unwrap_or_default()),
        workspaces,
    };
    let d = app.store.create_deployment(ctx.actor(), &new).await?;
    Ok(Json(d.to_json()))
}

/// `GET /deployments`: `page_size`, `current_page`, `type`.
#[utoipa::path(
    get,
    path = "/v1/deployments",
    operation_id = "listDeployments",
    tag = tag::DEPLOYMENTS,
    summary = "List deployments",
    params(ListQuery),
    responses(
        (status = 200, description = "A page of deployments.", body = ListEnvelope),
        (status = 400, description = "An invalid query.", body = ErrorBody),
    )
)]
pub async fn list(State(app): State<AppState>, ctx: Ctx) -> Result<Json<Value>> {
    let q: ListQuery = ctx.query()?;
    let page = Page::new(q.page_size, q.current_page)?;
    authz::allowed(
        &ctx.principal,
        &Action::new(Resource::Deployments, Op::List),
        None,
    )?;
    let (total, list) = app
        .store
        .deployments(
            &ctx.principal.organisation_id,
            q.kind.map(DeploymentType::as_str),
            page,
        )
        .await?;
    Ok(list_envelope(
        total,
        list.iter().map(Deployment::to_json).collect(),
    ))
}

/// `GET /deployments/{id}` (id or slug).
#[utoipa::path(
    get,
    path = "/v1/deployments/{id}",
    operation_id = "getDeployment",
    tag = tag::DEPLOYMENTS,
    summary = "Get a deployment",
    params(
        ("id" = String, Path, description = "The deployment's id or slug."),
    ),
    responses(
        (status = 200, description = "The deployment.", body = Object),
        (status = 404, description = "No such deployment.", body = ErrorBody),
    )
)]
pub async fn get(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let d = authorised(&app.store, &ctx, &id, Op::Read).await?;
    Ok(Json(d.to_json()))
}

/// `PUT /deployments/{id}`: the fields given change; `workspace_restrictions: null` lifts the
/// restriction.
#[utoipa::path(
    put,
    path = "/v1/deployments/{id}",
    operation_id = "updateDeployment",
    tag = tag::DEPLOYMENTS,
    summary = "Update a deployment",
    params(
        ("id" = String, Path, description = "The deployment's id or slug."),
    ),
    request_body = UpdateDeployment,
    responses(
        (status = 200, description = "Updated.", body = EmptyObject),
        (status = 400, description = "An invalid body.", body = ErrorBody),
        (status = 404, description = "No such deployment (AB08), or a workspace of `workspace_restrictions` does not exist (AB02).", body = ErrorBody),
        (status = 409, description = "The slug is taken, or the organisation has as many deployments of the type as its settings allow (`deployments_production_max`, `deployments_non_production_max`).", body = ErrorBody),
    )
)]
pub async fn update(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let body: UpdateDeployment = ctx.json()?;
    let d = authorised(&app.store, &ctx, &id, Op::Update).await?;
    let workspaces = match body.workspace_restrictions {
        None => None,
        Some(None) => Some(None),
        Some(Some(list)) => Some(Some(
            resolve_workspaces(&app.store, &d.organisation_id, &list).await?,
        )),
    };
    let changes = DeploymentChanges {
        name: body.name.map(|n| validate::name("name", &n)).transpose()?,
        slug: body.slug.map(|s| slug(&s)).transpose()?,
        kind: body.kind.map(|k| k.as_str().to_owned()),
        config: body.deployment_config.map(Value::Object),
        workspaces,
    };
    app.store
        .update_deployment(ctx.actor(), &d, &changes)
        .await?;
    Ok(empty())
}

/// `DELETE /deployments/{id}`.
#[utoipa::path(
    delete,
    path = "/v1/deployments/{id}",
    operation_id = "deleteDeployment",
    tag = tag::DEPLOYMENTS,
    summary = "Delete a deployment",
    params(
        ("id" = String, Path, description = "The deployment's id or slug."),
    ),
    responses(
        (status = 200, description = "Deleted.", body = EmptyObject),
        (status = 400, description = "A body with fields (this takes none).", body = ErrorBody),
        (status = 404, description = "No such deployment.", body = ErrorBody),
    )
)]
pub async fn delete(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let _: super::members::NoFields = ctx.json()?;
    let d = authorised(&app.store, &ctx, &id, Op::Delete).await?;
    app.store.delete_deployment(ctx.actor(), &d).await?;
    Ok(empty())
}

/// The deployment of the path (id or slug) when the caller may do `op` to deployments.
async fn authorised(store: &Store, ctx: &Ctx, id_or_slug: &str, op: Op) -> Result<Deployment> {
    let p = &ctx.principal;
    authz::allowed(p, &Action::new(Resource::Deployments, op), None)?;
    store
        .deployment(&p.organisation_id, id_or_slug)
        .await?
        .ok_or_else(|| AdminError::not_found(format!("no deployment {id_or_slug:?}")))
}

/// `workspace_restrictions`: one or more workspaces (ids or slugs), each once, as ids; 404
/// (AB02) for one that does not exist.
async fn resolve_workspaces(store: &Store, org: &str, list: &[String]) -> Result<Vec<String>> {
    if list.is_empty() {
        return Err(AdminError::field(
            "workspace_restrictions",
            "must list at least one workspace; null serves every workspace",
        ));
    }
    if list.len() > MAX_WORKSPACES {
        return Err(AdminError::field(
            "workspace_restrictions",
            format!("must list at most {MAX_WORKSPACES} workspaces"),
        ));
    }
    let mut ids = Vec::new();
    let mut seen = BTreeSet::new();
    for (i, w) in list.iter().enumerate() {
        let field = format!("workspace_restrictions[{i}]");
        validate::max_len(&field, w, validate::MAX_NAME)?;
        let ws = store
            .workspace(org, w)
            .await?
            .ok_or_else(|| AdminError::reference(format!("{field}: no workspace {w:?}")))?;
        if !seen.insert(ws.id.clone()) {
            return Err(AdminError::field(
                &field,
                "names a workspace listed earlier",
            ));
        }
        ids.push(ws.id);
    }
    Ok(ids)
}

/// A slug given by the client: 1 to 50 of `a-z A-Z 0-9 _ -`, and not a UUID (paths take
/// either).
fn slug(s: &str) -> Result<String> {
    let ok = !s.is_empty()
        && s.len() <= MAX_SLUG
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !ok {
        return Err(AdminError::field(
            "slug",
            format!("must be 1 to {MAX_SLUG} of a-z, A-Z, 0-9, _ and -, got {s:?}"),
        ));
    }
    if validate::is_uuid(s) {
        return Err(AdminError::field("slug", "must not be a UUID"));
    }
    Ok(s.to_owned())
}

/// A slug from a name: `dep-` and its letters and digits in lowercase, dashes between words,
/// and a random suffix, at most 50 characters (`dep-edge-eu-3f9c2e`).
fn slug_from(name: &str) -> String {
    super::generated_slug("dep", 32, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs() {
        let s = slug_from("Edge EU / Primary");
        assert!(s.starts_with("dep-edge-eu-primary-"), "{s}");
        assert!(slug_from(&"x".repeat(300)).len() <= MAX_SLUG);
        assert!(slug_from("***").starts_with("dep-"));
        assert!(slug("edge_eu-1").is_ok());
        assert!(slug(&"a".repeat(50)).is_ok());
        assert!(slug(&"a".repeat(51)).is_err());
        assert!(slug("").is_err());
        assert!(slug("a b").is_err());
        assert!(slug("5f0c7f1e-1d7a-4b8e-9d6e-0a1b2c3d4e5f").is_err());
    }
}
