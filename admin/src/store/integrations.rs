//! Integrations: a provider account (the provider id, its secret, its settings) that providers
//! make usable in workspaces. The secret and the secret settings are stored encrypted
//! ([`crate::crypto`]); only their masks are ever read back by the API.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};
use sqlx::any::AnyRow;
use sqlx::Row;

use super::audit::{self, AuditEntry};
use super::changes::Change;
use super::providers::{self, NewProvider};
use super::snapshot::secret_context;
use super::{from_text, to_text, Actor, Store};
use crate::db::{Backend, Sql, Tx};
use crate::error::{is_foreign_key_violation, is_unique_violation, AdminError, Result};
use crate::keys;
use crate::time;
use crate::validate::{Page, RateLimit, UsageLimits};

/// The provider ids the gateway knows (its provider table), which `ai_provider_id` must name.
/// The gateway has a test that this list and its table agree.
pub const AI_PROVIDER_IDS: &[&str] = &[
    "openai",
    "groq",
    "together-ai",
    "fireworks-ai",
    "deepseek",
    "mistral-ai",
    "perplexity-ai",
    "openrouter",
    "x-ai",
    "deepinfra",
    "cerebras",
    "nebius",
    "sambanova",
    "hyperbolic",
    "novita-ai",
    "lambda",
    "github",
    "nvidia",
    "moonshot",
    "zhipu",
    "dashscope",
    "huggingface",
    "featherless-ai",
    "siliconflow",
    "inference-net",
    "anthropic",
    "azure-openai",
    "google",
    "vertex-ai",
    "bedrock",
    "cohere",
    "ollama",
    "lm-studio",
];

/// Who made an integration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// `POST /integrations`.
    Api,
    /// The legacy `POST /virtual-keys`, which makes an integration and a provider together.
    VirtualKey,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Api => "api",
            Origin::VirtualKey => "virtual_key",
        }
    }
}

/// An integration to create.
#[derive(Debug, Clone)]
pub struct NewIntegration {
    /// `None`: an organisation integration.
    pub workspace_id: Option<String>,
    pub slug: String,
    pub name: String,
    pub ai_provider_id: String,
    pub description: Option<String>,
    /// The provider secret, in clear: encrypted here.
    pub key: Option<String>,
    /// Settings that are not secret (`custom_host`, `aws_region`...).
    pub settings: Map<String, Value>,
    /// Secret settings (`aws_secret_access_key`...), in clear: encrypted here.
    pub secret_settings: BTreeMap<String, String>,
    pub tags: BTreeMap<String, String>,
    pub origin: Origin,
    /// The provider made with it (`create_default_provider`); its `integration_id` is set here.
    /// For an organisation integration its workspace is enabled as well.
    pub default_provider: Option<NewProvider>,
}

/// A stored integration, as the API shows it (secrets masked).
#[derive(Debug, Clone, PartialEq)]
pub struct Integration {
    pub id: String,
    pub organisation_id: String,
    pub workspace_id: Option<String>,
    pub slug: String,
    pub name: String,
    pub ai_provider_id: String,
    pub description: Option<String>,
    pub key_mask: Option<String>,
    pub settings: Map<String, Value>,
    pub secret_masks: BTreeMap<String, String>,
    pub tags: BTreeMap<String, String>,
    pub global_workspace_access: bool,
    pub global_limits: Value,
    pub origin: String,
    pub status: String,
    pub created_at: String,
    pub last_updated_at: String,
}

impl Integration {
    pub fn to_json(&self) -> Value {
        let mut configurations = self.settings.clone();
        for (k, v) in &self.secret_masks {
            configurations.insert(k.clone(), json!(v));
        }
        json!({
            "id": self.id,
            "slug": self.slug,
            "name": self.name,
            "ai_provider_id": self.ai_provider_id,
            "description": self.description,
            "organisation_id": self.organisation_id,
            "workspace_id": self.workspace_id,
            "masked_key": self.key_mask,
            "configurations": configurations,
            "tags": self.tags,
            "global_workspace_access": self.global_access_json(),
            "status": self.status,
            "created_at": self.created_at,
            "last_updated_at": self.last_updated_at,
            "object": "integration",
        })
    }

    pub fn global_access_json(&self) -> Value {
        let mut v = self.global_limits.clone();
        if !v.is_object() {
            v = json!({});
        }
        v["enabled"] = json!(self.global_workspace_access);
        v
    }

