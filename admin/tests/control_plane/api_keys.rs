//! `/v1/api-keys`: every endpoint's success and error statuses, the raw key shown once and
//! hashed at rest, masking, rotation, expiry, concurrent creation.

use std::time::Duration;

use serde_json::{json, Value};

use crate::common::{App, TestDb, ADMIN_KEY, WS_SCOPES};

fn error_code(body: &Value) -> &str {
    assert_eq!(body["success"], false, "{body}");
    body["data"]["errorCode"].as_str().unwrap_or_default()
}

fn message(body: &Value) -> &str {
    body["data"]["message"].as_str().unwrap_or_default()
}

async fn keys_are_shown_once_and_hashed_at_rest(db: TestDb) {
    let app = App::start(db).await;
    let (status, created) = app
        .admin(
            "POST",
            "/v1/api-keys/workspace/service",
            Some(json!({"name": "svc", "workspace_id": "default", "scopes": WS_SCOPES})),
        )
        .await;
    assert_eq!(status, 200, "{created}");
    assert_eq!(created["object"], "api-key");
    let id = created["id"].as_str().unwrap();
    let raw = created["key"].as_str().unwrap();
    assert_eq!(raw.len(), 43);
    assert_eq!(
        created.as_object().unwrap().len(),
        3,
        "only id, key, object: {created}"
    );

    // At rest: the SHA-256 of the key and its mask; the raw key is in no column.
    let (hash, mask) = app.store.api_key_at_rest(id).await.unwrap().unwrap();
    assert_eq!(hash, admin::keys::hash(raw));
    assert_eq!(mask, format!("{}*******{}", &raw[..2], &raw[41..]));
    let row: String = sqlx::query_scalar(
        "SELECT id || name || key_hash || key_mask || scopes || defaults FROM api_keys WHERE id = $1",
    )
    .bind(id)
    .fetch_one(app.store.db().pool())
    .await
    .unwrap();
    assert!(!row.contains(raw));

    // Reads show the mask only.
    let (status, got) = app.admin("GET", &format!("/v1/api-keys/{id}"), None).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["key"], mask.as_str());
    assert_eq!(got["type"], "workspace-service");
    assert_eq!(got["workspace_id"], app.default_ws.as_str());
    assert_eq!(got["status"], "active");
    assert_eq!(got["object"], "api-key");
    assert_eq!(got["scopes"].as_array().unwrap().len(), WS_SCOPES.len());
    let (status, list) = app.admin("GET", "/v1/api-keys", None).await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["object"], "list");
    assert_eq!(list["total"], 2, "the bootstrap key and this one: {list}");
    let text = list.to_string();
    assert!(!text.contains(raw));
    assert!(!text.contains(ADMIN_KEY));
    for k in list["data"].as_array().unwrap() {
        assert!(k["key"].as_str().unwrap().contains("*******"), "{k}");
    }

    // The key works.
    let (status, own) = app.call("GET", "/v1/api-keys", Some(raw), None).await;
    assert_eq!(status, 200, "{own}");
    assert_eq!(own["total"], 1, "a workspace key sees its workspace: {own}");
}

