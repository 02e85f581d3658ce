//! Providers: an integration made usable in one workspace, addressed in requests as
//! `x-gw-provider: @slug` (or, the legacy way, `x-gw-virtual-key: slug`). The legacy virtual
//! keys are providers too: `POST /virtual-keys` makes an integration and its provider at once.

use std::collections::BTreeMap;

use serde_json::{json, Value};
use sqlx::any::AnyRow;
use sqlx::Row;

use super::api_keys::{restate_expiry_and_budget, BudgetHolder};
use super::audit::{self, AuditEntry};
use super::changes::Change;
use super::integrations::{self, nullable, NewIntegration};
use super::usage;
use super::{from_text, to_text, Actor, Store};
use crate::db::{Sql, Tx};
use crate::error::{is_foreign_key_violation, is_unique_violation, AdminError, Result};
use crate::time::{self, Timestamp};
use crate::validate::{Page, RateLimit, UsageLimits};

/// A provider to create.
#[derive(Debug, Clone)]
pub struct NewProvider {
    pub workspace_id: String,
    pub integration_id: String,
    pub slug: String,
    pub name: String,
    pub note: Option<String>,
    pub usage_limits: Option<UsageLimits>,
    pub rate_limits: Vec<RateLimit>,
    pub expires_at: Option<Timestamp>,
    pub tags: BTreeMap<String, String>,
}

/// A stored provider, with what it shows of its integration.
#[derive(Debug, Clone, PartialEq)]
pub struct Provider {
    pub id: String,
    pub organisation_id: String,
    pub workspace_id: String,
    pub integration_id: String,
    pub integration_slug: String,
    pub integration_origin: String,
    pub ai_provider_id: String,
    pub key_mask: Option<String>,
    pub slug: String,
    pub name: String,
    pub note: Option<String>,
    /// As stored; see [`Provider::status`].
    pub stored_status: String,
    pub usage_limits: Option<UsageLimits>,
    /// The usage counted in the budget's current reset period (0 once the period of the
    /// stored usage has elapsed).
    pub current_usage: f64,
    /// The reset period the stored usage was counted in, and the number of manual resets.
    pub usage_period: i64,
    pub reset_epoch: i64,
    pub rate_limits: Vec<RateLimit>,
    pub tags: BTreeMap<String, String>,
    pub expires_at: Option<String>,
    pub created_at: String,
    pub last_updated_at: String,
}

impl Provider {
    /// `expired` once past `expires_at`, even before the expiry worker has marked it.
    pub fn status(&self) -> &str {
        let past = self
            .expires_at
            .as_deref()
            .and_then(time::parse)
            .is_some_and(|t| t <= time::now());
        if past {
            "expired"
        } else {
            &self.stored_status
        }
    }

    fn usage_json(&self) -> Value {
        match &self.usage_limits {
            Some(u) => {
                let mut v = serde_json::to_value(u).expect("usage limits serialise");
                v["current_usage"] = json!(self.current_usage);
                v
            }
            None => Value::Null,
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "slug": self.slug,
            "name": self.name,
            "note": self.note,
            "status": self.status(),
            "integration_id": self.integration_slug,
            "ai_provider_id": self.ai_provider_id,
            "organisation_id": self.organisation_id,
            "workspace_id": self.workspace_id,
            "usage_limits": self.usage_json(),
            "rate_limits": self.rate_limits,
            "tags": self.tags,
            "expires_at": self.expires_at,
            "created_at": self.created_at,
            "last_updated_at": self.last_updated_at,
            "object": "provider",
        })
    }

    /// The legacy virtual key's shape: the provider id under `provider`, the key masked.
    pub fn to_virtual_key_json(&self) -> Value {
        json!({
            "id": self.id,
            "slug": self.slug,
            "name": self.name,
            "note": self.note,
            "status": self.status(),
            "provider": self.ai_provider_id,
            "key": self.key_mask,
            "integration_id": self.integration_slug,
            "workspace_id": self.workspace_id,
            "usage_limits": self.usage_json(),
            "rate_limits": self.rate_limits,
            "expires_at": self.expires_at,
            "created_at": self.created_at,
            "last_updated_at": self.last_updated_at,
            "object": "virtual-key",
        })
    }
}

