//! `/v1/providers` and the legacy `/v1/virtual-keys`: every endpoint's success and error
//! statuses, slugs, limits, expiry, tags, the data plane's view (at once on this instance,
//! within a second or two on another one), and who may do what.

use std::time::{Duration, Instant};

use admin::authz::{OrgRole, WorkspaceRole};
use admin::{BootstrapOptions, ControlPlane, Options};
use bytes::Bytes;
use plugin_sdk::store::ProviderStore;
use serde_json::{json, Value};

use crate::common::{App, TestDb, ADMIN_KEY};
use crate::integrations::{app_with_key, create_integration, TEST_SECRET_KEY};

fn code(body: &Value) -> &str {
    body["data"]["errorCode"].as_str().unwrap_or_default()
}

fn message(body: &Value) -> &str {
    body["data"]["message"].as_str().unwrap_or_default()
}

fn in_days(days: i64) -> String {
    (chrono::Utc::now() + chrono::Duration::days(days)).to_rfc3339()
}

/// An integration `base` of the default workspace (openai, a key, a custom host) without its
/// default provider.
async fn base_integration(app: &App) {
    create_integration(
        app,
        json!({"name": "Base", "slug": "base", "ai_provider_id": "openai", "key": "sk-base-123456",
            "workspace_id": "default", "configurations": {"custom_host": "http://127.0.0.1:9/v1"},
            "create_default_provider": false}),
    )
    .await;
}

async fn create_get_list_update_delete(db: TestDb) {
    let app = app_with_key(db).await;
    base_integration(&app).await;
    let ws = app.workspace("Team").await;
    let before = app.audit_count().await;
    let (status, made) = app
        .admin(
            "POST",
            "/v1/providers",
            Some(json!({
                "name": "Prod OpenAI", "integration_id": "base", "slug": "prod-openai",
                "note": "for production",
                "usage_limits": {"credit_limit": 100, "type": "cost", "alert_threshold": 80, "periodic_reset": "monthly"},
                "rate_limits": [{"type": "requests", "unit": "rpm", "value": 60}],
                "expires_at": in_days(30), "tags": {"env": "prod"},
            })),
        )
        .await;
    assert_eq!(status, 200, "{made}");
    assert_eq!(made["slug"], "prod-openai");
    let id = made["id"].as_str().unwrap().to_owned();
    assert_eq!(app.audit_count().await, before + 1);
    for key in ["prod-openai", id.as_str()] {
        let (status, got) = app
            .admin("GET", &format!("/v1/providers/{key}"), None)
            .await;
        assert_eq!(status, 200, "{got}");
        assert_eq!(got["id"], id.as_str());
        assert_eq!(got["name"], "Prod OpenAI");
        assert_eq!(got["note"], "for production");
        assert_eq!(got["status"], "active");
        assert_eq!(got["integration_id"], "base");
        assert_eq!(got["ai_provider_id"], "openai");
        assert_eq!(got["workspace_id"], app.default_ws.as_str());
        assert_eq!(got["usage_limits"]["credit_limit"], 100);
        assert_eq!(got["usage_limits"]["current_usage"], 0.0);
        assert_eq!(got["rate_limits"][0]["value"], 60);
        assert_eq!(got["tags"], json!({"env": "prod"}));
        assert!(got["expires_at"].is_string());
        assert_eq!(got["object"], "provider");
        assert!(!got.to_string().contains("sk-base-123456"));
    }
    // The data plane: the integration's provider id, key and host under the provider's slug.
    let published = app.store.published();
    let record = published
        .provider("prod-openai")
        .expect("published at once");
    assert_eq!(record.provider, "openai");
    assert_eq!(record.api_key.as_deref(), Some("sk-base-123456"));
    assert_eq!(record.custom_host.as_deref(), Some("http://127.0.0.1:9/v1"));

    // A generated slug; another workspace.
    let (status, made) = app
        .admin(
            "POST",
            "/v1/providers",
            Some(json!({"name": "Dev OpenAI!", "integration_id": "base", "workspace_id": "default", "tags": {"env": "dev"}})),
        )
        .await;
    assert_eq!(status, 200, "{made}");
    let generated = made["slug"].as_str().unwrap().to_owned();
    assert!(
        generated.starts_with("dev-openai-") && generated.len() == "dev-openai-".len() + 6,
        "{made}"
    );

    // Lists and filters.
    let (_, list) = app.admin("GET", "/v1/providers", None).await;
    assert_eq!(list["total"], 2, "{list}");
    assert_eq!(list["data"][0]["slug"], generated.as_str(), "newest first");
    for (query, total) in [
        ("tags[env]=prod", 1),
        ("tags[env]=dev&integration_id=base", 1),
        ("integration_id=base", 2),
        ("status=active", 2),
        ("status=expired", 0),
        ("workspace_id=default", 2),
        (&format!("workspace_id={ws}"), 0),
        ("page_size=1&current_page=1", 2),
    ] {
        let (status, list) = app
            .admin("GET", &format!("/v1/providers?{query}"), None)
            .await;
        assert_eq!(
            (status, &list["total"]),
            (200, &json!(total)),
            "{query}: {list}"
        );
    }

    // Update.
    let path = "/v1/providers/prod-openai";
    let (status, got) = app
        .admin(
            "PUT",
            path,
            Some(json!({"name": "Prod", "note": null, "usage_limits": null,
                "rate_limits": [], "expires_at": null, "tags": {"env": "prod", "tier": "1"}})),
        )
        .await;
    assert_eq!((status, &got), (200, &json!({})));
    let (_, got) = app.admin("GET", path, None).await;
    assert_eq!(got["name"], "Prod");
    assert_eq!(got["note"], Value::Null);
    assert_eq!(got["usage_limits"], Value::Null);
    assert_eq!(got["rate_limits"], json!([]));
    assert_eq!(got["expires_at"], Value::Null);
    let (_, list) = app.admin("GET", "/v1/providers?tags[tier]=1", None).await;
    assert_eq!(list["total"], 1, "{list}");
    // Exhausted (by the data plane, later): reset_usage makes it active again.
    app.sql(
        "UPDATE providers SET status = 'exhausted', current_usage = 5 WHERE slug = $1",
        &["prod-openai"],
    )
    .await;
    let (_, got) = app.admin("GET", path, None).await;
    assert_eq!(got["status"], "exhausted");
    let (status, _) = app
        .admin("PUT", path, Some(json!({"reset_usage": true})))
        .await;
    assert_eq!(status, 200);
    let (_, got) = app.admin("GET", path, None).await;
    assert_eq!(got["status"], "active");

    let (status, got) = app.admin("DELETE", path, None).await;
    assert_eq!((status, &got), (200, &json!({})));
    let (status, got) = app.admin("GET", path, None).await;
    assert_eq!((status, code(&got)), (404, "AB08"));
    assert!(published.provider("prod-openai").is_none());
    let (_, integration) = app.admin("GET", "/v1/integrations/base", None).await;
    assert_eq!(integration["slug"], "base", "the integration stays");
}

