//! `GET /v1/audit-logs`: the organisation's audit records, newest first.

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{AppState, Ctx};
use crate::authz::{self, Action, Op, Resource};
use crate::error::{AdminError, Result};
use crate::store::AuditFilter;
use crate::validate::{self, Page};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    start_time: String,
    end_time: String,
    #[serde(default)]
    method: Option<String>,
    #[serde(default)]
    uri: Option<String>,
    #[serde(default)]
    user_id: Option<String>,
    #[serde(default)]
    user_type: Option<String>,
    #[serde(default)]
    workspace_id: Option<String>,
    #[serde(default)]
    response_status_code: Option<i64>,
    #[serde(default)]
    resource_type: Option<String>,
    #[serde(default)]
    action: Option<String>,
    #[serde(default)]
    client_ip: Option<String>,
    #[serde(default)]
    page_size: Option<i64>,
    #[serde(default)]
    current_page: Option<i64>,
}

/// `{object: "list", total, records: [...]}`.
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