async fn creation_is_validated(db: TestDb) {
    let app = App::start(db).await;
    let ok = json!({"name": "k", "workspace_id": "default", "scopes": ["configs.read"]});
    let cases: Vec<(&str, Value, u16, &str, &str)> = vec![
        (
            "/v1/api-keys/workspace/service",
            json!({"name": "k", "workspace_id": "default", "scopes": ["configs.read", "configs.fly"]}),
            400,
            "AB01",
            "scopes[1]: unknown scope \"configs.fly\"",
        ),
        (
            "/v1/api-keys/workspace/service",
            json!({"name": "k", "workspace_id": "default", "scopes": [], "colour": "red"}),
            400,
            "AB01",
            "colour: unknown field",
        ),
        (
            "/v1/api-keys/workspace/service",
            json!({"workspace_id": "default", "scopes": []}),
            400,
            "AB01",
            "missing field `name`",
        ),
        (
            "/v1/api-keys/workspace/service",
            json!({"name": "", "workspace_id": "default", "scopes": []}),
            400,
            "AB01",
            "name: must not be empty",
        ),
        (
            "/v1/api-keys/workspace/service",
            json!({"name": "x".repeat(256), "workspace_id": "default", "scopes": []}),
            400,
            "AB01",
            "name: must be at most 255 characters",
        ),
        (
            "/v1/api-keys/workspace/service",
            json!({"name": "k", "scopes": []}),
            400,
            "AB01",
            "workspace_id: is required",
        ),
        (
            "/v1/api-keys/organisation/service",
            json!({"name": "k", "workspace_id": "default", "scopes": []}),
            400,
            "AB01",
            "workspace_id: an admin key belongs to the organisation",
        ),
        (
            "/v1/api-keys/workspace/service",
            json!({"name": "k", "workspace_id": "default", "scopes": ["workspaces.create"]}),
            400,
            "AB01",
            "admin keys only",
        ),
        (
            "/v1/api-keys/workspace/service",
            json!({"name": "k", "workspace_id": "nowhere", "scopes": []}),
            404,
            "AB02",
            "workspace_id: no workspace \"nowhere\"",
        ),
        (
            "/v1/api-keys/workspace/user",
            json!({"name": "k", "workspace_id": "default", "scopes": [], "user_id": "not-a-uuid"}),
            400,
            "AB01",
            "user_id: must be a UUID",
        ),
        (
            "/v1/api-keys/workspace/user",
            json!({"name": "k", "workspace_id": "default", "scopes": [], "user_id": "7d1f0b1e-8a4c-4f3e-9b1a-2c3d4e5f6a7b"}),
            404,
            "AB02",
            "user_id: no user",
        ),
        (
            "/v1/api-keys/workspace/service",
            json!({"name": "k", "workspace_id": "default", "scopes": [], "user_id": "7d1f0b1e-8a4c-4f3e-9b1a-2c3d4e5f6a7b"}),
            400,
            "AB01",
            "user_id: only workspace user keys",
        ),
        (
            "/v1/api-keys/organisation/user",
            ok.clone(),
            400,
            "AB01",
            "unknown key type organisation/user",
        ),
        (
            "/v1/api-keys/workspace/service",
            json!({"name": "k", "workspace_id": "default", "scopes": [], "rate_limits": [{"type": "requests", "unit": "rpm", "value": 0}]}),
            400,
            "AB01",
            "rate_limits[0].value: must be >= 1",
        ),
        (
            "/v1/api-keys/workspace/service",
            json!({"name": "k", "workspace_id": "default", "scopes": [], "usage_limits": {"credit_limit": 10, "periodic_reset": "daily"}}),
            400,
            "AB01",
            "usage_limits.periodic_reset: unknown variant `daily`",
        ),
        (
            "/v1/api-keys/workspace/service",
            json!({"name": "k", "workspace_id": "default", "scopes": [], "expires_at": "2020-01-01T00:00:00Z"}),
            400,
            "AB01",
            "expires_at: must be in the future",
        ),
        (
            "/v1/api-keys/workspace/service",
            json!({"name": "k", "workspace_id": "default", "scopes": [], "expires_at": "2999-01-01T00:00:00Z"}),
            400,
            "AB01",
            "expires_at: must be within 730 days",
        ),
        (
            "/v1/api-keys/workspace/service",
            json!({"name": "k", "workspace_id": "default", "scopes": [], "expires_at": null}),
            400,
            "AB01",
            "expires_at: keys must expire within 730 days",
        ),
        (
            "/v1/api-keys/workspace/service",
            json!({"name": "k", "workspace_id": "default", "scopes": [], "alert_emails": ["nobody"]}),
            400,
            "AB01",
            "alert_emails[0]: \"nobody\" is not an e-mail address",
        ),
    ];
    let before = app.audit_count().await;
    for (path, body, status, code, msg) in cases {
        let (got, resp) = app.admin("POST", path, Some(body.clone())).await;
        assert_eq!(got, status, "{body}: {resp}");
        assert_eq!(error_code(&resp), code, "{resp}");
        assert!(message(&resp).contains(msg), "want {msg:?} in {resp}");
    }
    // Malformed JSON.
    let (got, resp) = app
        .call(
            "POST",
            "/v1/api-keys/workspace/service",
            Some(ADMIN_KEY),
            Some(json!("not an object")),
        )
        .await;
    assert_eq!(got, 400, "{resp}");
    // Nothing failed was recorded; nothing was made.
    assert_eq!(app.audit_count().await, before);
    let (_, list) = app.admin("GET", "/v1/api-keys", None).await;
    assert_eq!(list["total"], 1);

    // 401: no key, an unknown key.
    let (got, resp) = app
        .call(
            "POST",
            "/v1/api-keys/workspace/service",
            None,
            Some(ok.clone()),
        )
        .await;
    assert_eq!((got, error_code(&resp)), (401, "AB05"), "{resp}");
    let (got, resp) = app
        .call(
            "POST",
            "/v1/api-keys/workspace/service",
            Some("nope-nope-nope-nope"),
            Some(ok.clone()),
        )
        .await;
    assert_eq!((got, error_code(&resp)), (401, "AB05"), "{resp}");

    // A complete key: limits, defaults, e-mails, expiry, rotation policy are kept.
    let (s, config) = app
        .admin(
            "POST",
            "/v1/configs",
            Some(json!({"name": "default", "config": {}})),
        )
        .await;
    assert_eq!(s, 200, "{config}");
    let full = json!({
        "name": "full", "description": "everything", "workspace_id": "default",
        "scopes": ["configs.read", "logs.view"],
        "rate_limits": [{"type": "requests", "unit": "rpm", "value": 100}],
        "usage_limits": {"credit_limit": 50, "type": "cost", "alert_threshold": 40, "periodic_reset": "monthly"},
        "defaults": {"metadata": {"team": "a"}, "config_id": config["slug"], "allow_config_override": false},
        "alert_emails": ["ops@example.com"],
        "expires_at": (chrono::Utc::now() + chrono::Duration::days(30)).to_rfc3339(),
        "rotation_policy": {"rotation_period": "monthly", "key_transition_period_ms": 3600000},
    });
    let (id, _) = app
        .key(ADMIN_KEY, "/v1/api-keys/workspace/service", full)
        .await;
    let (_, got) = app.admin("GET", &format!("/v1/api-keys/{id}"), None).await;
    assert_eq!(
        got["rate_limits"],
        json!([{"type": "requests", "unit": "rpm", "value": 100}])
    );
    assert_eq!(got["usage_limits"]["credit_limit"], 50);
    assert_eq!(got["usage_limits"]["current_usage"], 0.0);
    assert_eq!(got["defaults"]["metadata"]["team"], "a");
    assert_eq!(got["defaults"]["config_id"], config["slug"]);
    assert_eq!(got["alert_emails"], json!(["ops@example.com"]));
    assert_eq!(got["rotation_policy"]["rotation_period"], "monthly");
    assert_eq!(got["description"], "everything");
    assert!(got["expires_at"].as_str().unwrap().ends_with('Z'), "{got}");
    // No expires_at: the organisation's default (a year).
    let (id, _) = app
        .key(ADMIN_KEY, "/v1/api-keys/workspace/service", ok)
        .await;
    let (_, got) = app.admin("GET", &format!("/v1/api-keys/{id}"), None).await;
    let expires =
        chrono::DateTime::parse_from_rfc3339(got["expires_at"].as_str().unwrap()).unwrap();
    let days = (expires.with_timezone(&chrono::Utc) - chrono::Utc::now()).num_days();
    assert!((364..=365).contains(&days), "{got}");
}

