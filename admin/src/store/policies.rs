//! Rate limits policies, usage limits policies, and the usage each usage limits policy has
//! counted per entity.
//!
//! An update reads the policy inside its transaction, locked (`FOR UPDATE` on PostgreSQL; on
//! SQLite the write transaction holds the database's write lock), checks the merged state and
//! writes it back, so concurrent updates never lose one another's changes. Raising or lowering a
//! usage policy's `credit_limit` re-decides its entities' status in the same transaction.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use sqlx::any::AnyRow;
use sqlx::Row;

use super::audit::{self, AuditEntry};
use super::changes::Change;
use super::usage;
use super::{from_text, to_text, Actor, Store};
use crate::db::{Backend, Sql, Tx};
use crate::error::{AdminError, Result};
use crate::time;
use crate::validate::{Page, PeriodicReset, RateLimitType, RateUnit, UsageType};

/// One condition of a policy: the requests whose `key` matches `value` (`*` is a wildcard),
/// except those matching one of `excludes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Condition {
    pub key: String,
    pub value: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub excludes: Option<Vec<String>>,
}

/// One `group_by` item: each distinct value of `key` gets its own counter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupBy {
    pub key: String,
}

pub use plugin_sdk::access::value_key;

/// A whole number as a JSON integer, anything else as a float: a limit of 100 reads back as
/// `100`, one of 12.5 as `12.5`.
fn number(x: f64) -> Value {
    if x.fract() == 0.0 && x.abs() < 9.0e15 {
        json!(x as i64)
    } else {
        json!(x)
    }
}

fn enum_text<T: Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(Value::String(s)) => s,
        _ => unreachable!("unit enums serialise as strings"),
    }
}

fn enum_from<T: for<'de> Deserialize<'de>>(column: &str, text: &str) -> Result<T> {
    serde_json::from_value(Value::String(text.to_owned()))
        .map_err(|_| super::bad_column(column, text))
}

/// `active` or `archived`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyStatus {
    Active,
    Archived,
}

impl PolicyStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyStatus::Active => "active",
            PolicyStatus::Archived => "archived",
        }
    }
}

/// A rate limits policy as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct RateLimitsPolicy {
    pub id: String,
    pub organisation_id: String,
    pub workspace_id: String,
    pub name: Option<String>,
    pub conditions: Vec<Condition>,
    pub group_by: Vec<GroupBy>,
    pub kind: RateLimitType,
    pub unit: RateUnit,
    pub value: i64,
    pub status: String,
    pub created_at: String,
    pub last_updated_at: String,
}

impl RateLimitsPolicy {
    /// The spec's policy object: with `object` on a single retrieval, without it in lists.
    pub fn to_json(&self, single: bool) -> Value {
        let mut v = json!({
            "id": self.id,
            "name": self.name,
            "conditions": self.conditions,
            "group_by": self.group_by,
            "type": self.kind,
            "unit": self.unit,
            "value": self.value,
            "status": self.status,
            "workspace_id": self.workspace_id,
            "organisation_id": self.organisation_id,
            "created_at": self.created_at,
            "last_updated_at": self.last_updated_at,
        });
        if single {
            v["object"] = json!("policy_rate_limits");
        }
        v
    }
}

/// A rate limits policy to create (checked).
#[derive(Debug, Clone)]
pub struct NewRateLimitsPolicy {
    pub workspace_id: String,
    pub name: Option<String>,
    pub conditions: Vec<Condition>,
    pub group_by: Vec<GroupBy>,
    pub kind: RateLimitType,
    pub unit: RateUnit,
    pub value: i64,
}

/// Changes of `PUT /policies/rate-limits/{id}`; `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct RateLimitsChanges {
    pub name: Option<String>,
    pub unit: Option<RateUnit>,
    pub value: Option<i64>,
}

/// A usage limits policy as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageLimitsPolicy {
    pub id: String,
    pub organisation_id: String,
    pub workspace_id: String,
    pub name: Option<String>,
    pub conditions: Vec<Condition>,
    pub group_by: Vec<GroupBy>,
    pub kind: UsageType,
    pub credit_limit: f64,
    pub alert_threshold: Option<f64>,
    pub periodic_reset: Option<PeriodicReset>,
    pub periodic_reset_days: Option<i64>,
    pub next_usage_reset_at: Option<String>,
    pub status: String,
    pub created_at: String,
    pub last_updated_at: String,
}

impl UsageLimitsPolicy {
    pub fn to_json(&self, single: bool) -> Value {
        let mut v = json!({
            "id": self.id,
            "name": self.name,
            "conditions": self.conditions,
            "group_by": self.group_by,
            "type": self.kind,
            "credit_limit": number(self.credit_limit),
            "alert_threshold": self.alert_threshold.map(number),
            "periodic_reset": self.periodic_reset,
            "periodic_reset_days": self.periodic_reset_days,
            "next_usage_reset_at": self.next_usage_reset_at,
            "status": self.status,
            "workspace_id": self.workspace_id,
            "organisation_id": self.organisation_id,
            "created_at": self.created_at,
            "last_updated_at": self.last_updated_at,
        });
        if single {
            v["object"] = json!("policy_usage_limits");
        }
        v
    }

