//! `/v1/logs`: the gateway's request logs — list (`logs.list`), one log (`logs.view`), insert
//! an external log (`logs.write`) — and their exports (`logs.export`): make a draft with
//! filters and the fields wanted, start it (the matching logs are written as JSON lines),
//! download it (this self-hosted gateway serves the lines itself, `application/x-ndjson`).
//!
//! An admin key reaches the organisation's logs; a workspace key those of its workspace (a
//! listing is confined to it, another workspace's log or export is refused).

use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use plugin_sdk::sinks::LogRecord;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use utoipa::openapi::schema::ArrayBuilder;
use utoipa::{IntoParams, ToSchema};

use super::openapi::{list_of, tag, ErrorBody, ListEnvelope};
use super::{list_envelope, AppState, Ctx, PathParams};
use crate::authz::{self, Action, Op, Principal, Resource};
use crate::error::{AdminError, Result};
use crate::store::audit::redact;
use crate::store::logs::{metadata_of, LogExport, LogFilter, NewLogExport, LOG_FIELDS};
use crate::store::Store;
use crate::validate::{self, Page};

/// Longest value of a text filter.
const MAX_FILTER: usize = 255;
/// Most logs in one `POST /v1/logs`.
const MAX_INSERT: usize = 100;
/// Longest `request.url` of an inserted log.
const MAX_URL: usize = 2048;

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
    /// A workspace id or slug; a workspace key lists its own workspace's.
    #[serde(default)]
    workspace_id: Option<String>,
    #[serde(default)]
    trace_id: Option<String>,
    #[serde(default)]
    api_key_id: Option<String>,
    /// An HTTP status, 100 to 599.
    #[serde(default)]
    #[param(minimum = 100, maximum = 599)]
    status_code: Option<i64>,
    #[serde(default)]
    provider: Option<String>,
    #[serde(default)]
    model: Option<String>,
    /// RFC 3339: logs made at or after it.
    #[serde(default)]
    #[param(format = DateTime)]
    time_of_generation_min: Option<String>,
    /// RFC 3339: logs made at or before it.
    #[serde(default)]
    #[param(format = DateTime)]
    time_of_generation_max: Option<String>,
}

/// A draft export, or the changes to one (fields not sent are kept).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = LogExportRequest)]
struct ExportBody {
    /// The workspace (id or slug) whose logs are exported; the same as `filters.workspace_id`
    /// if both are sent. Default: a workspace key's own workspace.
    #[serde(default)]
    workspace_id: Option<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    filters: Option<LogFilter>,
    /// The fields of each exported log.
    #[serde(default)]
    #[schema(schema_with = requested_data_schema)]
    requested_data: Option<Vec<String>>,
}