async fn get_update_delete(db: TestDb) {
    let app = App::start(db).await;
    let (id, raw) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/workspace/service",
            json!({"name": "k", "workspace_id": "default", "scopes": WS_SCOPES}),
        )
        .await;
    let path = format!("/v1/api-keys/{id}");

    // 400 for a malformed id, 404 for an unknown one, on every method.
    for method in ["GET", "PUT", "DELETE"] {
        let (got, resp) = app
            .admin(method, "/v1/api-keys/nope", Some(json!({})))
            .await;
        assert_eq!((got, error_code(&resp)), (400, "AB01"), "{method} {resp}");
        assert!(message(&resp).contains("id: must be a UUID"), "{resp}");
        let (got, resp) = app
            .admin(
                method,
                "/v1/api-keys/7d1f0b1e-8a4c-4f3e-9b1a-2c3d4e5f6a7b",
                Some(json!({})),
            )
            .await;
        assert_eq!((got, error_code(&resp)), (404, "AB08"), "{method} {resp}");
    }

    let (got, resp) = app
        .admin(
            "PUT",
            &path,
            Some(
                json!({"name": "renamed", "description": null, "scopes": ["configs.read"],
                "rate_limits": [{"type": "tokens", "unit": "rpd", "value": 5}],
                "usage_limits": {"credit_limit": 3.5}}),
            ),
        )
        .await;
    assert_eq!((got, error_code(&resp)), (400, "AB01"), "{resp}");
    assert!(
        message(&resp).contains("usage_limits.credit_limit"),
        "{resp}"
    );
    let (got, resp) = app
        .admin(
            "PUT",
            &path,
            Some(
                json!({"name": "renamed", "description": null, "scopes": ["configs.read"],
                "rate_limits": [{"type": "tokens", "unit": "rpd", "value": 5}],
                "usage_limits": {"credit_limit": 3, "current_usage": 1.25}, "reset_usage": true}),
            ),
        )
        .await;
    assert_eq!((got, &resp), (200, &json!({})));
    let (_, got) = app.admin("GET", &path, None).await;
    assert_eq!(got["name"], "renamed");
    assert_eq!(got["description"], Value::Null);
    assert_eq!(got["scopes"], json!(["configs.read"]));
    assert_eq!(got["usage_limits"]["credit_limit"], 3);
    assert_eq!(got["rate_limits"][0]["unit"], "rpd");
    let (got, resp) = app
        .admin("PUT", &path, Some(json!({"status": "active"})))
        .await;
    assert_eq!((got, error_code(&resp)), (400, "AB01"), "{resp}");
    let (got, resp) = app
        .admin(
            "PUT",
            &path,
            Some(json!({"scopes": ["organisation_settings.read"]})),
        )
        .await;
    assert_eq!((got, error_code(&resp)), (400, "AB01"), "{resp}");

    // The key now lacks its key-management scopes: its own listing is refused.
    let (got, resp) = app.call("GET", "/v1/api-keys", Some(&raw), None).await;
    assert_eq!((got, error_code(&resp)), (403, "AB03"), "{resp}");

    let (got, resp) = app.admin("DELETE", &path, None).await;
    assert_eq!((got, &resp), (200, &json!({})));
    let (got, resp) = app.call("GET", "/v1/api-keys", Some(&raw), None).await;
    assert_eq!(
        (got, error_code(&resp)),
        (401, "AB05"),
        "a deleted key: {resp}"
    );
    let (got, _) = app.admin("DELETE", &path, None).await;
    assert_eq!(got, 404);
    let (got, _) = app.admin("GET", &path, None).await;
    assert_eq!(got, 404);

    // Pagination.
    for i in 0..3 {
        app.key(
            ADMIN_KEY,
            "/v1/api-keys/workspace/service",
            json!({"name": format!("p{i}"), "workspace_id": "default", "scopes": []}),
        )
        .await;
    }
    let (_, page) = app
        .admin("GET", "/v1/api-keys?page_size=2&current_page=1", None)
        .await;
    assert_eq!(page["total"], 4, "{page}");
    assert_eq!(page["data"].as_array().unwrap().len(), 2);
    let (_, page) = app
        .admin("GET", "/v1/api-keys?workspace_id=default", None)
        .await;
    assert_eq!(page["total"], 3, "{page}");
    for bad in [
        "/v1/api-keys?page_size=101",
        "/v1/api-keys?page_size=-1",
        "/v1/api-keys?current_page=x",
        "/v1/api-keys?colour=red",
    ] {
        let (got, resp) = app.admin("GET", bad, None).await;
        assert_eq!((got, error_code(&resp)), (400, "AB01"), "{bad}: {resp}");
    }
    let (got, resp) = app
        .admin("GET", "/v1/api-keys?workspace_id=nowhere", None)
        .await;
    assert_eq!((got, error_code(&resp)), (404, "AB02"), "{resp}");
}