/// Changes of `PUT /providers/{slug}`; `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct ProviderChanges {
    pub name: Option<String>,
    pub note: Option<Option<String>>,
    pub usage_limits: Option<Option<UsageLimits>>,
    pub rate_limits: Option<Vec<RateLimit>>,
    pub expires_at: Option<Option<Timestamp>>,
    pub tags: Option<BTreeMap<String, String>>,
    /// Usage back to zero in a new reset epoch (an exhausted provider becomes active).
    pub reset_usage: bool,
}

/// Filters of `GET /providers`.
#[derive(Debug, Clone, Default)]
pub struct ProviderFilter {
    pub workspace_id: Option<String>,
    pub integration_id: Option<String>,
    pub status: Option<String>,
    pub tags: Vec<(String, String)>,
}

const COLUMNS: &str = "p.id, p.organisation_id, p.workspace_id, p.integration_id,
    i.slug AS integration_slug, i.origin AS integration_origin, i.ai_provider_id, i.key_mask,
    p.slug, p.name, p.note, p.status, p.usage_limits, p.current_usage, p.usage_period,
    p.reset_epoch, p.rate_limits, p.tags, p.expires_at, p.created_at, p.last_updated_at";

const FROM: &str = " FROM providers p JOIN integrations i ON i.id = p.integration_id";

fn from_row(r: &AnyRow) -> Result<Provider> {
    let usage_limits: Option<UsageLimits> = r
        .try_get::<Option<String>, _>("usage_limits")?
        .map(|u| from_text("providers.usage_limits", &u))
        .transpose()?;
    let usage_period: i64 = r.try_get("usage_period")?;
    let (stored_status, current_usage) = usage::shown(
        usage_limits.as_ref().map(usage::sdk_limit).as_ref(),
        &r.try_get::<String, _>("status")?,
        r.try_get("current_usage")?,
        usage_period,
    );
    Ok(Provider {
        id: r.try_get("id")?,
        organisation_id: r.try_get("organisation_id")?,
        workspace_id: r.try_get("workspace_id")?,
        integration_id: r.try_get("integration_id")?,
        integration_slug: r.try_get("integration_slug")?,
        integration_origin: r.try_get("integration_origin")?,
        ai_provider_id: r.try_get("ai_provider_id")?,
        key_mask: r.try_get("key_mask")?,
        slug: r.try_get("slug")?,
        name: r.try_get("name")?,
        note: r.try_get("note")?,
        stored_status,
        usage_limits,
        current_usage,
        usage_period,
        reset_epoch: r.try_get("reset_epoch")?,
        rate_limits: from_text(
            "providers.rate_limits",
            &r.try_get::<String, _>("rate_limits")?,
        )?,
        tags: from_text("providers.tags", &r.try_get::<String, _>("tags")?)?,
        expires_at: r.try_get("expires_at")?,
        created_at: r.try_get("created_at")?,
        last_updated_at: r.try_get("last_updated_at")?,
    })
}

