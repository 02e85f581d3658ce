//! The control plane's sink, as the data plane's plugins use it: settled usage charged to keys,
//! workspace budgets, providers and policy entities (period rollover, reset epochs, exhausted
//! and reactivated by raising the limit), audit events, and from another runtime through a
//! running control plane.

use std::time::{Duration, SystemTime};

use admin::{BootstrapOptions, ControlPlane, Options, StoreSink};
use plugin_sdk::access::{KeyStatus, UsageLimit};
use plugin_sdk::sinks::{AuditEvent, ControlPlaneSink, LogRecord, UsageCharge};
use plugin_sdk::store::ProviderStore;
use plugin_sdk::AccessStore;
use serde_json::{json, Value};
use sqlx::Row;

use crate::common::{digest, App, TestDb, ADMIN_KEY};
use crate::integrations::{app_with_key, create_integration, TEST_SECRET_KEY};

fn sink(app: &App) -> StoreSink {
    StoreSink::new(app.store.clone(), tokio::runtime::Handle::current())
}

fn charge(budget_id: &str, value_key: &str, amount: f64, period: i64, epoch: i64) -> UsageCharge {
    UsageCharge {
        budget_id: budget_id.into(),
        value_key: value_key.into(),
        amount,
        period,
        reset_epoch: epoch,
    }
}

async fn ok(app: &App, method: &str, path: &str, body: Option<Value>) -> Value {
    let (status, got) = app.admin(method, path, body).await;
    assert_eq!(status, 200, "{method} {path}: {got}");
    got
}

/// The stored (usage, period, epoch, status) of a row.
async fn stored(app: &App, sql: &str, key: &str) -> (f64, i64, i64, String) {
    let r = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
        .bind(key.to_owned())
        .fetch_one(app.store.db().pool())
        .await
        .expect("a row");
    (
        r.try_get(0).unwrap(),
        r.try_get(1).unwrap(),
        r.try_get(2).unwrap(),
        r.try_get(3).unwrap(),
    )
}

const KEY_ROW: &str =
    "SELECT current_usage, usage_period, reset_epoch, status FROM api_keys WHERE id = $1";

