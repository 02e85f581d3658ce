//! `/v1/guardrails`: create, list, get, update, delete (by id or slug), under the
//! `guardrails.*` scopes. A guardrail is one hook (its checks and actions, in the shape
//! `before_request_hooks` items take), owned by a workspace. Routing configs, the workspace's
//! defaults (`defaults.input_guardrails`) and the pipeline's YAML name it by slug (`pg-...`)
//! or id; the data plane reads it from its snapshot. The headers of its checks are secrets:
//! stored encrypted, shown masked, and a mask sent back keeps the stored value.

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use utoipa::ToSchema;

use super::configs::{list_workspace, target_workspace, WorkspacePageQuery};
use super::openapi::{tag, EmptyObject, ErrorBody, ListEnvelope};
use super::{empty, list_envelope, AppState, Ctx, PathParams};
use crate::authz::{self, Action, Op, Principal, Resource};
use crate::error::{AdminError, Result};
use crate::store::audit::redact;
use crate::store::config_secrets::{self, Body};
use crate::store::{Guardrail, GuardrailChanges, GuardrailFilter, NewGuardrail, Store};
use crate::validate::{self, Page};

/// `guardrail` (checks and reports) or `mutator` (may also rewrite: a redacting PII check).
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum HookType {
    Guardrail,
    Mutator,
}

impl HookType {
    fn as_str(self) -> &'static str {
        match self {
            HookType::Guardrail => "guardrail",
            HookType::Mutator => "mutator",
        }
    }
}

/// What happens with the verdict.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct Actions {
    /// A failed guardrail refuses the request (446). Default false: the answer goes on (246).
    #[serde(default)]
    deny: Option<bool>,
    /// Run beside the request; results are only logged and counted. Default false.
    #[serde(default, rename = "async")]
    is_async: Option<bool>,
    /// Reported with the result when it fails: `{feedback: {value, weight, metadata}}`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    on_fail: Option<Value>,
    /// Reported with the result when it passes.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    on_success: Option<Value>,
}

/// A new guardrail.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateGuardrail {
    /// 1 to 255 characters.
    name: String,
    /// Default `guardrail`.
    #[serde(default, rename = "type")]
    kind: Option<HookType>,
    /// At least one: `{id: "default.regexMatch", parameters: {...}, is_enabled: true}`, as in
    /// a routing config's hooks. The `headers` of a check are stored encrypted.
    #[serde(default)]
    #[schema(value_type = Vec<Object>)]
    checks: Vec<Value>,
    #[serde(default)]
    actions: Option<Actions>,
    /// A workspace id or slug; default: the calling workspace key's workspace, else the
    /// organisation's `default` workspace.
    #[serde(default)]
    workspace_id: Option<String>,
}

/// The changes; absent fields are kept. At least one field.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct UpdateGuardrail {
    #[serde(default)]
    name: Option<String>,
    #[serde(default, rename = "type")]
    kind: Option<HookType>,
    /// Replaces the checks. A header sent back as the mask the API showed keeps the stored
    /// value (if the check's `webhookURL` is unchanged).
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    checks: Option<Vec<Value>>,
    /// The actions given replace theirs; the others are kept.
    #[serde(default)]
    actions: Option<Actions>,
}

/// `{id, slug, object}`: the new guardrail.
#[derive(ToSchema)]
#[allow(dead_code)] // described in the OpenAPI document, never built
struct GuardrailCreated {
    id: String,
    /// What configs and workspace defaults name it by.
    slug: String,
    /// `guardrail`.
    object: String,
}

