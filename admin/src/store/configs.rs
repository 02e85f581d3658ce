//! Saved routing configs and their versions. Every update adds a version; the config points at
//! its current one, which is what the data plane serves. Secrets inside a config are sealed at
//! rest and shown masked ([`super::config_secrets`]); the data plane's snapshot opens them.

use serde_json::{json, Value};
use sqlx::any::AnyRow;
use sqlx::Row;

use super::audit::{self, AuditEntry};
use super::changes::Change;
use super::config_secrets::{self, Sealed};
use super::{to_text, Actor, Store};
use crate::db::{Sql, Tx};
use crate::error::{is_unique_violation, AdminError, Result};
use crate::time;
use crate::validate::Page;

/// A config to create.
#[derive(Debug, Clone)]
pub struct NewConfig {
    pub workspace_id: String,
    pub slug: String,
    pub name: String,
    pub config: Value,
    pub is_default: bool,
}

/// A stored config with its current version; `config` shows its secrets masked.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub id: String,
    pub organisation_id: String,
    pub workspace_id: String,
    pub slug: String,
    pub name: String,
    pub is_default: bool,
    pub status: String,
    pub version_id: String,
    pub version: i64,
    pub config: Value,
    pub created_at: String,
    pub last_updated_at: String,
}

impl Config {
    pub fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "slug": self.slug,
            "name": self.name,
            "organisation_id": self.organisation_id,
            "workspace_id": self.workspace_id,
            "is_default": self.is_default,
            "status": self.status,
            "version_id": self.version_id,
            "version": self.version,
            "config": self.config,
            "created_at": self.created_at,
            "last_updated_at": self.last_updated_at,
            "object": "config",
        })
    }
}

/// One version of a config; `config` shows its secrets masked.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigVersion {
    pub id: String,
    pub config_id: String,
    pub version: i64,
    pub name: String,
    pub config: Value,
    pub created_by_user_id: Option<String>,
    pub created_by_key_id: Option<String>,
    pub created_at: String,
}

impl ConfigVersion {
    pub fn to_json(&self, current_version_id: &str) -> Value {
        json!({
            "id": self.id,
            "config_id": self.config_id,
            "version": self.version,
            "name": self.name,
            "config": self.config,
            "is_current": self.id == current_version_id,
            "created_by_user_id": self.created_by_user_id,
            "created_by_key_id": self.created_by_key_id,
            "created_at": self.created_at,
            "object": "config-version",
        })
    }
}

/// Changes of `PUT /configs/{slug}`; `None` leaves a field as it is. Any change makes a version.
#[derive(Debug, Clone, Default)]
pub struct ConfigChanges {
    pub name: Option<String>,
    /// The new body as the client sent it: a secret sent back masked keeps the stored one
    /// ([`config_secrets::unmask`]). Checked with the data plane's validator once unmasked.
    pub config: Option<Value>,
    pub is_default: Option<bool>,
}

/// Filters of `GET /configs`.
#[derive(Debug, Clone, Default)]
pub struct ConfigFilter {
    pub workspace_id: Option<String>,
}

const COLUMNS: &str = "c.id, c.organisation_id, c.workspace_id, c.slug, c.name, c.is_default,
    c.status, c.current_version_id, c.version_count, c.created_at, c.last_updated_at, v.config,
    v.secrets";

const FROM: &str = " FROM configs c JOIN config_versions v ON v.id = c.current_version_id";

fn from_row(r: &AnyRow) -> Result<Config> {
    Ok(Config {
        id: r.try_get("id")?,
        organisation_id: r.try_get("organisation_id")?,
        workspace_id: r.try_get("workspace_id")?,
        slug: r.try_get("slug")?,
        name: r.try_get("name")?,
        is_default: r.try_get::<i64, _>("is_default")? != 0,
        status: r.try_get("status")?,
        version_id: r.try_get("current_version_id")?,
        version: r.try_get("version_count")?,
        config: shown_config(r)?,
        created_at: r.try_get("created_at")?,
        last_updated_at: r.try_get("last_updated_at")?,
    })
}

fn version_from_row(r: &AnyRow) -> Result<ConfigVersion> {
    Ok(ConfigVersion {
        id: r.try_get("id")?,
        config_id: r.try_get("config_id")?,
        version: r.try_get("version")?,
        name: r.try_get("name")?,
        config: shown_config(r)?,
        created_by_user_id: r.try_get("created_by_user_id")?,
        created_by_key_id: r.try_get("created_by_key_id")?,
        created_at: r.try_get("created_at")?,
    })
}

/// The body of a version as the API shows it: stored masked, or (a version written before
/// secrets were sealed, `secrets` NULL) masked as it is read.
fn shown_config(r: &AnyRow) -> Result<Value> {
    let config = super::json_column(r, "config")?;
    let sealed: Option<String> = r.try_get("secrets")?;
    Ok(match sealed {
        Some(_) => config,
        None => config_secrets::masked(&config),
    })
}

