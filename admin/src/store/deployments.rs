//! Gateway deployments: a type (`production` or `non-production`), a slug, a deployment config
//! and, optionally, the workspaces they are restricted to. How many of each type the
//! organisation may have is one of its settings (`deployments_production_max`,
//! `deployments_non_production_max`), checked in the transaction that makes a deployment or
//! changes its type.

use serde_json::{json, Value};
use sqlx::any::AnyRow;
use sqlx::Row;

use super::audit::{self, AuditEntry};
use super::{from_text, to_text, Actor, Store};
use crate::db::{Sql, Tx};
use crate::error::{is_foreign_key_violation, is_unique_violation, AdminError, Result};
use crate::time;
use crate::validate::Page;

/// A deployment to make (checked by the handler; workspace ids resolved).
#[derive(Debug, Clone)]
pub struct NewDeployment {
    pub slug: String,
    pub name: String,
    /// `production` or `non-production`.
    pub kind: String,
    pub config: Value,
    /// The workspaces it may serve; `None`: every workspace.
    pub workspaces: Option<Vec<String>>,
}

/// A stored deployment.
#[derive(Debug, Clone, PartialEq)]
pub struct Deployment {
    pub id: String,
    pub organisation_id: String,
    pub slug: String,
    pub name: String,
    pub kind: String,
    pub config: Value,
    pub workspaces: Option<Vec<String>>,
    pub created_at: String,
    pub last_updated_at: String,
}

impl Deployment {
    pub fn to_json(&self) -> Value {
        json!({
            "object": "deployment",
            "id": self.id,
            "slug": self.slug,
            "name": self.name,
            "type": self.kind,
            "deployment_config": self.config,
            "workspace_restrictions": self.workspaces,
            "organisation_id": self.organisation_id,
            "created_at": self.created_at,
            "last_updated_at": self.last_updated_at,
        })
    }
}

/// Changes of `PUT /deployments/{id}`; `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct DeploymentChanges {
    pub name: Option<String>,
    pub slug: Option<String>,
    pub kind: Option<String>,
    pub config: Option<Value>,
    /// `Some(None)`: serve every workspace again.
    pub workspaces: Option<Option<Vec<String>>>,
}

const COLUMNS: &str = "id, organisation_id, slug, name, type, deployment_config, restricted,
    created_at, last_updated_at";

fn from_row(r: &AnyRow) -> Result<Deployment> {
    let restricted: i64 = r.try_get("restricted")?;
    Ok(Deployment {
        id: r.try_get("id")?,
        organisation_id: r.try_get("organisation_id")?,
        slug: r.try_get("slug")?,
        name: r.try_get("name")?,
        kind: r.try_get("type")?,
        config: from_text(
            "deployments.deployment_config",
            &r.try_get::<String, _>("deployment_config")?,
        )?,
        workspaces: (restricted != 0).then(Vec::new),
        created_at: r.try_get("created_at")?,
        last_updated_at: r.try_get("last_updated_at")?,
    })
}

fn slug_taken(slug: &str) -> AdminError {
    AdminError::conflict(format!("a deployment with the slug {slug} already exists"))
}

/// Writes the workspaces a deployment is restricted to (replacing earlier ones).
async fn set_workspaces(tx: &mut Tx, deployment_id: &str, workspaces: &[String]) -> Result<()> {
    sqlx::query("DELETE FROM deployment_workspaces WHERE deployment_id = $1")
        .bind(deployment_id)
        .execute(&mut **tx)
        .await?;
    for (i, ws) in workspaces.iter().enumerate() {
        sqlx::query(
            "INSERT INTO deployment_workspaces (deployment_id, workspace_id) VALUES ($1, $2)",
        )
        .bind(deployment_id)
        .bind(ws)
        .execute(&mut **tx)
        .await
        .map_err(|e| {
            if is_foreign_key_violation(&e) {
                AdminError::reference(format!(
                    "workspace_restrictions[{i}]: the workspace {ws} was deleted meanwhile"
                ))
            } else {
                e.into()
            }
        })?;
    }
    Ok(())
}

