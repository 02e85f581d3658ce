//! The authorisation table through the API: each kind of key and role against each action,
//! confined to its workspace, narrowed by its scopes.

use serde_json::{json, Value};

use admin::authz::{OrgRole, WorkspaceRole};

use crate::common::{App, TestDb, ADMIN_KEY, WS_SCOPES};

fn code(body: &Value) -> &str {
    body["data"]["errorCode"].as_str().unwrap_or_default()
}

struct World {
    app: App,
    ws_b: String,
    manager: String,
    member: String,
    manager_key: String,
    member_key: (String, String),
    manager_key_id: String,
}

async fn world(db: TestDb) -> World {
    let app = App::start(db).await;
    let a = app.default_ws.clone();
    let ws_b = app.workspace("B").await;
    let manager = app
        .user(
            "manager@example.com",
            OrgRole::Member,
            Some((&a, WorkspaceRole::Manager)),
        )
        .await;
    let member = app
        .user(
            "member@example.com",
            OrgRole::Member,
            Some((&a, WorkspaceRole::Member)),
        )
        .await;
    let (manager_key_id, manager_key) = app.user_key(&a, &manager, WS_SCOPES).await;
    let member_key = app.user_key(&a, &member, WS_SCOPES).await;
    World {
        app,
        ws_b,
        manager,
        member,
        manager_key,
        member_key,
        manager_key_id,
    }
}

async fn create(app: &App, key: &str, path: &str, body: Value) -> (u16, Value) {
    app.call("POST", path, Some(key), Some(body)).await
}

