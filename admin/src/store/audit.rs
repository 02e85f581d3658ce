//! The audit log: one row per control-plane write, inserted in the write's own transaction;
//! events the data plane reports; and control-plane calls refused with 401 or 403
//! ([`Store::record_refused`], bounded per second by `crate::api`, the excess summarised by
//! [`Store::record_refusal_summary`]).

use serde_json::{json, Map, Value};
use sqlx::any::AnyRow;
use sqlx::Row;

use super::{Actor, Store};
use crate::db::{Sql, Tx};
use crate::error::Result;
use crate::time::{self, Timestamp};
use crate::validate::Page;

/// The request behind a write.
#[derive(Debug, Clone, Default)]
pub struct RequestMeta {
    pub method: String,
    /// Path and query.
    pub uri: String,
    pub request_id: String,
    pub client_ip: Option<String>,
    /// The JSON body with its secrets redacted ([`redact`]); `None` without a body.
    pub body: Option<Value>,
}

impl RequestMeta {
    /// Keeps a request body for the audit log, its secrets redacted. A body that is not JSON
    /// is kept only as its length.
    pub fn with_body(mut self, body: &[u8]) -> RequestMeta {
        if body.iter().all(u8::is_ascii_whitespace) {
            self.body = None;
        } else {
            self.body = Some(match serde_json::from_slice::<Value>(body) {
                Ok(v) => redact(v),
                Err(_) => json!({"unparsed_bytes": body.len()}),
            });
        }
        self
    }
}

/// What a write did.
#[derive(Debug, Clone)]
pub struct AuditEntry {
    pub action: &'static str,
    pub resource_type: &'static str,
    pub resource_id: Option<String>,
    pub workspace_id: Option<String>,
    /// The things a bulk action changed, by id (listed as `resource_ids`).
    pub resource_ids: Vec<String>,
}

impl AuditEntry {
    pub fn new(action: &'static str, resource_type: &'static str) -> AuditEntry {
        AuditEntry {
            action,
            resource_type,
            resource_id: None,
            workspace_id: None,
            resource_ids: Vec::new(),
        }
    }

    /// The workspace of a bulk action: the one all its items belong to, none when they differ.
    pub fn workspace_of_all<'a>(
        self,
        items: impl IntoIterator<Item = Option<&'a str>>,
    ) -> AuditEntry {
        let mut items = items.into_iter();
        let first = items.next().flatten();
        let shared = items.all(|w| w == first);
        self.workspace(if shared { first } else { None })
    }

    /// The items of a bulk action.
    pub fn items(mut self, ids: Vec<String>) -> AuditEntry {
        self.resource_ids = ids;
        self
    }

    pub fn resource(mut self, id: &str) -> AuditEntry {
        self.resource_id = Some(id.to_owned());
        self
    }

    pub fn workspace(mut self, id: Option<&str>) -> AuditEntry {
        self.workspace_id = id.map(str::to_owned);
        self
    }
}

const REDACTED: &str = "[REDACTED]";

/// Field names whose values are secrets: `key`, `api_key`, `password`, `token`, `secret`,
/// `authorization`, `*_key` such as `aws_secret_access_key`...
pub fn is_secret_name(name: &str) -> bool {
    let n: String = name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_lowercase())
        .collect();
    n == "key"
        || n.ends_with("key")
        || n.contains("apikey")
        || n.contains("secret")
        || n.contains("password")
        || n.contains("passwd")
        || n.contains("token") && !n.contains("tokens")
        || n.contains("authorization")
        || n.contains("credential")
        || n.contains("privatekey")
}

/// Replaces every string or number under a secret-like name with `[REDACTED]`, at any depth.
/// A plain `key` inside a list item names something (`conditions: [{key, value}]`,
/// `group_by: [{key}]`, tags) rather than holding a secret, so it is kept there.
pub fn redact(value: Value) -> Value {
    redact_in(value, false)
}

fn redact_in(value: Value, list_item: bool) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| {
                    let names_a_thing = list_item && k == "key";
                    let v = match v {
                        Value::String(_) | Value::Number(_)
                            if is_secret_name(&k) && !names_a_thing =>
                        {
                            Value::String(REDACTED.into())
                        }
                        other => redact_in(other, false),
                    };
                    (k, v)
                })
                .collect::<Map<_, _>>(),
        ),
        Value::Array(items) => Value::Array(
            items
                .into_iter()
                .map(|item| redact_in(item, true))
                .collect(),
        ),
        other => other,
    }
}

