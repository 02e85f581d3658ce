//! Roles that cannot be climbed (issue 20): a workspace key or a workspace user acts on user
//! keys only for explicit members of its workspace whose role is at most its own, never for
//! the organisation's owners and admins; and an integration's host changes only with its
//! credentials sent again (or by an organisation admin).

use serde_json::{json, Value};

use admin::authz::{OrgRole, WorkspaceRole};

use crate::common::{App, TestDb, ADMIN_KEY, WS_SCOPES};
use crate::integrations::app_with_key;

fn code(body: &Value) -> &str {
    body["data"]["errorCode"].as_str().unwrap_or_default()
}

fn message(body: &Value) -> &str {
    body["data"]["message"].as_str().unwrap_or_default()
}

fn user_key_body(ws: &str, user: &str) -> Value {
    json!({"name": "k", "workspace_id": ws, "user_id": user, "scopes": ["configs.read"]})
}

/// The people of workspace `default`, their user keys, and a service key there.
struct People {
    app: App,
    ws: String,
    /// An organisation admin who is not a member of the workspace.
    org_admin: String,
    /// An organisation admin who is also an explicit member (role member) of the workspace.
    org_admin_member: String,
    ws_admin: String,
    manager: String,
    other_manager: String,
    member: String,
    ws_admin_key: String,
    manager_key: String,
    member_key: String,
    org_admin_key: String,
    service_key: String,
}

async fn people(db: TestDb) -> People {
    let app = app_with_key(db).await;
    let ws = app.default_ws.clone();
    let as_member = |role| Some((ws.as_str(), role));
    let org_admin = app
        .user("org-admin@example.com", OrgRole::Admin, None)
        .await;
    let org_admin_member = app
        .user(
            "org-admin-member@example.com",
            OrgRole::Admin,
            as_member(WorkspaceRole::Member),
        )
        .await;
    let ws_admin = app
        .user(
            "ws-admin@example.com",
            OrgRole::Member,
            as_member(WorkspaceRole::Admin),
        )
        .await;
    let manager = app
        .user(
            "manager@example.com",
            OrgRole::Member,
            as_member(WorkspaceRole::Manager),
        )
        .await;
    let other_manager = app
        .user(
            "manager2@example.com",
            OrgRole::Member,
            as_member(WorkspaceRole::Manager),
        )
        .await;
    let member = app
        .user(
            "member@example.com",
            OrgRole::Member,
            as_member(WorkspaceRole::Member),
        )
        .await;
    let (_, ws_admin_key) = app.user_key(&ws, &ws_admin, WS_SCOPES).await;
    let (_, manager_key) = app.user_key(&ws, &manager, WS_SCOPES).await;
    let (_, member_key) = app.user_key(&ws, &member, WS_SCOPES).await;
    let (_, org_admin_key) = app.user_key(&ws, &org_admin, WS_SCOPES).await;
    let (_, service_key) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/workspace/service",
            json!({"name": "svc", "workspace_id": ws, "scopes": WS_SCOPES}),
        )
        .await;
    People {
        app,
        ws,
        org_admin,
        org_admin_member,
        ws_admin,
        manager,
        other_manager,
        member,
        ws_admin_key,
        manager_key,
        member_key,
        org_admin_key,
        service_key,
    }
}

