//! `/v1/integrations`: every endpoint's success and error statuses, the secret encrypted at
//! rest and never returned, settings per provider, tags and their filters, the workspaces bulk
//! update with default providers, deletion, the secret key, and who may do what.

use admin::authz::{OrgRole, WorkspaceRole};
use admin::crypto::SecretKey;
use admin::store::DataPlaneOptions;
use admin::Store;
use plugin_sdk::store::ProviderStore;
use serde_json::{json, Value};

use crate::common::{App, TestDb, ADMIN_KEY};

/// The secret key of tests on PostgreSQL (where there is no key file): 32 bytes in base64.
pub const TEST_SECRET_KEY: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";

pub fn test_key() -> SecretKey {
    SecretKey::from_base64(TEST_SECRET_KEY).expect("a valid test key")
}

/// A bootstrapped control plane that can store secrets: SQLite keeps a generated key beside
/// its file; PostgreSQL is given [`TEST_SECRET_KEY`], as `GW_SECRET_KEY` would be.
pub async fn app_with_key(db: TestDb) -> App {
    let mut app = App::start(db).await;
    if !app.store.has_secret_key() {
        app.store = app
            .store
            .clone()
            .with_data_plane(DataPlaneOptions {
                secret_key: Some(test_key()),
                config_check: None,
                guardrail_check: None,
            })
            .await
            .expect("a key");
        app.router = admin::router(app.store.clone());
    }
    app
}

fn code(body: &Value) -> &str {
    body["data"]["errorCode"].as_str().unwrap_or_default()
}

fn message(body: &Value) -> &str {
    body["data"]["message"].as_str().unwrap_or_default()
}

pub async fn create_integration(app: &App, body: Value) -> Value {
    let (status, got) = app.admin("POST", "/v1/integrations", Some(body)).await;
    assert_eq!(status, 200, "{got}");
    got
}

const SECRET: &str = "sk-live-0123456789-SECRET";
const AWS_SECRET: &str = "aws/Secret+Access+Key-987";

async fn secrets_are_encrypted_and_never_returned(db: TestDb) {
    let app = app_with_key(db).await;
    let before = app.audit_count().await;
    let made = create_integration(
        &app,
        json!({
            "name": "OpenAI prod", "ai_provider_id": "openai", "key": SECRET,
            "description": "the main account", "workspace_id": "default",
            "configurations": {"custom_host": "http://127.0.0.1:9/v1"},
            "tags": {"env": "prod", "team": "a"},
        }),
    )
    .await;
    assert_eq!(made["slug"], "openai-prod", "{made}");
    assert_eq!(made["default_provider_slug"], "openai-prod", "{made}");
    let id = made["id"].as_str().unwrap().to_owned();
    assert_eq!(
        app.audit_count().await,
        before + 2,
        "the integration and its provider"
    );

    // Never returned: a mask instead.
    let (status, got) = app.admin("GET", "/v1/integrations/openai-prod", None).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["masked_key"], "sk*******ET", "{got}");
    assert_eq!(got["ai_provider_id"], "openai");
    assert_eq!(
        got["configurations"]["custom_host"],
        "http://127.0.0.1:9/v1"
    );
    assert_eq!(got["tags"], json!({"env": "prod", "team": "a"}));
    assert_eq!(got["workspace_id"], app.default_ws.as_str());
    assert_eq!(got["description"], "the main account");
    let (_, list) = app.admin("GET", "/v1/integrations", None).await;
    let (_, by_id) = app
        .admin("GET", &format!("/v1/integrations/{id}"), None)
        .await;
    assert_eq!(by_id["slug"], "openai-prod");
    for body in [&made, &got, &list, &by_id] {
        assert!(!body.to_string().contains(SECRET), "{body}");
    }

    // Encrypted at rest: the raw column is a ciphertext, not the key.
    let raw: Option<String> =
        sqlx::query_scalar("SELECT key_secret FROM integrations WHERE id = $1")
            .bind(&id)
            .fetch_one(app.store.db().pool())
            .await
            .unwrap();
    let raw = raw.expect("a stored secret");
    assert!(
        raw.starts_with("v1:") && !raw.contains(SECRET) && !raw.contains("SECRET"),
        "{raw}"
    );
    // The audit log has the request with the secret redacted.
    let bodies: Vec<Option<String>> = sqlx::query_scalar("SELECT request_body FROM audit_logs")
        .fetch_all(app.store.db().pool())
        .await
        .unwrap();
    assert!(bodies.iter().flatten().any(|b| b.contains("[REDACTED]")));
    assert!(!bodies.iter().flatten().any(|b| b.contains(SECRET)));

    // The data plane has it decrypted, under the provider's slug, at once.
    let record = app
        .store
        .published()
        .provider("openai-prod")
        .expect("published");
    assert_eq!(record.provider, "openai");
    assert_eq!(record.api_key.as_deref(), Some(SECRET));
    assert_eq!(record.custom_host.as_deref(), Some("http://127.0.0.1:9/v1"));

    // AWS secrets too, with the other settings in clear.
    let made = create_integration(
        &app,
        json!({
            "name": "Bedrock", "ai_provider_id": "bedrock", "slug": "bedrock-main",
            "configurations": {"aws_access_key_id": "AKIAEXAMPLE", "aws_secret_access_key": AWS_SECRET,
                "aws_session_token": "session-token-value", "aws_region": "eu-west-1"},
        }),
    )
    .await;
    let (_, got) = app
        .admin("GET", "/v1/integrations/bedrock-main", None)
        .await;
    let c = &got["configurations"];
    assert_eq!(c["aws_region"], "eu-west-1");
    assert_eq!(c["aws_access_key_id"], "AKIAEXAMPLE");
    assert_eq!(c["aws_secret_access_key"], "aw*******87");
    assert_eq!(c["aws_session_token"], "se*******ue");
    assert_eq!(got["masked_key"], Value::Null);
    let raw: Option<String> =
        sqlx::query_scalar("SELECT secret_settings FROM integrations WHERE slug = 'bedrock-main'")
            .fetch_one(app.store.db().pool())
            .await
            .unwrap();
    let raw = raw.unwrap();
    assert!(
        !raw.contains(AWS_SECRET) && !raw.contains("session-token-value"),
        "{raw}"
    );
    let settings: Option<String> =
        sqlx::query_scalar("SELECT settings FROM integrations WHERE slug = 'bedrock-main'")
            .fetch_one(app.store.db().pool())
            .await
            .unwrap();
    assert!(!settings.unwrap().contains(AWS_SECRET));
    let record = app.store.published().provider("bedrock-main").unwrap();
    assert_eq!(record.settings["aws_secret_access_key"], AWS_SECRET);
    assert_eq!(record.settings["aws_session_token"], "session-token-value");
    assert_eq!(record.settings["aws_region"], "eu-west-1");
    assert_eq!(record.api_key, None);
    assert_eq!(made["default_provider_slug"], "bedrock-main");
}