    /// True for an organisation integration (not tied to one workspace).
    pub fn is_organisation_wide(&self) -> bool {
        self.workspace_id.is_none()
    }
}

/// Changes of `PUT /integrations/{slug}`. Settings and secrets are merged by name: a name
/// mapped to `None` is removed, names not given are kept.
#[derive(Debug, Clone, Default)]
pub struct IntegrationChanges {
    pub name: Option<String>,
    pub description: Option<Option<String>>,
    pub key: Option<Option<String>>,
    pub settings: BTreeMap<String, Option<Value>>,
    pub secrets: BTreeMap<String, Option<String>>,
    pub tags: Option<BTreeMap<String, String>>,
}

/// Filters of `GET /integrations`.
#[derive(Debug, Clone, Default)]
pub struct IntegrationFilter {
    /// Integrations usable in this workspace: its own, and organisation integrations enabled
    /// for it.
    pub workspace_id: Option<String>,
    pub ai_provider_id: Option<String>,
    /// Every pair must match.
    pub tags: Vec<(String, String)>,
}

/// The access every workspace has to an organisation integration, or one workspace's.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkspaceAccess {
    pub enabled: bool,
    pub usage_limits: Vec<UsageLimits>,
    pub rate_limits: Vec<RateLimit>,
}

/// One workspace of `GET /integrations/{slug}/workspaces`.
#[derive(Debug, Clone, PartialEq)]
pub struct IntegrationWorkspace {
    pub workspace_id: String,
    pub slug: String,
    pub name: String,
    pub enabled: bool,
    pub usage_limits: Vec<UsageLimits>,
    pub rate_limits: Vec<RateLimit>,
    /// What the workspace has spent of each of `usage_limits`, in the budget's current period.
    pub current_usage: Vec<f64>,
}

impl IntegrationWorkspace {
    pub fn to_json(&self) -> Value {
        let usage_limits: Vec<Value> = self
            .usage_limits
            .iter()
            .enumerate()
            .map(|(i, limit)| {
                let mut v = json!(limit);
                v["current_usage"] = json!(self.current_usage.get(i).copied().unwrap_or(0.0));
                v
            })
            .collect();
        json!({
            "id": self.workspace_id,
            "slug": self.slug,
            "name": self.name,
            "enabled": self.enabled,
            "usage_limits": usage_limits,
            "rate_limits": self.rate_limits,
            "object": "integration-workspace",
        })
    }
}

/// One workspace of `PUT /integrations/{slug}/workspaces`.
#[derive(Debug, Clone)]
pub struct WorkspaceAccessChange {
    pub workspace_id: String,
    pub workspace_slug: String,
    pub enabled: bool,
    pub usage_limits: Vec<UsageLimits>,
    pub rate_limits: Vec<RateLimit>,
    /// `None`: no default provider; `Some(slug)`: one with this slug, or the default slug.
    pub default_provider: Option<Option<String>>,
}

/// The whole of `PUT /integrations/{slug}/workspaces`.
#[derive(Debug, Clone, Default)]
pub struct WorkspaceAccessChanges {
    pub global: Option<WorkspaceAccess>,
    /// Remove every workspace's own access first.
    pub override_existing: bool,
    pub workspaces: Vec<WorkspaceAccessChange>,
}

const COLUMNS: &str = "i.id, i.organisation_id, i.workspace_id, i.slug, i.name, i.ai_provider_id,
    i.description, i.key_mask, i.settings, i.secret_masks, i.tags, i.global_workspace_access,
    i.global_limits, i.origin, i.status, i.created_at, i.last_updated_at";

fn from_row(r: &AnyRow) -> Result<Integration> {
    let text = |c: &str| -> Result<String> { Ok(r.try_get::<String, _>(c)?) };
    Ok(Integration {
        id: r.try_get("id")?,
        organisation_id: r.try_get("organisation_id")?,
        workspace_id: r.try_get("workspace_id")?,
        slug: r.try_get("slug")?,
        name: r.try_get("name")?,
        ai_provider_id: r.try_get("ai_provider_id")?,
        description: r.try_get("description")?,
        key_mask: r.try_get("key_mask")?,
        settings: from_text("integrations.settings", &text("settings")?)?,
        secret_masks: from_text("integrations.secret_masks", &text("secret_masks")?)?,
        tags: from_text("integrations.tags", &text("tags")?)?,
        global_workspace_access: r.try_get::<i64, _>("global_workspace_access")? != 0,
        global_limits: from_text("integrations.global_limits", &text("global_limits")?)?,
        origin: r.try_get("origin")?,
        status: r.try_get("status")?,
        created_at: r.try_get("created_at")?,
        last_updated_at: r.try_get("last_updated_at")?,
    })
}

