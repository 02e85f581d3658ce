//! Settings (paths of this gateway; the reference shows none): `GET/PUT /v1/admin/settings`
//! for the organisation and `GET/PUT /v1/admin/workspaces/{id}/settings` for a workspace's
//! overrides, both with the admin key only. Organisation: API-key expiry default and maximum,
//! user API keys per workspace maximum, deployments per type maximum (production and
//! non-production apart), prompt and analytics access. Workspace: the last two
//! kinds, each `null` to inherit the organisation's value again.

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use utoipa::ToSchema;

use super::openapi::{tag, EmptyObject, ErrorBody};
use super::{double_option, empty, AppState, Ctx, PathParams};
use crate::authz::{self, AccessSettings, Action, Op, Resource};
use crate::error::{AdminError, Result};
use crate::store::{OrganisationSettings, Store, Workspace, WorkspaceSettings};

/// The longest key lifetime that can be set (ten years).
const MAX_EXPIRY_DAYS: i64 = 3650;
/// The highest user-keys-per-workspace maximum.
const MAX_USER_KEYS: i64 = 10_000;
/// The highest deployments-per-type maximum.
const MAX_DEPLOYMENTS: i64 = 10_000;

/// The six access settings of a body, by name: absent `None`; `null` `Some(None)` (refused at
/// organisation level, where there is nothing to inherit; clears a workspace's override).
type AccessFields = [(&'static str, Option<Option<bool>>); 6];

fn access_slot<'a>(a: &'a mut AccessSettings, name: &str) -> &'a mut bool {
    match name {
        "membersViewPrompts" => &mut a.members_view_prompts,
        "membersWritePrompts" => &mut a.members_write_prompts,
        "managersViewPrompts" => &mut a.managers_view_prompts,
        "managersWritePrompts" => &mut a.managers_write_prompts,
        "membersViewAnalytics" => &mut a.members_view_analytics,
        _ => &mut a.managers_view_analytics,
    }
}

fn override_slot<'a>(w: &'a mut WorkspaceSettings, name: &str) -> &'a mut Option<bool> {
    match name {
        "membersViewPrompts" => &mut w.members_view_prompts,
        "membersWritePrompts" => &mut w.members_write_prompts,
        "managersViewPrompts" => &mut w.managers_view_prompts,
        "managersWritePrompts" => &mut w.managers_write_prompts,
        "membersViewAnalytics" => &mut w.members_view_analytics,
        _ => &mut w.managers_view_analytics,
    }
}

/// The organisation's settings to change; absent fields are kept.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = UpdateOrganisationSettings)]
struct UpdateOrganisation {
    /// Days a new key lives without `expires_at`: 1 to 3650, at most the maximum; `null`:
    /// never (only without a maximum).
    #[serde(default, deserialize_with = "double_option")]
    #[schema(minimum = 1, maximum = 3650)]
    api_key_default_expiry_days: Option<Option<i64>>,
    /// The longest a key may live, in days: 1 to 3650; `null`: no maximum.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(minimum = 1, maximum = 3650)]
    api_key_max_expiry_days: Option<Option<i64>>,
    /// The most user keys a user may have in one workspace: 1 to 10000; `null`: no maximum.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(minimum = 1, maximum = 10000)]
    user_api_keys_per_workspace_max: Option<Option<i64>>,
    /// The most deployments of type `production`: 0 to 10000; `null`: no limit.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(minimum = 0, maximum = 10000)]
    deployments_production_max: Option<Option<i64>>,
    /// The most deployments of type `non-production`: 0 to 10000; `null`: no limit.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(minimum = 0, maximum = 10000)]
    deployments_non_production_max: Option<Option<i64>>,
    #[serde(
        default,
        rename = "membersViewPrompts",
        deserialize_with = "double_option"
    )]
    #[schema(value_type = bool)]
    members_view_prompts: Option<Option<bool>>,
    #[serde(
        default,
        rename = "membersWritePrompts",
        deserialize_with = "double_option"
    )]
    #[schema(value_type = bool)]
    members_write_prompts: Option<Option<bool>>,
    #[serde(
        default,
        rename = "managersViewPrompts",
        deserialize_with = "double_option"
    )]
    #[schema(value_type = bool)]
    managers_view_prompts: Option<Option<bool>>,
    #[serde(
        default,
        rename = "managersWritePrompts",
        deserialize_with = "double_option"
    )]
    #[schema(value_type = bool)]
    managers_write_prompts: Option<Option<bool>>,
    #[serde(
        default,
        rename = "membersViewAnalytics",
        deserialize_with = "double_option"
    )]
    #[schema(value_type = bool)]
    members_view_analytics: Option<Option<bool>>,
    #[serde(
        default,
        rename = "managersViewAnalytics",
        deserialize_with = "double_option"
    )]
    #[schema(value_type = bool)]
    managers_view_analytics: Option<Option<bool>>,
}