/// `POST /guardrails` -> `{id, slug, object}`.
#[utoipa::path(
    post,
    path = "/v1/guardrails",
    operation_id = "createGuardrail",
    tag = tag::GUARDRAILS,
    summary = "Create a guardrail",
    request_body = CreateGuardrail,
    responses(
        (status = 200, description = "The new guardrail.", body = GuardrailCreated),
        (status = 400, description = "An invalid body, or checks the gateway refuses (the message names the field).", body = ErrorBody),
        (status = 404, description = "No workspace `workspace_id` (AB02).", body = ErrorBody),
    )
)]
pub async fn create(State(app): State<AppState>, mut ctx: Ctx) -> Result<Json<Value>> {
    mask_audited_body(&mut ctx);
    let body: CreateGuardrail = ctx.json()?;
    let p = &ctx.principal;
    let name = validate::name("name", &body.name)?;
    let workspace_id = target_workspace(&app.store, p, body.workspace_id.as_deref()).await?;
    authz::allowed(
        p,
        &Action::new(Resource::Guardrails, Op::Create),
        Some(&workspace_id),
    )?;
    let hook = hook_of(
        &Value::Null,
        body.kind,
        Some(body.checks),
        body.actions.unwrap_or_default(),
    );
    app.store
        .check_guardrail(&hook)
        .map_err(AdminError::validation)?;
    let new = NewGuardrail {
        workspace_id,
        slug: super::short_slug("pg", &name),
        name,
        hook,
    };
    let created = app.store.create_guardrail(ctx.actor(), &new).await?;
    Ok(Json(json!({
        "id": created.id,
        "slug": created.slug,
        "object": "guardrail",
    })))
}

/// `GET /guardrails`: the guardrails the caller may list, newest first.
#[utoipa::path(
    get,
    path = "/v1/guardrails",
    operation_id = "listGuardrails",
    tag = tag::GUARDRAILS,
    summary = "List guardrails",
    description = "The guardrails the caller may list, newest first.",
    params(WorkspacePageQuery),
    responses(
        (status = 200, description = "A page of guardrails.", body = ListEnvelope),
        (status = 400, description = "An invalid query.", body = ErrorBody),
        (status = 404, description = "No workspace `workspace_id` (AB02).", body = ErrorBody),
    )
)]
pub async fn list(State(app): State<AppState>, ctx: Ctx) -> Result<Json<Value>> {
    let q: WorkspacePageQuery = ctx.query()?;
    let page = Page::new(q.page_size, q.current_page)?;
    let p = &ctx.principal;
    let workspace_id = list_workspace(&app.store, p, q.workspace_id.as_deref()).await?;
    authz::allowed(
        p,
        &Action::new(Resource::Guardrails, Op::List),
        workspace_id.as_deref(),
    )?;
    let (total, list) = app
        .store
        .guardrails(&p.organisation_id, &GuardrailFilter { workspace_id }, page)
        .await?;
    Ok(list_envelope(
        total,
        list.iter().map(Guardrail::to_json).collect(),
    ))
}

/// `GET /guardrails/{id}` (id or slug).
#[utoipa::path(
    get,
    path = "/v1/guardrails/{id}",
    operation_id = "getGuardrail",
    tag = tag::GUARDRAILS,
    summary = "Get a guardrail",
    params(
        ("id" = String, Path, description = "The guardrail's id or slug (`pg-...`)."),
    ),
    responses(
        (status = 200, description = "The guardrail (the headers of its checks masked).", body = Object),
        (status = 404, description = "No such guardrail.", body = ErrorBody),
    )
)]
pub async fn get(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let g = authorised(&app.store, &ctx.principal, &id, Op::Read).await?;
    Ok(Json(g.to_json()))
}

/// `PUT /guardrails/{id}`.
#[utoipa::path(
    put,
    path = "/v1/guardrails/{id}",
    operation_id = "updateGuardrail",
    tag = tag::GUARDRAILS,
    summary = "Update a guardrail",
    description = "Requests naming the guardrail use the new version from the next snapshot on. \
        A header sent back as the mask the API showed keeps the stored value.",
    params(
        ("id" = String, Path, description = "The guardrail's id or slug (`pg-...`)."),
    ),
    request_body = UpdateGuardrail,
    responses(
        (status = 200, description = "Updated.", body = EmptyObject),
        (status = 400, description = "An invalid body, nothing to update, checks the gateway refuses, or a masked header that matches none stored.", body = ErrorBody),
        (status = 404, description = "No such guardrail.", body = ErrorBody),
    )
)]
pub async fn update(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    mut ctx: Ctx,
) -> Result<Json<Value>> {
    mask_audited_body(&mut ctx);
    let body: UpdateGuardrail = ctx.json()?;
    if body.name.is_none() && body.kind.is_none() && body.checks.is_none() && body.actions.is_none()
    {
        return Err(AdminError::validation(
            "nothing to update: send name, type, checks or actions",
        ));
    }
    let name = body.name.map(|n| validate::name("name", &n)).transpose()?;
    let g = authorised(&app.store, &ctx.principal, &id, Op::Update).await?;
    let hook =
        (body.kind.is_some() || body.checks.is_some() || body.actions.is_some()).then(|| {
            hook_of(
                &g.hook,
                body.kind,
                body.checks,
                body.actions.unwrap_or_default(),
            )
        });
    app.store
        .update_guardrail(ctx.actor(), &g, &GuardrailChanges { name, hook })
        .await?;
    Ok(empty())
}

