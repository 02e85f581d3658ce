//! A database per test (a SQLite file in a temporary folder, or a PostgreSQL schema of its
//! own), the bootstrapped control plane on it, and requests to its router.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU64, Ordering};

use admin::{BootstrapOptions, BootstrapOutcome, ClientAddr, Store};
use bytes::Bytes;
use serde_json::Value;
use tower::ServiceExt;

/// The bootstrap admin key of every test.
pub const ADMIN_KEY: &str = "test-admin-key-0123456789";

/// The address the test requests come from, as the audit log should record it.
pub const CLIENT_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 9));

/// The variable naming a PostgreSQL server for these tests (set by `.ci/run`).
pub const POSTGRES_VAR: &str = "GW_TEST_POSTGRES_URL";

/// A database that removes itself when dropped.
pub struct TestDb {
    pub url: String,
    cleanup: Cleanup,
}

enum Cleanup {
    Dir(std::path::PathBuf),
    Schema { server: String, schema: String },
}

static SEQ: AtomicU64 = AtomicU64::new(0);

fn unique() -> String {
    format!(
        "{}_{}_{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst),
        admin::keys::random_hex(6)
    )
}

/// A SQLite file in a folder of its own under the system's temporary folder.
pub fn sqlite() -> TestDb {
    let dir = std::env::temp_dir().join(format!("gw-admin-test-{}", unique()));
    std::fs::create_dir_all(&dir).expect("make a temporary folder");
    TestDb {
        url: format!("sqlite://{}", dir.join("control.db").display()),
        cleanup: Cleanup::Dir(dir),
    }
}

/// A fresh schema on the server of `GW_TEST_POSTGRES_URL`, or `None` when it is unset. A set
/// variable whose server cannot be reached fails the test: a silent skip would hide it.
pub async fn postgres() -> Option<TestDb> {
    let server = std::env::var(POSTGRES_VAR).ok().filter(|s| !s.is_empty())?;
    let schema = format!("gwtest_{}", unique());
    sqlx::any::install_default_drivers();
    let mut conn = sqlx::AnyConnection::connect(&server)
        .await
        .unwrap_or_else(|e| panic!("{POSTGRES_VAR} is set but {server} is unreachable: {e}"));
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&mut conn)
        .await
        .expect("create the test schema");
    use sqlx::Connection;
    conn.close().await.ok();
    let sep = if server.contains('?') { '&' } else { '?' };
    Some(TestDb {
        url: format!("{server}{sep}options=-c%20search_path%3D{schema}"),
        cleanup: Cleanup::Schema { server, schema },
    })
}

impl Drop for TestDb {
    fn drop(&mut self) {
        match &self.cleanup {
            Cleanup::Dir(dir) => {
                let _ = std::fs::remove_dir_all(dir);
            }
            Cleanup::Schema { server, schema } => {
                let (server, schema) = (server.clone(), schema.clone());
                // Dropped inside a runtime, perhaps while panicking: clean up on a thread.
                let _ = std::thread::spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("a runtime");
                    rt.block_on(async {
                        use sqlx::Connection;
                        if let Ok(mut conn) = sqlx::AnyConnection::connect(&server).await {
                            let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                                "DROP SCHEMA IF EXISTS {schema} CASCADE"
                            )))
                            .execute(&mut conn)
                            .await;
                            let _ = conn.close().await;
                        }
                    })
                })
                .join();
            }
        }
    }
}

/// A bootstrapped control plane and its router.
pub struct App {
    pub store: Store,
    pub router: axum::Router,
    pub org: String,
    pub owner: String,
    pub default_ws: String,
    pub admin_key_id: String,
    /// Removes the database when the app is dropped (last: after the store).
    _db: TestDb,
}

impl App {
    pub async fn start(db: TestDb) -> App {
        let store = Store::open(&db.url).await.expect("open and migrate");
        let outcome = store
            .bootstrap(&BootstrapOptions {
                admin_key: Some(ADMIN_KEY.into()),
                ..BootstrapOptions::default()
            })
            .await
            .expect("bootstrap");
        let BootstrapOutcome::Created {
            organisation_id,
            owner_id,
            workspace_id,
            admin_key_id,
            generated_key,
        } = outcome
        else {
            panic!("a fresh database is bootstrapped: {outcome:?}")
        };
        assert!(generated_key.is_none(), "a supplied key is not generated");
        App {
            router: admin::router(store.clone()),
            store,
            org: organisation_id,
            owner: owner_id,
            default_ws: workspace_id,
            admin_key_id,
            _db: db,
        }
    }

