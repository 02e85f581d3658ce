//! `/v1/admin/settings` and `/v1/admin/workspaces/{id}/settings`: the spec's defaults, updates
//! and their bounds, workspace overrides, and the user keys per workspace maximum refusing
//! one key too many.

use std::sync::Arc;

use serde_json::{json, Value};

use admin::authz::{OrgRole, WorkspaceRole};

use crate::common::{App, TestDb, ADMIN_KEY, WS_SCOPES};

fn code(body: &Value) -> &str {
    body["data"]["errorCode"].as_str().unwrap_or_default()
}

fn message(body: &Value) -> &str {
    body["data"]["message"].as_str().unwrap_or_default()
}

async fn organisation_defaults_and_updates(db: TestDb) {
    let app = App::start(db).await;
    let (s, got) = app.admin("GET", "/v1/admin/settings", None).await;
    assert_eq!(s, 200, "{got}");
    assert_eq!(
        got,
        json!({
            "object": "organisation-settings",
            "organisation_id": app.org,
            "api_key_default_expiry_days": 365,
            "api_key_max_expiry_days": 730,
            "user_api_keys_per_workspace_max": null,
            "deployments_production_max": null,
            "deployments_non_production_max": null,
            "membersViewPrompts": true,
            "membersWritePrompts": false,
            "managersViewPrompts": true,
            "managersWritePrompts": true,
            "membersViewAnalytics": true,
            "managersViewAnalytics": true,
        })
    );

    let (s, got) = app
        .admin(
            "PUT",
            "/v1/admin/settings",
            Some(json!({
                "membersWritePrompts": true,
                "managersViewAnalytics": false,
                "api_key_default_expiry_days": 30,
                "api_key_max_expiry_days": 90,
                "user_api_keys_per_workspace_max": 5,
            })),
        )
        .await;
    assert_eq!((s, &got), (200, &json!({})));
    let (_, got) = app.admin("GET", "/v1/admin/settings", None).await;
    assert_eq!(got["membersWritePrompts"], true);
    assert_eq!(got["managersViewAnalytics"], false);
    assert_eq!(got["membersViewPrompts"], true, "untouched");
    assert_eq!(got["api_key_default_expiry_days"], 30);
    assert_eq!(got["api_key_max_expiry_days"], 90);
    assert_eq!(got["user_api_keys_per_workspace_max"], 5);
    let stored = app.store.organisation_settings(&app.org).await.unwrap();
    assert!(stored.access.members_write_prompts);

    // The expiry settings apply to new keys.
    let (id, _) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/workspace/service",
            json!({"name": "k", "workspace_id": "default", "scopes": []}),
        )
        .await;
    let (_, key) = app.admin("GET", &format!("/v1/api-keys/{id}"), None).await;
    let expires = admin::time::parse(key["expires_at"].as_str().unwrap()).unwrap();
    let in_30 = admin::time::now() + chrono::Duration::days(30);
    assert!((expires - in_30).num_seconds().abs() < 60, "{key}");
    let far = admin::time::format(admin::time::now() + chrono::Duration::days(100));
    let (s, got) = app
        .admin(
            "POST",
            "/v1/api-keys/workspace/service",
            Some(json!({"name": "k", "workspace_id": "default", "scopes": [], "expires_at": far})),
        )
        .await;
    assert_eq!((s, code(&got)), (400, "AB01"), "{got}");
    assert!(message(&got).contains("90 days"), "{got}");

    // Refusals change nothing and are not recorded.
    let before = app.audit_count().await;
    let cases = [
        (
            json!({"api_key_default_expiry_days": 91}),
            "api_key_default_expiry_days: must not exceed api_key_max_expiry_days (90), got 91",
        ),
        (
            json!({"api_key_default_expiry_days": null}),
            "api_key_default_expiry_days: cannot be null while api_key_max_expiry_days is 90",
        ),
        (
            json!({"api_key_max_expiry_days": 0}),
            "api_key_max_expiry_days: must be between 1 and 3650",
        ),
        (
            json!({"api_key_max_expiry_days": 3651}),
            "api_key_max_expiry_days: must be between 1 and 3650",
        ),
        (
            json!({"api_key_default_expiry_days": -1}),
            "api_key_default_expiry_days: must be between 1 and 3650",
        ),
        (
            json!({"user_api_keys_per_workspace_max": 0}),
            "user_api_keys_per_workspace_max: must be between 1 and 10000",
        ),
        (
            json!({"user_api_keys_per_workspace_max": 1.5}),
            "user_api_keys_per_workspace_max: invalid type",
        ),
        (
            json!({"membersViewPrompts": null}),
            "membersViewPrompts: must be true or false, not null",
        ),
        (
            json!({"membersViewPrompts": "yes"}),
            "membersViewPrompts: invalid type",
        ),
        (
            json!({"membersViewPrompts": true, "colour": 1}),
            "colour: unknown field",
        ),
        (
            json!({"object": "organisation-settings"}),
            "object: unknown field",
        ),
        (json!("all"), "invalid type"),
    ];
    for (body, want) in cases {
        let (s, got) = app
            .admin("PUT", "/v1/admin/settings", Some(body.clone()))
            .await;
        assert_eq!((s, code(&got)), (400, "AB01"), "{body}: {got}");
        assert!(message(&got).contains(want), "want {want:?}: {got}");
    }
    assert_eq!(app.audit_count().await, before);
    let (_, got) = app.admin("GET", "/v1/admin/settings", None).await;
    assert_eq!(got["api_key_default_expiry_days"], 30);
    assert_eq!(got["membersViewPrompts"], true);

    // Keys without expiry: both bounds lifted together; the limit lifted.
    let (s, got) = app
        .admin(
            "PUT",
            "/v1/admin/settings",
            Some(json!({"api_key_default_expiry_days": null, "api_key_max_expiry_days": null, "user_api_keys_per_workspace_max": null})),
        )
        .await;
    assert_eq!(s, 200, "{got}");
    let (_, got) = app.admin("GET", "/v1/admin/settings", None).await;
    assert_eq!(got["api_key_max_expiry_days"], Value::Null);
    assert_eq!(got["user_api_keys_per_workspace_max"], Value::Null);
    assert_eq!(app.audit_count().await, before + 1);
    let (_, logs) = app
        .admin(
            "GET",
            "/v1/audit-logs?start_time=2000-01-01T00:00:00Z&end_time=2999-01-01T00:00:00Z&resource_type=organisation_settings",
            None,
        )
        .await;
    assert_eq!(logs["total"], 2, "{logs}");
}

