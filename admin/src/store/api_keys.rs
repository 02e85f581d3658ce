//! API keys at rest: the raw key is never stored, only its SHA-256 and a masked form.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{json, Value};
use sqlx::any::AnyRow;
use sqlx::Row;

use super::audit::{self, AuditEntry};
use super::changes::Change;
use super::integrations::nullable;
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

/// The raw key an automatic rotation made, as its owner fetches it (once).
#[derive(Debug, Clone)]
pub struct RotatedKey {
    pub id: String,
    pub key: String,
    /// When the rotation happened.
    pub rotated_at: String,
    /// Until when the previous value still works.
    pub key_transition_expires_at: Option<String>,
}

/// The shortest and the default transition of a rotation: the previous value works 30 more
/// minutes.
pub const MIN_KEY_TRANSITION_MS: i64 = 30 * 60 * 1000;

/// The most due keys one pass of the rotation worker rotates; the rest wait for the next pass.
const ROTATION_BATCH: i64 = 100;

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
             created_at, last_updated_at, next_rotation_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'active', $11, $12, $13, 0, $14, $15,
             $16, $17, $18, $18, $19)",
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
    .bind(next_rotation_of(key.rotation_policy.as_ref()))
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
    /// Creates many keys in one transaction: all or none. One audit record (`bulk_create`)
    /// names every key made. Returns each key's id and raw key, in the order given.
    pub async fn create_api_keys(
        &self,
        actor: Actor<'_>,
        keys: &[NewKey],
    ) -> Result<Vec<(String, String)>> {
        let mut tx = self.db.begin_write().await?;
        let org = &actor.principal.organisation_id;
        let mut made = Vec::with_capacity(keys.len());
        for (i, key) in keys.iter().enumerate() {
            if let (KeyKind::WorkspaceUser, Some(ws), Some(user)) =
                (key.kind, &key.workspace_id, &key.user_id)
            {
                super::settings::enforce_user_key_limit(&mut tx, org, ws, user)
                    .await
                    .map_err(|e| e.within(&format!("keys[{i}]")))?;
            }
            let raw = keys::generate();
            let id = insert(&mut tx, org, key, &raw)
                .await
                .map_err(|e| e.within(&format!("keys[{i}]")))?;
            made.push((id, raw));
        }
        let ids: Vec<String> = made.iter().map(|(id, _)| id.clone()).collect();
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("bulk_create", "api_key")
                .workspace_of_all(keys.iter().map(|k| k.workspace_id.as_deref()))
                .items(ids.clone()),
        )
        .await?;
        let changes: Vec<Change> = ids.into_iter().map(Change::ApiKey).collect();
        self.data_plane_changed(&mut tx, &changes).await?;
        tx.commit().await?;
        self.after_data_plane_change().await;
        Ok(made)
    }

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
        self.data_plane_changed(&mut tx, &[Change::ApiKey(id.clone())])
            .await?;
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
        let BudgetHolder {
            stored_status,
            old_limits,
            stored,
        } = self
            .lock_budget_holder(&mut tx, "api_keys", &key.id, &key.organisation_id)
            .await?
            .ok_or_else(|| AdminError::not_found(format!("no API key {}", key.id)))?;

        let mut sql = Sql::new("UPDATE api_keys SET last_updated_at = ");
        sql.text(time::format(now));
        if let Some(name) = &changes.name {
            sql.push(", name = ").text(name.clone());
        }
        if let Some(d) = &changes.description {
            sql.push(", description = ");
            nullable(&mut sql, d.clone());
        }
        if let Some(s) = &changes.scopes {
            sql.push(", scopes = ").text(to_text(s));
        }
        if let Some(r) = &changes.rate_limits {
            sql.push(", rate_limits = ").text(to_text(r));
        }
        if let Some(u) = &changes.usage_limits {
            sql.push(", usage_limits = ");
            nullable(&mut sql, u.as_ref().map(to_text));
        }
        if let Some(d) = &changes.defaults {
            sql.push(", defaults = ").text(to_text(d));
        }
        if let Some(a) = &changes.alert_emails {
            sql.push(", alert_emails = ").text(to_text(a));
        }
        if let Some(r) = &changes.rotation_policy {
            sql.push(", rotation_policy = ");
            nullable(&mut sql, r.as_ref().map(to_text));
            // The worker's schedule follows the policy.
            sql.push(", next_rotation_at = ");
            nullable(&mut sql, next_rotation_of(r.as_ref()));
        }
        let status = restate_expiry_and_budget(
            &mut sql,
            &stored_status,
            changes.expires_at,
            now,
            changes.reset_usage,
            changes.usage_limits.as_ref(),
            old_limits.as_ref(),
            stored,
        );
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
        self.data_plane_changed(&mut tx, &[Change::ApiKey(key.id.clone())])
            .await?;
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
        self.data_plane_changed(&mut tx, &[Change::ApiKey(key.id.clone())])
            .await?;
        tx.commit().await?;
        self.after_data_plane_change().await;
        Ok(())
    }

    /// Gives a key a new raw value; the previous one keeps working for `transition`. The
    /// caller gets the new value, so a value an automatic rotation left unfetched is dropped
    /// (it no longer works once this transition ends).
    pub async fn rotate_api_key(
        &self,
        actor: Actor<'_>,
        key: &ApiKey,
        transition: Duration,
    ) -> Result<Rotated> {
        let raw = keys::generate();
        let now = time::now();
        let until = time::format(transition_end(now, transition)?);
        let mut tx = self.db.begin_write().await?;
        let done = sqlx::query(
            "UPDATE api_keys SET previous_key_hash = key_hash, previous_key_expires_at = $1,
                 key_hash = $2, key_mask = $3, last_updated_at = $4,
                 rotated_key = NULL, rotated_key_at = NULL
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
        self.data_plane_changed(&mut tx, &[Change::ApiKey(key.id.clone())])
            .await?;
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
        let mut changes = Vec::with_capacity(rows.len());
        for r in &rows {
            let id: String = r.try_get("id")?;
            changes.push(Change::ApiKey(id.clone()));
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
            self.data_plane_changed(&mut tx, &changes).await?;
        }
        tx.commit().await?;
        if !rows.is_empty() {
            self.after_data_plane_change().await;
        }
        Ok(rows.len())
    }

    /// The rotation worker's pass: rotates every key whose `next_rotation_at` has passed
    /// (active or exhausted, not expired; at most [`ROTATION_BATCH`] a pass, the longest due
    /// first), and returns how many it rotated. Each key is rotated in a transaction of its own,
    /// with a system audit record (`rotate`) and the data plane's version bumped:
    /// - a new raw value; the previous one works for the policy's `key_transition_period_ms`
    ///   (default and at least 30 minutes), as after a manual rotation;
    /// - the new value stored encrypted until its owner fetches it
    ///   ([`Store::take_rotated_key`]); it replaces one nobody fetched;
    /// - `next_rotation_at` one `rotation_period` later (weekly: 7 days; monthly: one calendar
    ///   month, the last day of a shorter month), skipping slots already past (rotations missed
    ///   while no gateway ran are not made up for); without a period the key rotates once and
    ///   its `next_rotation_at` becomes `null`.
    ///
    /// The update is conditional on the key's policy and `next_rotation_at` being those read:
    /// when several instances run a pass at once, one rotates the key and the others skip it.
    /// A key that cannot be rotated is logged and retried at the next pass. Refused (with due
    /// keys) when the store has no secret key to encrypt the new values with.
    pub async fn rotate_due_api_keys(&self) -> Result<usize> {
        let now = time::now();
        let rows = sqlx::query(
            "SELECT id, organisation_id, workspace_id, rotation_policy, next_rotation_at
             FROM api_keys
             WHERE next_rotation_at IS NOT NULL AND next_rotation_at <= $1
                 AND rotation_policy IS NOT NULL AND status <> 'expired'
                 AND (expires_at IS NULL OR expires_at > $1)
             ORDER BY next_rotation_at, id LIMIT $2",
        )
        .bind(time::format(now))
        .bind(ROTATION_BATCH)
        .fetch_all(self.db.pool())
        .await?;
        if rows.is_empty() {
            return Ok(0);
        }
        if !self.has_secret_key() {
            return Err(AdminError::internal(format!(
                "{} keys are due for rotation but cannot be rotated: their new values are \
                 stored encrypted, and {} is not set",
                rows.len(),
                crate::crypto::SECRET_KEY_VAR
            )));
        }
        let mut rotated = 0;
        let mut first_error = None;
        for row in &rows {
            let result = match due_key(row) {
                Ok(due) => self.rotate_due_key(&due, now).await,
                Err(e) => Err(e),
            };
            match result {
                Ok(true) => rotated += 1,
                // Rotated by another instance, or its policy changed meanwhile.
                Ok(false) => {}
                Err(e) => {
                    let id: String = row.try_get("id").unwrap_or_default();
                    tracing::warn!(key = %id, error = %e, "could not rotate an API key due for rotation; retrying at the next pass");
                    first_error.get_or_insert(e);
                }
            }
        }
        if rotated > 0 {
            self.after_data_plane_change().await;
        }
        match first_error {
            // Nothing done at all: say why (the database is down...).
            Some(e) if rotated == 0 => Err(e),
            _ => Ok(rotated),
        }
    }

    /// Rotates one due key (see [`Store::rotate_due_api_keys`]); false when the key is no
    /// longer as it was read (another instance rotated it, or its policy changed).
    async fn rotate_due_key(&self, key: &DueKey, now: Timestamp) -> Result<bool> {
        let raw = keys::generate();
        let sealed = self.cipher()?.encrypt(&raw, &rotated_key_context(&key.id));
        let transition = Duration::from_millis(key.transition_ms.unsigned_abs());
        let until = time::format(transition_end(now, transition)?);
        let next = next_rotation(key.due, key.period, now).map(time::format);
        let mut policy = key.policy.clone();
        policy.insert("next_rotation_at".into(), json!(next));
        let now_text = time::format(now);
        let mut tx = self.db.begin_write().await?;
        let done = sqlx::query(
            "UPDATE api_keys SET previous_key_hash = key_hash, previous_key_expires_at = $1,
                 key_hash = $2, key_mask = $3, rotated_key = $4, rotated_key_at = $5,
                 rotation_policy = $6, next_rotation_at = $7, last_updated_at = $5
             WHERE id = $8 AND next_rotation_at = $9 AND rotation_policy = $10
                 AND status <> 'expired'",
        )
        .bind(&until)
        .bind(keys::hash(&raw))
        .bind(keys::mask(&raw))
        .bind(sealed)
        .bind(&now_text)
        .bind(to_text(&policy))
        .bind(next.clone())
        .bind(&key.id)
        .bind(&key.due_text)
        .bind(&key.policy_text)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Ok(false);
        }
        self.record_secret_key(&mut tx).await?;
        audit::insert_system(
            &mut tx,
            &key.organisation_id,
            &AuditEntry::new("rotate", "api_key")
                .resource(&key.id)
                .workspace(key.workspace_id.as_deref()),
        )
        .await?;
        self.data_plane_changed(&mut tx, &[Change::ApiKey(key.id.clone())])
            .await?;
        tx.commit().await?;
        tracing::info!(
            key = %key.id,
            next_rotation_at = next.as_deref().unwrap_or("none"),
            "API key rotated by its rotation policy"
        );
        Ok(true)
    }

    /// The raw value the last automatic rotation gave `key`, handed out once: the stored value
    /// is cleared in the same transaction, with an audit record (`fetch_rotated_key`), so a
    /// second call, on this instance or another, finds none. `None` when none is waiting.
    pub async fn take_rotated_key(
        &self,
        actor: Actor<'_>,
        key: &ApiKey,
    ) -> Result<Option<RotatedKey>> {
        let mut tx = self.db.begin_write().await?;
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT rotated_key, rotated_key_at, previous_key_expires_at FROM api_keys
             WHERE id = $1 AND organisation_id = $2{}",
            self.db.backend().for_update()
        )))
        .bind(&key.id)
        .bind(&key.organisation_id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let Some(sealed) = row.try_get::<Option<String>, _>("rotated_key")? else {
            return Ok(None);
        };
        // Opened before anything is cleared: a value that cannot be opened stays stored.
        let raw = self
            .cipher()?
            .decrypt(&sealed, &rotated_key_context(&key.id))?;
        let rotated_at: Option<String> = row.try_get("rotated_key_at")?;
        let until: Option<String> = row.try_get("previous_key_expires_at")?;
        sqlx::query(
            "UPDATE api_keys SET rotated_key = NULL, rotated_key_at = NULL
             WHERE id = $1 AND organisation_id = $2",
        )
        .bind(&key.id)
        .bind(&key.organisation_id)
        .execute(&mut *tx)
        .await?;
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("fetch_rotated_key", "api_key")
                .resource(&key.id)
                .workspace(key.workspace_id.as_deref()),
        )
        .await?;
        tx.commit().await?;
        Ok(Some(RotatedKey {
            id: key.id.clone(),
            key: raw,
            rotated_at: rotated_at.unwrap_or_default(),
            key_transition_expires_at: until,
        }))
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