/// `requested_data`: fields of a log.
fn requested_data_schema() -> ArrayBuilder {
    list_of(LOG_FIELDS)
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ExportListQuery {
    /// A workspace id or slug; a workspace key lists its own workspace's.
    #[serde(default)]
    workspace_id: Option<String>,
    /// Items per page: 0 to 100, default 50.
    #[serde(default)]
    #[param(minimum = 0, maximum = 100)]
    page_size: Option<i64>,
    /// The page, from 0.
    #[serde(default)]
    #[param(minimum = 0)]
    current_page: Option<i64>,
}

/// `{id, total, object}`: a saved draft export.
#[derive(ToSchema)]
#[allow(dead_code)] // described in the OpenAPI document, never built
struct ExportSaved {
    id: String,
    /// How many logs match now.
    total: i64,
    /// `export`.
    object: String,
}

/// `{id, status, total, message, object}`: a finished export.
#[derive(ToSchema)]
#[allow(dead_code)] // described in the OpenAPI document, never built
struct ExportStarted {
    id: String,
    /// `success`.
    status: String,
    /// How many logs it holds.
    total: i64,
    message: String,
    /// `export`.
    object: String,
}

/// `{id, status, message, object}`: a cancelled export.
#[derive(ToSchema)]
#[allow(dead_code)] // described in the OpenAPI document, never built
struct ExportCancelled {
    id: String,
    /// `cancelled`.
    status: String,
    message: String,
    /// `export`.
    object: String,
}

// Described for the OpenAPI document only; the handler reads a JSON value, then each log.
/// The body of `POST /v1/logs`: one log, or a list of 1 to 100.
#[derive(Deserialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)] // described in the OpenAPI document, never built
#[schema(as = InsertLogs)]
enum InsertBody {
    One(Box<ExternalLog>),
    Many(Vec<ExternalLog>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NoBody {}

/// One log of `POST /v1/logs`: the request, the response, metadata.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct ExternalLog {
    request: ExternalRequest,
    response: ExternalResponse,
    /// Any `key: value` pairs; `trace_id`/`traceId`, `span_id`/`spanId`,
    /// `span_name`/`spanName` and `parent_span_id`/`parentSpanId` become the log's tracing
    /// fields.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    metadata: Option<Map<String, Value>>,
}

/// The request of an inserted log.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = ExternalLogRequest)]
struct ExternalRequest {
    /// At most 2048 characters.
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    provider: Option<String>,
    /// Accepted and not stored: headers carry credentials.
    #[serde(default)]
    #[allow(dead_code)]
    headers: Option<Value>,
    /// Default `POST`.
    #[serde(default)]
    method: Option<String>,
    /// Stored with secrets redacted; its `model` is the log's model.
    #[serde(default)]
    body: Option<Value>,
}

/// The response of an inserted log.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = ExternalLogResponse)]
struct ExternalResponse {
    /// Default 200.
    #[serde(default)]
    #[schema(minimum = 100, maximum = 599)]
    status: Option<i64>,
    /// Accepted and not stored.
    #[serde(default)]
    #[allow(dead_code)]
    headers: Option<Value>,
    /// Stored with secrets redacted; its `usage` gives the log's tokens.
    #[serde(default)]
    body: Option<Value>,
    /// Latency in milliseconds (`response_time` wins when both are sent).
    #[serde(default)]
    time: Option<f64>,
    /// Latency in milliseconds.
    #[serde(default)]
    response_time: Option<f64>,
    #[serde(default, rename = "streamingMode")]
    streaming_mode: Option<bool>,
}

// ----- logs -----

/// `GET /v1/logs`: newest first, without request and response bodies (read one log for them).
#[utoipa::path(
    get,
    path = "/v1/logs",
    operation_id = "listLogs",
    tag = tag::LOGS,
    summary = "List request logs",
    description = "Newest first, without request and response bodies (read one log for them).",
    params(ListQuery),
    responses(
        (status = 200, description = "A page of logs.", body = ListEnvelope),
        (status = 400, description = "An invalid query.", body = ErrorBody),
        (status = 404, description = "No workspace `workspace_id` (AB02).", body = ErrorBody),
    )
)]
pub async fn list(State(app): State<AppState>, ctx: Ctx) -> Result<Json<Value>> {
    let q: ListQuery = ctx.query()?;
    let page = Page::new(q.page_size, q.current_page)?;
    let p = &ctx.principal;
    let mut filter = checked_filter(LogFilter {
        workspace_id: q.workspace_id,
        trace_id: q.trace_id,
        api_key_id: q.api_key_id,
        status_code: q.status_code,
        provider: q.provider,
        model: q.model,
        time_of_generation_min: q.time_of_generation_min,
        time_of_generation_max: q.time_of_generation_max,
    })?;
    filter.workspace_id = scope(&app.store, p, Op::List, filter.workspace_id.as_deref()).await?;
    let (total, logs) = app
        .store
        .request_logs(&p.organisation_id, &filter, page)
        .await?;
    let data = logs
        .iter()
        .map(|l| {
            let mut v = l.to_json();
            if let Some(o) = v.as_object_mut() {
                o.remove("request_body");
                o.remove("response_body");
            }
            v
        })
        .collect();
    Ok(list_envelope(total, data))
}