/// Inserts a provider; returns its id. A taken slug is a 409.
pub(super) async fn insert(tx: &mut Tx, organisation_id: &str, p: &NewProvider) -> Result<String> {
    let id = uuid::Uuid::new_v4().to_string();
    let now = time::format(time::now());
    sqlx::query(
        "INSERT INTO providers (id, organisation_id, workspace_id, integration_id, slug, name,
             note, status, usage_limits, current_usage, rate_limits, tags, expires_at, created_at,
             last_updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, 'active', $8, 0, $9, $10, $11, $12, $12)",
    )
    .bind(&id)
    .bind(organisation_id)
    .bind(&p.workspace_id)
    .bind(&p.integration_id)
    .bind(&p.slug)
    .bind(&p.name)
    .bind(p.note.clone())
    .bind(p.usage_limits.as_ref().map(to_text))
    .bind(to_text(&p.rate_limits))
    .bind(to_text(&p.tags))
    .bind(p.expires_at.map(time::format))
    .bind(&now)
    .execute(&mut **tx)
    .await
    .map_err(|e| {
        if is_unique_violation(&e) {
            AdminError::conflict(format!(
                "a provider with the slug {} already exists",
                p.slug
            ))
        } else if is_foreign_key_violation(&e) {
            AdminError::reference("the provider's workspace or integration no longer exists")
        } else {
            e.into()
        }
    })?;
    integrations::replace_tags(tx, "provider_tags", "provider_id", &id, &p.tags).await?;
    Ok(id)
}