async fn key_charges_follow_periods_and_epochs(db: TestDb) {
    let app = App::start(db).await;
    let sink = sink(&app);
    let published = app.store.published();
    let (id, raw) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/workspace/service",
            json!({"name": "svc", "workspace_id": "default", "scopes": ["completions.write"],
                   "usage_limits": {"credit_limit": 10, "periodic_reset": "monthly"}}),
        )
        .await;
    let budget = format!("api_key:{id}");
    let limit: UsageLimit = published
        .api_key(&digest(&raw))
        .unwrap()
        .usage_limits
        .clone()
        .unwrap();
    let now = limit.period_at(SystemTime::now());
    let path = format!("/v1/api-keys/{id}");

    // Last month's spend exhausts the key in its period...
    sink.charge_usage(vec![charge(&budget, "", 11.0, now - 1, 0)])
        .await
        .unwrap();
    assert_eq!(
        stored(&app, KEY_ROW, &id).await,
        (11.0, now - 1, 0, "exhausted".into())
    );
    // ...which has elapsed: the API shows it as spent nothing, active.
    let got = ok(&app, "GET", &path, None).await;
    assert_eq!(
        (&got["status"], &got["usage_limits"]["current_usage"]),
        (&json!("active"), &json!(0.0))
    );
    // This month's first charge starts the usage over; two charges of one batch add up.
    sink.charge_usage(vec![
        charge(&budget, "", 2.0, now, 0),
        charge(&budget, "", 1.5, now, 0),
    ])
    .await
    .unwrap();
    assert_eq!(
        stored(&app, KEY_ROW, &id).await,
        (3.5, now, 0, "active".into())
    );
    // A late charge of last month is dropped.
    sink.charge_usage(vec![charge(&budget, "", 100.0, now - 1, 0)])
        .await
        .unwrap();
    assert_eq!(stored(&app, KEY_ROW, &id).await.0, 3.5);

    // A manual reset: usage 0 in epoch 1; charges counted before it are dropped.
    ok(&app, "PUT", &path, Some(json!({"reset_usage": true}))).await;
    assert_eq!(
        stored(&app, KEY_ROW, &id).await,
        (0.0, now, 1, "active".into())
    );
    let report = app
        .store
        .apply_usage_charges(&[
            charge(&budget, "", 4.0, now, 0),
            charge(&budget, "", 6.0, now, 1),
        ])
        .await
        .unwrap();
    assert_eq!((report.applied, report.dropped), (1, 1));
    assert_eq!(stored(&app, KEY_ROW, &id).await.0, 6.0);

    // Reaching the limit exhausts the key; raising the limit above the usage reactivates it
    // at once, in the API and the snapshot.
    sink.charge_usage(vec![charge(&budget, "", 4.0, now, 1)])
        .await
        .unwrap();
    assert_eq!(
        stored(&app, KEY_ROW, &id).await,
        (10.0, now, 1, "exhausted".into())
    );
    let got = ok(&app, "GET", &path, None).await;
    assert_eq!(got["status"], "exhausted");
    assert_eq!(got["usage_limits"]["current_usage"], 10.0);
    ok(
        &app,
        "PUT",
        &path,
        Some(json!({"usage_limits": {"credit_limit": 25, "periodic_reset": "monthly"}})),
    )
    .await;
    assert_eq!(
        stored(&app, KEY_ROW, &id).await,
        (10.0, now, 1, "active".into())
    );
    let k = published.api_key(&digest(&raw)).unwrap();
    assert_eq!(k.status, KeyStatus::Active);
    assert_eq!((k.counted.current_usage, k.counted.reset_epoch), (10.0, 1));
    assert_eq!(k.usage_limits.as_ref().unwrap().credit_limit, 25.0);
    // Lowering it to the usage exhausts it again.
    ok(
        &app,
        "PUT",
        &path,
        Some(json!({"usage_limits": {"credit_limit": 10, "periodic_reset": "monthly"}})),
    )
    .await;
    assert_eq!(stored(&app, KEY_ROW, &id).await.3, "exhausted");
    assert_eq!(
        published.api_key(&digest(&raw)).unwrap().status,
        KeyStatus::Exhausted
    );

    // Unknown, malformed and JWT budgets are skipped, not errors.
    let report = app
        .store
        .apply_usage_charges(&[
            charge(
                "api_key:00000000-0000-4000-8000-000000000000",
                "",
                1.0,
                now,
                0,
            ),
            charge("nonsense", "", 1.0, now, 0),
            charge(&budget, "", -1.0, now, 1),
            charge(&budget, "", f64::NAN, now, 1),
            charge("jwt:alice:0", "", 1.0, now, 0),
        ])
        .await
        .unwrap();
    assert_eq!(
        (
            report.applied,
            report.dropped,
            report.unknown,
            report.invalid
        ),
        (0, 0, 2, 3)
    );
    assert_eq!(stored(&app, KEY_ROW, &id).await.0, 10.0);
}

const BUDGET_ROW: &str = "SELECT current_usage, usage_period, reset_epoch, status
    FROM workspace_budget_usage WHERE workspace_id = $1 AND budget_index = 0";

