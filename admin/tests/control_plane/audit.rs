//! The audit log: a record for every write, with who, what, where from and the body with its
//! secrets redacted; none for a write that failed; the reference's filters; calls refused with
//! 401 or 403 recorded as `refused` without the presented key, bounded per second.

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
    let refused_before = app.refused_count().await;
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
    // The refused caller is recorded as such, and only the refusal.
    assert_eq!(app.refused_count().await, refused_before + 1);
}

/// The key stored as a workspace service key with no scopes; returns (id, raw key).
async fn scopeless_key(app: &App) -> (String, String) {
    app.key(
        ADMIN_KEY,
        "/v1/api-keys/workspace/service",
        json!({"name": "scopeless", "workspace_id": "default", "scopes": []}),
    )
    .await
}

async fn refused_calls_are_recorded_without_the_key(db: TestDb) {
    let app = App::start(db).await;
    let (weak_id, weak) = scopeless_key(&app).await;
    let (expired_id, expired) = scopeless_key(&app).await;
    app.sql(
        "UPDATE api_keys SET expires_at = '2001-01-01T00:00:00.000000Z' WHERE id = $1",
        &[expired_id.as_str()],
    )
    .await;
    const UNKNOWN: &str = "sk-unknown-key-that-nobody-has-0001";

    // No key, an unknown key, an expired key: 401; a key without the right: 403.
    let (status, _) = app
        .call("GET", "/v1/api-keys?page_size=5", None, None)
        .await;
    assert_eq!(status, 401);
    let (status, _) = app
        .call(
            "POST",
            "/v1/configs?api_key=sk-in-the-query-77",
            Some(UNKNOWN),
            Some(json!({"name": "c", "config": {}, "key": "sk-in-the-body-88"})),
        )
        .await;
    assert_eq!(status, 401);
    let (status, _) = app
        .call("GET", "/v1/admin/workspaces", Some(&expired), None)
        .await;
    assert_eq!(status, 401);
    let (status, body) = app
        .call(
            "POST",
            "/v1/admin/workspaces",
            Some(&weak),
            Some(json!({"name": "nope"})),
        )
        .await;
    assert_eq!(status, 403, "{body}");
    // Answers other than 401 and 403 are not refusals.
    let (status, _) = app.admin("GET", "/v1/admin/workspaces/nowhere", None).await;
    assert_eq!(status, 404);
    let (status, _) = app.call("GET", "/v1/nothing-here", None, None).await;
    assert_eq!(status, 404);

    let log = audit(&app, "action=refused").await;
    assert_eq!(log["total"], 4, "{log}");
    let records = log["records"].as_array().unwrap();
    // Newest first.
    let (forbidden, expired_rec, unknown, missing) =
        (&records[0], &records[1], &records[2], &records[3]);
    for r in records {
        assert_eq!(r["action"], "refused", "{r}");
        assert_eq!(r["organisation_id"], app.org.as_str(), "{r}");
        assert_eq!(r["client_ip"], CLIENT_IP.to_string(), "{r}");
        assert!(
            r["request_id"].as_str().is_some_and(|s| !s.is_empty()),
            "{r}"
        );
        assert!(r["request_body"]["reason"].is_string(), "{r}");
    }

    assert_eq!(missing["response_status_code"], 401);
    assert_eq!(missing["method"], "GET");
    assert_eq!(missing["uri"], "/v1/api-keys?page_size=5");
    assert_eq!(missing["resource_type"], "api_key");
    assert_eq!(missing["user_type"], "anonymous");
    assert_eq!(missing["api_key_id"], Value::Null);
    assert!(
        missing["request_body"]["reason"]
            .as_str()
            .unwrap()
            .starts_with("missing API key"),
        "{missing}"
    );

    // An unknown key: under the bootstrap organisation, nothing of what was sent kept.
    assert_eq!(unknown["response_status_code"], 401);
    assert_eq!(unknown["resource_type"], "config");
    assert_eq!(unknown["user_type"], "anonymous");
    assert_eq!(unknown["api_key_id"], Value::Null);
    assert_eq!(unknown["workspace_id"], Value::Null);
    assert_eq!(unknown["uri"], "/v1/configs?api_key=[REDACTED]");
    assert_eq!(
        unknown["request_body"],
        json!({"reason": "invalid API key"})
    );

    // An expired key is known: named by its id, with its workspace.
    assert_eq!(expired_rec["response_status_code"], 401);
    assert_eq!(expired_rec["api_key_id"], expired_id.as_str());
    assert_eq!(expired_rec["workspace_id"], app.default_ws.as_str());
    assert_eq!(expired_rec["user_type"], "api_key");
    assert_eq!(expired_rec["user_id"], app.owner.as_str(), "its creator");
    assert_eq!(expired_rec["resource_type"], "workspace");
    assert_eq!(
        expired_rec["request_body"],
        json!({"reason": "the API key has expired"})
    );

    // A known key without the right.
    assert_eq!(forbidden["response_status_code"], 403);
    assert_eq!(forbidden["method"], "POST");
    assert_eq!(forbidden["uri"], "/v1/admin/workspaces");
    assert_eq!(forbidden["api_key_id"], weak_id.as_str());
    assert_eq!(forbidden["workspace_id"], app.default_ws.as_str());
    assert_eq!(forbidden["resource_type"], "workspace");
    assert_eq!(
        forbidden["request_body"]["reason"], body["data"]["message"],
        "why, as the caller was told"
    );

    // Filters work on them as on any record.
    assert_eq!(
        audit(&app, "action=refused&response_status_code=401").await["total"],
        3
    );
    assert_eq!(
        audit(&app, "action=refused&user_type=anonymous").await["total"],
        2
    );
    // No presented key, and nothing else the refused callers sent, is stored anywhere.
    let rows: Vec<(String, String, Option<String>)> =
        sqlx::query_as("SELECT id, uri, request_body FROM audit_logs")
            .fetch_all(app.store.db().pool())
            .await
            .unwrap();
    let stored = format!("{rows:?}");
    for secret in [
        UNKNOWN,
        weak.as_str(),
        expired.as_str(),
        "sk-in-the-query-77",
        "sk-in-the-body-88",
    ] {
        assert!(!stored.contains(secret), "{secret} is stored");
    }
    let hashes = admin::keys::hash(UNKNOWN);
    assert!(!stored.contains(&hashes), "nor its hash");
    // Nor are they changes.
    let writes = audit(&app, "").await["total"].as_i64().unwrap();
    assert_eq!(writes - 4, app.audit_count().await);
}

