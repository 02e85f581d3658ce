//! Usage the data plane settles against the stored budgets after its requests
//! ([`Store::apply_usage_charges`]), by counter id: `api_key:<id>`, `workspace:<id>:<index>`,
//! `provider:<slug>`, `integration:<id>:<workspace id>:<index>`, and `policy:<id>` with the
//! entity's value key.
//!
//! Per stored budget: a charge counted before its last manual reset (an older reset epoch) or in
//! an older period than the stored one is dropped; one of a newer period starts the usage over;
//! one of the same period adds to it. The holder is `exhausted` once its usage reaches the
//! credit limit (and `active` again when a newer period starts below it).
//!
//! Charges do not bump the data plane's version: the data plane's counters are the live truth
//! and the stored usage only seeds them (after a restart, or on another instance); a key or
//! provider that becomes exhausted here reaches the snapshots with the next change made
//! through the API or within the next rebuild, and the data plane refuses it from its own
//! counters meanwhile.

use plugin_sdk::sinks::UsageCharge;
use sqlx::Row;

use super::integrations::workspace_budgets;
use super::policies::{charge_entity, EntityCharge};
use super::usage::{self, UsageRows};
use super::{from_text, Store};
use crate::db::{Backend, Tx};
use crate::error::Result;
use crate::time;
use crate::validate::UsageLimits;

/// What a batch of charges did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChargeReport {
    /// Charges added to a stored budget (charges of one budget, period and epoch in the same
    /// batch count once each).
    pub applied: usize,
    /// Charges of an older reset epoch or period, or of a holder without a budget.
    pub dropped: usize,
    /// Charges of a budget that no longer exists (a deleted key, an archived policy, a
    /// workspace budget past the end of its list).
    pub unknown: usize,
    /// Malformed charges: an unreadable counter id, or an amount that is not a number >= 0.
    pub invalid: usize,
}

/// The stored budget a counter id names.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Target {
    ApiKey(String),
    Provider(String),
    Workspace(String, i64),
    /// `integration:<integration id>:<workspace id>:<index>`.
    Integration {
        id: String,
        workspace: String,
        index: i64,
    },
    Policy {
        id: String,
        value_key: String,
    },
}

impl Target {
    fn parse(budget_id: &str, value_key: &str) -> Option<Target> {
        let (kind, rest) = budget_id.split_once(':')?;
        if rest.is_empty() {
            return None;
        }
        match kind {
            "api_key" => Some(Target::ApiKey(rest.to_owned())),
            "provider" => Some(Target::Provider(rest.to_owned())),
            "workspace" => {
                let (id, index) = rest.rsplit_once(':')?;
                let index: i64 = index.parse().ok().filter(|i| *i >= 0)?;
                (!id.is_empty()).then(|| Target::Workspace(id.to_owned(), index))
            }
            "integration" => {
                let (rest, index) = rest.rsplit_once(':')?;
                let index: i64 = index.parse().ok().filter(|i| *i >= 0)?;
                let (id, workspace) = rest.split_once(':')?;
                (!id.is_empty() && !workspace.is_empty() && !workspace.contains(':')).then(|| {
                    Target::Integration {
                        id: id.to_owned(),
                        workspace: workspace.to_owned(),
                        index,
                    }
                })
            }
            "policy" if !value_key.is_empty() => Some(Target::Policy {
                id: rest.to_owned(),
                value_key: value_key.to_owned(),
            }),
            _ => None,
        }
    }
}

enum Outcome {
    Applied,
    Dropped,
    Unknown,
}

