//! `/v1/admin/users` and `/v1/admin/users/invites`: every endpoint's success and error
//! statuses, and the invite flow end to end (invite, list, resend, accept, the user and their
//! memberships, re-invite refused).

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

/// The token of an invite link.
fn token(link: &str) -> String {
    link.split_once("token=")
        .expect("a token in the link")
        .1
        .to_owned()
}

async fn invite(app: &App, body: Value) -> (String, String) {
    let (s, b) = app
        .admin("POST", "/v1/admin/users/invites", Some(body))
        .await;
    assert_eq!(s, 200, "{b}");
    let link = b["invite_link"].as_str().expect("a link").to_owned();
    (b["id"].as_str().expect("an id").to_owned(), link)
}

async fn accept(app: &App, id: &str, body: Value) -> (u16, Value) {
    app.call(
        "POST",
        &format!("/v1/admin/users/invites/{id}/accept"),
        None,
        Some(body),
    )
    .await
}

async fn users_list_get_update_delete(db: TestDb) {
    let app = App::start(db).await;
    let ws = app.default_ws.clone();
    let admin = app.user("Admin@Example.com", OrgRole::Admin, None).await;
    let m1 = app
        .user(
            "member1@example.com",
            OrgRole::Member,
            Some((&ws, WorkspaceRole::Member)),
        )
        .await;
    let _m2 = app.user("member2@example.com", OrgRole::Member, None).await;

    let (s, list) = app.admin("GET", "/v1/admin/users", None).await;
    assert_eq!(s, 200, "{list}");
    assert_eq!(list["object"], "list");
    assert_eq!(list["total"], 4, "{list}");
    let first = &list["data"][0];
    assert_eq!(first["object"], "user");
    assert_eq!(first["id"], app.owner.as_str());
    assert_eq!(first["role"], "owner");
    for field in ["first_name", "last_name", "created_at", "last_updated_at"] {
        assert!(first.get(field).is_some(), "{field}: {first}");
    }
    let one = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["id"] == m1.as_str())
        .unwrap();
    assert_eq!(one["workspace_ids"], json!([ws]));
    assert_eq!(one["email"], "member1@example.com");

    for (query, total) in [
        ("role=member", 2),
        ("role=owner", 1),
        ("role=admin", 1),
        ("email=MEMBER1", 1),
        ("email=example.com", 3),
        ("email=%25", 0),
        ("pageSize=1&currentPage=1", 4),
    ] {
        let (s, got) = app
            .admin("GET", &format!("/v1/admin/users?{query}"), None)
            .await;
        assert_eq!(s, 200, "{query}: {got}");
        assert_eq!(got["total"], total, "{query}: {got}");
    }
    let (_, page) = app
        .admin("GET", "/v1/admin/users?pageSize=1&currentPage=1", None)
        .await;
    assert_eq!(page["data"].as_array().unwrap().len(), 1);
    assert_eq!(page["data"][0]["id"], admin.as_str());
    for (query, want) in [
        ("pageSize=101", "pageSize: must be between 0 and 100"),
        ("currentPage=-1", "currentPage: must be >= 0"),
        ("role=boss", "unknown variant"),
        ("page_size=1", "unknown field `page_size`"),
    ] {
        let (s, got) = app
            .admin("GET", &format!("/v1/admin/users?{query}"), None)
            .await;
        assert_eq!((s, code(&got)), (400, "AB01"), "{query}: {got}");
        assert!(message(&got).contains(want), "{query}: {got}");
    }

    // One user.
    let path = format!("/v1/admin/users/{m1}");
    let (s, got) = app.admin("GET", &path, None).await;
    assert_eq!(s, 200, "{got}");
    assert_eq!(got["role"], "member");
    assert_eq!(got["workspace_ids"], json!([ws]));
    let (s, got) = app.admin("GET", "/v1/admin/users/not-a-uuid", None).await;
    assert_eq!((s, code(&got)), (400, "AB01"), "{got}");
    let nobody = "7d1f0b1e-8a4c-4f3e-9b1a-2c3d4e5f6a7b";
    let (s, got) = app
        .admin("GET", &format!("/v1/admin/users/{nobody}"), None)
        .await;
    assert_eq!((s, code(&got)), (404, "AB08"), "{got}");

    // Role changes.
    let before = app.audit_count().await;
    let (s, got) = app
        .admin("PUT", &path, Some(json!({"role": "admin"})))
        .await;
    assert_eq!((s, &got), (200, &json!({})));
    let (_, got) = app.admin("GET", &path, None).await;
    assert_eq!(got["role"], "admin");
    assert_eq!(app.audit_count().await, before + 1);
    for (body, want) in [
        (json!({"role": "owner"}), "unknown variant `owner`"),
        (json!({}), "missing field `role`"),
        (json!({"role": "member", "email": "x@y.z"}), "unknown field"),
    ] {
        let (s, got) = app.admin("PUT", &path, Some(body.clone())).await;
        assert_eq!((s, code(&got)), (400, "AB01"), "{body}: {got}");
        assert!(message(&got).contains(want), "{got}");
    }
    let owner_path = format!("/v1/admin/users/{}", app.owner);
    let (s, got) = app
        .admin("PUT", &owner_path, Some(json!({"role": "member"})))
        .await;
    assert_eq!(
        (s, code(&got)),
        (403, "AB03"),
        "the owner keeps the role: {got}"
    );
    let (s, got) = app
        .admin(
            "PUT",
            &format!("/v1/admin/users/{nobody}"),
            Some(json!({"role": "member"})),
        )
        .await;
    assert_eq!((s, code(&got)), (404, "AB08"), "{got}");
    assert_eq!(
        app.audit_count().await,
        before + 1,
        "refusals change nothing (they are recorded as refused only)"
    );

    // Removal: the user's keys stop working, their memberships go.
    app.sql(
        "UPDATE users SET role = 'member' WHERE id = $1",
        &[m1.as_str()],
    )
    .await;
    let (_, m1_key) = app
        .user_key(&ws, &m1, &["workspace_user_api_keys.list"])
        .await;
    let (s, _) = app.call("GET", "/v1/api-keys", Some(&m1_key), None).await;
    assert_eq!(s, 200);
    let (s, got) = app.admin("DELETE", &path, None).await;
    assert_eq!((s, &got), (200, &json!({})));
    let (s, got) = app.call("GET", "/v1/api-keys", Some(&m1_key), None).await;
    assert_eq!((s, code(&got)), (401, "AB05"), "{got}");
    let (s, _) = app.admin("GET", &path, None).await;
    assert_eq!(s, 404);
    let (s, _) = app.admin("DELETE", &path, None).await;
    assert_eq!(s, 404);
    let (_, members) = app
        .admin("GET", &format!("/v1/admin/workspaces/{ws}/users"), None)
        .await;
    assert_eq!(members["total"], 0, "{members}");
    let (s, got) = app.admin("DELETE", &owner_path, None).await;
    assert_eq!((s, code(&got)), (403, "AB03"), "{got}");
    let (s, got) = app
        .admin(
            "DELETE",
            &format!("/v1/admin/users/{admin}"),
            Some(json!({"force": true})),
        )
        .await;
    assert_eq!((s, code(&got)), (400, "AB01"), "{got}");
    let (_, list) = app.admin("GET", "/v1/admin/users", None).await;
    assert_eq!(list["total"], 3);

    // The audit log names what was done.
    let (_, logs) = app
        .admin(
            "GET",
            "/v1/audit-logs?start_time=2000-01-01T00:00:00Z&end_time=2999-01-01T00:00:00Z&resource_type=user",
            None,
        )
        .await;
    let actions: Vec<&str> = logs["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["action"].as_str().unwrap())
        .collect();
    // Newest first: the refused delete and update of the owner are there too, by the admin key.
    assert_eq!(
        actions,
        ["refused", "delete", "refused", "update"],
        "{logs}"
    );
    let refused = &logs["records"][0];
    assert_eq!(refused["response_status_code"], 403, "{refused}");
    assert_eq!(refused["method"], "DELETE", "{refused}");
    assert_eq!(refused["uri"], owner_path.as_str(), "{refused}");
    assert_eq!(
        refused["api_key_id"],
        app.admin_key_id.as_str(),
        "{refused}"
    );
}

