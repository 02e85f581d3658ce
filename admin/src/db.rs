//! The database: one sqlx `Any` pool over SQLite or PostgreSQL, write transactions that take
//! the write lock up front, the migration runner, and a small builder for queries with
//! optional filters.
//!
//! Every query is written once, with `$1`-style placeholders (both SQLite and PostgreSQL read
//! them), and binds only text, integers and floats: the `Any` driver has no UUID or time
//! types, which is why ids and times are stored as text.

use std::time::Duration;

use sqlx::any::{AnyArguments, AnyPoolOptions, AnyRow};
use sqlx::query::Query;
use sqlx::{Any, AnyPool, AssertSqlSafe, Connection, Executor, Row, Transaction};

use crate::error::{AdminError, Result};
use crate::validate::Page;

/// The database behind a URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    /// ` FOR UPDATE` where the database has it (PostgreSQL); SQLite's write transaction already
    /// holds the only write lock.
    pub fn for_update(self) -> &'static str {
        match self {
            Backend::Postgres => " FOR UPDATE",
            Backend::Sqlite => "",
        }
    }

    /// ` FOR SHARE` on PostgreSQL: waits for a write of the row in progress.
    pub fn for_share(self) -> &'static str {
        match self {
            Backend::Postgres => " FOR SHARE",
            Backend::Sqlite => "",
        }
    }

    pub fn of_url(url: &str) -> Option<Backend> {
        if url.starts_with("sqlite:") {
            Some(Backend::Sqlite)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Some(Backend::Postgres)
        } else {
            None
        }
    }
}

/// A write transaction.
pub type Tx = Transaction<'static, Any>;

/// The control plane's connection pool.
#[derive(Clone, Debug)]
pub struct Db {
    pool: AnyPool,
    backend: Backend,
}

/// Migrations, in order: (version, name, SQL). The SQL is portable: one file for both databases.
const MIGRATIONS: &[(i64, &str, &str)] = &[
    (
        1,
        "control_plane",
        include_str!("../migrations/0001_control_plane.sql"),
    ),
    (
        2,
        "configs_providers",
        include_str!("../migrations/0002_configs_providers.sql"),
    ),
    (
        3,
        "policies",
        include_str!("../migrations/0003_policies.sql"),
    ),
    (
        4,
        "users_settings_deployments",
        include_str!("../migrations/0004_users_settings_deployments.sql"),
    ),
    (
        5,
        "enforcement",
        include_str!("../migrations/0005_enforcement.sql"),
    ),
    (
        6,
        "integration_models",
        include_str!("../migrations/0006_integration_models.sql"),
    ),
    (
        7,
        "key_rotation",
        include_str!("../migrations/0007_key_rotation.sql"),
    ),
    (
        8,
        "config_secrets",
        include_str!("../migrations/0008_config_secrets.sql"),
    ),
    (
        9,
        "guardrails",
        include_str!("../migrations/0009_guardrails.sql"),
    ),
    (
        10,
        "data_plane_changes",
        include_str!("../migrations/0010_data_plane_changes.sql"),
    ),
    (
        11,
        "bulk_audit",
        include_str!("../migrations/0011_bulk_audit.sql"),
    ),
    (
        12,
        "integration_budgets",
        include_str!("../migrations/0012_integration_budgets.sql"),
    ),
];

/// The key of the PostgreSQL advisory lock that serialises migrations and bootstrap across
/// gateway instances ("gw-ctrl" in ASCII).
const PG_LOCK_KEY: i64 = 0x67_772d_6374_726c;

