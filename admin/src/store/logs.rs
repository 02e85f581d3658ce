//! Request logs: written in batches by the data plane's log writer (through the control
//! plane's sink) or one at a time with `POST /v1/logs`, listed and read by `GET /v1/logs`, and
//! exported as JSON lines (`/v1/logs/exports`).

use std::collections::BTreeMap;

use plugin_sdk::sinks::LogRecord;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use sqlx::any::AnyRow;
use sqlx::Row;

use super::audit::{self, AuditEntry};
use super::{from_text, to_text, Actor, Store};
use crate::db::{Backend, Sql, Tx};
use crate::error::{AdminError, Result};
use crate::time;
use crate::validate::Page;

/// The fields of a log as the API shows it, in order; `requested_data` of an export names a
/// subset of them.
pub const LOG_FIELDS: &[&str] = &[
    "id",
    "trace_id",
    "span_id",
    "parent_span_id",
    "span_name",
    "created_at",
    "organisation_id",
    "workspace_id",
    "api_key_id",
    "user_id",
    "metadata",
    "route",
    "method",
    "path",
    "provider",
    "model",
    "status_code",
    "latency_ms",
    "upstream_latency_ms",
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "cost",
    "cache_status",
    "retries",
    "final_target",
    "streamed",
    "error",
    "request_body",
    "response_body",
    "source",
];

/// The most logs one export holds: an export matching more is refused when started.
pub const MAX_EXPORT_ROWS: i64 = 100_000;

const COLUMNS: &str = "id, organisation_id, workspace_id, api_key_id, user_id, trace_id, span_id,
    parent_span_id, span_name, created_at, metadata, route, method, path, provider, model,
    status_code, latency_ms, upstream_latency_ms, prompt_tokens, completion_tokens, cost,
    cache_status, retries, final_target, streamed, error, request_body, response_body, source";

/// The columns a list shows: all but the bodies.
const LIST_COLUMNS: &str = "id, organisation_id, workspace_id, api_key_id, user_id, trace_id,
    span_id, parent_span_id, span_name, created_at, metadata, route, method, path, provider,
    model, status_code, latency_ms, upstream_latency_ms, prompt_tokens, completion_tokens, cost,
    cache_status, retries, final_target, streamed, error, NULL AS request_body,
    NULL AS response_body, source";

/// Where a log came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogSource {
    /// A request through this gateway.
    Gateway,
    /// `POST /v1/logs`.
    External,
}

impl LogSource {
    fn as_str(self) -> &'static str {
        match self {
            LogSource::Gateway => "gateway",
            LogSource::External => "external",
        }
    }
}

/// Which logs a listing or an export selects. Times are RFC 3339 (stored normalised to UTC);
/// `None` does not filter.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogFilter {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_code: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_of_generation_min: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_of_generation_max: Option<String>,
}

impl LogFilter {
    /// ` FROM request_logs WHERE ...` for the organisation's logs matching the filter.
    fn condition(&self, organisation_id: &str) -> Sql {
        let mut cond = Sql::new(" FROM request_logs WHERE organisation_id = ");
        cond.text(organisation_id);
        let exact = [
            ("workspace_id", &self.workspace_id),
            ("trace_id", &self.trace_id),
            ("api_key_id", &self.api_key_id),
            ("provider", &self.provider),
            ("model", &self.model),
        ];
        for (column, value) in exact {
            if let Some(v) = value {
                cond.push(&format!(" AND {column} = ")).text(v.clone());
            }
        }
        if let Some(code) = self.status_code {
            cond.push(" AND status_code = ").int(code);
        }
        if let Some(t) = &self.time_of_generation_min {
            cond.push(" AND created_at >= ").text(t.clone());
        }
        if let Some(t) = &self.time_of_generation_max {
            cond.push(" AND created_at <= ").text(t.clone());
        }
        cond
    }
}

