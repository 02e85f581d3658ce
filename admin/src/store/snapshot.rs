//! What the data plane reads from the control plane — saved providers (with their decrypted
//! secrets), saved configs, and the access data of enforcement (API keys, workspaces, active
//! rate and usage limits policies: [`super::access`]) — published as an immutable
//! [`Snapshot`] behind an `ArcSwap`.
//!
//! - Every change the data plane reads bumps `data_plane_version` in its own transaction
//!   ([`changed`]) and, with PostgreSQL, sends `NOTIFY gw_data_plane` (delivered on commit).
//! - After the commit, the instance that made the change rebuilds its snapshot at once
//!   ([`Store::refresh_data_plane`]): its data plane sees the change on the next request.
//! - Other instances learn of it from the notification ([`watch`] listens with `PgListener`),
//!   or, as a fallback and for SQLite, by polling the version (every second by default).
//! - A request reads the current snapshot: a pointer load and a hash lookup, no query.
//!
//! Each rebuild reads everything (providers joined with their integrations and the
//! integrations' priced models, configs with their current version, keys, workspaces,
//! policies): simple, and fast enough for the thousands of rows a control plane holds.
//!
//! A provider is served while it is `active` or `exhausted` (not `expired`, nor past its
//! `expires_at`), with its own rate limits, budget and counted usage: the data plane's
//! `usage_limit` plugin refuses an exhausted one with a 412 from its counters (seeded with the
//! counted usage), and lets it through again once a new reset period starts or its credit
//! limit is raised, as it does for API keys.
//!
//! Usage the data plane charges ([`Store::apply_usage_charges`]) does not bump the version: the
//! data plane's own counters are the live truth, and the counted usage in a snapshot only seeds
//! them. A rebuild for any other reason picks the stored usage up.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use plugin_sdk::access::{
    Budget, CountedUsage, RateLimit, SavedGuardrail, ScopedRateLimit, UsageLimit,
};
use plugin_sdk::store::{ConfigStore, IntegrationLimits, Owner, ProviderStore, SavedConfig};
use plugin_sdk::ProviderRecord;
use serde_json::Value;
use sqlx::any::AnyRow;
use sqlx::Row;

use super::access::SharedMap;
use super::changes::Change;
use super::integrations::GlobalLimits;
use super::Store;
use crate::crypto::{self, Cipher, SecretKey};
use crate::db::{Backend, Db, Tx};
use crate::error::{AdminError, Result};
use crate::time::{self, Timestamp};
use crate::validate::UsageLimits;

/// The PostgreSQL notification channel of data-plane changes.
pub const CHANNEL: &str = "gw_data_plane";

/// How often instances compare their snapshot with the database's version by default.
pub const DEFAULT_REFRESH_INTERVAL: Duration = Duration::from_secs(1);

/// How often instances compare their whole snapshot with the database by default
/// ([`Store::check_data_plane`]).
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(600);

/// Checks a config body before it is saved (the gateway hands in its routing-config
/// validator; without one, any JSON object is accepted). The error names the problem.
#[derive(Clone)]
pub struct ConfigCheck(pub Arc<CheckFn>);

/// The function behind a [`ConfigCheck`]: the problem, if the config is refused.
pub type CheckFn = dyn Fn(&Value) -> std::result::Result<(), String> + Send + Sync;

impl ConfigCheck {
    pub fn new(
        check: impl Fn(&Value) -> std::result::Result<(), String> + Send + Sync + 'static,
    ) -> ConfigCheck {
        ConfigCheck(Arc::new(check))
    }
}

impl std::fmt::Debug for ConfigCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConfigCheck")
    }
}

/// How the store reaches the data plane's secrets and checks.
#[derive(Clone, Default)]
pub struct DataPlaneOptions {
    /// The key of stored secrets. `None`: a SQLite file database keeps a generated one in
    /// `<file>.key`; an in-memory one uses a random key; a PostgreSQL one has none (storing or
    /// reading a secret then fails, and [`crate::ControlPlane::start`] refuses to start).
    pub secret_key: Option<SecretKey>,
    pub config_check: Option<ConfigCheck>,
    /// Checks a saved guardrail's hook (`{type, checks, deny, async, ...}`) with the data
    /// plane's hook validator; without one, only its shape is checked.
    pub guardrail_check: Option<ConfigCheck>,
}

impl std::fmt::Debug for DataPlaneOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataPlaneOptions")
            .field("secret_key", &self.secret_key)
            .field("config_check", &self.config_check.is_some())
            .field("guardrail_check", &self.guardrail_check.is_some())
            .finish()
    }
}

/// One saved provider as the data plane uses it.
#[derive(Debug, Clone)]
struct Entry {
    record: Arc<ProviderRecord>,
    expires_at: Option<Timestamp>,
    /// The integration it uses: a change to the integration re-reads it.
    integration: String,
}

/// The data plane's view of the control plane at one version. Immutable once published; the
/// next version is a clone with the changes applied, sharing what they did not touch.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    /// The `data_plane_version` it was built at; -1 before the first build.
    pub version: i64,
    providers: SharedMap<String, Entry>,
    /// By slug and by id, with the workspace that owns each.
    configs: SharedMap<String, SavedConfig>,
    /// Each config's slug by id: what a change to the config replaces.
    config_slugs: SharedMap<String, String>,
    /// Saved guardrails by slug and by id, their secrets opened.
    guardrails: SharedMap<String, Arc<SavedGuardrail>>,
    /// Keys, workspaces and policies.
    access: super::access::AccessData,
}

