//! The access part of the data plane's snapshot: API keys by the SHA-256 of their raw value
//! (and a rotated key's previous value until its transition ends), active workspaces, and the
//! active rate and usage limits policies with the usage each usage policy's entities have
//! counted. Read by the data plane through [`plugin_sdk::AccessStore`]
//! ([`super::snapshot::Published`]), rebuilt with the rest of the snapshot.
//!
//! A row that cannot be read (malformed JSON in a column) is left out with an error in the log,
//! rather than failing the whole snapshot: a key left out is refused, which is the safe side.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use futures_util::TryStreamExt;
use plugin_sdk::access::{
    ApiKeyRecord, Condition, CountedUsage, Defaults, KeyKind, KeyStatus, RateLimit, RateLimitKind,
    RateLimitPolicy, RateUnit, UsageLimit, UsageLimitPolicy, WorkspaceRecord,
};
use plugin_sdk::FastState;
use sqlx::any::AnyRow;
use sqlx::Row;

use super::changes::Change;
use super::policies::{
    rate_from_row, usage_from_row, RateLimitsPolicy, RATE_COLUMNS, USAGE_COLUMNS,
};
use super::{from_text, usage};
use crate::db::Db;
use crate::error::{AdminError, Result};
use crate::time;
use crate::validate::{self, RateLimitType};

/// A persistent hash map: a clone shares its structure with the original, so a snapshot that
/// differs by one change costs the changed paths, not a copy of every entry.
pub type SharedMap<K, V> =
    imbl::hashmap::GenericHashMap<K, V, FastState, imbl::shared_ptr::DefaultSharedPtr>;

/// A persistent ordered map: denser than [`SharedMap`] (a quarter of its memory per entry) but
/// slower to search, so it holds what only writes look up.
type SharedOrdMap<K, V> = imbl::ordmap::GenericOrdMap<K, V, imbl::shared_ptr::DefaultSharedPtr>;

/// Keys, workspaces and policies as the data plane reads them. Immutable once published; a
/// change is applied to a clone ([`AccessData::apply`]).
#[derive(Debug, Default, Clone)]
pub struct AccessData {
    keys: SharedMap<[u8; 32], Arc<ApiKeyRecord>>,
    /// A rotated key's previous value, with the end of its transition.
    previous: SharedMap<[u8; 32], (Arc<ApiKeyRecord>, SystemTime)>,
    /// Each key's current digest by id, and a rotated key's previous one: what a change to the
    /// key replaces. The ids are the records' own.
    key_digests: SharedOrdMap<Arc<str>, [u8; 32]>,
    previous_digests: SharedOrdMap<Arc<str>, [u8; 32]>,
    interned: Interned,
    workspaces: SharedMap<String, Arc<WorkspaceRecord>>,
    rate_policies: Arc<[RateLimitPolicy]>,
    usage_policies: Arc<[UsageLimitPolicy]>,
}

impl AccessData {
    /// The key whose SHA-256 is `digest` at `now`: its current value, or its previous one
    /// before the rotation's transition ends. A key exhausted in a reset period that has
    /// elapsed since reads as active (its usage no longer counts).
    pub fn api_key(&self, digest: &[u8; 32], now: SystemTime) -> Option<Arc<ApiKeyRecord>> {
        self.api_key_with_digest(digest, now)
            .map(|(record, _)| record)
    }

    /// [`AccessData::api_key`], with the stored digest the record was found under (for the
    /// auth plugin's constant-time comparison).
    pub fn api_key_with_digest(
        &self,
        digest: &[u8; 32],
        now: SystemTime,
    ) -> Option<(Arc<ApiKeyRecord>, [u8; 32])> {
        let (stored, record) = match self.keys.get_key_value(digest) {
            Some(found) => found,
            None => match self.previous.get_key_value(digest) {
                Some((stored, (r, until))) if now < *until => (stored, r),
                _ => return None,
            },
        };
        let elapsed = record.status == KeyStatus::Exhausted
            && record
                .usage_limits
                .as_ref()
                .is_some_and(|l| l.period_at(now) > record.counted.period);
        if elapsed {
            let mut active = ApiKeyRecord::clone(record);
            active.status = KeyStatus::Active;
            return Some((Arc::new(active), *stored));
        }
        Some((record.clone(), *stored))
    }