/// What an update of a key or provider reads first: its stored status, budget and usage.
pub(super) struct BudgetHolder {
    pub stored_status: String,
    pub old_limits: Option<UsageLimits>,
    pub stored: usage::Stored,
}

impl Store {
    /// Reads and locks the budget state of the key or provider `id` in `table` (`api_keys` or
    /// `providers`): a charge from the data plane waits for the update, or it for the charge.
    /// `None` when there is no such row in the organisation.
    pub(super) async fn lock_budget_holder(
        &self,
        tx: &mut Tx,
        table: &'static str,
        id: &str,
        organisation_id: &str,
    ) -> Result<Option<BudgetHolder>> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT status, usage_limits, current_usage, usage_period FROM {table}
             WHERE id = $1 AND organisation_id = $2{}",
            self.db.backend().for_update()
        )))
        .bind(id)
        .bind(organisation_id)
        .fetch_optional(&mut **tx)
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        Ok(Some(BudgetHolder {
            stored_status: row.try_get("status")?,
            old_limits: row
                .try_get::<Option<String>, _>("usage_limits")?
                .map(|t| from_text(&format!("{table}.usage_limits"), &t))
                .transpose()?,
            stored: usage::Stored {
                usage: row.try_get("current_usage")?,
                period: row.try_get("usage_period")?,
                epoch: 0,
            },
        }))
    }
}