async fn invite_flow_end_to_end(db: TestDb) {
    let app = App::start(db).await;
    let ws_b = app.workspace("B").await;
    let scopes = ["configs.read", "workspace_users.list"];
    let (id, link) = invite(
        &app,
        json!({
            "email": "New.Person@Example.com",
            "role": "member",
            "workspaces": [{"id": "default", "role": "manager"}, {"id": ws_b, "role": "member"}],
            "workspace_api_key_details": {"scopes": scopes},
        }),
    )
    .await;
    assert!(
        link.contains(&format!("/v1/admin/users/invites/{id}/accept?token=")),
        "{link}"
    );

    // Listed, pending, the address in lowercase, invited by the admin key's user.
    let (s, list) = app.admin("GET", "/v1/admin/users/invites", None).await;
    assert_eq!(s, 200, "{list}");
    assert_eq!(list["total"], 1);
    let inv = &list["data"][0];
    assert_eq!(inv["object"], "invite");
    assert_eq!(inv["id"], id.as_str());
    assert_eq!(inv["email"], "new.person@example.com");
    assert_eq!(inv["role"], "member");
    assert_eq!(inv["status"], "pending");
    assert_eq!(inv["accepted_at"], Value::Null);
    assert_eq!(inv["invited_by"], app.owner.as_str());
    assert_eq!(
        inv["workspaces"],
        json!([{"id": app.default_ws, "role": "manager"}, {"id": ws_b, "role": "member"}])
    );
    assert_eq!(inv["workspace_api_key_details"]["scopes"], json!(scopes));
    assert!(inv["expires_at"].as_str().unwrap() > inv["created_at"].as_str().unwrap());
    for (query, total) in [
        ("status=pending", 1),
        ("status=accepted", 0),
        ("email=NEW.person", 1),
        ("role=admin", 0),
        ("pageSize=0", 1),
    ] {
        let (s, got) = app
            .admin("GET", &format!("/v1/admin/users/invites?{query}"), None)
            .await;
        assert_eq!((s, &got["total"]), (200, &json!(total)), "{query}: {got}");
    }
    let (s, got) = app
        .admin("GET", "/v1/admin/users/invites?status=lost", None)
        .await;
    assert_eq!((s, code(&got)), (400, "AB01"), "{got}");
    let (s, got) = app
        .admin("GET", &format!("/v1/admin/users/invites/{id}"), None)
        .await;
    assert_eq!(s, 200, "{got}");
    assert_eq!(&got, inv);

    // Resend: a new link; the old one no longer works.
    let (s, got) = app
        .admin(
            "POST",
            &format!("/v1/admin/users/invites/{id}/resend"),
            None,
        )
        .await;
    assert_eq!(s, 200, "{got}");
    let new_link = got["inviteLink"].as_str().unwrap().to_owned();
    assert_ne!(token(&new_link), token(&link));
    let (s, got) = accept(&app, &id, json!({"token": token(&link)})).await;
    assert_eq!((s, code(&got)), (401, "AB05"), "{got}");
    let (s, got) = accept(&app, &id, json!({})).await;
    assert_eq!((s, code(&got)), (400, "AB01"), "{got}");
    assert!(message(&got).starts_with("token:"), "{got}");

    // Accept: the user, their memberships and keys.
    let (s, user) = accept(
        &app,
        &id,
        json!({"token": token(&new_link), "first_name": "New", "last_name": "Person"}),
    )
    .await;
    assert_eq!(s, 200, "{user}");
    assert_eq!(user["object"], "user");
    assert_eq!(user["email"], "new.person@example.com");
    assert_eq!(user["role"], "member");
    assert_eq!(user["first_name"], "New");
    assert_eq!(user["last_name"], "Person");
    let user_id = user["id"].as_str().unwrap().to_owned();
    let mut joined: Vec<&str> = user["workspace_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    joined.sort();
    let mut want = vec![app.default_ws.as_str(), ws_b.as_str()];
    want.sort();
    assert_eq!(joined, want);
    let keys = user["api_keys"].as_array().unwrap();
    assert_eq!(keys.len(), 2, "{user}");
    let default_key = keys
        .iter()
        .find(|k| k["workspace_id"] == app.default_ws.as_str())
        .unwrap()["key"]
        .as_str()
        .unwrap()
        .to_owned();

    let (s, got) = app
        .admin("GET", &format!("/v1/admin/users/{user_id}"), None)
        .await;
    assert_eq!(s, 200, "{got}");
    assert_eq!(got["first_name"], "New");
    // The new key works: the user manages the default workspace, whose members they list.
    let (s, members) = app
        .call(
            "GET",
            "/v1/admin/workspaces/default/users",
            Some(&default_key),
            None,
        )
        .await;
    assert_eq!(s, 200, "{members}");
    let me = members["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == user_id.as_str())
        .expect("the new member")
        .clone();
    assert_eq!(me["role"], "manager");
    assert_eq!(me["org_role"], "member");
    assert_eq!(me["scopes"], json!(scopes));
    let (_, member_b) = app
        .admin(
            "GET",
            &format!("/v1/admin/workspaces/{ws_b}/users/{user_id}"),
            None,
        )
        .await;
    assert_eq!(member_b["role"], "member");
    let (_, keys_listed) = app
        .admin("GET", &format!("/v1/api-keys?workspace_id={ws_b}"), None)
        .await;
    assert_eq!(keys_listed["total"], 1, "{keys_listed}");
    assert_eq!(keys_listed["data"][0]["user_id"], user_id.as_str());
    assert!(keys_listed["data"][0]["expires_at"].is_string());

    let (_, got) = app
        .admin("GET", &format!("/v1/admin/users/invites/{id}"), None)
        .await;
    assert_eq!(got["status"], "accepted");
    assert!(got["accepted_at"].is_string());
    let (s, got) = accept(&app, &id, json!({"token": token(&new_link)})).await;
    assert_eq!((s, code(&got)), (409, "AB07"), "{got}");

    // Inviting them again is the spec's improved error.
    let (s, got) = app
        .admin(
            "POST",
            "/v1/admin/users/invites",
            Some(json!({"email": "NEW.PERSON@example.com", "role": "admin", "workspaces": []})),
        )
        .await;
    assert_eq!((s, code(&got)), (409, "AB07"), "{got}");
    assert!(
        message(&got).contains("is already a member of the organisation"),
        "{got}"
    );
    for (method, path) in [
        ("POST", format!("/v1/admin/users/invites/{id}/resend")),
        ("DELETE", format!("/v1/admin/users/invites/{id}")),
    ] {
        let (s, got) = app.admin(method, &path, None).await;
        assert_eq!((s, code(&got)), (409, "AB07"), "{method} {path}: {got}");
    }

    // The acceptance is in the audit log as the new user's act, without the token.
    let (_, logs) = app
        .admin(
            "GET",
            "/v1/audit-logs?start_time=2000-01-01T00:00:00Z&end_time=2999-01-01T00:00:00Z&action=accept",
            None,
        )
        .await;
    assert_eq!(logs["total"], 1, "{logs}");
    let rec = &logs["records"][0];
    assert_eq!(rec["user_id"], user_id.as_str());
    assert_eq!(rec["resource_type"], "invite");
    assert_eq!(rec["request_body"]["token"], "[REDACTED]");
    assert!(!rec["uri"].as_str().unwrap().contains("token"), "{rec}");
}

async fn invite_errors_cancel_and_expiry(db: TestDb) {
    let app = App::start(db).await;
    let before = app.audit_count().await;
    let nobody = "7d1f0b1e-8a4c-4f3e-9b1a-2c3d4e5f6a7b";
    let ok = |extra: Value| {
        let mut body = json!({"email": "a@example.com", "role": "member", "workspaces": [{"id": "default", "role": "member"}]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let cases = [
        (
            json!({"role": "member", "workspaces": []}),
            400,
            "missing field `email`",
        ),
        (
            ok(json!({"email": "not-an-address"})),
            400,
            "email: \"not-an-address\" is not an e-mail address",
        ),
        (
            ok(json!({"role": "owner"})),
            400,
            "role: unknown variant `owner`",
        ),
        (
            json!({"email": "a@example.com", "role": "member"}),
            400,
            "missing field `workspaces`",
        ),
        (
            ok(json!({"workspaces": [{"id": "nope", "role": "member"}]})),
            404,
            "workspaces[0].id: no workspace",
        ),
        (
            ok(json!({"workspaces": [{"id": "default", "role": "boss"}]})),
            400,
            "workspaces[0].role: unknown variant",
        ),
        (
            ok(
                json!({"workspaces": [{"id": "default", "role": "member"}, {"id": app.default_ws, "role": "admin"}]}),
            ),
            400,
            "workspaces[1].id: names a workspace listed earlier",
        ),
        (
            ok(json!({"workspace_api_key_details": {"scopes": ["nope"]}})),
            400,
            "workspace_api_key_details.scopes[0]: unknown scope",
        ),
        (
            ok(json!({"workspace_api_key_details": {"scopes": ["deployments.list"]}})),
            400,
            "admin keys only",
        ),
        (
            ok(json!({"workspaces": [], "workspace_api_key_details": {"scopes": []}})),
            400,
            "list at least one",
        ),
        (
            ok(json!({"workspace_api_key_details": {}})),
            400,
            "missing field `scopes`",
        ),
        (ok(json!({"colour": "blue"})), 400, "colour: unknown field"),
    ];
    for (body, status, want) in cases {
        let (s, got) = app
            .admin("POST", "/v1/admin/users/invites", Some(body.clone()))
            .await;
        assert_eq!(s, status, "{body}: {got}");
        assert!(message(&got).contains(want), "want {want:?}: {got}");
    }
    assert_eq!(app.audit_count().await, before);

    // One pending invite per address.
    let (id, link) = invite(&app, ok(json!({}))).await;
    let (s, got) = app
        .admin(
            "POST",
            "/v1/admin/users/invites",
            Some(ok(json!({"email": "A@example.com"}))),
        )
        .await;
    assert_eq!((s, code(&got)), (409, "AB07"), "{got}");
    assert!(message(&got).contains("pending invite"), "{got}");

    // Cancel: the link stops working; cancelling twice, resending or accepting it is a 409.
    let path = format!("/v1/admin/users/invites/{id}");
    let (s, got) = app.admin("DELETE", &path, None).await;
    assert_eq!((s, &got), (200, &json!({})));
    let (_, got) = app.admin("GET", &path, None).await;
    assert_eq!(got["status"], "cancelled");
    let (s, _) = app.admin("DELETE", &path, None).await;
    assert_eq!(s, 409);
    let (s, _) = app.admin("POST", &format!("{path}/resend"), None).await;
    assert_eq!(s, 409);
    let (s, got) = accept(&app, &id, json!({"token": token(&link)})).await;
    assert_eq!((s, code(&got)), (409, "AB07"), "{got}");
    let (_, list) = app
        .admin("GET", "/v1/admin/users/invites?status=cancelled", None)
        .await;
    assert_eq!(list["total"], 1);

    // The address may be invited again; that invite expires.
    let (id2, link2) = invite(&app, ok(json!({}))).await;
    app.sql(
        "UPDATE invites SET expires_at = '2020-01-01T00:00:00.000000Z' WHERE id = $1",
        &[id2.as_str()],
    )
    .await;
    let path2 = format!("/v1/admin/users/invites/{id2}");
    let (_, got) = app.admin("GET", &path2, None).await;
    assert_eq!(got["status"], "expired");
    let (_, list) = app
        .admin("GET", "/v1/admin/users/invites?status=expired", None)
        .await;
    assert_eq!(list["total"], 1);
    let (_, list) = app
        .admin("GET", "/v1/admin/users/invites?status=pending", None)
        .await;
    assert_eq!(list["total"], 0);
    let (s, got) = accept(&app, &id2, json!({"token": token(&link2)})).await;
    assert_eq!((s, code(&got)), (409, "AB07"), "{got}");
    assert!(message(&got).contains("expired"), "{got}");
    // An expired invite does not hold the address...
    let (id3, _) = invite(&app, ok(json!({}))).await;
    let (_, got) = app.admin("GET", &path2, None).await;
    assert_eq!(got["status"], "expired");
    // ...and is not resent while a newer one is pending.
    let (s, got) = app.admin("POST", &format!("{path2}/resend"), None).await;
    assert_eq!((s, code(&got)), (409, "AB07"), "{got}");
    let (s, _) = app
        .admin("DELETE", &format!("/v1/admin/users/invites/{id3}"), None)
        .await;
    assert_eq!(s, 200);
    // Resending it makes it pending for a new week; the link of the resend is accepted in
    // the query.
    let (s, got) = app.admin("POST", &format!("{path2}/resend"), None).await;
    assert_eq!(s, 200, "{got}");
    let link = got["inviteLink"].as_str().unwrap();
    let (_, got) = app.admin("GET", &path2, None).await;
    assert_eq!(got["status"], "pending");
    let (s, got) = app
        .call("POST", &link[link.find("/v1/").unwrap()..], None, None)
        .await;
    assert_eq!(s, 200, "{got}");
    assert_eq!(got["email"], "a@example.com");
    assert_eq!(got["api_keys"], json!([]));
    assert_eq!(got["workspace_ids"], json!([app.default_ws]));

    // Unknown and malformed ids; a body field the endpoint does not take.
    for (method, path) in [
        ("GET", format!("/v1/admin/users/invites/{nobody}")),
        ("DELETE", format!("/v1/admin/users/invites/{nobody}")),
        ("POST", format!("/v1/admin/users/invites/{nobody}/resend")),
    ] {
        let (s, got) = app.admin(method, &path, None).await;
        assert_eq!((s, code(&got)), (404, "AB08"), "{method} {path}: {got}");
    }
    let (s, got) = accept(&app, nobody, json!({"token": "x"})).await;
    assert_eq!((s, code(&got)), (404, "AB08"), "{got}");
    let (s, got) = accept(&app, "x", json!({"token": "x"})).await;
    assert_eq!((s, code(&got)), (400, "AB01"), "{got}");
    let (s, got) = accept(&app, &id2, json!({"token": "x", "password": "p"})).await;
    assert_eq!((s, code(&got)), (400, "AB01"), "{got}");
    let (s, got) = app.admin("GET", "/v1/admin/users/invites/x", None).await;
    assert_eq!((s, code(&got)), (400, "AB01"), "{got}");
    let (s, got) = app
        .admin(
            "POST",
            &format!("{path2}/resend"),
            Some(json!({"email": "b@example.com"})),
        )
        .await;
    assert_eq!((s, code(&got)), (400, "AB01"), "{got}");
}

async fn concurrent_acceptance(db: TestDb) {
    let app = Arc::new(App::start(db).await);
    let (id, link) = invite(
        &app,
        json!({"email": "race@example.com", "role": "member", "workspaces": [{"id": "default", "role": "member"}]}),
    )
    .await;
    let tasks = (0..6).map(|_| {
        let app = app.clone();
        let (id, t) = (id.clone(), token(&link));
        tokio::spawn(async move { accept(&app, &id, json!({"token": t})).await.0 })
    });
    let mut statuses: Vec<u16> = futures_util::future::join_all(tasks)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    statuses.sort();
    assert_eq!(statuses, [200, 409, 409, 409, 409, 409]);
    let (_, users) = app.admin("GET", "/v1/admin/users?email=race", None).await;
    assert_eq!(users["total"], 1);
}

/// Users and invites need an admin key: every workspace key, whatever its role, is refused.
async fn workspace_keys_reach_no_users(db: TestDb) {
    let app = App::start(db).await;
    let manager = app
        .user(
            "m@example.com",
            OrgRole::Member,
            Some((&app.default_ws, WorkspaceRole::Manager)),
        )
        .await;
    let (_, key) = app.user_key(&app.default_ws, &manager, WS_SCOPES).await;
    let (_, service) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/workspace/service",
            json!({"name": "svc", "workspace_id": "default", "scopes": WS_SCOPES}),
        )
        .await;
    let (id, _) = invite(
        &app,
        json!({"email": "x@example.com", "role": "member", "workspaces": []}),
    )
    .await;
    let calls = [
        ("GET", "/v1/admin/users".to_owned(), None),
        ("GET", format!("/v1/admin/users/{manager}"), None),
        (
            "PUT",
            format!("/v1/admin/users/{manager}"),
            Some(json!({"role": "admin"})),
        ),
        ("DELETE", format!("/v1/admin/users/{manager}"), None),
        (
            "POST",
            "/v1/admin/users/invites".to_owned(),
            Some(json!({"email": "y@example.com", "role": "member", "workspaces": []})),
        ),
        ("GET", "/v1/admin/users/invites".to_owned(), None),
        ("GET", format!("/v1/admin/users/invites/{id}"), None),
        ("DELETE", format!("/v1/admin/users/invites/{id}"), None),
        ("POST", format!("/v1/admin/users/invites/{id}/resend"), None),
    ];
    for k in [key.as_str(), service.as_str()] {
        for (method, path, body) in &calls {
            let (s, got) = app.call(method, path, Some(k), body.clone()).await;
            assert_eq!((s, code(&got)), (403, "AB03"), "{method} {path}: {got}");
        }
    }
    // An admin key without the scope is refused too; no key at all is a 401.
    let (_, reader) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/organisation/service",
            json!({"name": "r", "scopes": ["organisation_users.list"]}),
        )
        .await;
    let (s, _) = app
        .call("GET", "/v1/admin/users", Some(&reader), None)
        .await;
    assert_eq!(s, 200);
    let (s, got) = app
        .call("GET", "/v1/admin/users/invites", Some(&reader), None)
        .await;
    assert_eq!(s, 200, "{got}");
    let (s, got) = app
        .call(
            "GET",
            &format!("/v1/admin/users/{manager}"),
            Some(&reader),
            None,
        )
        .await;
    assert_eq!(
        (s, message(&got)),
        (403, "the key lacks the scope organisation_users.read")
    );
    let (s, got) = app.call("GET", "/v1/admin/users", None, None).await;
    assert_eq!((s, code(&got)), (401, "AB05"), "{got}");
}

crate::on_both_databases!(
    users_list_get_update_delete,
    invite_flow_end_to_end,
    invite_errors_cancel_and_expiry,
    concurrent_acceptance,
    workspace_keys_reach_no_users,
);