    pub fn workspace(&self, id: &str) -> Option<Arc<WorkspaceRecord>> {
        self.workspaces.get(id).cloned()
    }

    pub fn rate_limit_policies(&self) -> Arc<[RateLimitPolicy]> {
        self.rate_policies.clone()
    }

    pub fn usage_limit_policies(&self) -> Arc<[UsageLimitPolicy]> {
        self.usage_policies.clone()
    }

    /// How many keys (current values), workspaces, and rate and usage policies it holds.
    pub fn counts(&self) -> (usize, usize, usize, usize) {
        (
            self.keys.len(),
            self.workspaces.len(),
            self.rate_policies.len(),
            self.usage_policies.len(),
        )
    }

    /// Puts a key read from its row in place of what the snapshot held under its id (`None`:
    /// the key is gone).
    fn put_key(&mut self, id: &str, row: Option<KeyRow>) {
        if let Some(current) = self.key_digests.remove(id) {
            self.keys.remove(&current);
        }
        if let Some(previous) = self.previous_digests.remove(id) {
            self.previous.remove(&previous);
        }
        let Some((record, hash, previous)) = row else {
            return;
        };
        let record = Arc::new(record);
        if let Some((digest, until)) = previous {
            self.previous_digests.insert(record.id.clone(), digest);
            self.previous.insert(digest, (record.clone(), until));
        }
        self.key_digests.insert(record.id.clone(), hash);
        self.keys.insert(hash, record);
    }

    /// A key's row read into a record, or `None` with an error in the log when it cannot be
    /// (the key is refused).
    fn readable_key(&mut self, r: &AnyRow) -> Option<KeyRow> {
        match key_from_row(r, &mut self.interned) {
            Ok(read) => Some(read),
            Err(e) => {
                let id: String = r.try_get("id").unwrap_or_default();
                tracing::error!(key = %id, error = %e, "API key left out of the data plane: its row cannot be read");
                None
            }
        }
    }

