//! The first start: an organisation, its owner, the `default` workspace and an admin key,
//! made once. The check and the creation run in one transaction under the database's write
//! lock (SQLite) or an advisory lock (PostgreSQL), and a one-row table keeps a second
//! organisation from ever being made by a race.

use serde_json::json;

use super::audit::{self, AuditEntry};
use super::changes::Change;
use super::{
    api_keys, insert_user, to_text, workspaces, NewKey, NewWorkspace, OrganisationSettings, Store,
};
use crate::authz::{grantable_scopes, KeyKind, OrgRole};
use crate::error::{AdminError, Result};
use crate::{keys, time};

/// What the first start makes.
#[derive(Clone)]
pub struct BootstrapOptions {
    /// The admin key's value (`GW_BOOTSTRAP_ADMIN_KEY`); `None`: generate one.
    pub admin_key: Option<String>,
    pub organisation_name: String,
    pub owner_email: String,
}

impl std::fmt::Debug for BootstrapOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BootstrapOptions")
            .field("admin_key", &self.admin_key.as_ref().map(|_| "<redacted>"))
            .field("organisation_name", &self.organisation_name)
            .field("owner_email", &self.owner_email)
            .finish()
    }
}

impl Default for BootstrapOptions {
    fn default() -> Self {
        BootstrapOptions {
            admin_key: None,
            organisation_name: "Default organisation".into(),
            owner_email: "owner@gateway.local".into(),
        }
    }
}

/// What bootstrap found or made.
#[derive(Clone, PartialEq, Eq)]
pub enum BootstrapOutcome {
    /// This call made the organisation.
    Created {
        organisation_id: String,
        owner_id: String,
        workspace_id: String,
        admin_key_id: String,
        /// The generated admin key, to be shown once; `None` when it was supplied.
        generated_key: Option<String>,
    },
    /// The database already had its organisation.
    Existing { organisation_id: String },
}

impl std::fmt::Debug for BootstrapOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BootstrapOutcome::Created {
                organisation_id,
                workspace_id,
                admin_key_id,
                generated_key,
                ..
            } => f
                .debug_struct("Created")
                .field("organisation_id", organisation_id)
                .field("workspace_id", workspace_id)
                .field("admin_key_id", admin_key_id)
                .field(
                    "generated_key",
                    &generated_key.as_ref().map(|_| "<redacted>"),
                )
                .finish(),
            BootstrapOutcome::Existing { organisation_id } => f
                .debug_struct("Existing")
                .field("organisation_id", organisation_id)
                .finish(),
        }
    }
}

impl BootstrapOutcome {
    pub fn organisation_id(&self) -> &str {
        match self {
            BootstrapOutcome::Created {
                organisation_id, ..
            }
            | BootstrapOutcome::Existing { organisation_id } => organisation_id,
        }
    }
}

impl Store {
    /// Makes the organisation, owner, default workspace and admin key unless the database
    /// already has them. Safe to run from several processes at once.
    pub async fn bootstrap(&self, options: &BootstrapOptions) -> Result<BootstrapOutcome> {
        if let Some(key) = &options.admin_key {
            if key.chars().count() < keys::MIN_SUPPLIED_KEY_LEN
                || key.chars().any(char::is_whitespace)
            {
                return Err(AdminError::validation(format!(
                    "GW_BOOTSTRAP_ADMIN_KEY must be at least {} characters without spaces",
                    keys::MIN_SUPPLIED_KEY_LEN
                )));
            }
        }
        let mut tx = self.db.begin_exclusive().await?;
        let existing: Option<String> =
            sqlx::query_scalar("SELECT organisation_id FROM bootstrap WHERE id = 1")
                .fetch_optional(&mut *tx)
                .await?;
        if let Some(organisation_id) = existing {
            tx.rollback().await?;
            return Ok(BootstrapOutcome::Existing { organisation_id });
        }

        let organisation_id = uuid::Uuid::new_v4().to_string();
        let now = time::format(time::now());
        sqlx::query(
            "INSERT INTO organisations (id, name, settings, created_at, last_updated_at)
             VALUES ($1, $2, $3, $4, $4)",
        )
        .bind(&organisation_id)
        .bind(&options.organisation_name)
        .bind(to_text(&OrganisationSettings::default()))
        .bind(&now)
        .execute(&mut *tx)
        .await?;
        sqlx::query("INSERT INTO bootstrap (id, organisation_id, created_at) VALUES (1, $1, $2)")
            .bind(&organisation_id)
            .bind(&now)
            .execute(&mut *tx)
            .await?;
        let owner = insert_user(
            &mut tx,
            &organisation_id,
            &options.owner_email,
            OrgRole::Owner,
        )
        .await?;
        let workspace = workspaces::insert(
            &mut tx,
            &organisation_id,
            &NewWorkspace {
                slug: "default".into(),
                name: "Default".into(),
                description: Some("Made by the first start".into()),
                defaults: json!({}),
                usage_limits: Vec::new(),
                rate_limits: Vec::new(),
                members: Vec::new(),
            },
        )
        .await?;
        let generated = options.admin_key.is_none().then(keys::generate);
        let raw = options
            .admin_key
            .clone()
            .or_else(|| generated.clone())
            .expect("a supplied or generated key");
        // The bootstrap key holds every scope and does not expire: it is how the organisation
        // is administered until people make keys of their own.
        let admin_key_id = api_keys::insert(
            &mut tx,
            &organisation_id,
            &NewKey {
                kind: KeyKind::OrganisationService,
                name: "Bootstrap admin key".into(),
                description: Some("Made by the first start".into()),
                workspace_id: None,
                user_id: None,
                created_by_user_id: Some(owner.id.clone()),
                scopes: grantable_scopes(KeyKind::OrganisationService),
                rate_limits: Vec::new(),
                usage_limits: None,
                defaults: json!({}),
                alert_emails: Vec::new(),
                rotation_policy: None,
                expires_at: None,
            },
            &raw,
        )
        .await?;
        audit::insert_system(
            &mut tx,
            &organisation_id,
            &AuditEntry::new("bootstrap", "organisation").resource(&organisation_id),
        )
        .await?;
        // The default workspace and the admin key join the data plane.
        self.data_plane_changed(&mut tx, &[Change::Everything])
            .await?;
        tx.commit().await?;
        self.after_data_plane_change().await;
        Ok(BootstrapOutcome::Created {
            organisation_id,
            owner_id: owner.id,
            workspace_id: workspace.id,
            admin_key_id,
            generated_key: generated,
        })
    }

    /// The organisation made by bootstrap, if any.
    pub async fn organisation_id(&self) -> Result<Option<String>> {
        Ok(
            sqlx::query_scalar("SELECT organisation_id FROM bootstrap WHERE id = 1")
                .fetch_optional(self.db.pool())
                .await?,
        )
    }
}