impl Snapshot {
    fn empty() -> Snapshot {
        Snapshot {
            version: -1,
            ..Snapshot::default()
        }
    }

    /// A SHA-256 (hex) of everything the snapshot serves, in a stable order: two snapshots with
    /// the same digest serve the same. Without `usage`, what usage charges write without a new
    /// version (counted usage, a key's `exhausted` status) is left out.
    pub fn digest(&self, usage: bool) -> String {
        let mut d = ring::digest::Context::new(&ring::digest::SHA256);
        let mut providers: Vec<_> = self.providers.iter().collect();
        providers.sort_by(|a, b| a.0.cmp(b.0));
        for (slug, e) in providers {
            let mut record = ProviderRecord::clone(&e.record);
            if !usage {
                record.counted = CountedUsage::default();
                if let Some(limits) = &mut record.integration_limits {
                    for b in &mut Arc::make_mut(limits).budgets {
                        b.counted = CountedUsage::default();
                    }
                }
            }
            // The record's Debug leaves its key and settings out; the digest needs them.
            d.update(
                format!(
                    "provider {slug} {} {:?} {record:?} {:?}",
                    e.integration, e.expires_at, record.settings
                )
                .as_bytes(),
            );
            d.update(record.api_key.as_deref().unwrap_or("-").as_bytes());
        }
        let mut configs: Vec<_> = self.configs.iter().collect();
        configs.sort_by(|a, b| a.0.cmp(b.0));
        for (name, c) in configs {
            d.update(format!("config {name} {:?} {}", c.owner, c.body).as_bytes());
        }
        let mut guardrails: Vec<_> = self.guardrails.iter().collect();
        guardrails.sort_by(|a, b| a.0.cmp(b.0));
        for (name, g) in guardrails {
            d.update(format!("guardrail {name} {} {:?} {}", g.id, g.owner, g.hook).as_bytes());
        }
        self.access.digest_into(&mut d, usage);
        d.finish()
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    pub fn provider(&self, slug: &str) -> Option<Arc<ProviderRecord>> {
        let entry = self.providers.get(slug)?;
        if entry.expires_at.is_some_and(|t| t <= time::now()) {
            return None;
        }
        Some(entry.record.clone())
    }

    pub fn config(&self, id_or_slug: &str) -> Option<Arc<Value>> {
        self.configs.get(id_or_slug).map(|c| c.body.clone())
    }

    /// A config with the workspace that owns it.
    pub fn saved_config(&self, id_or_slug: &str) -> Option<SavedConfig> {
        self.configs.get(id_or_slug).cloned()
    }

    pub fn provider_count(&self) -> usize {
        self.providers.len()
    }

    /// The keys, workspaces and policies of this snapshot.
    pub fn access(&self) -> &super::access::AccessData {
        &self.access
    }
}

/// The published snapshot: cheap to clone, read without locks. It implements the plugin SDK's
/// [`ProviderStore`], [`ConfigStore`] and [`plugin_sdk::AccessStore`], which is how the gateway
/// and its plugins read it.
#[derive(Clone)]
pub struct Published(Arc<ArcSwap<Snapshot>>, Arc<RefreshStats>);

/// How an instance has kept its snapshot current since it started: counters the gateway
/// exports as metrics, and tests read to see which path ran.
#[derive(Debug, Default)]
pub struct RefreshStats {
    /// Refreshes that applied the changes of the log to the snapshot.
    pub applied: AtomicU64,
    /// Refreshes (and checks) that read every row again.
    pub rebuilt: AtomicU64,
    /// Consistency checks that found the snapshot different from the database.
    pub differed: AtomicU64,
}

impl Default for Published {
    fn default() -> Self {
        Published(
            Arc::new(ArcSwap::from_pointee(Snapshot::empty())),
            Arc::default(),
        )
    }
}

impl std::fmt::Debug for Published {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Published(version {})", self.0.load().version)
    }
}

impl Published {
    /// The current snapshot.
    pub fn current(&self) -> Arc<Snapshot> {
        self.0.load_full()
    }

    pub fn version(&self) -> i64 {
        self.0.load().version
    }

    pub fn stats(&self) -> &RefreshStats {
        &self.1
    }

    fn publish(&self, snapshot: Snapshot, how: &AtomicU64) {
        self.0.store(Arc::new(snapshot));
        how.fetch_add(1, Ordering::Relaxed);
    }
}

impl ProviderStore for Published {
    fn provider(&self, slug: &str) -> Option<Arc<ProviderRecord>> {
        self.0.load().provider(slug)
    }
}

impl ConfigStore for Published {
    fn config(&self, id_or_slug: &str) -> Option<Arc<Value>> {
        self.0.load().config(id_or_slug)
    }
    fn saved_config(&self, id_or_slug: &str) -> Option<SavedConfig> {
        self.0.load().saved_config(id_or_slug)
    }
}