    /// Applies one change to the part it names by re-reading its rows; false for a change this
    /// part does not hold.
    pub(super) async fn apply(&mut self, db: &Db, change: &Change) -> Result<bool> {
        match change {
            Change::ApiKey(id) => {
                let row = sqlx::query(sqlx::AssertSqlSafe(format!(
                    "SELECT {KEY_COLUMNS} FROM api_keys WHERE id = $1"
                )))
                .bind(id)
                .fetch_optional(db.pool())
                .await?;
                let read = row.as_ref().and_then(|r| self.readable_key(r));
                self.put_key(id, read);
            }
            Change::Workspace(id) => match load_workspace(db, id).await? {
                Some(ws) => {
                    self.workspaces.insert(id.clone(), Arc::new(ws));
                }
                None => {
                    self.workspaces.remove(id);
                }
            },
            Change::RatePolicies => self.rate_policies = load_rate_policies(db).await?,
            Change::UsagePolicies => self.usage_policies = load_usage_policies(db).await?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Feeds what the snapshot serves into `digest`, in a stable order; without `usage`, the
    /// usage charges write behind the snapshot's back (counted usage, a key's `exhausted`
    /// status) are left out.
    pub(super) fn digest_into(&self, digest: &mut ring::digest::Context, usage: bool) {
        let key_line = |record: &ApiKeyRecord| {
            let mut r = record.clone();
            if !usage {
                r.counted = CountedUsage::default();
                if r.status == KeyStatus::Exhausted {
                    r.status = KeyStatus::Active;
                }
            }
            format!("{r:?}")
        };
        let mut keys: Vec<_> = self.keys.iter().collect();
        keys.sort_by(|a, b| a.0.cmp(b.0));
        for (hash, record) in keys {
            digest.update(b"key ");
            digest.update(hash);
            digest.update(key_line(record).as_bytes());
        }
        let mut previous: Vec<_> = self.previous.iter().collect();
        previous.sort_by(|a, b| a.0.cmp(b.0));
        for (hash, (record, until)) in previous {
            digest.update(b"previous ");
            digest.update(hash);
            digest.update(format!("{} {until:?}", record.id).as_bytes());
        }
        let mut workspaces: Vec<_> = self.workspaces.iter().collect();
        workspaces.sort_by(|a, b| a.0.cmp(b.0));
        for (_, ws) in workspaces {
            let mut ws = WorkspaceRecord::clone(ws);
            if !usage {
                ws.counted.clear();
            }
            digest.update(format!("workspace {ws:?}").as_bytes());
        }
        for p in self.rate_policies.iter() {
            digest.update(format!("rate policy {p:?}").as_bytes());
        }
        for p in self.usage_policies.iter() {
            let mut p = p.clone();
            if !usage {
                p.usage.clear();
            }
            digest.update(format!("usage policy {p:?}").as_bytes());
        }
    }
}

/// The columns of `api_keys` a key's record is read from.
const KEY_COLUMNS: &str = "id, organisation_id, workspace_id, user_id, type, status, expires_at,
    scopes, defaults, rate_limits, usage_limits, current_usage, usage_period, reset_epoch,
    key_hash, previous_key_hash, previous_key_expires_at";

/// Reads everything the access part holds.
pub(super) async fn load(db: &Db) -> Result<AccessData> {
    let mut data = AccessData::default();
    // Streamed: an organisation's keys are its largest table, and the rows need not all be
    // in memory at once beside the records made of them.
    let sql = format!("SELECT {KEY_COLUMNS} FROM api_keys");
    let mut rows = sqlx::query(sqlx::AssertSqlSafe(sql)).fetch(db.pool());
    while let Some(r) = rows.try_next().await? {
        if let Some(read) = data.readable_key(&r) {
            let id = read.0.id.clone();
            data.put_key(&id, Some(read));
        }
    }
    data.workspaces = load_workspaces(db, None).await?;
    data.rate_policies = load_rate_policies(db).await?;
    data.usage_policies = load_usage_policies(db).await?;
    Ok(data)
}

/// One active workspace, or `None` when it is gone, archived or unreadable.
async fn load_workspace(db: &Db, id: &str) -> Result<Option<WorkspaceRecord>> {
    Ok(load_workspaces(db, Some(id))
        .await?
        .get(id)
        .map(|ws| WorkspaceRecord::clone(ws)))
}

/// The active workspaces with their counted budgets: all, or only `only`.
async fn load_workspaces(
    db: &Db,
    only: Option<&str>,
) -> Result<SharedMap<String, Arc<WorkspaceRecord>>> {
    let filter = if only.is_some() {
        " WHERE workspace_id = $1"
    } else {
        ""
    };
    let sql = format!(
        "SELECT workspace_id, budget_index, current_usage, usage_period, reset_epoch
         FROM workspace_budget_usage{filter}"
    );
    let budgets = super::bind_some(sqlx::query(sqlx::AssertSqlSafe(sql)), only)
        .fetch_all(db.pool())
        .await?;
    let mut counted: HashMap<String, Vec<(usize, CountedUsage)>> = HashMap::new();
    for r in &budgets {
        let index: i64 = r.try_get("budget_index")?;
        counted
            .entry(r.try_get("workspace_id")?)
            .or_default()
            .push((usize::try_from(index).unwrap_or(usize::MAX), counted_of(r)?));
    }
    let filter = if only.is_some() { " AND id = $1" } else { "" };
    let sql = format!(
        "SELECT id, slug, organisation_id, defaults, rate_limits, usage_limits
         FROM workspaces WHERE status = 'active'{filter}"
    );
    let rows = super::bind_some(sqlx::query(sqlx::AssertSqlSafe(sql)), only)
        .fetch_all(db.pool())
        .await?;
    let mut workspaces = SharedMap::default();
    for r in &rows {
        let id: String = r.try_get("id")?;
        match workspace_from_row(r, counted.get(&id).map(Vec::as_slice).unwrap_or(&[])) {
            Ok(ws) => {
                workspaces.insert(id, Arc::new(ws));
            }
            Err(e) => {
                tracing::error!(workspace = %id, error = %e, "workspace left out of the data plane: its row cannot be read")
            }
        }
    }
    Ok(workspaces)
}

/// The active rate limits policies, oldest first.
async fn load_rate_policies(db: &Db) -> Result<Arc<[RateLimitPolicy]>> {
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {RATE_COLUMNS} FROM rate_limits_policies WHERE status = 'active'
         ORDER BY created_at, id"
    )))
    .fetch_all(db.pool())
    .await?;
    let mut rate = Vec::with_capacity(rows.len());
    for r in &rows {
        match rate_from_row(r).map(rate_policy) {
            Ok(p) => rate.push(p),
            Err(e) => {
                tracing::error!(error = %e, "a rate limits policy was left out of the data plane")
            }
        }
    }
    Ok(Arc::from(rate))
}