/// Who may create a user key for whom: a manager (user or service key) for members and
/// managers only; a workspace admin for every explicit member who is not an organisation
/// owner or admin; an organisation admin (admin key, or their user key) for anyone.
async fn user_keys_are_made_only_for_members_at_or_below_the_caller(db: TestDb) {
    let p = people(db).await;
    let app = &p.app;
    let owner = app.owner.clone();
    let refused = [
        (
            "manager",
            &p.manager_key,
            &owner,
            "the organisation's owner",
        ),
        (
            "manager",
            &p.manager_key,
            &p.org_admin,
            "an organisation admin",
        ),
        (
            "manager",
            &p.manager_key,
            &p.org_admin_member,
            "an organisation admin who is a member",
        ),
        ("manager", &p.manager_key, &p.ws_admin, "a workspace admin"),
        ("service key", &p.service_key, &owner, "the owner"),
        ("service key", &p.service_key, &p.org_admin, "an org admin"),
        (
            "service key",
            &p.service_key,
            &p.ws_admin,
            "a workspace admin",
        ),
        ("workspace admin", &p.ws_admin_key, &owner, "the owner"),
        (
            "workspace admin",
            &p.ws_admin_key,
            &p.org_admin_member,
            "an org admin who is a member",
        ),
    ];
    for (who, key, target, what) in refused {
        let (s, b) = app
            .call(
                "POST",
                "/v1/api-keys/workspace/user",
                Some(key),
                Some(user_key_body(&p.ws, target)),
            )
            .await;
        assert_eq!((s, code(&b)), (403, "AB03"), "{who} for {what}: {b}");
    }
    // A service key naming no user would make a key for the user who made the service key:
    // here the owner (the bootstrap admin key's user).
    let (s, b) = app
        .call(
            "POST",
            "/v1/api-keys/workspace/user",
            Some(&p.service_key),
            Some(json!({"name": "k", "workspace_id": p.ws, "scopes": ["configs.read"]})),
        )
        .await;
    assert_eq!((s, code(&b)), (403, "AB03"), "{b}");

    let allowed = [
        ("manager", &p.manager_key, &p.member, "a member"),
        (
            "manager",
            &p.manager_key,
            &p.other_manager,
            "another manager",
        ),
        ("manager", &p.manager_key, &p.manager, "itself"),
        ("service key", &p.service_key, &p.member, "a member"),
        ("service key", &p.service_key, &p.manager, "a manager"),
        ("workspace admin", &p.ws_admin_key, &p.manager, "a manager"),
        ("workspace admin", &p.ws_admin_key, &p.ws_admin, "itself"),
        ("organisation admin", &p.org_admin_key, &owner, "the owner"),
        (
            "organisation admin",
            &p.org_admin_key,
            &p.ws_admin,
            "a ws admin",
        ),
        ("admin key", &ADMIN_KEY.to_owned(), &owner, "the owner"),
        (
            "admin key",
            &ADMIN_KEY.to_owned(),
            &p.org_admin,
            "an org admin",
        ),
    ];
    for (who, key, target, what) in allowed {
        let (s, b) = app
            .call(
                "POST",
                "/v1/api-keys/workspace/user",
                Some(key),
                Some(user_key_body(&p.ws, target)),
            )
            .await;
        assert_eq!(s, 200, "{who} for {what}: {b}");
    }
    // Members still make none.
    let (s, _) = app
        .call(
            "POST",
            "/v1/api-keys/workspace/user",
            Some(&p.member_key),
            Some(user_key_body(&p.ws, &p.member)),
        )
        .await;
    assert_eq!(s, 403);
}