    /// Sends a request; returns the status and the JSON body.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json");
        if let Some(key) = key {
            req = req.header("x-gw-api-key", key);
        }
        let body = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
        let mut req = req.body(axum::body::Body::from(body)).expect("a request");
        req.extensions_mut().insert(ClientAddr(Some(CLIENT_IP)));
        let resp = self.router.clone().oneshot(req).await.expect("infallible");
        let status = resp.status().as_u16();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .expect("a body");
        let value = serde_json::from_slice(&bytes).unwrap_or_else(|_| {
            panic!(
                "{method} {path}: not JSON: {}",
                String::from_utf8_lossy(&bytes)
            )
        });
        (status, value)
    }

    /// Sends a request; returns the status, the content type and the body as it is (for
    /// answers that are not JSON).
    pub async fn call_raw(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Option<Value>,
    ) -> (u16, String, Bytes) {
        let mut req = http::Request::builder().method(method).uri(path);
        if let Some(key) = key {
            req = req.header("x-gw-api-key", key);
        }
        let body = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
        let mut req = req.body(axum::body::Body::from(body)).expect("a request");
        req.extensions_mut().insert(ClientAddr(Some(CLIENT_IP)));
        let resp = self.router.clone().oneshot(req).await.expect("infallible");
        let status = resp.status().as_u16();
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .expect("a body");
        (status, content_type, bytes)
    }

    pub async fn admin(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        self.call(method, path, Some(ADMIN_KEY), body).await
    }

    /// Creates a workspace with the admin key; returns its id.
    pub async fn workspace(&self, name: &str) -> String {
        let (status, body) = self
            .admin(
                "POST",
                "/v1/admin/workspaces",
                Some(serde_json::json!({"name": name})),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        body["id"].as_str().expect("an id").to_owned()
    }

    /// Creates a key with `creator`; returns (id, raw key).
    pub async fn key(&self, creator: &str, path: &str, body: Value) -> (String, String) {
        let (status, resp) = self.call("POST", path, Some(creator), Some(body)).await;
        assert_eq!(status, 200, "POST {path}: {resp}");
        (
            resp["id"].as_str().expect("an id").to_owned(),
            resp["key"].as_str().expect("a key").to_owned(),
        )
    }

    /// A user of the organisation with this org role, member of `ws` with `ws_role` if given.
    pub async fn user(
        &self,
        email: &str,
        org_role: admin::authz::OrgRole,
        ws: Option<(&str, admin::authz::WorkspaceRole)>,
    ) -> String {
        let user = self
            .store
            .create_user(&self.org, email, org_role)
            .await
            .expect("create a user");
        if let Some((ws, role)) = ws {
            self.store
                .set_workspace_member(ws, &user.id, role)
                .await
                .expect("add a member");
        }
        user.id
    }

    /// A workspace user key for `user` in `ws`, made with the admin key.
    pub async fn user_key(&self, ws: &str, user: &str, scopes: &[&str]) -> (String, String) {
        self.key(
            ADMIN_KEY,
            "/v1/api-keys/workspace/user",
            serde_json::json!({"name": "k", "workspace_id": ws, "user_id": user, "scopes": scopes}),
        )
        .await
    }

    /// How many audit records of changes there are: refused calls (action `refused`, which
    /// every 401 and 403 leaves) are not counted; see [`App::refused_count`].
    pub async fn audit_count(&self) -> i64 {
        sqlx::query_scalar("SELECT COUNT(*) FROM audit_logs WHERE action <> 'refused'")
            .fetch_one(self.store.db().pool())
            .await
            .expect("count")
    }

    /// How many records of refused calls there are (one by one and summaries).
    pub async fn refused_count(&self) -> i64 {
        sqlx::query_scalar("SELECT COUNT(*) FROM audit_logs WHERE action = 'refused'")
            .fetch_one(self.store.db().pool())
            .await
            .expect("count")
    }

    /// The URL of the app's database (to open another instance on it).
    pub fn db_url(&self) -> String {
        self._db.url.clone()
    }

    /// Runs a statement directly on the database (to set up what the API cannot).
    pub async fn sql(&self, sql: &str, args: &[&str]) {
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()));
        for a in args {
            q = q.bind(a.to_string());
        }
        q.execute(self.store.db().pool()).await.expect("sql");
    }
}

/// The SHA-256 of a raw key: how the data plane looks keys up.
pub fn digest(raw: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, raw.as_bytes());
    d.as_ref().try_into().expect("32 bytes")
}

/// Bumps the data plane's version behind the store's back and rebuilds its snapshot (to pick up
/// what a test wrote with SQL).
pub async fn rebuild(app: &App) {
    app.sql(
        "UPDATE data_plane_version SET version = version + 1 WHERE id = 1",
        &[],
    )
    .await;
    assert!(app
        .store
        .refresh_data_plane()
        .await
        .expect("rebuild")
        .published());
}

/// Workspace-level scopes for keys in tests.
pub const WS_SCOPES: &[&str] = &[
    "workspace_service_api_keys.create",
    "workspace_service_api_keys.read",
    "workspace_service_api_keys.list",
    "workspace_service_api_keys.update",
    "workspace_service_api_keys.delete",
    "workspace_user_api_keys.create",
    "workspace_user_api_keys.read",
    "workspace_user_api_keys.list",
    "workspace_user_api_keys.update",
    "workspace_user_api_keys.delete",
    "configs.read",
];

/// Expands each listed `async fn name(db: TestDb)` into a test on SQLite and one on PostgreSQL
/// (the latter returns at once when `GW_TEST_POSTGRES_URL` is unset).
#[macro_export]
macro_rules! on_both_databases {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common::sqlite()).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    match $crate::common::postgres().await {
                        Some(db) => super::$name(db).await,
                        None => eprintln!(
                            "{}: skipped on PostgreSQL ({} is unset)",
                            stringify!($name),
                            $crate::common::POSTGRES_VAR
                        ),
                    }
                }
            )*
        }
    };
}