/// A flood of refusals leaves at most `N` records a second one by one; the rest are counted
/// and summarised (one record per status once their second is over), so that the records and
/// the summaries account for every refusal.
async fn refused_records_are_bounded_and_summarised(db: TestDb) {
    let mut app = App::start(db).await;
    const PER_SECOND: u32 = 3;
    app.router = admin::router_with(
        app.store.clone(),
        admin::RouterOptions {
            refused_records_per_second: PER_SECOND,
            ..admin::RouterOptions::default()
        },
    );
    let (_, weak) = scopeless_key(&app).await;
    const SENT_401: i64 = 40;
    const SENT_403: i64 = 10;
    let started = std::time::Instant::now();
    for i in 0..SENT_401 {
        let (status, _) = app
            .call(
                "GET",
                "/v1/admin/workspaces",
                Some(&format!("sk-flood-{i}")),
                None,
            )
            .await;
        assert_eq!(status, 401);
    }
    for _ in 0..SENT_403 {
        let (status, _) = app
            .call("GET", "/v1/admin/workspaces", Some(&weak), None)
            .await;
        assert_eq!(status, 403);
    }
    let elapsed = started.elapsed().as_secs();

    // One by one: at most N in each second the flood lasted.
    let one_by_one = |status: i64| {
        let app = &app;
        async move {
            audit(
                app,
                &format!("action=refused&resource_type=workspace&response_status_code={status}"),
            )
            .await["total"]
                .as_i64()
                .unwrap()
        }
    };
    let recorded = one_by_one(401).await + one_by_one(403).await;
    let bound = i64::from(PER_SECOND) * (elapsed as i64 + 2);
    assert!(recorded <= bound, "{recorded} records in {elapsed}s");
    assert!(
        recorded >= i64::from(PER_SECOND),
        "the first N are recorded"
    );
    assert!(
        recorded < SENT_401 + SENT_403,
        "the flood was not recorded whole"
    );

    // The summaries arrive once their second is over, and account for the rest.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let summaries = audit(&app, "action=refused&resource_type=control_plane").await;
        let mut summarised = [0i64; 2];
        for r in summaries["records"].as_array().unwrap() {
            assert_eq!(r["user_type"], "system", "{r}");
            assert_eq!(r["organisation_id"], app.org.as_str(), "{r}");
            assert_eq!(r["request_body"]["summary"], true, "{r}");
            assert_eq!(r["request_body"]["records_per_second"], PER_SECOND, "{r}");
            let n = r["request_body"]["refused"].as_i64().unwrap();
            assert!(n > 0, "{r}");
            match r["response_status_code"].as_i64().unwrap() {
                401 => summarised[0] += n,
                403 => summarised[1] += n,
                other => panic!("a summary of status {other}: {r}"),
            }
        }
        if one_by_one(401).await + summarised[0] == SENT_401
            && one_by_one(403).await + summarised[1] == SENT_403
        {
            // One summary per status and second at most.
            let total = summaries["total"].as_i64().unwrap();
            assert!(total <= 2 * (elapsed as i64 + 2), "{summaries}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the summaries do not account for every refusal: {summaries}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

crate::on_both_databases!(
    writes_are_recorded_with_secrets_redacted,
    failed_writes_leave_no_record,
    refused_calls_are_recorded_without_the_key,
    refused_records_are_bounded_and_summarised,
);