async fn workspace_and_provider_budgets(db: TestDb) {
    let app = app_with_key(db).await;
    let sink = sink(&app);
    let published = app.store.published();
    let made = ok(
        &app,
        "POST",
        "/v1/admin/workspaces",
        Some(json!({"name": "Team", "usage_limits": [
            {"credit_limit": 5},
            {"credit_limit": 100, "type": "tokens", "periodic_reset": "weekly"}]})),
    )
    .await;
    let ws = made["id"].as_str().unwrap().to_owned();
    let weekly = published.workspace(&ws).unwrap().usage_limits[1].clone();
    let week = weekly.period_at(SystemTime::now());
    sink.charge_usage(vec![
        charge(&format!("workspace:{ws}:0"), "", 5.0, 0, 0),
        charge(&format!("workspace:{ws}:1"), "", 40.0, week, 0),
    ])
    .await
    .unwrap();
    assert_eq!(
        stored(&app, BUDGET_ROW, &ws).await,
        (5.0, 0, 0, "exhausted".into())
    );
    let got = ok(&app, "GET", &format!("/v1/admin/workspaces/{ws}"), None).await;
    assert_eq!(got["usage_limits"][0]["current_usage"], 5.0);
    assert_eq!(got["usage_limits"][1]["current_usage"], 40.0);
    let report = app
        .store
        .apply_usage_charges(&[charge(&format!("workspace:{ws}:2"), "", 1.0, 0, 0)])
        .await
        .unwrap();
    assert_eq!(report.unknown, 1, "no third budget");

    // Raising the first budget's limit reactivates it at once; the counted usage stays and
    // reaches the snapshot with the change.
    ok(
        &app,
        "PUT",
        &format!("/v1/admin/workspaces/{ws}"),
        Some(json!({"usage_limits": [
            {"credit_limit": 8},
            {"credit_limit": 100, "type": "tokens", "periodic_reset": "weekly"}]})),
    )
    .await;
    assert_eq!(
        stored(&app, BUDGET_ROW, &ws).await,
        (5.0, 0, 0, "active".into())
    );
    let record = published.workspace(&ws).unwrap();
    assert_eq!(record.counted[0].current_usage, 5.0);
    assert_eq!(
        (record.counted[1].current_usage, record.counted[1].period),
        (40.0, week)
    );
    // A shorter list drops the usage of the items past its end.
    ok(
        &app,
        "PUT",
        &format!("/v1/admin/workspaces/{ws}"),
        Some(json!({"usage_limits": [{"credit_limit": 8}]})),
    )
    .await;
    let rows: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM workspace_budget_usage WHERE workspace_id = $1")
            .bind(&ws)
            .fetch_one(app.store.db().pool())
            .await
            .unwrap();
    assert_eq!(rows, 1);
    assert_eq!(published.workspace(&ws).unwrap().counted.len(), 1);

    // A provider's budget, by slug.
    create_integration(
        &app,
        json!({"name": "Base", "slug": "base", "ai_provider_id": "openai", "key": "sk-base-123456",
               "workspace_id": "default", "create_default_provider": false}),
    )
    .await;
    ok(
        &app,
        "POST",
        "/v1/providers",
        Some(
            json!({"name": "Prod", "integration_id": "base", "slug": "prod",
                    "usage_limits": {"credit_limit": 3}}),
        ),
    )
    .await;
    const PROVIDER_ROW: &str =
        "SELECT current_usage, usage_period, reset_epoch, status FROM providers WHERE slug = $1";
    sink.charge_usage(vec![charge("provider:prod", "", 3.25, 0, 0)])
        .await
        .unwrap();
    assert_eq!(
        stored(&app, PROVIDER_ROW, "prod").await,
        (3.25, 0, 0, "exhausted".into())
    );
    let got = ok(&app, "GET", "/v1/providers/prod", None).await;
    assert_eq!(got["status"], "exhausted");
    assert_eq!(got["usage_limits"]["current_usage"], 3.25);
    ok(
        &app,
        "PUT",
        "/v1/providers/prod",
        Some(json!({"usage_limits": {"credit_limit": 4}})),
    )
    .await;
    assert_eq!(stored(&app, PROVIDER_ROW, "prod").await.3, "active");
    ok(
        &app,
        "PUT",
        "/v1/providers/prod",
        Some(json!({"reset_usage": true})),
    )
    .await;
    assert_eq!(
        stored(&app, PROVIDER_ROW, "prod").await,
        (0.0, 0, 1, "active".into())
    );
    let report = app
        .store
        .apply_usage_charges(&[charge("provider:prod", "", 1.0, 0, 0)])
        .await
        .unwrap();
    assert_eq!(report.dropped, 1, "counted before the reset");
}