/// One stored log.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestLog {
    pub id: String,
    pub organisation_id: String,
    pub workspace_id: Option<String>,
    pub api_key_id: Option<String>,
    pub user_id: Option<String>,
    pub trace_id: String,
    pub span_id: Option<String>,
    pub parent_span_id: Option<String>,
    pub span_name: Option<String>,
    pub created_at: String,
    pub metadata: Value,
    pub route: String,
    pub method: String,
    pub path: String,
    pub provider: Option<String>,
    pub model: Option<String>,
    pub status_code: i64,
    pub latency_ms: i64,
    pub upstream_latency_ms: Option<i64>,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub cost: Option<f64>,
    pub cache_status: Option<String>,
    pub retries: i64,
    pub final_target: Option<String>,
    pub streamed: bool,
    pub error: Option<String>,
    /// `None` when not kept (or in a listing, which leaves bodies out).
    pub request_body: Option<String>,
    pub response_body: Option<String>,
    pub source: String,
}

/// A stored body: JSON when it is JSON, else the text.
fn body_json(body: &Option<String>) -> Value {
    match body {
        None => Value::Null,
        Some(text) => serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.clone())),
    }
}

impl RequestLog {
    /// Every field of [`LOG_FIELDS`].
    pub fn fields(&self) -> Map<String, Value> {
        let v = json!({
            "id": self.id,
            "trace_id": self.trace_id,
            "span_id": self.span_id,
            "parent_span_id": self.parent_span_id,
            "span_name": self.span_name,
            "created_at": self.created_at,
            "organisation_id": self.organisation_id,
            "workspace_id": self.workspace_id,
            "api_key_id": self.api_key_id,
            "user_id": self.user_id,
            "metadata": self.metadata,
            "route": self.route,
            "method": self.method,
            "path": self.path,
            "provider": self.provider,
            "model": self.model,
            "status_code": self.status_code,
            "latency_ms": self.latency_ms,
            "upstream_latency_ms": self.upstream_latency_ms,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens.saturating_add(self.completion_tokens),
            "cost": self.cost,
            "cache_status": self.cache_status,
            "retries": self.retries,
            "final_target": self.final_target,
            "streamed": self.streamed,
            "error": self.error,
            "request_body": body_json(&self.request_body),
            "response_body": body_json(&self.response_body),
            "source": self.source,
        });
        match v {
            Value::Object(map) => map,
            _ => unreachable!("a JSON object"),
        }
    }

    /// The API's log object: every field and `object: "log"`.
    pub fn to_json(&self) -> Value {
        let mut map = self.fields();
        map.insert("object".into(), json!("log"));
        Value::Object(map)
    }

    /// One line of an export: the requested fields (all when none are named), in
    /// [`LOG_FIELDS`] order.
    fn export_line(&self, requested: &[String]) -> String {
        let mut all = self.fields();
        let line: Map<String, Value> = if requested.is_empty() {
            all
        } else {
            LOG_FIELDS
                .iter()
                .filter(|f| requested.iter().any(|r| r == *f))
                .filter_map(|f| all.remove(*f).map(|v| ((*f).to_owned(), v)))
                .collect()
        };
        Value::Object(line).to_string()
    }
}

fn from_row(r: &AnyRow) -> Result<RequestLog> {
    let metadata: String = r.try_get("metadata")?;
    Ok(RequestLog {
        id: r.try_get("id")?,
        organisation_id: r.try_get("organisation_id")?,
        workspace_id: r.try_get("workspace_id")?,
        api_key_id: r.try_get("api_key_id")?,
        user_id: r.try_get("user_id")?,
        trace_id: r.try_get("trace_id")?,
        span_id: r.try_get("span_id")?,
        parent_span_id: r.try_get("parent_span_id")?,
        span_name: r.try_get("span_name")?,
        created_at: r.try_get("created_at")?,
        metadata: from_text("request_logs.metadata", &metadata)?,
        route: r.try_get("route")?,
        method: r.try_get("method")?,
        path: r.try_get("path")?,
        provider: r.try_get("provider")?,
        model: r.try_get("model")?,
        status_code: r.try_get("status_code")?,
        latency_ms: r.try_get("latency_ms")?,
        upstream_latency_ms: r.try_get("upstream_latency_ms")?,
        prompt_tokens: r.try_get("prompt_tokens")?,
        completion_tokens: r.try_get("completion_tokens")?,
        cost: r.try_get("cost")?,
        cache_status: r.try_get("cache_status")?,
        retries: r.try_get("retries")?,
        final_target: r.try_get("final_target")?,
        streamed: r.try_get::<i64, _>("streamed")? != 0,
        error: r.try_get("error")?,
        request_body: r.try_get("request_body")?,
        response_body: r.try_get("response_body")?,
        source: r.try_get("source")?,
    })
}