/// What the auth, rate limit and usage limit plugins read: a pointer load and a hash lookup.
impl plugin_sdk::AccessStore for Published {
    fn api_key(&self, digest: &[u8; 32]) -> Option<Arc<plugin_sdk::access::ApiKeyRecord>> {
        self.0
            .load()
            .access
            .api_key(digest, std::time::SystemTime::now())
    }
    fn api_key_with_digest(
        &self,
        digest: &[u8; 32],
    ) -> Option<(Arc<plugin_sdk::access::ApiKeyRecord>, [u8; 32])> {
        self.0
            .load()
            .access
            .api_key_with_digest(digest, std::time::SystemTime::now())
    }
    fn workspace(&self, id: &str) -> Option<Arc<plugin_sdk::access::WorkspaceRecord>> {
        self.0.load().access.workspace(id)
    }
    fn rate_limit_policies(&self) -> Arc<[plugin_sdk::access::RateLimitPolicy]> {
        self.0.load().access.rate_limit_policies()
    }
    fn usage_limit_policies(&self) -> Arc<[plugin_sdk::access::UsageLimitPolicy]> {
        self.0.load().access.usage_limit_policies()
    }
    fn version(&self) -> i64 {
        self.0.load().version
    }
    fn guardrail(&self, id_or_slug: &str) -> Option<Arc<SavedGuardrail>> {
        self.0.load().guardrails.get(id_or_slug).cloned()
    }
}

/// The store's link to the data plane: the secret key, the config check, the published
/// snapshot, and a lock that lets one rebuild run at a time (so an older one never replaces a
/// newer one).
pub struct DataPlane {
    key: Option<SecretKey>,
    cipher: Option<Cipher>,
    config_check: Option<ConfigCheck>,
    guardrail_check: Option<ConfigCheck>,
    published: Published,
    rebuild: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for DataPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataPlane")
            .field("cipher", &self.cipher.is_some())
            .field("published", &self.published)
            .finish()
    }
}

/// The value stored in `secret_key_check`, encrypted.
const CHECK_PLAINTEXT: &str = "gw-secret-key-check";
const CHECK_CONTEXT: &str = "secret_key_check";

/// The file of a SQLite URL, `None` for an in-memory database.
fn sqlite_file(url: &str) -> Option<PathBuf> {
    if url.contains(":memory:") || url.contains("mode=memory") {
        return None;
    }
    let path = url
        .trim_start_matches("sqlite://")
        .trim_start_matches("sqlite:");
    let path = path.split('?').next().unwrap_or_default();
    (!path.is_empty()).then(|| PathBuf::from(path))
}

/// The key to use for a database when none is given.
fn default_key(db: &Db, url: &str) -> Result<Option<SecretKey>> {
    Ok(match db.backend() {
        Backend::Postgres => None,
        Backend::Sqlite => match sqlite_file(url) {
            Some(file) => Some(crypto::load_or_create_key_file(&crypto::key_file_of(
                &file,
            ))?),
            // The database ends with the process: so may the key.
            None => Some(SecretKey::generate()),
        },
    })
}

/// Refuses a key other than the one the stored secrets were encrypted with.
async fn verify_key(db: &Db, cipher: &Cipher) -> Result<()> {
    let stored: Option<String> =
        sqlx::query_scalar("SELECT value FROM secret_key_check WHERE id = 1")
            .fetch_optional(db.pool())
            .await?;
    match stored {
        Some(v) if cipher.decrypt(&v, CHECK_CONTEXT).is_err() => {
            Err(AdminError::internal(format!(
                "the secret key is not the one this database's provider secrets were encrypted \
             with: set {} to that key",
                crypto::SECRET_KEY_VAR
            )))
        }
        _ => Ok(()),
    }
}

impl Store {
    /// Opens the database, applies its migrations, sets up the data plane's key and checks,
    /// and builds the first snapshot.
    pub async fn open_with(database_url: &str, options: DataPlaneOptions) -> Result<Store> {
        let db = Db::connect(database_url).await?;
        db.migrate().await?;
        let key = match options.secret_key.clone() {
            Some(k) => Some(k),
            None => default_key(&db, database_url)?,
        };
        Store::build(db, key, options).await
    }

    /// The same database with other data-plane options (a new snapshot is built); without a
    /// secret key in `options`, the store's key is kept.
    pub async fn with_data_plane(self, options: DataPlaneOptions) -> Result<Store> {
        let key = options
            .secret_key
            .clone()
            .or_else(|| self.data_plane.key.clone());
        Store::build(self.db, key, options).await
    }

    async fn build(db: Db, key: Option<SecretKey>, options: DataPlaneOptions) -> Result<Store> {
        let cipher = key.as_ref().map(Cipher::new);
        if let Some(c) = &cipher {
            verify_key(&db, c).await?;
        }
        let store = Store {
            db,
            data_plane: Arc::new(DataPlane {
                key,
                cipher,
                config_check: options.config_check,
                guardrail_check: options.guardrail_check,
                published: Published::default(),
                rebuild: tokio::sync::Mutex::new(()),
            }),
        };
        store.seal_legacy_config_secrets().await?;
        store.refresh_data_plane().await?;
        Ok(store)
    }

    /// The snapshot the data plane reads, kept current by this store.
    pub fn published(&self) -> Published {
        self.data_plane.published.clone()
    }