async fn policy_entities_by_period_and_epoch(db: TestDb) {
    let app = App::start(db).await;
    let sink = sink(&app);
    let made = ok(
        &app,
        "POST",
        "/v1/policies/usage-limits",
        Some(
            json!({"workspace_id": "default", "conditions": [{"key": "workspace_id", "value": "*"}],
                    "group_by": [{"key": "metadata._user"}], "type": "cost", "credit_limit": 10,
                    "periodic_reset": "monthly"}),
        ),
    )
    .await;
    let id = made["id"].as_str().unwrap().to_owned();
    let budget = format!("policy:{id}");
    let policy = app.store.published().usage_limit_policies()[0].clone();
    let now = policy.limit.period_at(SystemTime::now());
    let path = format!("/v1/policies/usage-limits/{id}");
    sink.charge_usage(vec![
        charge(&budget, "metadata._user:alice", 4.0, now, 0),
        charge(&budget, "metadata._user:bob", 12.0, now - 1, 0),
        charge(&budget, "metadata._user:carol", 10.0, now, 0),
    ])
    .await
    .unwrap();
    // Bob spent last month: his usage shows as 0 and he is active; carol is exhausted.
    let got = ok(&app, "GET", &format!("{path}?include_usage=true"), None).await;
    assert_eq!(
        got["value_key_usage_map"],
        json!({
            "metadata._user:alice": {"current_usage": 4.0, "status": "active"},
            "metadata._user:bob": {"current_usage": 0.0, "status": "active"},
            "metadata._user:carol": {"current_usage": 10.0, "status": "exhausted"},
        })
    );
    let list = ok(
        &app,
        "GET",
        &format!("{path}/entities?status=exhausted"),
        None,
    )
    .await;
    assert_eq!(list["total"], 1, "{list}");
    assert_eq!(list["data"][0]["value_key"], "metadata._user:carol");
    let list = ok(&app, "GET", &format!("{path}/entities?status=active"), None).await;
    assert_eq!(list["total"], 2, "{list}");

    // Raising the limit reactivates carol at once.
    ok(&app, "PUT", &path, Some(json!({"credit_limit": 12}))).await;
    let got = ok(&app, "GET", &format!("{path}?include_usage=true"), None).await;
    assert_eq!(
        got["value_key_usage_map"]["metadata._user:carol"],
        json!({"current_usage": 10.0, "status": "active"})
    );
    // Bob's old usage was dropped by the restatement: this month starts at zero.
    sink.charge_usage(vec![charge(&budget, "metadata._user:bob", 1.0, now, 0)])
        .await
        .unwrap();
    let got = ok(&app, "GET", &format!("{path}?include_usage=true"), None).await;
    assert_eq!(
        got["value_key_usage_map"]["metadata._user:bob"]["current_usage"],
        1.0
    );

    // An entity reset starts epoch 1: charges of epoch 0 are dropped.
    ok(
        &app,
        "PUT",
        &format!("{path}/entities/metadata._user:alice/reset"),
        None,
    )
    .await;
    let report = app
        .store
        .apply_usage_charges(&[
            charge(&budget, "metadata._user:alice", 3.0, now, 0),
            charge(&budget, "metadata._user:alice", 2.0, now, 1),
            charge(&budget, "", 2.0, now, 1),
        ])
        .await
        .unwrap();
    assert_eq!((report.applied, report.dropped, report.invalid), (1, 1, 1));
    let got = ok(&app, "GET", &format!("{path}?include_usage=true"), None).await;
    assert_eq!(
        got["value_key_usage_map"]["metadata._user:alice"]["current_usage"],
        2.0
    );

    // An archived policy is charged no more.
    ok(&app, "DELETE", &path, None).await;
    let report = app
        .store
        .apply_usage_charges(&[charge(&budget, "metadata._user:alice", 1.0, now, 1)])
        .await
        .unwrap();
    assert_eq!(report.unknown, 1);
}