fn int(x: u64) -> i64 {
    i64::try_from(x).unwrap_or(i64::MAX)
}

/// Rows per INSERT statement (30 values each), by backend. Each statement is a round trip:
/// to PostgreSQL, and for SQLite to the thread sqlx runs its statements on. A batch's last
/// statement holds the rest, so SQLite prepares at most this many distinct statements.
fn rows_per_insert(backend: Backend) -> usize {
    match backend {
        Backend::Sqlite => 32,
        Backend::Postgres => 8,
    }
}

/// Inserts logs in `tx`, several rows per statement; a log whose id is already stored (a
/// batch sent again) is skipped. Records without an organisation are stored under
/// `default_organisation`; without an id or trace id they get a new one. Returns the ids.
///
/// Ids (and generated trace ids) are UUIDv7, ordered by time: each row then lands at the right
/// edge of the indexes on them instead of on a random page. On the in-memory SQLite of the
/// benchmark that cut the database thread's CPU per logged request from 26 us to 9 us.
async fn insert_logs(
    tx: &mut Tx,
    backend: Backend,
    records: &[LogRecord],
    source: LogSource,
    default_organisation: &str,
) -> Result<Vec<String>> {
    let now = time::now();
    let mut ids = Vec::with_capacity(records.len());
    let head = format!("INSERT INTO request_logs ({COLUMNS}) VALUES ");
    for chunk in records.chunks(rows_per_insert(backend)) {
        let mut sql = match backend {
            Backend::Sqlite => Sql::sqlite_anonymous(&head),
            Backend::Postgres => Sql::new(&head),
        };
        for (i, r) in chunk.iter().enumerate() {
            let id = if r.id.is_empty() {
                uuid::Uuid::now_v7().to_string()
            } else {
                r.id.clone()
            };
            let trace_id = if r.trace_id.is_empty() {
                id.clone()
            } else {
                r.trace_id.clone()
            };
            let created_at = r
                .created_at
                .map(chrono::DateTime::<chrono::Utc>::from)
                .unwrap_or(now);
            sql.push(if i == 0 { "(" } else { ", (" });
            sql.text(id.clone()).push(", ");
            sql.text(
                r.organisation_id
                    .clone()
                    .unwrap_or_else(|| default_organisation.to_owned()),
            )
            .push(", ");
            sql.opt_text(r.workspace_id.clone()).push(", ");
            sql.opt_text(r.api_key_id.clone()).push(", ");
            sql.opt_text(r.user_id.clone()).push(", ");
            sql.text(trace_id).push(", ");
            sql.opt_text(r.span_id.clone()).push(", ");
            sql.opt_text(r.parent_span_id.clone()).push(", ");
            sql.opt_text(r.span_name.clone()).push(", ");
            sql.text(time::format(created_at)).push(", ");
            sql.text(to_text(&r.metadata)).push(", ");
            sql.text(r.route.clone()).push(", ");
            sql.text(r.method.clone()).push(", ");
            sql.text(r.path.clone()).push(", ");
            sql.opt_text(r.provider.clone()).push(", ");
            sql.opt_text(r.model.clone()).push(", ");
            sql.int(i64::from(r.status)).push(", ");
            sql.int(int(r.latency_ms)).push(", ");
            sql.opt_int(r.upstream_latency_ms.map(int)).push(", ");
            sql.int(int(r.prompt_tokens)).push(", ");
            sql.int(int(r.completion_tokens)).push(", ");
            sql.opt_float(r.cost.filter(|c| c.is_finite())).push(", ");
            sql.opt_text(r.cache_status.clone()).push(", ");
            sql.int(i64::from(r.retries)).push(", ");
            sql.opt_text(r.final_target.clone()).push(", ");
            sql.int(i64::from(r.streamed)).push(", ");
            sql.opt_text(r.error.clone()).push(", ");
            sql.opt_text(r.request_body.clone()).push(", ");
            sql.opt_text(r.response_body.clone()).push(", ");
            sql.text(source.as_str()).push(")");
            ids.push(id);
        }
        sql.push(" ON CONFLICT (id) DO NOTHING");
        sql.into_query().execute(&mut **tx).await?;
    }
    Ok(ids)
}