/// `GET /v1/logs/{id}`: one log, with its bodies when they were kept.
#[utoipa::path(
    get,
    path = "/v1/logs/{id}",
    operation_id = "getLog",
    tag = tag::LOGS,
    summary = "Get a request log",
    description = "With its bodies when they were kept.",
    params(
        ("id" = String, Path, description = "The log's id."),
    ),
    responses(
        (status = 200, description = "The log.", body = Object),
        (status = 400, description = "An id longer than 255 characters.", body = ErrorBody),
        (status = 404, description = "No such log.", body = ErrorBody),
    )
)]
pub async fn get(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    validate::max_len("id", &id, MAX_FILTER)?;
    let p = &ctx.principal;
    let log = app
        .store
        .request_log(&p.organisation_id, &id)
        .await?
        .ok_or_else(|| AdminError::not_found(format!("no log {id}")))?;
    authz::allowed(
        p,
        &Action::new(Resource::Logs, Op::View),
        log.workspace_id.as_deref(),
    )?;
    Ok(Json(log.to_json()))
}

/// `POST /v1/logs`: stores one log, or a list of up to 100, sent by something other than
/// this gateway; `{object: "list", total, data: [{id, object: "log"}]}`. The logs belong to
/// the caller's organisation and, for a workspace key, its workspace. Headers are not stored;
/// bodies are, with secrets redacted.
#[utoipa::path(
    post,
    path = "/v1/logs",
    operation_id = "insertLogs",
    tag = tag::LOGS,
    summary = "Insert logs",
    description = "Stores one log, or a list of up to 100, sent by something other than this gateway. They belong to the caller's organisation and, for a workspace key, its workspace. Headers are not stored; bodies are, with secrets redacted.",
    request_body = InsertBody,
    responses(
        (status = 200, description = "The new logs' ids: `data` is `[{id, object: \"log\"}]`.", body = ListEnvelope),
        (status = 400, description = "An invalid body.", body = ErrorBody),
    )
)]
pub async fn insert(State(app): State<AppState>, ctx: Ctx) -> Result<Json<Value>> {
    let p = &ctx.principal;
    authz::allowed(p, &Action::new(Resource::Logs, Op::Write), p.workspace_id())?;
    let body: Value = serde_json::from_slice(&ctx.body)
        .map_err(|e| AdminError::validation(format!("the body is not valid JSON: {e}")))?;
    let items: Vec<(String, Value)> = match body {
        Value::Array(items) => {
            if items.is_empty() || items.len() > MAX_INSERT {
                return Err(AdminError::validation(format!(
                    "the body must hold 1 to {MAX_INSERT} logs, got {}",
                    items.len()
                )));
            }
            items
                .into_iter()
                .enumerate()
                .map(|(i, v)| (format!("[{i}]"), v))
                .collect()
        }
        one @ Value::Object(_) => vec![(String::new(), one)],
        _ => {
            return Err(AdminError::validation(
                "the body must be a log object or a list of them",
            ))
        }
    };
    let mut records = Vec::with_capacity(items.len());
    for (at, item) in items {
        let log: ExternalLog = parse_at(&at, item)?;
        records.push(external_record(p, &at, log)?);
    }
    // The audit record notes how many logs came, not their bodies (prompts stay in the logs).
    let mut meta = ctx.meta.clone();
    meta.body = Some(json!({"logs": records.len()}));
    let actor = crate::store::Actor {
        principal: &ctx.principal,
        request: &meta,
    };
    let ids = app.store.insert_external_logs(actor, &records).await?;
    let total = ids.len() as i64;
    Ok(list_envelope(
        total,
        ids.into_iter()
            .map(|id| json!({"id": id, "object": "log"}))
            .collect(),
    ))
}

// ----- exports -----

