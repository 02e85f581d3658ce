//! Bulk creation: many keys in one call, in one transaction, audited as one action that names
//! its items, and all of them in the data plane at once.

use plugin_sdk::store::ProviderStore;
use plugin_sdk::AccessStore;
use serde_json::{json, Value};

use crate::common::{digest, App, TestDb, ADMIN_KEY};

const BULK: &str = "/v1/api-keys/workspace/service/bulk";

fn item(app: &App, name: &str) -> Value {
    json!({"name": name, "workspace_id": app.default_ws, "scopes": ["completions.write"],
           "rate_limits": [{"type": "requests", "unit": "rpm", "value": 60}]})
}

fn message(body: &Value) -> &str {
    body["data"]["message"].as_str().unwrap_or_default()
}

async fn keys_made_in_one_call(db: TestDb) {
    let app = App::start(db).await;
    let published = app.store.published();
    let items: Vec<Value> = (0..250).map(|i| item(&app, &format!("ci-{i}"))).collect();
    let before = published.version();
    let (status, got) = app.admin("POST", BULK, Some(json!({"keys": items}))).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["object"], "list");
    assert_eq!(got["total"], 250);
    let made = got["data"].as_array().unwrap();
    assert_eq!(made.len(), 250);
    // Every key works on the data plane at once, made by one change.
    assert_eq!(published.version(), before + 1);
    let mut ids = Vec::new();
    for k in made {
        assert_eq!(k["object"], "api-key");
        let record = published
            .api_key(&digest(k["key"].as_str().unwrap()))
            .expect("in the snapshot");
        assert_eq!(&*record.id, k["id"].as_str().unwrap());
        assert_eq!(
            record.workspace_id.as_deref(),
            Some(app.default_ws.as_str())
        );
        ids.push(k["id"].clone());
    }
    // The order asked is kept.
    let (_, first) = app
        .admin(
            "GET",
            &format!("/v1/api-keys/{}", made[0]["id"].as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(first["name"], "ci-0");
    // One audit record names them all.
    let (_, audit) = app
        .admin("GET", "/v1/audit-logs?start_time=2000-01-01T00:00:00Z&end_time=2999-01-01T00:00:00Z&action=bulk_create", None)
        .await;
    assert_eq!(audit["total"], 1, "{audit}");
    let record = &audit["records"][0];
    assert_eq!(record["resource_type"], "api_key");
    assert_eq!(record["workspace_id"], app.default_ws.as_str());
    assert_eq!(record["resource_ids"], Value::Array(ids));
    // A record of a single create has no list.
    app.key(
        ADMIN_KEY,
        "/v1/api-keys/workspace/service",
        item(&app, "one"),
    )
    .await;
    let (_, audit) = app.admin("GET", "/v1/audit-logs?start_time=2000-01-01T00:00:00Z&end_time=2999-01-01T00:00:00Z&action=create", None).await;
    assert!(audit["records"][0].get("resource_ids").is_none(), "{audit}");
}

async fn key_count(app: &App) -> i64 {
    let (_, list) = app.admin("GET", "/v1/api-keys", None).await;
    list["total"].as_i64().unwrap()
}

async fn one_bad_item_makes_none(db: TestDb) {
    let app = App::start(db).await;
    let before = key_count(&app).await;
    let mut items: Vec<Value> = (0..5).map(|i| item(&app, &format!("k{i}"))).collect();
    items[3]["scopes"] = json!(["no.such_scope"]);
    let (status, got) = app.admin("POST", BULK, Some(json!({"keys": items}))).await;
    assert_eq!(status, 400, "{got}");
    assert!(message(&got).starts_with("keys[3]"), "{got}");
    let mut items: Vec<Value> = (0..3).map(|i| item(&app, &format!("k{i}"))).collect();
    items[2]["workspace_id"] = json!("no-such-workspace");
    let (status, got) = app.admin("POST", BULK, Some(json!({"keys": items}))).await;
    assert_eq!(status, 404, "{got}");
    assert!(message(&got).starts_with("keys[2]"), "{got}");
    let mut items: Vec<Value> = (0..3).map(|i| item(&app, &format!("k{i}"))).collect();
    items[1]["colour"] = json!("blue");
    let (status, got) = app.admin("POST", BULK, Some(json!({"keys": items}))).await;
    assert_eq!(status, 400, "{got}");
    assert!(message(&got).contains("keys[1]"), "{got}");
    for body in [json!({"keys": []}), json!({})] {
        let (status, got) = app.admin("POST", BULK, Some(body)).await;
        assert_eq!(status, 400, "{got}");
        assert!(message(&got).contains("keys"), "{got}");
    }
    let many: Vec<Value> = (0..1001).map(|i| item(&app, &format!("k{i}"))).collect();
    let (status, got) = app.admin("POST", BULK, Some(json!({"keys": many}))).await;
    assert_eq!(status, 400, "{got}");
    assert!(message(&got).starts_with("keys: 1 to 1000"), "{got}");
    let (status, got) = app
        .admin(
            "POST",
            "/v1/api-keys/workspace/robot/bulk",
            Some(json!({"keys": [item(&app, "x")]})),
        )
        .await;
    assert_eq!(status, 400, "{got}");
    assert_eq!(key_count(&app).await, before, "nothing was made");
}

/// A workspace key may bulk-create only in its own workspace, as it may create one by one.
async fn the_caller_needs_the_right_for_each_item(db: TestDb) {
    let app = App::start(db).await;
    let other = app.workspace("other").await;
    let (_, manager) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/workspace/service",
            json!({"name": "mgr", "workspace_id": app.default_ws,
                   "scopes": ["workspace_service_api_keys.create", "completions.write"]}),
        )
        .await;
    let mine = item(&app, "mine");
    let mut theirs = item(&app, "theirs");
    theirs["workspace_id"] = json!(other);
    let (status, got) = app
        .call(
            "POST",
            BULK,
            Some(&manager),
            Some(json!({"keys": [mine.clone(), theirs]})),
        )
        .await;
    assert_eq!(status, 403, "{got}");
    assert!(message(&got).starts_with("keys[1]"), "{got}");
    let (status, got) = app
        .call("POST", BULK, Some(&manager), Some(json!({"keys": [mine]})))
        .await;
    assert_eq!(status, 200, "{got}");
}