/// Records a successful write (status 200) in the write's transaction.
pub(crate) async fn insert(tx: &mut Tx, actor: Actor<'_>, entry: &AuditEntry) -> Result<()> {
    let p = actor.principal;
    let r = actor.request;
    sqlx::query(
        "INSERT INTO audit_logs (id, timestamp, organisation_id, workspace_id, user_id, user_type,
             api_key_id, action, resource_type, resource_id, method, uri, request_id, request_body,
             response_status_code, client_ip, resource_ids)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)",
    )
    .bind(uuid::Uuid::new_v4().to_string())
    .bind(time::format(time::now()))
    .bind(&p.organisation_id)
    .bind(
        entry
            .workspace_id
            .clone()
            .or_else(|| p.workspace_id().map(str::to_owned)),
    )
    .bind(p.user_id.clone())
    .bind(p.user_type())
    .bind(p.key_id.clone())
    .bind(entry.action)
    .bind(entry.resource_type)
    .bind(entry.resource_id.clone())
    .bind(&r.method)
    .bind(&r.uri)
    .bind(&r.request_id)
    .bind(r.body.as_ref().map(Value::to_string))
    .bind(200_i64)
    .bind(r.client_ip.clone())
    .bind((!entry.resource_ids.is_empty()).then(|| super::to_text(&entry.resource_ids)))
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Records a change made by the gateway itself (the expiry worker), not by a request.
pub(crate) async fn insert_system(
    tx: &mut Tx,
    organisation_id: &str,
    entry: &AuditEntry,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO audit_logs (id, timestamp, organisation_id, workspace_id, user_type, action,
             resource_type, resource_id, method, uri, request_id, response_status_code)
         VALUES ($1, $2, $3, $4, 'system', $5, $6, $7, '', '', $8, 200)",
    )
    .bind(uuid::Uuid::new_v4().to_string())
    .bind(time::format(time::now()))
    .bind(organisation_id)
    .bind(entry.workspace_id.clone())
    .bind(entry.action)
    .bind(entry.resource_type)
    .bind(entry.resource_id.clone())
    .bind(uuid::Uuid::new_v4().to_string())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// `user_type` of an event the data plane reports: `jwt` for a token's events (a refused
/// JWT), `system` for the rest (a budget's alert).
fn event_user_type(e: &plugin_sdk::sinks::AuditEvent) -> &'static str {
    if e.resource_type == "jwt" || e.action.starts_with("auth.jwt") || e.action.starts_with("jwt") {
        "jwt"
    } else {
        "system"
    }
}

impl Store {
    /// Records events the data plane reports (a refused JWT, a budget's alert), in one
    /// transaction: each under its organisation, or the bootstrap organisation when it has
    /// none; `request_body` holds its details with secrets redacted. An event about an API key
    /// names it as `api_key_id`.
    pub async fn record_audit_events(
        &self,
        events: &[plugin_sdk::sinks::AuditEvent],
    ) -> Result<()> {
        if events.is_empty() {
            return Ok(());
        }
        let fallback = if events.iter().any(|e| e.organisation_id.is_none()) {
            self.organisation_id().await?.ok_or_else(|| {
                crate::error::AdminError::internal(
                    "audit events without an organisation need a bootstrapped database",
                )
            })?
        } else {
            String::new()
        };
        let mut tx = self.db.begin_write().await?;
        for e in events {
            let details = match &e.details {
                Value::Null => None,
                d => Some(redact(d.clone()).to_string()),
            };
            let request_id = if e.request_id.is_empty() {
                uuid::Uuid::new_v4().to_string()
            } else {
                e.request_id.clone()
            };
            let api_key_id = (e.resource_type == "api_key")
                .then(|| e.resource_id.clone())
                .flatten();
            sqlx::query(
                "INSERT INTO audit_logs (id, timestamp, organisation_id, workspace_id, user_id,
                     user_type, api_key_id, action, resource_type, resource_id, method, uri,
                     request_id, request_body, response_status_code, client_ip)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)",
            )
            .bind(uuid::Uuid::new_v4().to_string())
            .bind(time::format(time::now()))
            .bind(
                e.organisation_id
                    .clone()
                    .unwrap_or_else(|| fallback.clone()),
            )
            .bind(e.workspace_id.clone())
            .bind(e.user_id.clone())
            .bind(event_user_type(e))
            .bind(api_key_id)
            .bind(&e.action)
            .bind(&e.resource_type)
            .bind(e.resource_id.clone())
            .bind(&e.method)
            .bind(&e.uri)
            .bind(request_id)
            .bind(details)
            .bind(i64::from(e.status))
            .bind(e.client_ip.clone())
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }
}

