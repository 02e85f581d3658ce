//! The organisation's users: list, read, change of role, removal.

use serde_json::{json, Value};
use sqlx::any::AnyRow;
use sqlx::Row;

use super::audit::{self, AuditEntry};
use super::changes::Change;
use super::{bad_column, Actor, Store};
use crate::authz::OrgRole;
use crate::db::Sql;
use crate::error::{AdminError, Result};
use crate::time;
use crate::validate::Page;

/// A user as the users endpoints show them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrgUser {
    pub id: String,
    pub organisation_id: String,
    pub email: String,
    pub first_name: Option<String>,
    pub last_name: Option<String>,
    pub role: OrgRole,
    pub created_at: String,
    pub last_updated_at: String,
    /// The workspaces the user is a member of.
    pub workspace_ids: Vec<String>,
}

impl OrgUser {
    pub fn to_json(&self) -> Value {
        json!({
            "object": "user",
            "id": self.id,
            "first_name": self.first_name,
            "last_name": self.last_name,
            "role": self.role.as_str(),
            "email": self.email,
            "created_at": self.created_at,
            "last_updated_at": self.last_updated_at,
            "workspace_ids": self.workspace_ids,
        })
    }
}

/// Filters of `GET /admin/users`.
#[derive(Debug, Clone, Default)]
pub struct UserFilter {
    pub role: Option<OrgRole>,
    /// Part of the address, any case.
    pub email: Option<String>,
}

const COLUMNS: &str =
    "id, organisation_id, email, first_name, last_name, role, created_at, last_updated_at";

pub(super) fn from_row(r: &AnyRow) -> Result<OrgUser> {
    let role: String = r.try_get("role")?;
    Ok(OrgUser {
        id: r.try_get("id")?,
        organisation_id: r.try_get("organisation_id")?,
        email: r.try_get("email")?,
        first_name: r.try_get("first_name")?,
        last_name: r.try_get("last_name")?,
        role: OrgRole::parse(&role).ok_or_else(|| bad_column("users.role", &role))?,
        created_at: r.try_get("created_at")?,
        last_updated_at: r.try_get("last_updated_at")?,
        workspace_ids: Vec::new(),
    })
}

impl Store {
    /// Users of the organisation, oldest first, and how many match in all.
    pub async fn users(
        &self,
        organisation_id: &str,
        filter: &UserFilter,
        page: Page,
    ) -> Result<(i64, Vec<OrgUser>)> {
        let mut cond = Sql::new(" FROM users WHERE organisation_id = ");
        cond.text(organisation_id);
        if let Some(role) = filter.role {
            cond.push(" AND role = ").text(role.as_str());
        }
        if let Some(email) = &filter.email {
            cond.push(" AND LOWER(email) LIKE ")
                .text(super::contains_pattern(email))
                .push(" ESCAPE '\\'");
        }
        let (total, mut users) = cond
            .select_page(&self.db, COLUMNS, "created_at, id", page, from_row)
            .await?;
        self.attach_workspaces(&mut users).await?;
        Ok((total, users))
    }

    /// One user of the organisation, with their workspaces.
    pub async fn org_user(&self, organisation_id: &str, id: &str) -> Result<Option<OrgUser>> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM users WHERE id = $1 AND organisation_id = $2"
        )))
        .bind(id)
        .bind(organisation_id)
        .fetch_optional(self.db.pool())
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let mut users = vec![from_row(&row)?];
        self.attach_workspaces(&mut users).await?;
        Ok(users.pop())
    }

    /// Fills `workspace_ids` of each user.
    async fn attach_workspaces(&self, users: &mut [OrgUser]) -> Result<()> {
        if users.is_empty() {
            return Ok(());
        }
        let mut sql =
            Sql::new("SELECT user_id, workspace_id FROM workspace_members WHERE user_id IN (");
        for (i, u) in users.iter().enumerate() {
            if i > 0 {
                sql.push(", ");
            }
            sql.text(u.id.clone());
        }
        sql.push(") ORDER BY created_at, workspace_id");
        for r in sql.query().fetch_all(self.db.pool()).await? {
            let user: String = r.try_get("user_id")?;
            let ws: String = r.try_get("workspace_id")?;
            if let Some(u) = users.iter_mut().find(|u| u.id == user) {
                u.workspace_ids.push(ws);
            }
        }
        Ok(())
    }

    /// Gives a user another organisation role. The owner's role never changes.
    pub async fn change_user_role(
        &self,
        actor: Actor<'_>,
        user: &OrgUser,
        role: OrgRole,
    ) -> Result<()> {
        let mut tx = self.db.begin_write().await?;
        let done = sqlx::query(
            "UPDATE users SET role = $1, last_updated_at = $2
             WHERE id = $3 AND organisation_id = $4 AND role <> 'owner'",
        )
        .bind(role.as_str())
        .bind(time::format(time::now()))
        .bind(&user.id)
        .bind(&user.organisation_id)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Err(AdminError::not_found(format!("no user {}", user.id)));
        }
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("update", "user").resource(&user.id),
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Removes a user from the organisation: their workspace user keys (which stop working at
    /// once) and memberships go with them. The owner is never removed.
    pub async fn delete_user(&self, actor: Actor<'_>, user: &OrgUser) -> Result<()> {
        let mut tx = self.db.begin_write().await?;
        // The keys deleted, as the DELETE saw them: a key made meanwhile is in the list too.
        let keys = sqlx::query(
            "DELETE FROM api_keys WHERE user_id = $1 AND organisation_id = $2
             RETURNING id, workspace_id",
        )
        .bind(&user.id)
        .bind(&user.organisation_id)
        .fetch_all(&mut *tx)
        .await?;
        sqlx::query("DELETE FROM workspace_members WHERE user_id = $1")
            .bind(&user.id)
            .execute(&mut *tx)
            .await?;
        let done = sqlx::query(
            "DELETE FROM users WHERE id = $1 AND organisation_id = $2 AND role <> 'owner'",
        )
        .bind(&user.id)
        .bind(&user.organisation_id)
        .execute(&mut *tx)
        .await
        .map_err(|e| {
            // A key made for the user while this ran.
            if crate::error::is_foreign_key_violation(&e) {
                AdminError::conflict(format!(
                    "the user {} gained API keys while being removed; try again",
                    user.id
                ))
            } else {
                e.into()
            }
        })?;
        if done.rows_affected() == 0 {
            return Err(AdminError::not_found(format!("no user {}", user.id)));
        }
        for k in &keys {
            let id: String = k.try_get("id")?;
            let ws: Option<String> = k.try_get("workspace_id")?;
            audit::insert(
                &mut tx,
                actor,
                &AuditEntry::new("delete", "api_key")
                    .resource(&id)
                    .workspace(ws.as_deref()),
            )
            .await?;
        }
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("delete", "user").resource(&user.id),
        )
        .await?;
        // Their keys leave the data plane.
        if !keys.is_empty() {
            let mut changes = Vec::with_capacity(keys.len());
            for k in &keys {
                changes.push(Change::ApiKey(k.try_get("id")?));
            }
            self.data_plane_changed(&mut tx, &changes).await?;
        }
        tx.commit().await?;
        if !keys.is_empty() {
            self.after_data_plane_change().await;
        }
        Ok(())
    }
}
