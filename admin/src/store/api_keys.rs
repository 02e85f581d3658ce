//! API keys at rest: the raw key is never stored, only its SHA-256 and a masked form.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{json, Value};
use sqlx::any::AnyRow;
use sqlx::Row;

use super::audit::{self, AuditEntry};
use super::usage;
use super::{from_text, to_text, Actor, Store};
use crate::authz::KeyKind;
use crate::db::{Sql, Tx};
use crate::error::{AdminError, Result};
use crate::keys;
use crate::time::{self, Timestamp};
use crate::validate::{Page, RateLimit, UsageLimits};

/// A key to create. The raw key is made here (or given, for the bootstrap key).
#[derive(Debug, Clone)]
pub struct NewKey {
    pub kind: KeyKind,
    pub name: String,
    pub description: Option<String>,
    pub workspace_id: Option<String>,
    /// The user a user key acts for.
    pub user_id: Option<String>,
    /// The user who made the key (the one behind the creating key).
    pub created_by_user_id: Option<String>,
    pub scopes: BTreeSet<String>,
    pub rate_limits: Vec<RateLimit>,
    pub usage_limits: Option<UsageLimits>,
    pub defaults: Value,
    pub alert_emails: Vec<String>,
    pub rotation_policy: Option<Value>,
    pub expires_at: Option<Timestamp>,
}

/// A stored key, as the API shows it (masked).
#[derive(Debug, Clone, PartialEq)]
pub struct ApiKey {
    pub id: String,
    pub organisation_id: String,
    pub workspace_id: Option<String>,
    pub user_id: Option<String>,
    pub created_by_user_id: Option<String>,
    pub kind: KeyKind,
    pub name: String,
    pub description: Option<String>,
    pub key_mask: String,
    pub status: String,
    pub scopes: Vec<String>,
    pub rate_limits: Vec<RateLimit>,
    pub usage_limits: Option<UsageLimits>,
    /// The usage counted in the budget's current reset period (0 once the period of the
    /// stored usage has elapsed).
    pub current_usage: f64,
    /// The reset period the stored usage was counted in, and the number of manual resets.
    pub usage_period: i64,
    pub reset_epoch: i64,
    pub defaults: Value,
    pub alert_emails: Vec<String>,
    pub rotation_policy: Option<Value>,
    pub expires_at: Option<String>,
    pub created_at: String,
    pub last_updated_at: String,
}

impl ApiKey {
    /// The reference's ApiKeyObject, with the key masked.
    pub fn to_json(&self) -> Value {
        let usage_limits = self.usage_limits.as_ref().map(|u| {
            let mut v = serde_json::to_value(u).expect("usage limits serialise");
            v["current_usage"] = json!(self.current_usage);
            v
        });
        json!({
            "id": self.id,
            "key": self.key_mask,
            "name": self.name,
            "description": self.description,
            "type": self.kind.as_str(),
            "organisation_id": self.organisation_id,
            "workspace_id": self.workspace_id,
            "user_id": self.user_id,
            "status": self.status,
            "created_at": self.created_at,
            "last_updated_at": self.last_updated_at,
            "rate_limits": self.rate_limits,
            "usage_limits": usage_limits,
            "scopes": self.scopes,
            "defaults": self.defaults,
            "alert_emails": self.alert_emails,
            "rotation_policy": self.rotation_policy,
            "expires_at": self.expires_at,
            "object": "api-key",
        })
    }
}

/// Changes of `PUT /api-keys/{id}`; `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct KeyChanges {
    pub name: Option<String>,
    pub description: Option<Option<String>>,
    pub scopes: Option<BTreeSet<String>>,
    pub rate_limits: Option<Vec<RateLimit>>,
    pub usage_limits: Option<Option<UsageLimits>>,
    pub defaults: Option<Value>,
    pub alert_emails: Option<Vec<String>>,
    pub rotation_policy: Option<Option<Value>>,
    pub expires_at: Option<Option<Timestamp>>,
    /// Sets the usage back to zero (an exhausted key becomes active) and starts a new reset
    /// epoch: what the data plane counted before no longer counts.
    pub reset_usage: bool,
}