async fn rotation(db: TestDb) {
    let app = App::start(db).await;
    let (id, old) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/workspace/service",
            json!({"name": "k", "workspace_id": "default", "scopes": WS_SCOPES}),
        )
        .await;
    let rotate = format!("/v1/api-keys/{id}/rotate");
    let (got, resp) = app
        .admin(
            "POST",
            &rotate,
            Some(json!({"key_transition_period_ms": 1000})),
        )
        .await;
    assert_eq!((got, error_code(&resp)), (400, "AB01"), "{resp}");
    let (got, resp) = app
        .admin(
            "POST",
            "/v1/api-keys/7d1f0b1e-8a4c-4f3e-9b1a-2c3d4e5f6a7b/rotate",
            None,
        )
        .await;
    assert_eq!((got, error_code(&resp)), (404, "AB08"), "{resp}");

    let (got, rotated) = app
        .admin(
            "POST",
            &rotate,
            Some(json!({"key_transition_period_ms": 3600000})),
        )
        .await;
    assert_eq!(got, 200, "{rotated}");
    assert_eq!(rotated["id"], id.as_str());
    let new = rotated["key"].as_str().unwrap().to_owned();
    assert_ne!(new, old);
    let until = chrono::DateTime::parse_from_rfc3339(
        rotated["key_transition_expires_at"].as_str().unwrap(),
    )
    .unwrap();
    let minutes = (until.with_timezone(&chrono::Utc) - chrono::Utc::now()).num_minutes();
    assert!((59..=60).contains(&minutes), "{rotated}");
    let (hash, mask) = app.store.api_key_at_rest(&id).await.unwrap().unwrap();
    assert_eq!(hash, admin::keys::hash(&new));
    let (_, got) = app.admin("GET", &format!("/v1/api-keys/{id}"), None).await;
    assert_eq!(got["key"], mask.as_str());

    // Both work during the transition; the old one stops when it ends.
    for key in [&old, &new] {
        let (got, resp) = app.call("GET", "/v1/api-keys", Some(key), None).await;
        assert_eq!(got, 200, "{resp}");
    }
    app.sql(
        "UPDATE api_keys SET previous_key_expires_at = '2000-01-01T00:00:00.000000Z' WHERE id = $1",
        &[&id],
    )
    .await;
    let (got, _) = app.call("GET", "/v1/api-keys", Some(&old), None).await;
    assert_eq!(got, 401);
    let (got, _) = app.call("GET", "/v1/api-keys", Some(&new), None).await;
    assert_eq!(got, 200);
}