    /// True when the store can encrypt and decrypt secrets.
    pub fn has_secret_key(&self) -> bool {
        self.data_plane.cipher.is_some()
    }

    /// The cipher, or a 500 saying how to configure one.
    pub(crate) fn cipher(&self) -> Result<&Cipher> {
        self.data_plane.cipher.as_ref().ok_or_else(|| {
            AdminError::internal(format!(
                "provider secrets cannot be stored or read: {} is not set",
                crypto::SECRET_KEY_VAR
            ))
        })
    }

    /// Checks a config body with the data plane's validator, if one was given.
    pub(crate) fn check_config(&self, config: &Value) -> std::result::Result<(), String> {
        match &self.data_plane.config_check {
            Some(check) => (check.0)(config),
            None => Ok(()),
        }
    }

    /// Checks a saved guardrail's hook: its shape here, then the data plane's validator if one
    /// was given. The problem names the field (`checks[0].parameters.rule: ...`).
    pub(crate) fn check_guardrail(&self, hook: &Value) -> std::result::Result<(), String> {
        let checks = hook.get("checks").and_then(Value::as_array);
        match checks {
            None => return Err("checks: must be a list of checks".into()),
            Some(list) if list.is_empty() => {
                return Err("checks: a guardrail needs at least one check".into())
            }
            Some(list) => {
                for (i, check) in list.iter().enumerate() {
                    if !check.get("id").is_some_and(Value::is_string) {
                        return Err(format!(
                            "checks[{i}].id: every check needs an id (a string)"
                        ));
                    }
                }
            }
        }
        match &self.data_plane.guardrail_check {
            Some(check) => (check.0)(hook),
            None => Ok(()),
        }
    }