/// The active usage limits policies, oldest first, with their entities' counted usage.
async fn load_usage_policies(db: &Db) -> Result<Arc<[UsageLimitPolicy]>> {
    let entities = sqlx::query(
        "SELECT e.policy_id, e.value_key, e.current_usage, e.usage_period, e.reset_epoch
         FROM usage_limits_policy_entities e
         JOIN usage_limits_policies p ON p.id = e.policy_id
         WHERE p.status = 'active'",
    )
    .fetch_all(db.pool())
    .await?;
    let mut by_policy: HashMap<String, Vec<(String, CountedUsage)>> = HashMap::new();
    for r in &entities {
        by_policy
            .entry(r.try_get("policy_id")?)
            .or_default()
            .push((r.try_get("value_key")?, counted_of(r)?));
    }
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {USAGE_COLUMNS} FROM usage_limits_policies WHERE status = 'active'
         ORDER BY created_at, id"
    )))
    .fetch_all(db.pool())
    .await?;
    let mut usage_policies = Vec::with_capacity(rows.len());
    for r in &rows {
        let policy = match usage_from_row(r) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(error = %e, "a usage limits policy was left out of the data plane");
                continue;
            }
        };
        let usage = by_policy.remove(&policy.id).unwrap_or_default();
        usage_policies.push(UsageLimitPolicy {
            limit: usage::policy_limit(&policy),
            id: policy.id,
            organisation_id: policy.organisation_id,
            workspace_id: policy.workspace_id,
            name: policy.name,
            conditions: policy.conditions.into_iter().map(condition).collect(),
            group_by: policy.group_by.into_iter().map(|g| g.key).collect(),
            usage: usage.into_iter().collect(),
        });
    }
    Ok(Arc::from(usage_policies))
}

fn counted_of(r: &AnyRow) -> Result<CountedUsage> {
    Ok(CountedUsage {
        current_usage: r.try_get("current_usage")?,
        period: r.try_get("usage_period")?,
        reset_epoch: r.try_get("reset_epoch")?,
    })
}

/// The 32 bytes of a stored hex SHA-256.
fn digest_of(column: &str, hex: &str) -> Result<[u8; 32]> {
    let bad = || AdminError::internal(format!("{column} is not a hex SHA-256"));
    let bytes = hex.as_bytes();
    if bytes.len() != 64 {
        return Err(bad());
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        out[i] = (nibble(pair[0]).ok_or_else(bad)? << 4) | nibble(pair[1]).ok_or_else(bad)?;
    }
    Ok(out)
}

fn system_time(column: &str, text: &str) -> Result<SystemTime> {
    time::parse(text)
        .map(SystemTime::from)
        .ok_or_else(|| AdminError::internal(format!("{column} is not a time: {text:?}")))
}

type KeyRow = (ApiKeyRecord, [u8; 32], Option<([u8; 32], SystemTime)>);

/// Values that many keys repeat, each held once: organisation and workspace ids, scope lists,
/// and the empty defaults (what most keys have). Only grows (by the distinct values of the keys
/// read since the last full read: a few per workspace), so a value once seen is shared by every
/// later key that repeats it.
#[derive(Debug, Default, Clone)]
struct Interned {
    ids: SharedMap<Arc<str>, ()>,
    scopes: SharedMap<Arc<[String]>, ()>,
    no_defaults: Option<Arc<Defaults>>,
}

impl Interned {
    fn id(&mut self, id: String) -> Arc<str> {
        if let Some((held, ())) = self.ids.get_key_value(id.as_str()) {
            return held.clone();
        }
        let id: Arc<str> = Arc::from(id);
        self.ids.insert(id.clone(), ());
        id
    }