async fn update_merges_settings_and_replaces_the_key(db: TestDb) {
    let app = app_with_key(db).await;
    create_integration(
        &app,
        json!({"name": "b", "slug": "b", "ai_provider_id": "bedrock", "key": "old-key-value",
            "configurations": {"aws_secret_access_key": AWS_SECRET, "aws_session_token": "tok-tok-tok", "aws_region": "us-east-1"},
            "tags": {"env": "dev"}}),
    )
    .await;
    let path = "/v1/integrations/b";
    let (status, got) = app
        .admin(
            "PUT",
            path,
            Some(
                json!({"name": "B", "description": "d", "key": "new-key-value-1",
                "configurations": {"aws_region": "eu-west-3", "aws_session_token": null},
                "tags": {"env": "prod"}}),
            ),
        )
        .await;
    assert_eq!((status, &got), (200, &json!({})));
    let (_, got) = app.admin("GET", path, None).await;
    assert_eq!(got["name"], "B");
    assert_eq!(got["description"], "d");
    assert_eq!(got["masked_key"], "ne*******-1");
    assert_eq!(got["tags"], json!({"env": "prod"}));
    let c = &got["configurations"];
    assert_eq!(c["aws_region"], "eu-west-3");
    assert_eq!(c["aws_secret_access_key"], "aw*******87", "kept: {got}");
    assert!(c.get("aws_session_token").is_none(), "removed: {got}");
    let record = app.store.published().provider("b").unwrap();
    assert_eq!(record.api_key.as_deref(), Some("new-key-value-1"));
    assert_eq!(record.settings["aws_region"], "eu-west-3");
    assert_eq!(record.settings["aws_secret_access_key"], AWS_SECRET);
    assert!(!record.settings.contains_key("aws_session_token"));
    // The key removed; the description cleared.
    let (status, _) = app
        .admin("PUT", path, Some(json!({"key": null, "description": null})))
        .await;
    assert_eq!(status, 200);
    let (_, got) = app.admin("GET", path, None).await;
    assert_eq!(got["masked_key"], Value::Null);
    assert_eq!(got["description"], Value::Null);
    assert_eq!(app.store.published().provider("b").unwrap().api_key, None);

    let bad = [
        (
            json!({"ai_provider_id": "openai"}),
            "ai_provider_id: unknown field",
        ),
        (json!({"slug": "c"}), "slug: unknown field"),
        (json!({"name": ""}), "name: must not be empty"),
        (json!({"key": ""}), "key: must not be empty"),
        (json!({"key": "has space"}), "key: may hold only"),
        (
            json!({"configurations": {"azure_resource_name": "x"}}),
            "applies to azure-openai integrations only",
        ),
        (
            json!({"tags": {"bad key": "v"}}),
            "tags.bad key: a tag name",
        ),
    ];
    for (body, want) in bad {
        let (status, got) = app.admin("PUT", path, Some(body.clone())).await;
        assert_eq!((status, code(&got)), (400, "AB01"), "{body}: {got}");
        assert!(message(&got).contains(want), "want {want:?}: {got}");
    }
    let (status, got) = app
        .admin("PUT", "/v1/integrations/none", Some(json!({"name": "x"})))
        .await;
    assert_eq!((status, code(&got)), (404, "AB08"));
}