    /// Checks what no single field shows: `alert_threshold` below `credit_limit`, whole
    /// numbers for a `tokens` policy, one reset schedule at most.
    pub fn check(&self) -> Result<()> {
        if self.kind == UsageType::Tokens {
            for (field, x) in [
                ("credit_limit", Some(self.credit_limit)),
                ("alert_threshold", self.alert_threshold),
            ] {
                if x.is_some_and(|x| x.fract() != 0.0) {
                    return Err(AdminError::field(
                        field,
                        "must be a whole number of tokens for a tokens policy",
                    ));
                }
            }
        }
        if let Some(t) = self.alert_threshold {
            if t >= self.credit_limit {
                return Err(AdminError::field(
                    "alert_threshold",
                    format!(
                        "must be below credit_limit ({}), got {t}",
                        number(self.credit_limit)
                    ),
                ));
            }
        }
        if self.periodic_reset.is_some() && self.periodic_reset_days.is_some() {
            return Err(mutually_exclusive_resets());
        }
        Ok(())
    }
}

/// The error for a request that sets both reset schedules.
fn mutually_exclusive_resets() -> AdminError {
    AdminError::validation(
        "periodic_reset and periodic_reset_days are mutually exclusive: send one of them",
    )
}

/// A usage limits policy to create (checked).
#[derive(Debug, Clone)]
pub struct NewUsageLimitsPolicy {
    pub workspace_id: String,
    pub name: Option<String>,
    pub conditions: Vec<Condition>,
    pub group_by: Vec<GroupBy>,
    pub kind: UsageType,
    pub credit_limit: f64,
    pub alert_threshold: Option<f64>,
    pub periodic_reset: Option<PeriodicReset>,
    pub periodic_reset_days: Option<i64>,
    pub next_usage_reset_at: Option<String>,
}

/// Changes of `PUT /policies/usage-limits/{id}`; `None` leaves a field as it is, `Some(None)`
/// clears a nullable one. Setting one reset schedule clears the other.
#[derive(Debug, Clone, Default)]
pub struct UsageLimitsChanges {
    pub name: Option<String>,
    pub credit_limit: Option<f64>,
    pub alert_threshold: Option<Option<f64>>,
    pub periodic_reset: Option<Option<PeriodicReset>>,
    pub periodic_reset_days: Option<Option<i64>>,
    pub next_usage_reset_at: Option<Option<String>>,
    /// The value key of an entity whose usage goes back to zero.
    pub reset_usage_for_value: Option<String>,
}

impl UsageLimitsChanges {
    /// What the changes show on their own: not both reset schedules at once.
    pub fn check(&self) -> Result<()> {
        if let (Some(Some(_)), Some(Some(_))) = (&self.periodic_reset, &self.periodic_reset_days) {
            return Err(mutually_exclusive_resets());
        }
        Ok(())
    }

    /// The policy with these changes, checked as a whole.
    pub fn apply(&self, policy: &UsageLimitsPolicy) -> Result<UsageLimitsPolicy> {
        self.check()?;
        let mut p = policy.clone();
        if let Some(n) = &self.name {
            p.name = Some(n.clone());
        }
        if let Some(c) = self.credit_limit {
            p.credit_limit = c;
        }
        if let Some(t) = self.alert_threshold {
            p.alert_threshold = t;
        }
        if let Some(r) = self.periodic_reset {
            p.periodic_reset = r;
            if r.is_some() {
                p.periodic_reset_days = None;
            }
        }
        if let Some(d) = self.periodic_reset_days {
            p.periodic_reset_days = d;
            if d.is_some() {
                p.periodic_reset = None;
            }
        }
        if let Some(t) = &self.next_usage_reset_at {
            p.next_usage_reset_at = t.clone();
        }
        p.check()?;
        Ok(p)
    }
}

/// Which policies a listing returns.
#[derive(Debug, Clone)]
pub struct PolicyFilter {
    pub workspace_id: Option<String>,
    pub status: PolicyStatus,
    /// `type`: requests/tokens, or cost/tokens.
    pub kind: Option<String>,
    /// Rate limits policies only.
    pub unit: Option<String>,
}

/// What a usage limits policy has counted for one entity.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageEntity {
    pub id: String,
    pub policy_id: String,
    pub value_key: String,
    /// As stored; the API shows the usage of an elapsed period as 0 ([`UsageEntity::at`]).
    pub current_usage: f64,
    pub status: String,
    /// The reset period the usage was counted in, and the number of manual resets.
    pub usage_period: i64,
    pub reset_epoch: i64,
    pub last_reset_at: Option<String>,
    pub created_at: String,
    pub last_updated_at: String,
}

impl UsageEntity {
    /// The entity as it stands in reset period `current`: usage counted in an elapsed period
    /// reads as 0, and the entity as active.
    pub fn at(mut self, current: i64) -> UsageEntity {
        if self.usage_period < current {
            self.current_usage = 0.0;
            self.status = "active".into();
        }
        self
    }

    pub fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "policy_id": self.policy_id,
            "value_key": self.value_key,
            "current_usage": self.current_usage,
            "status": self.status,
            "last_reset_at": self.last_reset_at,
            "created_at": self.created_at,
            "last_updated_at": self.last_updated_at,
        })
    }
}

