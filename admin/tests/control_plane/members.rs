//! `/v1/admin/workspaces/{id}/users`: every endpoint's success and error statuses, role
//! changes seen in the list, and who may manage members (the admin key everywhere, workspace
//! admins and managers in their workspace, members nowhere).

use serde_json::{json, Value};

use admin::authz::{OrgRole, WorkspaceRole};

use crate::common::{App, TestDb, ADMIN_KEY};

fn code(body: &Value) -> &str {
    body["data"]["errorCode"].as_str().unwrap_or_default()
}

fn message(body: &Value) -> &str {
    body["data"]["message"].as_str().unwrap_or_default()
}

const MEMBER_SCOPES: &[&str] = &[
    "workspace_users.create",
    "workspace_users.read",
    "workspace_users.update",
    "workspace_users.delete",
    "workspace_users.list",
    "workspace_user_api_keys.read",
];

async fn add_list_get_update_delete(db: TestDb) {
    let app = App::start(db).await;
    let ws = app.workspace("Team").await;
    let (_, team) = app
        .admin("GET", &format!("/v1/admin/workspaces/{ws}"), None)
        .await;
    let slug = team["slug"].as_str().unwrap().to_owned();
    let u1 = app.user("u1@example.com", OrgRole::Member, None).await;
    let u2 = app.user("u2@example.com", OrgRole::Admin, None).await;
    let u3 = app.user("u3@example.com", OrgRole::Member, None).await;
    let base = format!("/v1/admin/workspaces/{ws}/users");
    let before = app.audit_count().await;
    let (s, got) = app
        .admin(
            "POST",
            &base,
            Some(json!({"users": [{"id": u1, "role": "member"}, {"id": u2, "role": "manager"}]})),
        )
        .await;
    assert_eq!((s, &got), (200, &json!({})));
    assert_eq!(
        app.audit_count().await,
        before + 1,
        "one record for the call"
    );
    let (_, audit) = app
        .admin("GET", "/v1/audit-logs?start_time=2000-01-01T00:00:00Z&end_time=2999-01-01T00:00:00Z&action=bulk_create&resource_type=workspace_user", None)
        .await;
    assert_eq!(audit["total"], 1, "{audit}");
    assert_eq!(
        audit["records"][0]["resource_ids"],
        json!([u1, u2]),
        "{audit}"
    );
    assert_eq!(audit["records"][0]["workspace_id"], json!(ws), "{audit}");

    let (s, list) = app.admin("GET", &base, None).await;
    assert_eq!(s, 200, "{list}");
    assert_eq!(list["object"], "list");
    assert_eq!(list["total"], 2);
    // Both were added at the same moment: find them by id.
    let find = |list: &Value, id: &str| {
        list["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("{id} in {list}"))
    };
    let first = &find(&list, &u1);
    assert_eq!(first["object"], "workspace-user");
    assert_eq!(first["id"], u1.as_str());
    assert_eq!(first["email"], "u1@example.com");
    assert_eq!(first["org_role"], "member");
    assert_eq!(first["role"], "member");
    assert_eq!(first["status"], "active");
    assert_eq!(first["workspace_id"], ws.as_str());
    assert_eq!(first["scopes"], json!([]));
    for field in ["first_name", "last_name", "created_at", "last_updated_at"] {
        assert!(first.get(field).is_some(), "{field}: {first}");
    }
    assert_eq!(find(&list, &u2)["org_role"], "admin");
    assert_eq!(find(&list, &u2)["role"], "manager");
    for (query, total, len) in [
        ("role=manager", 1, 1),
        ("role=admin", 0, 0),
        ("page_size=1", 2, 1),
        ("page_size=1&current_page=1", 2, 1),
    ] {
        let (s, got) = app.admin("GET", &format!("{base}?{query}"), None).await;
        assert_eq!(s, 200, "{query}: {got}");
        assert_eq!(got["total"], total, "{query}: {got}");
        assert_eq!(got["data"].as_array().unwrap().len(), len, "{query}");
    }
    for query in ["role=owner", "page_size=101", "pageSize=1"] {
        let (s, got) = app.admin("GET", &format!("{base}?{query}"), None).await;
        assert_eq!((s, code(&got)), (400, "AB01"), "{query}: {got}");
    }

    // One member, by the workspace's id or slug.
    for w in [&ws, &slug] {
        let (s, got) = app
            .admin("GET", &format!("/v1/admin/workspaces/{w}/users/{u1}"), None)
            .await;
        assert_eq!(s, 200, "{got}");
        assert_eq!(got["id"], u1.as_str());
        assert_eq!(got["role"], "member");
    }

    // A role change shows in the list.
    let one = format!("{base}/{u1}");
    let (s, got) = app
        .admin("PUT", &one, Some(json!({"role": "manager"})))
        .await;
    assert_eq!((s, &got), (200, &json!({})));
    let (_, list) = app
        .admin("GET", &format!("{base}?role=manager"), None)
        .await;
    assert_eq!(list["total"], 2, "{list}");
    let (_, got) = app.admin("GET", &one, None).await;
    assert_eq!(got["role"], "manager");

    // Errors, none of which changes anything.
    let before = app.audit_count().await;
    let nobody = "7d1f0b1e-8a4c-4f3e-9b1a-2c3d4e5f6a7b";
    let cases = [
        (
            json!({"users": [{"id": u3, "role": "member"}, {"id": u1, "role": "member"}]}),
            409,
            "AB07",
            "users[1].id: the user",
        ),
        (
            json!({"users": [{"id": nobody, "role": "member"}]}),
            404,
            "AB02",
            "users[0].id: no user",
        ),
        (
            json!({"users": [{"id": "x", "role": "member"}]}),
            400,
            "AB01",
            "users[0].id: must be a UUID",
        ),
        (
            json!({"users": [{"id": u3, "role": "member"}, {"id": u3, "role": "admin"}]}),
            400,
            "AB01",
            "users[1].id: names a user listed earlier",
        ),
        (
            json!({"users": []}),
            400,
            "AB01",
            "users: must list at least one user",
        ),
        (
            json!({"users": [{"id": u3, "role": "owner"}]}),
            400,
            "AB01",
            "users[0].role: unknown variant",
        ),
        (
            json!({"users": [{"id": u3}]}),
            400,
            "AB01",
            "users[0]: missing field `role`",
        ),
        (json!({}), 400, "AB01", "missing field `users`"),
        (
            json!({"users": [], "extra": 1}),
            400,
            "AB01",
            "extra: unknown field",
        ),
    ];
    for (body, status, want_code, want) in cases {
        let (s, got) = app.admin("POST", &base, Some(body.clone())).await;
        assert_eq!((s, code(&got)), (status, want_code), "{body}: {got}");
        assert!(message(&got).contains(want), "want {want:?}: {got}");
    }
    let (_, list) = app.admin("GET", &base, None).await;
    assert_eq!(
        list["total"], 2,
        "the refused additions added no one: {list}"
    );
    for (method, path, body, status, want_code) in [
        (
            "GET",
            "/v1/admin/workspaces/nowhere/users".to_owned(),
            None,
            404,
            "AB08",
        ),
        (
            "POST",
            "/v1/admin/workspaces/nowhere/users".to_owned(),
            Some(json!({"users": [{"id": u3, "role": "member"}]})),
            404,
            "AB08",
        ),
        ("GET", format!("{base}/{u3}"), None, 404, "AB08"),
        ("GET", format!("{base}/x"), None, 400, "AB01"),
        (
            "PUT",
            format!("{base}/{u3}"),
            Some(json!({"role": "member"})),
            404,
            "AB08",
        ),
        (
            "PUT",
            one.clone(),
            Some(json!({"role": "owner"})),
            400,
            "AB01",
        ),
        ("PUT", one.clone(), Some(json!({})), 400, "AB01"),
        ("DELETE", format!("{base}/{u3}"), None, 404, "AB08"),
        (
            "DELETE",
            one.clone(),
            Some(json!({"force": true})),
            400,
            "AB01",
        ),
    ] {
        let (s, got) = app.admin(method, &path, body).await;
        assert_eq!(
            (s, code(&got)),
            (status, want_code),
            "{method} {path}: {got}"
        );
    }
    assert_eq!(app.audit_count().await, before);

    // Removal: the member's user keys in the workspace go with the membership.
    let (_, u1_key) = app.user_key(&ws, &u1, &["configs.read"]).await;
    app.store
        .set_workspace_member(&app.default_ws, &u1, WorkspaceRole::Member)
        .await
        .unwrap();
    let (_, u1_other) = app.user_key(&app.default_ws, &u1, &["configs.read"]).await;
    let (s, got) = app.admin("DELETE", &one, None).await;
    assert_eq!((s, &got), (200, &json!({})));
    let (s, _) = app.call("GET", "/v1/api-keys", Some(&u1_key), None).await;
    assert_eq!(s, 401);
    let (s, _) = app.call("GET", "/v1/api-keys", Some(&u1_other), None).await;
    assert_eq!(
        s, 403,
        "the key of another workspace stays (it lacks the scope)"
    );
    let (s, _) = app.admin("GET", &one, None).await;
    assert_eq!(s, 404);
    let (s, _) = app.admin("DELETE", &one, None).await;
    assert_eq!(s, 404);
    let (_, got) = app
        .admin("GET", &format!("/v1/admin/workspaces/{ws}"), None)
        .await;
    assert_eq!(got["users"].as_array().unwrap().len(), 1, "{got}");
    // Added again, as a new member.
    let (s, _) = app
        .admin(
            "POST",
            &format!("/v1/admin/workspaces/{slug}/users"),
            Some(json!({"users": [{"id": u1, "role": "admin"}]})),
        )
        .await;
    assert_eq!(s, 200);
    let (_, got) = app.admin("GET", &one, None).await;
    assert_eq!(got["role"], "admin");
}

async fn managers_manage_their_own_workspace(db: TestDb) {
    let app = App::start(db).await;
    let a = app.default_ws.clone();
    let b = app.workspace("B").await;
    let manager = app
        .user(
            "m@example.com",
            OrgRole::Member,
            Some((&a, WorkspaceRole::Manager)),
        )
        .await;
    let member = app
        .user(
            "x@example.com",
            OrgRole::Member,
            Some((&a, WorkspaceRole::Member)),
        )
        .await;
    let ws_admin = app
        .user(
            "wa@example.com",
            OrgRole::Member,
            Some((&a, WorkspaceRole::Admin)),
        )
        .await;
    let newcomer = app.user("n@example.com", OrgRole::Member, None).await;
    let (_, mk) = app.user_key(&a, &manager, MEMBER_SCOPES).await;
    let (_, xk) = app.user_key(&a, &member, MEMBER_SCOPES).await;
    let (_, ak) = app.user_key(&a, &ws_admin, MEMBER_SCOPES).await;
    let base = format!("/v1/admin/workspaces/{a}/users");

    // The manager lists, reads, adds, changes and removes members and managers of their
    // workspace...
    let (s, list) = app.call("GET", &base, Some(&mk), None).await;
    assert_eq!(s, 200, "{list}");
    assert_eq!(list["total"], 3);
    let (s, got) = app
        .call("GET", &format!("{base}/{member}"), Some(&mk), None)
        .await;
    assert_eq!(s, 200, "{got}");
    let (s, got) = app
        .call(
            "POST",
            &base,
            Some(&mk),
            Some(json!({"users": [{"id": newcomer, "role": "member"}]})),
        )
        .await;
    assert_eq!(s, 200, "{got}");
    let (s, got) = app
        .call(
            "PUT",
            &format!("{base}/{newcomer}"),
            Some(&mk),
            Some(json!({"role": "manager"})),
        )
        .await;
    assert_eq!(s, 200, "{got}");
    let (s, got) = app
        .call("DELETE", &format!("{base}/{newcomer}"), Some(&mk), None)
        .await;
    assert_eq!(s, 200, "{got}");
    // ...but neither grants nor touches the admin role.
    for (method, path, body) in [
        (
            "POST",
            base.clone(),
            Some(json!({"users": [{"id": newcomer, "role": "admin"}]})),
        ),
        (
            "PUT",
            format!("{base}/{member}"),
            Some(json!({"role": "admin"})),
        ),
        (
            "PUT",
            format!("{base}/{ws_admin}"),
            Some(json!({"role": "member"})),
        ),
        ("DELETE", format!("{base}/{ws_admin}"), None),
    ] {
        let (s, got) = app.call(method, &path, Some(&mk), body).await;
        assert_eq!((s, code(&got)), (403, "AB03"), "{method} {path}: {got}");
    }
    // A workspace admin does.
    let (s, got) = app
        .call(
            "PUT",
            &format!("{base}/{member}"),
            Some(&ak),
            Some(json!({"role": "admin"})),
        )
        .await;
    assert_eq!(s, 200, "{got}");
    let (s, got) = app
        .call(
            "PUT",
            &format!("{base}/{member}"),
            Some(&ak),
            Some(json!({"role": "member"})),
        )
        .await;
    assert_eq!(s, 200, "{got}");

    // Another workspace, existing or not, is out of reach.
    for path in [
        format!("/v1/admin/workspaces/{b}/users"),
        "/v1/admin/workspaces/nowhere/users".to_owned(),
        format!("/v1/admin/workspaces/{b}/users/{manager}"),
    ] {
        let (s, got) = app.call("GET", &path, Some(&mk), None).await;
        assert_eq!((s, code(&got)), (403, "AB03"), "{path}: {got}");
    }
    let (s, got) = app
        .call(
            "POST",
            &format!("/v1/admin/workspaces/{b}/users"),
            Some(&mk),
            Some(json!({"users": [{"id": newcomer, "role": "member"}]})),
        )
        .await;
    assert_eq!((s, code(&got)), (403, "AB03"), "{got}");

    // A member manages no one, not even reading the list.
    for (method, path, body) in [
        ("GET", base.clone(), None),
        ("GET", format!("{base}/{manager}"), None),
        (
            "POST",
            base.clone(),
            Some(json!({"users": [{"id": newcomer, "role": "member"}]})),
        ),
        (
            "PUT",
            format!("{base}/{manager}"),
            Some(json!({"role": "member"})),
        ),
        ("DELETE", format!("{base}/{manager}"), None),
    ] {
        let (s, got) = app.call(method, &path, Some(&xk), body).await;
        assert_eq!((s, code(&got)), (403, "AB03"), "{method} {path}: {got}");
    }

    // Scopes narrow the manager's key.
    let (_, lister) = app.user_key(&a, &manager, &["workspace_users.list"]).await;
    let (s, _) = app.call("GET", &base, Some(&lister), None).await;
    assert_eq!(s, 200);
    let (s, got) = app
        .call(
            "POST",
            &base,
            Some(&lister),
            Some(json!({"users": [{"id": newcomer, "role": "member"}]})),
        )
        .await;
    assert_eq!(
        (s, message(&got)),
        (403, "the key lacks the scope workspace_users.create")
    );

    // The admin key manages every workspace's members, admins included.
    let (s, got) = app
        .call(
            "POST",
            &format!("/v1/admin/workspaces/{b}/users"),
            Some(ADMIN_KEY),
            Some(json!({"users": [{"id": manager, "role": "admin"}]})),
        )
        .await;
    assert_eq!(s, 200, "{got}");
    let (s, _) = app
        .admin("DELETE", &format!("{base}/{ws_admin}"), None)
        .await;
    assert_eq!(s, 200);
}

crate::on_both_databases!(
    add_list_get_update_delete,
    managers_manage_their_own_workspace,
);