impl Store {
    pub async fn create_deployment(
        &self,
        actor: Actor<'_>,
        new: &NewDeployment,
    ) -> Result<Deployment> {
        let org = &actor.principal.organisation_id;
        let id = uuid::Uuid::new_v4().to_string();
        let now = time::format(time::now());
        let mut tx = self.db.begin_write().await?;
        super::settings::enforce_deployment_limit(&mut tx, org, &new.kind, None).await?;
        sqlx::query(
            "INSERT INTO deployments (id, organisation_id, slug, name, type, deployment_config,
                 restricted, created_at, last_updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8)",
        )
        .bind(&id)
        .bind(org)
        .bind(&new.slug)
        .bind(&new.name)
        .bind(&new.kind)
        .bind(to_text(&new.config))
        .bind(i64::from(new.workspaces.is_some()))
        .bind(&now)
        .execute(&mut *tx)
        .await
        .map_err(|e| {
            if is_unique_violation(&e) {
                slug_taken(&new.slug)
            } else {
                e.into()
            }
        })?;
        if let Some(ws) = &new.workspaces {
            set_workspaces(&mut tx, &id, ws).await?;
        }
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("create", "deployment").resource(&id),
        )
        .await?;
        tx.commit().await?;
        Ok(Deployment {
            id,
            organisation_id: org.clone(),
            slug: new.slug.clone(),
            name: new.name.clone(),
            kind: new.kind.clone(),
            config: new.config.clone(),
            workspaces: new.workspaces.clone(),
            created_at: now.clone(),
            last_updated_at: now,
        })
    }

    /// A deployment by id or slug.
    pub async fn deployment(
        &self,
        organisation_id: &str,
        id_or_slug: &str,
    ) -> Result<Option<Deployment>> {
        let column = if crate::validate::is_uuid(id_or_slug) {
            "id"
        } else {
            "slug"
        };
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM deployments WHERE {column} = $1 AND organisation_id = $2"
        )))
        .bind(id_or_slug)
        .bind(organisation_id)
        .fetch_optional(self.db.pool())
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let mut list = vec![from_row(&row)?];
        self.attach_deployment_workspaces(&mut list).await?;
        Ok(list.pop())
    }

    /// Deployments of the organisation (of one type if given), oldest first, and how many
    /// match in all.
    pub async fn deployments(
        &self,
        organisation_id: &str,
        kind: Option<&str>,
        page: Page,
    ) -> Result<(i64, Vec<Deployment>)> {
        let mut cond = Sql::new(" FROM deployments WHERE organisation_id = ");
        cond.text(organisation_id);
        if let Some(kind) = kind {
            cond.push(" AND type = ").text(kind);
        }
        let (total, mut list) = cond
            .select_page(&self.db, COLUMNS, "created_at, id", page, from_row)
            .await?;
        self.attach_deployment_workspaces(&mut list).await?;
        Ok((total, list))
    }

    /// Fills the workspaces of the restricted deployments among `list`.
    async fn attach_deployment_workspaces(&self, list: &mut [Deployment]) -> Result<()> {
        if !list.iter().any(|d| d.workspaces.is_some()) {
            return Ok(());
        }
        let mut sql = Sql::new(
            "SELECT deployment_id, workspace_id FROM deployment_workspaces WHERE deployment_id IN (",
        );
        for (i, d) in list.iter().filter(|d| d.workspaces.is_some()).enumerate() {
            if i > 0 {
                sql.push(", ");
            }
            sql.text(d.id.clone());
        }
        sql.push(") ORDER BY workspace_id");
        for r in sql.query().fetch_all(self.db.pool()).await? {
            let dep: String = r.try_get("deployment_id")?;
            let ws: String = r.try_get("workspace_id")?;
            if let Some(list) = list
                .iter_mut()
                .find(|d| d.id == dep)
                .and_then(|d| d.workspaces.as_mut())
            {
                list.push(ws);
            }
        }
        Ok(())
    }

    pub async fn update_deployment(
        &self,
        actor: Actor<'_>,
        d: &Deployment,
        changes: &DeploymentChanges,
    ) -> Result<()> {
        let mut sql = Sql::new("UPDATE deployments SET last_updated_at = ");
        sql.text(time::format(time::now()));
        if let Some(name) = &changes.name {
            sql.push(", name = ").text(name.clone());
        }
        if let Some(slug) = &changes.slug {
            sql.push(", slug = ").text(slug.clone());
        }
        if let Some(kind) = &changes.kind {
            sql.push(", type = ").text(kind.clone());
        }
        if let Some(config) = &changes.config {
            sql.push(", deployment_config = ").text(to_text(config));
        }
        if let Some(ws) = &changes.workspaces {
            sql.push(", restricted = ").int(i64::from(ws.is_some()));
        }
        sql.push(" WHERE id = ")
            .text(d.id.clone())
            .push(" AND organisation_id = ")
            .text(d.organisation_id.clone());
        let mut tx = self.db.begin_write().await?;
        if let Some(kind) = &changes.kind {
            // Checked before the row changes: only a deployment that is not of the type yet
            // counts against the type's limit (the count leaves it out either way).
            let current: Option<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT type FROM deployments WHERE id = $1 AND organisation_id = $2{}",
                self.db.backend().for_update()
            )))
            .bind(&d.id)
            .bind(&d.organisation_id)
            .fetch_optional(&mut *tx)
            .await?;
            if current.as_deref().is_some_and(|c| c != kind) {
                super::settings::enforce_deployment_limit(
                    &mut tx,
                    &d.organisation_id,
                    kind,
                    Some(&d.id),
                )
                .await?;
            }
        }
        let done = sql.query().execute(&mut *tx).await.map_err(|e| {
            if is_unique_violation(&e) {
                slug_taken(changes.slug.as_deref().unwrap_or_default())
            } else {
                e.into()
            }
        })?;
        if done.rows_affected() == 0 {
            return Err(AdminError::not_found(format!("no deployment {}", d.id)));
        }
        if let Some(ws) = &changes.workspaces {
            set_workspaces(&mut tx, &d.id, ws.as_deref().unwrap_or_default()).await?;
        }
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("update", "deployment").resource(&d.id),
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    pub async fn delete_deployment(&self, actor: Actor<'_>, d: &Deployment) -> Result<()> {
        let mut tx = self.db.begin_write().await?;
        sqlx::query("DELETE FROM deployment_workspaces WHERE deployment_id = $1")
            .bind(&d.id)
            .execute(&mut *tx)
            .await?;
        let done = sqlx::query("DELETE FROM deployments WHERE id = $1 AND organisation_id = $2")
            .bind(&d.id)
            .bind(&d.organisation_id)
            .execute(&mut *tx)
            .await?;
        if done.rows_affected() == 0 {
            return Err(AdminError::not_found(format!("no deployment {}", d.id)));
        }
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("delete", "deployment").resource(&d.id),
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }
}