/// Which entities a listing returns.
#[derive(Debug, Clone, Default)]
pub struct EntityFilter {
    /// `active` or `exhausted`.
    pub status: Option<String>,
    /// Part of the value key, any case.
    pub search: Option<String>,
}

pub(super) const RATE_COLUMNS: &str =
    "id, organisation_id, workspace_id, name, conditions, group_by, type,
    unit, value, status, created_at, last_updated_at";

pub(super) const USAGE_COLUMNS: &str =
    "id, organisation_id, workspace_id, name, conditions, group_by, type,
    credit_limit, alert_threshold, periodic_reset, periodic_reset_days, next_usage_reset_at,
    status, created_at, last_updated_at";

const ENTITY_COLUMNS: &str = "id, policy_id, value_key, current_usage, status, usage_period,
    reset_epoch, last_reset_at, created_at, last_updated_at";

pub(super) fn rate_from_row(r: &AnyRow) -> Result<RateLimitsPolicy> {
    let kind: String = r.try_get("type")?;
    let unit: String = r.try_get("unit")?;
    Ok(RateLimitsPolicy {
        id: r.try_get("id")?,
        organisation_id: r.try_get("organisation_id")?,
        workspace_id: r.try_get("workspace_id")?,
        name: r.try_get("name")?,
        conditions: from_text(
            "rate_limits_policies.conditions",
            &r.try_get::<String, _>("conditions")?,
        )?,
        group_by: from_text(
            "rate_limits_policies.group_by",
            &r.try_get::<String, _>("group_by")?,
        )?,
        kind: enum_from("rate_limits_policies.type", &kind)?,
        unit: enum_from("rate_limits_policies.unit", &unit)?,
        value: r.try_get("value")?,
        status: r.try_get("status")?,
        created_at: r.try_get("created_at")?,
        last_updated_at: r.try_get("last_updated_at")?,
    })
}

pub(super) fn usage_from_row(r: &AnyRow) -> Result<UsageLimitsPolicy> {
    let kind: String = r.try_get("type")?;
    let reset: Option<String> = r.try_get("periodic_reset")?;
    Ok(UsageLimitsPolicy {
        id: r.try_get("id")?,
        organisation_id: r.try_get("organisation_id")?,
        workspace_id: r.try_get("workspace_id")?,
        name: r.try_get("name")?,
        conditions: from_text(
            "usage_limits_policies.conditions",
            &r.try_get::<String, _>("conditions")?,
        )?,
        group_by: from_text(
            "usage_limits_policies.group_by",
            &r.try_get::<String, _>("group_by")?,
        )?,
        kind: enum_from("usage_limits_policies.type", &kind)?,
        credit_limit: r.try_get("credit_limit")?,
        alert_threshold: r.try_get("alert_threshold")?,
        periodic_reset: reset
            .map(|t| enum_from("usage_limits_policies.periodic_reset", &t))
            .transpose()?,
        periodic_reset_days: r.try_get("periodic_reset_days")?,
        next_usage_reset_at: r.try_get("next_usage_reset_at")?,
        status: r.try_get("status")?,
        created_at: r.try_get("created_at")?,
        last_updated_at: r.try_get("last_updated_at")?,
    })
}

fn entity_from_row(r: &AnyRow) -> Result<UsageEntity> {
    Ok(UsageEntity {
        id: r.try_get("id")?,
        policy_id: r.try_get("policy_id")?,
        value_key: r.try_get("value_key")?,
        current_usage: r.try_get("current_usage")?,
        status: r.try_get("status")?,
        usage_period: r.try_get("usage_period")?,
        reset_epoch: r.try_get("reset_epoch")?,
        last_reset_at: r.try_get("last_reset_at")?,
        created_at: r.try_get("created_at")?,
        last_updated_at: r.try_get("last_updated_at")?,
    })
}

/// ` FOR UPDATE` where the database has it (PostgreSQL); SQLite's write transaction already
/// holds the only write lock.
fn for_update(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => " FOR UPDATE",
        Backend::Sqlite => "",
    }
}

/// ` FOR SHARE` on PostgreSQL: waits for an update of the policy in progress.
fn for_share(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => " FOR SHARE",
        Backend::Sqlite => "",
    }
}

fn no_policy(kind: &str, id: &str) -> AdminError {
    AdminError::not_found(format!("no active {kind} policy {id}"))
}

/// Maps a foreign-key failure on insert (the workspace deleted meanwhile) to a 404.
fn insert_error(e: sqlx::Error) -> AdminError {
    if crate::error::is_foreign_key_violation(&e) {
        AdminError::reference("workspace_id: the workspace no longer exists")
    } else {
        e.into()
    }
}

/// The table of one kind of policy, and its names in messages and in the audit log.
struct PolicyTable {
    table: &'static str,
    kind: &'static str,
    resource_type: &'static str,
    /// What a write to the table changes in the data plane.
    change: Change,
}

const RATE_TABLE: PolicyTable = PolicyTable {
    table: "rate_limits_policies",
    kind: "rate limits",
    resource_type: "rate_limits_policy",
    change: Change::RatePolicies,
};

const USAGE_TABLE: PolicyTable = PolicyTable {
    table: "usage_limits_policies",
    kind: "usage limits",
    resource_type: "usage_limits_policy",
    change: Change::UsagePolicies,
};