/// An export of logs as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct LogExport {
    pub id: String,
    pub organisation_id: String,
    pub workspace_id: Option<String>,
    pub description: Option<String>,
    pub filters: LogFilter,
    /// The fields each line holds; empty: all of them.
    pub requested_data: Vec<String>,
    /// `draft` until started; `success` once its lines are written; `cancelled`.
    pub status: String,
    /// How many logs it matched when made or updated, or holds once started.
    pub total: i64,
    pub created_by: Option<String>,
    pub created_at: String,
    pub last_updated_at: String,
}

impl LogExport {
    pub fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "organisation_id": self.organisation_id,
            "workspace_id": self.workspace_id,
            "description": self.description,
            "filters": self.filters,
            "requested_data": self.requested_data,
            "status": self.status,
            "total": self.total,
            "created_by": self.created_by,
            "created_at": self.created_at,
            "last_updated_at": self.last_updated_at,
            "object": "export",
        })
    }
}

/// An export to make, or the new state of a draft: its filters already carry its workspace.
#[derive(Debug, Clone)]
pub struct NewLogExport {
    pub workspace_id: Option<String>,
    pub description: Option<String>,
    pub filters: LogFilter,
    pub requested_data: Vec<String>,
}

const EXPORT_COLUMNS: &str = "id, organisation_id, workspace_id, description, filters,
    requested_data, status, total, created_by, created_at, last_updated_at";

fn export_from_row(r: &AnyRow) -> Result<LogExport> {
    Ok(LogExport {
        id: r.try_get("id")?,
        organisation_id: r.try_get("organisation_id")?,
        workspace_id: r.try_get("workspace_id")?,
        description: r.try_get("description")?,
        filters: from_text("log_exports.filters", &r.try_get::<String, _>("filters")?)?,
        requested_data: from_text(
            "log_exports.requested_data",
            &r.try_get::<String, _>("requested_data")?,
        )?,
        status: r.try_get("status")?,
        total: r.try_get("total")?,
        created_by: r.try_get("created_by")?,
        created_at: r.try_get("created_at")?,
        last_updated_at: r.try_get("last_updated_at")?,
    })
}

impl Store {
    /// Writes a batch of the data plane's request logs in one transaction (records without
    /// an organisation go to the bootstrap organisation). Not a control-plane request: not in
    /// the audit log.
    pub async fn write_request_logs(&self, records: &[LogRecord]) -> Result<usize> {
        if records.is_empty() {
            return Ok(0);
        }
        let default_org = if records.iter().any(|r| r.organisation_id.is_none()) {
            self.organisation_id().await?.ok_or_else(|| {
                AdminError::internal("logs without an organisation need a bootstrapped database")
            })?
        } else {
            String::new()
        };
        let mut tx = self.db.begin_write().await?;
        let ids = insert_logs(
            &mut tx,
            self.db.backend(),
            records,
            LogSource::Gateway,
            &default_org,
        )
        .await?;
        tx.commit().await?;
        Ok(ids.len())
    }