async fn bad_input(db: TestDb) {
    let app = app_with_key(db).await;
    base_integration(&app).await;
    let ws = app.workspace("Team").await;
    create_integration(
        &app,
        json!({"name": "w", "slug": "w", "ai_provider_id": "groq", "workspace_id": ws}),
    )
    .await;
    let (status, _) = app
        .admin(
            "POST",
            "/v1/providers",
            Some(json!({"name": "p", "integration_id": "base", "slug": "taken"})),
        )
        .await;
    assert_eq!(status, 200);
    let before = app.audit_count().await;
    let cases = [
        (
            json!({"integration_id": "base"}),
            400,
            "AB01",
            "missing field `name`",
        ),
        (
            json!({"name": "n"}),
            400,
            "AB01",
            "missing field `integration_id`",
        ),
        (
            json!({"name": "x".repeat(256), "integration_id": "base"}),
            400,
            "AB01",
            "name: must be at most 255",
        ),
        (
            json!({"name": "n", "integration_id": "base", "slug": "bad slug"}),
            400,
            "AB01",
            "slug: must match",
        ),
        (
            json!({"name": "n", "integration_id": "base", "slug": "s".repeat(256)}),
            400,
            "AB01",
            "slug: must be at most 255",
        ),
        (
            json!({"name": "n", "integration_id": "base", "note": "x".repeat(1025)}),
            400,
            "AB01",
            "note: must be at most 1024",
        ),
        (
            json!({"name": "n", "integration_id": "base", "usage_limits": {"credit_limit": 0}}),
            400,
            "AB01",
            "usage_limits.credit_limit: must be >= 1",
        ),
        (
            json!({"name": "n", "integration_id": "base", "rate_limits": [{"type": "requests", "unit": "rps", "value": 1}]}),
            400,
            "AB01",
            "rate_limits[0].unit",
        ),
        (
            json!({"name": "n", "integration_id": "base", "expires_at": "2020-01-01T00:00:00Z"}),
            400,
            "AB01",
            "expires_at: must be in the future",
        ),
        (
            json!({"name": "n", "integration_id": "base", "expires_at": "tomorrow"}),
            400,
            "AB01",
            "expires_at: must be an RFC 3339 time",
        ),
        (
            json!({"name": "n", "integration_id": "base", "tags": {"": "v"}}),
            400,
            "AB01",
            "a tag name",
        ),
        (
            json!({"name": "n", "integration_id": "base", "status": "active"}),
            400,
            "AB01",
            "status: unknown field",
        ),
        (
            json!({"name": "n", "integration_id": "nope"}),
            404,
            "AB02",
            "integration_id: no integration \"nope\"",
        ),
        (
            json!({"name": "n", "integration_id": "w"}),
            404,
            "AB02",
            "integration_id: the integration w is not enabled for this workspace",
        ),
        (
            json!({"name": "n", "integration_id": "base", "workspace_id": "nowhere"}),
            404,
            "AB02",
            "workspace_id: no workspace",
        ),
        (
            json!({"name": "n", "integration_id": "base", "slug": "taken"}),
            409,
            "AB07",
            "a provider with the slug taken already exists",
        ),
    ];
    for (body, status, want_code, want) in cases {
        let (got, resp) = app.admin("POST", "/v1/providers", Some(body.clone())).await;
        assert_eq!((got, code(&resp)), (status, want_code), "{body}: {resp}");
        assert!(message(&resp).contains(want), "want {want:?}: {resp}");
    }
    for (body, want) in [
        (json!({"name": ""}), "name: must not be empty"),
        (
            json!({"expires_at": "2020-01-01T00:00:00Z"}),
            "expires_at: must be in the future",
        ),
        (
            json!({"integration_id": "w"}),
            "integration_id: unknown field",
        ),
        (json!({"slug": "other"}), "slug: unknown field"),
        (json!({"reset_usage": "yes"}), "reset_usage: invalid type"),
    ] {
        let (status, resp) = app
            .admin("PUT", "/v1/providers/taken", Some(body.clone()))
            .await;
        assert_eq!((status, code(&resp)), (400, "AB01"), "{body}: {resp}");
        assert!(message(&resp).contains(want), "want {want:?}: {resp}");
    }
    for (method, path) in [
        ("GET", "/v1/providers/none"),
        ("PUT", "/v1/providers/none"),
        ("DELETE", "/v1/providers/none"),
    ] {
        let (status, got) = app.admin(method, path, Some(json!({}))).await;
        assert_eq!((status, code(&got)), (404, "AB08"), "{method}: {got}");
    }
    for bad in [
        "/v1/providers?status=gone",
        "/v1/providers?page_size=-1",
        "/v1/providers?integration_id=nope",
        "/v1/providers?tags=x",
    ] {
        let (status, got) = app.admin("GET", bad, None).await;
        assert!(status == 400 || status == 404, "{bad}: {got}");
        assert!(code(&got) == "AB01" || code(&got) == "AB02", "{bad}: {got}");
    }
    let (status, _) = app.call("GET", "/v1/providers", None, None).await;
    assert_eq!(status, 401);
    assert_eq!(
        app.audit_count().await,
        before,
        "nothing failed was recorded"
    );
}

