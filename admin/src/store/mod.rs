//! The control plane's store: every read and write of its tables. Each write is one
//! transaction that also records the audit entry, so a change and its record land together or
//! not at all.

pub mod access;
mod api_keys;
pub mod audit;
mod auth;
mod bootstrap;
pub mod changes;
mod charges;
pub mod config_secrets;
mod configs;
mod deployments;
mod guardrails;
mod integration_models;
mod integrations;
mod invites;
pub mod logs;
mod members;
mod policies;
mod providers;
mod settings;
pub mod snapshot;
mod usage;
mod users;
mod workspaces;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::any::AnyRow;
use sqlx::Row;

pub(crate) use api_keys::fill_next_rotation_at;
pub use api_keys::{
    ApiKey, KeyChanges, KeyFilter, NewKey, Rotated, RotatedKey, MIN_KEY_TRANSITION_MS,
};
pub use audit::{AuditEntry, AuditFilter, RefusalSummary, RefusedAttempt, RequestMeta};
pub use bootstrap::{BootstrapOptions, BootstrapOutcome};
pub use changes::Change;
pub use charges::ChargeReport;
pub use configs::{Config, ConfigChanges, ConfigFilter, ConfigVersion, NewConfig};
pub use deployments::{Deployment, DeploymentChanges, NewDeployment};
pub use guardrails::{Guardrail, GuardrailChanges, GuardrailFilter, NewGuardrail};
pub use integration_models::{IntegrationModel, ModelPricing, MAX_MODELS_PER_INTEGRATION};
pub use integrations::{
    Integration, IntegrationChanges, IntegrationFilter, IntegrationWorkspace, NewIntegration,
    Origin, WorkspaceAccess, WorkspaceAccessChange, WorkspaceAccessChanges, AI_PROVIDER_IDS,
};
pub use invites::{
    Accepted, Invite, InviteFilter, InviteWorkspace, NewInvite, INVITE_VALIDITY_DAYS,
};
pub use members::WorkspaceMember;
pub use policies::{
    value_key, Condition, EntityFilter, GroupBy, NewRateLimitsPolicy, NewUsageLimitsPolicy,
    PolicyFilter, PolicyStatus, RateLimitsChanges, RateLimitsPolicy, UsageEntity,
    UsageLimitsChanges, UsageLimitsPolicy,
};
pub use providers::{NewProvider, Provider, ProviderChanges, ProviderFilter};
pub use settings::{EffectiveSettings, WorkspaceSettings};
pub use snapshot::{ConfigCheck, DataPlaneOptions, Published, Snapshot};
pub use users::{OrgUser, UserFilter};
pub use workspaces::{
    BudgetUsage, Member, NewWorkspace, Workspace, WorkspaceChanges, WorkspaceFilter,
};

use crate::authz::{OrgRole, Principal};
use crate::db::{Db, Tx};
use crate::error::{AdminError, Result};
use crate::time;

/// The store over one database.
#[derive(Clone, Debug)]
pub struct Store {
    db: Db,
    /// Secrets, config checks and the snapshot the data plane reads ([`snapshot`]).
    data_plane: std::sync::Arc<snapshot::DataPlane>,
}

/// Who made a write and the request that carried it: what the audit log records.
#[derive(Debug, Clone, Copy)]
pub struct Actor<'a> {
    pub principal: &'a Principal,
    pub request: &'a RequestMeta,
}

/// Organisation-wide settings, stored as a JSON document on the organisation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct OrganisationSettings {
    /// Days until a new key expires when its creator gives no `expires_at`; `None`: never.
    pub api_key_default_expiry_days: Option<i64>,
    /// The latest `expires_at` a key may have, in days from the request; `None`: no limit
    /// (and keys may then be made without expiry).
    pub api_key_max_expiry_days: Option<i64>,
    /// The most workspace user keys one user may hold in one workspace; `None`: no limit.
    /// Workspaces may override it.
    pub user_api_keys_per_workspace_max: Option<i64>,
    /// The most deployments of type `production` the organisation may have (0 to 10000);
    /// `None` (the default): no limit. Checked as a deployment is made or changes type.
    pub deployments_production_max: Option<i64>,
    /// The most deployments of type `non-production` (0 to 10000); `None` (the default): no
    /// limit.
    pub deployments_non_production_max: Option<i64>,
    /// Prompt and analytics access of workspace managers and members (`membersViewPrompts`...).
    #[serde(flatten)]
    pub access: crate::authz::AccessSettings,
}

/// Keys expire after a year unless their creator says otherwise, and after two at the latest.
impl Default for OrganisationSettings {
    fn default() -> Self {
        OrganisationSettings {
            api_key_default_expiry_days: Some(365),
            api_key_max_expiry_days: Some(730),
            user_api_keys_per_workspace_max: None,
            deployments_production_max: None,
            deployments_non_production_max: None,
            access: crate::authz::AccessSettings::default(),
        }
    }
}

/// A user of the organisation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub id: String,
    pub organisation_id: String,
    pub email: String,
    pub role: OrgRole,
}