async fn workspace_overrides(db: TestDb) {
    let app = App::start(db).await;
    let path = "/v1/admin/workspaces/default/settings";
    let (s, got) = app.admin("GET", path, None).await;
    assert_eq!(s, 200, "{got}");
    assert_eq!(
        got,
        json!({
            "object": "workspace-settings",
            "workspace_id": app.default_ws,
            "user_api_keys_per_workspace_max": null,
            "membersViewPrompts": true,
            "membersWritePrompts": false,
            "managersViewPrompts": true,
            "managersWritePrompts": true,
            "membersViewAnalytics": true,
            "managersViewAnalytics": true,
            "overrides": {},
        })
    );
    let (s, got) = app
        .admin(
            "PUT",
            path,
            Some(json!({"membersViewPrompts": false, "managersWritePrompts": false, "user_api_keys_per_workspace_max": 2})),
        )
        .await;
    assert_eq!((s, &got), (200, &json!({})));
    let (_, got) = app
        .admin(
            "GET",
            &format!("/v1/admin/workspaces/{}/settings", app.default_ws),
            None,
        )
        .await;
    assert_eq!(got["membersViewPrompts"], false);
    assert_eq!(got["managersWritePrompts"], false);
    assert_eq!(got["user_api_keys_per_workspace_max"], 2);
    assert_eq!(
        got["overrides"],
        json!({"membersViewPrompts": false, "managersWritePrompts": false, "user_api_keys_per_workspace_max": 2})
    );

    // Organisation changes reach the workspace where it has no override.
    let (s, _) = app
        .admin(
            "PUT",
            "/v1/admin/settings",
            Some(json!({"membersViewPrompts": true, "membersWritePrompts": true, "membersViewAnalytics": false, "user_api_keys_per_workspace_max": 9})),
        )
        .await;
    assert_eq!(s, 200);
    let (_, got) = app.admin("GET", path, None).await;
    assert_eq!(got["membersWritePrompts"], true, "inherited: {got}");
    assert_eq!(got["membersViewAnalytics"], false, "inherited: {got}");
    assert_eq!(got["membersViewPrompts"], false, "overridden: {got}");
    assert_eq!(
        got["user_api_keys_per_workspace_max"], 2,
        "overridden: {got}"
    );
    let other = app.workspace("Other").await;
    let (_, got) = app
        .admin(
            "GET",
            &format!("/v1/admin/workspaces/{other}/settings"),
            None,
        )
        .await;
    assert_eq!(got["user_api_keys_per_workspace_max"], 9, "{got}");
    assert_eq!(got["overrides"], json!({}));
    let effective = app
        .store
        .effective_workspace_settings(&app.org, &app.default_ws)
        .await
        .unwrap();
    assert!(!effective.access.members_view_prompts);
    assert!(effective.access.members_write_prompts);
    assert_eq!(effective.user_api_keys_per_workspace_max, Some(2));

    // `null` removes an override.
    let (s, _) = app
        .admin(
            "PUT",
            path,
            Some(json!({"membersViewPrompts": null, "user_api_keys_per_workspace_max": null})),
        )
        .await;
    assert_eq!(s, 200);
    let (_, got) = app.admin("GET", path, None).await;
    assert_eq!(got["membersViewPrompts"], true);
    assert_eq!(got["user_api_keys_per_workspace_max"], 9);
    assert_eq!(got["overrides"], json!({"managersWritePrompts": false}));

    // Errors.
    let before = app.audit_count().await;
    for (method, p, body, status, want) in [
        (
            "GET",
            "/v1/admin/workspaces/nowhere/settings",
            None,
            404,
            "AB08",
        ),
        (
            "PUT",
            "/v1/admin/workspaces/nowhere/settings",
            Some(json!({"membersViewPrompts": true})),
            404,
            "AB08",
        ),
        (
            "PUT",
            path,
            Some(json!({"user_api_keys_per_workspace_max": 0})),
            400,
            "AB01",
        ),
        (
            "PUT",
            path,
            Some(json!({"api_key_max_expiry_days": 10})),
            400,
            "AB01",
        ),
        (
            "PUT",
            path,
            Some(json!({"managersViewAnalytics": 1})),
            400,
            "AB01",
        ),
    ] {
        let (s, got) = app.admin(method, p, body).await;
        assert_eq!((s, code(&got)), (status, want), "{method} {p}: {got}");
    }
    assert_eq!(app.audit_count().await, before);

    // A deleted workspace takes its overrides with it.
    let (s, _) = app
        .admin(
            "PUT",
            &format!("/v1/admin/workspaces/{other}/settings"),
            Some(json!({"membersViewPrompts": false})),
        )
        .await;
    assert_eq!(s, 200);
    let (s, _) = app
        .admin("DELETE", &format!("/v1/admin/workspaces/{other}"), None)
        .await;
    assert_eq!(s, 200);
    assert_eq!(
        app.store.workspace_settings(&other).await.unwrap(),
        admin::store::WorkspaceSettings::default()
    );
}

