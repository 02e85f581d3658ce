//! Settings: the organisation's document (key expiry, the user-key limit, deployment limits,
//! prompt and analytics access), each workspace's overrides of it, and the user-key and
//! deployment limits applied as keys and deployments are made.

use serde::{Deserialize, Serialize};
use sqlx::Row;

use super::audit::{self, AuditEntry};
use super::{from_text, to_text, Actor, OrganisationSettings, Store, Workspace};
use crate::authz::AccessSettings;
use crate::db::Tx;
use crate::error::{AdminError, Result};
use crate::time;

/// A workspace's overrides of the organisation's settings; `None` inherits its value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct WorkspaceSettings {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_api_keys_per_workspace_max: Option<i64>,
    #[serde(rename = "membersViewPrompts", skip_serializing_if = "Option::is_none")]
    pub members_view_prompts: Option<bool>,
    #[serde(
        rename = "membersWritePrompts",
        skip_serializing_if = "Option::is_none"
    )]
    pub members_write_prompts: Option<bool>,
    #[serde(
        rename = "managersViewPrompts",
        skip_serializing_if = "Option::is_none"
    )]
    pub managers_view_prompts: Option<bool>,
    #[serde(
        rename = "managersWritePrompts",
        skip_serializing_if = "Option::is_none"
    )]
    pub managers_write_prompts: Option<bool>,
    #[serde(
        rename = "membersViewAnalytics",
        skip_serializing_if = "Option::is_none"
    )]
    pub members_view_analytics: Option<bool>,
    #[serde(
        rename = "managersViewAnalytics",
        skip_serializing_if = "Option::is_none"
    )]
    pub managers_view_analytics: Option<bool>,
}

/// The settings in force in a workspace: its override, else the organisation's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EffectiveSettings {
    pub user_api_keys_per_workspace_max: Option<i64>,
    pub access: AccessSettings,
}

impl WorkspaceSettings {
    pub fn effective(&self, org: &OrganisationSettings) -> EffectiveSettings {
        let a = org.access;
        EffectiveSettings {
            user_api_keys_per_workspace_max: self
                .user_api_keys_per_workspace_max
                .or(org.user_api_keys_per_workspace_max),
            access: AccessSettings {
                members_view_prompts: self.members_view_prompts.unwrap_or(a.members_view_prompts),
                members_write_prompts: self
                    .members_write_prompts
                    .unwrap_or(a.members_write_prompts),
                managers_view_prompts: self
                    .managers_view_prompts
                    .unwrap_or(a.managers_view_prompts),
                managers_write_prompts: self
                    .managers_write_prompts
                    .unwrap_or(a.managers_write_prompts),
                members_view_analytics: self
                    .members_view_analytics
                    .unwrap_or(a.members_view_analytics),
                managers_view_analytics: self
                    .managers_view_analytics
                    .unwrap_or(a.managers_view_analytics),
            },
        }
    }
}

