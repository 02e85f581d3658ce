//! The models of an integration: whether each is enabled, and its custom price. Priced models
//! reach the data plane with every provider of the integration
//! (`ProviderRecord::model_prices`), where they price requests before any price table.
//!
//! A model is one row per integration and model id, whatever the id's case (`slug_key` is it
//! in lowercase). `PUT /integrations/{slug}/models` upserts: each listed model's row is set as
//! given; models not listed are kept.

use std::collections::HashMap;

use plugin_sdk::store::ModelPrice;
use serde_json::{json, Value};
use sqlx::any::AnyRow;
use sqlx::Row;

use super::audit::{self, AuditEntry};
use super::changes::Change;
use super::{Actor, Integration, Store};
use crate::db::{Db, Sql};
use crate::error::{AdminError, Result};
use crate::time;
use crate::validate::Page;

/// The most models one integration lists: keeps every snapshot of the data plane small.
pub const MAX_MODELS_PER_INTEGRATION: i64 = 10_000;

/// A model's custom price, in US dollars per million tokens (finite, 0 or more: the handler
/// checks).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelPricing {
    pub input_per_million: f64,
    pub output_per_million: f64,
}

/// One model of an integration.
#[derive(Debug, Clone, PartialEq)]
pub struct IntegrationModel {
    /// The model id as written by the client (1 to 255 printable characters).
    pub slug: String,
    pub enabled: bool,
    /// `None`: no custom price (the price tables apply).
    pub pricing: Option<ModelPricing>,
}

impl IntegrationModel {
    /// `{slug, enabled, pricing_config: {input_per_million, output_per_million} | null, object}`.
    pub fn to_json(&self) -> Value {
        json!({
            "slug": self.slug,
            "enabled": self.enabled,
            "pricing_config": self.pricing.map(|p| json!({
                "input_per_million": p.input_per_million,
                "output_per_million": p.output_per_million,
            })),
            "object": "integration-model",
        })
    }
}

fn from_row(r: &AnyRow) -> Result<IntegrationModel> {
    let input: Option<f64> = r.try_get("input_per_million")?;
    let output: Option<f64> = r.try_get("output_per_million")?;
    Ok(IntegrationModel {
        slug: r.try_get("slug")?,
        enabled: r.try_get::<i64, _>("enabled")? != 0,
        pricing: match (input, output) {
            (Some(input_per_million), Some(output_per_million)) => Some(ModelPricing {
                input_per_million,
                output_per_million,
            }),
            _ => None,
        },
    })
}

impl Store {
    /// The models of an integration, by id (case-insensitive order), and how many in all.
    pub async fn integration_models(
        &self,
        integration: &Integration,
        page: Page,
    ) -> Result<(i64, Vec<IntegrationModel>)> {
        let mut cond = Sql::new(" FROM integration_models WHERE integration_id = ");
        cond.text(integration.id.clone());
        cond.select_page(
            &self.db,
            "slug, enabled, input_per_million, output_per_million",
            "slug_key",
            page,
            from_row,
        )
        .await
    }

    /// Sets each of `models` on the integration (added, or replacing the model of the same id
    /// in any case), in one transaction with its audit record; the data plane sees the new
    /// prices with its next request. `models` holds each id once (the handler checks).
    pub async fn update_integration_models(
        &self,
        actor: Actor<'_>,
        integration: &Integration,
        models: &[IntegrationModel],
    ) -> Result<()> {
        let now = time::format(time::now());
        let mut tx = self.db.begin_write().await?;
        // The integration's row, taken: it still exists, and concurrent updates queue.
        let done = sqlx::query(
            "UPDATE integrations SET last_updated_at = $1 WHERE id = $2 AND organisation_id = $3",
        )
        .bind(&now)
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
        for m in models {
            sqlx::query(
                "INSERT INTO integration_models (integration_id, slug_key, slug, enabled,
                     input_per_million, output_per_million, created_at, last_updated_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $7)
                 ON CONFLICT (integration_id, slug_key) DO UPDATE SET slug = excluded.slug,
                     enabled = excluded.enabled, input_per_million = excluded.input_per_million,
                     output_per_million = excluded.output_per_million,
                     last_updated_at = excluded.last_updated_at",
            )
            .bind(&integration.id)
            .bind(m.slug.to_ascii_lowercase())
            .bind(&m.slug)
            .bind(i64::from(m.enabled))
            .bind(m.pricing.map(|p| p.input_per_million))
            .bind(m.pricing.map(|p| p.output_per_million))
            .bind(&now)
            .execute(&mut *tx)
            .await?;
        }
        let listed: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM integration_models WHERE integration_id = $1")
                .bind(&integration.id)
                .fetch_one(&mut *tx)
                .await?;
        if listed > MAX_MODELS_PER_INTEGRATION {
            return Err(AdminError::field(
                "models",
                format!(
                    "an integration lists at most {MAX_MODELS_PER_INTEGRATION} models; this would \
                     make {listed}"
                ),
            ));
        }
        audit::insert(
            &mut tx,
            actor,
            &AuditEntry::new("update_models", "integration")
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
}

/// The priced models of every integration, or only of `only` (for the data plane's snapshot), by
/// integration id, each list in id order.
pub(super) async fn model_prices(
    db: &Db,
    only: Option<&str>,
) -> Result<HashMap<String, Vec<ModelPrice>>> {
    let filter = if only.is_some() {
        " AND integration_id = $1"
    } else {
        ""
    };
    let sql = format!(
        "SELECT integration_id, slug, input_per_million, output_per_million
         FROM integration_models
         WHERE input_per_million IS NOT NULL AND output_per_million IS NOT NULL{filter}
         ORDER BY integration_id, slug_key"
    );
    let rows = super::bind_some(sqlx::query(sqlx::AssertSqlSafe(sql)), only)
        .fetch_all(db.pool())
        .await?;
    let mut out: HashMap<String, Vec<ModelPrice>> = HashMap::new();
    for r in &rows {
        out.entry(r.try_get("integration_id")?)
            .or_default()
            .push(ModelPrice {
                model: r.try_get("slug")?,
                input_per_million: r.try_get("input_per_million")?,
                output_per_million: r.try_get("output_per_million")?,
            });
    }
    Ok(out)
}
