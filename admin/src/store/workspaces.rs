//! Workspaces and their members.

use serde_json::{json, Value};
use sqlx::any::AnyRow;
use sqlx::Row;

use super::audit::{self, AuditEntry};
use super::changes::Change;
use super::usage;
use super::{from_text, to_text, Actor, Store};
use crate::authz::WorkspaceRole;
use crate::db::{Db, Sql, Tx};
use crate::error::{is_foreign_key_violation, is_unique_violation, AdminError, Result};
use crate::time;
use crate::validate::{Page, RateLimit, UsageLimits};

/// A workspace to create.
#[derive(Debug, Clone)]
pub struct NewWorkspace {
    pub slug: String,
    pub name: String,
    pub description: Option<String>,
    pub defaults: Value,
    pub usage_limits: Vec<UsageLimits>,
    pub rate_limits: Vec<RateLimit>,
    /// Users to add, with their workspace role.
    pub members: Vec<(String, WorkspaceRole)>,
}

/// A stored workspace.
#[derive(Debug, Clone, PartialEq)]
pub struct Workspace {
    pub id: String,
    pub organisation_id: String,
    pub slug: String,
    pub name: String,
    pub description: Option<String>,
    pub defaults: Value,
    pub usage_limits: Vec<UsageLimits>,
    pub rate_limits: Vec<RateLimit>,
    pub status: String,
    pub created_at: String,
    pub last_updated_at: String,
    /// What each item of `usage_limits` has counted, same order (zero for an item never
    /// charged).
    pub budget_usage: Vec<BudgetUsage>,
}

/// What one workspace budget (an item of its `usage_limits`) has counted.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetUsage {
    /// The usage of the current reset period (0 once the period of the stored usage elapsed).
    pub current_usage: f64,
    pub usage_period: i64,
    pub reset_epoch: i64,
    /// `active` or `exhausted` (usage at or above the item's credit limit).
    pub status: String,
}

impl Default for BudgetUsage {
    fn default() -> Self {
        BudgetUsage {
            current_usage: 0.0,
            usage_period: 0,
            reset_epoch: 0,
            status: "active".into(),
        }
    }
}

impl Workspace {
    pub fn to_json(&self) -> Value {
        let usage_limits: Vec<Value> = self
            .usage_limits
            .iter()
            .enumerate()
            .map(|(i, u)| {
                let mut v = serde_json::to_value(u).expect("usage limits serialise");
                let used = self.budget_usage.get(i).map_or(0.0, |b| b.current_usage);
                v["current_usage"] = json!(used);
                v
            })
            .collect();
        json!({
            "id": self.id,
            "slug": self.slug,
            "name": self.name,
            "description": self.description,
            "status": self.status,
            "organisation_id": self.organisation_id,
            "created_at": self.created_at,
            "last_updated_at": self.last_updated_at,
            "defaults": self.defaults,
            "usage_limits": usage_limits,
            "rate_limits": self.rate_limits,
            "object": "workspace",
        })
    }
}

/// A member of a workspace.
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    pub user_id: String,
    pub email: String,
    pub first_name: Option<String>,
    pub last_name: Option<String>,
    pub org_role: String,
    pub role: String,
    pub created_at: String,
    pub last_updated_at: String,
}

impl Member {
    pub fn to_json(&self, workspace_id: &str) -> Value {
        json!({
            "object": "workspace-user",
            "id": self.user_id,
            "email": self.email,
            "first_name": self.first_name,
            "last_name": self.last_name,
            "org_role": self.org_role,
            "role": self.role,
            "status": "active",
            "workspace_id": workspace_id,
            "created_at": self.created_at,
            "last_updated_at": self.last_updated_at,
        })
    }
}

/// Changes of `PUT /admin/workspaces/{id}`; `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct WorkspaceChanges {
    pub name: Option<String>,
    pub description: Option<Option<String>>,
    pub defaults: Option<Value>,
    pub usage_limits: Option<Vec<UsageLimits>>,
    pub rate_limits: Option<Vec<RateLimit>>,
}

/// Filters of `GET /admin/workspaces`.
#[derive(Debug, Clone, Default)]
pub struct WorkspaceFilter {
    /// Part of the name, any case.
    pub name: Option<String>,
    pub exact_name: Option<String>,
    pub status: Option<String>,
}

const COLUMNS: &str = "id, organisation_id, slug, name, description, defaults, usage_limits,
    rate_limits, status, created_at, last_updated_at";