impl Store {
    /// Changes the organisation's settings: `change` edits (and checks) the current document
    /// inside the write transaction, so concurrent updates apply one after the other.
    pub async fn update_organisation_settings<F>(
        &self,
        actor: Actor<'_>,
        change: F,
    ) -> Result<OrganisationSettings>
    where
        F: FnOnce(&mut OrganisationSettings) -> Result<()>,
    {
        let org = &actor.principal.organisation_id;
        let now = time::format(time::now());
        let mut tx = self.db.begin_write().await?;
        // Taking the row first makes a concurrent update wait for this one (PostgreSQL).
        let done = sqlx::query("UPDATE organisations SET last_updated_at = $1 WHERE id = $2")
            .bind(&now)
            .bind(org)
            .execute(&mut *tx)
            .await?;
        if done.rows_affected() == 0 {
            return Err(AdminError::not_found("no such organisation"));
        }
        let mut settings = organisation_settings_in(&mut tx, org).await?;
        change(&mut settings)?;
        sqlx::query("UPDATE organisations SET settings = $1 WHERE id = $2")
            .bind(to_text(&settings))
            .bind(org)
            .execute(&mut *tx)
            .await?;
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("update", "organisation_settings").resource(org),
        )
        .await?;
        tx.commit().await?;
        Ok(settings)
    }

    /// A workspace's overrides (none when it has never had any).
    pub async fn workspace_settings(&self, workspace_id: &str) -> Result<WorkspaceSettings> {
        let text: Option<String> =
            sqlx::query_scalar("SELECT settings FROM workspace_settings WHERE workspace_id = $1")
                .bind(workspace_id)
                .fetch_optional(self.db.pool())
                .await?;
        text.map_or_else(
            || Ok(WorkspaceSettings::default()),
            |t| from_text("workspace_settings.settings", &t),
        )
    }

    /// The settings in force in a workspace (for the handlers that apply them).
    pub async fn effective_workspace_settings(
        &self,
        organisation_id: &str,
        workspace_id: &str,
    ) -> Result<EffectiveSettings> {
        let org = self.organisation_settings(organisation_id).await?;
        Ok(self.workspace_settings(workspace_id).await?.effective(&org))
    }

    /// Changes a workspace's overrides: `change` edits the current ones inside the write
    /// transaction.
    pub async fn update_workspace_settings<F>(
        &self,
        actor: Actor<'_>,
        ws: &Workspace,
        change: F,
    ) -> Result<WorkspaceSettings>
    where
        F: FnOnce(&mut WorkspaceSettings) -> Result<()>,
    {
        let now = time::format(time::now());
        let mut tx = self.db.begin_write().await?;
        // The workspace's row, taken: it still exists, and concurrent updates queue.
        let done = sqlx::query(
            "UPDATE workspaces SET last_updated_at = last_updated_at
             WHERE id = $1 AND organisation_id = $2",
        )
        .bind(&ws.id)
        .bind(&ws.organisation_id)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Err(AdminError::not_found(format!("no workspace {}", ws.id)));
        }
        let text: Option<String> =
            sqlx::query_scalar("SELECT settings FROM workspace_settings WHERE workspace_id = $1")
                .bind(&ws.id)
                .fetch_optional(&mut *tx)
                .await?;
        let mut settings: WorkspaceSettings = match text {
            Some(t) => from_text("workspace_settings.settings", &t)?,
            None => WorkspaceSettings::default(),
        };
        change(&mut settings)?;
        sqlx::query(
            "INSERT INTO workspace_settings (workspace_id, settings, created_at, last_updated_at)
             VALUES ($1, $2, $3, $3)
             ON CONFLICT (workspace_id)
             DO UPDATE SET settings = excluded.settings, last_updated_at = excluded.last_updated_at",
        )
        .bind(&ws.id)
        .bind(to_text(&settings))
        .bind(&now)
        .execute(&mut *tx)
        .await?;
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("update", "workspace_settings")
                .resource(&ws.id)
                .workspace(Some(&ws.id)),
        )
        .await?;
        tx.commit().await?;
        Ok(settings)
    }
}

async fn organisation_settings_in(
    tx: &mut Tx,
    organisation_id: &str,
) -> Result<OrganisationSettings> {
    let text: Option<String> =
        sqlx::query_scalar("SELECT settings FROM organisations WHERE id = $1")
            .bind(organisation_id)
            .fetch_optional(&mut **tx)
            .await?;
    let text = text.ok_or_else(|| AdminError::not_found("no such organisation"))?;
    from_text("organisations.settings", &text)
}

/// In the transaction that makes a workspace user key: refuses it (409) when its user already
/// holds as many keys in the workspace as the settings in force allow. The user's row is taken
/// first, so keys made for one user at the same time are counted one after the other.
pub(super) async fn enforce_user_key_limit(
    tx: &mut Tx,
    organisation_id: &str,
    workspace_id: &str,
    user_id: &str,
) -> Result<()> {
    sqlx::query(
        "UPDATE users SET last_updated_at = last_updated_at WHERE id = $1 AND organisation_id = $2",
    )
    .bind(user_id)
    .bind(organisation_id)
    .execute(&mut **tx)
    .await?;
    let org = organisation_settings_in(tx, organisation_id).await?;
    let text: Option<String> =
        sqlx::query_scalar("SELECT settings FROM workspace_settings WHERE workspace_id = $1")
            .bind(workspace_id)
            .fetch_optional(&mut **tx)
            .await?;
    let ws: WorkspaceSettings = match text {
        Some(t) => from_text("workspace_settings.settings", &t)?,
        None => WorkspaceSettings::default(),
    };
    let Some(max) = ws.effective(&org).user_api_keys_per_workspace_max else {
        return Ok(());
    };
    let held: i64 = sqlx::query(
        "SELECT COUNT(*) FROM api_keys
         WHERE organisation_id = $1 AND workspace_id = $2 AND user_id = $3 AND type = 'workspace-user'",
    )
    .bind(organisation_id)
    .bind(workspace_id)
    .bind(user_id)
    .fetch_one(&mut **tx)
    .await?
    .try_get(0)?;
    if held >= max {
        return Err(AdminError::conflict(format!(
            "the user {user_id} already holds {held} API key(s) in this workspace, the most its \
             settings allow (user_api_keys_per_workspace_max: {max}); delete one first"
        )));
    }
    Ok(())
}

