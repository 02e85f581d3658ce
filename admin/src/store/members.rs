//! Workspace members: add, list, read, change of role, removal.

use serde_json::{json, Value};
use sqlx::any::AnyRow;
use sqlx::Row;

use super::audit::{self, AuditEntry};
use super::changes::Change;
use super::{bad_column, from_text, Actor, Store, Workspace};
use crate::authz::WorkspaceRole;
use crate::db::Sql;
use crate::error::{is_unique_violation, AdminError, Result};
use crate::time;
use crate::validate::Page;

/// A member of a workspace, as the members endpoints show them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceMember {
    pub workspace_id: String,
    pub user_id: String,
    pub email: String,
    pub first_name: Option<String>,
    pub last_name: Option<String>,
    pub org_role: String,
    pub role: WorkspaceRole,
    /// The scopes an accepted invite gave the member's workspace key.
    pub scopes: Vec<String>,
    pub created_at: String,
    pub last_updated_at: String,
}

impl WorkspaceMember {
    pub fn to_json(&self) -> Value {
        json!({
            "object": "workspace-user",
            "id": self.user_id,
            "first_name": self.first_name,
            "last_name": self.last_name,
            "org_role": self.org_role,
            "role": self.role.as_str(),
            "created_at": self.created_at,
            "last_updated_at": self.last_updated_at,
            "status": "active",
            "workspace_id": self.workspace_id,
            "email": self.email,
            "scopes": self.scopes,
        })
    }
}

const SELECT: &str = "SELECT m.workspace_id, m.user_id, u.email, u.first_name, u.last_name,
        u.role AS org_role, m.role, m.scopes, m.created_at, m.last_updated_at
    FROM workspace_members m JOIN users u ON u.id = m.user_id";

fn from_row(r: &AnyRow) -> Result<WorkspaceMember> {
    let role: String = r.try_get("role")?;
    Ok(WorkspaceMember {
        workspace_id: r.try_get("workspace_id")?,
        user_id: r.try_get("user_id")?,
        email: r.try_get("email")?,
        first_name: r.try_get("first_name")?,
        last_name: r.try_get("last_name")?,
        org_role: r.try_get("org_role")?,
        role: WorkspaceRole::parse(&role)
            .ok_or_else(|| bad_column("workspace_members.role", &role))?,
        scopes: from_text(
            "workspace_members.scopes",
            &r.try_get::<String, _>("scopes")?,
        )?,
        created_at: r.try_get("created_at")?,
        last_updated_at: r.try_get("last_updated_at")?,
    })
}

impl Store {
    /// Members of a workspace, earliest first, and how many match in all.
    pub async fn members(
        &self,
        workspace_id: &str,
        role: Option<WorkspaceRole>,
        page: Page,
    ) -> Result<(i64, Vec<WorkspaceMember>)> {
        let mut cond = Sql::new(" WHERE m.workspace_id = ");
        cond.text(workspace_id);
        if let Some(role) = role {
            cond.push(" AND m.role = ").text(role.as_str());
        }
        let total: i64 = cond
            .prefixed("SELECT COUNT(*) FROM workspace_members m")
            .query()
            .fetch_one(self.db.pool())
            .await?
            .try_get(0)?;
        let mut rows = cond.prefixed(SELECT);
        rows.push(" ORDER BY m.created_at, m.user_id LIMIT ")
            .int(page.size)
            .push(" OFFSET ")
            .int(page.offset());
        let rows = rows.query().fetch_all(self.db.pool()).await?;
        let list = rows.iter().map(from_row).collect::<Result<Vec<_>>>()?;
        Ok((total, list))
    }