/// Rotating, updating and fetching the rotated value of a key act as its user: refused to a
/// manager for the keys of the owner, organisation admins and workspace admins.
async fn keys_above_the_caller_are_not_rotated_updated_or_read(db: TestDb) {
    let p = people(db).await;
    let app = &p.app;
    let ws = p.ws.clone();
    let due = json!({"next_rotation_at": "2001-01-01T00:00:00Z"});
    let mut targets = Vec::new();
    for user in [
        app.owner.clone(),
        p.org_admin.clone(),
        p.org_admin_member.clone(),
        p.ws_admin.clone(),
        p.member.clone(),
    ] {
        let mut body = user_key_body(&ws, &user);
        body["rotation_policy"] = due.clone();
        let (id, _) = app
            .key(ADMIN_KEY, "/v1/api-keys/workspace/user", body)
            .await;
        targets.push((user, id));
    }
    // Every key is due: each gets a rotated value waiting to be fetched.
    assert_eq!(app.store.rotate_due_api_keys().await.unwrap(), 5);
    for (caller, key) in [("manager", &p.manager_key), ("service key", &p.service_key)] {
        for (user, id) in &targets[..4] {
            for (method, path, body) in [
                ("POST", format!("/v1/api-keys/{id}/rotate"), Some(json!({}))),
                ("GET", format!("/v1/api-keys/{id}/rotated-key"), None),
                (
                    "PUT",
                    format!("/v1/api-keys/{id}"),
                    Some(json!({"name": "mine now"})),
                ),
            ] {
                let (s, b) = app.call(method, &path, Some(key), body).await;
                assert_eq!(
                    (s, code(&b)),
                    (403, "AB03"),
                    "{caller}: {method} {path} (the key of {user}): {b}"
                );
            }
        }
    }
    // A member's key: the manager fetches the waiting value, rotates and updates it.
    let (_, member_key_id) = &targets[4];
    for (method, path, body) in [
        (
            "GET",
            format!("/v1/api-keys/{member_key_id}/rotated-key"),
            None,
        ),
        (
            "POST",
            format!("/v1/api-keys/{member_key_id}/rotate"),
            Some(json!({})),
        ),
        (
            "PUT",
            format!("/v1/api-keys/{member_key_id}"),
            Some(json!({"name": "renamed"})),
        ),
    ] {
        let (s, b) = app.call(method, &path, Some(&p.manager_key), body).await;
        assert_eq!(s, 200, "{method} {path}: {b}");
    }
    // The organisation admin's user key and the admin key keep their rights.
    let (_, owner_key_id) = &targets[0];
    for key in [&p.org_admin_key, &ADMIN_KEY.to_owned()] {
        let (s, b) = app
            .call(
                "POST",
                &format!("/v1/api-keys/{owner_key_id}/rotate"),
                Some(key),
                Some(json!({})),
            )
            .await;
        assert_eq!(s, 200, "{b}");
    }
    // A workspace admin rotates a manager's key, not an organisation admin's.
    let (manager_key_id, _) = app.user_key(&ws, &p.other_manager, &["configs.read"]).await;
    let (s, b) = app
        .call(
            "POST",
            &format!("/v1/api-keys/{manager_key_id}/rotate"),
            Some(&p.ws_admin_key),
            Some(json!({})),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    let (_, org_admin_key_id) = &targets[1];
    let (s, b) = app
        .call(
            "POST",
            &format!("/v1/api-keys/{org_admin_key_id}/rotate"),
            Some(&p.ws_admin_key),
            Some(json!({})),
        )
        .await;
    assert_eq!((s, code(&b)), (403, "AB03"), "{b}");
}

/// A workspace integration whose key an organisation admin entered: a manager may not point
/// it at another host without sending the key again.
async fn a_host_change_needs_the_credentials_again(db: TestDb) {
    let p = people(db).await;
    let app = &p.app;
    let (s, made) = app
        .admin(
            "POST",
            "/v1/integrations",
            Some(
                json!({"name": "OpenAI", "ai_provider_id": "openai", "key": "sk-org-admin-secret-1",
                "workspace_id": p.ws, "create_default_provider": false}),
            ),
        )
        .await;
    assert_eq!(s, 200, "{made}");
    let path = format!("/v1/integrations/{}", made["slug"].as_str().unwrap());
    let (_, manager) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/workspace/service",
            json!({"name": "m", "workspace_id": p.ws, "scopes": ["workspace_integrations.update", "workspace_integrations.read"]}),
        )
        .await;
    let (_, manager_user_key) = app
        .user_key(
            &p.ws,
            &p.manager,
            &[
                "workspace_integrations.update",
                "workspace_integrations.read",
            ],
        )
        .await;
    let elsewhere = json!({"configurations": {"custom_host": "https://elsewhere.example/v1"}});
    for key in [&manager, &manager_user_key] {
        let (s, b) = app
            .call("PUT", &path, Some(key), Some(elsewhere.clone()))
            .await;
        assert_eq!((s, code(&b)), (400, "AB01"), "{b}");
        assert!(message(&b).starts_with("key: "), "{b}");
        assert!(message(&b).contains("custom_host"), "{b}");
    }
    let (_, got) = app.admin("GET", &path, None).await;
    assert!(
        got["configurations"].get("custom_host").is_none(),
        "unchanged: {got}"
    );
    // Other changes need no key; nor does removing the host (the key goes back to the
    // provider's own).
    let (s, b) = app
        .call(
            "PUT",
            &path,
            Some(&manager),
            Some(json!({"name": "renamed"})),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    // An Azure integration's resource names its host (`{resource}.openai.azure.com`, which any
    // Azure customer can own): moving it needs the key too.
    let (s, azure) = app
        .admin(
            "POST",
            "/v1/integrations",
            Some(json!({"name": "Azure", "ai_provider_id": "azure-openai",
                "key": "az-org-admin-secret-1", "workspace_id": p.ws,
                "create_default_provider": false,
                "configurations": {"azure_resource_name": "ours", "azure_deployment_id": "d"}})),
        )
        .await;
    assert_eq!(s, 200, "{azure}");
    let azure_path = format!("/v1/integrations/{}", azure["slug"].as_str().unwrap());
    let (s, b) = app
        .call(
            "PUT",
            &azure_path,
            Some(&manager),
            Some(json!({"configurations": {"azure_resource_name": "theirs"}})),
        )
        .await;
    assert_eq!((s, code(&b)), (400, "AB01"), "{b}");
    assert!(message(&b).starts_with("key: "), "{b}");
    // The mask the API shows is not the key: sent back, it is refused (never stored).
    let (_, shown) = app.admin("GET", &path, None).await;
    let mut with_mask = elsewhere.clone();
    with_mask["key"] = shown["masked_key"].clone();
    assert!(
        with_mask["key"].as_str().is_some_and(|m| m.contains('*')),
        "{shown}"
    );
    let (s, b) = app
        .call("PUT", &path, Some(&manager), Some(with_mask))
        .await;
    assert_eq!((s, code(&b)), (400, "AB01"), "{b}");
    assert!(message(&b).starts_with("key: is the masked value"), "{b}");
    // With the key: done.
    let mut with_key = elsewhere.clone();
    with_key["key"] = json!("sk-managers-own-key-2");
    let (s, b) = app.call("PUT", &path, Some(&manager), Some(with_key)).await;
    assert_eq!(s, 200, "{b}");
    let (_, got) = app.admin("GET", &path, None).await;
    assert_eq!(
        got["configurations"]["custom_host"],
        "https://elsewhere.example/v1"
    );
    // The same host again is no change.
    let (s, b) = app
        .call("PUT", &path, Some(&manager), Some(elsewhere.clone()))
        .await;
    assert_eq!(s, 200, "{b}");
    let (s, b) = app
        .call(
            "PUT",
            &path,
            Some(&manager),
            Some(json!({"configurations": {"custom_host": null}})),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    // The admin key changes the host alone.
    let (s, b) = app.admin("PUT", &path, Some(elsewhere.clone())).await;
    assert_eq!(s, 200, "{b}");
    // Its provider cannot be changed at all.
    let (s, b) = app
        .admin("PUT", &path, Some(json!({"ai_provider_id": "anthropic"})))
        .await;
    assert_eq!((s, code(&b)), (400, "AB01"), "{b}");

    // AWS credentials are credentials too.
    let (s, made) = app
        .admin(
            "POST",
            "/v1/integrations",
            Some(json!({"name": "Bedrock", "ai_provider_id": "bedrock", "workspace_id": p.ws,
                "create_default_provider": false,
                "configurations": {"aws_access_key_id": "AKIAEXAMPLE", "aws_secret_access_key": "aws/secret+1234",
                    "aws_region": "us-east-1"}})),
        )
        .await;
    assert_eq!(s, 200, "{made}");
    let path = format!("/v1/integrations/{}", made["slug"].as_str().unwrap());
    let (s, b) = app
        .call("PUT", &path, Some(&manager), Some(elsewhere.clone()))
        .await;
    assert_eq!((s, code(&b)), (400, "AB01"), "{b}");
    assert!(
        message(&b).starts_with("configurations.aws_secret_access_key: "),
        "{b}"
    );
    let (s, b) = app
        .call(
            "PUT",
            &path,
            Some(&manager),
            Some(
                json!({"configurations": {"custom_host": "https://elsewhere.example/v1",
                "aws_secret_access_key": "aws/managers+own"}}),
            ),
        )
        .await;
    assert_eq!(s, 200, "{b}");
}

crate::on_both_databases!(
    user_keys_are_made_only_for_members_at_or_below_the_caller,
    keys_above_the_caller_are_not_rotated_updated_or_read,
    a_host_change_needs_the_credentials_again,
);
