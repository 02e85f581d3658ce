//! Counted usage of budgets (API keys, providers, workspace budgets, usage limits policy
//! entities): the arithmetic shared by the data plane's charges, the manual resets and the
//! usage the API shows.
//!
//! Every stored usage carries the reset period it was counted in (`usage_period`, the
//! [`UsageLimit::period_at`] of the budget's schedule) and a reset epoch (`reset_epoch`, bumped
//! by each manual reset). Usage of an elapsed period counts as zero; a charge counted before a
//! manual reset (an older epoch) or in an elapsed period is dropped.

use std::time::SystemTime;

use plugin_sdk::access::{PeriodicReset as SdkReset, UsageKind, UsageLimit};

use super::policies::UsageLimitsPolicy;
use crate::validate::{PeriodicReset, UsageLimits, UsageType};

/// A stored `UsageLimits` (keys, providers, workspaces) as the data plane reads it.
pub(crate) fn sdk_limit(l: &UsageLimits) -> UsageLimit {
    UsageLimit {
        credit_limit: l.credit_limit as f64,
        kind: sdk_kind(l.kind),
        alert_threshold: l.alert_threshold.map(|t| t as f64),
        periodic_reset: l.periodic_reset.map(sdk_reset),
        periodic_reset_days: l.periodic_reset_days.and_then(|d| u32::try_from(d).ok()),
        next_usage_reset_at: l.next_usage_reset_at.clone(),
    }
}

/// A usage limits policy's limit as the data plane reads it.
pub(crate) fn policy_limit(p: &UsageLimitsPolicy) -> UsageLimit {
    UsageLimit {
        credit_limit: p.credit_limit,
        kind: sdk_kind(p.kind),
        alert_threshold: p.alert_threshold,
        periodic_reset: p.periodic_reset.map(sdk_reset),
        periodic_reset_days: p.periodic_reset_days.and_then(|d| u32::try_from(d).ok()),
        next_usage_reset_at: p.next_usage_reset_at.clone(),
    }
}

fn sdk_kind(k: UsageType) -> UsageKind {
    match k {
        UsageType::Cost => UsageKind::Cost,
        UsageType::Tokens => UsageKind::Tokens,
    }
}

fn sdk_reset(r: PeriodicReset) -> SdkReset {
    match r {
        PeriodicReset::Weekly => SdkReset::Weekly,
        PeriodicReset::Monthly => SdkReset::Monthly,
    }
}

/// The reset period the budget is in now (0 for a budget without a schedule).
pub(crate) fn period_now(limit: Option<&UsageLimit>) -> i64 {
    limit.map_or(0, |l| l.period_at(SystemTime::now()))
}

/// The usage that counts in `current` of usage counted in `counted_in`.
pub(crate) fn in_period(usage: f64, counted_in: i64, current: i64) -> f64 {
    if counted_in >= current {
        usage
    } else {
        0.0
    }
}

/// What is stored for one budget.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Stored {
    pub usage: f64,
    pub period: i64,
    pub epoch: i64,
}

/// The stored usage after a charge of `amount` counted in `period` at `epoch`, as
/// `(usage, period)`; `None` when the charge is dropped: it was counted before the budget's last
/// manual reset (an older epoch) or in a period older than the stored one. A newer period starts
/// the usage over.
pub(crate) fn settle(stored: Stored, amount: f64, period: i64, epoch: i64) -> Option<(f64, i64)> {
    if epoch < stored.epoch || period < stored.period {
        return None;
    }
    if period > stored.period {
        Some((amount, period))
    } else {
        Some((stored.usage + amount, period))
    }
}

/// The status of a budget holder with `usage` against `limit`: `exhausted` at or above it,
/// `active` below it; `expired` (keys, providers) is left as it is.
pub(crate) fn decide(status: &str, usage: f64, limit: f64) -> String {
    if status == "expired" {
        status.to_owned()
    } else if usage >= limit {
        "exhausted".to_owned()
    } else {
        "active".to_owned()
    }
}

/// What the API shows of a stored budget now: usage of an elapsed period reads as 0, and an
/// exhausted status as active (the next charge or update writes it so).
pub(crate) fn shown(
    limit: Option<&UsageLimit>,
    status: &str,
    usage: f64,
    period: i64,
) -> (String, f64) {
    let Some(limit) = limit else {
        return (status.to_owned(), usage);
    };
    let now = period_now(Some(limit));
    if period >= now {
        return (status.to_owned(), usage);
    }
    let status = if status == "exhausted" {
        "active"
    } else {
        status
    };
    (status.to_owned(), 0.0)
}

/// The usage rows of one holder's budgets in a budget-usage table (`workspace_budget_usage`,
/// `integration_budget_usage`): the table, and the values of its key columns (`budget_index`
/// aside), bound as `$1..$n`.
pub(super) struct UsageRows<'a> {
    pub table: &'static str,
    pub keys: &'a [(&'static str, &'a str)],
}