/// The stored form of a version's body: its text, and its sealed secrets (NULL for a version
/// written before they were sealed).
struct StoredBody {
    config: String,
    secrets: Option<String>,
}

impl StoredBody {
    fn read(r: &AnyRow) -> Result<StoredBody> {
        Ok(StoredBody {
            config: r.try_get("config")?,
            secrets: r.try_get("secrets")?,
        })
    }

    fn sealed(&self) -> Result<Option<Sealed>> {
        self.secrets
            .as_deref()
            .map(|s| super::from_text("config_versions.secrets", s))
            .transpose()
    }
}

/// Adds version `version` of a config; returns its id.
async fn insert_version(
    tx: &mut Tx,
    actor: Actor<'_>,
    config_id: &str,
    version: i64,
    name: &str,
    body: &StoredBody,
    now: &str,
) -> Result<String> {
    let id = uuid::Uuid::new_v4().to_string();
    sqlx::query(
        "INSERT INTO config_versions (id, config_id, version, name, config, secrets,
             created_by_user_id, created_by_key_id, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(&id)
    .bind(config_id)
    .bind(version)
    .bind(name)
    .bind(&body.config)
    .bind(body.secrets.clone())
    .bind(actor.principal.user_id.clone())
    .bind(actor.principal.key_id.clone())
    .bind(now)
    .execute(&mut **tx)
    .await?;
    Ok(id)
}

/// Makes `config_id` the only default config of its workspace.
async fn clear_other_defaults(tx: &mut Tx, workspace_id: &str, config_id: &str) -> Result<()> {
    sqlx::query("UPDATE configs SET is_default = 0 WHERE workspace_id = $1 AND id <> $2")
        .bind(workspace_id)
        .bind(config_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

impl Store {
    /// Creates a config and its first version.
    pub async fn create_config(&self, actor: Actor<'_>, new: &NewConfig) -> Result<Config> {
        let org = &actor.principal.organisation_id;
        let id = uuid::Uuid::new_v4().to_string();
        let now = time::format(time::now());
        // A mask is never taken for a secret: there is nothing stored to keep yet.
        let clear = config_secrets::unmask(new.config.clone(), &Value::Null)?;
        let (shown, body) = self.sealed_body(&id, &clear)?;
        let mut tx = self.db.begin_write().await?;
        if body.secrets.as_deref().is_some_and(|s| s != "{}") {
            self.record_secret_key(&mut tx).await?;
        }
        let version_id = uuid::Uuid::new_v4().to_string();
        sqlx::query(
            "INSERT INTO configs (id, organisation_id, workspace_id, slug, name, is_default, status,
                 current_version_id, version_count, created_at, last_updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, 'active', $7, 1, $8, $8)",
        )
        .bind(&id)
        .bind(org)
        .bind(&new.workspace_id)
        .bind(&new.slug)
        .bind(&new.name)
        .bind(i64::from(new.is_default))
        .bind(&version_id)
        .bind(&now)
        .execute(&mut *tx)
        .await
        .map_err(|e| {
            if is_unique_violation(&e) {
                AdminError::conflict(format!("a config with the slug {} already exists", new.slug))
            } else if crate::error::is_foreign_key_violation(&e) {
                AdminError::reference("workspace_id: the workspace no longer exists")
            } else {
                e.into()
            }
        })?;
        sqlx::query(
            "INSERT INTO config_versions (id, config_id, version, name, config, secrets,
                 created_by_user_id, created_by_key_id, created_at)
             VALUES ($1, $2, 1, $3, $4, $5, $6, $7, $8)",
        )
        .bind(&version_id)
        .bind(&id)
        .bind(&new.name)
        .bind(&body.config)
        .bind(body.secrets.clone())
        .bind(actor.principal.user_id.clone())
        .bind(actor.principal.key_id.clone())
        .bind(&now)
        .execute(&mut *tx)
        .await?;
        if new.is_default {
            clear_other_defaults(&mut tx, &new.workspace_id, &id).await?;
        }
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("create", "config")
                .resource(&id)
                .workspace(Some(&new.workspace_id)),
        )
        .await?;
        self.data_plane_changed(&mut tx, &[Change::Config(id.clone())])
            .await?;
        tx.commit().await?;
        self.after_data_plane_change().await;
        Ok(Config {
            id,
            organisation_id: org.clone(),
            workspace_id: new.workspace_id.clone(),
            slug: new.slug.clone(),
            name: new.name.clone(),
            is_default: new.is_default,
            status: "active".into(),
            version_id,
            version: 1,
            config: shown,
            created_at: now.clone(),
            last_updated_at: now,
        })
    }

    /// A config of the organisation by id or slug, with its current version.
    pub async fn config(&self, organisation_id: &str, id_or_slug: &str) -> Result<Option<Config>> {
        let column = if crate::validate::is_uuid(id_or_slug) {
            "c.id"
        } else {
            "c.slug"
        };
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS}{FROM} WHERE {column} = $1 AND c.organisation_id = $2"
        )))
        .bind(id_or_slug)
        .bind(organisation_id)
        .fetch_optional(self.db.pool())
        .await?;
        row.as_ref().map(from_row).transpose()
    }

    /// Configs of the organisation, newest first, and how many match in all.
    pub async fn configs(
        &self,
        organisation_id: &str,
        filter: &ConfigFilter,
        page: Page,
    ) -> Result<(i64, Vec<Config>)> {
        let mut cond = Sql::new(FROM);
        cond.push(" WHERE c.organisation_id = ")
            .text(organisation_id);
        if let Some(ws) = &filter.workspace_id {
            cond.push(" AND c.workspace_id = ").text(ws.clone());
        }
        cond.select_page(
            &self.db,
            COLUMNS,
            "c.created_at DESC, c.id DESC",
            page,
            from_row,
        )
        .await
    }

    /// Applies `changes` as a new version; returns the new version's id.
    pub async fn update_config(
        &self,
        actor: Actor<'_>,
        config: &Config,
        changes: &ConfigChanges,
    ) -> Result<String> {
        let now = time::format(time::now());
        let mut tx = self.db.begin_write().await?;
        // Takes the row (PostgreSQL locks it; SQLite holds the write lock): concurrent updates
        // number their versions one after the other.
        let mut sql =
            Sql::new("UPDATE configs SET version_count = version_count + 1, last_updated_at = ");
        sql.text(now.clone());
        if let Some(name) = &changes.name {
            sql.push(", name = ").text(name.clone());
        }
        if let Some(d) = changes.is_default {
            sql.push(", is_default = ").int(i64::from(d));
        }
        sql.push(" WHERE id = ")
            .text(config.id.clone())
            .push(" AND organisation_id = ")
            .text(config.organisation_id.clone())
            .push(" RETURNING version_count, current_version_id, name");
        let row = sql
            .query()
            .fetch_optional(&mut *tx)
            .await?
            .ok_or_else(|| AdminError::not_found(format!("no config {}", config.slug)))?;
        let version: i64 = row.try_get("version_count")?;
        let previous: String = row.try_get("current_version_id")?;
        let name: String = row.try_get("name")?;
        let previous = sqlx::query("SELECT config, secrets FROM config_versions WHERE id = $1")
            .bind(&previous)
            .fetch_one(&mut *tx)
            .await?;
        let previous = StoredBody::read(&previous)?;
        let body = match &changes.config {
            Some(sent) => {
                // Masks sent back keep the stored secrets; the result is what is checked.
                let current = config_secrets::open(
                    self.cipher().ok(),
                    &config.id,
                    &super::from_text("config_versions.config", &previous.config)?,
                    previous.sealed()?.as_ref(),
                )?;
                let clear = config_secrets::unmask(sent.clone(), &current)?;
                self.check_config(&clear)
                    .map_err(|problem| AdminError::field("config", problem))?;
                let (_, body) = self.sealed_body(&config.id, &clear)?;
                if body.secrets.as_deref().is_some_and(|s| s != "{}") {
                    self.record_secret_key(&mut tx).await?;
                }
                body
            }
            // The same body and secrets (sealed for this config, whichever its version).
            None => previous,
        };
        let version_id =
            insert_version(&mut tx, actor, &config.id, version, &name, &body, &now).await?;
        sqlx::query("UPDATE configs SET current_version_id = $1 WHERE id = $2")
            .bind(&version_id)
            .bind(&config.id)
            .execute(&mut *tx)
            .await?;
        if changes.is_default == Some(true) {
            clear_other_defaults(&mut tx, &config.workspace_id, &config.id).await?;
        }
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("update", "config")
                .resource(&config.id)
                .workspace(Some(&config.workspace_id)),
        )
        .await?;
        self.data_plane_changed(&mut tx, &[Change::Config(config.id.clone())])
            .await?;
        tx.commit().await?;
        self.after_data_plane_change().await;
        Ok(version_id)
    }

    /// Deletes a config and its versions.
    pub async fn delete_config(&self, actor: Actor<'_>, config: &Config) -> Result<()> {
        let mut tx = self.db.begin_write().await?;
        let done = sqlx::query("DELETE FROM configs WHERE id = $1 AND organisation_id = $2")
            .bind(&config.id)
            .bind(&config.organisation_id)
            .execute(&mut *tx)
            .await?;
        if done.rows_affected() == 0 {
            return Err(AdminError::not_found(format!("no config {}", config.slug)));
        }
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("delete", "config")
                .resource(&config.id)
                .workspace(Some(&config.workspace_id)),
        )
        .await?;
        self.data_plane_changed(&mut tx, &[Change::Config(config.id.clone())])
            .await?;
        tx.commit().await?;
        self.after_data_plane_change().await;
        Ok(())
    }

    /// A config body in clear as stored: the masked body the API shows, and the stored form.
    fn sealed_body(&self, config_id: &str, clear: &Value) -> Result<(Value, StoredBody)> {
        let (shown, sealed) = config_secrets::seal(self.cipher().ok(), config_id, clear)?;
        let body = StoredBody {
            config: to_text(&shown),
            secrets: Some(to_text(&sealed)),
        };
        Ok((shown, body))
    }

    /// A version's body in clear, for the data plane: `None` (logged) when its secrets cannot
    /// be opened, so that the config is left out rather than served without them.
    pub(super) fn open_config(
        &self,
        config_id: &str,
        config_text: &str,
        secrets: Option<&str>,
    ) -> Result<Option<Value>> {
        let stored: Value = super::from_text("config_versions.config", config_text)?;
        let body = StoredBody {
            config: String::new(),
            secrets: secrets.map(str::to_owned),
        };
        let opened = body.sealed().and_then(|sealed| {
            config_secrets::open(self.cipher().ok(), config_id, &stored, sealed.as_ref())
        });
        match opened {
            Ok(config) => Ok(Some(config)),
            Err(e) => {
                tracing::error!(config = %config_id, error = %e, "config left out of the data plane: its secrets cannot be read");
                Ok(None)
            }
        }
    }

    /// Seals the secrets of config versions written before they were sealed (`secrets` NULL),
    /// once, when the store starts with a secret key; returns how many versions it changed.
    /// Without a key they stay as they are (masked when read) and a warning says so.
    pub async fn seal_legacy_config_secrets(&self) -> Result<usize> {
        let rows =
            sqlx::query("SELECT id, config_id, config FROM config_versions WHERE secrets IS NULL")
                .fetch_all(self.db.pool())
                .await?;
        if rows.is_empty() {
            return Ok(0);
        }
        if self.cipher().ok().is_none() {
            tracing::warn!(
                versions = rows.len(),
                "config versions from before secrets were sealed stay as they are: {} is not set",
                crate::crypto::SECRET_KEY_VAR
            );
            return Ok(0);
        }
        let mut tx = self.db.begin_write().await?;
        let mut sealed = 0;
        let mut any_secret = false;
        for r in &rows {
            let id: String = r.try_get("id")?;
            let config_id: String = r.try_get("config_id")?;
            // An unreadable body is left as it is (and out of the data plane), not a reason
            // to refuse to start.
            let Ok(clear) = super::json_column(r, "config") else {
                continue;
            };
            let (_, body) = self.sealed_body(&config_id, &clear)?;
            any_secret |= body.secrets.as_deref().is_some_and(|s| s != "{}");
            let done = sqlx::query(
                "UPDATE config_versions SET config = $1, secrets = $2
                 WHERE id = $3 AND secrets IS NULL",
            )
            .bind(&body.config)
            .bind(body.secrets.clone())
            .bind(&id)
            .execute(&mut *tx)
            .await?;
            sealed += done.rows_affected() as usize;
        }
        if any_secret {
            self.record_secret_key(&mut tx).await?;
        }
        tx.commit().await?;
        tracing::info!(
            versions = sealed,
            "sealed the secrets of config versions written before they were encrypted"
        );
        Ok(sealed)
    }

    /// The stored columns of a config version (`config`, `secrets`): tests check what is at
    /// rest.
    pub async fn config_version_at_rest(
        &self,
        version_id: &str,
    ) -> Result<Option<(String, Option<String>)>> {
        let row = sqlx::query("SELECT config, secrets FROM config_versions WHERE id = $1")
            .bind(version_id)
            .fetch_optional(self.db.pool())
            .await?;
        row.map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).transpose()
    }

    /// The versions of a config, newest first, and how many there are.
    pub async fn config_versions(
        &self,
        config_id: &str,
        page: Page,
    ) -> Result<(i64, Vec<ConfigVersion>)> {
        let total: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM config_versions WHERE config_id = $1")
                .bind(config_id)
                .fetch_one(self.db.pool())
                .await?;
        let rows = sqlx::query(
            "SELECT id, config_id, version, name, config, secrets, created_by_user_id,
                    created_by_key_id, created_at
             FROM config_versions WHERE config_id = $1
             ORDER BY version DESC LIMIT $2 OFFSET $3",
        )
        .bind(config_id)
        .bind(page.size)
        .bind(page.offset())
        .fetch_all(self.db.pool())
        .await?;
        let list = rows
            .iter()
            .map(version_from_row)
            .collect::<Result<Vec<_>>>()?;
        Ok((total, list))
    }
}