async fn bad_input(db: TestDb) {
    let app = app_with_key(db).await;
    create_integration(
        &app,
        json!({"name": "one", "slug": "taken", "ai_provider_id": "openai", "key": "k-123456789"}),
    )
    .await;
    let before = app.audit_count().await;
    let long = "x".repeat(256);
    let cases = [
        (
            json!({"ai_provider_id": "openai"}),
            400,
            "AB01",
            "missing field `name`",
        ),
        (
            json!({"name": "n"}),
            400,
            "AB01",
            "missing field `ai_provider_id`",
        ),
        (
            json!({"name": "n", "ai_provider_id": "nope"}),
            400,
            "AB01",
            "ai_provider_id: unknown provider \"nope\"",
        ),
        (
            json!({"name": long, "ai_provider_id": "openai"}),
            400,
            "AB01",
            "name: must be at most 255",
        ),
        (
            json!({"name": "n", "ai_provider_id": "openai", "slug": "a b"}),
            400,
            "AB01",
            "slug: must match ^[a-zA-Z0-9_-]+$",
        ),
        (
            json!({"name": "n", "ai_provider_id": "openai", "slug": "x".repeat(256)}),
            400,
            "AB01",
            "slug: must be at most 255",
        ),
        (
            json!({"name": "n", "ai_provider_id": "openai", "slug": "5f0c7f1e-1d7a-4b8e-9d6e-0a1b2c3d4e5f"}),
            400,
            "AB01",
            "slug: must not be a UUID",
        ),
        (
            json!({"name": "n", "ai_provider_id": "openai", "configurations": {"aws_region": "x"}}),
            400,
            "AB01",
            "configurations.aws_region: applies to bedrock",
        ),
        (
            json!({"name": "n", "ai_provider_id": "openai", "configurations": {"custom_host": "ftp://h"}}),
            400,
            "AB01",
            "configurations.custom_host: must be an http(s) URL",
        ),
        (
            json!({"name": "n", "ai_provider_id": "openai", "configurations": {"colour": 1}}),
            400,
            "AB01",
            "configurations.colour: unknown field",
        ),
        (
            json!({"name": "n", "ai_provider_id": "openai", "key": 5}),
            400,
            "AB01",
            "key: invalid type",
        ),
        (
            json!({"name": "n", "ai_provider_id": "openai", "tags": {"k": 1}}),
            400,
            "AB01",
            "tags.k: invalid type",
        ),
        (
            json!({"name": "n", "ai_provider_id": "openai", "tags": {"k": "x".repeat(256)}}),
            400,
            "AB01",
            "tags.k: must be at most 255",
        ),
        (
            json!({"name": "n", "ai_provider_id": "openai", "create_default_provider": false, "default_provider_slug": "p"}),
            400,
            "AB01",
            "default_provider_slug: cannot be set",
        ),
        (
            json!({"name": "n", "ai_provider_id": "openai", "default_provider_slug": "a b"}),
            400,
            "AB01",
            "default_provider_slug: must match",
        ),
        (
            json!({"name": "n", "ai_provider_id": "openai", "workspace_id": "nowhere"}),
            404,
            "AB02",
            "workspace_id: no workspace",
        ),
        (
            json!({"name": "n", "ai_provider_id": "openai", "slug": "taken"}),
            409,
            "AB07",
            "an integration with the slug taken already exists",
        ),
        (
            json!({"name": "n", "ai_provider_id": "openai", "slug": "fresh", "default_provider_slug": "taken"}),
            409,
            "AB07",
            "a provider with the slug taken already exists",
        ),
    ];
    for (body, status, want_code, want) in cases {
        let (got, resp) = app
            .admin("POST", "/v1/integrations", Some(body.clone()))
            .await;
        assert_eq!((got, code(&resp)), (status, want_code), "{body}: {resp}");
        assert!(message(&resp).contains(want), "want {want:?}: {resp}");
    }
    assert_eq!(
        app.audit_count().await,
        before,
        "nothing failed was recorded"
    );
    let (_, list) = app.admin("GET", "/v1/integrations", None).await;
    assert_eq!(list["total"], 1, "no partial write: {list}");
    let (_, providers) = app.admin("GET", "/v1/providers", None).await;
    assert_eq!(providers["total"], 1, "{providers}");
    for (method, path) in [
        ("GET", "/v1/integrations/none"),
        ("DELETE", "/v1/integrations/none"),
        ("GET", "/v1/integrations/none/workspaces"),
        ("PUT", "/v1/integrations/none/workspaces"),
    ] {
        let (status, got) = app.admin(method, path, Some(json!({}))).await;
        assert_eq!(
            (status, code(&got)),
            (404, "AB08"),
            "{method} {path}: {got}"
        );
    }
    for bad in [
        "/v1/integrations?page_size=500",
        "/v1/integrations?ai_provider_id=nope",
        "/v1/integrations?colour=1",
        "/v1/integrations?tags[bad%20key]=1",
    ] {
        let (status, got) = app.admin("GET", bad, None).await;
        assert_eq!((status, code(&got)), (400, "AB01"), "{bad}: {got}");
    }
    let (status, got) = app
        .call(
            "POST",
            "/v1/integrations",
            None,
            Some(json!({"name": "n", "ai_provider_id": "openai"})),
        )
        .await;
    assert_eq!((status, code(&got)), (401, "AB05"));
}

