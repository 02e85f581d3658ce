//! `GET /v1/audit-logs`: the organisation's audit records, newest first: changes, events the
//! data plane reports, and refused control-plane calls (see `super::refusals`).

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use utoipa::{IntoParams, ToSchema};

use super::openapi::{tag, ErrorBody, Object};
use super::{AppState, Ctx};
use crate::authz::{self, Action, Op, Resource};
use crate::error::{AdminError, Result};
use crate::store::AuditFilter;
use crate::validate::{self, Page};

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    /// RFC 3339: records at or after it.
    #[param(format = DateTime)]
    start_time: String,
    /// RFC 3339: records at or before it (not before `start_time`).
    #[param(format = DateTime)]
    end_time: String,
    /// The request's HTTP method.
    #[serde(default)]
    method: Option<String>,
    /// The request's path.
    #[serde(default)]
    uri: Option<String>,
    #[serde(default)]
    user_id: Option<String>,
    #[serde(default)]
    user_type: Option<String>,
    /// A workspace id or slug (a deleted workspace's id still matches its records).
    #[serde(default)]
    workspace_id: Option<String>,
    /// An HTTP status, 100 to 599.
    #[serde(default)]
    #[param(minimum = 100, maximum = 599)]
    response_status_code: Option<i64>,
    #[serde(default)]
    resource_type: Option<String>,
    #[serde(default)]
    action: Option<String>,
    #[serde(default)]
    client_ip: Option<String>,
    /// Items per page: 0 to 100, default 50.
    #[serde(default)]
    #[param(minimum = 0, maximum = 100)]
    page_size: Option<i64>,
    /// The page, from 0.
    #[serde(default)]
    #[param(minimum = 0)]
    current_page: Option<i64>,
}

/// `{object: "list", total, records}`: a page of audit records, newest first.
#[derive(ToSchema)]
#[allow(dead_code)] // described in the OpenAPI document, never built
struct AuditLogList {
    /// `list`.
    object: String,
    /// How many records match in all.
    total: i64,
    records: Vec<Object>,
}

/// `{object: "list", total, records: [...]}`.
#[utoipa::path(
    get,
    path = "/v1/audit-logs",
    operation_id = "listAuditLogs",
    tag = tag::AUDIT_LOGS,
    summary = "List audit records",
    description = "The organisation's audit records between two times, newest first (an admin key with `audit_logs.list`). Besides changes: control-plane calls refused with 401 or 403 (action `refused`, `request_body.reason`; an unknown caller's under the organisation with `user_type` `anonymous`), at most a bounded number a second per gateway instance, the rest counted in summary records (resource type `control_plane`, `request_body.summary` true, `refused` the count).",
    params(ListQuery),
    responses(
        (status = 200, description = "A page of audit records.", body = AuditLogList),
        (status = 400, description = "An invalid query (`start_time` and `end_time` are required).", body = ErrorBody),
    )
)]
pub async fn list(State(app): State<AppState>, ctx: Ctx) -> Result<Json<Value>> {
    let q: ListQuery = ctx.query()?;
    let p = &ctx.principal;
    authz::allowed(p, &Action::new(Resource::AuditLogs, Op::List), None)?;
    let page = Page::new(q.page_size, q.current_page)?;
    let start = validate::timestamp("start_time", &q.start_time)?;
    let end = validate::timestamp("end_time", &q.end_time)?;
    if end < start {
        return Err(AdminError::field(
            "end_time",
            "must not be before start_time",
        ));
    }
    let workspace_id = match q.workspace_id {
        Some(ws) => Some(
            app.store
                .workspace(&p.organisation_id, &ws)
                .await?
                .map(|w| w.id)
                // A deleted workspace keeps its records: filter by the id as given.
                .unwrap_or(ws),
        ),
        None => None,
    };
    if let Some(code) = q.response_status_code {
        if !(100..=599).contains(&code) {
            return Err(AdminError::field(
                "response_status_code",
                format!("must be an HTTP status (100 to 599), got {code}"),
            ));
        }
    }
    let filter = AuditFilter {
        start_time: Some(start),
        end_time: Some(end),
        method: q.method,
        uri: q.uri,
        user_id: q.user_id,
        user_type: q.user_type,
        workspace_id,
        response_status_code: q.response_status_code,
        resource_type: q.resource_type,
        action: q.action,
        client_ip: q.client_ip,
    };
    let (total, records) = app
        .store
        .audit_logs(&p.organisation_id, &filter, page)
        .await?;
    Ok(Json(
        json!({"object": "list", "total": total, "records": records}),
    ))
}
