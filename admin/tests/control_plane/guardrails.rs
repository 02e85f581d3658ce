//! `/v1/guardrails`: the lifecycle and its audit records, the data plane's view (owner,
//! headers in clear), masked headers and masks sent back, the validator hook, bad input, a
//! guardrail named by its workspace's defaults, and who may do what.

use admin::store::DataPlaneOptions;
use admin::ConfigCheck;
use plugin_sdk::AccessStore;
use serde_json::{json, Value};

use crate::common::{App, TestDb, ADMIN_KEY};
use crate::integrations::app_with_key;

fn code(body: &Value) -> &str {
    body["data"]["errorCode"].as_str().unwrap_or_default()
}

fn message(body: &Value) -> &str {
    body["data"]["message"].as_str().unwrap_or_default()
}

const WEBHOOK: &str = "https://hooks.example.com/check";

/// A guardrail with a webhook check whose header is a secret.
fn with_webhook(name: &str) -> Value {
    json!({
        "name": name,
        "type": "guardrail",
        "checks": [{"id": "default.webhook",
                    "parameters": {"webhookURL": WEBHOOK, "headers": {"x-api-key": "hook-secret-123456"}}}],
        "actions": {"deny": true, "on_fail": {"feedback": {"value": -1, "weight": 1}}}
    })
}

async fn create(app: &App, body: Value) -> Value {
    let (status, got) = app.admin("POST", "/v1/guardrails", Some(body)).await;
    assert_eq!(status, 200, "{got}");
    got
}

async fn lifecycle(db: TestDb) {
    let app = app_with_key(db).await;
    let before = app.audit_count().await;
    let made = create(&app, with_webhook("No secrets out")).await;
    let slug = made["slug"].as_str().unwrap().to_owned();
    let id = made["id"].as_str().unwrap().to_owned();
    assert!(slug.starts_with("pg-nosec-"), "{made}");
    assert_eq!(made["object"], "guardrail");
    assert_eq!(app.audit_count().await, before + 1);

    // By slug and by id: the checks with the header masked, the actions, the workspace.
    for key in [&slug, &id] {
        let (status, got) = app
            .admin("GET", &format!("/v1/guardrails/{key}"), None)
            .await;
        assert_eq!(status, 200, "{got}");
        assert_eq!(got["id"], id.as_str());
        assert_eq!(got["name"], "No secrets out");
        assert_eq!(got["type"], "guardrail");
        assert_eq!(got["workspace_id"], app.default_ws.as_str());
        assert_eq!(got["actions"]["deny"], true);
        assert_eq!(got["actions"]["async"], false);
        assert_eq!(got["actions"]["on_fail"]["feedback"]["value"], -1);
        let header = &got["checks"][0]["parameters"]["headers"]["x-api-key"];
        assert_eq!(header, "ho*******56", "shown masked: {got}");
        assert_eq!(got["version"], 1);
    }
    let (_, list) = app.admin("GET", "/v1/guardrails", None).await;
    assert_eq!(list["total"], 1, "{list}");
    assert_eq!(list["data"][0]["slug"], slug.as_str());

    // Stored encrypted: the row holds the mask, never the secret.
    let stored: String = sqlx::query_scalar("SELECT hook || secrets FROM guardrails WHERE id = $1")
        .bind(&id)
        .fetch_one(app.store.db().pool())
        .await
        .unwrap();
    assert!(!stored.contains("hook-secret"), "{stored}");

    // The data plane has it by slug and id, with its owner and the header in clear.
    let published = app.store.published();
    let saved = published.guardrail(&slug).expect("published");
    assert_eq!(saved.id, id);
    assert_eq!(saved.owner.workspace_id, app.default_ws);
    assert_eq!(
        saved.hook["checks"][0]["parameters"]["headers"]["x-api-key"],
        "hook-secret-123456"
    );
    assert_eq!(saved.hook["deny"], true);
    assert!(published.guardrail(&id).is_some());

    // An update sending the checks back as shown keeps the secret; new actions apply.
    let (_, shown) = app
        .admin("GET", &format!("/v1/guardrails/{slug}"), None)
        .await;
    let (status, got) = app
        .admin(
            "PUT",
            &format!("/v1/guardrails/{slug}"),
            Some(json!({"checks": shown["checks"], "actions": {"deny": false}, "name": "Renamed"})),
        )
        .await;
    assert_eq!(status, 200, "{got}");
    let saved = app.store.published().guardrail(&slug).unwrap();
    assert_eq!(
        saved.hook["checks"][0]["parameters"]["headers"]["x-api-key"],
        "hook-secret-123456"
    );
    assert_eq!(saved.hook["deny"], false);
    assert_eq!(
        saved.hook["on_fail"]["feedback"]["value"], -1,
        "actions not sent are kept"
    );
    let (_, got) = app
        .admin("GET", &format!("/v1/guardrails/{slug}"), None)
        .await;
    assert_eq!(
        (got["name"].as_str(), got["version"].as_i64()),
        (Some("Renamed"), Some(2))
    );

    // The mask does not travel to another host.
    let mut moved = shown["checks"].clone();
    moved[0]["parameters"]["webhookURL"] = json!("https://attacker.example.net/");
    let (status, got) = app
        .admin(
            "PUT",
            &format!("/v1/guardrails/{slug}"),
            Some(json!({"checks": moved})),
        )
        .await;
    assert_eq!((status, code(&got)), (400, "AB01"), "{got}");
    assert!(
        message(&got).starts_with("checks[0].parameters.headers.x-api-key"),
        "{got}"
    );

    // Named by its workspace's defaults, it cannot be deleted until they stop naming it.
    let ws_path = format!("/v1/admin/workspaces/{}", app.default_ws);
    let (status, got) = app
        .admin(
            "PUT",
            &ws_path,
            Some(json!({"defaults": {"output_guardrails": [slug]}})),
        )
        .await;
    assert_eq!(status, 200, "{got}");
    let (status, got) = app
        .admin("DELETE", &format!("/v1/guardrails/{slug}"), None)
        .await;
    assert_eq!(status, 409, "{got}");
    assert!(message(&got).contains("defaults"), "{got}");
    app.admin(
        "PUT",
        &ws_path,
        Some(json!({"defaults": {"output_guardrails": []}})),
    )
    .await;
    let before = app.audit_count().await;
    let (status, _) = app
        .admin("DELETE", &format!("/v1/guardrails/{id}"), None)
        .await;
    assert_eq!(status, 200);
    assert_eq!(app.audit_count().await, before + 1);
    assert!(app.store.published().guardrail(&slug).is_none());
    let (status, got) = app
        .admin("GET", &format!("/v1/guardrails/{slug}"), None)
        .await;
    assert_eq!((status, code(&got)), (404, "AB08"), "{got}");

    // The audit log has the body with the header masked.
    let bodies: Vec<String> = sqlx::query_scalar(
        "SELECT COALESCE(request_body, '') FROM audit_logs WHERE resource_type = 'guardrail'",
    )
    .fetch_all(app.store.db().pool())
    .await
    .unwrap();
    assert!(!bodies.is_empty());
    assert!(
        bodies.iter().all(|b| !b.contains("hook-secret")),
        "{bodies:?}"
    );
}