/// Replaces the tags of a row in `table` (`integration_tags` or `provider_tags`).
pub(super) async fn replace_tags(
    tx: &mut Tx,
    table: &'static str,
    id_column: &'static str,
    id: &str,
    tags: &BTreeMap<String, String>,
) -> Result<()> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DELETE FROM {table} WHERE {id_column} = $1"
    )))
    .bind(id)
    .execute(&mut **tx)
    .await?;
    for (k, v) in tags {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {table} ({id_column}, tag_key, tag_value) VALUES ($1, $2, $3)"
        )))
        .bind(id)
        .bind(k)
        .bind(v)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// Appends one `EXISTS` condition per tag pair: rows of `alias` carrying all of them.
pub(super) fn tag_conditions(
    cond: &mut Sql,
    table: &str,
    id_column: &str,
    alias: &str,
    tags: &[(String, String)],
) {
    for (k, v) in tags {
        cond.push(&format!(
            " AND EXISTS (SELECT 1 FROM {table} t WHERE t.{id_column} = {alias}.id AND t.tag_key = "
        ))
        .text(k.clone())
        .push(" AND t.tag_value = ")
        .text(v.clone())
        .push(")");
    }
}

/// The masks of secret settings.
fn masks(secrets: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    secrets
        .iter()
        .map(|(k, v)| (k.clone(), keys::mask(v)))
        .collect()
}

fn conflict_or(e: sqlx::Error, slug: &str) -> AdminError {
    if is_unique_violation(&e) {
        AdminError::conflict(format!(
            "an integration with the slug {slug} already exists"
        ))
    } else if is_foreign_key_violation(&e) {
        AdminError::reference("workspace_id: the workspace no longer exists")
    } else {
        e.into()
    }
}

/// Enables an organisation integration for a workspace (or changes its limits there).
async fn enable_workspace(
    tx: &mut Tx,
    integration_id: &str,
    workspace_id: &str,
    usage_limits: &[UsageLimits],
    rate_limits: &[RateLimit],
    now: &str,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO integration_workspaces (integration_id, workspace_id, usage_limits,
             rate_limits, created_at, last_updated_at)
         VALUES ($1, $2, $3, $4, $5, $5)
         ON CONFLICT (integration_id, workspace_id)
         DO UPDATE SET usage_limits = $3, rate_limits = $4, last_updated_at = $5",
    )
    .bind(integration_id)
    .bind(workspace_id)
    .bind(to_text(usage_limits))
    .bind(to_text(rate_limits))
    .bind(now)
    .execute(&mut **tx)
    .await
    .map_err(|e| {
        if is_foreign_key_violation(&e) {
            AdminError::reference(format!("no workspace {workspace_id}"))
        } else {
            e.into()
        }
    })?;
    Ok(())
}

/// Whether a provider slug is taken.
async fn provider_slug_taken(tx: &mut Tx, slug: &str) -> Result<bool> {
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM providers WHERE slug = $1")
        .bind(slug)
        .fetch_one(&mut **tx)
        .await?;
    Ok(n > 0)
}