/// Pushes the expiry and budget columns an update of a key or provider changes, and returns the
/// status it takes: an expired one whose `expires_at` moves into the future (or goes) is active
/// again; one whose usage is reset or restated under new limits is exhausted or active against
/// its (new) credit limit.
#[allow(clippy::too_many_arguments)]
pub(super) fn restate_expiry_and_budget(
    sql: &mut Sql,
    stored_status: &str,
    expires_at: Option<Option<Timestamp>>,
    now: Timestamp,
    reset_usage: bool,
    usage_limits: Option<&Option<UsageLimits>>,
    old_limits: Option<&UsageLimits>,
    stored: usage::Stored,
) -> String {
    let mut status = stored_status.to_owned();
    if let Some(e) = expires_at {
        sql.push(", expires_at = ");
        nullable(sql, e.map(time::format));
        if status == "expired" && e.is_none_or(|t| t > now) {
            status = "active".into();
        }
    }
    let old_limit = old_limits.map(usage::sdk_limit);
    let new_limit = match usage_limits {
        Some(u) => u.as_ref().map(usage::sdk_limit),
        None => old_limit.clone(),
    };
    let usage_now = restate_usage(
        sql,
        reset_usage,
        usage_limits.is_some(),
        stored,
        old_limit.as_ref(),
        new_limit.as_ref(),
    );
    match (usage_now, &new_limit) {
        (Some(u), Some(l)) => usage::decide(&status, u, l.credit_limit),
        (Some(_), None) if status == "exhausted" => "active".into(),
        _ => status,
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

/// The `next_rotation_at` of a rotation policy, in the stored form (the worker's column).
fn next_rotation_of(policy: Option<&Value>) -> Option<String> {
    let text = policy?.get("next_rotation_at")?.as_str()?;
    time::parse(text).map(time::format)
}

/// When the previous value of a key rotated at `now` stops working.
fn transition_end(now: Timestamp, transition: Duration) -> Result<Timestamp> {
    chrono::Duration::from_std(transition)
        .ok()
        .and_then(|d| now.checked_add_signed(d))
        .ok_or_else(|| AdminError::field("key_transition_period_ms", "is too long"))
}

/// The associated data of a stored rotated key: the value opens only in its own row.
fn rotated_key_context(key_id: &str) -> String {
    format!("api_key:{key_id}:rotated_key")
}

/// How often a rotation policy rotates its key (`rotation_period`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RotationPeriod {
    Weekly,
    Monthly,
}

/// The first rotation after one due at `due` that is later than `now`: whole periods after
/// `due` (so missed slots are skipped, not made up for). `None` without a period, or past the
/// last representable time.
fn next_rotation(
    due: Timestamp,
    period: Option<RotationPeriod>,
    now: Timestamp,
) -> Option<Timestamp> {
    match period? {
        RotationPeriod::Weekly => {
            const WEEK_SECS: i64 = 7 * 24 * 60 * 60;
            let elapsed = (now - due).num_seconds().max(0);
            let mut weeks = elapsed / WEEK_SECS + 1;
            loop {
                let next = due.checked_add_signed(chrono::Duration::try_weeks(weeks)?)?;
                if next > now {
                    return Some(next);
                }
                weeks += 1;
            }
        }
        RotationPeriod::Monthly => {
            // Counted from `due` each time, so that a month end stays one (Jan 31 -> Feb 28 ->
            // Mar 31) within a pass.
            let mut months = 1u32;
            loop {
                let next = due.checked_add_months(chrono::Months::new(months))?;
                if next > now {
                    return Some(next);
                }
                months = months.checked_add(1)?;
            }
        }
    }
}

/// A key the rotation worker found due, as read.
struct DueKey {
    id: String,
    organisation_id: String,
    workspace_id: Option<String>,
    /// The policy as stored (the update's condition) and as a document.
    policy_text: String,
    policy: serde_json::Map<String, Value>,
    /// `next_rotation_at` as stored (the update's condition) and as a time.
    due_text: String,
    due: Timestamp,
    period: Option<RotationPeriod>,
    transition_ms: i64,
}

fn due_key(r: &AnyRow) -> Result<DueKey> {
    let policy_text: String = r.try_get("rotation_policy")?;
    let policy: serde_json::Map<String, Value> =
        from_text("api_keys.rotation_policy", &policy_text)?;
    let due_text: String = r.try_get("next_rotation_at")?;
    let due = time::parse(&due_text)
        .ok_or_else(|| super::bad_column("api_keys.next_rotation_at", &due_text))?;
    let period = match policy.get("rotation_period") {
        None | Some(Value::Null) => None,
        Some(Value::String(p)) if p == "weekly" => Some(RotationPeriod::Weekly),
        Some(Value::String(p)) if p == "monthly" => Some(RotationPeriod::Monthly),
        Some(other) => {
            return Err(super::bad_column(
                "api_keys.rotation_policy.rotation_period",
                &other.to_string(),
            ))
        }
    };
    let transition_ms = policy
        .get("key_transition_period_ms")
        .and_then(Value::as_i64)
        .unwrap_or(MIN_KEY_TRANSITION_MS)
        .max(MIN_KEY_TRANSITION_MS);
    Ok(DueKey {
        id: r.try_get("id")?,
        organisation_id: r.try_get("organisation_id")?,
        workspace_id: r.try_get("workspace_id")?,
        policy_text,
        policy,
        due_text,
        due,
        period,
        transition_ms,
    })
}

/// Copies each key's `rotation_policy.next_rotation_at` into the `next_rotation_at` column, in
/// the transaction of migration 7 (keys with a policy made before it). An unreadable policy is
/// left without a schedule.
pub(crate) async fn fill_next_rotation_at(tx: &mut Tx) -> Result<()> {
    let rows =
        sqlx::query("SELECT id, rotation_policy FROM api_keys WHERE rotation_policy IS NOT NULL")
            .fetch_all(&mut **tx)
            .await?;
    for r in rows {
        let id: String = r.try_get("id")?;
        let text: String = r.try_get("rotation_policy")?;
        let Ok(policy) = serde_json::from_str::<Value>(&text) else {
            continue;
        };
        if let Some(next) = next_rotation_of(Some(&policy)) {
            sqlx::query("UPDATE api_keys SET next_rotation_at = $1 WHERE id = $2")
                .bind(next)
                .bind(id)
                .execute(&mut **tx)
                .await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        time::parse(text).expect("a time")
    }

    #[test]
    fn the_next_rotation_is_whole_periods_after_the_due_one() {
        let due = at("2026-01-31T09:00:00Z");
        let weekly = Some(RotationPeriod::Weekly);
        let monthly = Some(RotationPeriod::Monthly);
        // Due a minute ago: one period later.
        let now = at("2026-01-31T09:01:00Z");
        assert_eq!(
            next_rotation(due, weekly, now),
            Some(at("2026-02-07T09:00:00Z"))
        );
        // A calendar month, the last day of a shorter month.
        assert_eq!(
            next_rotation(due, monthly, now),
            Some(at("2026-02-28T09:00:00Z"))
        );
        // Missed slots are skipped: the first one after now, counted from the due time.
        let later = at("2026-03-20T00:00:00Z");
        assert_eq!(
            next_rotation(due, weekly, later),
            Some(at("2026-03-21T09:00:00Z"))
        );
        assert_eq!(
            next_rotation(due, monthly, later),
            Some(at("2026-03-31T09:00:00Z"))
        );
        // Exactly on a slot: the next one (the result is always later than now).
        let on_slot = at("2026-02-07T09:00:00Z");
        assert_eq!(
            next_rotation(due, weekly, on_slot),
            Some(at("2026-02-14T09:00:00Z"))
        );
        // No period: the key rotates once.
        assert_eq!(next_rotation(due, None, now), None);
        // Past the last representable time: no further rotation rather than a panic.
        let end = chrono::DateTime::<chrono::Utc>::MAX_UTC - chrono::Duration::days(1);
        assert_eq!(next_rotation(end, weekly, end), None);
        assert_eq!(next_rotation(end, monthly, end), None);
    }

    #[test]
    fn policies_name_their_schedule() {
        let p =
            json!({"rotation_period": "weekly", "next_rotation_at": "2026-01-02T03:04:05+02:00"});
        assert_eq!(
            next_rotation_of(Some(&p)).as_deref(),
            Some("2026-01-02T01:04:05.000000Z")
        );
        assert_eq!(
            next_rotation_of(Some(&json!({"next_rotation_at": null}))),
            None
        );
        assert_eq!(next_rotation_of(None), None);
        assert!(transition_end(time::now(), Duration::from_millis(u64::MAX)).is_err());
        assert_ne!(rotated_key_context("a"), rotated_key_context("b"));
    }

    #[tokio::test]
    async fn the_migration_schedules_keys_made_before_it() {
        let store = Store::open("sqlite::memory:").await.expect("a database");
        store
            .bootstrap(&super::super::BootstrapOptions::default())
            .await
            .expect("bootstrap");
        let pool = store.db.pool();
        let fill = || async {
            let mut tx = store.db.begin_write().await.unwrap();
            fill_next_rotation_at(&mut tx).await.unwrap();
            tx.commit().await.unwrap();
            sqlx::query_scalar::<_, Option<String>>("SELECT next_rotation_at FROM api_keys")
                .fetch_one(pool)
                .await
                .unwrap()
        };
        let set = |policy: &'static str| async move {
            sqlx::query("UPDATE api_keys SET rotation_policy = $1, next_rotation_at = NULL")
                .bind(policy)
                .execute(pool)
                .await
                .unwrap();
        };
        set(r#"{"rotation_period":"weekly","next_rotation_at":"2026-01-02T03:04:05+02:00"}"#).await;
        assert_eq!(fill().await.as_deref(), Some("2026-01-02T01:04:05.000000Z"));
        // No next rotation, or an unreadable policy: no schedule.
        set(r#"{"rotation_period":"weekly","next_rotation_at":null}"#).await;
        assert_eq!(fill().await, None);
        set("not json").await;
        assert_eq!(fill().await, None);
    }
}