/// `DELETE /guardrails/{id}`.
#[utoipa::path(
    delete,
    path = "/v1/guardrails/{id}",
    operation_id = "deleteGuardrail",
    tag = tag::GUARDRAILS,
    summary = "Delete a guardrail",
    params(
        ("id" = String, Path, description = "The guardrail's id or slug (`pg-...`)."),
    ),
    responses(
        (status = 200, description = "Deleted.", body = EmptyObject),
        (status = 404, description = "No such guardrail.", body = ErrorBody),
        (status = 409, description = "Its workspace's defaults name it: remove it there first.", body = ErrorBody),
    )
)]
pub async fn delete(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let _: super::members::NoFields = ctx.json()?;
    let g = authorised(&app.store, &ctx.principal, &id, Op::Delete).await?;
    app.store.delete_guardrail(ctx.actor(), &g).await?;
    Ok(empty())
}

/// The guardrail of the path (id or slug) when the caller may do `op` to it; one of another
/// workspace is a 404, as one that does not exist.
async fn authorised(store: &Store, p: &Principal, id: &str, op: Op) -> Result<Guardrail> {
    let not_found = || AdminError::not_found(format!("no guardrail {id:?}"));
    let g = store
        .guardrail(&p.organisation_id, id)
        .await?
        .ok_or_else(not_found)?;
    if p.workspace_id().is_some_and(|ws| ws != g.workspace_id) {
        return Err(not_found());
    }
    authz::allowed(
        p,
        &Action::new(Resource::Guardrails, op),
        Some(&g.workspace_id),
    )?;
    Ok(g)
}

/// The stored hook (`{type, checks, deny, async, on_fail, on_success}`) from `base` (the
/// current hook, `null` for a new one) and the fields sent.
fn hook_of(
    base: &Value,
    kind: Option<HookType>,
    checks: Option<Vec<Value>>,
    actions: Actions,
) -> Value {
    let mut hook = base.as_object().cloned().unwrap_or_else(Map::new);
    let mut set = |name: &str, v: Option<Value>| {
        if let Some(v) = v {
            if v.is_null() {
                hook.remove(name);
            } else {
                hook.insert(name.to_owned(), v);
            }
        }
    };
    set("type", kind.map(|k| json!(k.as_str())));
    set("checks", checks.map(Value::Array));
    set("deny", actions.deny.map(Value::Bool));
    set("async", actions.is_async.map(Value::Bool));
    set("on_fail", actions.on_fail);
    set("on_success", actions.on_success);
    hook.entry("type").or_insert_with(|| json!("guardrail"));
    Value::Object(hook)
}

/// The audit log keeps the request's body: the headers of its checks are masked there as
/// when the guardrail is read.
fn mask_audited_body(ctx: &mut Ctx) {
    let Ok(mut body) = serde_json::from_slice::<Value>(&ctx.body) else {
        return;
    };
    if let Some(checks) = body.get_mut("checks") {
        let masked = config_secrets::masked_in(Body::Hook, &json!({"checks": checks.clone()}));
        *checks = masked["checks"].clone();
    }
    ctx.meta.body = Some(redact(body));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hooks_take_the_fields_sent_and_keep_the_rest() {
        let new = hook_of(
            &Value::Null,
            None,
            Some(vec![json!({"id": "default.pii"})]),
            Actions::default(),
        );
        assert_eq!(
            new,
            json!({"type": "guardrail", "checks": [{"id": "default.pii"}]})
        );
        let changed = hook_of(
            &json!({"type": "mutator", "checks": [], "deny": true, "on_fail": {"a": 1}}),
            None,
            None,
            Actions {
                is_async: Some(true),
                on_fail: Some(Value::Null),
                ..Actions::default()
            },
        );
        assert_eq!(
            changed,
            json!({"type": "mutator", "checks": [], "deny": true, "async": true})
        );
    }
}