impl UsageRows<'_> {
    /// `k1 = $1 AND k2 = $2 ...`
    pub fn matches(&self) -> String {
        let parts: Vec<String> = self
            .keys
            .iter()
            .enumerate()
            .map(|(i, (column, _))| format!("{column} = ${}", i + 1))
            .collect();
        parts.join(" AND ")
    }

    /// The number of the first placeholder after the keys'.
    pub fn next(&self) -> usize {
        self.keys.len() + 1
    }

    /// `sql` with the keys bound.
    pub fn query(&self, sql: String) -> sqlx::query::Query<'_, sqlx::Any, sqlx::any::AnyArguments> {
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
        for (_, value) in self.keys {
            q = q.bind(*value);
        }
        q
    }
}

/// After a change of a holder's budgets from `old` to `new` (in the change's transaction, the
/// rows the budgets come from locked): each item keeps the usage counted in its current period,
/// carried into the new schedule's current period, and its status is re-decided against the
/// new credit limit (so raising it reactivates an exhausted budget at once); usage of items past
/// the end of the new list is removed. Items are matched by position.
pub(super) async fn restate(
    tx: &mut crate::db::Tx,
    backend: crate::db::Backend,
    rows: &UsageRows<'_>,
    old: &[UsageLimits],
    new: &[UsageLimits],
) -> crate::error::Result<()> {
    use sqlx::Row;
    let (table, matches, at) = (rows.table, rows.matches(), rows.next());
    let now = crate::time::format(crate::time::now());
    rows.query(format!(
        "DELETE FROM {table} WHERE {matches} AND budget_index >= ${at}"
    ))
    .bind(new.len() as i64)
    .execute(&mut **tx)
    .await?;
    // Locked: a charge committed meanwhile would otherwise be overwritten with what was read.
    let stored = rows
        .query(format!(
            "SELECT budget_index, current_usage, usage_period FROM {table} WHERE {matches}{}",
            backend.for_update()
        ))
        .fetch_all(&mut **tx)
        .await?;
    for r in &stored {
        let index: i64 = r.try_get("budget_index")?;
        let Some(limit) = usize::try_from(index).ok().and_then(|i| new.get(i)) else {
            continue;
        };
        let old_limit = old.get(index as usize).map(sdk_limit);
        let new_limit = sdk_limit(limit);
        let counted = in_period(
            r.try_get("current_usage")?,
            r.try_get("usage_period")?,
            period_now(old_limit.as_ref()),
        );
        rows.query(format!(
            "UPDATE {table}
             SET current_usage = ${at}, usage_period = ${}, status = ${}, last_updated_at = ${}
             WHERE {matches} AND budget_index = ${}",
            at + 1,
            at + 2,
            at + 3,
            at + 4
        ))
        .bind(counted)
        .bind(period_now(Some(&new_limit)))
        .bind(decide("active", counted, new_limit.credit_limit))
        .bind(&now)
        .bind(index)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const AT: Stored = Stored {
        usage: 5.0,
        period: 10,
        epoch: 2,
    };

    #[test]
    fn charges_settle_by_period_and_epoch() {
        // Same period and epoch: added.
        assert_eq!(settle(AT, 1.5, 10, 2), Some((6.5, 10)));
        // A newer period starts over.
        assert_eq!(settle(AT, 1.5, 11, 2), Some((1.5, 11)));
        // An older period, or one counted before the last reset: dropped.
        assert_eq!(settle(AT, 1.5, 9, 2), None);
        assert_eq!(settle(AT, 1.5, 10, 1), None);
        assert_eq!(settle(AT, 1.5, 11, 1), None);
        // A newer epoch than stored (a snapshot ahead of this row: cannot happen, but harmless).
        assert_eq!(settle(AT, 1.0, 10, 3), Some((6.0, 10)));
    }

    #[test]
    fn status_follows_usage_and_limit() {
        assert_eq!(decide("active", 10.0, 10.0), "exhausted");
        assert_eq!(decide("exhausted", 9.99, 10.0), "active");
        assert_eq!(decide("expired", 100.0, 10.0), "expired");
        assert_eq!(in_period(3.0, 4, 4), 3.0);
        assert_eq!(in_period(3.0, 3, 4), 0.0);
    }

    #[test]
    fn an_elapsed_period_shows_as_zero() {
        let monthly = UsageLimit {
            credit_limit: 10.0,
            kind: UsageKind::Cost,
            alert_threshold: None,
            periodic_reset: Some(SdkReset::Monthly),
            periodic_reset_days: None,
            next_usage_reset_at: None,
        };
        let now = period_now(Some(&monthly));
        assert_eq!(
            shown(Some(&monthly), "exhausted", 12.0, now),
            ("exhausted".to_owned(), 12.0)
        );
        assert_eq!(
            shown(Some(&monthly), "exhausted", 12.0, now - 1),
            ("active".to_owned(), 0.0)
        );
        assert_eq!(
            shown(Some(&monthly), "expired", 12.0, now - 1),
            ("expired".to_owned(), 0.0)
        );
        assert_eq!(
            shown(None, "exhausted", 1.0, -5),
            ("exhausted".to_owned(), 1.0)
        );
    }
}