    /// Records, in a transaction storing a secret, which key encrypts them (once).
    pub(crate) async fn record_secret_key(&self, tx: &mut Tx) -> Result<()> {
        let value = self.cipher()?.encrypt(CHECK_PLAINTEXT, CHECK_CONTEXT);
        sqlx::query(
            "INSERT INTO secret_key_check (id, value) VALUES (1, $1) ON CONFLICT (id) DO NOTHING",
        )
        .bind(value)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    /// Records, in a write's transaction, what it changed of what the data plane reads
    /// ([`super::changes`]).
    pub(crate) async fn data_plane_changed(&self, tx: &mut Tx, changes: &[Change]) -> Result<()> {
        super::changes::record(tx, self.db.backend(), changes).await
    }

    /// After a committed change: rebuilds this instance's snapshot at once. A failure is
    /// logged, not returned (the change is made; the watcher retries within a second).
    pub(crate) async fn after_data_plane_change(&self) {
        if let Err(e) = self.refresh_data_plane().await {
            tracing::warn!(error = %e, "could not rebuild the data plane's snapshot; retrying shortly");
        }
    }

    /// Brings the snapshot to the database's version: the changes since the published
    /// version are applied to a copy of it, or, when the change log misses one of them (or says
    /// so), every row is read again. Returns what it did.
    pub async fn refresh_data_plane(&self) -> Result<Refresh> {
        let _one_at_a_time = self.data_plane.rebuild.lock().await;
        let version = self.data_plane_version().await?;
        let current = self.data_plane.published.current();
        if version == current.version {
            return Ok(Refresh::Current);
        }
        let changes = if current.version < 0 || version < current.version {
            None
        } else {
            super::changes::since(&self.db, current.version, version).await?
        };
        let incremental = changes.filter(|c| !c.contains(&Change::Everything));
        let (snapshot, refresh) = match incremental {
            Some(mut changes) => {
                changes.sort();
                changes.dedup();
                let mut next = Snapshot::clone(&current);
                next.version = version;
                for change in &changes {
                    self.apply(&mut next, change).await?;
                }
                (next, Refresh::Applied(changes.len()))
            }
            None => (self.build_snapshot(version).await?, Refresh::Rebuilt),
        };
        let (keys, workspaces, rate_policies, usage_policies) = snapshot.access.counts();
        tracing::debug!(
            version,
            ?refresh,
            providers = snapshot.providers.len(),
            configs = snapshot.configs.len(),
            keys,
            workspaces,
            rate_policies,
            usage_policies,
            "data plane snapshot published"
        );
        let published = &self.data_plane.published;
        let how = match refresh {
            Refresh::Rebuilt => &published.1.rebuilt,
            _ => &published.1.applied,
        };
        published.publish(snapshot, how);
        Ok(refresh)
    }

    async fn data_plane_version(&self) -> Result<i64> {
        Ok(
            sqlx::query_scalar("SELECT version FROM data_plane_version WHERE id = 1")
                .fetch_one(self.db.pool())
                .await?,
        )
    }

    /// The periodic consistency check: reads every row again and compares what that snapshot
    /// serves with the published one (leaving out the usage charges write behind its back). A
    /// difference is a defect of the incremental path: it is logged as an error, and the
    /// rebuilt snapshot replaces the published one either way (which also refreshes the counted
    /// usage that seeds the data plane's counters).
    pub async fn check_data_plane(&self) -> Result<Check> {
        let version = self.data_plane_version().await?;
        let rebuilt = self.build_snapshot(version).await?;
        let _one_at_a_time = self.data_plane.rebuild.lock().await;
        let current = self.data_plane.published.current();
        // A change committed while the rows were read: its rows may be in the rebuild, not in
        // the published snapshot. Check again next time.
        if current.version != version || self.data_plane_version().await? != version {
            return Ok(Check::Moved);
        }
        let check = if current.digest(false) == rebuilt.digest(false) {
            Check::Same
        } else {
            tracing::error!(
                version,
                "the data plane's snapshot differed from the database; replaced by a full rebuild"
            );
            self.data_plane
                .published
                .1
                .differed
                .fetch_add(1, Ordering::Relaxed);
            Check::Differed
        };
        let published = &self.data_plane.published;
        published.publish(rebuilt, &published.1.rebuilt);
        Ok(check)
    }

    /// A snapshot read from every row at `version` (tests compare it with the published one).
    pub async fn rebuilt_snapshot(&self) -> Result<Snapshot> {
        let version = self.data_plane_version().await?;
        self.build_snapshot(version).await
    }

    /// Applies one change to `snapshot` by re-reading the rows it names.
    async fn apply(&self, snapshot: &mut Snapshot, change: &Change) -> Result<()> {
        match change {
            Change::Provider(slug) => {
                snapshot.providers.remove(slug);
                for (slug, entry) in self.load_providers(Only::Provider(slug)).await? {
                    snapshot.providers.insert(slug, entry);
                }
            }
            Change::Integration(id) => {
                let using: Vec<String> = snapshot
                    .providers
                    .iter()
                    .filter(|(_, e)| e.integration == *id)
                    .map(|(slug, _)| slug.clone())
                    .collect();
                for slug in using {
                    snapshot.providers.remove(&slug);
                }
                for (slug, entry) in self.load_providers(Only::Integration(id)).await? {
                    snapshot.providers.insert(slug, entry);
                }
            }
            Change::Config(id) => {
                let old = snapshot.configs.remove(id);
                if let Some(slug) = snapshot.config_slugs.remove(id) {
                    // Unless another config took the slug since.
                    let same = |c: &SavedConfig| {
                        old.as_ref().is_some_and(|o| Arc::ptr_eq(&o.body, &c.body))
                    };
                    if snapshot.configs.get(&slug).is_some_and(same) {
                        snapshot.configs.remove(&slug);
                    }
                }
                self.load_configs(snapshot, Some(id)).await?;
            }
            Change::Guardrail(id) => {
                if let Some(old) = snapshot.guardrails.remove(id) {
                    // Unless another guardrail took the slug since.
                    if snapshot
                        .guardrails
                        .get(&old.slug)
                        .is_some_and(|g| g.id == *id)
                    {
                        snapshot.guardrails.remove(&old.slug);
                    }
                }
                self.load_guardrails(snapshot, Some(id)).await?;
            }
            other => {
                snapshot.access.apply(&self.db, other).await?;
            }
        }
        Ok(())
    }

    async fn build_snapshot(&self, version: i64) -> Result<Snapshot> {
        let mut snapshot = Snapshot {
            version,
            ..Snapshot::default()
        };
        for (slug, entry) in self.load_providers(Only::All).await? {
            snapshot.providers.insert(slug, entry);
        }
        self.load_configs(&mut snapshot, None).await?;
        self.load_guardrails(&mut snapshot, None).await?;
        snapshot.access = super::access::load(&self.db).await?;
        Ok(snapshot)
    }

    /// The providers served: all, one by slug, or those of one integration.
    async fn load_providers(&self, only: Only<'_>) -> Result<Vec<(String, Entry)>> {
        let (filter, value) = match only {
            Only::All => ("", None),
            Only::Provider(slug) => (" AND p.slug = $1", Some(slug)),
            Only::Integration(id) => (" AND i.id = $1", Some(id)),
        };
        let sql = format!(
            "SELECT p.slug, p.expires_at, p.usage_limits, p.rate_limits, p.current_usage,
                    p.usage_period, p.reset_epoch, p.organisation_id, p.workspace_id,
                    i.id AS integration_id, i.ai_provider_id, i.key_secret,
                    i.settings, i.secret_settings, i.workspace_id AS integration_workspace_id,
                    i.global_workspace_access, i.global_limits,
                    iw.usage_limits AS workspace_usage_limits,
                    iw.rate_limits AS workspace_rate_limits
             FROM providers p JOIN integrations i ON i.id = p.integration_id
             LEFT JOIN integration_workspaces iw
                 ON iw.integration_id = i.id AND iw.workspace_id = p.workspace_id
             WHERE p.status IN ('active', 'exhausted') AND i.status = 'active' AND (
                 i.workspace_id = p.workspace_id
                 OR (i.workspace_id IS NULL AND (
                     i.global_workspace_access = 1
                     OR EXISTS (SELECT 1 FROM integration_workspaces w
                                WHERE w.integration_id = i.id AND w.workspace_id = p.workspace_id)))){filter}"
        );
        let rows = super::bind_some(sqlx::query(sqlx::AssertSqlSafe(sql)), value)
            .fetch_all(self.db.pool())
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        if rows.is_empty() {
            return Ok(out);
        }
        // Secrets of an integration are decrypted once, however many providers use it.
        let mut secrets: HashMap<String, Option<Secrets>> = HashMap::new();
        // The priced models of each integration, which price requests through its providers.
        // Only the integrations these rows use, unless every provider is read.
        let only_integration: Option<String> = match only {
            Only::All => None,
            Only::Integration(id) => Some(id.to_owned()),
            Only::Provider(_) => Some(rows[0].try_get("integration_id")?),
        };
        let model_prices =
            super::integration_models::model_prices(&self.db, only_integration.as_deref()).await?;
        let integration_usage = integration_usage(&self.db, only_integration.as_deref()).await?;
        for r in &rows {
            let slug: String = r.try_get("slug")?;
            let integration: String = r.try_get("integration_id")?;
            let expires_at: Option<String> = r.try_get("expires_at")?;
            // A provider whose limits cannot be read is left out (refused), not served unlimited.
            let (limits, integration_limits) = match provider_limits(r)
                .and_then(|own| Ok((own, integration_limits(r, &integration_usage)?)))
            {
                Ok(limits) => limits,
                Err(e) => {
                    tracing::error!(provider = %slug, error = %e, "provider left out of the data plane: its limits cannot be read");
                    continue;
                }
            };
            if !secrets.contains_key(&integration) {
                let opened = self.open_secrets(
                    &integration,
                    r.try_get("key_secret")?,
                    r.try_get("secret_settings")?,
                );
                let opened = match opened {
                    Ok(s) => Some(s),
                    Err(e) => {
                        tracing::error!(integration = %integration, error = %e, "integration left out of the data plane: its secrets cannot be read");
                        None
                    }
                };
                secrets.insert(integration.clone(), opened);
            }
            let Some(Some(opened)) = secrets.get(&integration) else {
                continue;
            };
            let stored: Value = super::from_text(
                "integrations.settings",
                &r.try_get::<String, _>("settings")?,
            )?;
            let mut settings = BTreeMap::new();
            let mut custom_host = None;
            for (k, v) in stored.as_object().into_iter().flatten() {
                let text = match v {
                    Value::String(s) => s.clone(),
                    Value::Null => continue,
                    other => other.to_string(),
                };
                if k == "custom_host" {
                    custom_host = Some(text);
                } else {
                    settings.insert(k.clone(), text);
                }
            }
            for (k, v) in &opened.settings {
                settings.insert(k.clone(), v.clone());
            }
            let record = ProviderRecord {
                slug: slug.clone(),
                provider: r.try_get("ai_provider_id")?,
                api_key: opened.key.clone(),
                custom_host,
                settings,
                rate_limits: limits.rate_limits,
                usage_limits: limits.usage_limits,
                counted: limits.counted,
                model_prices: model_prices.get(&integration).cloned().unwrap_or_default(),
                owner: Some(Owner {
                    organisation_id: r.try_get("organisation_id")?,
                    workspace_id: r.try_get("workspace_id")?,
                }),
                integration_limits: integration_limits.map(Arc::new),
            };
            out.push((
                slug,
                Entry {
                    record: Arc::new(record),
                    expires_at: expires_at.as_deref().and_then(time::parse),
                    integration,
                },
            ));
        }
        Ok(out)
    }

    /// Adds the active configs to `snapshot`: all, or only the one with id `only`.
    async fn load_configs(&self, snapshot: &mut Snapshot, only: Option<&str>) -> Result<()> {
        let filter = if only.is_some() { " AND c.id = $1" } else { "" };
        let sql = format!(
            "SELECT c.id, c.slug, c.organisation_id, c.workspace_id, v.config, v.secrets
             FROM configs c JOIN config_versions v ON v.id = c.current_version_id
             WHERE c.status = 'active'{filter}"
        );
        let rows = super::bind_some(sqlx::query(sqlx::AssertSqlSafe(sql)), only)
            .fetch_all(self.db.pool())
            .await?;
        for r in &rows {
            let id: String = r.try_get("id")?;
            let slug: String = r.try_get("slug")?;
            // The body with its secrets opened; left out when they cannot be.
            let Some(config) = self.open_config(
                &id,
                &r.try_get::<String, _>("config")?,
                r.try_get::<Option<String>, _>("secrets")?.as_deref(),
            )?
            else {
                continue;
            };
            let config = SavedConfig {
                owner: Some(Owner {
                    organisation_id: r.try_get("organisation_id")?,
                    workspace_id: r.try_get("workspace_id")?,
                }),
                body: Arc::new(config),
            };
            snapshot.config_slugs.insert(id.clone(), slug.clone());
            snapshot.configs.insert(id, config.clone());
            snapshot.configs.insert(slug, config);
        }
        Ok(())
    }

    /// Adds the active guardrails to `snapshot`: all, or only the one with id `only`.
    async fn load_guardrails(&self, snapshot: &mut Snapshot, only: Option<&str>) -> Result<()> {
        let filter = if only.is_some() { " AND id = $1" } else { "" };
        let sql = format!(
            "SELECT id, slug, organisation_id, workspace_id, hook, secrets FROM guardrails
             WHERE status = 'active'{filter}"
        );
        let rows = super::bind_some(sqlx::query(sqlx::AssertSqlSafe(sql)), only)
            .fetch_all(self.db.pool())
            .await?;
        for r in &rows {
            let Some(hook) = self.open_guardrail(r)? else {
                continue;
            };
            let id: String = r.try_get("id")?;
            let slug: String = r.try_get("slug")?;
            let saved = Arc::new(SavedGuardrail {
                id: id.clone(),
                slug: slug.clone(),
                owner: Owner {
                    organisation_id: r.try_get("organisation_id")?,
                    workspace_id: r.try_get("workspace_id")?,
                },
                hook,
            });
            snapshot.guardrails.insert(id, saved.clone());
            snapshot.guardrails.insert(slug, saved);
        }
        Ok(())
    }
    fn open_secrets(
        &self,
        integration: &str,
        key: Option<String>,
        settings: Option<String>,
    ) -> Result<Secrets> {
        if key.is_none() && settings.is_none() {
            return Ok(Secrets::default());
        }
        let cipher = self.cipher()?;
        let key = key
            .map(|k| cipher.decrypt(&k, &secret_context(integration, "key")))
            .transpose()?;
        let settings = match settings {
            Some(s) => {
                let text = cipher.decrypt(&s, &secret_context(integration, "settings"))?;
                super::from_text("integrations.secret_settings", &text)?
            }
            None => BTreeMap::new(),
        };
        Ok(Secrets { key, settings })
    }
}

/// A provider row's own limits, as the data plane enforces them.
#[derive(Debug)]
struct ProviderLimits {
    rate_limits: Vec<RateLimit>,
    usage_limits: Option<UsageLimit>,
    counted: CountedUsage,
}

/// Reads `usage_limits`, `rate_limits` (stored as the API's `{type, unit, value}` list, which
/// the SDK's type reads as is), `current_usage`, `usage_period` and `reset_epoch`.
fn provider_limits(r: &AnyRow) -> Result<ProviderLimits> {
    let usage_limits: Option<UsageLimits> = r
        .try_get::<Option<String>, _>("usage_limits")?
        .map(|t| super::from_text("providers.usage_limits", &t))
        .transpose()?;
    let rate_limits: Vec<RateLimit> = super::from_text(
        "providers.rate_limits",
        &r.try_get::<String, _>("rate_limits")?,
    )?;
    Ok(ProviderLimits {
        rate_limits,
        usage_limits: usage_limits.as_ref().map(super::usage::sdk_limit),
        counted: CountedUsage {
            current_usage: r.try_get("current_usage")?,
            period: r.try_get("usage_period")?,
            reset_epoch: r.try_get("reset_epoch")?,
        },
    })
}

/// What each workspace has counted of the budgets organisation integrations set on it, by
/// (integration, workspace): (budget index, usage). All, or one integration's.
async fn integration_usage(
    db: &Db,
    only: Option<&str>,
) -> Result<HashMap<(String, String), Vec<(usize, CountedUsage)>>> {
    let filter = if only.is_some() {
        " WHERE integration_id = $1"
    } else {
        ""
    };
    let sql = format!(
        "SELECT integration_id, workspace_id, budget_index, current_usage, usage_period,
                reset_epoch
         FROM integration_budget_usage{filter}"
    );
    let rows = super::bind_some(sqlx::query(sqlx::AssertSqlSafe(sql)), only)
        .fetch_all(db.pool())
        .await?;
    let mut out: HashMap<(String, String), Vec<(usize, CountedUsage)>> = HashMap::new();
    for r in &rows {
        let index: i64 = r.try_get("budget_index")?;
        out.entry((r.try_get("integration_id")?, r.try_get("workspace_id")?))
            .or_default()
            .push((
                usize::try_from(index).unwrap_or(usize::MAX),
                CountedUsage {
                    current_usage: r.try_get("current_usage")?,
                    period: r.try_get("usage_period")?,
                    reset_epoch: r.try_get("reset_epoch")?,
                },
            ));
    }
    Ok(out)
}

/// The limits an organisation integration sets on the workspace of the provider row `r`: the
/// workspace's own (`integration_workspaces`), each kind (budgets, rate limits) else the global
/// access's (as [`super::integrations::workspace_budgets`] reads the budgets to charge); `None`
/// for a workspace's own integration, or when there are none.
fn integration_limits(
    r: &AnyRow,
    usage: &HashMap<(String, String), Vec<(usize, CountedUsage)>>,
) -> Result<Option<IntegrationLimits>> {
    if r.try_get::<Option<String>, _>("integration_workspace_id")?
        .is_some()
    {
        return Ok(None);
    }
    // Each kind from the workspace's own list when it has any, else from the global access's.
    let text = |c: &str| -> Result<String> {
        Ok(r.try_get::<Option<String>, _>(c)?
            .unwrap_or_else(|| "[]".to_owned()))
    };
    let own_usage: Vec<UsageLimits> = super::from_text(
        "integration_workspaces.usage_limits",
        &text("workspace_usage_limits")?,
    )?;
    let own_rate: Vec<RateLimit> = super::from_text(
        "integration_workspaces.rate_limits",
        &text("workspace_rate_limits")?,
    )?;
    let global = if r.try_get::<i64, _>("global_workspace_access")? != 0 {
        super::from_text(
            "integrations.global_limits",
            &r.try_get::<String, _>("global_limits")?,
        )?
    } else {
        GlobalLimits::default()
    };
    let usage_limits = if own_usage.is_empty() {
        global.usage_limits
    } else {
        own_usage
    };
    let rate_limits = if own_rate.is_empty() {
        global.rate_limits
    } else {
        own_rate
    };
    if usage_limits.is_empty() && rate_limits.is_empty() {
        return Ok(None);
    }
    let integration: String = r.try_get("integration_id")?;
    let workspace: String = r.try_get("workspace_id")?;
    let counted = usage.get(&(integration.clone(), workspace.clone()));
    let id = |i: usize| format!("integration:{integration}:{workspace}:{i}");
    Ok(Some(IntegrationLimits {
        rate_limits: rate_limits
            .into_iter()
            .enumerate()
            .map(|(i, limit)| ScopedRateLimit { id: id(i), limit })
            .collect(),
        budgets: usage_limits
            .iter()
            .enumerate()
            .map(|(i, limit)| Budget {
                id: id(i),
                limit: super::usage::sdk_limit(limit),
                counted: counted
                    .and_then(|c| c.iter().find(|(index, _)| *index == i))
                    .map(|(_, c)| *c)
                    .unwrap_or_default(),
            })
            .collect(),
    }))
}

/// The decrypted secrets of one integration.
#[derive(Debug, Default)]
struct Secrets {
    key: Option<String>,
    settings: BTreeMap<String, String>,
}

/// Which providers [`Store::load_providers`] reads.
#[derive(Debug, Clone, Copy)]
enum Only<'a> {
    All,
    Provider(&'a str),
    Integration(&'a str),
}

/// What [`Store::refresh_data_plane`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refresh {
    /// The snapshot was at the database's version.
    Current,
    /// This many distinct changes were applied to it.
    Applied(usize),
    /// Every row was read again.
    Rebuilt,
}

impl Refresh {
    /// Whether a new snapshot was published.
    pub fn published(self) -> bool {
        self != Refresh::Current
    }
}

/// What [`Store::check_data_plane`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// The published snapshot serves what the database holds.
    Same,
    /// It did not (now replaced).
    Differed,
    /// The database changed during the check; nothing compared.
    Moved,
}