async fn providers_made_in_one_call(db: TestDb) {
    let app = crate::integrations::app_with_key(db).await;
    let (status, got) = app
        .admin(
            "POST",
            "/v1/integrations",
            Some(
                json!({"name": "Base", "slug": "base", "ai_provider_id": "openai",
                        "key": "sk-base-123456789"}),
            ),
        )
        .await;
    assert_eq!(status, 200, "{got}");
    let published = app.store.published();
    let items: Vec<Value> = (0..20)
        .map(|i| {
            json!({"name": format!("team {i}"), "slug": format!("team-{i}"),
                        "integration_id": "base", "workspace_id": app.default_ws,
                        "rate_limits": [{"type": "requests", "unit": "rpm", "value": 10}]})
        })
        .collect();
    let (status, got) = app
        .admin(
            "POST",
            "/v1/providers/bulk",
            Some(json!({"providers": items})),
        )
        .await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["total"], 20);
    let mut ids = Vec::new();
    for (i, p) in got["data"].as_array().unwrap().iter().enumerate() {
        assert_eq!(p["slug"], format!("team-{i}"));
        let record = published.provider(&format!("team-{i}")).expect("served");
        assert_eq!(record.api_key.as_deref(), Some("sk-base-123456789"));
        ids.push(p["id"].clone());
    }
    let (_, audit) = app
        .admin("GET", "/v1/audit-logs?start_time=2000-01-01T00:00:00Z&end_time=2999-01-01T00:00:00Z&action=bulk_create&resource_type=provider", None)
        .await;
    assert_eq!(audit["total"], 1, "{audit}");
    assert_eq!(audit["records"][0]["resource_ids"], Value::Array(ids));

    // A slug given twice: nothing is made, and the error names the second.
    let twice = json!({"providers": [
        {"name": "a", "slug": "dup", "integration_id": "base", "workspace_id": app.default_ws},
        {"name": "b", "slug": "dup", "integration_id": "base", "workspace_id": app.default_ws},
    ]});
    let (status, got) = app.admin("POST", "/v1/providers/bulk", Some(twice)).await;
    assert_eq!(status, 409, "{got}");
    assert!(message(&got).starts_with("providers[1]"), "{got}");
    assert!(published.provider("dup").is_none());
    let (status, got) = app
        .admin(
            "POST",
            "/v1/providers/bulk",
            Some(json!({"providers": [{"name": "x", "integration_id": "nope"}]})),
        )
        .await;
    assert_eq!(status, 404, "{got}");
    assert!(
        message(&got).starts_with("providers[0].integration_id"),
        "{got}"
    );
    let (status, got) = app
        .admin(
            "POST",
            "/v1/providers",
            Some(json!({"name": "x", "slug": "bulk", "integration_id": "base"})),
        )
        .await;
    assert_eq!(status, 400, "{got}");
    assert!(message(&got).starts_with("slug"), "{got}");
}

crate::on_both_databases!(
    providers_made_in_one_call,
    keys_made_in_one_call,
    one_bad_item_makes_none,
    the_caller_needs_the_right_for_each_item,
);