async fn key_creation_by_role(db: TestDb) {
    let w = world(db).await;
    let app = &w.app;
    let org_key = json!({"name": "k", "scopes": ["workspaces.read"]});
    let ws_key = |ws: &str| json!({"name": "k", "workspace_id": ws, "scopes": ["configs.read"]});
    let user_key = |ws: &str, user: &str| json!({"name": "k", "workspace_id": ws, "user_id": user, "scopes": ["configs.read"]});

    // The admin key (organisation owner/admin): admin keys, and workspace keys anywhere.
    let (s, b) = create(
        app,
        ADMIN_KEY,
        "/v1/api-keys/organisation/service",
        org_key.clone(),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    for ws in ["default", w.ws_b.as_str()] {
        let (s, b) = create(app, ADMIN_KEY, "/v1/api-keys/workspace/service", ws_key(ws)).await;
        assert_eq!(s, 200, "{b}");
    }

    // A workspace manager: workspace keys in the managed workspace only, for any member.
    let mk = &w.manager_key;
    let (s, b) = create(
        app,
        mk,
        "/v1/api-keys/organisation/service",
        org_key.clone(),
    )
    .await;
    assert_eq!((s, code(&b)), (403, "AB03"), "{b}");
    let (s, b) = create(app, mk, "/v1/api-keys/workspace/service", ws_key("default")).await;
    assert_eq!(s, 200, "{b}");
    let (s, b) = create(
        app,
        mk,
        "/v1/api-keys/workspace/user",
        user_key("default", &w.member),
    )
    .await;
    assert_eq!(s, 200, "on behalf of a member: {b}");
    let (s, b) = create(
        app,
        mk,
        "/v1/api-keys/workspace/user",
        json!({"name": "mine", "workspace_id": "default", "scopes": ["configs.read"]}),
    )
    .await;
    assert_eq!(s, 200, "user_id defaults to the caller: {b}");
    let (_, mine) = app
        .admin(
            "GET",
            &format!("/v1/api-keys/{}", b["id"].as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(mine["user_id"], w.manager.as_str());
    let (s, b) = create(app, mk, "/v1/api-keys/workspace/service", ws_key(&w.ws_b)).await;
    assert_eq!((s, code(&b)), (403, "AB03"), "{b}");
    // ...and only with scopes it holds itself.
    let (s, b) = create(
        app,
        mk,
        "/v1/api-keys/workspace/service",
        json!({"name": "k", "workspace_id": "default", "scopes": ["configs.delete"]}),
    )
    .await;
    assert_eq!((s, code(&b)), (403, "AB03"), "{b}");
    assert!(b["data"]["message"]
        .as_str()
        .unwrap()
        .contains("configs.delete"));
    // A user who is not in the workspace cannot get a key there.
    let outsider = app.user("out@example.com", OrgRole::Member, None).await;
    let (s, b) = create(
        app,
        mk,
        "/v1/api-keys/workspace/user",
        user_key("default", &outsider),
    )
    .await;
    assert_eq!((s, code(&b)), (400, "AB01"), "{b}");

    // A workspace member: no keys at all.
    let member_key = &w.member_key.1;
    for (path, body) in [
        ("/v1/api-keys/organisation/service", org_key.clone()),
        ("/v1/api-keys/workspace/service", ws_key("default")),
        (
            "/v1/api-keys/workspace/user",
            user_key("default", &w.member),
        ),
    ] {
        let (s, b) = create(app, member_key, path, body).await;
        assert_eq!((s, code(&b)), (403, "AB03"), "{path}: {b}");
    }

    // An organisation admin's user key acts as a workspace admin wherever it is made.
    let org_admin = app.user("admin@example.com", OrgRole::Admin, None).await;
    let (_, admin_user_key) = app.user_key(&w.ws_b, &org_admin, WS_SCOPES).await;
    let (s, b) = create(
        app,
        &admin_user_key,
        "/v1/api-keys/workspace/service",
        ws_key(&w.ws_b),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let (s, _) = create(
        app,
        &admin_user_key,
        "/v1/api-keys/workspace/service",
        ws_key("default"),
    )
    .await;
    assert_eq!(s, 403, "still confined to its workspace");

    // A workspace service key manages its workspace's keys.
    let (_, service) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/workspace/service",
            json!({"name": "svc", "workspace_id": "default", "scopes": WS_SCOPES}),
        )
        .await;
    let (s, b) = create(
        app,
        &service,
        "/v1/api-keys/workspace/user",
        user_key("default", &w.member),
    )
    .await;
    assert_eq!(s, 200, "{b}");
}

async fn workspace_keys_stay_in_their_workspace(db: TestDb) {
    let w = world(db).await;
    let app = &w.app;
    let mk = w.manager_key.as_str();
    // Organisation-level resources: refused to every workspace key.
    for (method, path, body) in [
        ("GET", "/v1/admin/workspaces".to_owned(), None),
        (
            "POST",
            "/v1/admin/workspaces".to_owned(),
            Some(json!({"name": "x"})),
        ),
        ("GET", "/v1/admin/workspaces/default".to_owned(), None),
        (
            "PUT",
            "/v1/admin/workspaces/default".to_owned(),
            Some(json!({"name": "x"})),
        ),
        ("DELETE", format!("/v1/admin/workspaces/{}", w.ws_b), None),
        (
            "GET",
            "/v1/audit-logs?start_time=2000-01-01T00:00:00Z&end_time=2999-01-01T00:00:00Z"
                .to_owned(),
            None,
        ),
        ("GET", format!("/v1/api-keys/{}", app.admin_key_id), None),
    ] {
        for key in [mk, w.member_key.1.as_str()] {
            let (s, b) = app.call(method, &path, Some(key), body.clone()).await;
            assert_eq!((s, code(&b)), (403, "AB03"), "{method} {path}: {b}");
        }
    }
    // Keys of another workspace.
    let (b_key, _) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/workspace/service",
            json!({"name": "b", "workspace_id": w.ws_b, "scopes": []}),
        )
        .await;
    for method in ["GET", "PUT", "DELETE"] {
        let (s, b) = app
            .call(
                method,
                &format!("/v1/api-keys/{b_key}"),
                Some(mk),
                Some(json!({})),
            )
            .await;
        assert_eq!((s, code(&b)), (403, "AB03"), "{method}: {b}");
    }
    let (s, _) = app
        .call(
            "POST",
            &format!("/v1/api-keys/{b_key}/rotate"),
            Some(mk),
            None,
        )
        .await;
    assert_eq!(s, 403);
    let (s, b) = app
        .call(
            "GET",
            &format!("/v1/api-keys?workspace_id={}", w.ws_b),
            Some(mk),
            None,
        )
        .await;
    assert_eq!((s, code(&b)), (403, "AB03"), "{b}");
    // Its own listing: the workspace's keys only.
    let (s, list) = app.call("GET", "/v1/api-keys", Some(mk), None).await;
    assert_eq!(s, 200, "{list}");
    assert_eq!(
        list["total"], 2,
        "the manager's and the member's keys: {list}"
    );
    for k in list["data"].as_array().unwrap() {
        assert_eq!(k["workspace_id"], app.default_ws.as_str());
    }
    // The manager updates and rotates keys of the workspace.
    let (s, b) = app
        .call(
            "PUT",
            &format!("/v1/api-keys/{}", w.member_key.0),
            Some(mk),
            Some(json!({"name": "renamed by the manager"})),
        )
        .await;
    assert_eq!(s, 200, "{b}");
}

async fn members_see_only_their_own_keys(db: TestDb) {
    let w = world(db).await;
    let app = &w.app;
    let (member_key_id, member_key) = (&w.member_key.0, w.member_key.1.as_str());
    let (s, b) = app
        .call(
            "GET",
            &format!("/v1/api-keys/{member_key_id}"),
            Some(member_key),
            None,
        )
        .await;
    assert_eq!(s, 200, "{b}");
    let (s, b) = app
        .call(
            "GET",
            &format!("/v1/api-keys/{}", w.manager_key_id),
            Some(member_key),
            None,
        )
        .await;
    assert_eq!((s, code(&b)), (403, "AB03"), "{b}");
    let (s, list) = app
        .call("GET", "/v1/api-keys", Some(member_key), None)
        .await;
    assert_eq!(s, 200, "{list}");
    assert_eq!(list["total"], 1, "{list}");
    assert_eq!(list["data"][0]["id"], member_key_id.as_str());
    for (method, path) in [
        ("PUT", format!("/v1/api-keys/{member_key_id}")),
        ("POST", format!("/v1/api-keys/{member_key_id}/rotate")),
        ("DELETE", format!("/v1/api-keys/{member_key_id}")),
    ] {
        let (s, b) = app
            .call(method, &path, Some(member_key), Some(json!({})))
            .await;
        assert_eq!((s, code(&b)), (403, "AB03"), "{method}: {b}");
    }
    // A member who leaves the workspace loses the key.
    app.store
        .remove_workspace_member(&app.default_ws, &w.member)
        .await
        .unwrap();
    let (s, b) = app
        .call("GET", "/v1/api-keys", Some(member_key), None)
        .await;
    assert_eq!((s, code(&b)), (401, "AB05"), "{b}");
}

async fn scopes_narrow_an_admin_key(db: TestDb) {
    let app = App::start(db).await;
    let (_, reader) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/organisation/service",
            json!({"name": "reader", "scopes": ["workspaces.read", "workspaces.list"]}),
        )
        .await;
    let (s, _) = app
        .call("GET", "/v1/admin/workspaces", Some(&reader), None)
        .await;
    assert_eq!(s, 200);
    let (s, _) = app
        .call("GET", "/v1/admin/workspaces/default", Some(&reader), None)
        .await;
    assert_eq!(s, 200);
    let (s, b) = app
        .call(
            "POST",
            "/v1/admin/workspaces",
            Some(&reader),
            Some(json!({"name": "x"})),
        )
        .await;
    assert_eq!((s, code(&b)), (403, "AB03"), "{b}");
    assert_eq!(
        b["data"]["message"],
        "the key lacks the scope workspaces.create"
    );
    for (method, path) in [
        ("GET", "/v1/api-keys"),
        (
            "GET",
            "/v1/audit-logs?start_time=2000-01-01T00:00:00Z&end_time=2999-01-01T00:00:00Z",
        ),
        ("DELETE", "/v1/admin/workspaces/default"),
    ] {
        let (s, b) = app.call(method, path, Some(&reader), None).await;
        assert_eq!((s, code(&b)), (403, "AB03"), "{method} {path}: {b}");
    }
    let (s, b) = app
        .call(
            "POST",
            "/v1/api-keys/organisation/service",
            Some(&reader),
            Some(json!({"name": "x", "scopes": []})),
        )
        .await;
    assert_eq!((s, code(&b)), (403, "AB03"), "{b}");
    // An unknown key id is a 404: which scope it would need depends on the key's kind.
    let (s, _) = app
        .call(
            "GET",
            "/v1/api-keys/7d1f0b1e-8a4c-4f3e-9b1a-2c3d4e5f6a7b",
            Some(&reader),
            None,
        )
        .await;
    assert_eq!(s, 404);
}

crate::on_both_databases!(
    key_creation_by_role,
    workspace_keys_stay_in_their_workspace,
    members_see_only_their_own_keys,
    scopes_narrow_an_admin_key,
);