fn from_row(r: &AnyRow) -> Result<Workspace> {
    Ok(Workspace {
        id: r.try_get("id")?,
        organisation_id: r.try_get("organisation_id")?,
        slug: r.try_get("slug")?,
        name: r.try_get("name")?,
        description: r.try_get("description")?,
        defaults: super::json_column(r, "defaults")?,
        usage_limits: from_text(
            "workspaces.usage_limits",
            &r.try_get::<String, _>("usage_limits")?,
        )?,
        rate_limits: from_text(
            "workspaces.rate_limits",
            &r.try_get::<String, _>("rate_limits")?,
        )?,
        status: r.try_get("status")?,
        created_at: r.try_get("created_at")?,
        last_updated_at: r.try_get("last_updated_at")?,
        budget_usage: Vec::new(),
    })
}

/// Fills `budget_usage` of each workspace from `workspace_budget_usage` (one query), as the
/// API shows it: the usage of an elapsed period reads as 0.
async fn attach_budget_usage(db: &Db, list: &mut [Workspace]) -> Result<()> {
    for ws in list.iter_mut() {
        ws.budget_usage = vec![BudgetUsage::default(); ws.usage_limits.len()];
    }
    if list.iter().all(|w| w.usage_limits.is_empty()) {
        return Ok(());
    }
    let mut sql = Sql::new(
        "SELECT workspace_id, budget_index, current_usage, usage_period, reset_epoch, status
         FROM workspace_budget_usage WHERE workspace_id IN (",
    );
    for (i, ws) in list.iter().enumerate() {
        if i > 0 {
            sql.push(", ");
        }
        sql.text(ws.id.clone());
    }
    sql.push(")");
    for r in sql.query().fetch_all(db.pool()).await? {
        let id: String = r.try_get("workspace_id")?;
        let index: i64 = r.try_get("budget_index")?;
        let Some(ws) = list.iter_mut().find(|w| w.id == id) else {
            continue;
        };
        let Some(limit) = usize::try_from(index)
            .ok()
            .and_then(|i| ws.usage_limits.get(i))
        else {
            continue;
        };
        let period: i64 = r.try_get("usage_period")?;
        let (status, current_usage) = usage::shown(
            Some(&usage::sdk_limit(limit)),
            &r.try_get::<String, _>("status")?,
            r.try_get("current_usage")?,
            period,
        );
        ws.budget_usage[index as usize] = BudgetUsage {
            current_usage,
            usage_period: period,
            reset_epoch: r.try_get("reset_epoch")?,
            status,
        };
    }
    Ok(())
}

/// Inserts a workspace and its members; returns it.
pub(super) async fn insert(
    tx: &mut Tx,
    organisation_id: &str,
    new: &NewWorkspace,
) -> Result<Workspace> {
    let id = uuid::Uuid::new_v4().to_string();
    let now = time::format(time::now());
    sqlx::query(
        "INSERT INTO workspaces (id, organisation_id, slug, name, description, defaults,
             usage_limits, rate_limits, status, created_at, last_updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'active', $9, $9)",
    )
    .bind(&id)
    .bind(organisation_id)
    .bind(&new.slug)
    .bind(&new.name)
    .bind(new.description.clone())
    .bind(to_text(&new.defaults))
    .bind(to_text(&new.usage_limits))
    .bind(to_text(&new.rate_limits))
    .bind(&now)
    .execute(&mut **tx)
    .await
    .map_err(|e| {
        if is_unique_violation(&e) {
            AdminError::conflict(format!(
                "a workspace with the slug {} already exists",
                new.slug
            ))
        } else {
            e.into()
        }
    })?;
    for (i, (user_id, role)) in new.members.iter().enumerate() {
        let user_org: Option<String> =
            sqlx::query_scalar("SELECT organisation_id FROM users WHERE id = $1")
                .bind(user_id)
                .fetch_optional(&mut **tx)
                .await?;
        if user_org.as_deref() != Some(organisation_id) {
            return Err(AdminError::reference(format!(
                "users[{i}].id: no user {user_id} in the organisation"
            )));
        }
        sqlx::query(
            "INSERT INTO workspace_members (workspace_id, user_id, role, created_at, last_updated_at)
             VALUES ($1, $2, $3, $4, $4)",
        )
        .bind(&id)
        .bind(user_id)
        .bind(role.as_str())
        .bind(&now)
        .execute(&mut **tx)
        .await
        .map_err(|e| {
            if is_unique_violation(&e) {
                AdminError::validation(format!("users[{i}].id: {user_id} is listed twice"))
            } else {
                e.into()
            }
        })?;
    }
    Ok(Workspace {
        id,
        organisation_id: organisation_id.to_owned(),
        slug: new.slug.clone(),
        name: new.name.clone(),
        description: new.description.clone(),
        defaults: new.defaults.clone(),
        usage_limits: new.usage_limits.clone(),
        rate_limits: new.rate_limits.clone(),
        status: "active".into(),
        created_at: now.clone(),
        last_updated_at: now,
        budget_usage: vec![BudgetUsage::default(); new.usage_limits.len()],
    })
}