/// Batches sent at once by several writers (several gateway instances) lose no charge and do
/// not deadlock, whatever order their budgets come in.
async fn concurrent_charges_add_up(db: TestDb) {
    let app = App::start(db).await;
    let (key, _) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/workspace/service",
            json!({"name": "svc", "workspace_id": "default", "scopes": ["completions.write"],
                   "usage_limits": {"credit_limit": 1000}}),
        )
        .await;
    let ws = ok(
        &app,
        "POST",
        "/v1/admin/workspaces",
        Some(json!({"name": "Team", "usage_limits": [{"credit_limit": 1000}]})),
    )
    .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let policy = ok(
        &app,
        "POST",
        "/v1/policies/usage-limits",
        Some(
            json!({"workspace_id": "default", "conditions": [{"key": "workspace_id", "value": "*"}],
                    "group_by": [{"key": "metadata._user"}], "type": "cost", "credit_limit": 1000}),
        ),
    )
    .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let budgets = [
        (format!("api_key:{key}"), String::new()),
        (format!("workspace:{ws}:0"), String::new()),
        (
            format!("policy:{policy}"),
            "metadata._user:alice".to_owned(),
        ),
    ];
    let mut tasks = Vec::new();
    for writer in 0..8usize {
        let sink = sink(&app);
        let mut batch: Vec<UsageCharge> = Vec::new();
        for round in 0..5usize {
            // Each writer lists the budgets in another order.
            for i in 0..budgets.len() {
                let (id, vk) = &budgets[(i + writer + round) % budgets.len()];
                batch.push(charge(id, vk, 0.5, 0, 0));
            }
        }
        tasks.push(tokio::spawn(async move {
            for chunk in batch.chunks(3) {
                sink.charge_usage(chunk.to_vec()).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // 8 writers x 5 rounds x 0.5.
    assert_eq!(stored(&app, KEY_ROW, &key).await.0, 20.0);
    assert_eq!(stored(&app, BUDGET_ROW, &ws).await.0, 20.0);
    let got = ok(
        &app,
        "GET",
        &format!("/v1/policies/usage-limits/{policy}?include_usage=true"),
        None,
    )
    .await;
    assert_eq!(
        got["value_key_usage_map"]["metadata._user:alice"]["current_usage"],
        20.0
    );
}

const AUDIT_ALL: &str =
    "/v1/audit-logs?start_time=2000-01-01T00:00:00Z&end_time=2999-01-01T00:00:00Z";

async fn audit_events_are_recorded(db: TestDb) {
    let app = App::start(db).await;
    let sink = sink(&app);
    let ws = app.workspace("Team").await;
    sink.audit(vec![
        AuditEvent {
            action: "auth.jwt_rejected".into(),
            resource_type: "jwt".into(),
            resource_id: None,
            organisation_id: None,
            workspace_id: None,
            user_id: None,
            method: "POST".into(),
            uri: "/v1/chat/completions".into(),
            request_id: "trace-1".into(),
            status: 401,
            client_ip: Some("10.0.0.7".into()),
            details: json!({"reason": "expired", "token": "eyJ.secret.sig"}),
        },
        AuditEvent {
            action: "usage_limits.alert".into(),
            resource_type: "api_key".into(),
            resource_id: Some("key-1".into()),
            organisation_id: Some(app.org.clone()),
            workspace_id: Some(ws.clone()),
            user_id: None,
            method: "POST".into(),
            uri: "/v1/chat/completions".into(),
            request_id: String::new(),
            status: 200,
            client_ip: None,
            details: json!({"usage": 8.5, "alert_threshold": 8}),
        },
    ])
    .await
    .unwrap();
    let got = ok(
        &app,
        "GET",
        &format!("{AUDIT_ALL}&action=auth.jwt_rejected"),
        None,
    )
    .await;
    assert_eq!(got["total"], 1, "{got}");
    let r = &got["records"][0];
    assert_eq!(
        r["organisation_id"],
        app.org.as_str(),
        "the bootstrap organisation"
    );
    assert_eq!(r["user_type"], "jwt");
    assert_eq!(r["resource_type"], "jwt");
    assert_eq!(r["response_status_code"], 401);
    assert_eq!(r["request_id"], "trace-1");
    assert_eq!(r["client_ip"], "10.0.0.7");
    assert_eq!(r["uri"], "/v1/chat/completions");
    assert_eq!(
        r["request_body"],
        json!({"reason": "expired", "token": "[REDACTED]"})
    );
    let got = ok(
        &app,
        "GET",
        &format!("{AUDIT_ALL}&workspace_id={ws}&action=usage_limits.alert"),
        None,
    )
    .await;
    assert_eq!(got["total"], 1, "{got}");
    let r = &got["records"][0];
    assert_eq!(r["user_type"], "system");
    assert_eq!(r["api_key_id"], "key-1");
    assert_eq!(r["resource_id"], "key-1");
    assert!(!r["request_id"].as_str().unwrap().is_empty());
    assert_eq!(r["request_body"]["usage"], 8.5);
}

/// `ControlPlane::sink` runs the database work on the control plane's runtime, whatever
/// runtime calls it; once the control plane is dropped, calls fail instead of hanging.
async fn the_running_control_plane_sink(db: TestDb) {
    let mut options = Options::new(db.url.clone());
    options.bootstrap = BootstrapOptions {
        admin_key: Some(ADMIN_KEY.into()),
        ..BootstrapOptions::default()
    };
    options.secret_key = Some(TEST_SECRET_KEY.into());
    let cp = ControlPlane::start(options).expect("starts");
    let sink = cp.sink();
    // A runtime of the caller's own, as Pingora's would be.
    let caller = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let from_elsewhere = sink.clone();
    let written = std::thread::spawn(move || {
        caller.block_on(async move {
            from_elsewhere
                .write_logs(vec![LogRecord {
                    id: uuid::Uuid::new_v4().to_string(),
                    trace_id: "t-1".into(),
                    route: "chat.completions".into(),
                    method: "POST".into(),
                    path: "/v1/chat/completions".into(),
                    status: 200,
                    ..LogRecord::default()
                }])
                .await
        })
    })
    .join()
    .unwrap();
    assert_eq!(written, Ok(()));
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM request_logs WHERE trace_id = 't-1'")
        .fetch_one(cp.store().db().pool())
        .await
        .unwrap();
    assert_eq!(n, 1);
    drop(cp);
    let late = tokio::time::timeout(
        Duration::from_secs(5),
        sink.charge_usage(vec![charge("api_key:x", "", 1.0, 0, 0)]),
    )
    .await
    .expect("answers at once");
    assert!(
        late.unwrap_err().contains("stopped"),
        "a stopped control plane says so"
    );
}

/// The usage of a budget an integration sets on a workspace: (usage, status).
async fn integration_usage(app: &App, integration: &str, ws: &str, index: i64) -> (f64, String) {
    stored_integration_usage(app, integration, ws, index)
        .await
        .expect("a usage row")
}

async fn stored_integration_usage(
    app: &App,
    integration: &str,
    ws: &str,
    index: i64,
) -> Option<(f64, String)> {
    let r = sqlx::query(
        "SELECT current_usage, status FROM integration_budget_usage
         WHERE integration_id = $1 AND workspace_id = $2 AND budget_index = $3",
    )
    .bind(integration.to_owned())
    .bind(ws.to_owned())
    .bind(index)
    .fetch_optional(app.store.db().pool())
    .await
    .expect("a query");
    r.map(|r| (r.try_get(0).unwrap(), r.try_get(1).unwrap()))
}

/// Budgets an organisation integration sets on a workspace (its own access, else the global
/// access's) reach the snapshot's providers with their counter ids, are charged to a usage row
/// per (integration, workspace, budget), and that usage seeds the next snapshot.
async fn integration_budgets(db: TestDb) {
    let app = app_with_key(db).await;
    let published = app.store.published();
    let made = create_integration(
        &app,
        json!({"name": "Base", "slug": "base", "ai_provider_id": "openai",
               "key": "sk-base-123456789", "create_default_provider": false}),
    )
    .await;
    let integration = made["id"].as_str().unwrap().to_owned();
    let ws = app.default_ws.clone();
    ok(
        &app,
        "PUT",
        "/v1/integrations/base/workspaces",
        Some(json!({"workspaces": [{"id": ws, "enabled": true,
            "usage_limits": [{"type": "tokens", "credit_limit": 10}],
            "rate_limits": [{"type": "requests", "unit": "rpm", "value": 5}]}]})),
    )
    .await;
    ok(
        &app,
        "POST",
        "/v1/providers",
        Some(json!({"name": "p", "slug": "p", "integration_id": "base", "workspace_id": ws})),
    )
    .await;
    let id = format!("integration:{integration}:{ws}:0");
    let limits = published.provider("p").unwrap().integration_limits.clone();
    let limits = limits.expect("the workspace's limits");
    assert_eq!(limits.rate_limits[0].id, id);
    assert_eq!(limits.rate_limits[0].limit.value, 5.0);
    assert_eq!(limits.budgets[0].id, id);
    assert_eq!(limits.budgets[0].limit.credit_limit, 10.0);

    let report = app
        .store
        .apply_usage_charges(&[charge(&id, "", 4.0, 0, 0), charge(&id, "", 6.0, 0, 0)])
        .await
        .unwrap();
    assert_eq!(report.applied, 2);
    assert_eq!(
        integration_usage(&app, &integration, &ws, 0).await,
        (10.0, "exhausted".into())
    );
    crate::common::rebuild(&app).await;
    let limits = published.provider("p").unwrap().integration_limits.clone();
    assert_eq!(limits.unwrap().budgets[0].counted.current_usage, 10.0);
    let listed = ok(&app, "GET", "/v1/integrations/base/workspaces", None).await;
    let shown = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["id"] == json!(ws))
        .unwrap()
        .clone();
    assert_eq!(shown["usage_limits"][0]["current_usage"], 10.0, "{shown}");
    let report = app
        .store
        .apply_usage_charges(&[charge(
            &format!("integration:{integration}:{ws}:1"),
            "",
            1.0,
            0,
            0,
        )])
        .await
        .unwrap();
    assert_eq!(report.unknown, 1, "no second budget");

    // Another workspace, reached through global access, gets the global limits, counted apart.
    let other = app.workspace("Other").await;
    ok(
        &app,
        "PUT",
        "/v1/integrations/base/workspaces",
        Some(
            json!({"workspaces": [], "global_workspace_access": {"enabled": true,
            "usage_limits": [{"type": "tokens", "credit_limit": 3}], "rate_limits": []}}),
        ),
    )
    .await;
    ok(
        &app,
        "POST",
        "/v1/providers",
        Some(json!({"name": "q", "slug": "q", "integration_id": "base", "workspace_id": other})),
    )
    .await;
    let limits = published.provider("q").unwrap().integration_limits.clone();
    let limits = limits.expect("the global limits");
    let other_id = format!("integration:{integration}:{other}:0");
    assert_eq!(limits.budgets[0].id, other_id);
    assert_eq!(limits.budgets[0].limit.credit_limit, 3.0);
    assert!(limits.rate_limits.is_empty());
    app.store
        .apply_usage_charges(&[charge(&other_id, "", 2.0, 0, 0)])
        .await
        .unwrap();
    assert_eq!(
        integration_usage(&app, &integration, &other, 0).await,
        (2.0, "active".into())
    );
    assert_eq!(integration_usage(&app, &integration, &ws, 0).await.0, 10.0);

    let access = |workspaces: Value| {
        ok(
            &app,
            "PUT",
            "/v1/integrations/base/workspaces",
            Some(json!({ "workspaces": workspaces })),
        )
    };
    // A workspace of its own with no budgets listed still gets the global ones: its usage stays.
    access(json!([{"id": other, "enabled": true, "usage_limits": [], "rate_limits": []}])).await;
    let limits = published.provider("q").unwrap().integration_limits.clone();
    assert_eq!(limits.unwrap().budgets[0].limit.credit_limit, 3.0);
    assert_eq!(
        integration_usage(&app, &integration, &other, 0).await.0,
        2.0
    );
    // Budgets of its own instead of the global ones: its usage starts over.
    access(json!([{"id": other, "enabled": true,
                   "usage_limits": [{"type": "tokens", "credit_limit": 50}]}]))
    .await;
    assert_eq!(
        stored_integration_usage(&app, &integration, &other, 0).await,
        None
    );
    // A longer list of the same workspace's own budgets: the first keeps its usage, restated
    // against its new limit (active again below it).
    access(json!([{"id": ws, "enabled": true, "usage_limits": [
        {"type": "tokens", "credit_limit": 20}, {"type": "tokens", "credit_limit": 5}]}]))
    .await;
    assert_eq!(
        integration_usage(&app, &integration, &ws, 0).await,
        (10.0, "active".into())
    );
    // Charges of a workspace deleted since are skipped, not errors (they would hold up every
    // other charge of their batch).
    let third = app.workspace("Third").await;
    ok(
        &app,
        "DELETE",
        &format!("/v1/admin/workspaces/{third}"),
        Some(json!({"force_delete": true})),
    )
    .await;
    let report = app
        .store
        .apply_usage_charges(&[
            charge(
                &format!("integration:{integration}:{third}:0"),
                "",
                1.0,
                0,
                0,
            ),
            charge(&id, "", 1.0, 0, 0),
        ])
        .await
        .unwrap();
    assert_eq!((report.unknown, report.applied), (1, 1));
    assert_eq!(integration_usage(&app, &integration, &ws, 0).await.0, 11.0);
}

crate::on_both_databases!(
    integration_budgets,
    key_charges_follow_periods_and_epochs,
    workspace_and_provider_budgets,
    policy_entities_by_period_and_epoch,
    concurrent_charges_add_up,
    audit_events_are_recorded,
    the_running_control_plane_sink,
);