impl Store {
    /// Creates an integration (and its default provider, if asked); returns it and the
    /// provider's slug.
    pub async fn create_integration(
        &self,
        actor: Actor<'_>,
        new: &NewIntegration,
    ) -> Result<(Integration, Option<(String, String)>)> {
        let org = &actor.principal.organisation_id;
        let id = uuid::Uuid::new_v4().to_string();
        let now = time::format(time::now());
        let has_secrets = new.key.is_some() || !new.secret_settings.is_empty();
        let (key_secret, settings_secret) = if has_secrets {
            let cipher = self.cipher()?;
            (
                new.key
                    .as_ref()
                    .map(|k| cipher.encrypt(k, &secret_context(&id, "key"))),
                (!new.secret_settings.is_empty()).then(|| {
                    cipher.encrypt(
                        &to_text(&new.secret_settings),
                        &secret_context(&id, "settings"),
                    )
                }),
            )
        } else {
            (None, None)
        };
        let key_mask = new.key.as_deref().map(keys::mask);
        let secret_masks = masks(&new.secret_settings);
        let mut tx = self.db.begin_write().await?;
        if has_secrets {
            self.record_secret_key(&mut tx).await?;
        }
        sqlx::query(
            "INSERT INTO integrations (id, organisation_id, workspace_id, slug, name, ai_provider_id,
                 description, key_secret, key_mask, settings, secret_settings, secret_masks, tags,
                 global_workspace_access, global_limits, origin, status, created_at,
                 last_updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, 0, '{}', $14,
                 'active', $15, $15)",
        )
        .bind(&id)
        .bind(org)
        .bind(new.workspace_id.clone())
        .bind(&new.slug)
        .bind(&new.name)
        .bind(&new.ai_provider_id)
        .bind(new.description.clone())
        .bind(key_secret)
        .bind(key_mask.clone())
        .bind(to_text(&new.settings))
        .bind(settings_secret)
        .bind(to_text(&secret_masks))
        .bind(to_text(&new.tags))
        .bind(new.origin.as_str())
        .bind(&now)
        .execute(&mut *tx)
        .await
        .map_err(|e| conflict_or(e, &new.slug))?;
        replace_tags(
            &mut tx,
            "integration_tags",
            "integration_id",
            &id,
            &new.tags,
        )
        .await?;
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("create", "integration")
                .resource(&id)
                .workspace(new.workspace_id.as_deref()),
        )
        .await?;
        let mut made = None;
        if let Some(p) = &new.default_provider {
            let mut p = p.clone();
            p.integration_id = id.clone();
            if new.workspace_id.is_none() {
                enable_workspace(&mut tx, &id, &p.workspace_id, &[], &[], &now).await?;
            }
            let provider_id = providers::insert(&mut tx, org, &p).await?;
            audit::insert(
                &mut tx,
                actor,
                &AuditEntry::new("create", "provider")
                    .resource(&provider_id)
                    .workspace(Some(&p.workspace_id)),
            )
            .await?;
            made = Some((provider_id, p.slug.clone()));
        }
        self.data_plane_changed(&mut tx, &[Change::Integration(id.clone())])
            .await?;
        tx.commit().await?;
        self.after_data_plane_change().await;
        let integration = Integration {
            id,
            organisation_id: org.clone(),
            workspace_id: new.workspace_id.clone(),
            slug: new.slug.clone(),
            name: new.name.clone(),
            ai_provider_id: new.ai_provider_id.clone(),
            description: new.description.clone(),
            key_mask,
            settings: new.settings.clone(),
            secret_masks,
            tags: new.tags.clone(),
            global_workspace_access: false,
            global_limits: json!({}),
            origin: new.origin.as_str().into(),
            status: "active".into(),
            created_at: now.clone(),
            last_updated_at: now,
        };
        Ok((integration, made))
    }

    /// An integration of the organisation by id or slug.
    pub async fn integration(
        &self,
        organisation_id: &str,
        id_or_slug: &str,
    ) -> Result<Option<Integration>> {
        let column = if crate::validate::is_uuid(id_or_slug) {
            "i.id"
        } else {
            "i.slug"
        };
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM integrations i WHERE {column} = $1 AND i.organisation_id = $2"
        )))
        .bind(id_or_slug)
        .bind(organisation_id)
        .fetch_optional(self.db.pool())
        .await?;
        row.as_ref().map(from_row).transpose()
    }

    /// Whether providers of `workspace_id` may use the integration: its own workspace, or an
    /// organisation integration enabled for that workspace or for all.
    pub async fn integration_usable_in(
        &self,
        integration: &Integration,
        workspace_id: &str,
    ) -> Result<bool> {
        if let Some(ws) = &integration.workspace_id {
            return Ok(ws == workspace_id);
        }
        if integration.global_workspace_access {
            return Ok(true);
        }
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM integration_workspaces WHERE integration_id = $1 AND workspace_id = $2",
        )
        .bind(&integration.id)
        .bind(workspace_id)
        .fetch_one(self.db.pool())
        .await?;
        Ok(n > 0)
    }

    /// Integrations of the organisation, newest first, and how many match in all.
    pub async fn integrations(
        &self,
        organisation_id: &str,
        filter: &IntegrationFilter,
        page: Page,
    ) -> Result<(i64, Vec<Integration>)> {
        let mut cond = Sql::new(" FROM integrations i WHERE i.organisation_id = ");
        cond.text(organisation_id);
        if let Some(ws) = &filter.workspace_id {
            cond.push(" AND (i.workspace_id = ")
                .text(ws.clone())
                .push(
                    " OR (i.workspace_id IS NULL AND (i.global_workspace_access = 1 OR EXISTS \
                     (SELECT 1 FROM integration_workspaces w WHERE w.integration_id = i.id \
                     AND w.workspace_id = ",
                )
                .text(ws.clone())
                .push("))))");
        }
        if let Some(p) = &filter.ai_provider_id {
            cond.push(" AND i.ai_provider_id = ").text(p.clone());
        }
        tag_conditions(
            &mut cond,
            "integration_tags",
            "integration_id",
            "i",
            &filter.tags,
        );
        cond.select_page(
            &self.db,
            COLUMNS,
            "i.created_at DESC, i.id DESC",
            page,
            from_row,
        )
        .await
    }

    /// Applies `changes` to an integration.
    pub async fn update_integration(
        &self,
        actor: Actor<'_>,
        integration: &Integration,
        changes: &IntegrationChanges,
    ) -> Result<()> {
        let now = time::format(time::now());
        let id = &integration.id;
        let mut tx = self.db.begin_write().await?;
        let mut sql = Sql::new("UPDATE integrations SET last_updated_at = ");
        sql.text(now.clone());
        if let Some(name) = &changes.name {
            sql.push(", name = ").text(name.clone());
        }
        if let Some(d) = &changes.description {
            sql.push(", description = ");
            nullable(&mut sql, d.clone());
        }
        if let Some(key) = &changes.key {
            let sealed = match key {
                Some(k) => Some(self.cipher()?.encrypt(k, &secret_context(id, "key"))),
                None => None,
            };
            sql.push(", key_secret = ");
            nullable(&mut sql, sealed);
            sql.push(", key_mask = ");
            nullable(&mut sql, key.as_deref().map(keys::mask));
        }
        if !changes.settings.is_empty() {
            let mut settings = integration.settings.clone();
            for (k, v) in &changes.settings {
                match v {
                    Some(v) => settings.insert(k.clone(), v.clone()),
                    None => settings.remove(k),
                };
            }
            sql.push(", settings = ").text(to_text(&settings));
        }
        if !changes.secrets.is_empty() {
            // The current secrets, read in this transaction, with the changes applied.
            let stored: Option<String> =
                sqlx::query_scalar("SELECT secret_settings FROM integrations WHERE id = $1")
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await?
                    .flatten();
            let cipher = self.cipher()?;
            let mut secrets: BTreeMap<String, String> = match stored {
                Some(s) => from_text(
                    "integrations.secret_settings",
                    &cipher.decrypt(&s, &secret_context(id, "settings"))?,
                )?,
                None => BTreeMap::new(),
            };
            for (k, v) in &changes.secrets {
                match v {
                    Some(v) => secrets.insert(k.clone(), v.clone()),
                    None => secrets.remove(k),
                };
            }
            let sealed = (!secrets.is_empty())
                .then(|| cipher.encrypt(&to_text(&secrets), &secret_context(id, "settings")));
            sql.push(", secret_settings = ");
            nullable(&mut sql, sealed);
            sql.push(", secret_masks = ")
                .text(to_text(&masks(&secrets)));
        }
        if let Some(tags) = &changes.tags {
            sql.push(", tags = ").text(to_text(tags));
            replace_tags(&mut tx, "integration_tags", "integration_id", id, tags).await?;
        }
        if changes.key.as_ref().is_some_and(Option::is_some) || !changes.secrets.is_empty() {
            self.record_secret_key(&mut tx).await?;
        }
        sql.push(" WHERE id = ")
            .text(id.clone())
            .push(" AND organisation_id = ")
            .text(integration.organisation_id.clone());
        let done = sql.query().execute(&mut *tx).await?;
        if done.rows_affected() == 0 {
            return Err(AdminError::not_found(format!(
                "no integration {}",
                integration.slug
            )));
        }
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("update", "integration")
                .resource(id)
                .workspace(integration.workspace_id.as_deref()),
        )
        .await?;
        self.data_plane_changed(&mut tx, &[Change::Integration(id.clone())])
            .await?;
        tx.commit().await?;
        self.after_data_plane_change().await;
        Ok(())
    }

    /// Deletes an integration and the providers made from it.
    pub async fn delete_integration(
        &self,
        actor: Actor<'_>,
        integration: &Integration,
    ) -> Result<()> {
        let mut tx = self.db.begin_write().await?;
        let providers: Vec<(String, String)> =
            sqlx::query_as("SELECT id, workspace_id FROM providers WHERE integration_id = $1")
                .bind(&integration.id)
                .fetch_all(&mut *tx)
                .await?;
        let done = sqlx::query("DELETE FROM integrations WHERE id = $1 AND organisation_id = $2")
            .bind(&integration.id)
            .bind(&integration.organisation_id)
            .execute(&mut *tx)
            .await?;
        if done.rows_affected() == 0 {
            return Err(AdminError::not_found(format!(
                "no integration {}",
                integration.slug
            )));
        }
        for (provider, ws) in &providers {
            audit::insert(
                &mut tx,
                actor,
                &AuditEntry::new("delete", "provider")
                    .resource(provider)
                    .workspace(Some(ws)),
            )
            .await?;
        }
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("delete", "integration")
                .resource(&integration.id)
                .workspace(integration.workspace_id.as_deref()),
        )
        .await?;
        self.data_plane_changed(&mut tx, &[Change::Integration(integration.id.clone())])
            .await?;
        tx.commit().await?;
        self.after_data_plane_change().await;
        Ok(())
    }

    /// The workspaces of the organisation with their access to an organisation integration
    /// (or, for a workspace integration, its one workspace), oldest first.
    pub async fn integration_workspaces(
        &self,
        integration: &Integration,
        page: Page,
    ) -> Result<(i64, Vec<IntegrationWorkspace>)> {
        let mut cond = Sql::new(
            " FROM workspaces ws LEFT JOIN integration_workspaces iw
                 ON iw.workspace_id = ws.id AND iw.integration_id = ",
        );
        cond.text(integration.id.clone())
            .push(" WHERE ws.organisation_id = ")
            .text(integration.organisation_id.clone());
        if let Some(ws) = &integration.workspace_id {
            cond.push(" AND ws.id = ").text(ws.clone());
        }
        let columns = "ws.id, ws.slug, ws.name, iw.workspace_id AS enabled_id, iw.usage_limits,
                       iw.rate_limits";
        let listed = cond
            .select_page(&self.db, columns, "ws.created_at, ws.id", page, |r| {
                let enabled_row: Option<String> = r.try_get("enabled_id")?;
                let usage: Option<String> = r.try_get("usage_limits")?;
                let rate: Option<String> = r.try_get("rate_limits")?;
                Ok(IntegrationWorkspace {
                    workspace_id: r.try_get("id")?,
                    slug: r.try_get("slug")?,
                    name: r.try_get("name")?,
                    enabled: enabled_row.is_some()
                        || integration.workspace_id.is_some()
                        || integration.global_workspace_access,
                    usage_limits: usage
                        .map(|u| from_text("integration_workspaces.usage_limits", &u))
                        .transpose()?
                        .unwrap_or_default(),
                    rate_limits: rate
                        .map(|u| from_text("integration_workspaces.rate_limits", &u))
                        .transpose()?
                        .unwrap_or_default(),
                    current_usage: Vec::new(),
                })
            })
            .await?;
        let (total, mut list) = listed;
        for ws in &mut list {
            ws.current_usage = vec![0.0; ws.usage_limits.len()];
        }
        let spent = sqlx::query(
            "SELECT workspace_id, budget_index, current_usage, usage_period, status
             FROM integration_budget_usage WHERE integration_id = $1",
        )
        .bind(&integration.id)
        .fetch_all(self.db.pool())
        .await?;
        for r in &spent {
            let workspace: String = r.try_get("workspace_id")?;
            let index: i64 = r.try_get("budget_index")?;
            let Some(ws) = list.iter_mut().find(|w| w.workspace_id == workspace) else {
                continue;
            };
            let Some((i, limit)) = usize::try_from(index)
                .ok()
                .and_then(|i| Some((i, ws.usage_limits.get(i)?)))
            else {
                continue;
            };
            let (_, used) = super::usage::shown(
                Some(&super::usage::sdk_limit(limit)),
                &r.try_get::<String, _>("status")?,
                r.try_get("current_usage")?,
                r.try_get("usage_period")?,
            );
            ws.current_usage[i] = used;
        }
        Ok((total, list))
    }

    /// The bulk update of an organisation integration's workspaces, with default providers
    /// made where asked; returns the providers made as (workspace id, slug).
    pub async fn update_integration_workspaces(
        &self,
        actor: Actor<'_>,
        integration: &Integration,
        changes: &WorkspaceAccessChanges,
    ) -> Result<Vec<(String, String)>> {
        let now = time::format(time::now());
        let org = &actor.principal.organisation_id;
        let id = &integration.id;
        let backend = self.db.backend();
        let mut tx = self.db.begin_write().await?;
        // Locked first: reading the limits in force below takes share locks, which two
        // updates at once could not both turn into the write locks they then need.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT id FROM integrations WHERE id = $1{}",
            backend.for_update()
        )))
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
        let counted = counted_workspaces(&mut tx, backend, id).await?;
        if changes.override_existing {
            sqlx::query("DELETE FROM integration_workspaces WHERE integration_id = $1")
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        if let Some(g) = &changes.global {
            let limits = json!({"usage_limits": g.usage_limits, "rate_limits": g.rate_limits});
            sqlx::query(
                "UPDATE integrations SET global_workspace_access = $1, global_limits = $2,
                     last_updated_at = $3 WHERE id = $4",
            )
            .bind(i64::from(g.enabled))
            .bind(to_text(&limits))
            .bind(&now)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        }
        let mut made = Vec::new();
        for (i, w) in changes.workspaces.iter().enumerate() {
            if !w.enabled {
                sqlx::query(
                    "DELETE FROM integration_workspaces WHERE integration_id = $1 AND workspace_id = $2",
                )
                .bind(id)
                .bind(&w.workspace_id)
                .execute(&mut *tx)
                .await?;
                continue;
            }
            enable_workspace(
                &mut tx,
                id,
                &w.workspace_id,
                &w.usage_limits,
                &w.rate_limits,
                &now,
            )
            .await?;
            let Some(requested) = &w.default_provider else {
                continue;
            };
            let existing: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM providers WHERE integration_id = $1 AND workspace_id = $2",
            )
            .bind(id)
            .bind(&w.workspace_id)
            .fetch_one(&mut *tx)
            .await?;
            if existing > 0 {
                continue;
            }
            let slug = match requested {
                Some(s) => s.clone(),
                None if !provider_slug_taken(&mut tx, &integration.slug).await? => {
                    integration.slug.clone()
                }
                None => {
                    let mut s = format!("{}-{}", integration.slug, w.workspace_slug);
                    s.truncate(crate::validate::MAX_NAME);
                    s
                }
            };
            let p = NewProvider {
                workspace_id: w.workspace_id.clone(),
                integration_id: id.clone(),
                slug: slug.clone(),
                name: integration.name.clone(),
                note: None,
                usage_limits: None,
                rate_limits: Vec::new(),
                expires_at: None,
                tags: BTreeMap::new(),
            };
            let provider_id = providers::insert(&mut tx, org, &p).await.map_err(|e| {
                if e.kind == crate::ErrorKind::Conflict {
                    AdminError::conflict(format!(
                        "workspaces[{i}].default_provider_slug: a provider with the slug {slug} already exists"
                    ))
                } else {
                    e
                }
            })?;
            audit::insert(
                &mut tx,
                actor,
                &AuditEntry::new("create", "provider")
                    .resource(&provider_id)
                    .workspace(Some(&w.workspace_id)),
            )
            .await?;
            made.push((w.workspace_id.clone(), slug));
        }
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("update_workspaces", "integration").resource(id),
        )
        .await?;
        restate_integration_usage(&mut tx, backend, id, counted).await?;
        self.data_plane_changed(&mut tx, &[Change::Integration(id.clone())])
            .await?;
        tx.commit().await?;
        self.after_data_plane_change().await;
        Ok(made)
    }

    /// The stored (encrypted) secret columns of an integration: tests check what is at rest.
    pub async fn integration_at_rest(
        &self,
        id: &str,
    ) -> Result<Option<(Option<String>, Option<String>)>> {
        let row = sqlx::query("SELECT key_secret, secret_settings FROM integrations WHERE id = $1")
            .bind(id)
            .fetch_optional(self.db.pool())
            .await?;
        row.map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).transpose()
    }
}