async fn expired_providers(db: TestDb) {
    let app = app_with_key(db).await;
    base_integration(&app).await;
    let (status, _) = app
        .admin("POST", "/v1/providers", Some(json!({"name": "p", "integration_id": "base", "slug": "soon", "expires_at": in_days(1)})))
        .await;
    assert_eq!(status, 200);
    let published = app.store.published();
    assert!(published.provider("soon").is_some());
    // Its time passes: expired at once for the API and the data plane, marked by the sweep.
    app.sql(
        "UPDATE providers SET expires_at = '2020-01-01T00:00:00.000000Z' WHERE slug = $1",
        &["soon"],
    )
    .await;
    let (_, got) = app.admin("GET", "/v1/providers/soon", None).await;
    assert_eq!(got["status"], "expired", "{got}");
    let (_, list) = app.admin("GET", "/v1/providers?status=expired", None).await;
    assert_eq!(list["total"], 1);
    let (_, list) = app.admin("GET", "/v1/providers?status=active", None).await;
    assert_eq!(list["total"], 0);
    // The snapshot holds the time it was built with; a forced rebuild applies the change.
    app.sql(
        "UPDATE data_plane_version SET version = version + 1 WHERE id = 1",
        &[],
    )
    .await;
    app.store.refresh_data_plane().await.unwrap();
    assert!(
        published.provider("soon").is_none(),
        "not served once expired"
    );
    assert_eq!(app.store.expire_providers().await.unwrap(), 1);
    assert_eq!(app.store.expire_providers().await.unwrap(), 0);
    // A new expiry in the future brings it back.
    let (status, _) = app
        .admin(
            "PUT",
            "/v1/providers/soon",
            Some(json!({"expires_at": in_days(2)})),
        )
        .await;
    assert_eq!(status, 200);
    let (_, got) = app.admin("GET", "/v1/providers/soon", None).await;
    assert_eq!(got["status"], "active");
    assert!(published.provider("soon").is_some());
}