/// A control-plane call refused with 401 or 403, as the audit log records it (action
/// `refused`). The presented key is never part of it: only its SHA-256, to find the key, which
/// is not stored either.
#[derive(Debug, Clone)]
pub struct RefusedAttempt {
    pub method: String,
    /// Path and query (values of secret-like query parameters redacted by the caller).
    pub uri: String,
    pub request_id: String,
    pub client_ip: Option<String>,
    /// 401 or 403.
    pub status: u16,
    /// What the route acts on (`workspace`, `api_key`...).
    pub resource_type: &'static str,
    /// Why it was refused: the error message the caller received.
    pub reason: String,
    /// The SHA-256 (hex) of the presented key; `None` when no key was sent.
    pub key_hash: Option<String>,
}

/// Refused calls of one status that were counted but not recorded one by one (beyond the
/// per-second bound of [`crate::api::RouterOptions::refused_records_per_second`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusalSummary {
    pub status: u16,
    pub count: u64,
    pub first_at: Timestamp,
    pub last_at: Timestamp,
    /// The bound that was in force.
    pub per_second: u32,
}

impl Store {
    /// Records a refused call. A key that exists (even expired or rotated away) is named by
    /// its id, with its organisation, workspace and user; an unknown key or none is recorded
    /// under the bootstrap organisation with `user_type` `anonymous`. Nothing is recorded on a
    /// database that was never bootstrapped.
    pub async fn record_refused(&self, r: &RefusedAttempt) -> Result<()> {
        let key = match &r.key_hash {
            // A rotated key's previous value, whenever its transition ended.
            Some(hash) => self.key_by_hash(hash, "").await?,
            None => None,
        };
        let (organisation_id, workspace_id, user_id, user_type, api_key_id) = match key {
            Some(k) => {
                let kind: String = k.try_get("type")?;
                let user: Option<String> = k.try_get("user_id")?;
                let creator: Option<String> = k.try_get("created_by_user_id")?;
                (
                    k.try_get::<String, _>("organisation_id")?,
                    k.try_get::<Option<String>, _>("workspace_id")?,
                    user.or(creator),
                    if kind == "workspace-user" {
                        "user"
                    } else {
                        "api_key"
                    },
                    Some(k.try_get::<String, _>("id")?),
                )
            }
            None => match self.organisation_id().await? {
                Some(org) => (org, None, None, "anonymous", None),
                None => return Ok(()),
            },
        };
        sqlx::query(
            "INSERT INTO audit_logs (id, timestamp, organisation_id, workspace_id, user_id,
                 user_type, api_key_id, action, resource_type, resource_id, method, uri,
                 request_id, request_body, response_status_code, client_ip)
             VALUES ($1, $2, $3, $4, $5, $6, $7, 'refused', $8, NULL, $9, $10, $11, $12, $13, $14)",
        )
        .bind(uuid::Uuid::new_v4().to_string())
        .bind(time::format(time::now()))
        .bind(organisation_id)
        .bind(workspace_id)
        .bind(user_id)
        .bind(user_type)
        .bind(api_key_id)
        .bind(r.resource_type)
        .bind(&r.method)
        .bind(&r.uri)
        .bind(&r.request_id)
        .bind(json!({"reason": r.reason}).to_string())
        .bind(i64::from(r.status))
        .bind(r.client_ip.clone())
        .execute(self.db.pool())
        .await?;
        Ok(())
    }

    /// Records refused calls that were only counted, as one record (action `refused`,
    /// resource type `control_plane`, `user_type` `system`, the status they were refused with)
    /// under the bootstrap organisation; `request_body` holds
    /// `{summary: true, refused: count, first_at, last_at, records_per_second}`.
    pub async fn record_refusal_summary(&self, s: &RefusalSummary) -> Result<()> {
        let Some(org) = self.organisation_id().await? else {
            return Ok(());
        };
        let body = json!({
            "summary": true,
            "refused": s.count,
            "first_at": time::format(s.first_at),
            "last_at": time::format(s.last_at),
            "records_per_second": s.per_second,
        });
        sqlx::query(
            "INSERT INTO audit_logs (id, timestamp, organisation_id, user_type, action,
                 resource_type, method, uri, request_id, request_body, response_status_code)
             VALUES ($1, $2, $3, 'system', 'refused', 'control_plane', '', '', $4, $5, $6)",
        )
        .bind(uuid::Uuid::new_v4().to_string())
        .bind(time::format(time::now()))
        .bind(org)
        .bind(uuid::Uuid::new_v4().to_string())
        .bind(body.to_string())
        .bind(i64::from(s.status))
        .execute(self.db.pool())
        .await?;
        Ok(())
    }
}

/// Filters of `GET /audit-logs`.
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    pub start_time: Option<Timestamp>,
    pub end_time: Option<Timestamp>,
    pub method: Option<String>,
    pub uri: Option<String>,
    pub user_id: Option<String>,
    pub user_type: Option<String>,
    pub workspace_id: Option<String>,
    pub response_status_code: Option<i64>,
    pub resource_type: Option<String>,
    pub action: Option<String>,
    pub client_ip: Option<String>,
}