    /// Stores logs sent with `POST /v1/logs` under the caller's organisation, with the audit
    /// record; returns their ids.
    pub async fn insert_external_logs(
        &self,
        actor: Actor<'_>,
        records: &[LogRecord],
    ) -> Result<Vec<String>> {
        let org = &actor.principal.organisation_id;
        let mut tx = self.db.begin_write().await?;
        let ids = insert_logs(
            &mut tx,
            self.db.backend(),
            records,
            LogSource::External,
            org,
        )
        .await?;
        let mut entry = AuditEntry::new("create", "log").workspace(actor.principal.workspace_id());
        if let [one] = ids.as_slice() {
            entry = entry.resource(one);
        }
        audit::insert(&mut tx, actor, &entry).await?;
        tx.commit().await?;
        Ok(ids)
    }

    /// Logs of the organisation, newest first (without their bodies), and how many match.
    pub async fn request_logs(
        &self,
        organisation_id: &str,
        filter: &LogFilter,
        page: Page,
    ) -> Result<(i64, Vec<RequestLog>)> {
        filter
            .condition(organisation_id)
            .select_page(
                &self.db,
                LIST_COLUMNS,
                "created_at DESC, id DESC",
                page,
                from_row,
            )
            .await
    }

    /// One log of the organisation, with its bodies.
    pub async fn request_log(&self, organisation_id: &str, id: &str) -> Result<Option<RequestLog>> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM request_logs WHERE id = $1 AND organisation_id = $2"
        )))
        .bind(id)
        .bind(organisation_id)
        .fetch_optional(self.db.pool())
        .await?;
        row.as_ref().map(from_row).transpose()
    }

    /// How many of the organisation's logs a filter selects.
    pub async fn count_request_logs(
        &self,
        organisation_id: &str,
        filter: &LogFilter,
    ) -> Result<i64> {
        Ok(filter
            .condition(organisation_id)
            .prefixed("SELECT COUNT(*)")
            .query()
            .fetch_one(self.db.pool())
            .await?
            .try_get(0)?)
    }

    /// Makes a draft export; returns its id and how many logs it matches now.
    pub async fn create_log_export(
        &self,
        actor: Actor<'_>,
        new: &NewLogExport,
    ) -> Result<(String, i64)> {
        let p = actor.principal;
        let total = self
            .count_request_logs(&p.organisation_id, &new.filters)
            .await?;
        let id = uuid::Uuid::new_v4().to_string();
        let now = time::format(time::now());
        let mut tx = self.db.begin_write().await?;
        sqlx::query(
            "INSERT INTO log_exports (id, organisation_id, workspace_id, description, filters,
                 requested_data, status, total, created_by, created_at, last_updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, 'draft', $7, $8, $9, $9)",
        )
        .bind(&id)
        .bind(&p.organisation_id)
        .bind(new.workspace_id.clone())
        .bind(new.description.clone())
        .bind(to_text(&new.filters))
        .bind(to_text(&new.requested_data))
        .bind(total)
        .bind(p.user_id.clone().or_else(|| p.key_id.clone()))
        .bind(&now)
        .execute(&mut *tx)
        .await?;
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("create", "log_export")
                .resource(&id)
                .workspace(new.workspace_id.as_deref()),
        )
        .await?;
        tx.commit().await?;
        Ok((id, total))
    }

    pub async fn log_export(&self, organisation_id: &str, id: &str) -> Result<Option<LogExport>> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {EXPORT_COLUMNS} FROM log_exports WHERE id = $1 AND organisation_id = $2"
        )))
        .bind(id)
        .bind(organisation_id)
        .fetch_optional(self.db.pool())
        .await?;
        row.as_ref().map(export_from_row).transpose()
    }

    /// Exports of the organisation (of one workspace, if given), newest first.
    pub async fn log_exports(
        &self,
        organisation_id: &str,
        workspace_id: Option<&str>,
        page: Page,
    ) -> Result<(i64, Vec<LogExport>)> {
        let mut cond = Sql::new(" FROM log_exports WHERE organisation_id = ");
        cond.text(organisation_id);
        if let Some(ws) = workspace_id {
            cond.push(" AND workspace_id = ").text(ws);
        }
        cond.select_page(
            &self.db,
            EXPORT_COLUMNS,
            "created_at DESC, id DESC",
            page,
            export_from_row,
        )
        .await
    }

    /// Replaces a draft's workspace, description, filters and fields; returns how many logs
    /// it matches now. 409 once the export has started or was cancelled.
    pub async fn update_log_export(
        &self,
        actor: Actor<'_>,
        export: &LogExport,
        new: &NewLogExport,
    ) -> Result<i64> {
        let total = self
            .count_request_logs(&export.organisation_id, &new.filters)
            .await?;
        let mut tx = self.db.begin_write().await?;
        let done = sqlx::query(
            "UPDATE log_exports SET workspace_id = $1, description = $2, filters = $3,
                 requested_data = $4, total = $5, last_updated_at = $6
             WHERE id = $7 AND organisation_id = $8 AND status = 'draft'",
        )
        .bind(new.workspace_id.clone())
        .bind(new.description.clone())
        .bind(to_text(&new.filters))
        .bind(to_text(&new.requested_data))
        .bind(total)
        .bind(time::format(time::now()))
        .bind(&export.id)
        .bind(&export.organisation_id)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Err(not_draft(export));
        }
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("update", "log_export")
                .resource(&export.id)
                .workspace(new.workspace_id.as_deref()),
        )
        .await?;
        tx.commit().await?;
        Ok(total)
    }

    /// Runs a draft export: writes the logs it selects, oldest first, as JSON lines of its
    /// requested fields, and marks it `success`; returns how many lines. Refused (400) when
    /// it selects more than [`MAX_EXPORT_ROWS`] logs, 409 when it is not a draft.
    pub async fn start_log_export(&self, actor: Actor<'_>, export: &LogExport) -> Result<i64> {
        if export.status != "draft" {
            return Err(not_draft(export));
        }
        let mut rows = export.filters.condition(&export.organisation_id);
        rows = rows.prefixed(&format!("SELECT {COLUMNS}"));
        rows.push(" ORDER BY created_at, id LIMIT ")
            .int(MAX_EXPORT_ROWS + 1);
        let rows = rows.query().fetch_all(self.db.pool()).await?;
        if rows.len() as i64 > MAX_EXPORT_ROWS {
            return Err(AdminError::validation(format!(
                "the export selects more than {MAX_EXPORT_ROWS} logs, the most one export holds: \
                 narrow its filters (time_of_generation_min/max)"
            )));
        }
        let mut data = String::new();
        for r in &rows {
            data.push_str(&from_row(r)?.export_line(&export.requested_data));
            data.push('\n');
        }
        let total = rows.len() as i64;
        let mut tx = self.db.begin_write().await?;
        let done = sqlx::query(
            "UPDATE log_exports SET status = 'success', data = $1, total = $2, last_updated_at = $3
             WHERE id = $4 AND organisation_id = $5 AND status = 'draft'",
        )
        .bind(data)
        .bind(total)
        .bind(time::format(time::now()))
        .bind(&export.id)
        .bind(&export.organisation_id)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Err(AdminError::conflict(format!(
                "the export {} changed while it was being written; read it again",
                export.id
            )));
        }
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("start", "log_export")
                .resource(&export.id)
                .workspace(export.workspace_id.as_deref()),
        )
        .await?;
        tx.commit().await?;
        Ok(total)
    }

    /// Cancels an export that has not finished (a draft); 409 for one that has.
    pub async fn cancel_log_export(&self, actor: Actor<'_>, export: &LogExport) -> Result<()> {
        let mut tx = self.db.begin_write().await?;
        let done = sqlx::query(
            "UPDATE log_exports SET status = 'cancelled', last_updated_at = $1
             WHERE id = $2 AND organisation_id = $3 AND status IN ('draft', 'in_progress')",
        )
        .bind(time::format(time::now()))
        .bind(&export.id)
        .bind(&export.organisation_id)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Err(AdminError::conflict(format!(
                "the export {} is {}: only an unfinished export is cancelled",
                export.id, export.status
            )));
        }
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("cancel", "log_export")
                .resource(&export.id)
                .workspace(export.workspace_id.as_deref()),
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The JSON lines of a finished export; 409 when it has not run.
    pub async fn log_export_data(&self, export: &LogExport) -> Result<String> {
        let data: Option<String> = sqlx::query_scalar(
            "SELECT data FROM log_exports WHERE id = $1 AND organisation_id = $2 AND status = 'success'",
        )
        .bind(&export.id)
        .bind(&export.organisation_id)
        .fetch_optional(self.db.pool())
        .await?
        .flatten();
        data.ok_or_else(|| {
            AdminError::conflict(format!(
                "the export {} is {}: start it (POST .../start) before downloading it",
                export.id, export.status
            ))
        })
    }
}