async fn virtual_keys(db: TestDb) {
    let app = app_with_key(db).await;
    let before = app.audit_count().await;
    let (status, made) = app
        .admin(
            "POST",
            "/v1/virtual-keys",
            Some(json!({"name": "Legacy groq", "provider": "groq", "key": "gsk-legacy-123456", "note": "old",
                "rate_limits": [{"type": "requests", "unit": "rph", "value": 5}]})),
        )
        .await;
    assert_eq!(status, 200, "{made}");
    let slug = made["slug"].as_str().unwrap().to_owned();
    assert!(slug.starts_with("legacy-groq-"), "{made}");
    assert_eq!(app.audit_count().await, before + 2);
    let path = format!("/v1/virtual-keys/{slug}");
    let (status, got) = app.admin("GET", &path, None).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["provider"], "groq");
    assert_eq!(got["key"], "gs*******56");
    assert_eq!(got["note"], "old");
    assert_eq!(got["status"], "active");
    assert_eq!(got["object"], "virtual-key");
    assert_eq!(got["rate_limits"][0]["unit"], "rph");
    // The same provider under /providers, and in the data plane.
    let (status, got) = app
        .admin("GET", &format!("/v1/providers/{slug}"), None)
        .await;
    assert_eq!(status, 200, "{got}");
    let published = app.store.published();
    assert_eq!(
        published.provider(&slug).unwrap().api_key.as_deref(),
        Some("gsk-legacy-123456")
    );
    let (_, list) = app.admin("GET", "/v1/virtual-keys", None).await;
    assert_eq!(list["total"], 1);
    assert_eq!(list["data"][0]["key"], "gs*******56");

    let (status, _) = app
        .admin(
            "PUT",
            &path,
            Some(json!({"key": "gsk-rotated-654321", "name": "Renamed", "note": null})),
        )
        .await;
    assert_eq!(status, 200);
    let (_, got) = app.admin("GET", &path, None).await;
    assert_eq!(
        (&got["name"], &got["key"], &got["note"]),
        (&json!("Renamed"), &json!("gs*******21"), &Value::Null)
    );
    assert_eq!(
        published.provider(&slug).unwrap().api_key.as_deref(),
        Some("gsk-rotated-654321")
    );

    for (body, want_status, want) in [
        (json!({"name": "n"}), 400, "missing field `provider`"),
        (
            json!({"name": "n", "provider": "nope"}),
            400,
            "provider: unknown provider",
        ),
        (
            json!({"name": "n", "provider": "groq", "key": ""}),
            400,
            "key: must not be empty",
        ),
        (
            json!({"name": "n", "provider": "groq", "colour": 1}),
            400,
            "colour: unknown field",
        ),
        (
            json!({"name": "n", "provider": "groq", "slug": slug}),
            409,
            "already exists",
        ),
        (
            json!({"name": "n", "provider": "groq", "workspace_id": "nowhere"}),
            404,
            "no workspace",
        ),
    ] {
        let (status, got) = app
            .admin("POST", "/v1/virtual-keys", Some(body.clone()))
            .await;
        assert_eq!(status, want_status, "{body}: {got}");
        assert!(message(&got).contains(want), "want {want:?}: {got}");
    }
    // A provider of a shared integration keeps its key in the integration.
    base_integration(&app).await;
    let (_, made) = app
        .admin(
            "POST",
            "/v1/providers",
            Some(json!({"name": "p", "integration_id": "base", "slug": "from-base"})),
        )
        .await;
    assert_eq!(made["slug"], "from-base");
    let (status, got) = app
        .admin(
            "PUT",
            "/v1/virtual-keys/from-base",
            Some(json!({"key": "sk-other-12345"})),
        )
        .await;
    assert_eq!((status, code(&got)), (400, "AB01"), "{got}");
    assert!(message(&got).contains("PUT /integrations/base"), "{got}");

    // Deleting the virtual key takes the integration made for it; a provider of a shared one
    // leaves its integration.
    let (status, _) = app.admin("DELETE", &path, None).await;
    assert_eq!(status, 200);
    let (status, _) = app.admin("GET", &path, None).await;
    assert_eq!(status, 404);
    let (_, list) = app.admin("GET", "/v1/integrations", None).await;
    assert_eq!(list["total"], 1, "only base is left: {list}");
    assert!(published.provider(&slug).is_none());
    let (status, _) = app
        .admin("DELETE", "/v1/virtual-keys/from-base", None)
        .await;
    assert_eq!(status, 200);
    let (status, _) = app.admin("GET", "/v1/integrations/base", None).await;
    assert_eq!(status, 200);
}