fn policy_filter(table: &str, organisation_id: &str, filter: &PolicyFilter) -> Sql {
    let mut cond = Sql::new(&format!(" FROM {table} WHERE organisation_id = "));
    cond.text(organisation_id);
    cond.push(" AND status = ").text(filter.status.as_str());
    if let Some(ws) = &filter.workspace_id {
        cond.push(" AND workspace_id = ").text(ws.clone());
    }
    if let Some(kind) = &filter.kind {
        cond.push(" AND type = ").text(kind.clone());
    }
    if let Some(unit) = &filter.unit {
        cond.push(" AND unit = ").text(unit.clone());
    }
    cond
}

impl Store {
    /// The row of a policy of the organisation, whatever its status.
    async fn policy_row(
        &self,
        t: &PolicyTable,
        columns: &str,
        organisation_id: &str,
        id: &str,
    ) -> Result<Option<AnyRow>> {
        Ok(sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {columns} FROM {} WHERE id = $1 AND organisation_id = $2",
            t.table
        )))
        .bind(id)
        .bind(organisation_id)
        .fetch_optional(self.db.pool())
        .await?)
    }

    /// The row of an active policy, locked for the rest of `tx` (404 when it is not active).
    async fn locked_active_row(
        &self,
        tx: &mut Tx,
        t: &PolicyTable,
        columns: &str,
        organisation_id: &str,
        id: &str,
    ) -> Result<AnyRow> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {columns} FROM {}
             WHERE id = $1 AND organisation_id = $2 AND status = 'active'{}",
            t.table,
            for_update(self.db.backend())
        )))
        .bind(id)
        .bind(organisation_id)
        .fetch_optional(&mut **tx)
        .await?
        .ok_or_else(|| no_policy(t.kind, id))
    }

    /// Archives an active policy.
    async fn archive_policy(
        &self,
        actor: Actor<'_>,
        t: &PolicyTable,
        organisation_id: &str,
        id: &str,
        workspace_id: &str,
    ) -> Result<()> {
        let mut tx = self.db.begin_write().await?;
        let done = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {} SET status = 'archived', last_updated_at = $1
             WHERE id = $2 AND organisation_id = $3 AND status = 'active'",
            t.table
        )))
        .bind(time::format(time::now()))
        .bind(id)
        .bind(organisation_id)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Err(no_policy(t.kind, id));
        }
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("archive", t.resource_type)
                .resource(id)
                .workspace(Some(workspace_id)),
        )
        .await?;
        self.data_plane_changed(&mut tx, std::slice::from_ref(&t.change))
            .await?;
        tx.commit().await?;
        self.after_data_plane_change().await;
        Ok(())
    }

    // ----- rate limits policies -----

    pub async fn create_rate_limits_policy(
        &self,
        actor: Actor<'_>,
        new: &NewRateLimitsPolicy,
    ) -> Result<String> {
        let id = uuid::Uuid::new_v4().to_string();
        let now = time::format(time::now());
        let mut tx = self.db.begin_write().await?;
        sqlx::query(
            "INSERT INTO rate_limits_policies (id, organisation_id, workspace_id, name, conditions,
                 group_by, type, unit, value, status, created_at, last_updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'active', $10, $10)",
        )
        .bind(&id)
        .bind(&actor.principal.organisation_id)
        .bind(&new.workspace_id)
        .bind(new.name.clone())
        .bind(to_text(&new.conditions))
        .bind(to_text(&new.group_by))
        .bind(enum_text(&new.kind))
        .bind(enum_text(&new.unit))
        .bind(new.value)
        .bind(&now)
        .execute(&mut *tx)
        .await
        .map_err(insert_error)?;
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("create", "rate_limits_policy")
                .resource(&id)
                .workspace(Some(&new.workspace_id)),
        )
        .await?;
        self.data_plane_changed(&mut tx, &[Change::RatePolicies])
            .await?;
        tx.commit().await?;
        self.after_data_plane_change().await;
        Ok(id)
    }

    /// A rate limits policy of the organisation, whatever its status.
    pub async fn rate_limits_policy(
        &self,
        organisation_id: &str,
        id: &str,
    ) -> Result<Option<RateLimitsPolicy>> {
        let row = self
            .policy_row(&RATE_TABLE, RATE_COLUMNS, organisation_id, id)
            .await?;
        row.as_ref().map(rate_from_row).transpose()
    }

    /// Rate limits policies of the organisation, newest first, and how many match in all.
    pub async fn rate_limits_policies(
        &self,
        organisation_id: &str,
        filter: &PolicyFilter,
        page: Page,
    ) -> Result<(i64, Vec<RateLimitsPolicy>)> {
        let cond = policy_filter("rate_limits_policies", organisation_id, filter);
        cond.select_page(
            &self.db,
            RATE_COLUMNS,
            "created_at DESC, id DESC",
            page,
            rate_from_row,
        )
        .await
    }

    /// Applies `changes` to an active policy: read, changed and written in one transaction.
    pub async fn update_rate_limits_policy(
        &self,
        actor: Actor<'_>,
        policy: &RateLimitsPolicy,
        changes: &RateLimitsChanges,
    ) -> Result<()> {
        let mut tx = self.db.begin_write().await?;
        let row = self
            .locked_active_row(
                &mut tx,
                &RATE_TABLE,
                RATE_COLUMNS,
                &policy.organisation_id,
                &policy.id,
            )
            .await?;
        let mut current = rate_from_row(&row)?;
        if let Some(n) = &changes.name {
            current.name = Some(n.clone());
        }
        if let Some(u) = changes.unit {
            current.unit = u;
        }
        if let Some(v) = changes.value {
            current.value = v;
        }
        sqlx::query(
            "UPDATE rate_limits_policies SET name = $1, unit = $2, value = $3, last_updated_at = $4
             WHERE id = $5",
        )
        .bind(current.name.clone())
        .bind(enum_text(&current.unit))
        .bind(current.value)
        .bind(time::format(time::now()))
        .bind(&current.id)
        .execute(&mut *tx)
        .await?;
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("update", "rate_limits_policy")
                .resource(&current.id)
                .workspace(Some(&current.workspace_id)),
        )
        .await?;
        self.data_plane_changed(&mut tx, &[Change::RatePolicies])
            .await?;
        tx.commit().await?;
        self.after_data_plane_change().await;
        Ok(())
    }

    /// Archives an active policy: it stops applying and reads back with `status=archived`.
    pub async fn archive_rate_limits_policy(
        &self,
        actor: Actor<'_>,
        policy: &RateLimitsPolicy,
    ) -> Result<()> {
        self.archive_policy(
            actor,
            &RATE_TABLE,
            &policy.organisation_id,
            &policy.id,
            &policy.workspace_id,
        )
        .await
    }

    // ----- usage limits policies -----

    pub async fn create_usage_limits_policy(
        &self,
        actor: Actor<'_>,
        new: &NewUsageLimitsPolicy,
    ) -> Result<String> {
        let id = uuid::Uuid::new_v4().to_string();
        let now = time::format(time::now());
        let mut tx = self.db.begin_write().await?;
        sqlx::query(
            "INSERT INTO usage_limits_policies (id, organisation_id, workspace_id, name, conditions,
                 group_by, type, credit_limit, alert_threshold, periodic_reset,
                 periodic_reset_days, next_usage_reset_at, status, created_at, last_updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, 'active', $13, $13)",
        )
        .bind(&id)
        .bind(&actor.principal.organisation_id)
        .bind(&new.workspace_id)
        .bind(new.name.clone())
        .bind(to_text(&new.conditions))
        .bind(to_text(&new.group_by))
        .bind(enum_text(&new.kind))
        .bind(new.credit_limit)
        .bind(new.alert_threshold)
        .bind(new.periodic_reset.as_ref().map(enum_text))
        .bind(new.periodic_reset_days)
        .bind(new.next_usage_reset_at.clone())
        .bind(&now)
        .execute(&mut *tx)
        .await
        .map_err(insert_error)?;
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("create", "usage_limits_policy")
                .resource(&id)
                .workspace(Some(&new.workspace_id)),
        )
        .await?;
        self.data_plane_changed(&mut tx, &[Change::UsagePolicies])
            .await?;
        tx.commit().await?;
        self.after_data_plane_change().await;
        Ok(id)
    }

    /// A usage limits policy of the organisation, whatever its status.
    pub async fn usage_limits_policy(
        &self,
        organisation_id: &str,
        id: &str,
    ) -> Result<Option<UsageLimitsPolicy>> {
        let row = self
            .policy_row(&USAGE_TABLE, USAGE_COLUMNS, organisation_id, id)
            .await?;
        row.as_ref().map(usage_from_row).transpose()
    }

    /// Usage limits policies of the organisation, newest first, and how many match in all.
    pub async fn usage_limits_policies(
        &self,
        organisation_id: &str,
        filter: &PolicyFilter,
        page: Page,
    ) -> Result<(i64, Vec<UsageLimitsPolicy>)> {
        let cond = policy_filter("usage_limits_policies", organisation_id, filter);
        cond.select_page(
            &self.db,
            USAGE_COLUMNS,
            "created_at DESC, id DESC",
            page,
            usage_from_row,
        )
        .await
    }

    /// Applies `changes` to an active policy in one transaction: the policy is read locked, the
    /// merged state checked and written; a changed credit limit re-decides every entity's status
    /// (usage below the limit: active, at or above it: exhausted); `reset_usage_for_value` sets
    /// that entity's usage back to zero (404 when the policy has no such entity).
    pub async fn update_usage_limits_policy(
        &self,
        actor: Actor<'_>,
        policy: &UsageLimitsPolicy,
        changes: &UsageLimitsChanges,
    ) -> Result<()> {
        let mut tx = self.db.begin_write().await?;
        let row = self
            .locked_active_row(
                &mut tx,
                &USAGE_TABLE,
                USAGE_COLUMNS,
                &policy.organisation_id,
                &policy.id,
            )
            .await?;
        let current = usage_from_row(&row)?;
        let next = changes.apply(&current)?;
        let now = time::format(time::now());
        sqlx::query(
            "UPDATE usage_limits_policies SET name = $1, credit_limit = $2, alert_threshold = $3,
                 periodic_reset = $4, periodic_reset_days = $5, next_usage_reset_at = $6,
                 last_updated_at = $7
             WHERE id = $8",
        )
        .bind(next.name.clone())
        .bind(next.credit_limit)
        .bind(next.alert_threshold)
        .bind(next.periodic_reset.as_ref().map(enum_text))
        .bind(next.periodic_reset_days)
        .bind(next.next_usage_reset_at.clone())
        .bind(&now)
        .bind(&next.id)
        .execute(&mut *tx)
        .await?;
        let old_period = usage::period_now(Some(&usage::policy_limit(&current)));
        let new_period = usage::period_now(Some(&usage::policy_limit(&next)));
        if next.credit_limit != current.credit_limit || old_period != new_period {
            restate_entities(
                &mut tx,
                &next.id,
                next.credit_limit,
                old_period,
                new_period,
                &now,
            )
            .await?;
        }
        if let Some(value_key) = &changes.reset_usage_for_value {
            let done = reset_entity(
                &mut tx,
                &next.id,
                EntityRef::ValueKey(value_key),
                new_period,
                &now,
            )
            .await?;
            if done.is_none() {
                return Err(AdminError::reference(format!(
                    "reset_usage_for_value: the policy has no entity {value_key:?}"
                )));
            }
        }
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("update", "usage_limits_policy")
                .resource(&next.id)
                .workspace(Some(&next.workspace_id)),
        )
        .await?;
        self.data_plane_changed(&mut tx, &[Change::UsagePolicies])
            .await?;
        tx.commit().await?;
        self.after_data_plane_change().await;
        Ok(())
    }

    /// Archives an active usage limits policy (its counted usage is kept).
    pub async fn archive_usage_limits_policy(
        &self,
        actor: Actor<'_>,
        policy: &UsageLimitsPolicy,
    ) -> Result<()> {
        self.archive_policy(
            actor,
            &USAGE_TABLE,
            &policy.organisation_id,
            &policy.id,
            &policy.workspace_id,
        )
        .await
    }

    /// The entities a usage limits policy has counted, newest first, and how many match, as
    /// they stand in the policy's current reset period (usage of an elapsed period reads as 0,
    /// the entity as active; the status filter reads them so too).
    pub async fn usage_limits_entities(
        &self,
        policy: &UsageLimitsPolicy,
        filter: &EntityFilter,
        page: Page,
    ) -> Result<(i64, Vec<UsageEntity>)> {
        let current = usage::period_now(Some(&usage::policy_limit(policy)));
        let mut cond = Sql::new(" FROM usage_limits_policy_entities WHERE policy_id = ");
        cond.text(policy.id.clone());
        match filter.status.as_deref() {
            Some("exhausted") => {
                cond.push(" AND status = 'exhausted' AND usage_period >= ")
                    .int(current);
            }
            Some(s) => {
                cond.push(" AND (status = ")
                    .text(s.to_owned())
                    .push(" OR usage_period < ")
                    .int(current)
                    .push(")");
            }
            None => {}
        }
        if let Some(s) = &filter.search {
            cond.push(" AND LOWER(value_key) LIKE ")
                .text(super::contains_pattern(s))
                .push(" ESCAPE '\\'");
        }
        cond.select_page(
            &self.db,
            ENTITY_COLUMNS,
            "created_at DESC, id DESC",
            page,
            |r| entity_from_row(r).map(|e| e.at(current)),
        )
        .await
    }

    /// Every entity of a policy (for `include_usage`), by value key, as it stands in the
    /// policy's current reset period.
    pub async fn usage_limits_entity_map(
        &self,
        policy: &UsageLimitsPolicy,
    ) -> Result<Map<String, Value>> {
        let current = usage::period_now(Some(&usage::policy_limit(policy)));
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {ENTITY_COLUMNS} FROM usage_limits_policy_entities WHERE policy_id = $1
             ORDER BY value_key"
        )))
        .bind(&policy.id)
        .fetch_all(self.db.pool())
        .await?;
        let mut map = Map::new();
        for r in &rows {
            let e = entity_from_row(r)?.at(current);
            map.insert(
                e.value_key,
                json!({"current_usage": e.current_usage, "status": e.status}),
            );
        }
        Ok(map)
    }

    /// Sets one entity's usage back to zero (active again), by its id or its value key; 404
    /// when the active policy has no such entity.
    pub async fn reset_usage_limits_entity(
        &self,
        actor: Actor<'_>,
        policy: &UsageLimitsPolicy,
        entity: &str,
    ) -> Result<UsageEntity> {
        let mut tx = self.db.begin_write().await?;
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {USAGE_COLUMNS} FROM usage_limits_policies
             WHERE id = $1 AND organisation_id = $2 AND status = 'active'{}",
            for_share(self.db.backend())
        )))
        .bind(&policy.id)
        .bind(&policy.organisation_id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| no_policy("usage limits", &policy.id))?;
        let current = usage::period_now(Some(&usage::policy_limit(&usage_from_row(&row)?)));
        let by = if crate::validate::is_uuid(entity) {
            EntityRef::Id(entity)
        } else {
            EntityRef::ValueKey(entity)
        };
        let now = time::format(time::now());
        let reset = reset_entity(&mut tx, &policy.id, by, current, &now)
            .await?
            .ok_or_else(|| {
                AdminError::not_found(format!("the policy {} has no entity {entity:?}", policy.id))
            })?;
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("reset_usage", "usage_limits_policy_entity")
                .resource(&reset.id)
                .workspace(Some(&policy.workspace_id)),
        )
        .await?;
        self.data_plane_changed(&mut tx, &[Change::UsagePolicies])
            .await?;
        tx.commit().await?;
        self.after_data_plane_change().await;
        Ok(reset)
    }

    /// Adds `amount` to what an active usage limits policy has counted for `value_key` in the
    /// policy's current reset period and the entity's current reset epoch (the entity is made
    /// on its first charge) and returns the entity: exhausted once its usage reaches the credit
    /// limit. For tests and tools; the data plane charges through
    /// [`Store::apply_usage_charges`]. Not a control-plane request, so not in the audit log.
    pub async fn charge_usage_limits_policy(
        &self,
        policy_id: &str,
        value_key: &str,
        amount: f64,
    ) -> Result<UsageEntity> {
        if !amount.is_finite() || amount < 0.0 {
            return Err(AdminError::validation(format!(
                "a charge must be a number >= 0, got {amount}"
            )));
        }
        let mut tx = self.db.begin_write().await?;
        let charged = charge_entity(
            &mut tx,
            self.db.backend(),
            policy_id,
            value_key,
            amount,
            None,
        )
        .await?;
        let entity = match charged {
            EntityCharge::Charged(e) => e,
            EntityCharge::NoPolicy => return Err(no_policy("usage limits", policy_id)),
            EntityCharge::Dropped => {
                return Err(AdminError::internal(
                    "the charge was dropped: the entity is ahead of the policy's schedule",
                ))
            }
        };
        tx.commit().await?;
        Ok(entity)
    }
}