    /// One member of a workspace.
    pub async fn member(
        &self,
        workspace_id: &str,
        user_id: &str,
    ) -> Result<Option<WorkspaceMember>> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "{SELECT} WHERE m.workspace_id = $1 AND m.user_id = $2"
        )))
        .bind(workspace_id)
        .bind(user_id)
        .fetch_optional(self.db.pool())
        .await?;
        row.as_ref().map(from_row).transpose()
    }

    /// Adds users of the organisation to a workspace, all or none: 404 (AB02) for a user who
    /// does not exist, 409 for one who is already a member. Audited as one action.
    pub async fn add_members(
        &self,
        actor: Actor<'_>,
        ws: &Workspace,
        members: &[(String, WorkspaceRole)],
    ) -> Result<()> {
        let now = time::format(time::now());
        let mut tx = self.db.begin_write().await?;
        for (i, (user_id, role)) in members.iter().enumerate() {
            let known: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM users WHERE id = $1 AND organisation_id = $2",
            )
            .bind(user_id)
            .bind(&ws.organisation_id)
            .fetch_one(&mut *tx)
            .await?;
            if known == 0 {
                return Err(AdminError::reference(format!(
                    "users[{i}].id: no user {user_id} in the organisation"
                )));
            }
            sqlx::query(
                "INSERT INTO workspace_members (workspace_id, user_id, role, created_at, last_updated_at)
                 VALUES ($1, $2, $3, $4, $4)",
            )
            .bind(&ws.id)
            .bind(user_id)
            .bind(role.as_str())
            .bind(&now)
            .execute(&mut *tx)
            .await
            .map_err(|e| {
                if is_unique_violation(&e) {
                    AdminError::conflict(format!(
                        "users[{i}].id: the user {user_id} is already a member of the workspace; \
                         PUT /v1/admin/workspaces/{}/users/{user_id} changes their role",
                        ws.slug
                    ))
                } else if crate::error::is_foreign_key_violation(&e) {
                    AdminError::not_found(format!("no workspace {}", ws.id))
                } else {
                    e.into()
                }
            })?;
        }
        // One member: a `create` of that user; several: one `bulk_create` naming them all.
        let entry = match members {
            [(user_id, _)] => AuditEntry::new("create", "workspace_user").resource(user_id),
            _ => AuditEntry::new("bulk_create", "workspace_user")
                .items(members.iter().map(|(user_id, _)| user_id.clone()).collect()),
        };
        audit::insert(&mut tx, actor, &entry.workspace(Some(&ws.id))).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Gives a member another workspace role.
    pub async fn change_member_role(
        &self,
        actor: Actor<'_>,
        member: &WorkspaceMember,
        role: WorkspaceRole,
    ) -> Result<()> {
        let mut tx = self.db.begin_write().await?;
        let done = sqlx::query(
            "UPDATE workspace_members SET role = $1, last_updated_at = $2
             WHERE workspace_id = $3 AND user_id = $4",
        )
        .bind(role.as_str())
        .bind(time::format(time::now()))
        .bind(&member.workspace_id)
        .bind(&member.user_id)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Err(AdminError::not_found(format!(
                "the user {} is not a member of the workspace",
                member.user_id
            )));
        }
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("update", "workspace_user")
                .resource(&member.user_id)
                .workspace(Some(&member.workspace_id)),
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Removes a member from a workspace with their user keys there (which stop working at
    /// once).
    pub async fn delete_member(&self, actor: Actor<'_>, member: &WorkspaceMember) -> Result<()> {
        let mut tx = self.db.begin_write().await?;
        // The keys deleted, as the DELETE saw them: a key made meanwhile is in the list too.
        let keys: Vec<String> = sqlx::query_scalar(
            "DELETE FROM api_keys WHERE workspace_id = $1 AND user_id = $2 AND type = 'workspace-user'
             RETURNING id",
        )
        .bind(&member.workspace_id)
        .bind(&member.user_id)
        .fetch_all(&mut *tx)
        .await?;
        let done =
            sqlx::query("DELETE FROM workspace_members WHERE workspace_id = $1 AND user_id = $2")
                .bind(&member.workspace_id)
                .bind(&member.user_id)
                .execute(&mut *tx)
                .await?;
        if done.rows_affected() == 0 {
            return Err(AdminError::not_found(format!(
                "the user {} is not a member of the workspace",
                member.user_id
            )));
        }
        for id in &keys {
            audit::insert(
                &mut tx,
                actor,
                &AuditEntry::new("delete", "api_key")
                    .resource(id)
                    .workspace(Some(&member.workspace_id)),
            )
            .await?;
        }
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("delete", "workspace_user")
                .resource(&member.user_id)
                .workspace(Some(&member.workspace_id)),
        )
        .await?;
        // Their user keys leave the data plane.
        if !keys.is_empty() {
            let changes: Vec<Change> = keys.iter().cloned().map(Change::ApiKey).collect();
            self.data_plane_changed(&mut tx, &changes).await?;
        }
        tx.commit().await?;
        if !keys.is_empty() {
            self.after_data_plane_change().await;
        }
        Ok(())
    }
}