/// Providers and virtual keys: the admin key everywhere; a workspace key (admin or manager)
/// in its workspace; a member reads only; each under its own scopes.
async fn authorisation(db: TestDb) {
    let app = app_with_key(db).await;
    let ws = app.workspace("Team").await;
    let other = app.workspace("Other").await;
    create_integration(&app, json!({"name": "t", "slug": "team", "ai_provider_id": "openai", "workspace_id": ws, "create_default_provider": false})).await;
    create_integration(&app, json!({"name": "o", "slug": "other", "ai_provider_id": "openai", "workspace_id": other, "create_default_provider": false})).await;
    let crud = |family: &str| -> Vec<String> {
        ["create", "read", "update", "delete", "list"]
            .iter()
            .map(|op| format!("{family}.{op}"))
            .collect()
    };
    let mut scopes = crud("providers");
    scopes.extend(crud("virtual_keys"));
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
    let scope_refs: Vec<&str> = scopes.iter().map(String::as_str).collect();
    let (_, member) = app.user_key(&ws, &member_user, &scope_refs).await;
    let (_, providers_only) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/workspace/service",
            json!({"name": "p", "workspace_id": ws, "scopes": crud("providers")}),
        )
        .await;

    let body = json!({"name": "p", "integration_id": "team", "slug": "team-p"});
    let (status, got) = app
        .call("POST", "/v1/providers", Some(&manager), Some(body))
        .await;
    assert_eq!(status, 200, "{got}");
    let (status, got) = app
        .call(
            "POST",
            "/v1/providers",
            Some(&manager),
            Some(json!({"name": "p", "integration_id": "other", "workspace_id": other})),
        )
        .await;
    assert_eq!((status, code(&got)), (403, "AB03"), "{got}");
    let (status, got) = app
        .call(
            "POST",
            "/v1/providers",
            Some(&manager),
            Some(json!({"name": "p", "integration_id": "other"})),
        )
        .await;
    assert_eq!(
        (status, code(&got)),
        (404, "AB02"),
        "another workspace's integration: {got}"
    );
    let (status, _) = app
        .admin("POST", "/v1/providers", Some(json!({"name": "p", "integration_id": "other", "workspace_id": other, "slug": "other-p"})))
        .await;
    assert_eq!(status, 200);
    for (method, body) in [
        ("GET", None),
        ("PUT", Some(json!({"name": "x"}))),
        ("DELETE", None),
    ] {
        let (status, got) = app
            .call(method, "/v1/providers/other-p", Some(&manager), body)
            .await;
        assert_eq!((status, code(&got)), (403, "AB03"), "{method}: {got}");
    }
    let (status, list) = app.call("GET", "/v1/providers", Some(&manager), None).await;
    assert_eq!((status, &list["total"]), (200, &json!(1)), "{list}");
    let (status, _) = app
        .call(
            "GET",
            &format!("/v1/providers?workspace_id={other}"),
            Some(&manager),
            None,
        )
        .await;
    assert_eq!(status, 403);
    let (status, made) = app
        .call(
            "POST",
            "/v1/virtual-keys",
            Some(&manager),
            Some(json!({"name": "vk", "provider": "openai", "key": "sk-vk-1234567"})),
        )
        .await;
    assert_eq!(status, 200, "{made}");
    let vk = format!("/v1/virtual-keys/{}", made["slug"].as_str().unwrap());

    // The member reads; writes are refused.
    for path in [
        "/v1/providers/team-p",
        "/v1/providers",
        vk.as_str(),
        "/v1/virtual-keys",
    ] {
        let (status, got) = app.call("GET", path, Some(&member), None).await;
        assert_eq!(status, 200, "{path}: {got}");
    }
    let (status, got) = app
        .call(
            "POST",
            "/v1/providers",
            Some(&member),
            Some(json!({"name": "p", "integration_id": "team"})),
        )
        .await;
    assert_eq!((status, code(&got)), (403, "AB03"), "{got}");
    let (status, _) = app
        .call(
            "POST",
            "/v1/virtual-keys",
            Some(&member),
            Some(json!({"name": "vk", "provider": "openai"})),
        )
        .await;
    assert_eq!(status, 403);
    for (method, path, body) in [
        ("PUT", "/v1/providers/team-p", Some(json!({"name": "x"}))),
        ("DELETE", "/v1/providers/team-p", None),
        ("PUT", vk.as_str(), Some(json!({"name": "x"}))),
        ("DELETE", vk.as_str(), None),
    ] {
        let (status, got) = app.call(method, path, Some(&member), body).await;
        assert_eq!(
            (status, code(&got)),
            (403, "AB03"),
            "{method} {path}: {got}"
        );
    }

    // virtual_keys.* and providers.* are separate scopes.
    let (status, got) = app
        .call("GET", vk.as_str(), Some(&providers_only), None)
        .await;
    assert_eq!((status, code(&got)), (403, "AB03"), "{got}");
    assert!(message(&got).contains("virtual_keys.read"), "{got}");
    let (status, _) = app
        .call("GET", "/v1/providers/team-p", Some(&providers_only), None)
        .await;
    assert_eq!(status, 200);

    let (status, _) = app.call("DELETE", vk.as_str(), Some(&manager), None).await;
    assert_eq!(status, 200);
    let (status, _) = app.admin("DELETE", "/v1/providers/other-p", None).await;
    assert_eq!(status, 200);
}