impl Store {
    /// Creates many providers in one transaction: all or none. One audit record
    /// (`bulk_create`) names every provider made. Returns their ids, in the order given.
    pub async fn create_providers(
        &self,
        actor: Actor<'_>,
        new: &[NewProvider],
    ) -> Result<Vec<String>> {
        let mut tx = self.db.begin_write().await?;
        let mut ids = Vec::with_capacity(new.len());
        for (i, p) in new.iter().enumerate() {
            let id = insert(&mut tx, &actor.principal.organisation_id, p)
                .await
                .map_err(|e| e.within(&format!("providers[{i}]")))?;
            ids.push(id);
        }
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("bulk_create", "provider")
                .workspace_of_all(new.iter().map(|p| Some(p.workspace_id.as_str())))
                .items(ids.clone()),
        )
        .await?;
        let changes: Vec<Change> = new
            .iter()
            .map(|p| Change::Provider(p.slug.clone()))
            .collect();
        self.data_plane_changed(&mut tx, &changes).await?;
        tx.commit().await?;
        self.after_data_plane_change().await;
        Ok(ids)
    }

    /// Creates a provider; returns its id.
    pub async fn create_provider(&self, actor: Actor<'_>, new: &NewProvider) -> Result<String> {
        let mut tx = self.db.begin_write().await?;
        let id = insert(&mut tx, &actor.principal.organisation_id, new).await?;
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("create", "provider")
                .resource(&id)
                .workspace(Some(&new.workspace_id)),
        )
        .await?;
        self.data_plane_changed(&mut tx, &[Change::Provider(new.slug.clone())])
            .await?;
        tx.commit().await?;
        self.after_data_plane_change().await;
        Ok(id)
    }

    /// A legacy virtual key: an integration (made for it) and its provider, in one transaction.
    /// Returns the provider's id.
    pub async fn create_virtual_key(
        &self,
        actor: Actor<'_>,
        integration: &NewIntegration,
    ) -> Result<String> {
        let (_, made) = self.create_integration(actor, integration).await?;
        made.map(|(id, _)| id)
            .ok_or_else(|| AdminError::internal("a virtual key is made with its provider"))
    }

    /// A provider of the organisation by id or slug.
    pub async fn provider(
        &self,
        organisation_id: &str,
        id_or_slug: &str,
    ) -> Result<Option<Provider>> {
        let column = if crate::validate::is_uuid(id_or_slug) {
            "p.id"
        } else {
            "p.slug"
        };
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS}{FROM} WHERE {column} = $1 AND p.organisation_id = $2"
        )))
        .bind(id_or_slug)
        .bind(organisation_id)
        .fetch_optional(self.db.pool())
        .await?;
        row.as_ref().map(from_row).transpose()
    }

    /// Providers of the organisation, newest first, and how many match in all.
    pub async fn providers(
        &self,
        organisation_id: &str,
        filter: &ProviderFilter,
        page: Page,
    ) -> Result<(i64, Vec<Provider>)> {
        let mut cond = Sql::new(FROM);
        cond.push(" WHERE p.organisation_id = ")
            .text(organisation_id);
        if let Some(ws) = &filter.workspace_id {
            cond.push(" AND p.workspace_id = ").text(ws.clone());
        }
        if let Some(i) = &filter.integration_id {
            cond.push(" AND p.integration_id = ").text(i.clone());
        }
        match filter.status.as_deref() {
            // Past its expiry counts as expired, marked or not.
            Some("expired") => {
                cond.push(
                    " AND (p.status = 'expired' OR (p.expires_at IS NOT NULL AND p.expires_at <= ",
                )
                .text(time::format(time::now()))
                .push("))");
            }
            Some(s) => {
                cond.push(" AND p.status = ")
                    .text(s.to_owned())
                    .push(" AND (p.expires_at IS NULL OR p.expires_at > ")
                    .text(time::format(time::now()))
                    .push(")");
            }
            None => {}
        }
        integrations::tag_conditions(&mut cond, "provider_tags", "provider_id", "p", &filter.tags);
        cond.select_page(
            &self.db,
            COLUMNS,
            "p.created_at DESC, p.id DESC",
            page,
            from_row,
        )
        .await
    }

    /// Applies `changes` to a provider; with `key`, also replaces its integration's secret
    /// (the legacy virtual key update), in the same transaction.
    pub async fn update_provider(
        &self,
        actor: Actor<'_>,
        provider: &Provider,
        changes: &ProviderChanges,
        key: Option<&str>,
    ) -> Result<()> {
        let now = time::now();
        let mut tx = self.db.begin_write().await?;
        let BudgetHolder {
            stored_status,
            old_limits,
            stored,
        } = self
            .lock_budget_holder(
                &mut tx,
                "providers",
                &provider.id,
                &provider.organisation_id,
            )
            .await?
            .ok_or_else(|| AdminError::not_found(format!("no provider {}", provider.slug)))?;
        let mut sql = Sql::new("UPDATE providers SET last_updated_at = ");
        sql.text(time::format(now));
        if let Some(name) = &changes.name {
            sql.push(", name = ").text(name.clone());
        }
        if let Some(n) = &changes.note {
            sql.push(", note = ");
            nullable(&mut sql, n.clone());
        }
        if let Some(u) = &changes.usage_limits {
            sql.push(", usage_limits = ");
            nullable(&mut sql, u.as_ref().map(to_text));
        }
        if let Some(r) = &changes.rate_limits {
            sql.push(", rate_limits = ").text(to_text(r));
        }
        if let Some(t) = &changes.tags {
            sql.push(", tags = ").text(to_text(t));
        }
        let status = restate_expiry_and_budget(
            &mut sql,
            &stored_status,
            changes.expires_at,
            now,
            changes.reset_usage,
            changes.usage_limits.as_ref(),
            old_limits.as_ref(),
            stored,
        );
        if status != stored_status {
            sql.push(", status = ").text(status);
        }
        sql.push(" WHERE id = ")
            .text(provider.id.clone())
            .push(" AND organisation_id = ")
            .text(provider.organisation_id.clone());
        let sealed_key = match key {
            Some(k) => Some(self.cipher()?.encrypt(
                k,
                &super::snapshot::secret_context(&provider.integration_id, "key"),
            )),
            None => None,
        };
        let done = sql.query().execute(&mut *tx).await?;
        if done.rows_affected() == 0 {
            return Err(AdminError::not_found(format!(
                "no provider {}",
                provider.slug
            )));
        }
        if let Some(t) = &changes.tags {
            integrations::replace_tags(&mut tx, "provider_tags", "provider_id", &provider.id, t)
                .await?;
        }
        // A new key is its integration's: every provider using it changes.
        let mut changed = vec![Change::Provider(provider.slug.clone())];
        if let (Some(sealed), Some(k)) = (sealed_key, key) {
            changed.push(Change::Integration(provider.integration_id.clone()));
            self.record_secret_key(&mut tx).await?;
            sqlx::query(
                "UPDATE integrations SET key_secret = $1, key_mask = $2, last_updated_at = $3
                 WHERE id = $4",
            )
            .bind(sealed)
            .bind(crate::keys::mask(k))
            .bind(time::format(now))
            .bind(&provider.integration_id)
            .execute(&mut *tx)
            .await?;
        }
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("update", "provider")
                .resource(&provider.id)
                .workspace(Some(&provider.workspace_id)),
        )
        .await?;
        self.data_plane_changed(&mut tx, &changed).await?;
        tx.commit().await?;
        self.after_data_plane_change().await;
        Ok(())
    }

    /// Deletes a provider. A provider made by the legacy virtual-key alias takes its
    /// integration with it when no other provider uses that integration.
    pub async fn delete_provider(&self, actor: Actor<'_>, provider: &Provider) -> Result<()> {
        let mut tx = self.db.begin_write().await?;
        let done = sqlx::query("DELETE FROM providers WHERE id = $1 AND organisation_id = $2")
            .bind(&provider.id)
            .bind(&provider.organisation_id)
            .execute(&mut *tx)
            .await?;
        if done.rows_affected() == 0 {
            return Err(AdminError::not_found(format!(
                "no provider {}",
                provider.slug
            )));
        }
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("delete", "provider")
                .resource(&provider.id)
                .workspace(Some(&provider.workspace_id)),
        )
        .await?;
        let mut changes = vec![Change::Provider(provider.slug.clone())];
        if provider.integration_origin == "virtual_key" {
            let left: i64 =
                sqlx::query_scalar("SELECT COUNT(*) FROM providers WHERE integration_id = $1")
                    .bind(&provider.integration_id)
                    .fetch_one(&mut *tx)
                    .await?;
            if left == 0 {
                // Its providers go with it (a cascade): one made since the count is one too.
                changes.push(Change::Integration(provider.integration_id.clone()));
                sqlx::query("DELETE FROM integrations WHERE id = $1")
                    .bind(&provider.integration_id)
                    .execute(&mut *tx)
                    .await?;
                audit::insert(
                    &mut tx,
                    actor,
                    &AuditEntry::new("delete", "integration")
                        .resource(&provider.integration_id)
                        .workspace(Some(&provider.workspace_id)),
                )
                .await?;
            }
        }
        self.data_plane_changed(&mut tx, &changes).await?;
        tx.commit().await?;
        self.after_data_plane_change().await;
        Ok(())
    }

    /// Whether a provider slug is taken (slugs are unique across the database).
    pub async fn provider_slug_taken(&self, slug: &str) -> Result<bool> {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM providers WHERE slug = $1")
            .bind(slug)
            .fetch_one(self.db.pool())
            .await?;
        Ok(n > 0)
    }

    /// Marks providers past their `expires_at` as `expired` (the expiry worker's sweep), each
    /// with an audit record; returns how many.
    pub async fn expire_providers(&self) -> Result<usize> {
        let now = time::format(time::now());
        let mut tx = self.db.begin_write().await?;
        let rows = sqlx::query(
            "UPDATE providers SET status = 'expired', last_updated_at = $1
             WHERE status <> 'expired' AND expires_at IS NOT NULL AND expires_at <= $1
             RETURNING id, slug, organisation_id, workspace_id",
        )
        .bind(&now)
        .fetch_all(&mut *tx)
        .await?;
        let mut changes = Vec::with_capacity(rows.len());
        for r in &rows {
            let id: String = r.try_get("id")?;
            changes.push(Change::Provider(r.try_get("slug")?));
            let org: String = r.try_get("organisation_id")?;
            let ws: String = r.try_get("workspace_id")?;
            audit::insert_system(
                &mut tx,
                &org,
                &AuditEntry::new("expire", "provider")
                    .resource(&id)
                    .workspace(Some(&ws)),
            )
            .await?;
        }
        if !rows.is_empty() {
            self.data_plane_changed(&mut tx, &changes).await?;
        }
        tx.commit().await?;
        if !rows.is_empty() {
            self.after_data_plane_change().await;
        }
        Ok(rows.len())
    }
}