impl Store {
    /// Audit records of the organisation, newest first, and how many match in all.
    pub async fn audit_logs(
        &self,
        organisation_id: &str,
        filter: &AuditFilter,
        page: Page,
    ) -> Result<(i64, Vec<Value>)> {
        let mut cond = Sql::new(" FROM audit_logs WHERE organisation_id = ");
        cond.text(organisation_id);
        if let Some(t) = filter.start_time {
            cond.push(" AND timestamp >= ").text(time::format(t));
        }
        if let Some(t) = filter.end_time {
            cond.push(" AND timestamp <= ").text(time::format(t));
        }
        let exact = [
            ("method", filter.method.as_ref().map(|m| m.to_uppercase())),
            ("uri", filter.uri.clone()),
            ("user_id", filter.user_id.clone()),
            ("user_type", filter.user_type.clone()),
            ("workspace_id", filter.workspace_id.clone()),
            ("resource_type", filter.resource_type.clone()),
            ("action", filter.action.clone()),
            ("client_ip", filter.client_ip.clone()),
        ];
        for (column, value) in exact {
            if let Some(v) = value {
                cond.push(&format!(" AND {column} = ")).text(v);
            }
        }
        if let Some(code) = filter.response_status_code {
            cond.push(" AND response_status_code = ").int(code);
        }
        cond.select_page(&self.db, "*", "timestamp DESC, id DESC", page, record)
            .await
    }
}

fn record(r: &AnyRow) -> Result<Value> {
    let body: Option<String> = r.try_get("request_body")?;
    let ids: Option<String> = r.try_get("resource_ids")?;
    let mut record = json!({
        "id": r.try_get::<String, _>("id")?,
        "timestamp": r.try_get::<String, _>("timestamp")?,
        "method": r.try_get::<String, _>("method")?,
        "uri": r.try_get::<String, _>("uri")?,
        "request_id": r.try_get::<String, _>("request_id")?,
        "request_body": body.and_then(|b| serde_json::from_str::<Value>(&b).ok()),
        "user_id": r.try_get::<Option<String>, _>("user_id")?,
        "user_type": r.try_get::<String, _>("user_type")?,
        "api_key_id": r.try_get::<Option<String>, _>("api_key_id")?,
        "organisation_id": r.try_get::<String, _>("organisation_id")?,
        "workspace_id": r.try_get::<Option<String>, _>("workspace_id")?,
        "response_status_code": r.try_get::<i64, _>("response_status_code")?,
        "resource_type": r.try_get::<String, _>("resource_type")?,
        "resource_id": r.try_get::<Option<String>, _>("resource_id")?,
        "action": r.try_get::<String, _>("action")?,
        "client_ip": r.try_get::<Option<String>, _>("client_ip")?,
    });
    // A bulk action's items.
    if let Some(ids) = ids {
        record["resource_ids"] = super::from_text("audit_logs.resource_ids", &ids)?;
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_in_lists_are_not_secrets() {
        let body = serde_json::json!({
            "key": "sk-secret",
            "conditions": [{"key": "metadata._user", "value": "alice"}],
            "group_by": [{"key": "api_key"}],
            "configurations": {"aws_secret_access_key": "s3"},
        });
        let out = redact(body);
        assert_eq!(out["key"], REDACTED);
        assert_eq!(out["conditions"][0]["key"], "metadata._user");
        assert_eq!(out["group_by"][0]["key"], "api_key");
        assert_eq!(out["configurations"]["aws_secret_access_key"], REDACTED);
    }

    #[test]
    fn secrets_are_redacted_at_any_depth() {
        let body = json!({
            "name": "k",
            "key": "sk-1",
            "api_key": "sk-2",
            "nested": {"aws_secret_access_key": "x", "password": "p", "list": [{"token": "t"}]},
            "usage_limits": {"type": "tokens", "credit_limit": 5},
            "max_tokens": 10,
            "scopes": ["configs.read"],
        });
        let got = redact(body);
        assert_eq!(
            got,
            json!({
                "name": "k",
                "key": REDACTED,
                "api_key": REDACTED,
                "nested": {"aws_secret_access_key": REDACTED, "password": REDACTED, "list": [{"token": REDACTED}]},
                "usage_limits": {"type": "tokens", "credit_limit": 5},
                "max_tokens": 10,
                "scopes": ["configs.read"],
            })
        );
        let meta = RequestMeta::default().with_body(b"not json");
        assert_eq!(meta.body, Some(json!({"unparsed_bytes": 8})));
    }
}
