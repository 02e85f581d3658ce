//! The control plane through the real gateway: served on the gateway's listener beside the
//! provider routes, bounded bodies, a database per gateway, and `gateway bootstrap`.

use std::process::Command;

use serde_json::{json, Value};

use gateway::config::{GatewayConfig, Overrides, Secret};
use gateway::server::{free_local_addr, Gateway};

use crate::common::{hello, Env, TempDir, ADMIN_KEY};

fn code(body: &Value) -> &str {
    body["data"]["errorCode"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn the_control_plane_is_served_beside_the_provider_routes() {
    use reqwest::Method;
    let env = Env::start().await;
    let (status, ws) = env
        .admin_call(
            Method::POST,
            "/v1/admin/workspaces",
            Some(ADMIN_KEY),
            Some(json!({"name": "Over HTTP"})),
        )
        .await;
    assert_eq!(status, 200, "{ws}");
    let (status, created) = env
        .admin_call(
            Method::POST,
            "/v1/api-keys/workspace/service",
            Some(ADMIN_KEY),
            Some(json!({"name": "k", "workspace_id": ws["id"], "scopes": ["workspace_service_api_keys.list"]})),
        )
        .await;
    assert_eq!(status, 200, "{created}");
    let key = created["key"].as_str().unwrap();
    let (status, list) = env
        .admin_call(Method::GET, "/v1/api-keys", Some(key), None)
        .await;
    assert_eq!((status, &list["total"]), (200, &json!(1)), "{list}");

    let (status, body) = env
        .admin_call(Method::GET, "/v1/api-keys", None, None)
        .await;
    assert_eq!((status, code(&body)), (401, "AB05"), "{body}");
    let (status, body) = env
        .admin_call(Method::GET, "/v1/admin/workspaces", Some(key), None)
        .await;
    assert_eq!((status, code(&body)), (403, "AB03"), "{body}");
    let (status, body) = env
        .admin_call(Method::PATCH, "/v1/api-keys", Some(ADMIN_KEY), None)
        .await;
    assert_eq!(status, 405, "{body}");
    // An unknown config under a control-plane path: the control plane's 404, not a provider's.
    let (status, body) = env
        .admin_call(
            Method::GET,
            "/v1/configs/pc-none0-000000",
            Some(ADMIN_KEY),
            None,
        )
        .await;
    assert_eq!((status, code(&body)), (404, "AB08"), "{body}");

    // The audit log has the client's address.
    let (status, log) = env
        .admin_call(
            Method::GET,
            "/v1/audit-logs?start_time=2000-01-01T00:00:00Z&end_time=2999-01-01T00:00:00Z&method=POST",
            Some(ADMIN_KEY),
            None,
        )
        .await;
    assert_eq!(status, 200, "{log}");
    assert_eq!(log["total"], 2, "{log}");
    assert_eq!(log["records"][0]["client_ip"], "127.0.0.1");

    // Provider routes are untouched.
    let resp = env.chat(hello("still here")).await;
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "mock reply to: still here"
    );
}

#[tokio::test]
async fn a_body_over_one_mebibyte_is_refused() {
    let env = Env::start().await;
    let big = "x".repeat(admin::MAX_BODY_BYTES + 1);
    let resp = env
        .client
        .post(env.url("/v1/admin/workspaces"))
        .header("x-gw-api-key", ADMIN_KEY)
        .header("content-type", "application/json")
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["success"], false);
    assert_eq!(code(&body), "AB01", "{body}");
}

#[tokio::test]
async fn each_gateway_has_a_database_of_its_own() {
    use reqwest::Method;
    let one = Env::start().await;
    let two = Env::start().await;
    assert_ne!(one.db.0, two.db.0);
    let (status, created) = one
        .admin_call(
            Method::POST,
            "/v1/api-keys/organisation/service",
            Some(ADMIN_KEY),
            Some(json!({"name": "only here", "scopes": ["workspaces.list"]})),
        )
        .await;
    assert_eq!(status, 200, "{created}");
    let key = created["key"].as_str().unwrap();
    let (status, _) = one
        .admin_call(Method::GET, "/v1/admin/workspaces", Some(key), None)
        .await;
    assert_eq!(status, 200);
    let (status, _) = two
        .admin_call(Method::GET, "/v1/admin/workspaces", Some(key), None)
        .await;
    assert_eq!(status, 401);
}

/// A gateway config whose control plane uses `db`.
fn config_on(db: &TempDir, key: Option<&str>) -> GatewayConfig {
    let overrides = Overrides {
        database_url: Some(db.sqlite_url()),
        bootstrap_admin_key: key.map(|k| Secret(k.into())),
        ..Overrides::default()
    };
    GatewayConfig::from_yaml(
        &format!("listen: {}\nthreads: 1\n", free_local_addr()),
        &overrides,
    )
    .expect("a valid config")
}