fn not_draft(export: &LogExport) -> AdminError {
    AdminError::conflict(format!(
        "the export {} is {}: only a draft is changed or started",
        export.id, export.status
    ))
}

/// Metadata as stored: string values (others as their JSON text).
pub fn metadata_of(map: &Map<String, Value>) -> BTreeMap<String, String> {
    map.iter()
        .map(|(k, v)| {
            let v = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (k.clone(), v)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log() -> RequestLog {
        RequestLog {
            id: "l1".into(),
            organisation_id: "o".into(),
            workspace_id: Some("w".into()),
            api_key_id: None,
            user_id: None,
            trace_id: "t".into(),
            span_id: None,
            parent_span_id: None,
            span_name: None,
            created_at: "2026-01-01T00:00:00.000000Z".into(),
            metadata: json!({"_user": "alice"}),
            route: "chat.completions".into(),
            method: "POST".into(),
            path: "/v1/chat/completions".into(),
            provider: Some("openai".into()),
            model: Some("gpt-4o".into()),
            status_code: 200,
            latency_ms: 12,
            upstream_latency_ms: Some(10),
            prompt_tokens: 3,
            completion_tokens: 4,
            cost: Some(0.5),
            cache_status: None,
            retries: 0,
            final_target: None,
            streamed: false,
            error: None,
            request_body: Some(r#"{"model":"gpt-4o"}"#.into()),
            response_body: Some("not json".into()),
            source: "gateway".into(),
        }
    }

    #[test]
    fn every_field_is_shown_and_exports_pick_theirs() {
        let l = log();
        let all = l.fields();
        let mut names: Vec<&str> = all.keys().map(String::as_str).collect();
        names.sort_unstable();
        let mut want: Vec<&str> = LOG_FIELDS.to_vec();
        want.sort_unstable();
        assert_eq!(names, want);
        assert_eq!(all["total_tokens"], 7);
        assert_eq!(all["request_body"], json!({"model": "gpt-4o"}));
        assert_eq!(all["response_body"], "not json");
        let line = l.export_line(&["model".into(), "id".into()]);
        assert_eq!(line, r#"{"id":"l1","model":"gpt-4o"}"#);
        let full: Value = serde_json::from_str(&l.export_line(&[])).unwrap();
        assert_eq!(full.as_object().unwrap().len(), LOG_FIELDS.len());
    }

    #[test]
    fn filters_refuse_unknown_fields() {
        let f: std::result::Result<LogFilter, _> =
            serde_json::from_value(json!({"trace_id": "t", "colour": "red"}));
        assert!(f
            .unwrap_err()
            .to_string()
            .contains("unknown field `colour`"));
        let f: LogFilter = serde_json::from_value(json!({"status_code": 200})).unwrap();
        assert_eq!(to_text(&f), r#"{"status_code":200}"#);
    }
}