/// A workspace's overrides to change: a value sets one, `null` removes it (the
/// organisation's value applies again); absent fields are kept.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = UpdateWorkspaceSettings)]
struct UpdateWorkspace {
    /// 1 to 10000.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(minimum = 1, maximum = 10000)]
    user_api_keys_per_workspace_max: Option<Option<i64>>,
    #[serde(
        default,
        rename = "membersViewPrompts",
        deserialize_with = "double_option"
    )]
    members_view_prompts: Option<Option<bool>>,
    #[serde(
        default,
        rename = "membersWritePrompts",
        deserialize_with = "double_option"
    )]
    members_write_prompts: Option<Option<bool>>,
    #[serde(
        default,
        rename = "managersViewPrompts",
        deserialize_with = "double_option"
    )]
    managers_view_prompts: Option<Option<bool>>,
    #[serde(
        default,
        rename = "managersWritePrompts",
        deserialize_with = "double_option"
    )]
    managers_write_prompts: Option<Option<bool>>,
    #[serde(
        default,
        rename = "membersViewAnalytics",
        deserialize_with = "double_option"
    )]
    members_view_analytics: Option<Option<bool>>,
    #[serde(
        default,
        rename = "managersViewAnalytics",
        deserialize_with = "double_option"
    )]
    managers_view_analytics: Option<Option<bool>>,
}

/// The access fields of either body.
macro_rules! access_fields {
    ($b:expr) => {
        [
            ("membersViewPrompts", $b.members_view_prompts),
            ("membersWritePrompts", $b.members_write_prompts),
            ("managersViewPrompts", $b.managers_view_prompts),
            ("managersWritePrompts", $b.managers_write_prompts),
            ("membersViewAnalytics", $b.members_view_analytics),
            ("managersViewAnalytics", $b.managers_view_analytics),
        ]
    };
}

/// `GET /admin/settings`.
#[utoipa::path(
    get,
    path = "/v1/admin/settings",
    operation_id = "getOrganisationSettings",
    tag = tag::SETTINGS,
    summary = "Get the organisation's settings",
    responses(
        (status = 200, description = "The settings.", body = Object),
    )
)]
pub async fn get_organisation(State(app): State<AppState>, ctx: Ctx) -> Result<Json<Value>> {
    let p = &ctx.principal;
    authz::allowed(
        p,
        &Action::new(Resource::OrganisationSettings, Op::Read),
        None,
    )?;
    let s = app.store.organisation_settings(&p.organisation_id).await?;
    Ok(Json(organisation_json(&p.organisation_id, &s)))
}

/// `PUT /admin/settings`: the fields given change, the others stay.
#[utoipa::path(
    put,
    path = "/v1/admin/settings",
    operation_id = "updateOrganisationSettings",
    tag = tag::SETTINGS,
    summary = "Update the organisation's settings",
    request_body = UpdateOrganisation,
    responses(
        (status = 200, description = "Updated.", body = EmptyObject),
        (status = 400, description = "An invalid body, or settings out of range.", body = ErrorBody),
    )
)]
pub async fn update_organisation(State(app): State<AppState>, ctx: Ctx) -> Result<Json<Value>> {
    let body: UpdateOrganisation = ctx.json()?;
    authz::allowed(
        &ctx.principal,
        &Action::new(Resource::OrganisationSettings, Op::Update),
        None,
    )?;
    let mut access = Vec::new();
    let fields: AccessFields = access_fields!(body);
    for (name, value) in fields {
        match value {
            None => {}
            Some(None) => {
                return Err(AdminError::field(name, "must be true or false, not null"));
            }
            Some(Some(v)) => access.push((name, v)),
        }
    }
    app.store
        .update_organisation_settings(ctx.actor(), |s| {
            if let Some(v) = body.api_key_default_expiry_days {
                s.api_key_default_expiry_days = v;
            }
            if let Some(v) = body.api_key_max_expiry_days {
                s.api_key_max_expiry_days = v;
            }
            if let Some(v) = body.user_api_keys_per_workspace_max {
                s.user_api_keys_per_workspace_max = v;
            }
            if let Some(v) = body.deployments_production_max {
                s.deployments_production_max = v;
            }
            if let Some(v) = body.deployments_non_production_max {
                s.deployments_non_production_max = v;
            }
            for (name, v) in access {
                *access_slot(&mut s.access, name) = v;
            }
            check_organisation(s)
        })
        .await?;
    Ok(empty())
}

/// `GET /admin/workspaces/{id}/settings`: the settings in force (override, else the
/// organisation's value) and the overrides themselves.
#[utoipa::path(
    get,
    path = "/v1/admin/workspaces/{id}/settings",
    operation_id = "getWorkspaceSettings",
    tag = tag::SETTINGS,
    summary = "Get a workspace's settings",
    description = "The settings in force (the override, else the organisation's value) and the overrides themselves.",
    params(
        ("id" = String, Path, description = "The workspace's id or slug."),
    ),
    responses(
        (status = 200, description = "The settings.", body = Object),
        (status = 404, description = "No such workspace.", body = ErrorBody),
    )
)]
pub async fn get_workspace(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let ws = authorised(&app.store, &ctx, &id, Op::Read).await?;
    let org = app
        .store
        .organisation_settings(&ctx.principal.organisation_id)
        .await?;
    let overrides = app.store.workspace_settings(&ws.id).await?;
    Ok(Json(workspace_json(&ws.id, &overrides, &org)))
}