/// `integrations.global_limits`: the limits each workspace gets under global workspace access.
#[derive(Debug, Default, serde::Deserialize)]
pub(super) struct GlobalLimits {
    #[serde(default)]
    pub usage_limits: Vec<UsageLimits>,
    #[serde(default)]
    pub rate_limits: Vec<plugin_sdk::access::RateLimit>,
}

/// The budgets an organisation integration sets on a workspace, with where they come from.
pub(super) type Budgets = (BudgetSource, Vec<UsageLimits>);

/// Where the budgets an organisation integration sets on a workspace come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BudgetSource {
    /// The workspace's own `usage_limits` (`integration_workspaces`).
    Own,
    /// The global access's, which a workspace gets when its own list is empty.
    Global,
}

/// The budgets an organisation integration sets on a workspace, read in `tx` with a share
/// lock on the rows they come from (a change of them waits): the workspace's own
/// `usage_limits` when it lists any, else the global access's when that is on. `None`: no
/// budgets (or no such integration or workspace).
pub(super) async fn workspace_budgets(
    tx: &mut Tx,
    backend: Backend,
    integration_id: &str,
    workspace_id: &str,
) -> Result<Option<Budgets>> {
    let share = backend.for_share();
    let own: Option<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT usage_limits FROM integration_workspaces
         WHERE integration_id = $1 AND workspace_id = $2{share}"
    )))
    .bind(integration_id)
    .bind(workspace_id)
    .fetch_optional(&mut **tx)
    .await?;
    if let Some(text) = own {
        let own: Vec<UsageLimits> = from_text("integration_workspaces.usage_limits", &text)?;
        if !own.is_empty() {
            return Ok(Some((BudgetSource::Own, own)));
        }
    }
    let global = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT i.global_workspace_access, i.global_limits FROM integrations i
         JOIN workspaces w ON w.organisation_id = i.organisation_id AND w.id = $2
         WHERE i.id = $1{share}"
    )))
    .bind(integration_id)
    .bind(workspace_id)
    .fetch_optional(&mut **tx)
    .await?;
    let Some(global) = global else {
        return Ok(None);
    };
    if global.try_get::<i64, _>("global_workspace_access")? == 0 {
        return Ok(None);
    }
    let limits: GlobalLimits = from_text(
        "integrations.global_limits",
        &global.try_get::<String, _>("global_limits")?,
    )?;
    Ok((!limits.usage_limits.is_empty()).then_some((BudgetSource::Global, limits.usage_limits)))
}