/// What became of a charge of a policy's entity.
pub(super) enum EntityCharge {
    /// The policy is not active (archived, or gone): nothing to charge.
    NoPolicy,
    /// Counted before the entity's last reset, or in an elapsed period: not added.
    Dropped,
    Charged(UsageEntity),
}

/// Charges an entity of an active policy in `tx` (made on its first charge), the entity's row
/// locked. `at`: the (period, reset epoch) the usage was counted in; `None`: now, in the
/// entity's current epoch. The entity is exhausted once its usage reaches the credit limit.
pub(super) async fn charge_entity(
    tx: &mut Tx,
    backend: Backend,
    policy_id: &str,
    value_key: &str,
    amount: f64,
    at: Option<(i64, i64)>,
) -> Result<EntityCharge> {
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {USAGE_COLUMNS} FROM usage_limits_policies WHERE id = $1 AND status = 'active'{}",
        for_share(backend)
    )))
    .bind(policy_id)
    .fetch_optional(&mut **tx)
    .await?;
    let Some(row) = row else {
        return Ok(EntityCharge::NoPolicy);
    };
    let policy = usage_from_row(&row)?;
    let now = time::format(time::now());
    sqlx::query(
        "INSERT INTO usage_limits_policy_entities (id, policy_id, value_key, current_usage,
             status, created_at, last_updated_at)
         VALUES ($1, $2, $3, 0, 'active', $4, $4)
         ON CONFLICT (policy_id, value_key) DO NOTHING",
    )
    .bind(uuid::Uuid::new_v4().to_string())
    .bind(policy_id)
    .bind(value_key)
    .bind(&now)
    .execute(&mut **tx)
    .await?;
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {ENTITY_COLUMNS} FROM usage_limits_policy_entities
         WHERE policy_id = $1 AND value_key = $2{}",
        for_update(backend)
    )))
    .bind(policy_id)
    .bind(value_key)
    .fetch_one(&mut **tx)
    .await?;
    let mut entity = entity_from_row(&row)?;
    let (period, epoch) = at.unwrap_or_else(|| {
        (
            usage::period_now(Some(&usage::policy_limit(&policy))),
            entity.reset_epoch,
        )
    });
    let stored = usage::Stored {
        usage: entity.current_usage,
        period: entity.usage_period,
        epoch: entity.reset_epoch,
    };
    let Some((used, period)) = usage::settle(stored, amount, period, epoch) else {
        return Ok(EntityCharge::Dropped);
    };
    let status = usage::decide(&entity.status, used, policy.credit_limit);
    sqlx::query(
        "UPDATE usage_limits_policy_entities
         SET current_usage = $1, usage_period = $2, status = $3, last_updated_at = $4
         WHERE id = $5",
    )
    .bind(used)
    .bind(period)
    .bind(&status)
    .bind(&now)
    .bind(&entity.id)
    .execute(&mut **tx)
    .await?;
    entity.current_usage = used;
    entity.usage_period = period;
    entity.status = status;
    entity.last_updated_at = now;
    Ok(EntityCharge::Charged(entity))
}