/// `POST /v1/logs/exports`: a draft export of the logs its filters select; `{id, total,
/// object: "export"}` (`total`: how many logs match now).
#[utoipa::path(
    post,
    path = "/v1/logs/exports",
    operation_id = "createLogExport",
    tag = tag::LOG_EXPORTS,
    summary = "Create a log export",
    description = "A draft export of the logs its filters select.",
    request_body = ExportBody,
    responses(
        (status = 200, description = "The draft, and how many logs match now.", body = ExportSaved),
        (status = 400, description = "An invalid body.", body = ErrorBody),
        (status = 404, description = "No workspace `workspace_id` (AB02).", body = ErrorBody),
    )
)]
pub async fn create_export(State(app): State<AppState>, ctx: Ctx) -> Result<Json<Value>> {
    let body: ExportBody = ctx.json()?;
    let new = export_of(&app.store, &ctx.principal, body, None).await?;
    let (id, total) = app.store.create_log_export(ctx.actor(), &new).await?;
    Ok(Json(json!({"id": id, "total": total, "object": "export"})))
}

/// `GET /v1/logs/exports`: newest first; `workspace_id` filters (a workspace key lists its
/// workspace's).
#[utoipa::path(
    get,
    path = "/v1/logs/exports",
    operation_id = "listLogExports",
    tag = tag::LOG_EXPORTS,
    summary = "List log exports",
    description = "Newest first.",
    params(ExportListQuery),
    responses(
        (status = 200, description = "A page of exports.", body = ListEnvelope),
        (status = 400, description = "An invalid query.", body = ErrorBody),
        (status = 404, description = "No workspace `workspace_id` (AB02).", body = ErrorBody),
    )
)]
pub async fn list_exports(State(app): State<AppState>, ctx: Ctx) -> Result<Json<Value>> {
    let q: ExportListQuery = ctx.query()?;
    let page = Page::new(q.page_size, q.current_page)?;
    let p = &ctx.principal;
    let ws = scope(&app.store, p, Op::Export, q.workspace_id.as_deref()).await?;
    let (total, list) = app
        .store
        .log_exports(&p.organisation_id, ws.as_deref(), page)
        .await?;
    Ok(list_envelope(
        total,
        list.iter().map(LogExport::to_json).collect(),
    ))
}

/// `GET /v1/logs/exports/{id}`.
#[utoipa::path(
    get,
    path = "/v1/logs/exports/{id}",
    operation_id = "getLogExport",
    tag = tag::LOG_EXPORTS,
    summary = "Get a log export",
    params(
        ("id" = String, Path, description = "The export's id (a UUID)."),
    ),
    responses(
        (status = 200, description = "The export.", body = Object),
        (status = 400, description = "A malformed id.", body = ErrorBody),
        (status = 404, description = "No such export.", body = ErrorBody),
    )
)]
pub async fn get_export(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let export = export(&app.store, &ctx.principal, &id).await?;
    Ok(Json(export.to_json()))
}

/// `PUT /v1/logs/exports/{id}`: changes a draft (fields not sent are kept); `{id, total,
/// object: "export"}`. 409 once it has started or was cancelled.
#[utoipa::path(
    put,
    path = "/v1/logs/exports/{id}",
    operation_id = "updateLogExport",
    tag = tag::LOG_EXPORTS,
    summary = "Update a draft log export",
    description = "Fields not sent are kept.",
    params(
        ("id" = String, Path, description = "The export's id (a UUID)."),
    ),
    request_body = ExportBody,
    responses(
        (status = 200, description = "The draft, and how many logs match now.", body = ExportSaved),
        (status = 400, description = "A malformed id or an invalid body.", body = ErrorBody),
        (status = 404, description = "No such export (AB08), or no workspace `workspace_id` (AB02).", body = ErrorBody),
        (status = 409, description = "The export has started or was cancelled.", body = ErrorBody),
    )
)]
pub async fn update_export(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let body: ExportBody = ctx.json()?;
    let current = export(&app.store, &ctx.principal, &id).await?;
    let new = export_of(&app.store, &ctx.principal, body, Some(&current)).await?;
    let total = app
        .store
        .update_log_export(ctx.actor(), &current, &new)
        .await?;
    Ok(Json(
        json!({"id": current.id, "total": total, "object": "export"}),
    ))
}