/// After an update of an integration's workspace access (in its transaction): each workspace
/// that has counted usage keeps it, restated against its new budgets by position (as a
/// workspace's own budgets are, [`super::usage::restate`]), when its budgets still come from
/// the same place; a workspace whose budgets now come from elsewhere (its own list and the
/// global one, or none) starts over.
async fn restate_integration_usage(
    tx: &mut Tx,
    backend: Backend,
    integration_id: &str,
    before: Vec<(String, Option<Budgets>)>,
) -> Result<()> {
    for (workspace_id, old) in before {
        let new = workspace_budgets(tx, backend, integration_id, &workspace_id).await?;
        let rows = super::usage::UsageRows {
            table: "integration_budget_usage",
            keys: &[
                ("integration_id", integration_id),
                ("workspace_id", &workspace_id),
            ],
        };
        match (old, new) {
            (old, new) if old == new => {}
            (Some((was, old)), Some((now, new))) if was == now => {
                super::usage::restate(tx, backend, &rows, &old, &new).await?;
            }
            _ => super::usage::restate(tx, backend, &rows, &[], &[]).await?,
        }
    }
    Ok(())
}

/// The workspaces with counted usage of an integration's budgets, with the budgets that apply
/// to each now.
async fn counted_workspaces(
    tx: &mut Tx,
    backend: Backend,
    integration_id: &str,
) -> Result<Vec<(String, Option<Budgets>)>> {
    let ids: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT workspace_id FROM integration_budget_usage WHERE integration_id = $1",
    )
    .bind(integration_id)
    .fetch_all(&mut **tx)
    .await?;
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        let budgets = workspace_budgets(tx, backend, integration_id, &id).await?;
        out.push((id, budgets));
    }
    Ok(out)
}

/// Appends a text placeholder, or `NULL`.
pub(super) fn nullable(sql: &mut Sql, value: Option<String>) {
    match value {
        Some(v) => {
            sql.text(v);
        }
        None => {
            sql.push("NULL");
        }
    }
}
