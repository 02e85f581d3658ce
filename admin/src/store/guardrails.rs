//! Saved guardrails: one hook each (checks and actions), owned by a workspace, named by
//! routing configs, workspace defaults and the pipeline's YAML (slug or id). The headers of
//! their checks are secrets, sealed at rest and shown masked as a config's are
//! ([`config_secrets`] with [`Body::Hook`]). Every change is audited and republishes the data
//! plane's snapshot.

use serde_json::{json, Value};
use sqlx::any::AnyRow;
use sqlx::Row;

use super::audit::{self, AuditEntry};
use super::changes::Change;
use super::config_secrets::{self, Body, Sealed};
use super::{to_text, Actor, Store};
use crate::db::{Sql, Tx};
use crate::error::{is_unique_violation, AdminError, Result};
use crate::time;
use crate::validate::Page;

/// A guardrail to create: `hook` in clear, validated.
#[derive(Debug, Clone)]
pub struct NewGuardrail {
    pub workspace_id: String,
    pub slug: String,
    pub name: String,
    /// `{type, checks, deny, async, on_fail, on_success}`.
    pub hook: Value,
}

/// A stored guardrail; `hook` shows its secrets masked.
#[derive(Debug, Clone, PartialEq)]
pub struct Guardrail {
    pub id: String,
    pub organisation_id: String,
    pub workspace_id: String,
    pub slug: String,
    pub name: String,
    pub hook: Value,
    pub status: String,
    /// 1 at creation, one more at each update.
    pub version: i64,
    pub created_at: String,
    pub last_updated_at: String,
}

impl Guardrail {
    /// The API's shape: the hook's `type` and `checks`, and its actions under `actions`.
    pub fn to_json(&self) -> Value {
        let field = |name: &str, default: Value| self.hook.get(name).cloned().unwrap_or(default);
        json!({
            "id": self.id,
            "slug": self.slug,
            "name": self.name,
            "organisation_id": self.organisation_id,
            "workspace_id": self.workspace_id,
            "type": field("type", json!("guardrail")),
            "checks": field("checks", json!([])),
            "actions": {
                "deny": field("deny", json!(false)),
                "async": field("async", json!(false)),
                "on_fail": field("on_fail", Value::Null),
                "on_success": field("on_success", Value::Null),
            },
            "status": self.status,
            "version": self.version,
            "created_at": self.created_at,
            "last_updated_at": self.last_updated_at,
            "object": "guardrail",
        })
    }
}

/// Changes of `PUT /guardrails/{id}`; `None` keeps a field.
#[derive(Debug, Clone, Default)]
pub struct GuardrailChanges {
    pub name: Option<String>,
    /// The new hook as the client sent it: a header sent back masked keeps the stored one.
    /// Checked with the data plane's validator once unmasked.
    pub hook: Option<Value>,
}

/// Filters of `GET /guardrails`.
#[derive(Debug, Clone, Default)]
pub struct GuardrailFilter {
    pub workspace_id: Option<String>,
}

const COLUMNS: &str = "g.id, g.organisation_id, g.workspace_id, g.slug, g.name, g.hook,
    g.status, g.version, g.created_at, g.last_updated_at";

fn from_row(r: &AnyRow) -> Result<Guardrail> {
    Ok(Guardrail {
        id: r.try_get("id")?,
        organisation_id: r.try_get("organisation_id")?,
        workspace_id: r.try_get("workspace_id")?,
        slug: r.try_get("slug")?,
        name: r.try_get("name")?,
        hook: super::json_column(r, "hook")?,
        status: r.try_get("status")?,
        version: r.try_get("version")?,
        created_at: r.try_get("created_at")?,
        last_updated_at: r.try_get("last_updated_at")?,
    })
}