enum EntityRef<'a> {
    Id(&'a str),
    ValueKey(&'a str),
}

/// Usage back to zero and active, in reset period `period` and a new reset epoch (what the
/// data plane counted before no longer counts); `None` when the policy has no such entity.
async fn reset_entity(
    tx: &mut Tx,
    policy_id: &str,
    by: EntityRef<'_>,
    period: i64,
    now: &str,
) -> Result<Option<UsageEntity>> {
    let (column, value) = match by {
        EntityRef::Id(id) => ("id", id.to_lowercase()),
        EntityRef::ValueKey(k) => ("value_key", k.to_owned()),
    };
    let done = sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE usage_limits_policy_entities
         SET current_usage = 0, status = 'active', usage_period = $1,
             reset_epoch = reset_epoch + 1, last_reset_at = $2, last_updated_at = $2
         WHERE policy_id = $3 AND {column} = $4"
    )))
    .bind(period)
    .bind(now)
    .bind(policy_id)
    .bind(&value)
    .execute(&mut **tx)
    .await?;
    if done.rows_affected() == 0 {
        return Ok(None);
    }
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {ENTITY_COLUMNS} FROM usage_limits_policy_entities
         WHERE policy_id = $1 AND {column} = $2"
    )))
    .bind(policy_id)
    .bind(&value)
    .fetch_one(&mut **tx)
    .await?;
    entity_from_row(&row).map(Some)
}