/// `POST /v1/logs/exports/{id}/start`: writes the matching logs (oldest first) as JSON lines
/// of the requested fields; the export is then `success` and can be downloaded.
#[utoipa::path(
    post,
    path = "/v1/logs/exports/{id}/start",
    operation_id = "startLogExport",
    tag = tag::LOG_EXPORTS,
    summary = "Run a log export",
    description = "Writes the matching logs (oldest first) as JSON lines of the requested fields; the export can then be downloaded.",
    params(
        ("id" = String, Path, description = "The export's id (a UUID)."),
    ),
    responses(
        (status = 200, description = "The export has run.", body = ExportStarted),
        (status = 400, description = "A malformed id, or a body with fields.", body = ErrorBody),
        (status = 404, description = "No such export.", body = ErrorBody),
        (status = 409, description = "The export is not a draft.", body = ErrorBody),
    )
)]
pub async fn start_export(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let _: NoBody = ctx.json()?;
    let export = export(&app.store, &ctx.principal, &id).await?;
    let total = app.store.start_log_export(ctx.actor(), &export).await?;
    Ok(Json(json!({
        "id": export.id,
        "status": "success",
        "total": total,
        "message": format!("the export holds {total} logs; download it from /v1/logs/exports/{}/download", export.id),
        "object": "export",
    })))
}

/// `POST /v1/logs/exports/{id}/cancel`: a draft is cancelled; 409 for a finished export.
#[utoipa::path(
    post,
    path = "/v1/logs/exports/{id}/cancel",
    operation_id = "cancelLogExport",
    tag = tag::LOG_EXPORTS,
    summary = "Cancel a draft log export",
    params(
        ("id" = String, Path, description = "The export's id (a UUID)."),
    ),
    responses(
        (status = 200, description = "Cancelled.", body = ExportCancelled),
        (status = 400, description = "A malformed id, or a body with fields.", body = ErrorBody),
        (status = 404, description = "No such export.", body = ErrorBody),
        (status = 409, description = "The export has finished.", body = ErrorBody),
    )
)]
pub async fn cancel_export(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ctx: Ctx,
) -> Result<Json<Value>> {
    let _: NoBody = ctx.json()?;
    let export = export(&app.store, &ctx.principal, &id).await?;
    app.store.cancel_log_export(ctx.actor(), &export).await?;
    Ok(Json(json!({
        "id": export.id,
        "status": "cancelled",
        "message": "the export is cancelled",
        "object": "export",
    })))
}

/// `GET /v1/logs/exports/{id}/download`: the export's JSON lines (`application/x-ndjson`);
/// 409 before it has run.
#[utoipa::path(
    get,
    path = "/v1/logs/exports/{id}/download",
    operation_id = "downloadLogExport",
    tag = tag::LOG_EXPORTS,
    summary = "Download a log export",
    params(
        ("id" = String, Path, description = "The export's id (a UUID)."),
    ),
    responses(
        (status = 200, description = "The export's logs, one JSON object a line.", body = String, content_type = "application/x-ndjson",
            headers(("content-disposition" = String, description = "`attachment; filename=\"logs-export-<id>.jsonl\"`"))),
        (status = 400, description = "A malformed id.", body = ErrorBody),
        (status = 404, description = "No such export.", body = ErrorBody),
        (status = 409, description = "The export has not run.", body = ErrorBody),
    )
)]
pub async fn download_export(
    State(app): State<AppState>,
    PathParams(id): PathParams<String>,
    ctx: Ctx,
) -> Result<Response> {
    let export = export(&app.store, &ctx.principal, &id).await?;
    let data = app.store.log_export_data(&export).await?;
    let mut resp = data.into_response();
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    if let Ok(v) = HeaderValue::from_str(&format!(
        "attachment; filename=\"logs-export-{}.jsonl\"",
        export.id
    )) {
        headers.insert(header::CONTENT_DISPOSITION, v);
    }
    Ok(resp)
}