async fn the_expiry_worker_expires_keys(db: TestDb) {
    let app = App::start(db).await;
    let soon = chrono::Utc::now() + chrono::Duration::milliseconds(1500);
    let (id, raw) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/workspace/service",
            json!({"name": "k", "workspace_id": "default", "scopes": WS_SCOPES, "expires_at": soon.to_rfc3339()}),
        )
        .await;
    let (got, _) = app.call("GET", "/v1/api-keys", Some(&raw), None).await;
    assert_eq!(got, 200);
    let worker = tokio::spawn(admin::expiry_worker(
        app.store.clone(),
        Duration::from_millis(100),
    ));
    let path = format!("/v1/api-keys/{id}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, got) = app.admin("GET", &path, None).await;
        if got["status"] == "expired" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not expired: {got}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    worker.abort();
    let (got, resp) = app.call("GET", "/v1/api-keys", Some(&raw), None).await;
    assert_eq!((got, error_code(&resp)), (401, "AB05"), "{resp}");
    assert!(message(&resp).contains("expired"), "{resp}");
    let (_, audit) = app
        .admin(
            "GET",
            "/v1/audit-logs?start_time=2000-01-01T00:00:00Z&end_time=2999-01-01T00:00:00Z&action=expire",
            None,
        )
        .await;
    assert_eq!(audit["total"], 1, "{audit}");
    assert_eq!(audit["records"][0]["resource_id"], id.as_str());
    assert_eq!(audit["records"][0]["user_type"], "system");
    // Rotating an expired key is refused; a new expiry revives it.
    let (got, _) = app.admin("POST", &format!("{path}/rotate"), None).await;
    assert_eq!(got, 400);
    let later = chrono::Utc::now() + chrono::Duration::days(1);
    let (got, resp) = app
        .admin(
            "PUT",
            &path,
            Some(json!({"expires_at": later.to_rfc3339()})),
        )
        .await;
    assert_eq!(got, 200, "{resp}");
    let (got, _) = app.call("GET", "/v1/api-keys", Some(&raw), None).await;
    assert_eq!(got, 200);

    // A key past its expiry is refused even before the worker has marked it.
    app.sql(
        "UPDATE api_keys SET expires_at = '2000-01-01T00:00:00.000000Z' WHERE id = $1",
        &[&id],
    )
    .await;
    let (got, _) = app.call("GET", "/v1/api-keys", Some(&raw), None).await;
    assert_eq!(got, 401);
}