/// After a change of a policy's credit limit or schedule: each entity keeps the usage counted
/// in the old schedule's current period (`old_period`), carried into the new one
/// (`new_period`), usage of an elapsed period drops to zero; then entities below the new limit
/// are active, the others exhausted (the spec's state table: raising the limit reactivates an
/// exhausted entity at once).
async fn restate_entities(
    tx: &mut Tx,
    policy_id: &str,
    limit: f64,
    old_period: i64,
    new_period: i64,
    now: &str,
) -> Result<()> {
    sqlx::query(
        "UPDATE usage_limits_policy_entities
         SET current_usage = CASE WHEN usage_period < $1 THEN 0 ELSE current_usage END,
             usage_period = $2, last_updated_at = $3
         WHERE policy_id = $4 AND usage_period <> $2",
    )
    .bind(old_period)
    .bind(new_period)
    .bind(now)
    .bind(policy_id)
    .execute(&mut **tx)
    .await?;
    sqlx::query(
        "UPDATE usage_limits_policy_entities SET status = 'active', last_updated_at = $1
         WHERE policy_id = $2 AND status = 'exhausted' AND current_usage < $3",
    )
    .bind(now)
    .bind(policy_id)
    .bind(limit)
    .execute(&mut **tx)
    .await?;
    sqlx::query(
        "UPDATE usage_limits_policy_entities SET status = 'exhausted', last_updated_at = $1
         WHERE policy_id = $2 AND status = 'active' AND current_usage >= $3",
    )
    .bind(now)
    .bind(policy_id)
    .bind(limit)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> UsageLimitsPolicy {
        UsageLimitsPolicy {
            id: "p".into(),
            organisation_id: "o".into(),
            workspace_id: "w".into(),
            name: None,
            conditions: vec![],
            group_by: vec![],
            kind: UsageType::Cost,
            credit_limit: 100.0,
            alert_threshold: Some(80.0),
            periodic_reset: None,
            periodic_reset_days: Some(30),
            next_usage_reset_at: None,
            status: "active".into(),
            created_at: String::new(),
            last_updated_at: String::new(),
        }
    }

    #[test]
    fn changes_are_checked_against_the_whole_policy() {
        let p = policy();
        let lower = UsageLimitsChanges {
            credit_limit: Some(50.0),
            ..Default::default()
        };
        assert_eq!(
            lower.apply(&p).unwrap_err().message,
            "alert_threshold: must be below credit_limit (50), got 80"
        );
        let both = UsageLimitsChanges {
            credit_limit: Some(50.0),
            alert_threshold: Some(None),
            ..Default::default()
        };
        assert_eq!(both.apply(&p).unwrap().alert_threshold, None);
        // One schedule replaces the other; both at once is refused.
        let weekly = UsageLimitsChanges {
            periodic_reset: Some(Some(PeriodicReset::Weekly)),
            ..Default::default()
        };
        let got = weekly.apply(&p).unwrap();
        assert_eq!(
            (got.periodic_reset, got.periodic_reset_days),
            (Some(PeriodicReset::Weekly), None)
        );
        let two = UsageLimitsChanges {
            periodic_reset: Some(Some(PeriodicReset::Weekly)),
            periodic_reset_days: Some(Some(7)),
            ..Default::default()
        };
        assert!(two
            .apply(&p)
            .unwrap_err()
            .message
            .contains("periodic_reset and periodic_reset_days"));
        let tokens = UsageLimitsPolicy {
            kind: UsageType::Tokens,
            ..p.clone()
        };
        let half = UsageLimitsChanges {
            credit_limit: Some(100.5),
            ..Default::default()
        };
        assert!(half
            .apply(&tokens)
            .unwrap_err()
            .message
            .starts_with("credit_limit: must be a whole number"));
        assert!(half.apply(&p).is_ok(), "a cost limit may be fractional");
    }

    #[test]
    fn value_keys_and_numbers() {
        assert_eq!(
            value_key([("metadata._user", "alice")]),
            "metadata._user:alice"
        );
        assert_eq!(
            value_key([("api_key", "k1"), ("model", "gpt-4o")]),
            "api_key:k1|model:gpt-4o"
        );
        assert_eq!(number(100.0), json!(100));
        assert_eq!(number(12.5), json!(12.5));
    }
}