    fn scopes(&mut self, scopes: Vec<String>) -> Arc<[String]> {
        if let Some((held, ())) = self.scopes.get_key_value(scopes.as_slice()) {
            return held.clone();
        }
        let scopes: Arc<[String]> = Arc::from(scopes);
        self.scopes.insert(scopes.clone(), ());
        scopes
    }

    fn defaults(&mut self, defaults: Defaults) -> Arc<Defaults> {
        if defaults == Defaults::default() {
            return self.no_defaults.get_or_insert_with(Arc::default).clone();
        }
        Arc::new(defaults)
    }
}

fn key_from_row(r: &AnyRow, interned: &mut Interned) -> Result<KeyRow> {
    let kind: String = r.try_get("type")?;
    let kind = match kind.as_str() {
        "organisation-service" => KeyKind::OrganisationService,
        "workspace-service" => KeyKind::WorkspaceService,
        "workspace-user" => KeyKind::WorkspaceUser,
        _ => return Err(AdminError::internal(format!("api_keys.type {kind:?}"))),
    };
    let status: String = r.try_get("status")?;
    let status = match status.as_str() {
        "active" => KeyStatus::Active,
        "exhausted" => KeyStatus::Exhausted,
        "expired" => KeyStatus::Expired,
        _ => return Err(AdminError::internal(format!("api_keys.status {status:?}"))),
    };
    let expires_at: Option<String> = r.try_get("expires_at")?;
    let usage_limits: Option<String> = r.try_get("usage_limits")?;
    let usage_limits: Option<validate::UsageLimits> = usage_limits
        .map(|t| from_text("api_keys.usage_limits", &t))
        .transpose()?;
    let rate_limits: Vec<validate::RateLimit> = from_text(
        "api_keys.rate_limits",
        &r.try_get::<String, _>("rate_limits")?,
    )?;
    let defaults: Defaults = from_text("api_keys.defaults", &r.try_get::<String, _>("defaults")?)?;
    let workspace_id: Option<String> = r.try_get("workspace_id")?;
    let user_id: Option<String> = r.try_get("user_id")?;
    let record = ApiKeyRecord {
        id: Arc::from(r.try_get::<String, _>("id")?),
        organisation_id: interned.id(r.try_get("organisation_id")?),
        workspace_id: workspace_id.map(|ws| interned.id(ws)),
        user_id: user_id.map(Arc::from),
        kind,
        status,
        expires_at: expires_at
            .map(|t| system_time("api_keys.expires_at", &t))
            .transpose()?,
        scopes: interned.scopes(from_text(
            "api_keys.scopes",
            &r.try_get::<String, _>("scopes")?,
        )?),
        defaults: interned.defaults(defaults),
        rate_limits: rate_limits.iter().map(rate_limit).collect(),
        usage_limits: usage_limits.as_ref().map(usage::sdk_limit),
        counted: counted_of(r)?,
    };
    let hash = digest_of("api_keys.key_hash", &r.try_get::<String, _>("key_hash")?)?;
    let previous_hash: Option<String> = r.try_get("previous_key_hash")?;
    let previous_until: Option<String> = r.try_get("previous_key_expires_at")?;
    let previous = match (previous_hash, previous_until) {
        (Some(h), Some(t)) => Some((
            digest_of("api_keys.previous_key_hash", &h)?,
            system_time("api_keys.previous_key_expires_at", &t)?,
        )),
        _ => None,
    };
    Ok((record, hash, previous))
}

fn workspace_from_row(r: &AnyRow, counted: &[(usize, CountedUsage)]) -> Result<WorkspaceRecord> {
    let limits: Vec<validate::UsageLimits> = from_text(
        "workspaces.usage_limits",
        &r.try_get::<String, _>("usage_limits")?,
    )?;
    let rate_limits: Vec<validate::RateLimit> = from_text(
        "workspaces.rate_limits",
        &r.try_get::<String, _>("rate_limits")?,
    )?;
    let mut usage = vec![CountedUsage::default(); limits.len()];
    for (index, c) in counted {
        if let Some(slot) = usage.get_mut(*index) {
            *slot = *c;
        }
    }
    Ok(WorkspaceRecord {
        id: r.try_get("id")?,
        slug: r.try_get("slug")?,
        organisation_id: r.try_get("organisation_id")?,
        defaults: from_text("workspaces.defaults", &r.try_get::<String, _>("defaults")?)?,
        rate_limits: rate_limits.iter().map(rate_limit).collect(),
        usage_limits: limits
            .iter()
            .map(usage::sdk_limit)
            .collect::<Vec<UsageLimit>>(),
        counted: usage,
    })
}