/// A workspace holding configs, integrations and providers is deleted only with force_delete,
/// which takes them (and their place in the data plane) with it.
async fn workspace_deletion(db: TestDb) {
    let app = app_with_key(db).await;
    let ws = app.workspace("Doomed").await;
    create_integration(&app, json!({"name": "d", "slug": "doomed", "ai_provider_id": "openai", "workspace_id": ws, "key": "sk-doomed-1234"})).await;
    let (status, made) = app
        .admin(
            "POST",
            "/v1/configs",
            Some(json!({"name": "c", "config": {"provider": "@doomed"}, "workspace_id": ws})),
        )
        .await;
    assert_eq!(status, 200, "{made}");
    let config = made["slug"].as_str().unwrap().to_owned();
    let published = app.store.published();
    assert!(published.provider("doomed").is_some());
    let path = format!("/v1/admin/workspaces/{ws}");
    let (status, got) = app.admin("DELETE", &path, None).await;
    assert_eq!((status, code(&got)), (409, "AB07"), "{got}");
    assert!(
        message(&got).contains("1 config(s), 1 integration(s), 1 provider(s)"),
        "{got}"
    );
    let (status, got) = app
        .admin("DELETE", &path, Some(json!({"force_delete": true})))
        .await;
    assert_eq!(status, 200, "{got}");
    assert!(published.provider("doomed").is_none());
    use plugin_sdk::store::ConfigStore;
    assert!(published.config(&config).is_none());
    let (_, list) = app.admin("GET", "/v1/integrations", None).await;
    assert_eq!(list["total"], 0, "{list}");
}

