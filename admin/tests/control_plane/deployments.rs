//! `/v1/deployments`: create, list with the `type` filter, get by id or slug, update, delete,
//! workspace restrictions, bad input, and the `deployments.*` / `deployments:*` scopes.

use serde_json::{json, Value};

use admin::authz::{OrgRole, WorkspaceRole};

use crate::common::{App, TestDb, ADMIN_KEY, WS_SCOPES};

fn code(body: &Value) -> &str {
    body["data"]["errorCode"].as_str().unwrap_or_default()
}

fn message(body: &Value) -> &str {
    body["data"]["message"].as_str().unwrap_or_default()
}

async fn crud_and_type_filter(db: TestDb) {
    let app = App::start(db).await;
    let (s, edge) = app
        .admin(
            "POST",
            "/v1/deployments",
            Some(json!({
                "name": "Edge EU",
                "slug": "edge-eu",
                "type": "production",
                "deployment_config": {"region": "eu-west-1", "replicas": 3},
                "workspace_restrictions": ["default"],
            })),
        )
        .await;
    assert_eq!(s, 200, "{edge}");
    assert_eq!(edge["object"], "deployment");
    assert_eq!(edge["slug"], "edge-eu");
    assert_eq!(edge["type"], "production");
    assert_eq!(edge["deployment_config"]["replicas"], 3);
    assert_eq!(edge["workspace_restrictions"], json!([app.default_ws]));
    assert_eq!(edge["organisation_id"], app.org.as_str());
    let edge_id = edge["id"].as_str().unwrap().to_owned();

    let (s, staging) = app
        .admin("POST", "/v1/deployments", Some(json!({"name": "Staging"})))
        .await;
    assert_eq!(s, 200, "{staging}");
    assert_eq!(staging["type"], "non-production", "the default type");
    assert!(
        staging["slug"]
            .as_str()
            .unwrap()
            .starts_with("dep-staging-"),
        "{staging}"
    );
    assert_eq!(staging["workspace_restrictions"], Value::Null);
    assert_eq!(staging["deployment_config"], json!({}));
    let (s, _) = app
        .admin(
            "POST",
            "/v1/deployments",
            Some(
                json!({"name": "Canary", "type": "non-production", "workspace_restrictions": null}),
            ),
        )
        .await;
    assert_eq!(s, 200);

    for (query, total) in [
        ("", 3),
        ("?type=production", 1),
        ("?type=non-production", 2),
        ("?page_size=1&current_page=2", 3),
    ] {
        let (s, list) = app
            .admin("GET", &format!("/v1/deployments{query}"), None)
            .await;
        assert_eq!(s, 200, "{query}: {list}");
        assert_eq!(list["object"], "list");
        assert_eq!(list["total"], total, "{query}: {list}");
    }
    let (_, list) = app
        .admin("GET", "/v1/deployments?type=production", None)
        .await;
    assert_eq!(list["data"][0]["id"], edge_id.as_str());
    assert_eq!(
        list["data"][0]["workspace_restrictions"],
        json!([app.default_ws])
    );
    for query in ["?type=prod", "?page_size=-1", "?kind=production"] {
        let (s, got) = app
            .admin("GET", &format!("/v1/deployments{query}"), None)
            .await;
        assert_eq!((s, code(&got)), (400, "AB01"), "{query}: {got}");
    }

    for key in [&edge_id, "edge-eu"] {
        let (s, got) = app
            .admin("GET", &format!("/v1/deployments/{key}"), None)
            .await;
        assert_eq!(s, 200, "{got}");
        assert_eq!(got, edge);
    }
    let (s, got) = app.admin("GET", "/v1/deployments/nowhere", None).await;
    assert_eq!((s, code(&got)), (404, "AB08"), "{got}");

    // Update: the fields given change.
    let b = app.workspace("B").await;
    let path = format!("/v1/deployments/{edge_id}");
    let (s, got) = app
        .admin(
            "PUT",
            &path,
            Some(json!({"name": "Edge EU 2", "type": "non-production", "workspace_restrictions": [b, "default"]})),
        )
        .await;
    assert_eq!((s, &got), (200, &json!({})));
    let (_, got) = app.admin("GET", &path, None).await;
    assert_eq!(got["name"], "Edge EU 2");
    assert_eq!(got["type"], "non-production");
    assert_eq!(got["slug"], "edge-eu", "untouched");
    assert_eq!(got["deployment_config"]["region"], "eu-west-1", "untouched");
    let mut restricted: Vec<String> = got["workspace_restrictions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap().to_owned())
        .collect();
    restricted.sort();
    let mut want = vec![b.clone(), app.default_ws.clone()];
    want.sort();
    assert_eq!(restricted, want);
    // A deleted workspace leaves the restriction.
    let (s, _) = app
        .admin("DELETE", &format!("/v1/admin/workspaces/{b}"), None)
        .await;
    assert_eq!(s, 200);
    let (_, got) = app.admin("GET", &path, None).await;
    assert_eq!(got["workspace_restrictions"], json!([app.default_ws]));
    let (s, _) = app
        .admin(
            "PUT",
            &path,
            Some(json!({"workspace_restrictions": null, "deployment_config": {"region": "eu-central-1"}, "slug": "edge-eu-2"})),
        )
        .await;
    assert_eq!(s, 200);
    let (_, got) = app.admin("GET", "/v1/deployments/edge-eu-2", None).await;
    assert_eq!(got["workspace_restrictions"], Value::Null);
    assert_eq!(got["deployment_config"], json!({"region": "eu-central-1"}));
    let (_, list) = app
        .admin("GET", "/v1/deployments?type=production", None)
        .await;
    assert_eq!(list["total"], 0);

    // Delete.
    let (s, got) = app.admin("DELETE", &path, None).await;
    assert_eq!((s, &got), (200, &json!({})));
    let (s, _) = app.admin("GET", &path, None).await;
    assert_eq!(s, 404);
    let (s, _) = app.admin("DELETE", &path, None).await;
    assert_eq!(s, 404);
    let (_, list) = app.admin("GET", "/v1/deployments", None).await;
    assert_eq!(list["total"], 2);

    let (_, logs) = app
        .admin(
            "GET",
            "/v1/audit-logs?start_time=2000-01-01T00:00:00Z&end_time=2999-01-01T00:00:00Z&resource_type=deployment",
            None,
        )
        .await;
    assert_eq!(logs["total"], 6, "3 made, 2 updated, 1 deleted: {logs}");
}

async fn bad_input(db: TestDb) {
    let app = App::start(db).await;
    let (s, _) = app
        .admin(
            "POST",
            "/v1/deployments",
            Some(json!({"name": "Taken", "slug": "taken"})),
        )
        .await;
    assert_eq!(s, 200);
    let before = app.audit_count().await;
    let cases = [
        (json!({}), 400, "missing field `name`"),
        (json!({"name": " "}), 400, "name: must not be empty"),
        (
            json!({"name": "x".repeat(256)}),
            400,
            "name: must be at most 255",
        ),
        (
            json!({"name": "a", "slug": "s".repeat(51)}),
            400,
            "slug: must be 1 to 50",
        ),
        (
            json!({"name": "a", "slug": ""}),
            400,
            "slug: must be 1 to 50",
        ),
        (
            json!({"name": "a", "slug": "a b"}),
            400,
            "slug: must be 1 to 50",
        ),
        (
            json!({"name": "a", "slug": "7d1f0b1e-8a4c-4f3e-9b1a-2c3d4e5f6a7b"}),
            400,
            "slug: must not be a UUID",
        ),
        (
            json!({"name": "a", "type": "prod"}),
            400,
            "type: unknown variant `prod`",
        ),
        (
            json!({"name": "a", "deployment_config": "x"}),
            400,
            "deployment_config: invalid type",
        ),
        (
            json!({"name": "a", "deployment_config": [1]}),
            400,
            "deployment_config: invalid type",
        ),
        (
            json!({"name": "a", "workspace_restrictions": []}),
            400,
            "workspace_restrictions: must list at least one",
        ),
        (
            json!({"name": "a", "workspace_restrictions": ["nope"]}),
            404,
            "workspace_restrictions[0]: no workspace",
        ),
        (
            json!({"name": "a", "workspace_restrictions": ["default", app.default_ws]}),
            400,
            "workspace_restrictions[1]: names a workspace listed earlier",
        ),
        (
            json!({"name": "a", "workspace_restrictions": "default"}),
            400,
            "workspace_restrictions: invalid type",
        ),
        (
            json!({"name": "a", "status": "active"}),
            400,
            "status: unknown field",
        ),
        (json!({"name": "a", "slug": "taken"}), 409, "already exists"),
    ];
    for (body, status, want) in cases {
        let (s, got) = app
            .admin("POST", "/v1/deployments", Some(body.clone()))
            .await;
        assert_eq!(s, status, "{body}: {got}");
        assert!(message(&got).contains(want), "want {want:?}: {got}");
    }
    let (s, other) = app
        .admin("POST", "/v1/deployments", Some(json!({"name": "Other"})))
        .await;
    assert_eq!(s, 200);
    let before_updates = app.audit_count().await;
    assert_eq!(before_updates, before + 1);
    let path = format!("/v1/deployments/{}", other["id"].as_str().unwrap());
    for (body, status) in [
        (json!({"slug": "taken"}), 409),
        (json!({"slug": "a b"}), 400),
        (json!({"name": ""}), 400),
        (json!({"type": "staging"}), 400),
        (json!({"workspace_restrictions": []}), 400),
        (json!({"workspace_restrictions": ["nope"]}), 404),
        (json!({"id": "x"}), 400),
    ] {
        let (s, got) = app.admin("PUT", &path, Some(body.clone())).await;
        assert_eq!(s, status, "{body}: {got}");
    }
    let (s, got) = app
        .admin("PUT", "/v1/deployments/nowhere", Some(json!({"name": "x"})))
        .await;
    assert_eq!((s, code(&got)), (404, "AB08"), "{got}");
    let (s, got) = app
        .admin("DELETE", &path, Some(json!({"force": true})))
        .await;
    assert_eq!((s, code(&got)), (400, "AB01"), "{got}");
    assert_eq!(
        app.audit_count().await,
        before_updates,
        "no refusal was recorded"
    );
}

/// Deployments need an admin key holding the `deployments.*` scope; both spellings of the
/// scope are accepted where scopes are written.
async fn permissions(db: TestDb) {
    let app = App::start(db).await;
    let (s, dep) = app
        .admin(
            "POST",
            "/v1/deployments",
            Some(json!({"name": "D", "slug": "d"})),
        )
        .await;
    assert_eq!(s, 200);
    let (id, lister) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/organisation/service",
            json!({"name": "l", "scopes": ["deployments:list", "deployments.read"]}),
        )
        .await;
    let (_, key) = app.admin("GET", &format!("/v1/api-keys/{id}"), None).await;
    assert_eq!(
        key["scopes"],
        json!(["deployments.list", "deployments.read"])
    );
    let (s, _) = app
        .call("GET", "/v1/deployments", Some(&lister), None)
        .await;
    assert_eq!(s, 200);
    let (s, _) = app
        .call("GET", "/v1/deployments/d", Some(&lister), None)
        .await;
    assert_eq!(s, 200);
    for (method, path, body, scope) in [
        (
            "POST",
            "/v1/deployments",
            Some(json!({"name": "E"})),
            "deployments.create",
        ),
        (
            "PUT",
            "/v1/deployments/d",
            Some(json!({"name": "E"})),
            "deployments.update",
        ),
        ("DELETE", "/v1/deployments/d", None, "deployments.delete"),
    ] {
        let (s, got) = app.call(method, path, Some(&lister), body).await;
        assert_eq!(
            (s, message(&got)),
            (403, format!("the key lacks the scope {scope}").as_str()),
            "{method} {path}"
        );
    }
    // Workspace keys: refused, and they cannot even carry the scope.
    let manager = app
        .user(
            "m@example.com",
            OrgRole::Member,
            Some((&app.default_ws, WorkspaceRole::Manager)),
        )
        .await;
    let (_, mk) = app.user_key(&app.default_ws, &manager, WS_SCOPES).await;
    for (method, path) in [
        ("GET", "/v1/deployments".to_owned()),
        (
            "GET",
            format!("/v1/deployments/{}", dep["id"].as_str().unwrap()),
        ),
        ("DELETE", "/v1/deployments/d".to_owned()),
    ] {
        let (s, got) = app.call(method, &path, Some(&mk), None).await;
        assert_eq!((s, code(&got)), (403, "AB03"), "{method} {path}: {got}");
    }
    let (s, got) = app
        .admin(
            "POST",
            "/v1/api-keys/workspace/service",
            Some(json!({"name": "w", "workspace_id": "default", "scopes": ["deployments:read"]})),
        )
        .await;
    assert_eq!((s, code(&got)), (400, "AB01"), "{got}");
}