/// In the transaction that makes a deployment of type `kind` (or changes one to it; `other_than`
/// is that deployment): refuses it (409) when the organisation already has as many deployments
/// of the type as its settings allow. The organisation's row is taken first, so deployments
/// made at the same time are counted one after the other.
pub(super) async fn enforce_deployment_limit(
    tx: &mut Tx,
    organisation_id: &str,
    kind: &str,
    other_than: Option<&str>,
) -> Result<()> {
    sqlx::query("UPDATE organisations SET last_updated_at = last_updated_at WHERE id = $1")
        .bind(organisation_id)
        .execute(&mut **tx)
        .await?;
    let org = organisation_settings_in(tx, organisation_id).await?;
    let (setting, max) = match kind {
        "production" => ("deployments_production_max", org.deployments_production_max),
        _ => (
            "deployments_non_production_max",
            org.deployments_non_production_max,
        ),
    };
    let Some(max) = max else {
        return Ok(());
    };
    let held: i64 = sqlx::query(
        "SELECT COUNT(*) FROM deployments WHERE organisation_id = $1 AND type = $2 AND id <> $3",
    )
    .bind(organisation_id)
    .bind(kind)
    .bind(other_than.unwrap_or(""))
    .fetch_one(&mut **tx)
    .await?
    .try_get(0)?;
    if held >= max {
        return Err(AdminError::conflict(format!(
            "the organisation already has {held} {kind} deployment(s), the most its settings \
             allow ({setting}: {max}); delete one or raise the limit first"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn stored_documents_read_with_defaults() {
        // A document written before these settings existed.
        let old: OrganisationSettings = serde_json::from_value(
            json!({"api_key_default_expiry_days": 30, "api_key_max_expiry_days": 60}),
        )
        .unwrap();
        assert_eq!(old.api_key_default_expiry_days, Some(30));
        assert_eq!(old.user_api_keys_per_workspace_max, None);
        assert_eq!(old.deployments_production_max, None);
        assert_eq!(old.access, AccessSettings::default());
        let d = serde_json::to_value(OrganisationSettings::default()).unwrap();
        assert_eq!(
            d,
            json!({
                "api_key_default_expiry_days": 365,
                "api_key_max_expiry_days": 730,
                "user_api_keys_per_workspace_max": null,
                "deployments_production_max": null,
                "deployments_non_production_max": null,
                "membersViewPrompts": true,
                "membersWritePrompts": false,
                "managersViewPrompts": true,
                "managersWritePrompts": true,
                "membersViewAnalytics": true,
                "managersViewAnalytics": true,
            })
        );
        let back: OrganisationSettings = serde_json::from_value(d).unwrap();
        assert_eq!(back, OrganisationSettings::default());
    }

    #[test]
    fn overrides_win_over_the_organisation() {
        let mut org = OrganisationSettings {
            user_api_keys_per_workspace_max: Some(5),
            ..OrganisationSettings::default()
        };
        org.access.members_write_prompts = true;
        let none = WorkspaceSettings::default();
        assert_eq!(serde_json::to_value(&none).unwrap(), json!({}));
        let e = none.effective(&org);
        assert_eq!(e.user_api_keys_per_workspace_max, Some(5));
        assert_eq!(e.access, org.access);
        let some = WorkspaceSettings {
            user_api_keys_per_workspace_max: Some(2),
            members_write_prompts: Some(false),
            managers_view_analytics: Some(false),
            ..WorkspaceSettings::default()
        };
        let e = some.effective(&org);
        assert_eq!(e.user_api_keys_per_workspace_max, Some(2));
        assert!(!e.access.members_write_prompts);
        assert!(!e.access.managers_view_analytics);
        assert!(e.access.members_view_prompts);
        assert_eq!(
            serde_json::to_value(&some).unwrap(),
            json!({"user_api_keys_per_workspace_max": 2, "membersWritePrompts": false, "managersViewAnalytics": false})
        );
    }
}