/// Which keys a listing returns.
#[derive(Debug, Clone, Default)]
pub struct KeyFilter {
    pub workspace_id: Option<String>,
    /// Only these kinds (the ones the caller may list).
    pub kinds: Vec<KeyKind>,
    /// Only the keys of this user (a workspace member lists their own).
    pub user_id: Option<String>,
}

/// The answer to a rotation: the new raw key, and until when the previous one still works.
#[derive(Debug, Clone)]
pub struct Rotated {
    pub id: String,
    pub key: String,
    pub key_transition_expires_at: String,
}

const COLUMNS: &str = "id, organisation_id, workspace_id, user_id, created_by_user_id, type, name,
    description, key_mask, status, scopes, rate_limits, usage_limits, current_usage,
    usage_period, reset_epoch, defaults, alert_emails, rotation_policy, expires_at, created_at,
    last_updated_at";

fn from_row(r: &AnyRow) -> Result<ApiKey> {
    let kind: String = r.try_get("type")?;
    let usage_limits: Option<UsageLimits> = r
        .try_get::<Option<String>, _>("usage_limits")?
        .map(|t| from_text("api_keys.usage_limits", &t))
        .transpose()?;
    let rotation_policy: Option<String> = r.try_get("rotation_policy")?;
    let usage_period: i64 = r.try_get("usage_period")?;
    let (status, current_usage) = usage::shown(
        usage_limits.as_ref().map(usage::sdk_limit).as_ref(),
        &r.try_get::<String, _>("status")?,
        r.try_get("current_usage")?,
        usage_period,
    );
    Ok(ApiKey {
        id: r.try_get("id")?,
        organisation_id: r.try_get("organisation_id")?,
        workspace_id: r.try_get("workspace_id")?,
        user_id: r.try_get("user_id")?,
        created_by_user_id: r.try_get("created_by_user_id")?,
        kind: KeyKind::parse(&kind).ok_or_else(|| super::bad_column("api_keys.type", &kind))?,
        name: r.try_get("name")?,
        description: r.try_get("description")?,
        key_mask: r.try_get("key_mask")?,
        status,
        scopes: from_text("api_keys.scopes", &r.try_get::<String, _>("scopes")?)?,
        rate_limits: from_text(
            "api_keys.rate_limits",
            &r.try_get::<String, _>("rate_limits")?,
        )?,
        usage_limits,
        current_usage,
        usage_period,
        reset_epoch: r.try_get("reset_epoch")?,
        defaults: super::json_column(r, "defaults")?,
        alert_emails: from_text(
            "api_keys.alert_emails",
            &r.try_get::<String, _>("alert_emails")?,
        )?,
        rotation_policy: rotation_policy
            .map(|t| from_text("api_keys.rotation_policy", &t))
            .transpose()?,
        expires_at: r.try_get("expires_at")?,
        created_at: r.try_get("created_at")?,
        last_updated_at: r.try_get("last_updated_at")?,
    })
}

/// Inserts a key; returns its id.
pub(super) async fn insert(
    tx: &mut Tx,
    organisation_id: &str,
    key: &NewKey,
    raw: &str,
) -> Result<String> {
    let id = uuid::Uuid::new_v4().to_string();
    let now = time::format(time::now());
    sqlx::query(
        "INSERT INTO api_keys (id, organisation_id, workspace_id, user_id, created_by_user_id,
             type, name, description, key_hash, key_mask, status, scopes, rate_limits,
             usage_limits, current_usage, defaults, alert_emails, rotation_policy, expires_at,
             created_at, last_updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'active', $11, $12, $13, 0, $14, $15,
             $16, $17, $18, $18)",
    )
    .bind(&id)
    .bind(organisation_id)
    .bind(key.workspace_id.clone())
    .bind(key.user_id.clone())
    .bind(key.created_by_user_id.clone())
    .bind(key.kind.as_str())
    .bind(&key.name)
    .bind(key.description.clone())
    .bind(keys::hash(raw))
    .bind(keys::mask(raw))
    .bind(to_text(&key.scopes))
    .bind(to_text(&key.rate_limits))
    .bind(key.usage_limits.as_ref().map(to_text))
    .bind(to_text(&key.defaults))
    .bind(to_text(&key.alert_emails))
    .bind(key.rotation_policy.as_ref().map(to_text))
    .bind(key.expires_at.map(time::format))
    .bind(&now)
    .execute(&mut **tx)
    .await
    .map_err(|e| {
        if crate::error::is_unique_violation(&e) {
            AdminError::conflict("an API key with this value already exists")
        } else if crate::error::is_foreign_key_violation(&e) {
            AdminError::reference("the key's workspace or user no longer exists")
        } else {
            e.into()
        }
    })?;
    Ok(id)
}