impl Store {
    /// Opens the database and applies the migrations it lacks.
    /// (The data plane's secret key and checks take their defaults: see
    /// [`Store::open_with`].)
    pub async fn open(database_url: &str) -> Result<Store> {
        Store::open_with(database_url, DataPlaneOptions::default()).await
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    pub async fn close(&self) {
        self.db.close().await;
    }

    /// The organisation's settings.
    pub async fn organisation_settings(
        &self,
        organisation_id: &str,
    ) -> Result<OrganisationSettings> {
        let text: Option<String> =
            sqlx::query_scalar("SELECT settings FROM organisations WHERE id = $1")
                .bind(organisation_id)
                .fetch_optional(self.db.pool())
                .await?;
        let text = text.ok_or_else(|| AdminError::not_found("no such organisation"))?;
        Ok(serde_json::from_str(&text).unwrap_or_default())
    }

    /// Replaces the organisation's settings (recorded in the audit log).
    pub async fn set_organisation_settings(
        &self,
        actor: Actor<'_>,
        settings: &OrganisationSettings,
    ) -> Result<()> {
        let mut tx = self.db.begin_write().await?;
        sqlx::query("UPDATE organisations SET settings = $1, last_updated_at = $2 WHERE id = $3")
            .bind(to_text(settings))
            .bind(time::format(time::now()))
            .bind(&actor.principal.organisation_id)
            .execute(&mut *tx)
            .await?;
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("update", "organisation_settings")
                .resource(&actor.principal.organisation_id),
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Adds a user to the organisation. (The users and invites endpoints come later; bootstrap
    /// and tests use this.)
    pub async fn create_user(
        &self,
        organisation_id: &str,
        email: &str,
        role: OrgRole,
    ) -> Result<User> {
        let mut tx = self.db.begin_write().await?;
        let user = insert_user(&mut tx, organisation_id, email, role).await?;
        tx.commit().await?;
        Ok(user)
    }

    /// A user of the organisation.
    pub async fn user(&self, organisation_id: &str, user_id: &str) -> Result<Option<User>> {
        let row = sqlx::query(
            "SELECT id, organisation_id, email, role FROM users WHERE id = $1 AND organisation_id = $2",
        )
        .bind(user_id)
        .bind(organisation_id)
        .fetch_optional(self.db.pool())
        .await?;
        row.map(|r| user_from_row(&r)).transpose()
    }
}

async fn insert_user(
    tx: &mut Tx,
    organisation_id: &str,
    email: &str,
    role: OrgRole,
) -> Result<User> {
    let id = uuid::Uuid::new_v4().to_string();
    let now = time::format(time::now());
    sqlx::query(
        "INSERT INTO users (id, organisation_id, email, role, created_at, last_updated_at)
         VALUES ($1, $2, $3, $4, $5, $5)",
    )
    .bind(&id)
    .bind(organisation_id)
    .bind(email)
    .bind(role.as_str())
    .bind(&now)
    .execute(&mut **tx)
    .await
    .map_err(|e| {
        if crate::error::is_unique_violation(&e) {
            AdminError::conflict(format!("a user with the e-mail {email} already exists"))
        } else {
            e.into()
        }
    })?;
    Ok(User {
        id,
        organisation_id: organisation_id.to_owned(),
        email: email.to_owned(),
        role,
    })
}

fn user_from_row(r: &AnyRow) -> Result<User> {
    let role: String = r.try_get("role")?;
    Ok(User {
        id: r.try_get("id")?,
        organisation_id: r.try_get("organisation_id")?,
        email: r.try_get("email")?,
        role: OrgRole::parse(&role).ok_or_else(|| bad_column("users.role", &role))?,
    })
}

/// A stored JSON document as text.
fn to_text<T: Serialize + ?Sized>(value: &T) -> String {
    serde_json::to_string(value).expect("control-plane documents serialise")
}

/// A stored JSON document back from text.
fn from_text<T: for<'de> Deserialize<'de>>(column: &str, text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| bad_column(column, &format!("{e}: {text}")))
}

fn json_column(r: &AnyRow, column: &str) -> Result<Value> {
    let text: String = r.try_get(column)?;
    from_text(column, &text)
}

fn bad_column(column: &str, value: &str) -> AdminError {
    tracing::error!(
        column,
        value,
        "unreadable value in the control-plane database"
    );
    AdminError::internal(format!("unreadable value in {column}"))
}

/// `LIKE` pattern matching `text` anywhere, with its wildcards escaped (`ESCAPE '\'`).
fn contains_pattern(text: &str) -> String {
    let mut p = String::from("%");
    for c in text.to_lowercase().chars() {
        if matches!(c, '%' | '_' | '\\') {
            p.push('\\');
        }
        p.push(c);
    }
    p.push('%');
    p
}

/// `query` with `value` bound as its `$1` when there is one: for a statement whose filter on
/// `$1` is only written when there is something to filter by.
fn bind_some<'q>(
    query: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>,
    value: Option<&'q str>,
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments> {
    match value {
        Some(v) => query.bind(v),
        None => query,
    }
}