impl Store {
    /// Adds settled usage to the stored budgets, all in one transaction: an `Err` means none
    /// was applied (the caller may send the batch again); malformed charges and charges of
    /// budgets that no longer exist are skipped and counted in the report, not errors.
    /// Charges of the same budget, period and epoch are added up first, and budgets are
    /// locked in one order, so concurrent batches do not deadlock.
    pub async fn apply_usage_charges(&self, charges: &[UsageCharge]) -> Result<ChargeReport> {
        let mut report = ChargeReport::default();
        let mut merged: Vec<(Target, i64, i64, f64, usize)> = Vec::new();
        for c in charges {
            // A JWT's budgets live in its claims, not here: nothing stored to charge.
            if c.budget_id.starts_with("jwt:") {
                report.unknown += 1;
                continue;
            }
            let target = Target::parse(&c.budget_id, &c.value_key);
            let Some(target) = target.filter(|_| c.amount.is_finite() && c.amount >= 0.0) else {
                tracing::warn!(
                    budget = %c.budget_id,
                    amount = c.amount,
                    "a usage charge was skipped: its budget id or amount is malformed"
                );
                report.invalid += 1;
                continue;
            };
            match merged
                .iter_mut()
                .find(|(t, p, e, _, _)| *t == target && *p == c.period && *e == c.reset_epoch)
            {
                Some(m) => {
                    m.3 += c.amount;
                    m.4 += 1;
                }
                None => merged.push((target, c.period, c.reset_epoch, c.amount, 1)),
            }
        }
        if merged.is_empty() {
            return Ok(report);
        }
        merged.sort_by(|a, b| (&a.0, a.1, a.2).cmp(&(&b.0, b.1, b.2)));
        let backend = self.db.backend();
        let mut tx = self.db.begin_write().await?;
        for (target, period, epoch, amount, n) in &merged {
            let outcome = match target {
                Target::ApiKey(id) => {
                    charge_holder(
                        &mut tx, backend, "api_keys", "id", id, *amount, *period, *epoch,
                    )
                    .await?
                }
                Target::Provider(slug) => {
                    charge_holder(
                        &mut tx,
                        backend,
                        "providers",
                        "slug",
                        slug,
                        *amount,
                        *period,
                        *epoch,
                    )
                    .await?
                }
                Target::Workspace(id, index) => {
                    charge_workspace(&mut tx, backend, id, *index, *amount, *period, *epoch).await?
                }
                Target::Integration {
                    id,
                    workspace,
                    index,
                } => {
                    charge_integration(
                        &mut tx, backend, id, workspace, *index, *amount, *period, *epoch,
                    )
                    .await?
                }
                Target::Policy { id, value_key } => {
                    match charge_entity(
                        &mut tx,
                        backend,
                        id,
                        value_key,
                        *amount,
                        Some((*period, *epoch)),
                    )
                    .await?
                    {
                        EntityCharge::Charged(_) => Outcome::Applied,
                        EntityCharge::Dropped => Outcome::Dropped,
                        EntityCharge::NoPolicy => Outcome::Unknown,
                    }
                }
            };
            match outcome {
                Outcome::Applied => report.applied += n,
                Outcome::Dropped => report.dropped += n,
                Outcome::Unknown => report.unknown += n,
            }
        }
        tx.commit().await?;
        if report.dropped + report.unknown + report.invalid > 0 {
            tracing::debug!(?report, "usage charges settled, some not applied");
        }
        Ok(report)
    }
}

/// Charges the budget stored on a row of `api_keys` or `providers` (`usage_limits`,
/// `current_usage`, `usage_period`, `reset_epoch`, `status`), the row locked.
#[allow(clippy::too_many_arguments)]
async fn charge_holder(
    tx: &mut Tx,
    backend: Backend,
    table: &str,
    column: &str,
    key: &str,
    amount: f64,
    period: i64,
    epoch: i64,
) -> Result<Outcome> {
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT usage_limits, current_usage, usage_period, reset_epoch, status FROM {table}
         WHERE {column} = $1{}",
        backend.for_update()
    )))
    .bind(key)
    .fetch_optional(&mut **tx)
    .await?;
    let Some(row) = row else {
        return Ok(Outcome::Unknown);
    };
    let limits: Option<String> = row.try_get("usage_limits")?;
    let Some(limits) = limits else {
        // The budget was removed since the request was counted.
        return Ok(Outcome::Dropped);
    };
    let limits: UsageLimits = from_text(&format!("{table}.usage_limits"), &limits)?;
    let stored = usage::Stored {
        usage: row.try_get("current_usage")?,
        period: row.try_get("usage_period")?,
        epoch: row.try_get("reset_epoch")?,
    };
    let Some((used, period)) = usage::settle(stored, amount, period, epoch) else {
        return Ok(Outcome::Dropped);
    };
    let status = usage::decide(
        &row.try_get::<String, _>("status")?,
        used,
        limits.credit_limit as f64,
    );
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {table} SET current_usage = $1, usage_period = $2, status = $3
         WHERE {column} = $4"
    )))
    .bind(used)
    .bind(period)
    .bind(status)
    .bind(key)
    .execute(&mut **tx)
    .await?;
    Ok(Outcome::Applied)
}

/// Charges item `index` of a workspace's `usage_limits` (its usage row is made on its first
/// charge). The workspace row is read with a share lock, so a change of its limits waits.
async fn charge_workspace(
    tx: &mut Tx,
    backend: Backend,
    workspace_id: &str,
    index: i64,
    amount: f64,
    period: i64,
    epoch: i64,
) -> Result<Outcome> {
    let limits: Option<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT usage_limits FROM workspaces WHERE id = $1{}",
        backend.for_share()
    )))
    .bind(workspace_id)
    .fetch_optional(&mut **tx)
    .await?;
    let Some(limits) = limits else {
        return Ok(Outcome::Unknown);
    };
    let limits: Vec<UsageLimits> = from_text("workspaces.usage_limits", &limits)?;
    let Some(limit) = usize::try_from(index).ok().and_then(|i| limits.get(i)) else {
        return Ok(Outcome::Unknown);
    };
    let rows = UsageRows {
        table: "workspace_budget_usage",
        keys: &[("workspace_id", workspace_id)],
    };
    charge_usage_row(tx, backend, &rows, index, limit, amount, period, epoch).await
}