async fn bad_input(db: TestDb) {
    let app = app_with_key(db).await;
    for (body, field) in [
        (json!({"name": "n"}), "checks"),
        (json!({"name": "n", "checks": []}), "checks"),
        (
            json!({"name": "n", "checks": [{"parameters": {}}]}),
            "checks[0].id",
        ),
        (
            json!({"name": "", "checks": [{"id": "default.pii"}]}),
            "name",
        ),
        (
            json!({"name": "n", "checks": [{"id": "default.pii"}], "colour": 1}),
            "colour",
        ),
        (
            json!({"name": "n", "checks": [{"id": "default.pii"}], "type": "other"}),
            "type",
        ),
        (
            json!({"name": "n", "checks": [{"id": "default.pii"}], "actions": {"deny": "yes"}}),
            "actions.deny",
        ),
        (
            json!({"name": "n", "checks": [{"id": "default.pii"}], "workspace_id": "nope"}),
            "workspace_id",
        ),
    ] {
        let (status, got) = app
            .admin("POST", "/v1/guardrails", Some(body.clone()))
            .await;
        assert!(status == 400 || status == 404, "{body}: {status} {got}");
        assert!(message(&got).starts_with(field), "{body}: {got}");
    }
    let made = create(
        &app,
        json!({"name": "n", "checks": [{"id": "default.pii"}]}),
    )
    .await;
    let path = format!("/v1/guardrails/{}", made["slug"].as_str().unwrap());
    let (status, got) = app.admin("PUT", &path, Some(json!({}))).await;
    assert_eq!((status, code(&got)), (400, "AB01"), "{got}");
    assert!(message(&got).starts_with("nothing to update"), "{got}");
    let (status, _) = app.admin("GET", "/v1/guardrails/pg-none", None).await;
    assert_eq!(status, 404);
}