/// Settings are the admin key's: workspace keys of every role are refused, and so is an admin
/// key without the scope.
async fn settings_need_an_admin_key(db: TestDb) {
    let app = App::start(db).await;
    let ws = app.default_ws.clone();
    let manager = app
        .user(
            "m@example.com",
            OrgRole::Member,
            Some((&ws, WorkspaceRole::Manager)),
        )
        .await;
    let (_, mk) = app.user_key(&ws, &manager, WS_SCOPES).await;
    for (method, path, body) in [
        ("GET", "/v1/admin/settings", None),
        (
            "PUT",
            "/v1/admin/settings",
            Some(json!({"membersWritePrompts": true})),
        ),
        ("GET", "/v1/admin/workspaces/default/settings", None),
        (
            "PUT",
            "/v1/admin/workspaces/default/settings",
            Some(json!({"membersWritePrompts": true})),
        ),
    ] {
        let (s, got) = app.call(method, path, Some(&mk), body).await;
        assert_eq!((s, code(&got)), (403, "AB03"), "{method} {path}: {got}");
    }
    let (_, reader) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/organisation/service",
            json!({"name": "r", "scopes": ["organisation_settings.read"]}),
        )
        .await;
    let (s, _) = app
        .call("GET", "/v1/admin/settings", Some(&reader), None)
        .await;
    assert_eq!(s, 200);
    let (s, got) = app
        .call(
            "PUT",
            "/v1/admin/settings",
            Some(&reader),
            Some(json!({"membersWritePrompts": true})),
        )
        .await;
    assert_eq!(
        (s, message(&got)),
        (403, "the key lacks the scope organisation_settings.update")
    );
    let (s, _) = app
        .call(
            "GET",
            "/v1/admin/workspaces/default/settings",
            Some(&reader),
            None,
        )
        .await;
    assert_eq!(s, 403, "workspace settings need workspaces.read");
}

