//! The data plane's change log: what each write changed, by version, so instances re-read only
//! that instead of every row ([`super::snapshot`]).
//!
//! A write that changes what the data plane reads calls [`record`] in its transaction: it bumps
//! `data_plane_version` and stores one row per changed thing under the new version in
//! `data_plane_changes`. The bump locks the version row until the commit, so versions commit in
//! order: an instance that reads version `v` can read every change up to `v`.
//!
//! An instance at version `a` that finds the database at `b` reads the changes `a+1..=b`; when one
//! of those versions has no row (pruned, or bumped by hand) it rebuilds everything instead. The
//! log keeps the last [`KEPT_VERSIONS`] versions.

use crate::db::{Backend, Db, Tx};
use crate::error::Result;

/// How many versions of changes the log keeps; an instance further behind rebuilds everything.
pub const KEPT_VERSIONS: i64 = 10_000;

/// How often (in versions) a write prunes the log.
const PRUNE_EVERY: i64 = 256;

/// One thing the data plane reads, named by what a write changed. Applying a change re-reads that
/// thing's current rows, so applying it twice, or after a newer change, is harmless.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Change {
    /// An API key, by id.
    ApiKey(String),
    /// A workspace (its defaults, limits and counted budgets), by id.
    Workspace(String),
    /// A saved provider, by slug.
    Provider(String),
    /// An integration, by id: every provider that uses it (secrets, settings, priced models,
    /// the workspaces it may serve).
    Integration(String),
    /// A saved config, by id.
    Config(String),
    /// A saved guardrail, by id.
    Guardrail(String),
    /// The rate limits policies (all of them: there are few).
    RatePolicies,
    /// The usage limits policies with their entities' counted usage.
    UsagePolicies,
    /// Anything else: instances rebuild their whole snapshot.
    Everything,
}

impl Change {
    fn kind(&self) -> &'static str {
        match self {
            Change::ApiKey(_) => "api_key",
            Change::Workspace(_) => "workspace",
            Change::Provider(_) => "provider",
            Change::Integration(_) => "integration",
            Change::Config(_) => "config",
            Change::Guardrail(_) => "guardrail",
            Change::RatePolicies => "rate_policies",
            Change::UsagePolicies => "usage_policies",
            Change::Everything => "everything",
        }
    }

    fn id(&self) -> &str {
        match self {
            Change::ApiKey(id)
            | Change::Workspace(id)
            | Change::Provider(id)
            | Change::Integration(id)
            | Change::Config(id)
            | Change::Guardrail(id) => id,
            Change::RatePolicies | Change::UsagePolicies | Change::Everything => "",
        }
    }

    /// A stored row read back; an unknown kind (written by a newer gateway) reads as
    /// [`Change::Everything`].
    fn parse(kind: &str, id: String) -> Change {
        match kind {
            "api_key" => Change::ApiKey(id),
            "workspace" => Change::Workspace(id),
            "provider" => Change::Provider(id),
            "integration" => Change::Integration(id),
            "config" => Change::Config(id),
            "guardrail" => Change::Guardrail(id),
            "rate_policies" => Change::RatePolicies,
            "usage_policies" => Change::UsagePolicies,
            _ => Change::Everything,
        }
    }
}

/// Records, in `tx`, that `changes` changed: one new version holding them all (nothing listed
/// records [`Change::Everything`]). With PostgreSQL it also queues a notification, sent when
/// the transaction commits.
pub(crate) async fn record(tx: &mut Tx, backend: Backend, changes: &[Change]) -> Result<()> {
    let version: i64 = sqlx::query_scalar(
        "UPDATE data_plane_version SET version = version + 1 WHERE id = 1 RETURNING version",
    )
    .fetch_one(&mut **tx)
    .await?;
    let everything = [Change::Everything];
    let changes = if changes.is_empty() {
        &everything[..]
    } else {
        changes
    };
    let mut distinct: Vec<&Change> = changes.iter().collect();
    distinct.sort();
    distinct.dedup();
    for change in distinct {
        sqlx::query("INSERT INTO data_plane_changes (version, kind, id) VALUES ($1, $2, $3)")
            .bind(version)
            .bind(change.kind())
            .bind(change.id())
            .execute(&mut **tx)
            .await?;
    }
    if version % PRUNE_EVERY == 0 {
        sqlx::query("DELETE FROM data_plane_changes WHERE version <= $1")
            .bind(version - KEPT_VERSIONS)
            .execute(&mut **tx)
            .await?;
    }
    if backend == Backend::Postgres {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "NOTIFY {}",
            super::snapshot::CHANNEL
        )))
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// The changes made after version `from` up to `to`, in version order; `None` when the log
/// misses one of those versions (the caller rebuilds everything).
pub(crate) async fn since(db: &Db, from: i64, to: i64) -> Result<Option<Vec<Change>>> {
    let rows: Vec<(i64, String, String)> = sqlx::query_as(
        "SELECT version, kind, id FROM data_plane_changes
         WHERE version > $1 AND version <= $2 ORDER BY version",
    )
    .bind(from)
    .bind(to)
    .fetch_all(db.pool())
    .await?;
    let mut expected = from + 1;
    let mut changes = Vec::with_capacity(rows.len());
    for (version, kind, id) in rows {
        if version == expected {
            expected += 1;
        } else if version != expected - 1 {
            return Ok(None);
        }
        changes.push(Change::parse(&kind, id));
    }
    Ok((expected == to + 1).then_some(changes))
}

/// Drops the log's changes up to `version` (what pruning does; tests use it to make an
/// instance fall behind the log).
pub async fn prune_through(db: &Db, version: i64) -> Result<()> {
    sqlx::query("DELETE FROM data_plane_changes WHERE version <= $1")
        .bind(version)
        .execute(db.pool())
        .await?;
    Ok(())
}
