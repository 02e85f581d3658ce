//! The audit log: a record for every write, with who, what, where from and the body with its
//! secrets redacted; none for a write that failed; the reference's filters.

use serde_json::{json, Value};

use crate::common::{App, TestDb, ADMIN_KEY, CLIENT_IP};

const ALL_TIME: &str = "start_time=2000-01-01T00:00:00Z&end_time=2999-01-01T00:00:00Z";

fn code(body: &Value) -> &str {
    body["data"]["errorCode"].as_str().unwrap_or_default()
}

async fn audit(app: &App, filters: &str) -> Value {
    let sep = if filters.is_empty() { "" } else { "&" };
    let (status, body) = app
        .admin(
            "GET",
            &format!("/v1/audit-logs?{ALL_TIME}{sep}{filters}"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    body
}

async fn writes_are_recorded_with_secrets_redacted(db: TestDb) {
    let app = App::start(db).await;
    let (status, ws) = app
        .admin(
            "POST",
            "/v1/admin/workspaces",
            Some(json!({"name": "Audited", "defaults": {"metadata": {"api_key": "sk-live-123", "team": "a"}}})),
        )
        .await;
    assert_eq!(status, 200, "{ws}");
    let ws_id = ws["id"].as_str().unwrap();
    let (key_id, _) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/workspace/service",
            json!({"name": "k", "workspace_id": ws_id, "scopes": []}),
        )
        .await;
    let (status, _) = app
        .admin(
            "PUT",
            &format!("/v1/api-keys/{key_id}"),
            Some(json!({"name": "k2"})),
        )
        .await;
    assert_eq!(status, 200);
    let (status, _) = app
        .admin("POST", &format!("/v1/api-keys/{key_id}/rotate"), None)
        .await;
    assert_eq!(status, 200);
    let (status, _) = app
        .admin("DELETE", &format!("/v1/api-keys/{key_id}"), None)
        .await;
    assert_eq!(status, 200);

    let log = audit(&app, "resource_type=workspace&action=create").await;
    assert_eq!(log["total"], 1, "{log}");
    let r = &log["records"][0];
    assert_eq!(r["method"], "POST");
    assert_eq!(r["uri"], "/v1/admin/workspaces");
    assert_eq!(r["resource_id"], ws_id);
    assert_eq!(r["workspace_id"], ws_id);
    assert_eq!(r["organisation_id"], app.org.as_str());
    assert_eq!(
        r["user_id"],
        app.owner.as_str(),
        "the user behind the admin key"
    );
    assert_eq!(r["api_key_id"], app.admin_key_id.as_str());
    assert_eq!(r["user_type"], "api_key");
    assert_eq!(r["response_status_code"], 200);
    assert_eq!(r["client_ip"], CLIENT_IP.to_string());
    assert!(r["request_id"].as_str().is_some_and(|s| !s.is_empty()));
    assert_eq!(
        r["request_body"]["defaults"]["metadata"],
        json!({"api_key": "[REDACTED]", "team": "a"})
    );
    assert!(!log.to_string().contains("sk-live-123"));
    chrono::DateTime::parse_from_rfc3339(r["timestamp"].as_str().unwrap()).unwrap();

    let log = audit(&app, "resource_type=api_key").await;
    let actions: Vec<&str> = log["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        ["delete", "rotate", "update", "create"],
        "newest first"
    );
    assert!(log["records"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["resource_id"] == key_id.as_str() && r["workspace_id"] == ws_id));

    // Filters.
    assert_eq!(audit(&app, "method=delete").await["total"], 1);
    assert_eq!(
        audit(&app, &format!("workspace_id={ws_id}")).await["total"],
        5
    );
    assert_eq!(audit(&app, "workspace_id=ws-nowhere").await["total"], 0);
    assert_eq!(
        audit(&app, &format!("user_id={}", app.owner)).await["total"],
        5
    );
    assert_eq!(
        audit(&app, "response_status_code=200&action=rotate").await["total"],
        1
    );
    assert_eq!(audit(&app, "uri=/v1/admin/workspaces").await["total"], 1);
    assert_eq!(
        audit(&app, &format!("client_ip={CLIENT_IP}")).await["total"],
        5
    );
    assert_eq!(
        audit(&app, "user_type=system").await["total"],
        1,
        "the bootstrap"
    );
    let page = audit(&app, "page_size=2&current_page=1").await;
    assert_eq!(page["total"], 6);
    assert_eq!(page["records"].as_array().unwrap().len(), 2);
    let none = app
        .admin(
            "GET",
            "/v1/audit-logs?start_time=2999-01-01T00:00:00Z&end_time=2999-01-02T00:00:00Z",
            None,
        )
        .await;
    assert_eq!(none.1["total"], 0);

    for bad in [
        "/v1/audit-logs",
        "/v1/audit-logs?start_time=2000-01-01T00:00:00Z",
        "/v1/audit-logs?start_time=yesterday&end_time=2999-01-01T00:00:00Z",
        "/v1/audit-logs?start_time=2999-01-01T00:00:00Z&end_time=2000-01-01T00:00:00Z",
        &format!("/v1/audit-logs?{ALL_TIME}&page_size=101"),
        &format!("/v1/audit-logs?{ALL_TIME}&response_status_code=9000"),
        &format!("/v1/audit-logs?{ALL_TIME}&colour=red"),
    ] {
        let (status, body) = app.admin("GET", bad, None).await;
        assert_eq!((status, code(&body)), (400, "AB01"), "{bad}: {body}");
    }
    let (status, body) = app
        .call("GET", &format!("/v1/audit-logs?{ALL_TIME}"), None, None)
        .await;
    assert_eq!((status, code(&body)), (401, "AB05"));
}

async fn failed_writes_leave_no_record(db: TestDb) {
    let app = App::start(db).await;
    app.admin(
        "POST",
        "/v1/admin/workspaces",
        Some(json!({"name": "x", "slug": "taken"})),
    )
    .await;
    let before = app.audit_count().await;
    // A conflict raised by the database inside the transaction...
    let (status, _) = app
        .admin(
            "POST",
            "/v1/admin/workspaces",
            Some(json!({"name": "y", "slug": "taken"})),
        )
        .await;
    assert_eq!(status, 409);
    // ...a reference that fails after the workspace row was inserted in the transaction...
    let (status, _) = app
        .admin(
            "POST",
            "/v1/admin/workspaces",
            Some(json!({"name": "z", "slug": "half", "users": [{"id": "7d1f0b1e-8a4c-4f3e-9b1a-2c3d4e5f6a7b", "role": "member"}]})),
        )
        .await;
    assert_eq!(status, 404);
    let (status, _) = app.admin("GET", "/v1/admin/workspaces/half", None).await;
    assert_eq!(status, 404, "the transaction was rolled back whole");
    // ...a refused delete, a validation failure, a refused caller.
    let (_, key) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/workspace/service",
            json!({"name": "k", "workspace_id": "taken", "scopes": []}),
        )
        .await;
    let before_delete = app.audit_count().await;
    assert_eq!(before_delete, before + 1);
    let (status, _) = app
        .admin("DELETE", "/v1/admin/workspaces/taken", None)
        .await;
    assert_eq!(status, 409);
    let (status, _) = app
        .admin(
            "PUT",
            "/v1/admin/workspaces/taken",
            Some(json!({"name": ""})),
        )
        .await;
    assert_eq!(status, 400);
    let (status, _) = app
        .call(
            "PUT",
            "/v1/admin/workspaces/taken",
            Some(&key),
            Some(json!({"name": "mine"})),
        )
        .await;
    assert_eq!(status, 403);
    assert_eq!(app.audit_count().await, before_delete);
}

crate::on_both_databases!(
    writes_are_recorded_with_secrets_redacted,
    failed_writes_leave_no_record,
);