async fn tags_filter_lists(db: TestDb) {
    let app = app_with_key(db).await;
    for (slug, provider, tags) in [
        ("a", "openai", json!({"env": "prod", "team": "a"})),
        ("b", "openai", json!({"env": "prod", "team": "b"})),
        ("c", "anthropic", json!({"env": "dev"})),
        ("d", "groq", json!({})),
    ] {
        create_integration(
            &app,
            json!({"name": slug, "slug": slug, "ai_provider_id": provider, "tags": tags, "create_default_provider": false}),
        )
        .await;
    }
    let slugs = |list: &Value| -> Vec<String> {
        let mut s: Vec<String> = list["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["slug"].as_str().unwrap().to_owned())
            .collect();
        s.sort();
        s
    };
    for (query, want) in [
        ("tags[env]=prod", vec!["a", "b"]),
        ("tags%5Benv%5D=prod&tags%5Bteam%5D=a", vec!["a"]),
        ("tags[env]=staging", vec![]),
        ("tags[env]=prod&ai_provider_id=openai", vec!["a", "b"]),
        ("ai_provider_id=anthropic", vec!["c"]),
        ("", vec!["a", "b", "c", "d"]),
    ] {
        let (status, list) = app
            .admin("GET", &format!("/v1/integrations?{query}"), None)
            .await;
        assert_eq!(status, 200, "{list}");
        assert_eq!(slugs(&list), want, "{query}");
        assert_eq!(list["total"], want.len(), "{query}");
    }
}

async fn workspaces_bulk_update(db: TestDb) {
    let app = app_with_key(db).await;
    let a = app.workspace("A").await;
    let b = app.workspace("B").await;
    let c = app.workspace("C").await;
    let d = app.workspace("D").await;
    let (_, b_ws) = app
        .admin("GET", &format!("/v1/admin/workspaces/{b}"), None)
        .await;
    let b_slug = b_ws["slug"].as_str().unwrap().to_owned();
    // An organisation integration, shared with nobody yet (no default provider).
    create_integration(
        &app,
        json!({"name": "Shared", "slug": "shared", "ai_provider_id": "openai", "key": "sk-shared-12345",
            "create_default_provider": false}),
    )
    .await;
    let (status, got) = app
        .admin("GET", "/v1/integrations/shared/workspaces", None)
        .await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["total"], 5, "default, A, B, C, D: {got}");
    assert!(got["data"]
        .as_array()
        .unwrap()
        .iter()
        .all(|w| w["enabled"] == false));
    assert_eq!(got["global_workspace_access"]["enabled"], false);

    let path = "/v1/integrations/shared/workspaces";
    let (status, got) = app
        .admin(
            "PUT",
            path,
            Some(json!({"workspaces": [
                {"id": a, "enabled": true, "default_provider_slug": "a-openai",
                 "rate_limits": [{"type": "requests", "unit": "rpm", "value": 10}]},
                {"id": b_slug, "enabled": true},
                {"id": c, "enabled": true, "create_default_provider": false,
                 "usage_limits": [{"credit_limit": 10, "type": "cost"}]},
            ]})),
        )
        .await;
    assert_eq!((status, &got), (200, &json!({})));
    let (_, got) = app.admin("GET", path, None).await;
    let enabled: Vec<&str> = got["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["enabled"] == true)
        .map(|w| w["id"].as_str().unwrap())
        .collect();
    assert_eq!(enabled, [a.as_str(), b.as_str(), c.as_str()], "{got}");
    let a_row = got["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["id"] == a.as_str())
        .unwrap();
    assert_eq!(a_row["rate_limits"][0]["value"], 10);
    // Default providers: the slug asked for in A, the integration's slug in B, none in C.
    let (_, providers) = app
        .admin("GET", "/v1/providers?integration_id=shared", None)
        .await;
    let mut made: Vec<(String, String)> = providers["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["workspace_id"].as_str().unwrap().to_owned(),
                p["slug"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    made.sort();
    let mut want = vec![
        (a.clone(), "a-openai".to_owned()),
        (b.clone(), "shared".to_owned()),
    ];
    want.sort();
    assert_eq!(made, want);
    let published = app.store.published();
    assert_eq!(
        published.provider("a-openai").unwrap().api_key.as_deref(),
        Some("sk-shared-12345")
    );
    // Again: no second default provider where one exists; a new workspace gets
    // `<integration>-<workspace>` since `shared` is taken.
    let (status, _) = app
        .admin(
            "PUT",
            path,
            Some(json!({"workspaces": [{"id": b, "enabled": true}, {"id": d, "enabled": true}]})),
        )
        .await;
    assert_eq!(status, 200);
    let (_, providers) = app
        .admin("GET", "/v1/providers?integration_id=shared", None)
        .await;
    assert_eq!(providers["total"], 3, "{providers}");
    let (_, d_ws) = app
        .admin("GET", &format!("/v1/admin/workspaces/{d}"), None)
        .await;
    let d_slug = format!("shared-{}", d_ws["slug"].as_str().unwrap());
    assert!(published.provider(&d_slug).is_some(), "{providers}");

    // A workspace key of C (enabled, no provider yet) makes one; D's is disabled again and
    // its provider leaves the data plane.
    let (_, c_key) = app
        .key(ADMIN_KEY, "/v1/api-keys/workspace/service", json!({"name": "c", "workspace_id": c,
            "scopes": ["providers.create", "workspace_integrations.read", "workspace_integrations.list"]}))
        .await;
    let (status, got) = app
        .call(
            "POST",
            "/v1/providers",
            Some(&c_key),
            Some(json!({"name": "mine", "integration_id": "shared", "slug": "c-own"})),
        )
        .await;
    assert_eq!(status, 200, "{got}");
    let (status, got) = app
        .call("GET", "/v1/integrations/shared", Some(&c_key), None)
        .await;
    assert_eq!(
        status, 200,
        "a workspace key reads an integration shared with it: {got}"
    );
    assert!(got.get("masked_key").is_some());
    let (status, list) = app
        .call("GET", "/v1/integrations", Some(&c_key), None)
        .await;
    assert_eq!((status, &list["total"]), (200, &json!(1)), "{list}");
    let (status, _) = app.call("GET", path, Some(&c_key), None).await;
    assert_eq!(status, 403, "the other workspaces are the admin's business");
    let (status, _) = app
        .call("PUT", path, Some(&c_key), Some(json!({"workspaces": []})))
        .await;
    assert_eq!(status, 403);
    let (status, _) = app
        .admin(
            "PUT",
            path,
            Some(json!({"workspaces": [{"id": d, "enabled": false}]})),
        )
        .await;
    assert_eq!(status, 200);
    assert!(
        published.provider(&d_slug).is_none(),
        "no longer enabled in D"
    );
    let (_, d_key) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/workspace/service",
            json!({"name": "d", "workspace_id": d,
            "scopes": ["providers.create", "workspace_integrations.read"]}),
        )
        .await;
    let (status, got) = app
        .call(
            "POST",
            "/v1/providers",
            Some(&d_key),
            Some(json!({"name": "x", "integration_id": "shared"})),
        )
        .await;
    assert_eq!((status, code(&got)), (404, "AB02"), "{got}");
    let (status, got) = app
        .call("GET", "/v1/integrations/shared", Some(&d_key), None)
        .await;
    assert_eq!(
        (status, code(&got)),
        (404, "AB08"),
        "not shared with D: {got}"
    );

    // Every workspace at once; override_existing_workspace_access drops the per-workspace rows.
    let (status, _) = app
        .admin(
            "PUT",
            path,
            Some(json!({"global_workspace_access": {"enabled": true,
            "rate_limits": [{"type": "tokens", "unit": "rpd", "value": 1000}]},
            "override_existing_workspace_access": true})),
        )
        .await;
    assert_eq!(status, 200);
    let (_, got) = app.admin("GET", path, None).await;
    assert_eq!(got["global_workspace_access"]["enabled"], true, "{got}");
    assert_eq!(
        got["global_workspace_access"]["rate_limits"][0]["value"],
        1000
    );
    assert!(got["data"]
        .as_array()
        .unwrap()
        .iter()
        .all(|w| w["enabled"] == true));
    assert!(got["data"]
        .as_array()
        .unwrap()
        .iter()
        .all(|w| w["rate_limits"] == json!([])));
    assert!(
        published.provider(&d_slug).is_some(),
        "D again, through global access"
    );
    let (status, got) = app
        .call(
            "POST",
            "/v1/providers",
            Some(&d_key),
            Some(json!({"name": "x", "integration_id": "shared"})),
        )
        .await;
    assert_eq!(status, 200, "{got}");

    // Errors.
    create_integration(
        &app,
        json!({"name": "w", "slug": "w", "ai_provider_id": "groq", "workspace_id": a}),
    )
    .await;
    let bad = [
        (
            path,
            json!({"workspaces": [{"id": a, "enabled": true}, {"id": a, "enabled": false}]}),
            400,
            "AB01",
            "workspaces[1].id: repeats",
        ),
        (
            path,
            json!({"workspaces": [{"id": "nowhere", "enabled": true}]}),
            404,
            "AB02",
            "workspaces[0].id: no workspace",
        ),
        (
            path,
            json!({"workspaces": [{"id": a, "enabled": false, "default_provider_slug": "x"}]}),
            400,
            "AB01",
            "workspaces[0].default_provider_slug: needs enabled",
        ),
        (
            path,
            json!({"workspaces": [{"id": "default", "enabled": true, "default_provider_slug": "a-openai"}]}),
            409,
            "AB07",
            "a provider with the slug a-openai already exists",
        ),
        (
            path,
            json!({"workspaces": [{"id": a}]}),
            400,
            "AB01",
            "missing field `enabled`",
        ),
        (
            path,
            json!({"workspaces": [{"id": a, "enabled": true, "rate_limits": [{"type": "requests", "unit": "rpm", "value": 0}]}]}),
            400,
            "AB01",
            "workspaces[0].rate_limits[0].value",
        ),
        (
            path,
            json!({"global_workspace_access": {"enabled": "yes"}}),
            400,
            "AB01",
            "global_workspace_access.enabled",
        ),
        (
            path,
            json!({"colour": 1}),
            400,
            "AB01",
            "colour: unknown field",
        ),
        (
            "/v1/integrations/w/workspaces",
            json!({"workspaces": []}),
            400,
            "AB01",
            "belongs to one workspace",
        ),
    ];
    let before = app.audit_count().await;
    for (p, body, status, want_code, want) in bad {
        let (got, resp) = app.admin("PUT", p, Some(body.clone())).await;
        assert_eq!((got, code(&resp)), (status, want_code), "{body}: {resp}");
        assert!(message(&resp).contains(want), "want {want:?}: {resp}");
    }
    assert_eq!(app.audit_count().await, before);
    // A workspace integration lists its own workspace only.
    let (_, got) = app
        .admin("GET", "/v1/integrations/w/workspaces", None)
        .await;
    assert_eq!(got["total"], 1, "{got}");
    assert_eq!(got["data"][0]["id"], a.as_str());
    assert_eq!(got["data"][0]["enabled"], true);
}

async fn delete_takes_its_providers(db: TestDb) {
    let app = app_with_key(db).await;
    create_integration(
        &app,
        json!({"name": "x", "slug": "x", "ai_provider_id": "openai", "key": "sk-x-1234567"}),
    )
    .await;
    let (status, _) = app
        .admin(
            "POST",
            "/v1/providers",
            Some(json!({"name": "second", "integration_id": "x", "slug": "x-2"})),
        )
        .await;
    assert_eq!(status, 200);
    let published = app.store.published();
    assert!(published.provider("x").is_some() && published.provider("x-2").is_some());
    let before = app.audit_count().await;
    let (status, got) = app.admin("DELETE", "/v1/integrations/x", None).await;
    assert_eq!((status, &got), (200, &json!({})));
    assert_eq!(
        app.audit_count().await,
        before + 3,
        "the integration and its two providers"
    );
    let (status, _) = app.admin("GET", "/v1/integrations/x", None).await;
    assert_eq!(status, 404);
    let (_, list) = app.admin("GET", "/v1/providers", None).await;
    assert_eq!(list["total"], 0, "{list}");
    assert!(published.provider("x").is_none() && published.provider("x-2").is_none());
}

/// The key file of a SQLite database, a second store on the same database, and a wrong key.
async fn the_secret_key(db: TestDb) {
    let app = app_with_key(db).await;
    create_integration(
        &app,
        json!({"name": "k", "slug": "k", "ai_provider_id": "openai", "key": "sk-kept-123456"}),
    )
    .await;
    let url = database_url(&app).await;
    if url.starts_with("sqlite") {
        let file = url.trim_start_matches("sqlite://");
        let key_file = format!("{file}.key");
        let meta = std::fs::metadata(&key_file).expect("a key file beside the database");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        // Another store on the file reads the key and the secret.
        let again = Store::open(&url).await.expect("reopens");
        assert_eq!(
            again.published().provider("k").unwrap().api_key.as_deref(),
            Some("sk-kept-123456")
        );
        again.close().await;
    } else {
        let again = Store::open_with(
            &url,
            DataPlaneOptions {
                secret_key: Some(test_key()),
                config_check: None,
                guardrail_check: None,
            },
        )
        .await
        .expect("reopens with the key");
        assert_eq!(
            again.published().provider("k").unwrap().api_key.as_deref(),
            Some("sk-kept-123456")
        );
        again.close().await;
    }
    // Another key is refused with a clear message.
    let err = Store::open_with(
        &url,
        DataPlaneOptions {
            secret_key: Some(SecretKey::generate()),
            config_check: None,
            guardrail_check: None,
        },
    )
    .await
    .expect_err("a wrong key");
    assert!(err.message.contains("GW_SECRET_KEY"), "{}", err.message);
}

/// The URL of the app's database, from the test harness's database handle.
async fn database_url(app: &App) -> String {
    // The pool does not reveal its URL: the SQLite file is found through the pragma, the
    // PostgreSQL schema through current_schema().
    use admin::db::Backend;
    match app.store.db().backend() {
        Backend::Sqlite => {
            let file: String =
                sqlx::query_scalar("SELECT file FROM pragma_database_list WHERE name = 'main'")
                    .fetch_one(app.store.db().pool())
                    .await
                    .unwrap();
            format!("sqlite://{file}")
        }
        Backend::Postgres => {
            let schema: String = sqlx::query_scalar("SELECT CAST(current_schema() AS TEXT)")
                .fetch_one(app.store.db().pool())
                .await
                .unwrap();
            let server = std::env::var(crate::common::POSTGRES_VAR).unwrap();
            let sep = if server.contains('?') { '&' } else { '?' };
            format!("{server}{sep}options=-c%20search_path%3D{schema}")
        }
    }
}

/// Workspace integrations: a workspace key (admin or manager role) makes and changes them in
/// its workspace; a member reads them; organisation integrations are the admin key's.
async fn authorisation(db: TestDb) {
    let app = app_with_key(db).await;
    let ws = app.workspace("Team").await;
    let other = app.workspace("Other").await;
    let scopes = [
        "workspace_integrations.create",
        "workspace_integrations.read",
        "workspace_integrations.update",
        "workspace_integrations.delete",
        "workspace_integrations.list",
        "providers.create",
    ];
    let (_, manager) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/workspace/service",
            json!({"name": "m", "workspace_id": ws, "scopes": scopes}),
        )
        .await;
    let member_user = app
        .user(
            "member@example.com",
            OrgRole::Member,
            Some((&ws, WorkspaceRole::Member)),
        )
        .await;
    let (_, member) = app.user_key(&ws, &member_user, &scopes).await;

    // The manager: a workspace integration of its own workspace (the default), not elsewhere,
    // not an organisation one.
    let body = json!({"name": "Team OpenAI", "slug": "team-openai", "ai_provider_id": "openai", "key": "sk-team-123456"});
    let (status, made) = app
        .call(
            "POST",
            "/v1/integrations",
            Some(&manager),
            Some(body.clone()),
        )
        .await;
    assert_eq!(status, 200, "{made}");
    assert_eq!(made["default_provider_slug"], "team-openai");
    let (_, got) = app.admin("GET", "/v1/integrations/team-openai", None).await;
    assert_eq!(got["workspace_id"], ws.as_str());
    let mut elsewhere = body.clone();
    elsewhere["slug"] = json!("elsewhere");
    elsewhere["workspace_id"] = json!(other);
    let (status, got) = app
        .call("POST", "/v1/integrations", Some(&manager), Some(elsewhere))
        .await;
    assert_eq!((status, code(&got)), (403, "AB03"), "{got}");
    let (status, _) = app
        .call(
            "PUT",
            "/v1/integrations/team-openai",
            Some(&manager),
            Some(json!({"name": "renamed"})),
        )
        .await;
    assert_eq!(status, 200);
    // Without providers.create, the default provider is refused (or skipped on request).
    let (_, narrow) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/workspace/service",
            json!({"name": "n", "workspace_id": ws,
            "scopes": ["workspace_integrations.create"]}),
        )
        .await;
    let mut third = body.clone();
    third["slug"] = json!("third");
    let (status, got) = app
        .call(
            "POST",
            "/v1/integrations",
            Some(&narrow),
            Some(third.clone()),
        )
        .await;
    assert_eq!((status, code(&got)), (403, "AB03"), "{got}");
    assert!(message(&got).contains("providers.create"), "{got}");
    third["create_default_provider"] = json!(false);
    let (status, got) = app
        .call("POST", "/v1/integrations", Some(&narrow), Some(third))
        .await;
    assert_eq!(status, 200, "{got}");

    // Organisation integrations: the admin key's.
    create_integration(&app, json!({"name": "Org", "slug": "org", "ai_provider_id": "openai", "create_default_provider": false})).await;
    let (status, got) = app
        .call("GET", "/v1/integrations/org", Some(&manager), None)
        .await;
    assert_eq!(
        (status, code(&got)),
        (404, "AB08"),
        "not shared with the workspace: {got}"
    );
    for (method, body) in [("PUT", Some(json!({"name": "x"}))), ("DELETE", None)] {
        let (status, _) = app
            .call(method, "/v1/integrations/org", Some(&manager), body)
            .await;
        assert_eq!(status, 404, "{method}");
    }
    let (status, _) = app
        .admin("PUT", "/v1/integrations/org/workspaces", Some(json!({"workspaces": [{"id": ws, "enabled": true, "create_default_provider": false}]})))
        .await;
    assert_eq!(status, 200);
    let (status, _) = app
        .call("GET", "/v1/integrations/org", Some(&manager), None)
        .await;
    assert_eq!(status, 200, "shared now: read");
    for (method, body) in [("PUT", Some(json!({"name": "x"}))), ("DELETE", None)] {
        let (status, got) = app
            .call(method, "/v1/integrations/org", Some(&manager), body)
            .await;
        assert_eq!((status, code(&got)), (403, "AB03"), "{method}: {got}");
    }
    let (status, list) = app
        .call("GET", "/v1/integrations", Some(&manager), None)
        .await;
    assert_eq!(
        (status, &list["total"]),
        (200, &json!(3)),
        "its own two and the shared one: {list}"
    );
    let (status, _) = app
        .call(
            "GET",
            &format!("/v1/integrations?workspace_id={other}"),
            Some(&manager),
            None,
        )
        .await;
    assert_eq!(status, 403);

    // The member: reads, never writes.
    let (status, _) = app
        .call("GET", "/v1/integrations/team-openai", Some(&member), None)
        .await;
    assert_eq!(status, 200);
    let (status, list) = app
        .call("GET", "/v1/integrations", Some(&member), None)
        .await;
    assert_eq!((status, &list["total"]), (200, &json!(3)));
    let mut fourth = body.clone();
    fourth["slug"] = json!("fourth");
    let (status, got) = app
        .call("POST", "/v1/integrations", Some(&member), Some(fourth))
        .await;
    assert_eq!((status, code(&got)), (403, "AB03"), "{got}");
    for (method, body) in [("PUT", Some(json!({"name": "x"}))), ("DELETE", None)] {
        let (status, got) = app
            .call(method, "/v1/integrations/team-openai", Some(&member), body)
            .await;
        assert_eq!((status, code(&got)), (403, "AB03"), "{method}: {got}");
    }
    let (status, _) = app
        .call(
            "DELETE",
            "/v1/integrations/team-openai",
            Some(&manager),
            None,
        )
        .await;
    assert_eq!(status, 200);
}

crate::on_both_databases!(
    secrets_are_encrypted_and_never_returned,
    update_merges_settings_and_replaces_the_key,
    bad_input,
    tags_filter_lists,
    workspaces_bulk_update,
    delete_takes_its_providers,
    the_secret_key,
    authorisation,
);