// ----- shared -----

/// The export of the path, when the caller may export its workspace's logs: 400 for a
/// malformed id, 404 when there is none, 403 without the right.
async fn export(store: &Store, p: &Principal, id: &str) -> Result<LogExport> {
    let id = validate::uuid("id", id)?;
    let export = store
        .log_export(&p.organisation_id, &id)
        .await?
        .ok_or_else(|| AdminError::not_found(format!("no log export {id}")))?;
    authz::allowed(
        p,
        &Action::new(Resource::Logs, Op::Export),
        export.workspace_id.as_deref(),
    )?;
    Ok(export)
}

/// A new export, or a draft's new state (`current`: fields not sent are kept), checked and
/// confined to the workspace the caller may export: `workspace_id` (top level or in
/// `filters`, the same one if both), else a workspace key's own.
async fn export_of(
    store: &Store,
    p: &Principal,
    body: ExportBody,
    current: Option<&LogExport>,
) -> Result<NewLogExport> {
    let mut filters = match body.filters {
        Some(f) => checked_filter(f)?,
        None => current.map(|c| c.filters.clone()).unwrap_or_default(),
    };
    let given = match (&body.workspace_id, &filters.workspace_id) {
        (Some(a), Some(b)) if a != b => {
            return Err(AdminError::field(
                "filters.workspace_id",
                "names another workspace than workspace_id; send one of them",
            ))
        }
        (Some(a), _) => Some(a.clone()),
        (None, Some(b)) => Some(b.clone()),
        (None, None) => current.and_then(|c| c.workspace_id.clone()),
    };
    let workspace_id = scope(store, p, Op::Export, given.as_deref()).await?;
    filters.workspace_id = workspace_id.clone();
    let requested_data = match body.requested_data {
        Some(fields) => checked_fields(fields)?,
        None => current
            .map(|c| c.requested_data.clone())
            .unwrap_or_default(),
    };
    let description = match body.description {
        Some(d) => validate::description(Some(d))?,
        None => current.and_then(|c| c.description.clone()),
    };
    Ok(NewLogExport {
        workspace_id,
        description,
        filters,
        requested_data,
    })
}

/// The workspace an operation on logs is confined to, when the caller may do it there: the
/// one named (id or slug; a deleted workspace's logs remain and are named by id), a workspace
/// key's own, or none (the whole organisation) for an admin key.
async fn scope(
    store: &Store,
    p: &Principal,
    op: Op,
    given: Option<&str>,
) -> Result<Option<String>> {
    let workspace_id = match given {
        Some(ws) => {
            validate::max_len("workspace_id", ws, MAX_FILTER)?;
            Some(
                store
                    .workspace(&p.organisation_id, ws)
                    .await?
                    .map(|w| w.id)
                    .unwrap_or_else(|| ws.to_owned()),
            )
        }
        None => p.workspace_id().map(str::to_owned),
    };
    authz::allowed(p, &Action::new(Resource::Logs, op), workspace_id.as_deref())?;
    Ok(workspace_id)
}

/// Checks a filter: text values at most 255 characters, an HTTP status, RFC 3339 times (kept
/// in the stored form, UTC), the earliest not after the latest.
fn checked_filter(mut f: LogFilter) -> Result<LogFilter> {
    for (field, v) in [
        ("workspace_id", &f.workspace_id),
        ("trace_id", &f.trace_id),
        ("api_key_id", &f.api_key_id),
        ("provider", &f.provider),
        ("model", &f.model),
    ] {
        if let Some(v) = v {
            validate::max_len(field, v, MAX_FILTER)?;
        }
    }
    if let Some(code) = f.status_code {
        if !(100..=599).contains(&code) {
            return Err(AdminError::field(
                "status_code",
                format!("must be an HTTP status (100 to 599), got {code}"),
            ));
        }
    }
    let min = f
        .time_of_generation_min
        .as_deref()
        .map(|t| validate::timestamp("time_of_generation_min", t))
        .transpose()?;
    let max = f
        .time_of_generation_max
        .as_deref()
        .map(|t| validate::timestamp("time_of_generation_max", t))
        .transpose()?;
    if let (Some(a), Some(b)) = (min, max) {
        if b < a {
            return Err(AdminError::field(
                "time_of_generation_max",
                "must not be before time_of_generation_min",
            ));
        }
    }
    f.time_of_generation_min = min.map(crate::time::format);
    f.time_of_generation_max = max.map(crate::time::format);
    Ok(f)
}