/// Sends a request to a control plane; returns the status and JSON body.
async fn send(cp: &ControlPlane, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("x-gw-api-key", ADMIN_KEY)
        .header("content-type", "application/json")
        .body(body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string())))
        .unwrap();
    req.extensions_mut().insert(admin::ClientAddr(None));
    let resp = cp.handle(req).await;
    let status = resp.status().as_u16();
    (
        status,
        serde_json::from_slice(resp.body()).unwrap_or(Value::Null),
    )
}

/// Waits up to `limit` for `check`; returns how long it took.
async fn within(limit: Duration, mut check: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if check() {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// Two control planes on one database, as two gateways would be: a change made through one
/// is in its own data plane at once and in the other's within two seconds (PostgreSQL: by
/// notification, the other's polling being left at a minute; SQLite: by polling the version).
async fn another_instance_learns_of_changes(db: TestDb) {
    let postgres = db.url.starts_with("postgres");
    let start = |refresh: Duration| {
        let mut options = Options::new(db.url.clone());
        options.bootstrap = BootstrapOptions {
            admin_key: Some(ADMIN_KEY.into()),
            ..BootstrapOptions::default()
        };
        options.secret_key = Some(TEST_SECRET_KEY.into());
        options.refresh_interval = refresh;
        ControlPlane::start(options).expect("starts")
    };
    let slow = if postgres {
        Duration::from_secs(60)
    } else {
        Duration::from_millis(250)
    };
    let one = start(slow);
    let two = start(slow);
    // Let the second one's listener connect (it catches up in any case once it has).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, made) = send(
        &one,
        "POST",
        "/v1/integrations",
        Some(json!({"name": "Shared", "slug": "shared", "ai_provider_id": "openai", "key": "sk-first-123456"})),
    )
    .await;
    assert_eq!(status, 200, "{made}");
    let here = one.store().published();
    let there = two.store().published();
    assert!(
        here.provider("shared").is_some(),
        "this instance's data plane has it at once"
    );
    let took = within(Duration::from_secs(2), || {
        there.provider("shared").is_some()
    })
    .await;
    assert!(took.is_some(), "the other instance learns of it within 2 s");

    let (status, _) = send(
        &one,
        "PUT",
        "/v1/integrations/shared",
        Some(json!({"key": "sk-second-123456"})),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        here.provider("shared").unwrap().api_key.as_deref(),
        Some("sk-second-123456")
    );
    let took = within(Duration::from_secs(2), || {
        there
            .provider("shared")
            .and_then(|r| r.api_key.clone())
            .as_deref()
            == Some("sk-second-123456")
    })
    .await;
    assert!(took.is_some(), "the new key reaches the other instance");

    let (status, made) = send(
        &two,
        "POST",
        "/v1/configs",
        Some(json!({"name": "c", "config": {"provider": "@shared"}})),
    )
    .await;
    assert_eq!(status, 200, "{made}");
    let slug = made["slug"].as_str().unwrap().to_owned();
    use plugin_sdk::store::ConfigStore;
    let took = within(Duration::from_secs(2), || here.config(&slug).is_some()).await;
    assert!(took.is_some(), "configs travel the other way too");

    let (status, _) = send(&one, "DELETE", "/v1/integrations/shared", None).await;
    assert_eq!(status, 200);
    assert!(here.provider("shared").is_none());
    let took = within(Duration::from_secs(2), || {
        there.provider("shared").is_none()
    })
    .await;
    assert!(took.is_some(), "the deletion reaches the other instance");
    drop(one);
    drop(two);
}

/// The data plane's record of a provider carries its own rate limits, budget and counted
/// usage, and keeps serving an exhausted provider (the data plane answers it with a 412 from its
/// counters) until it is reset or its limit raised.
async fn limits_and_counted_usage_reach_the_data_plane(db: TestDb) {
    use plugin_sdk::access::{
        CountedUsage, PeriodicReset, RateLimit, RateLimitKind, RateUnit, UsageKind,
    };
    use plugin_sdk::sinks::UsageCharge;

    let app = app_with_key(db).await;
    base_integration(&app).await;
    let (status, made) = app
        .admin(
            "POST",
            "/v1/providers",
            Some(json!({
                "name": "Capped", "integration_id": "base", "slug": "capped",
                "usage_limits": {"credit_limit": 10, "type": "tokens", "alert_threshold": 8,
                                 "periodic_reset": "weekly"},
                "rate_limits": [{"type": "requests", "unit": "rpm", "value": 3},
                                {"type": "tokens", "unit": "rph", "value": 1000}],
            })),
        )
        .await;
    assert_eq!(status, 200, "{made}");
    let (status, made) = app
        .admin(
            "POST",
            "/v1/providers",
            Some(json!({"name": "Free", "integration_id": "base", "slug": "free"})),
        )
        .await;
    assert_eq!(status, 200, "{made}");
    let published = app.store.published();

    let free = published.provider("free").expect("published");
    assert!(free.rate_limits.is_empty());
    assert_eq!(free.usage_limits, None);
    assert_eq!(free.counted, CountedUsage::default());

    let capped = published.provider("capped").expect("published");
    assert_eq!(
        capped.rate_limits,
        [
            RateLimit {
                kind: RateLimitKind::Requests,
                unit: RateUnit::Rpm,
                value: 3.0
            },
            RateLimit {
                kind: RateLimitKind::Tokens,
                unit: RateUnit::Rph,
                value: 1000.0
            }
        ]
    );
    let limit = capped.usage_limits.clone().expect("a budget");
    assert_eq!(limit.credit_limit, 10.0);
    assert_eq!(limit.kind, UsageKind::Tokens);
    assert_eq!(limit.alert_threshold, Some(8.0));
    assert_eq!(limit.periodic_reset, Some(PeriodicReset::Weekly));
    assert_eq!(capped.counted, CountedUsage::default());

    // Usage the data plane settled reaches the record with the next rebuild.
    let period = limit.period_at(std::time::SystemTime::now());
    let charge = |amount: f64, epoch: i64| UsageCharge {
        budget_id: "provider:capped".into(),
        value_key: String::new(),
        amount,
        period,
        reset_epoch: epoch,
    };
    let report = app
        .store
        .apply_usage_charges(&[charge(4.0, 0)])
        .await
        .unwrap();
    assert_eq!(report.applied, 1);
    crate::common::rebuild(&app).await;
    assert_eq!(
        published.provider("capped").unwrap().counted,
        CountedUsage {
            current_usage: 4.0,
            period,
            reset_epoch: 0
        }
    );

    // Exhausted: still served, with the usage that refuses it.
    app.store
        .apply_usage_charges(&[charge(6.0, 0)])
        .await
        .unwrap();
    let (_, got) = app.admin("GET", "/v1/providers/capped", None).await;
    assert_eq!(got["status"], "exhausted", "{got}");
    crate::common::rebuild(&app).await;
    let exhausted = published
        .provider("capped")
        .expect("an exhausted provider stays in the data plane");
    assert_eq!(exhausted.counted.current_usage, 10.0);
    assert_eq!(exhausted.api_key.as_deref(), Some("sk-base-123456"));

    // A manual reset starts a new epoch at zero, at once.
    let (status, _) = app
        .admin(
            "PUT",
            "/v1/providers/capped",
            Some(json!({"reset_usage": true})),
        )
        .await;
    assert_eq!(status, 200);
    let reset = published.provider("capped").unwrap();
    assert_eq!(reset.counted.current_usage, 0.0);
    assert_eq!(reset.counted.reset_epoch, 1);

    // Limits removed: none in the record.
    let (status, _) = app
        .admin(
            "PUT",
            "/v1/providers/capped",
            Some(json!({"usage_limits": null, "rate_limits": []})),
        )
        .await;
    assert_eq!(status, 200);
    let bare = published.provider("capped").unwrap();
    assert!(bare.rate_limits.is_empty());
    assert_eq!(bare.usage_limits, None);

    // A row whose limits cannot be read is left out (refused), not served unlimited.
    app.sql(
        "UPDATE providers SET rate_limits = 'not json' WHERE slug = $1",
        &["capped"],
    )
    .await;
    crate::common::rebuild(&app).await;
    assert!(published.provider("capped").is_none());
    assert!(published.provider("free").is_some(), "the others stay");
}

crate::on_both_databases!(
    create_get_list_update_delete,
    bad_input,
    expired_providers,
    virtual_keys,
    authorisation,
    workspace_deletion,
    another_instance_learns_of_changes,
    limits_and_counted_usage_reach_the_data_plane,
);
