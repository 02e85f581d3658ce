//! Authentication: a raw key from `x-gw-api-key` to the principal behind it.

use std::collections::BTreeSet;

use plugin_sdk::access::TokenIdentity;
use sqlx::any::AnyRow;
use sqlx::Row;

use super::Store;
use crate::authz::{Access, KeyKind, KeyUser, OrgRole, Principal, WorkspaceRole};
use crate::error::{AdminError, Result};
use crate::{keys, time};

impl Store {
    /// The key whose current value hashes to `hash`, else the one whose previous value does
    /// with its transition ending after `previous_until` (an RFC 3339 time; `""`: any).
    ///
    /// Two lookups, each on one index, rather than one with `OR`: PostgreSQL may keep a plan
    /// for the `OR` made while the table was small (a sequential scan) as the table grows,
    /// making each call slower with every key.
    pub(super) async fn key_by_hash(
        &self,
        hash: &str,
        previous_until: &str,
    ) -> Result<Option<AnyRow>> {
        const COLUMNS: &str = "id, organisation_id, workspace_id, user_id, created_by_user_id,
            type, status, scopes, expires_at";
        let current = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM api_keys WHERE key_hash = $1"
        )))
        .bind(hash)
        .fetch_optional(self.db.pool())
        .await?;
        if current.is_some() {
            return Ok(current);
        }
        Ok(sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM api_keys
             WHERE previous_key_hash = $1 AND previous_key_expires_at > $2"
        )))
        .bind(hash)
        .bind(previous_until)
        .fetch_optional(self.db.pool())
        .await?)
    }

    /// The principal of a raw key: 401 for an unknown, deleted or expired key (expired by its
    /// `expires_at` even before the expiry worker has marked it), or a user key whose user has
    /// left its workspace. A rotated key still works until its transition period ends.
    pub async fn authenticate(&self, raw_key: &str) -> Result<Principal> {
        let unknown = || AdminError::unauthorized("invalid API key");
        if raw_key.is_empty() || raw_key.len() > 512 {
            return Err(unknown());
        }
        let hash = keys::hash(raw_key);
        let now = time::format(time::now());
        let row = self.key_by_hash(&hash, &now).await?.ok_or_else(unknown)?;
        let status: String = row.try_get("status")?;
        let expires_at: Option<String> = row.try_get("expires_at")?;
        if status == "expired" || expires_at.is_some_and(|t| t <= now) {
            return Err(AdminError::unauthorized("the API key has expired"));
        }
        let kind_text: String = row.try_get("type")?;
        let kind = KeyKind::parse(&kind_text)
            .ok_or_else(|| super::bad_column("api_keys.type", &kind_text))?;
        let key_id: String = row.try_get("id")?;
        let organisation_id: String = row.try_get("organisation_id")?;
        let workspace_id: Option<String> = row.try_get("workspace_id")?;
        let key_user: Option<String> = row.try_get("user_id")?;
        let created_by: Option<String> = row.try_get("created_by_user_id")?;
        let scopes: BTreeSet<String> =
            super::from_text("api_keys.scopes", &row.try_get::<String, _>("scopes")?)?;

        let workspace = || {
            workspace_id
                .clone()
                .ok_or_else(|| super::bad_column("api_keys.workspace_id", "null"))
        };
        let (access, user_id, user_org_role) = match kind {
            KeyKind::OrganisationService => (
                Access::Organisation {
                    role: OrgRole::Admin,
                },
                created_by,
                None,
            ),
            KeyKind::WorkspaceService => (
                Access::Workspace {
                    workspace_id: workspace()?,
                    role: WorkspaceRole::Manager,
                },
                created_by,
                None,
            ),
            KeyKind::WorkspaceUser => {
                let user_id =
                    key_user.ok_or_else(|| super::bad_column("api_keys.user_id", "null"))?;
                let ws = workspace()?;
                let user = self.key_user(&organisation_id, &ws, &user_id).await?;
                let role = user.and_then(|u| u.workspace_role()).ok_or_else(|| {
                    AdminError::unauthorized(
                        "the API key's user is no longer a member of its workspace",
                    )
                })?;
                (
                    Access::Workspace {
                        workspace_id: ws,
                        role,
                    },
                    Some(user_id),
                    user.map(|u| u.org_role),
                )
            }
        };
        Ok(Principal {
            organisation_id,
            key_id: Some(key_id),
            key_kind: Some(kind),
            user_id,
            access,
            scopes: Some(scopes),
            user_org_role,
        })
    }

    /// The principal of a verified JWT (the data plane's `jwt:` settings and claims): a caller
    /// confined to the token's workspace, like a workspace service key, that only reads and
    /// lists (its `*.read`, `*.list` and `*.view` scopes; any other scope it carries is not
    /// taken). 403 for a token without a workspace, or naming one the organisation claim does
    /// not own or that does not exist.
    pub async fn token_principal(&self, token: &TokenIdentity) -> Result<Principal> {
        let named = token.workspace_id.as_deref().ok_or_else(|| {
            AdminError::forbidden(
                "a JWT reaches the control plane only within its workspace: the token names none",
            )
        })?;
        // By id; by slug only within the organisation the token names.
        let row = sqlx::query(
            "SELECT id, organisation_id FROM workspaces
             WHERE id = $1 OR (slug = $1 AND organisation_id = $2)",
        )
        .bind(named)
        .bind(token.organisation_id.as_deref().unwrap_or(""))
        .fetch_optional(self.db.pool())
        .await?;
        let refused = || {
            AdminError::forbidden(format!(
                "the token's workspace {named:?} is not one of this gateway"
            ))
        };
        let row = row.ok_or_else(refused)?;
        let workspace_id: String = row.try_get("id")?;
        let organisation_id: String = row.try_get("organisation_id")?;
        if token
            .organisation_id
            .as_deref()
            .is_some_and(|org| org != organisation_id)
        {
            return Err(refused());
        }
        let scopes = token
            .scopes
            .iter()
            .filter(|s| {
                s.rsplit_once('.')
                    .is_some_and(|(_, op)| matches!(op, "read" | "list" | "view"))
            })
            .cloned()
            .collect();
        Ok(Principal {
            organisation_id,
            key_id: None,
            key_kind: Some(KeyKind::WorkspaceService),
            user_id: None,
            access: Access::Workspace {
                workspace_id,
                role: WorkspaceRole::Manager,
            },
            scopes: Some(scopes),
            user_org_role: None,
        })
    }

    /// A user's role in a workspace: organisation owners and admins are workspace admins
    /// everywhere; others have the role of their membership, or none.
    pub async fn workspace_role_of(
        &self,
        organisation_id: &str,
        workspace_id: &str,
        user_id: &str,
    ) -> Result<Option<WorkspaceRole>> {
        Ok(self
            .key_user(organisation_id, workspace_id, user_id)
            .await?
            .and_then(|u| u.workspace_role()))
    }

    /// A user of the organisation as a workspace sees them: their organisation role and their
    /// explicit membership of the workspace; `None` for no such user.
    pub async fn key_user(
        &self,
        organisation_id: &str,
        workspace_id: &str,
        user_id: &str,
    ) -> Result<Option<KeyUser>> {
        let row = sqlx::query(
            "SELECT u.role AS org_role, m.role AS ws_role
             FROM users u
             LEFT JOIN workspace_members m ON m.user_id = u.id AND m.workspace_id = $1
             WHERE u.id = $2 AND u.organisation_id = $3",
        )
        .bind(workspace_id)
        .bind(user_id)
        .bind(organisation_id)
        .fetch_optional(self.db.pool())
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let org_role: String = row.try_get("org_role")?;
        let org_role =
            OrgRole::parse(&org_role).ok_or_else(|| super::bad_column("users.role", &org_role))?;
        let ws_role: Option<String> = row.try_get("ws_role")?;
        Ok(Some(KeyUser {
            org_role,
            membership: ws_role.as_deref().and_then(WorkspaceRole::parse),
        }))
    }
}