fn rate_kind(k: RateLimitType) -> RateLimitKind {
    match k {
        RateLimitType::Requests => RateLimitKind::Requests,
        RateLimitType::Tokens => RateLimitKind::Tokens,
    }
}

fn rate_unit(u: validate::RateUnit) -> RateUnit {
    match u {
        validate::RateUnit::Rpm => RateUnit::Rpm,
        validate::RateUnit::Rph => RateUnit::Rph,
        validate::RateUnit::Rpd => RateUnit::Rpd,
    }
}

fn rate_limit(l: &validate::RateLimit) -> RateLimit {
    RateLimit {
        kind: rate_kind(l.kind),
        unit: rate_unit(l.unit),
        value: l.value as f64,
    }
}

fn condition(c: super::policies::Condition) -> Condition {
    Condition {
        key: c.key,
        value: c.value,
        excludes: c.excludes,
    }
}

fn rate_policy(p: RateLimitsPolicy) -> RateLimitPolicy {
    RateLimitPolicy {
        limit: RateLimit {
            kind: rate_kind(p.kind),
            unit: rate_unit(p.unit),
            value: p.value as f64,
        },
        id: p.id,
        organisation_id: p.organisation_id,
        workspace_id: p.workspace_id,
        name: p.name,
        conditions: p.conditions.into_iter().map(condition).collect(),
        group_by: p.group_by.into_iter().map(|g| g.key).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn stored_hashes_read_as_digests() {
        let hex = crate::keys::hash("abc");
        let digest = digest_of("c", &hex).unwrap();
        assert_eq!(
            digest.as_slice(),
            ring::digest::digest(&ring::digest::SHA256, b"abc").as_ref()
        );
        assert!(digest_of("c", "abc").is_err());
        assert!(digest_of("c", &"zz".repeat(32)).is_err());
    }

    fn record(status: KeyStatus, period: i64) -> ApiKeyRecord {
        ApiKeyRecord {
            id: "k".into(),
            organisation_id: "o".into(),
            workspace_id: None,
            user_id: None,
            kind: KeyKind::OrganisationService,
            status,
            expires_at: None,
            scopes: Arc::from([]),
            defaults: Arc::default(),
            rate_limits: vec![],
            usage_limits: Some(UsageLimit {
                credit_limit: 1.0,
                kind: plugin_sdk::access::UsageKind::Cost,
                alert_threshold: None,
                periodic_reset: None,
                periodic_reset_days: Some(1),
                next_usage_reset_at: None,
            }),
            counted: CountedUsage {
                current_usage: 1.0,
                period,
                reset_epoch: 0,
            },
        }
    }

    #[test]
    fn lookups_by_current_and_previous_digest() {
        let now = SystemTime::now();
        let today = record(KeyStatus::Exhausted, 0)
            .usage_limits
            .unwrap()
            .period_at(now);
        let mut data = AccessData::default();
        let current = Arc::new(record(KeyStatus::Exhausted, today));
        data.keys.insert([1; 32], current.clone());
        data.previous
            .insert([2; 32], (current.clone(), now + Duration::from_secs(60)));
        data.previous
            .insert([3; 32], (current, now - Duration::from_secs(1)));
        assert_eq!(
            data.api_key(&[1; 32], now).unwrap().status,
            KeyStatus::Exhausted
        );
        assert!(data.api_key(&[2; 32], now).is_some(), "in its transition");
        assert_eq!(data.api_key_with_digest(&[2; 32], now).unwrap().1, [2; 32]);
        assert!(
            data.api_key(&[3; 32], now).is_none(),
            "after its transition"
        );
        assert!(data.api_key(&[4; 32], now).is_none());
        // Exhausted yesterday: active today.
        data.keys
            .insert([5; 32], Arc::new(record(KeyStatus::Exhausted, today - 1)));
        assert_eq!(
            data.api_key(&[5; 32], now).unwrap().status,
            KeyStatus::Active
        );
    }
}