/// `requested_data`: names of log fields, each once.
fn checked_fields(fields: Vec<String>) -> Result<Vec<String>> {
    let mut out: Vec<String> = Vec::with_capacity(fields.len());
    for (i, f) in fields.into_iter().enumerate() {
        if !LOG_FIELDS.contains(&f.as_str()) {
            return Err(AdminError::field(
                &format!("requested_data[{i}]"),
                format!("unknown field {f:?}; a log has {}", LOG_FIELDS.join(", ")),
            ));
        }
        if !out.contains(&f) {
            out.push(f);
        }
    }
    Ok(out)
}

/// `value` as `T`, a problem named by its path under `at` (`[2].response.status`).
fn parse_at<T: DeserializeOwned>(at: &str, value: Value) -> Result<T> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let message = e.into_inner().to_string();
        let field = match (at.is_empty(), path == ".") {
            (true, true) => String::new(),
            (true, false) => path,
            (false, true) => at.to_owned(),
            (false, false) => format!("{at}.{path}"),
        };
        if field.is_empty() {
            AdminError::validation(message)
        } else {
            AdminError::field(&field, message)
        }
    })
}

/// A stored body: JSON text with secrets redacted (a string is kept as it is).
fn body_text(body: Option<Value>) -> Option<String> {
    match body? {
        Value::Null => None,
        Value::String(s) => Some(s),
        other => Some(redact(other).to_string()),
    }
}