impl Store {
    pub async fn create_workspace(
        &self,
        actor: Actor<'_>,
        new: &NewWorkspace,
    ) -> Result<Workspace> {
        let mut tx = self.db.begin_write().await?;
        let ws = insert(&mut tx, &actor.principal.organisation_id, new).await?;
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("create", "workspace")
                .resource(&ws.id)
                .workspace(Some(&ws.id)),
        )
        .await?;
        self.data_plane_changed(&mut tx, &[Change::Workspace(ws.id.clone())])
            .await?;
        tx.commit().await?;
        self.after_data_plane_change().await;
        Ok(ws)
    }

    /// A workspace by id or slug.
    pub async fn workspace(
        &self,
        organisation_id: &str,
        id_or_slug: &str,
    ) -> Result<Option<Workspace>> {
        let column = if crate::validate::is_uuid(id_or_slug) {
            "id"
        } else {
            "slug"
        };
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM workspaces WHERE {column} = $1 AND organisation_id = $2"
        )))
        .bind(if column == "id" {
            id_or_slug.to_lowercase()
        } else {
            id_or_slug.to_owned()
        })
        .bind(organisation_id)
        .fetch_optional(self.db.pool())
        .await?;
        let Some(mut ws) = row.as_ref().map(from_row).transpose()? else {
            return Ok(None);
        };
        attach_budget_usage(&self.db, std::slice::from_mut(&mut ws)).await?;
        Ok(Some(ws))
    }

    /// Workspaces of the organisation, oldest first, and how many match in all.
    pub async fn workspaces(
        &self,
        organisation_id: &str,
        filter: &WorkspaceFilter,
        page: Page,
    ) -> Result<(i64, Vec<Workspace>)> {
        let mut cond = Sql::new(" FROM workspaces WHERE organisation_id = ");
        cond.text(organisation_id);
        if let Some(name) = &filter.name {
            cond.push(" AND LOWER(name) LIKE ")
                .text(super::contains_pattern(name))
                .push(" ESCAPE '\\'");
        }
        if let Some(name) = &filter.exact_name {
            cond.push(" AND name = ").text(name.clone());
        }
        if let Some(status) = &filter.status {
            cond.push(" AND status = ").text(status.clone());
        }
        let (total, mut list) = cond
            .select_page(&self.db, COLUMNS, "created_at, id", page, from_row)
            .await?;
        attach_budget_usage(&self.db, &mut list).await?;
        Ok((total, list))
    }

    /// The members of a workspace.
    pub async fn workspace_members(&self, workspace_id: &str) -> Result<Vec<Member>> {
        let rows = sqlx::query(
            "SELECT m.user_id, u.email, u.first_name, u.last_name, u.role AS org_role, m.role,
                    m.created_at, m.last_updated_at
             FROM workspace_members m JOIN users u ON u.id = m.user_id
             WHERE m.workspace_id = $1 ORDER BY m.created_at, m.user_id",
        )
        .bind(workspace_id)
        .fetch_all(self.db.pool())
        .await?;
        rows.iter()
            .map(|r| {
                Ok(Member {
                    user_id: r.try_get("user_id")?,
                    email: r.try_get("email")?,
                    first_name: r.try_get("first_name")?,
                    last_name: r.try_get("last_name")?,
                    org_role: r.try_get("org_role")?,
                    role: r.try_get("role")?,
                    created_at: r.try_get("created_at")?,
                    last_updated_at: r.try_get("last_updated_at")?,
                })
            })
            .collect()
    }

    pub async fn update_workspace(
        &self,
        actor: Actor<'_>,
        ws: &Workspace,
        changes: &WorkspaceChanges,
    ) -> Result<()> {
        let mut sql = Sql::new("UPDATE workspaces SET last_updated_at = ");
        sql.text(time::format(time::now()));
        if let Some(name) = &changes.name {
            sql.push(", name = ").text(name.clone());
        }
        if let Some(d) = &changes.description {
            match d {
                Some(d) => sql.push(", description = ").text(d.clone()),
                None => sql.push(", description = NULL"),
            };
        }
        if let Some(d) = &changes.defaults {
            sql.push(", defaults = ").text(to_text(d));
        }
        if let Some(u) = &changes.usage_limits {
            sql.push(", usage_limits = ").text(to_text(u));
        }
        if let Some(r) = &changes.rate_limits {
            sql.push(", rate_limits = ").text(to_text(r));
        }
        sql.push(" WHERE id = ")
            .text(ws.id.clone())
            .push(" AND organisation_id = ")
            .text(ws.organisation_id.clone());
        let mut tx = self.db.begin_write().await?;
        // The stored budgets, locked: a charge of one of them waits for this update.
        let stored: Option<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT usage_limits FROM workspaces WHERE id = $1 AND organisation_id = $2{}",
            self.db.backend().for_update()
        )))
        .bind(&ws.id)
        .bind(&ws.organisation_id)
        .fetch_optional(&mut *tx)
        .await?;
        let stored =
            stored.ok_or_else(|| AdminError::not_found(format!("no workspace {}", ws.id)))?;
        let old_limits: Vec<UsageLimits> = from_text("workspaces.usage_limits", &stored)?;
        let done = sql.query().execute(&mut *tx).await?;
        if done.rows_affected() == 0 {
            return Err(AdminError::not_found(format!("no workspace {}", ws.id)));
        }
        if let Some(new_limits) = &changes.usage_limits {
            let rows = usage::UsageRows {
                table: "workspace_budget_usage",
                keys: &[("workspace_id", &ws.id)],
            };
            usage::restate(&mut tx, self.db.backend(), &rows, &old_limits, new_limits).await?;
        }
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("update", "workspace")
                .resource(&ws.id)
                .workspace(Some(&ws.id)),
        )
        .await?;
        self.data_plane_changed(&mut tx, &[Change::Workspace(ws.id.clone())])
            .await?;
        tx.commit().await?;
        self.after_data_plane_change().await;
        Ok(())
    }

    /// Deletes a workspace. While API keys remain in it this is refused (409) unless `force`,
    /// which deletes them with it.
    pub async fn delete_workspace(
        &self,
        actor: Actor<'_>,
        ws: &Workspace,
        force: bool,
    ) -> Result<()> {
        let mut tx = self.db.begin_write().await?;
        // What remains in the workspace; configs, integrations and providers go with it
        // (ON DELETE CASCADE), API keys are deleted here.
        let mut remaining = Vec::new();
        for (table, what) in [
            ("api_keys", "API key(s)"),
            ("configs", "config(s)"),
            ("integrations", "integration(s)"),
            ("providers", "provider(s)"),
        ] {
            let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT COUNT(*) FROM {table} WHERE workspace_id = $1"
            )))
            .bind(&ws.id)
            .fetch_one(&mut *tx)
            .await?;
            if n > 0 {
                remaining.push(format!("{n} {what}"));
            }
        }
        if !remaining.is_empty() && !force {
            return Err(AdminError::conflict(format!(
                "the workspace {} still has {}; delete them first or send \
                 {{\"force_delete\": true}} to delete them with it",
                ws.slug,
                remaining.join(", ")
            )));
        }
        // Its keys, providers, configs, guardrails and policies leave the data plane.
        self.data_plane_changed(&mut tx, &[Change::Everything])
            .await?;
        sqlx::query("DELETE FROM api_keys WHERE workspace_id = $1")
            .bind(&ws.id)
            .execute(&mut *tx)
            .await?;
        let done = sqlx::query("DELETE FROM workspaces WHERE id = $1 AND organisation_id = $2")
            .bind(&ws.id)
            .bind(&ws.organisation_id)
            .execute(&mut *tx)
            .await
            .map_err(|e| {
                // A key made in the workspace while this ran.
                if is_foreign_key_violation(&e) {
                    AdminError::conflict(format!(
                        "the workspace {} gained resources while being deleted; try again",
                        ws.slug
                    ))
                } else {
                    e.into()
                }
            })?;
        if done.rows_affected() == 0 {
            return Err(AdminError::not_found(format!("no workspace {}", ws.id)));
        }
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("delete", "workspace")
                .resource(&ws.id)
                .workspace(Some(&ws.id)),
        )
        .await?;
        tx.commit().await?;
        self.after_data_plane_change().await;
        Ok(())
    }

    /// Adds a user to a workspace or changes their role. (The workspace members endpoints come
    /// later; tests use this.)
    pub async fn set_workspace_member(
        &self,
        workspace_id: &str,
        user_id: &str,
        role: WorkspaceRole,
    ) -> Result<()> {
        let now = time::format(time::now());
        let mut tx = self.db.begin_write().await?;
        sqlx::query("DELETE FROM workspace_members WHERE workspace_id = $1 AND user_id = $2")
            .bind(workspace_id)
            .bind(user_id)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO workspace_members (workspace_id, user_id, role, created_at, last_updated_at)
             VALUES ($1, $2, $3, $4, $4)",
        )
        .bind(workspace_id)
        .bind(user_id)
        .bind(role.as_str())
        .bind(&now)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Removes a user from a workspace.
    pub async fn remove_workspace_member(&self, workspace_id: &str, user_id: &str) -> Result<()> {
        let mut tx = self.db.begin_write().await?;
        sqlx::query("DELETE FROM workspace_members WHERE workspace_id = $1 AND user_id = $2")
            .bind(workspace_id)
            .bind(user_id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }
}