/// `deployments_production_max` and `deployments_non_production_max`: each type counted apart,
/// one too many refused with 409 naming the type and the limit (nothing made, nothing
/// recorded), a type change counted against the new type, 0 allowing none, null no limit.
async fn limits_per_type(db: TestDb) {
    let app = App::start(db).await;
    let set = |body: Value| {
        let app = &app;
        async move {
            let (s, got) = app.admin("PUT", "/v1/admin/settings", Some(body)).await;
            assert_eq!(s, 200, "{got}");
        }
    };
    let make = |slug: &str, kind: &str| {
        let app = &app;
        let body = json!({"name": slug, "slug": slug, "type": kind});
        async move { app.admin("POST", "/v1/deployments", Some(body)).await }
    };
    set(json!({"deployments_production_max": 1, "deployments_non_production_max": 2})).await;
    let (_, got) = app.admin("GET", "/v1/admin/settings", None).await;
    assert_eq!(got["deployments_production_max"], 1, "{got}");
    assert_eq!(got["deployments_non_production_max"], 2, "{got}");

    assert_eq!(make("prod-1", "production").await.0, 200);
    let before = app.audit_count().await;
    let (s, got) = make("prod-2", "production").await;
    assert_eq!((s, code(&got)), (409, "AB07"), "{got}");
    assert_eq!(
        message(&got),
        "the organisation already has 1 production deployment(s), the most its settings allow \
         (deployments_production_max: 1); delete one or raise the limit first"
    );
    assert_eq!(
        app.audit_count().await,
        before,
        "a refusal records no change"
    );
    let (s, _) = app.admin("GET", "/v1/deployments/prod-2", None).await;
    assert_eq!(s, 404, "nothing was made");
    // The other type has its own count.
    assert_eq!(make("dev-1", "non-production").await.0, 200);
    assert_eq!(make("dev-2", "non-production").await.0, 200);
    let (s, got) = make("dev-3", "non-production").await;
    assert_eq!((s, code(&got)), (409, "AB07"), "{got}");
    assert!(
        message(&got).contains("2 non-production deployment(s)")
            && message(&got).contains("deployments_non_production_max: 2"),
        "{got}"
    );

    // A type change counts against the new type; a change that keeps the type does not.
    let (s, got) = app
        .admin(
            "PUT",
            "/v1/deployments/dev-1",
            Some(json!({"type": "production"})),
        )
        .await;
    assert_eq!((s, code(&got)), (409, "AB07"), "{got}");
    assert!(
        message(&got).contains("deployments_production_max: 1"),
        "{got}"
    );
    let (_, dev1) = app.admin("GET", "/v1/deployments/dev-1", None).await;
    assert_eq!(dev1["type"], "non-production", "unchanged");
    for body in [
        json!({"type": "production", "name": "Prod one"}),
        json!({"type": "non-production", "name": "Dev two"}),
    ] {
        let slug = if body["type"] == "production" {
            "prod-1"
        } else {
            "dev-2"
        };
        let (s, got) = app
            .admin("PUT", &format!("/v1/deployments/{slug}"), Some(body))
            .await;
        assert_eq!((s, &got), (200, &json!({})), "{slug}");
    }
    // Moving the production one to non-production frees its slot and fills the other type.
    set(json!({"deployments_non_production_max": 3})).await;
    let (s, got) = app
        .admin(
            "PUT",
            "/v1/deployments/prod-1",
            Some(json!({"type": "non-production"})),
        )
        .await;
    assert_eq!(s, 200, "{got}");
    assert_eq!(make("prod-2", "production").await.0, 200);
    assert_eq!(make("dev-4", "non-production").await.0, 409);

    // 0 allows none; a deletion frees a slot; null lifts the limit.
    set(json!({"deployments_production_max": 0})).await;
    assert_eq!(make("prod-3", "production").await.0, 409);
    set(json!({"deployments_production_max": 2})).await;
    assert_eq!(make("prod-3", "production").await.0, 200);
    assert_eq!(make("prod-4", "production").await.0, 409);
    let (s, _) = app.admin("DELETE", "/v1/deployments/prod-3", None).await;
    assert_eq!(s, 200);
    assert_eq!(make("prod-4", "production").await.0, 200);
    set(json!({"deployments_production_max": null, "deployments_non_production_max": null})).await;
    for i in 5..8 {
        assert_eq!(make(&format!("prod-{i}"), "production").await.0, 200);
    }
    let (_, list) = app
        .admin("GET", "/v1/deployments?type=production", None)
        .await;
    assert_eq!(list["total"], 5, "{list}");

    // The settings' bounds.
    for (body, want) in [
        (
            json!({"deployments_production_max": -1}),
            "deployments_production_max: must be between 0 and 10000, or null; got -1",
        ),
        (
            json!({"deployments_non_production_max": 10001}),
            "deployments_non_production_max: must be between 0 and 10000, or null; got 10001",
        ),
        (
            json!({"deployments_production_max": "1"}),
            "deployments_production_max: invalid type",
        ),
    ] {
        let (s, got) = app
            .admin("PUT", "/v1/admin/settings", Some(body.clone()))
            .await;
        assert_eq!((s, code(&got)), (400, "AB01"), "{body}: {got}");
        assert!(message(&got).contains(want), "{body}: {got}");
    }
}

/// Concurrent creations cannot exceed a type's limit (the organisation's row serialises them).
async fn limits_hold_under_concurrency(db: TestDb) {
    let app = std::sync::Arc::new(App::start(db).await);
    let (s, _) = app
        .admin(
            "PUT",
            "/v1/admin/settings",
            Some(json!({"deployments_production_max": 3})),
        )
        .await;
    assert_eq!(s, 200);
    let mut tasks = Vec::new();
    for i in 0..8 {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            let body =
                json!({"name": format!("p{i}"), "slug": format!("p{i}"), "type": "production"});
            app.admin("POST", "/v1/deployments", Some(body)).await.0
        }));
    }
    let mut made = 0;
    for t in tasks {
        match t.await.unwrap() {
            200 => made += 1,
            409 => {}
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(made, 3);
    let (_, list) = app
        .admin("GET", "/v1/deployments?type=production", None)
        .await;
    assert_eq!(list["total"], 3, "{list}");
}

crate::on_both_databases!(
    crud_and_type_filter,
    bad_input,
    permissions,
    limits_per_type,
    limits_hold_under_concurrency,
);