impl Store {
    /// Creates a guardrail.
    pub async fn create_guardrail(
        &self,
        actor: Actor<'_>,
        new: &NewGuardrail,
    ) -> Result<Guardrail> {
        let org = &actor.principal.organisation_id;
        let id = uuid::Uuid::new_v4().to_string();
        let now = time::format(time::now());
        // A mask is never taken for a secret: there is nothing stored to keep yet.
        let clear = config_secrets::unmask_in(Body::Hook, new.hook.clone(), &Value::Null)?;
        let (shown, sealed) = self.sealed_hook(&id, &clear)?;
        let mut tx = self.db.begin_write().await?;
        if !sealed.is_empty() {
            self.record_secret_key(&mut tx).await?;
        }
        sqlx::query(
            "INSERT INTO guardrails (id, organisation_id, workspace_id, slug, name, hook, secrets,
                 status, version, created_by_user_id, created_by_key_id, created_at,
                 last_updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, 'active', 1, $8, $9, $10, $10)",
        )
        .bind(&id)
        .bind(org)
        .bind(&new.workspace_id)
        .bind(&new.slug)
        .bind(&new.name)
        .bind(to_text(&shown))
        .bind(to_text(&sealed))
        .bind(actor.principal.user_id.clone())
        .bind(actor.principal.key_id.clone())
        .bind(&now)
        .execute(&mut *tx)
        .await
        .map_err(|e| {
            if is_unique_violation(&e) {
                AdminError::conflict(format!(
                    "a guardrail with the slug {} already exists",
                    new.slug
                ))
            } else if crate::error::is_foreign_key_violation(&e) {
                AdminError::reference("workspace_id: the workspace no longer exists")
            } else {
                e.into()
            }
        })?;
        self.commit_change(tx, actor, "create", &id, &new.workspace_id)
            .await?;
        Ok(Guardrail {
            id,
            organisation_id: org.clone(),
            workspace_id: new.workspace_id.clone(),
            slug: new.slug.clone(),
            name: new.name.clone(),
            hook: shown,
            status: "active".into(),
            version: 1,
            created_at: now.clone(),
            last_updated_at: now,
        })
    }

    /// A guardrail of the organisation by id or slug.
    pub async fn guardrail(
        &self,
        organisation_id: &str,
        id_or_slug: &str,
    ) -> Result<Option<Guardrail>> {
        let column = if crate::validate::is_uuid(id_or_slug) {
            "g.id"
        } else {
            "g.slug"
        };
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM guardrails g WHERE {column} = $1 AND g.organisation_id = $2"
        )))
        .bind(id_or_slug)
        .bind(organisation_id)
        .fetch_optional(self.db.pool())
        .await?;
        row.as_ref().map(from_row).transpose()
    }

    /// Guardrails of the organisation, newest first, and how many match in all.
    pub async fn guardrails(
        &self,
        organisation_id: &str,
        filter: &GuardrailFilter,
        page: Page,
    ) -> Result<(i64, Vec<Guardrail>)> {
        let mut cond = Sql::new(" FROM guardrails g");
        cond.push(" WHERE g.organisation_id = ")
            .text(organisation_id);
        if let Some(ws) = &filter.workspace_id {
            cond.push(" AND g.workspace_id = ").text(ws.clone());
        }
        cond.select_page(
            &self.db,
            COLUMNS,
            "g.created_at DESC, g.id DESC",
            page,
            from_row,
        )
        .await
    }

    /// Applies `changes`.
    pub async fn update_guardrail(
        &self,
        actor: Actor<'_>,
        guardrail: &Guardrail,
        changes: &GuardrailChanges,
    ) -> Result<()> {
        let now = time::format(time::now());
        let mut tx = self.db.begin_write().await?;
        let row = sqlx::query(
            "SELECT hook, secrets FROM guardrails WHERE id = $1 AND organisation_id = $2",
        )
        .bind(&guardrail.id)
        .bind(&guardrail.organisation_id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| AdminError::not_found(format!("no guardrail {}", guardrail.slug)))?;
        let mut sql = Sql::new("UPDATE guardrails SET version = version + 1, last_updated_at = ");
        sql.text(now);
        if let Some(name) = &changes.name {
            sql.push(", name = ").text(name.clone());
        }
        if let Some(sent) = &changes.hook {
            // Masks sent back keep the stored secrets; the result is what is checked.
            let current = config_secrets::open_in(
                Body::Hook,
                self.cipher().ok(),
                &guardrail.id,
                &super::json_column(&row, "hook")?,
                Some(&stored_secrets(&row)?),
            )?;
            let clear = config_secrets::unmask_in(Body::Hook, sent.clone(), &current)?;
            self.check_guardrail(&clear)
                .map_err(AdminError::validation)?;
            let (shown, sealed) = self.sealed_hook(&guardrail.id, &clear)?;
            if !sealed.is_empty() {
                self.record_secret_key(&mut tx).await?;
            }
            sql.push(", hook = ")
                .text(to_text(&shown))
                .push(", secrets = ")
                .text(to_text(&sealed));
        }
        sql.push(" WHERE id = ").text(guardrail.id.clone());
        sql.query().execute(&mut *tx).await?;
        self.commit_change(tx, actor, "update", &guardrail.id, &guardrail.workspace_id)
            .await
    }

    /// Deletes a guardrail. One its workspace's defaults name is a 409: the workspace's
    /// requests would be refused until the defaults stop naming it.
    pub async fn delete_guardrail(&self, actor: Actor<'_>, guardrail: &Guardrail) -> Result<()> {
        let mut tx = self.db.begin_write().await?;
        let defaults: Option<String> =
            sqlx::query_scalar("SELECT defaults FROM workspaces WHERE id = $1")
                .bind(&guardrail.workspace_id)
                .fetch_optional(&mut *tx)
                .await?;
        if let Some(text) = defaults {
            let defaults: Value = super::from_text("workspaces.defaults", &text)?;
            let named = ["input_guardrails", "output_guardrails"]
                .iter()
                .any(|side| {
                    defaults[side].as_array().is_some_and(|list| {
                        list.iter().any(|g| {
                            g.as_str() == Some(guardrail.slug.as_str())
                                || g.as_str() == Some(guardrail.id.as_str())
                        })
                    })
                });
            if named {
                return Err(AdminError::conflict(format!(
                    "the guardrail {} is named in its workspace's defaults \
                     (input_guardrails or output_guardrails): remove it there first",
                    guardrail.slug
                )));
            }
        }
        let done = sqlx::query("DELETE FROM guardrails WHERE id = $1 AND organisation_id = $2")
            .bind(&guardrail.id)
            .bind(&guardrail.organisation_id)
            .execute(&mut *tx)
            .await?;
        if done.rows_affected() == 0 {
            return Err(AdminError::not_found(format!(
                "no guardrail {}",
                guardrail.slug
            )));
        }
        self.commit_change(tx, actor, "delete", &guardrail.id, &guardrail.workspace_id)
            .await
    }

    /// Ends a write: its audit record, the data plane's version, the commit, and this
    /// instance's new snapshot.
    async fn commit_change(
        &self,
        mut tx: Tx,
        actor: Actor<'_>,
        action: &'static str,
        id: &str,
        workspace_id: &str,
    ) -> Result<()> {
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new(action, "guardrail")
                .resource(id)
                .workspace(Some(workspace_id)),
        )
        .await?;
        self.data_plane_changed(&mut tx, &[Change::Guardrail(id.to_string())])
            .await?;
        tx.commit().await?;
        self.after_data_plane_change().await;
        Ok(())
    }

    /// A hook in clear as stored: masked, and its secrets sealed.
    fn sealed_hook(&self, id: &str, clear: &Value) -> Result<(Value, Sealed)> {
        config_secrets::seal_in(Body::Hook, self.cipher().ok(), id, clear)
    }

    /// A guardrail's hook in clear, for the data plane: `None` (logged) when its secrets
    /// cannot be opened, so that it is left out (requests naming it are refused) rather than
    /// run without them.
    pub(super) fn open_guardrail(&self, r: &AnyRow) -> Result<Option<Value>> {
        let id: String = r.try_get("id")?;
        let opened = stored_secrets(r).and_then(|sealed| {
            config_secrets::open_in(
                Body::Hook,
                self.cipher().ok(),
                &id,
                &super::json_column(r, "hook")?,
                Some(&sealed),
            )
        });
        match opened {
            Ok(hook) => Ok(Some(hook)),
            Err(e) => {
                tracing::error!(guardrail = %id, error = %e, "guardrail left out of the data plane: its secrets cannot be read");
                Ok(None)
            }
        }
    }
}

fn stored_secrets(r: &AnyRow) -> Result<Sealed> {
    let text: String = r.try_get("secrets")?;
    super::from_text("guardrails.secrets", &text)
}