async fn user_keys_per_workspace_maximum(db: TestDb) {
    let app = App::start(db).await;
    let a = app.default_ws.clone();
    let b = app.workspace("B").await;
    let u = app
        .user(
            "u@example.com",
            OrgRole::Member,
            Some((&a, WorkspaceRole::Member)),
        )
        .await;
    app.store
        .set_workspace_member(&b, &u, WorkspaceRole::Member)
        .await
        .unwrap();
    let v = app
        .user(
            "v@example.com",
            OrgRole::Member,
            Some((&a, WorkspaceRole::Member)),
        )
        .await;
    let (s, _) = app
        .admin(
            "PUT",
            "/v1/admin/settings",
            Some(json!({"user_api_keys_per_workspace_max": 2})),
        )
        .await;
    assert_eq!(s, 200);
    let make = |ws: &str, user: &str| json!({"name": "k", "workspace_id": ws, "user_id": user, "scopes": ["configs.read"]});
    let post = |body: Value| app.admin("POST", "/v1/api-keys/workspace/user", Some(body));
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (s, got) = post(make(&a, &u)).await;
        assert_eq!(s, 200, "{got}");
        ids.push(got["id"].as_str().unwrap().to_owned());
    }
    let before = app.audit_count().await;
    let (s, got) = post(make(&a, &u)).await;
    assert_eq!((s, code(&got)), (409, "AB07"), "one too many: {got}");
    assert!(
        message(&got).contains("user_api_keys_per_workspace_max: 2"),
        "{got}"
    );
    assert_eq!(app.audit_count().await, before, "nothing was made");
    // Per user and per workspace; service keys do not count.
    let (s, _) = post(make(&a, &v)).await;
    assert_eq!(s, 200);
    let (s, _) = post(make(&b, &u)).await;
    assert_eq!(s, 200);
    let (s, got) = app
        .admin(
            "POST",
            "/v1/api-keys/workspace/service",
            Some(json!({"name": "svc", "workspace_id": a, "scopes": []})),
        )
        .await;
    assert_eq!(s, 200, "{got}");
    // A workspace override raises it there; deleting a key frees a place.
    let (s, _) = app
        .admin(
            "PUT",
            &format!("/v1/admin/workspaces/{a}/settings"),
            Some(json!({"user_api_keys_per_workspace_max": 3})),
        )
        .await;
    assert_eq!(s, 200);
    let (s, _) = post(make(&a, &u)).await;
    assert_eq!(s, 200);
    let (s, _) = post(make(&a, &u)).await;
    assert_eq!(s, 409);
    let (s, _) = app
        .admin("DELETE", &format!("/v1/api-keys/{}", ids[0]), None)
        .await;
    assert_eq!(s, 200);
    let (s, _) = post(make(&a, &u)).await;
    assert_eq!(s, 200);
    // A user's own key making a key for themselves meets the same limit.
    let manager = app
        .user(
            "m@example.com",
            OrgRole::Member,
            Some((&b, WorkspaceRole::Manager)),
        )
        .await;
    let (_, mk) = app.user_key(&b, &manager, WS_SCOPES).await;
    let (s, got) = app
        .call(
            "POST",
            "/v1/api-keys/workspace/user",
            Some(&mk),
            Some(json!({"name": "mine", "workspace_id": b, "scopes": ["configs.read"]})),
        )
        .await;
    assert_eq!(s, 200, "{got}");
    let (s, got) = app
        .call(
            "POST",
            "/v1/api-keys/workspace/user",
            Some(&mk),
            Some(json!({"name": "mine", "workspace_id": b, "scopes": ["configs.read"]})),
        )
        .await;
    assert_eq!((s, code(&got)), (409, "AB07"), "{got}");
}

async fn concurrent_keys_meet_the_maximum(db: TestDb) {
    let app = Arc::new(App::start(db).await);
    let a = app.default_ws.clone();
    let u = app
        .user(
            "u@example.com",
            OrgRole::Member,
            Some((&a, WorkspaceRole::Member)),
        )
        .await;
    let (s, _) = app
        .admin(
            "PUT",
            &format!("/v1/admin/workspaces/{a}/settings"),
            Some(json!({"user_api_keys_per_workspace_max": 1})),
        )
        .await;
    assert_eq!(s, 200);
    let tasks = (0..6).map(|_| {
        let app = app.clone();
        let body = json!({"name": "k", "workspace_id": a, "user_id": u, "scopes": []});
        tokio::spawn(async move {
            app.admin("POST", "/v1/api-keys/workspace/user", Some(body))
                .await
                .0
        })
    });
    let mut statuses: Vec<u16> = futures_util::future::join_all(tasks)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    statuses.sort();
    assert_eq!(statuses, [200, 409, 409, 409, 409, 409]);
}

crate::on_both_databases!(
    organisation_defaults_and_updates,
    workspace_overrides,
    settings_need_an_admin_key,
    user_keys_per_workspace_maximum,
    concurrent_keys_meet_the_maximum,
);