async fn the_validator_decides(db: TestDb) {
    let mut app = app_with_key(db).await;
    let check = ConfigCheck::new(|hook: &Value| match hook["checks"][0]["id"].as_str() {
        Some("default.nope") => Err("checks[0].id: unknown check \"default.nope\"".to_owned()),
        _ => Ok(()),
    });
    app.store = app
        .store
        .clone()
        .with_data_plane(DataPlaneOptions {
            guardrail_check: Some(check),
            ..DataPlaneOptions::default()
        })
        .await
        .expect("same key, a check");
    app.router = admin::router(app.store.clone());
    let bad = json!({"name": "n", "checks": [{"id": "default.nope"}]});
    let (status, got) = app.admin("POST", "/v1/guardrails", Some(bad)).await;
    assert_eq!((status, code(&got)), (400, "AB01"), "{got}");
    assert_eq!(
        message(&got),
        "checks[0].id: unknown check \"default.nope\""
    );
    let made = create(
        &app,
        json!({"name": "n", "checks": [{"id": "default.pii"}]}),
    )
    .await;
    let path = format!("/v1/guardrails/{}", made["slug"].as_str().unwrap());
    let (status, got) = app
        .admin(
            "PUT",
            &path,
            Some(json!({"checks": [{"id": "default.nope"}]})),
        )
        .await;
    assert_eq!((status, code(&got)), (400, "AB01"), "{got}");
}

async fn workspaces_keep_their_own(db: TestDb) {
    let app = app_with_key(db).await;
    let ws = app.workspace("Team").await;
    let other = app.workspace("Other").await;
    let scopes = |list: &[&str]| json!(list);
    let (_, team) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/workspace/service",
            json!({"name": "svc", "workspace_id": ws, "scopes": scopes(&[
                "guardrails.create", "guardrails.read", "guardrails.update",
                "guardrails.delete", "guardrails.list"])}),
        )
        .await;
    let (_, reader) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/workspace/service",
            json!({"name": "ro", "workspace_id": ws, "scopes": ["guardrails.read"]}),
        )
        .await;
    let body = json!({"name": "mine", "checks": [{"id": "default.pii"}]});
    let (status, mine) = app
        .call("POST", "/v1/guardrails", Some(&team), Some(body.clone()))
        .await;
    assert_eq!(status, 200, "{mine}");
    let mine = format!("/v1/guardrails/{}", mine["slug"].as_str().unwrap());
    let (_, got) = app.admin("GET", &mine, None).await;
    assert_eq!(
        got["workspace_id"],
        ws.as_str(),
        "the key's workspace by default"
    );

    // Another workspace's guardrail is a 404, as one that does not exist; none is listed.
    let theirs = create(
        &app,
        json!({"name": "theirs", "checks": [{"id": "default.pii"}],
                                     "workspace_id": other}),
    )
    .await;
    let theirs = format!("/v1/guardrails/{}", theirs["slug"].as_str().unwrap());
    for (method, body) in [
        ("GET", None),
        ("PUT", Some(json!({"name": "x"}))),
        ("DELETE", None),
    ] {
        let (status, got) = app.call(method, &theirs, Some(&team), body).await;
        assert_eq!((status, code(&got)), (404, "AB08"), "{method}: {got}");
    }
    let (status, got) = app.call("GET", "/v1/guardrails", Some(&team), None).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["total"], 1, "{got}");
    let mut other_ws = body.clone();
    other_ws["workspace_id"] = json!(other);
    let (status, _) = app
        .call("POST", "/v1/guardrails", Some(&team), Some(other_ws))
        .await;
    assert_eq!(status, 403);

    // Scopes: guardrails.read reads, nothing more; refusals are audited.
    let (status, _) = app.call("GET", &mine, Some(&reader), None).await;
    assert_eq!(status, 200);
    let refused = app.refused_count().await;
    for (method, path, body) in [
        ("GET", "/v1/guardrails", None),
        ("POST", "/v1/guardrails", Some(body.clone())),
        ("PUT", mine.as_str(), Some(json!({"name": "x"}))),
        ("DELETE", mine.as_str(), None),
    ] {
        let (status, got) = app.call(method, path, Some(&reader), body).await;
        assert_eq!(
            (status, code(&got)),
            (403, "AB03"),
            "{method} {path}: {got}"
        );
    }
    assert!(app.refused_count().await > refused);
}

crate::on_both_databases!(
    lifecycle,
    bad_input,
    the_validator_decides,
    workspaces_keep_their_own,
);