impl Db {
    /// Opens a pool. SQLite files are created when missing (with their folder), put in WAL mode,
    /// and wait up to five seconds for a lock; PostgreSQL takes the URL as it is (a schema can
    /// be chosen with `?options=-c%20search_path%3Dname`).
    pub async fn connect(url: &str) -> Result<Db> {
        sqlx::any::install_default_drivers();
        let backend = Backend::of_url(url).ok_or_else(|| {
            AdminError::validation(format!(
                "database_url must start with sqlite: or postgres://, got {:?}",
                redact_url(url)
            ))
        })?;
        let cannot = |e: sqlx::Error| {
            AdminError::internal(format!("cannot open the database {}: {e}", redact_url(url)))
        };
        let pool = match backend {
            Backend::Sqlite => {
                let url = sqlite_url(url)?;
                if !is_memory(&url) {
                    set_wal(&url).await.map_err(cannot)?;
                }
                // An in-memory database lives as long as one of its connections: keep one. Its
                // connections share a cache with table locks that writers cannot wait on:
                // give it a single connection.
                let max = if is_memory(&url) { 1 } else { 4 };
                AnyPoolOptions::new()
                    .max_connections(max)
                    .min_connections(1)
                    .idle_timeout(None)
                    .max_lifetime(None)
                    .acquire_timeout(Duration::from_secs(30))
                    .connect(&url)
                    .await
                    .map_err(cannot)?
            }
            Backend::Postgres => AnyPoolOptions::new()
                .max_connections(8)
                .acquire_timeout(Duration::from_secs(10))
                .connect(url)
                .await
                .map_err(cannot)?,
        };
        Ok(Db { pool, backend })
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// Begins a transaction that will write. On SQLite it takes the write lock at once
    /// (`BEGIN IMMEDIATE`), so concurrent writers wait for each other instead of failing when
    /// a read lock cannot be upgraded.
    pub async fn begin_write(&self) -> Result<Tx> {
        Ok(match self.backend {
            Backend::Sqlite => self.pool.begin_with("BEGIN IMMEDIATE").await?,
            Backend::Postgres => self.pool.begin().await?,
        })
    }

    /// Begins a write transaction that no other instance runs at the same time (migrations,
    /// bootstrap): SQLite's write lock, or a PostgreSQL advisory lock held to the commit.
    pub async fn begin_exclusive(&self) -> Result<Tx> {
        let mut tx = self.begin_write().await?;
        if self.backend == Backend::Postgres {
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(PG_LOCK_KEY)
                .execute(&mut *tx)
                .await?;
        }
        Ok(tx)
    }

    /// Applies the migrations this build knows and the database lacks, in one transaction.
    /// Refuses a database whose applied migrations differ from this build's (an edited file)
    /// or that has migrations this build does not know (a newer gateway migrated it).
    pub async fn migrate(&self) -> Result<()> {
        let mut tx = self.begin_exclusive().await?;
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS gw_schema_migrations (
                version BIGINT PRIMARY KEY,
                name TEXT NOT NULL,
                checksum TEXT NOT NULL,
                applied_at TEXT NOT NULL
            )",
        )
        .execute(&mut *tx)
        .await?;
        let applied: Vec<(i64, String)> =
            sqlx::query_as("SELECT version, checksum FROM gw_schema_migrations ORDER BY version")
                .fetch_all(&mut *tx)
                .await?;
        for (version, checksum) in &applied {
            match MIGRATIONS.iter().find(|(v, _, _)| v == version) {
                None => {
                    return Err(AdminError::internal(format!(
                        "the database has migration {version}, which this gateway does not know: \
                         it was migrated by a newer version"
                    )))
                }
                Some((_, name, sql)) if crate::keys::hash(sql) != *checksum => {
                    return Err(AdminError::internal(format!(
                        "migration {version} ({name}) differs from the one applied to the database"
                    )))
                }
                Some(_) => {}
            }
        }
        for (version, name, sql) in MIGRATIONS {
            if applied.iter().any(|(v, _)| v == version) {
                continue;
            }
            tracing::info!(version, name, "applying control-plane migration");
            tx.execute(sqlx::raw_sql(*sql)).await?;
            after_migration(*version, &mut tx).await?;
            sqlx::query(
                "INSERT INTO gw_schema_migrations (version, name, checksum, applied_at)
                 VALUES ($1, $2, $3, $4)",
            )
            .bind(*version)
            .bind(*name)
            .bind(crate::keys::hash(sql))
            .bind(crate::time::format(crate::time::now()))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// What a migration needs beyond its SQL, in its transaction: data that portable SQL cannot
/// move (values inside JSON documents).
async fn after_migration(version: i64, tx: &mut Tx) -> Result<()> {
    if version == 7 {
        crate::store::fill_next_rotation_at(tx).await?;
    }
    Ok(())
}

/// SQLite URLs are opened read-write-create unless they say otherwise; the file's folder is
/// created when missing.
fn sqlite_url(url: &str) -> Result<String> {
    if is_memory(url) || url.contains("mode=") {
        return Ok(url.to_owned());
    }
    let path = url
        .trim_start_matches("sqlite://")
        .trim_start_matches("sqlite:");
    let path = path.split('?').next().unwrap_or_default();
    if let Some(dir) = std::path::Path::new(path).parent() {
        if !dir.as_os_str().is_empty() && !dir.exists() {
            std::fs::create_dir_all(dir).map_err(|e| {
                AdminError::internal(format!("cannot create {}: {e}", dir.display()))
            })?;
        }
    }
    let sep = if url.contains('?') { '&' } else { '?' };
    Ok(format!("{url}{sep}mode=rwc"))
}

fn is_memory(url: &str) -> bool {
    url.contains(":memory:") || url.contains("mode=memory")
}

/// WAL lets readers go on while one writer writes. Switching needs a moment alone with the
/// file, which two instances starting together may not get at once: retry briefly.
async fn set_wal(url: &str) -> std::result::Result<(), sqlx::Error> {
    let mut attempt = 0;
    loop {
        let result = async {
            let mut conn = sqlx::AnyConnection::connect(url).await?;
            let mode: String = sqlx::query("PRAGMA journal_mode = WAL")
                .fetch_one(&mut conn)
                .await?
                .try_get(0)?;
            conn.close().await?;
            Ok::<_, sqlx::Error>(mode)
        }
        .await;
        match result {
            Ok(_) => return Ok(()),
            Err(e) if attempt < 50 && e.to_string().contains("locked") => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(20 * attempt)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// A URL with its password hidden, for messages.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.split_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// A value bound to a built query.
#[derive(Debug, Clone)]
pub enum Arg {
    Text(String),
    Int(i64),
    Float(f64),
    /// A nullable value, bound with its type (PostgreSQL types a NULL by its parameter).
    OptText(Option<String>),
    OptInt(Option<i64>),
    OptFloat(Option<f64>),
}

/// A query built from pieces, numbering its placeholders `$1, $2...` as values are bound.
#[derive(Debug, Default, Clone)]
pub struct Sql {
    text: String,
    args: Vec<Arg>,
    /// Plain `?` placeholders instead of numbered ones (SQLite only).
    anonymous: bool,
}

impl Sql {
    pub fn new(text: &str) -> Sql {
        Sql {
            text: text.to_owned(),
            args: Vec::new(),
            anonymous: false,
        }
    }

    /// A SQLite query with plain `?` placeholders, bound in order. For statements with many
    /// values: SQLite looks a numbered placeholder up by name when it is bound, in time that
    /// grows with the statement's placeholder count, and a `?` needs no lookup.
    pub fn sqlite_anonymous(text: &str) -> Sql {
        Sql {
            anonymous: true,
            ..Sql::new(text)
        }
    }

    /// Appends SQL text (never a value).
    pub fn push(&mut self, text: &str) -> &mut Sql {
        self.text.push_str(text);
        self
    }

    /// Appends a placeholder for a text value.
    pub fn text(&mut self, value: impl Into<String>) -> &mut Sql {
        self.args.push(Arg::Text(value.into()));
        self.placeholder()
    }

    /// Appends a placeholder for an integer.
    pub fn int(&mut self, value: i64) -> &mut Sql {
        self.args.push(Arg::Int(value));
        self.placeholder()
    }

    /// Appends a placeholder for a float.
    pub fn float(&mut self, value: f64) -> &mut Sql {
        self.args.push(Arg::Float(value));
        self.placeholder()
    }

    /// Appends a placeholder for a text value or NULL.
    pub fn opt_text(&mut self, value: Option<String>) -> &mut Sql {
        self.args.push(Arg::OptText(value));
        self.placeholder()
    }

    /// Appends a placeholder for an integer or NULL.
    pub fn opt_int(&mut self, value: Option<i64>) -> &mut Sql {
        self.args.push(Arg::OptInt(value));
        self.placeholder()
    }

    /// Appends a placeholder for a float or NULL.
    pub fn opt_float(&mut self, value: Option<f64>) -> &mut Sql {
        self.args.push(Arg::OptFloat(value));
        self.placeholder()
    }

    /// A copy with `head` before the text: one filter shared by a count and a page query.
    pub fn prefixed(&self, head: &str) -> Sql {
        Sql {
            text: format!("{head}{}", self.text),
            args: self.args.clone(),
            anonymous: self.anonymous,
        }
    }

    /// For a ` FROM ... WHERE ...` condition: how many rows it selects in all, and one page of
    /// them (`SELECT {columns}` ... `ORDER BY {order_by} LIMIT ... OFFSET ...`) read by
    /// `from_row`.
    pub async fn select_page<T>(
        &self,
        db: &Db,
        columns: &str,
        order_by: &str,
        page: Page,
        from_row: impl FnMut(&AnyRow) -> Result<T>,
    ) -> Result<(i64, Vec<T>)> {
        let total: i64 = self
            .prefixed("SELECT COUNT(*)")
            .query()
            .fetch_one(db.pool())
            .await?
            .try_get(0)?;
        let mut rows = self.prefixed(&format!("SELECT {columns}"));
        rows.push(&format!(" ORDER BY {order_by} LIMIT "))
            .int(page.size)
            .push(" OFFSET ")
            .int(page.offset());
        let rows = rows.query().fetch_all(db.pool()).await?;
        let list = rows.iter().map(from_row).collect::<Result<Vec<_>>>()?;
        Ok((total, list))
    }

    fn placeholder(&mut self) -> &mut Sql {
        if self.anonymous {
            self.text.push('?');
            return self;
        }
        let mut digits = itoa::Buffer::new();
        self.text.push('$');
        self.text.push_str(digits.format(self.args.len()));
        self
    }

    pub fn query(&self) -> Query<'static, Any, AnyArguments> {
        self.clone().into_query()
    }

    /// The query, its values moved rather than copied (for statements with many of them).
    pub fn into_query(self) -> Query<'static, Any, AnyArguments> {
        let mut q = sqlx::query(AssertSqlSafe(self.text));
        for arg in self.args {
            q = match arg {
                Arg::Text(s) => q.bind(s),
                Arg::Int(i) => q.bind(i),
                Arg::Float(f) => q.bind(f),
                Arg::OptText(s) => q.bind(s),
                Arg::OptInt(i) => q.bind(i),
                Arg::OptFloat(f) => q.bind(f),
            };
        }
        q
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(Backend::of_url("sqlite://x.db"), Some(Backend::Sqlite));
        assert_eq!(Backend::of_url("sqlite::memory:"), Some(Backend::Sqlite));
        assert_eq!(
            Backend::of_url("postgresql://u@h/db"),
            Some(Backend::Postgres)
        );
        assert_eq!(Backend::of_url("mysql://h/db"), None);
        assert_eq!(
            sqlite_url("sqlite://gateway.db").unwrap(),
            "sqlite://gateway.db?mode=rwc"
        );
        assert_eq!(sqlite_url("sqlite::memory:").unwrap(), "sqlite::memory:");
        assert_eq!(
            redact_url("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
    }

    #[test]
    fn built_queries_number_their_placeholders() {
        let mut sql = Sql::new("SELECT 1 FROM t WHERE a = ");
        sql.text("x")
            .push(" AND b = ")
            .int(2)
            .push(" LIMIT ")
            .int(3);
        assert_eq!(sql.text, "SELECT 1 FROM t WHERE a = $1 AND b = $2 LIMIT $3");
        assert_eq!(sql.args.len(), 3);
    }
}