impl Store {
    /// Creates a key; returns its id and the raw key, which is never available again.
    pub async fn create_api_key(&self, actor: Actor<'_>, key: &NewKey) -> Result<(String, String)> {
        let raw = keys::generate();
        let mut tx = self.db.begin_write().await?;
        // A user key counts against the user keys per workspace maximum in force.
        if let (KeyKind::WorkspaceUser, Some(ws), Some(user)) =
            (key.kind, &key.workspace_id, &key.user_id)
        {
            let org = &actor.principal.organisation_id;
            super::settings::enforce_user_key_limit(&mut tx, org, ws, user).await?;
        }
        let id = insert(&mut tx, &actor.principal.organisation_id, key, &raw).await?;
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("create", "api_key")
                .resource(&id)
                .workspace(key.workspace_id.as_deref()),
        )
        .await?;
        self.data_plane_changed(&mut tx).await?;
        tx.commit().await?;
        self.after_data_plane_change().await;
        Ok((id, raw))
    }

    /// One key of the organisation.
    pub async fn api_key(&self, organisation_id: &str, id: &str) -> Result<Option<ApiKey>> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM api_keys WHERE id = $1 AND organisation_id = $2"
        )))
        .bind(id)
        .bind(organisation_id)
        .fetch_optional(self.db.pool())
        .await?;
        row.as_ref().map(from_row).transpose()
    }

    /// Keys of the organisation, newest first, and how many match in all.
    pub async fn api_keys(
        &self,
        organisation_id: &str,
        filter: &KeyFilter,
        page: Page,
    ) -> Result<(i64, Vec<ApiKey>)> {
        if filter.kinds.is_empty() {
            return Ok((0, Vec::new()));
        }
        let mut cond = Sql::new(" FROM api_keys WHERE organisation_id = ");
        cond.text(organisation_id);
        if let Some(ws) = &filter.workspace_id {
            cond.push(" AND workspace_id = ").text(ws.clone());
        }
        if let Some(user) = &filter.user_id {
            cond.push(" AND user_id = ").text(user.clone());
        }
        cond.push(" AND type IN (");
        for (i, kind) in filter.kinds.iter().enumerate() {
            if i > 0 {
                cond.push(", ");
            }
            cond.text(kind.as_str());
        }
        cond.push(")");
        cond.select_page(
            &self.db,
            COLUMNS,
            "created_at DESC, id DESC",
            page,
            from_row,
        )
        .await
    }

    /// Applies `changes` to a key in one transaction, which reads the key's stored status and
    /// usage locked (a charge from the data plane waits for it, or it for the charge):
    /// - a new `expires_at` in the future, or none, makes an expired key active again;
    /// - `reset_usage` sets the usage to zero in a new reset epoch (exhausted -> active);
    /// - new `usage_limits` keep the usage counted in the current period (carried into the new
    ///   schedule's current period) and re-decide the status: exhausted at or above the new
    ///   credit limit, active below it, so raising the limit reactivates the key at once.
    pub async fn update_api_key(
        &self,
        actor: Actor<'_>,
        key: &ApiKey,
        changes: &KeyChanges,
    ) -> Result<()> {
        let now = time::now();
        let mut tx = self.db.begin_write().await?;
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT status, usage_limits, current_usage, usage_period FROM api_keys
             WHERE id = $1 AND organisation_id = $2{}",
            self.db.backend().for_update()
        )))
        .bind(&key.id)
        .bind(&key.organisation_id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| AdminError::not_found(format!("no API key {}", key.id)))?;
        let stored_status: String = row.try_get("status")?;
        let old_limits: Option<UsageLimits> = row
            .try_get::<Option<String>, _>("usage_limits")?
            .map(|t| from_text("api_keys.usage_limits", &t))
            .transpose()?;
        let stored = usage::Stored {
            usage: row.try_get("current_usage")?,
            period: row.try_get("usage_period")?,
            epoch: 0,
        };

        let mut sql = Sql::new("UPDATE api_keys SET last_updated_at = ");
        sql.text(time::format(now));
        if let Some(name) = &changes.name {
            sql.push(", name = ").text(name.clone());
        }
        if let Some(d) = &changes.description {
            sql.push(", description = ");
            nullable_text(&mut sql, d.clone());
        }
        if let Some(s) = &changes.scopes {
            sql.push(", scopes = ").text(to_text(s));
        }
        if let Some(r) = &changes.rate_limits {
            sql.push(", rate_limits = ").text(to_text(r));
        }
        if let Some(u) = &changes.usage_limits {
            sql.push(", usage_limits = ");
            nullable_text(&mut sql, u.as_ref().map(to_text));
        }
        if let Some(d) = &changes.defaults {
            sql.push(", defaults = ").text(to_text(d));
        }
        if let Some(a) = &changes.alert_emails {
            sql.push(", alert_emails = ").text(to_text(a));
        }
        if let Some(r) = &changes.rotation_policy {
            sql.push(", rotation_policy = ");
            nullable_text(&mut sql, r.as_ref().map(to_text));
        }
        let mut status = stored_status.clone();
        if let Some(e) = &changes.expires_at {
            sql.push(", expires_at = ");
            nullable_text(&mut sql, e.map(time::format));
            if status == "expired" && e.is_none_or(|t| t > now) {
                status = "active".into();
            }
        }
        let old_limit = old_limits.as_ref().map(usage::sdk_limit);
        let new_limit = match &changes.usage_limits {
            Some(u) => u.as_ref().map(usage::sdk_limit),
            None => old_limit.clone(),
        };
        let usage_now = restate_usage(
            &mut sql,
            changes.reset_usage,
            changes.usage_limits.is_some(),
            stored,
            old_limit.as_ref(),
            new_limit.as_ref(),
        );
        if let Some(u) = usage_now {
            status = match &new_limit {
                Some(l) => usage::decide(&status, u, l.credit_limit),
                None if status == "exhausted" => "active".into(),
                None => status,
            };
        }
        if status != stored_status {
            sql.push(", status = ").text(status);
        }
        sql.push(" WHERE id = ")
            .text(key.id.clone())
            .push(" AND organisation_id = ")
            .text(key.organisation_id.clone());
        let done = sql.query().execute(&mut *tx).await?;
        if done.rows_affected() == 0 {
            return Err(AdminError::not_found(format!("no API key {}", key.id)));
        }
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("update", "api_key")
                .resource(&key.id)
                .workspace(key.workspace_id.as_deref()),
        )
        .await?;
        self.data_plane_changed(&mut tx).await?;
        tx.commit().await?;
        self.after_data_plane_change().await;
        Ok(())
    }

    /// Deletes a key: it stops working at once.
    pub async fn delete_api_key(&self, actor: Actor<'_>, key: &ApiKey) -> Result<()> {
        let mut tx = self.db.begin_write().await?;
        let done = sqlx::query("DELETE FROM api_keys WHERE id = $1 AND organisation_id = $2")
            .bind(&key.id)
            .bind(&key.organisation_id)
            .execute(&mut *tx)
            .await?;
        if done.rows_affected() == 0 {
            return Err(AdminError::not_found(format!("no API key {}", key.id)));
        }
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("delete", "api_key")
                .resource(&key.id)
                .workspace(key.workspace_id.as_deref()),
        )
        .await?;
        self.data_plane_changed(&mut tx).await?;
        tx.commit().await?;
        self.after_data_plane_change().await;
        Ok(())
    }

    /// Gives a key a new raw value; the previous one keeps working for `transition`.
    pub async fn rotate_api_key(
        &self,
        actor: Actor<'_>,
        key: &ApiKey,
        transition: Duration,
    ) -> Result<Rotated> {
        let raw = keys::generate();
        let now = time::now();
        let until = time::format(now + chrono::Duration::from_std(transition).unwrap_or_default());
        let mut tx = self.db.begin_write().await?;
        let done = sqlx::query(
            "UPDATE api_keys SET previous_key_hash = key_hash, previous_key_expires_at = $1,
                 key_hash = $2, key_mask = $3, last_updated_at = $4
             WHERE id = $5 AND organisation_id = $6",
        )
        .bind(&until)
        .bind(keys::hash(&raw))
        .bind(keys::mask(&raw))
        .bind(time::format(now))
        .bind(&key.id)
        .bind(&key.organisation_id)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Err(AdminError::not_found(format!("no API key {}", key.id)));
        }
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("rotate", "api_key")
                .resource(&key.id)
                .workspace(key.workspace_id.as_deref()),
        )
        .await?;
        self.data_plane_changed(&mut tx).await?;
        tx.commit().await?;
        self.after_data_plane_change().await;
        Ok(Rotated {
            id: key.id.clone(),
            key: raw,
            key_transition_expires_at: until,
        })
    }

    /// Marks every key past its `expires_at` as `expired` (the expiry worker's sweep), each
    /// with an audit record; returns how many.
    pub async fn expire_api_keys(&self) -> Result<usize> {
        let now = time::format(time::now());
        let mut tx = self.db.begin_write().await?;
        let rows = sqlx::query(
            "UPDATE api_keys SET status = 'expired', last_updated_at = $1
             WHERE status <> 'expired' AND expires_at IS NOT NULL AND expires_at <= $1
             RETURNING id, organisation_id, workspace_id",
        )
        .bind(&now)
        .fetch_all(&mut *tx)
        .await?;
        for r in &rows {
            let id: String = r.try_get("id")?;
            let org: String = r.try_get("organisation_id")?;
            let ws: Option<String> = r.try_get("workspace_id")?;
            audit::insert_system(
                &mut tx,
                &org,
                &AuditEntry::new("expire", "api_key")
                    .resource(&id)
                    .workspace(ws.as_deref()),
            )
            .await?;
        }
        if !rows.is_empty() {
            self.data_plane_changed(&mut tx).await?;
        }
        tx.commit().await?;
        if !rows.is_empty() {
            self.after_data_plane_change().await;
        }
        Ok(rows.len())
    }

    /// The stored hash and mask of a key (tests read what is at rest).
    pub async fn api_key_at_rest(&self, id: &str) -> Result<Option<(String, String)>> {
        let row = sqlx::query("SELECT key_hash, key_mask FROM api_keys WHERE id = $1")
            .bind(id)
            .fetch_optional(self.db.pool())
            .await?;
        row.map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).transpose()
    }
}