#[tokio::test]
async fn a_generated_admin_key_is_handed_out_once() {
    let db = TempDir::new("cp-generated");
    let mut first = Gateway::new(config_on(&db, None)).expect("starts");
    let key = first
        .control_plane
        .take_generated_key()
        .expect("a first start generates a key");
    assert_eq!(first.control_plane.take_generated_key(), None);
    drop(first);
    let mut again = Gateway::new(config_on(&db, None)).expect("restarts");
    assert_eq!(again.control_plane.take_generated_key(), None);
    let principal = again.control_plane.store().authenticate(&key).await;
    assert!(principal.is_ok(), "the generated key works after a restart");
    // A bad database URL stops the start with a message naming the setting.
    std::fs::write(db.0.join("a-file"), "").unwrap();
    let mut bad = config_on(&db, None);
    bad.database_url = format!("sqlite://{}/a-file/x.db", db.0.display());
    let err = Gateway::new(bad).err().expect("refused");
    assert_eq!(err.0[0].path, "database_url", "{err}");
}

fn run_bootstrap(config: &std::path::Path, db: &TempDir, key: Option<&str>) -> (bool, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gateway"));
    cmd.args(["bootstrap", "--config"])
        .arg(config)
        .arg("--database-url")
        .arg(db.sqlite_url())
        .env_remove("GW_BOOTSTRAP_ADMIN_KEY")
        .env_remove("GW_DATABASE_URL");
    if let Some(key) = key {
        cmd.env("GW_BOOTSTRAP_ADMIN_KEY", key);
    }
    let out = cmd.output().expect("run gateway bootstrap");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[tokio::test]
async fn the_bootstrap_command_runs_once() {
    let dir = TempDir::new("cp-bootstrap");
    let config = dir.0.join("gateway.yaml");
    std::fs::write(&config, "listen: 127.0.0.1:9\n").unwrap();

    let db = TempDir::new("cp-bootstrap-db");
    let (ok, out) = run_bootstrap(&config, &db, None);
    assert!(ok, "{out}");
    let key = out
        .lines()
        .map(str::trim)
        .find(|l| l.len() == 43 && !l.contains(' '))
        .unwrap_or_else(|| panic!("no key in {out}"))
        .to_owned();
    let (ok, again) = run_bootstrap(&config, &db, None);
    assert!(ok, "{again}");
    assert!(again.contains("Already bootstrapped"), "{again}");
    assert!(!again.contains(&key));
    let gw = Gateway::new(config_on(&db, None)).expect("starts on the bootstrapped database");
    assert!(gw.control_plane.store().authenticate(&key).await.is_ok());

    // A supplied key is used and not printed; a short one is refused.
    let db = TempDir::new("cp-bootstrap-supplied");
    let (ok, out) = run_bootstrap(&config, &db, Some("short"));
    assert!(!ok, "{out}");
    assert!(out.contains("at least 16 characters"), "{out}");
    let supplied = "a-supplied-admin-key-0123";
    let (ok, out) = run_bootstrap(&config, &db, Some(supplied));
    assert!(ok, "{out}");
    assert!(
        out.contains("GW_BOOTSTRAP_ADMIN_KEY") && !out.contains(supplied),
        "{out}"
    );
    let gw = Gateway::new(config_on(&db, None)).expect("starts");
    assert!(gw
        .control_plane
        .store()
        .authenticate(supplied)
        .await
        .is_ok());
}

/// `GW_SECRET_KEY` of the PostgreSQL test: 32 bytes in base64.
const PG_SECRET_KEY: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";

/// The same over HTTP with PostgreSQL (`GW_TEST_POSTGRES_URL`, in a schema of its own): the
/// pool lives on the control plane's runtime while Pingora's runtimes serve the requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_plane_runs_on_postgres() {
    use sqlx::Connection;
    let Some(server) = std::env::var("GW_TEST_POSTGRES_URL")
        .ok()
        .filter(|s| !s.is_empty())
    else {
        eprintln!("the_control_plane_runs_on_postgres: skipped (GW_TEST_POSTGRES_URL is unset)");
        return;
    };
    sqlx::any::install_default_drivers();
    let schema = format!("gwtest_gateway_{}", std::process::id());
    let run = |sql: String| {
        let server = server.clone();
        async move {
            let mut conn = sqlx::AnyConnection::connect(&server)
                .await
                .unwrap_or_else(|e| panic!("GW_TEST_POSTGRES_URL is set but unreachable: {e}"));
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&mut conn)
                .await
                .expect("schema statement");
            conn.close().await.ok();
        }
    };
    run(format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).await;
    run(format!("CREATE SCHEMA {schema}")).await;
    let sep = if server.contains('?') { '&' } else { '?' };
    let overrides = Overrides {
        database_url: Some(format!("{server}{sep}options=-c%20search_path%3D{schema}")),
        bootstrap_admin_key: Some(Secret(ADMIN_KEY.into())),
        secret_key: Some(Secret(PG_SECRET_KEY.into())),
        ..Overrides::default()
    };
    let config = GatewayConfig::from_yaml(
        &format!("listen: {}\nthreads: 2\n", free_local_addr()),
        &overrides,
    )
    .unwrap();
    // Without GW_SECRET_KEY a PostgreSQL database is refused at start, saying why.
    let mut keyless = config.clone();
    keyless.secret_key = None;
    let err = Gateway::new(keyless)
        .err()
        .expect("refused without a secret key");
    assert_eq!(err.0[0].path, "GW_SECRET_KEY", "{err}");
    assert!(
        err.0[0]
            .message
            .contains("required with a PostgreSQL database"),
        "{err}"
    );
    let gw = Gateway::new(config).expect("starts on PostgreSQL");
    let running = tokio::task::spawn_blocking(move || gateway::server::spawn(gw))
        .await
        .unwrap();
    let client = reqwest::Client::new();
    let mut ids = Vec::new();
    for i in 0..5 {
        let resp = client
            .post(format!("{}/v1/admin/workspaces", running.url()))
            .header("x-gw-api-key", ADMIN_KEY)
            .json(&json!({"name": format!("pg {i}")}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let body: Value = resp.json().await.unwrap();
        ids.push(body["id"].as_str().unwrap().to_owned());
    }
    let list: Value = client
        .get(format!("{}/v1/admin/workspaces", running.url()))
        .header("x-gw-api-key", ADMIN_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["total"], 6, "{list}");
    // A provider secret is stored (encrypted with GW_SECRET_KEY) and shown masked.
    let resp = client
        .post(format!("{}/v1/integrations", running.url()))
        .header("x-gw-api-key", ADMIN_KEY)
        .json(&json!({"name": "pg", "ai_provider_id": "openai", "key": "sk-on-postgres-1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let got: Value = client
        .get(format!("{}/v1/integrations/pg", running.url()))
        .header("x-gw-api-key", ADMIN_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(got["masked_key"], "sk*******-1", "{got}");
    assert!(running.gateway.providers.provider("pg").is_some());
    drop(running);
    run(format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).await;
}

/// The control plane's OpenAPI document is served through the gateway's listener, without a key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_is_served_on_the_listener() {
    let env = Env::start().await;
    let resp = env
        .bare
        .get(env.url("/v1/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/json");
    let doc: Value = resp.json().await.unwrap();
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3."),
        "{}",
        doc["openapi"]
    );
    let update = &doc["paths"]["/v1/policies/rate-limits/{id}"]["put"];
    assert!(
        update.is_object(),
        "no rate limits policy update in {}",
        doc["paths"]
    );
    assert_eq!(
        doc["paths"]["/v1/chat/completions"],
        Value::Null,
        "provider routes are not the control plane's"
    );
}

/// Every path of the reference control plane is the control plane's: one not built yet is a 404
/// in the control plane's shape naming the path, never a provider request, even for a key
/// whose default config would route it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_plane_paths_never_reach_a_provider() {
    let env = Env::start().await;
    let (status, made) = env
        .admin_call(
            reqwest::Method::POST,
            "/v1/configs",
            Some(ADMIN_KEY),
            Some(serde_json::json!({"name": "Default", "config": {"provider": "@mock"}})),
        )
        .await;
    assert_eq!(status, 200, "{made}");
    let ws = env.default_workspace().await;
    let (key, _) = env
        .workspace_key(
            &ws,
            serde_json::json!({"defaults": {"config_id": made["id"]}}),
        )
        .await;
    for (method, path) in [
        (reqwest::Method::GET, "/v1/analytics/graphs/requests"),
        (reqwest::Method::POST, "/v1/feedback"),
        (reqwest::Method::GET, "/v1/mcp-servers/s-1/metadata"),
        (reqwest::Method::GET, "/v1/mcp-integrations"),
        (reqwest::Method::POST, "/v1/prompts/p-1/completions"),
    ] {
        for credential in [ADMIN_KEY, key.as_str()] {
            let (status, body) = env
                .admin_call(method.clone(), path, Some(credential), None)
                .await;
            assert_eq!(status, 404, "{method} {path}: {body}");
            assert_eq!(body["success"], false, "{body}");
            assert!(
                body["data"]["message"].as_str().unwrap().contains(path),
                "{body}"
            );
        }
    }
    assert!(env.mock.requests().is_empty(), "nothing reached a provider");
}