async fn concurrent_creation(db: TestDb) {
    let app = std::sync::Arc::new(App::start(db).await);
    let before = app.audit_count().await;
    let tasks = (0..16).map(|i| {
        let app = app.clone();
        tokio::spawn(async move {
            app.admin(
                "POST",
                "/v1/api-keys/workspace/service",
                Some(json!({"name": format!("c{i}"), "workspace_id": "default", "scopes": ["configs.read"]})),
            )
            .await
        })
    });
    let results = futures_util::future::join_all(tasks).await;
    let mut ids = std::collections::BTreeSet::new();
    for r in results {
        let (status, body) = r.unwrap();
        assert_eq!(status, 200, "{body}");
        ids.insert(body["id"].as_str().unwrap().to_owned());
    }
    assert_eq!(ids.len(), 16);
    let (_, list) = app
        .admin("GET", "/v1/api-keys?workspace_id=default", None)
        .await;
    assert_eq!(list["total"], 16);
    assert_eq!(app.audit_count().await, before + 16);
}

/// A key's `defaults.config_id` names a config the key may use: one of its workspace for a
/// workspace key, one of its organisation for an admin key. Another workspace's config is
/// refused exactly as an unknown one, on creation and on update.
async fn default_config_is_one_the_key_may_use(db: TestDb) {
    let app = App::start(db).await;
    let other_ws = app.workspace("Other").await;
    let config_in = |ws: String| {
        let app = &app;
        async move {
            let (s, c) = app
                .admin(
                    "POST",
                    "/v1/configs",
                    Some(json!({"name": "c", "config": {}, "workspace_id": ws})),
                )
                .await;
            assert_eq!(s, 200, "{c}");
            (
                c["slug"].as_str().unwrap().to_owned(),
                c["id"].as_str().unwrap().to_owned(),
            )
        }
    };
    let (own_slug, own_id) = config_in(app.default_ws.clone()).await;
    let (their_slug, their_id) = config_in(other_ws.clone()).await;
    let with_default = |path: &str, config: &str| {
        let mut body =
            json!({"name": "k", "scopes": ["configs.read"], "defaults": {"config_id": config}});
        if path.contains("workspace") {
            body["workspace_id"] = json!("default");
        }
        body
    };
    let service = "/v1/api-keys/workspace/service";
    for config in [their_slug.as_str(), their_id.as_str(), "pc-nope-000000"] {
        let (s, b) = app
            .admin("POST", service, Some(with_default(service, config)))
            .await;
        assert_eq!((s, error_code(&b)), (400, "AB01"), "{config}: {b}");
        assert_eq!(
            message(&b),
            format!("defaults.config_id: no config {config:?}"),
            "the same answer as for an unknown config"
        );
    }
    let mut made = Vec::new();
    for config in [own_slug.as_str(), own_id.as_str()] {
        let (s, b) = app
            .admin("POST", service, Some(with_default(service, config)))
            .await;
        assert_eq!(s, 200, "{config}: {b}");
        made.push(b["id"].as_str().unwrap().to_owned());
    }
    // An admin key uses any config of its organisation.
    let org = "/v1/api-keys/organisation/service";
    for config in [&own_slug, &their_slug] {
        let (s, b) = app
            .admin("POST", org, Some(with_default(org, config)))
            .await;
        assert_eq!(s, 200, "{config}: {b}");
    }
    let (s, b) = app
        .admin("POST", org, Some(with_default(org, "pc-nope-000000")))
        .await;
    assert_eq!((s, error_code(&b)), (400, "AB01"), "{b}");
    // Updates are checked the same way.
    let path = format!("/v1/api-keys/{}", made[0]);
    let (s, b) = app
        .admin(
            "PUT",
            &path,
            Some(json!({"defaults": {"config_id": their_slug}})),
        )
        .await;
    assert_eq!((s, error_code(&b)), (400, "AB01"), "{b}");
    assert_eq!(
        message(&b),
        format!("defaults.config_id: no config {their_slug:?}")
    );
    let (_, got) = app.admin("GET", &path, None).await;
    assert_eq!(got["defaults"]["config_id"], own_slug.as_str(), "unchanged");
    let (s, b) = app
        .admin(
            "PUT",
            &path,
            Some(json!({"defaults": {"config_id": own_id}})),
        )
        .await;
    assert_eq!(s, 200, "{b}");
}

crate::on_both_databases!(
    keys_are_shown_once_and_hashed_at_rest,
    default_config_is_one_the_key_may_use,
    creation_is_validated,
    get_update_delete,
    rotation,
    the_expiry_worker_expires_keys,
    concurrent_creation,
);