/// The record of one inserted log.
fn external_record(p: &Principal, at: &str, log: ExternalLog) -> Result<LogRecord> {
    let field = |name: &str| {
        if at.is_empty() {
            name.to_owned()
        } else {
            format!("{at}.{name}")
        }
    };
    let status = log.response.status.unwrap_or(200);
    if !(100..=599).contains(&status) {
        return Err(AdminError::field(
            &field("response.status"),
            format!("must be an HTTP status (100 to 599), got {status}"),
        ));
    }
    let latency = log
        .response
        .response_time
        .or(log.response.time)
        .unwrap_or(0.0);
    if !latency.is_finite() || latency < 0.0 {
        return Err(AdminError::field(
            &field("response.response_time"),
            format!("must be a number of milliseconds >= 0, got {latency}"),
        ));
    }
    let method = log.request.method.unwrap_or_else(|| "POST".into());
    validate::max_len(&field("request.method"), &method, 16)?;
    let url = log.request.url.unwrap_or_default();
    validate::max_len(&field("request.url"), &url, MAX_URL)?;
    if let Some(provider) = &log.request.provider {
        validate::max_len(&field("request.provider"), provider, MAX_FILTER)?;
    }
    let model = log
        .request
        .body
        .as_ref()
        .and_then(|b| b.get("model"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let usage = log.response.body.as_ref().and_then(|b| b.get("usage"));
    let tokens = |names: [&str; 2]| {
        names
            .iter()
            .find_map(|n| usage.and_then(|u| u.get(*n)).and_then(Value::as_u64))
            .unwrap_or(0)
    };
    let mut metadata = log.metadata.unwrap_or_default();
    let mut take = |names: [&str; 2]| -> Result<Option<String>> {
        let mut found = None;
        for n in names {
            if let Some(v) = metadata.remove(n) {
                let text = match v {
                    Value::String(s) => s,
                    other => other.to_string(),
                };
                validate::max_len(&field(&format!("metadata.{n}")), &text, MAX_FILTER)?;
                found = found.or(Some(text));
            }
        }
        Ok(found)
    };
    let trace_id = take(["trace_id", "traceId"])?;
    let span_id = take(["span_id", "spanId"])?;
    let span_name = take(["span_name", "spanName"])?;
    let parent_span_id = take(["parent_span_id", "parentSpanId"])?;
    Ok(LogRecord {
        id: uuid::Uuid::now_v7().to_string(),
        trace_id: trace_id.unwrap_or_else(|| uuid::Uuid::now_v7().to_string()),
        span_id,
        parent_span_id,
        span_name,
        created_at: None,
        organisation_id: Some(p.organisation_id.clone()),
        workspace_id: p.workspace_id().map(str::to_owned),
        api_key_id: p.key_id.clone(),
        user_id: p.user_id.clone(),
        metadata: metadata_of(&metadata),
        route: "external".into(),
        method: method.to_uppercase(),
        path: url,
        provider: log.request.provider,
        model,
        status: status as u16,
        latency_ms: latency.round() as u64,
        upstream_latency_ms: None,
        prompt_tokens: tokens(["prompt_tokens", "input_tokens"]),
        completion_tokens: tokens(["completion_tokens", "output_tokens"]),
        cost: None,
        cache_status: None,
        retries: 0,
        final_target: None,
        streamed: log.response.streaming_mode.unwrap_or(false),
        error: None,
        request_body: body_text(log.request.body),
        response_body: body_text(log.response.body),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_are_checked_and_times_normalised() {
        let f = checked_filter(LogFilter {
            time_of_generation_min: Some("2026-01-02T03:04:05+02:00".into()),
            ..LogFilter::default()
        })
        .unwrap();
        assert_eq!(
            f.time_of_generation_min.as_deref(),
            Some("2026-01-02T01:04:05.000000Z")
        );
        let bad = [
            (
                LogFilter {
                    status_code: Some(99),
                    ..LogFilter::default()
                },
                "status_code: must be an HTTP status (100 to 599), got 99",
            ),
            (
                LogFilter {
                    time_of_generation_min: Some("2026-01-02T00:00:00Z".into()),
                    time_of_generation_max: Some("2026-01-01T00:00:00Z".into()),
                    ..LogFilter::default()
                },
                "time_of_generation_max: must not be before time_of_generation_min",
            ),
            (
                LogFilter {
                    model: Some("m".repeat(256)),
                    ..LogFilter::default()
                },
                "model: must be at most 255 characters, got 256",
            ),
        ];
        for (f, want) in bad {
            assert_eq!(checked_filter(f).unwrap_err().message, want);
        }
        assert!(checked_filter(LogFilter {
            time_of_generation_max: Some("yesterday".into()),
            ..LogFilter::default()
        })
        .unwrap_err()
        .message
        .starts_with("time_of_generation_max: must be an RFC 3339 time"));
    }

    #[test]
    fn requested_fields_are_known_and_kept_once() {
        assert_eq!(
            checked_fields(vec!["model".into(), "id".into(), "model".into()]).unwrap(),
            vec!["model".to_owned(), "id".to_owned()]
        );
        let e = checked_fields(vec!["id".into(), "colour".into()]).unwrap_err();
        assert!(
            e.message
                .starts_with("requested_data[1]: unknown field \"colour\""),
            "{e:?}"
        );
    }

    #[test]
    fn inserted_logs_name_the_bad_field() {
        let e = parse_at::<ExternalLog>("[1]", json!({"request": {}, "response": {"status": "x"}}))
            .unwrap_err();
        assert!(
            e.message.starts_with("[1].response.status: invalid type"),
            "{e:?}"
        );
        let e = parse_at::<ExternalLog>("", json!({"request": {}})).unwrap_err();
        assert_eq!(e.message, "missing field `response`");
    }
}