/// `PUT /admin/workspaces/{id}/settings`: the fields given set an override; `null` removes it.
#[utoipa::path(
    put,
    path = "/v1/admin/workspaces/{id}/settings",
    operation_id = "updateWorkspaceSettings",
    tag = tag::SETTINGS,
    summary = "Update a workspace's overrides",
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
pub async fn update_workspace(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let body: UpdateWorkspace = ctx.json()?;
    if let Some(Some(max)) = body.user_api_keys_per_workspace_max {
        check_user_keys_max(max)?;
    }
    let ws = authorised(&app.store, &ctx, &id, Op::Update).await?;
    let fields: AccessFields = access_fields!(body);
    app.store
        .update_workspace_settings(ctx.actor(), &ws, |w| {
            if let Some(v) = body.user_api_keys_per_workspace_max {
                w.user_api_keys_per_workspace_max = v;
            }
            for (name, value) in fields {
                if let Some(v) = value {
                    *override_slot(w, name) = v;
                }
            }
            Ok(())
        })
        .await?;
    Ok(empty())
}

/// Every organisation setting in range, and the expiry default within the maximum.
fn check_organisation(s: &OrganisationSettings) -> Result<()> {
    for (field, days) in [
        ("api_key_default_expiry_days", s.api_key_default_expiry_days),
        ("api_key_max_expiry_days", s.api_key_max_expiry_days),
    ] {
        if let Some(d) = days {
            if !(1..=MAX_EXPIRY_DAYS).contains(&d) {
                return Err(AdminError::field(
                    field,
                    format!("must be between 1 and {MAX_EXPIRY_DAYS} days, or null; got {d}"),
                ));
            }
        }
    }
    match (s.api_key_default_expiry_days, s.api_key_max_expiry_days) {
        (Some(d), Some(m)) if d > m => {
            return Err(AdminError::field(
                "api_key_default_expiry_days",
                format!("must not exceed api_key_max_expiry_days ({m}), got {d}"),
            ))
        }
        (None, Some(m)) => {
            return Err(AdminError::field(
                "api_key_default_expiry_days",
                format!(
                    "cannot be null while api_key_max_expiry_days is {m}: keys made without \
                     expires_at would never expire"
                ),
            ))
        }
        _ => {}
    }
    if let Some(max) = s.user_api_keys_per_workspace_max {
        check_user_keys_max(max)?;
    }
    for (field, max) in [
        ("deployments_production_max", s.deployments_production_max),
        (
            "deployments_non_production_max",
            s.deployments_non_production_max,
        ),
    ] {
        if let Some(max) = max {
            if !(0..=MAX_DEPLOYMENTS).contains(&max) {
                return Err(AdminError::field(
                    field,
                    format!("must be between 0 and {MAX_DEPLOYMENTS}, or null; got {max}"),
                ));
            }
        }
    }
    Ok(())
}

fn check_user_keys_max(max: i64) -> Result<()> {
    if !(1..=MAX_USER_KEYS).contains(&max) {
        return Err(AdminError::field(
            "user_api_keys_per_workspace_max",
            format!("must be between 1 and {MAX_USER_KEYS}, or null; got {max}"),
        ));
    }
    Ok(())
}

fn organisation_json(organisation_id: &str, s: &OrganisationSettings) -> Value {
    let mut v = serde_json::to_value(s).expect("settings serialise");
    v["object"] = json!("organisation-settings");
    v["organisation_id"] = json!(organisation_id);
    v
}

fn workspace_json(
    workspace_id: &str,
    overrides: &WorkspaceSettings,
    org: &OrganisationSettings,
) -> Value {
    let e = overrides.effective(org);
    let mut v = serde_json::to_value(e.access).expect("settings serialise");
    v["user_api_keys_per_workspace_max"] = json!(e.user_api_keys_per_workspace_max);
    v["overrides"] = serde_json::to_value(overrides).expect("settings serialise");
    v["object"] = json!("workspace-settings");
    v["workspace_id"] = json!(workspace_id);
    v
}

/// The workspace of the path (id or slug) when the caller may do `op` to workspaces.
async fn authorised(store: &Store, ctx: &Ctx, id_or_slug: &str, op: Op) -> Result<Workspace> {
    let p = &ctx.principal;
    let action = Action::new(Resource::Workspaces, op);
    authz::allowed(p, &action, None)?;
    let ws = store
        .workspace(&p.organisation_id, id_or_slug)
        .await?
        .ok_or_else(|| AdminError::not_found(format!("no workspace {id_or_slug:?}")))?;
    authz::allowed(p, &action, Some(&ws.id))?;
    Ok(ws)
}