/// For an update of a budget holder (a key, a provider): appends the usage columns that
/// change and returns the usage that now counts, or `None` when neither a reset nor new limits
/// touch the usage. `reset`: zero in a new reset epoch; new limits: the usage counted in the old
/// schedule's current period, carried into the new schedule's current period.
pub(super) fn restate_usage(
    sql: &mut Sql,
    reset: bool,
    limits_changed: bool,
    stored: usage::Stored,
    old_limit: Option<&plugin_sdk::access::UsageLimit>,
    new_limit: Option<&plugin_sdk::access::UsageLimit>,
) -> Option<f64> {
    let new_period = usage::period_now(new_limit);
    if reset {
        sql.push(", current_usage = 0, reset_epoch = reset_epoch + 1, usage_period = ")
            .int(new_period);
        Some(0.0)
    } else if limits_changed {
        let counted = usage::in_period(stored.usage, stored.period, usage::period_now(old_limit));
        sql.push(", current_usage = ")
            .float(counted)
            .push(", usage_period = ")
            .int(new_period);
        Some(counted)
    } else {
        None
    }
}

/// Appends a text placeholder, or `NULL`.
fn nullable_text(sql: &mut Sql, value: Option<String>) {
    match value {
        Some(v) => {
            sql.text(v);
        }
        None => {
            sql.push("NULL");
        }
    }
}