/// The associated data of a secret: the integration and the field it is stored in.
pub(crate) fn secret_context(integration_id: &str, field: &str) -> String {
    format!("integration:{integration_id}:{field}")
}

/// Keeps `store`'s snapshot current with changes made by other instances: with PostgreSQL it
/// listens for notifications; in every case it compares the version every `every`, and runs the
/// consistency check ([`Store::check_data_plane`]) every `check_every`. Runs until its task is
/// dropped.
pub async fn watch(store: Store, database_url: String, every: Duration, check_every: Duration) {
    if store.db.backend() == Backend::Postgres {
        tokio::spawn(listen(store.clone(), database_url));
    }
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut check =
        tokio::time::interval_at(tokio::time::Instant::now() + check_every, check_every);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if let Err(e) = store.refresh_data_plane().await {
                    tracing::warn!(error = %e, "could not refresh the data plane's snapshot; retrying");
                }
            }
            _ = check.tick() => {
                if let Err(e) = store.check_data_plane().await {
                    tracing::warn!(error = %e, "could not check the data plane's snapshot against the database");
                }
            }
        }
    }
}

/// Rebuilds on every `NOTIFY gw_data_plane`; reconnects when the connection drops.
async fn listen(store: Store, database_url: String) {
    use sqlx::postgres::PgListener;
    loop {
        let listener = async {
            let mut l = PgListener::connect(&database_url).await?;
            l.listen(CHANNEL).await?;
            Ok::<_, sqlx::Error>(l)
        }
        .await;
        match listener {
            Ok(mut l) => {
                // Changes made while not listening.
                store.after_data_plane_change().await;
                loop {
                    match l.recv().await {
                        Ok(_) => store.after_data_plane_change().await,
                        Err(e) => {
                            tracing::warn!(error = %e, "lost the data plane's notification channel; reconnecting");
                            break;
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(
                error = %e,
                "cannot listen for data plane changes; polling only, retrying in a second"
            ),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_files_of_urls() {
        assert_eq!(
            sqlite_file("sqlite://data/gateway.db?mode=rwc"),
            Some(PathBuf::from("data/gateway.db"))
        );
        assert_eq!(
            sqlite_file("sqlite:/tmp/x.db"),
            Some(PathBuf::from("/tmp/x.db"))
        );
        assert_eq!(sqlite_file("sqlite::memory:"), None);
        assert_eq!(sqlite_file("sqlite://x.db?mode=memory"), None);
    }

    #[test]
    fn expired_providers_are_not_served() {
        let record = |slug: &str| {
            Arc::new(ProviderRecord {
                slug: slug.into(),
                provider: "openai".into(),
                api_key: None,
                custom_host: None,
                settings: BTreeMap::new(),
                ..ProviderRecord::default()
            })
        };
        let mut s = Snapshot::empty();
        s.providers.insert(
            "live".into(),
            Entry {
                record: record("live"),
                expires_at: Some(time::now() + chrono::Duration::hours(1)),
                integration: "i".into(),
            },
        );
        s.providers.insert(
            "gone".into(),
            Entry {
                record: record("gone"),
                expires_at: Some(time::now() - chrono::Duration::seconds(1)),
                integration: "i".into(),
            },
        );
        assert!(s.provider("live").is_some());
        assert!(s.provider("gone").is_none());
        assert!(s.provider("none").is_none());
    }
}