/// Charges item `index` of the budgets an organisation integration sets on a workspace
/// ([`workspace_budgets`]: its own, else those of the integration's global access), read with
/// a share lock so that a change of them waits.
#[allow(clippy::too_many_arguments)]
async fn charge_integration(
    tx: &mut Tx,
    backend: Backend,
    integration_id: &str,
    workspace_id: &str,
    index: i64,
    amount: f64,
    period: i64,
    epoch: i64,
) -> Result<Outcome> {
    let Some((_, limits)) = workspace_budgets(tx, backend, integration_id, workspace_id).await?
    else {
        return Ok(Outcome::Unknown);
    };
    let Some(limit) = usize::try_from(index).ok().and_then(|i| limits.get(i)) else {
        return Ok(Outcome::Unknown);
    };
    let rows = UsageRows {
        table: "integration_budget_usage",
        keys: &[
            ("integration_id", integration_id),
            ("workspace_id", workspace_id),
        ],
    };
    charge_usage_row(tx, backend, &rows, index, limit, amount, period, epoch).await
}

/// Charges budget `index` of a holder counted in a usage table (its row is made on its first
/// charge, then locked): the usage settles as [`usage::settle`] says and the row's status
/// follows it.
#[allow(clippy::too_many_arguments)]
async fn charge_usage_row(
    tx: &mut Tx,
    backend: Backend,
    rows: &UsageRows<'_>,
    index: i64,
    limit: &UsageLimits,
    amount: f64,
    period: i64,
    epoch: i64,
) -> Result<Outcome> {
    let (table, matches, at) = (rows.table, rows.matches(), rows.next());
    let columns: Vec<&str> = rows.keys.iter().map(|(c, _)| *c).collect();
    let columns = columns.join(", ");
    let placeholders: Vec<String> = (1..at).map(|i| format!("${i}")).collect();
    let now = time::format(time::now());
    rows.query(format!(
        "INSERT INTO {table} ({columns}, budget_index, current_usage, status, created_at,
             last_updated_at)
         VALUES ({}, ${at}, 0, 'active', ${now_at}, ${now_at})
         ON CONFLICT ({columns}, budget_index) DO NOTHING",
        placeholders.join(", "),
        now_at = at + 1
    ))
    .bind(index)
    .bind(&now)
    .execute(&mut **tx)
    .await?;
    let stored = rows
        .query(format!(
            "SELECT current_usage, usage_period, reset_epoch, status FROM {table}
             WHERE {matches} AND budget_index = ${at}{}",
            backend.for_update()
        ))
        .bind(index)
        .fetch_one(&mut **tx)
        .await?;
    let before = usage::Stored {
        usage: stored.try_get("current_usage")?,
        period: stored.try_get("usage_period")?,
        epoch: stored.try_get("reset_epoch")?,
    };
    let Some((used, period)) = usage::settle(before, amount, period, epoch) else {
        return Ok(Outcome::Dropped);
    };
    let status = usage::decide(
        &stored.try_get::<String, _>("status")?,
        used,
        limit.credit_limit as f64,
    );
    rows.query(format!(
        "UPDATE {table}
         SET current_usage = ${}, usage_period = ${}, status = ${}, last_updated_at = ${}
         WHERE {matches} AND budget_index = ${at}",
        at + 1,
        at + 2,
        at + 3,
        at + 4
    ))
    .bind(index)
    .bind(used)
    .bind(period)
    .bind(status)
    .bind(&now)
    .execute(&mut **tx)
    .await?;
    Ok(Outcome::Applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_ids_name_their_budget() {
        let t = |id: &str, vk: &str| Target::parse(id, vk);
        assert_eq!(t("api_key:k1", ""), Some(Target::ApiKey("k1".into())));
        assert_eq!(t("provider:p-1", ""), Some(Target::Provider("p-1".into())));
        assert_eq!(
            t("workspace:w:1", ""),
            Some(Target::Workspace("w".into(), 1))
        );
        assert_eq!(
            t("integration:i:w:2", ""),
            Some(Target::Integration {
                id: "i".into(),
                workspace: "w".into(),
                index: 2
            })
        );
        assert_eq!(
            t("policy:p", "metadata._user:alice"),
            Some(Target::Policy {
                id: "p".into(),
                value_key: "metadata._user:alice".into()
            })
        );
        for bad in [
            ("api_key:", ""),
            ("workspace:w", ""),
            ("workspace:w:-1", ""),
            ("workspace::1", ""),
            ("integration:i:0", ""),
            ("integration:i::0", ""),
            ("integration:i:w:x:0", ""),
            ("integration:i:w:-1", ""),
            ("policy:p", ""),
            ("jwt:sub:0", ""),
            ("nothing", ""),
        ] {
            assert_eq!(t(bad.0, bad.1), None, "{bad:?}");
        }
    }
}
