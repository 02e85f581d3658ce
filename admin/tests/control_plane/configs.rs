//! `/v1/configs`: every endpoint's success and error statuses, versions, the default flag, the
//! data plane's view, the validator hook, concurrent updates, and who may do what.

use admin::authz::{OrgRole, WorkspaceRole};
use admin::store::DataPlaneOptions;
use admin::ConfigCheck;
use plugin_sdk::store::ConfigStore;
use serde_json::{json, Value};

use crate::common::{App, TestDb, ADMIN_KEY};
use crate::integrations::app_with_key;

fn code(body: &Value) -> &str {
    body["data"]["errorCode"].as_str().unwrap_or_default()
}

fn message(body: &Value) -> &str {
    body["data"]["message"].as_str().unwrap_or_default()
}

const FALLBACK: &str =
    r#"{"strategy": {"mode": "fallback"}, "targets": [{"provider": "@a"}, {"provider": "@b"}]}"#;

/// Creates a config with the admin key; returns the answer.
async fn create(app: &App, body: Value) -> Value {
    let (status, got) = app.admin("POST", "/v1/configs", Some(body)).await;
    assert_eq!(status, 200, "{got}");
    got
}

async fn create_get_list_update_versions_delete(db: TestDb) {
    let app = app_with_key(db).await;
    let config: Value = serde_json::from_str(FALLBACK).unwrap();
    let before = app.audit_count().await;
    let made = create(
        &app,
        json!({"name": "Fallback config", "config": config, "isDefault": true}),
    )
    .await;
    let slug = made["slug"].as_str().unwrap().to_owned();
    let id = made["id"].as_str().unwrap().to_owned();
    let first_version = made["version_id"].as_str().unwrap().to_owned();
    assert!(slug.starts_with("pc-fallb-"), "{made}");
    assert_eq!(slug.len(), "pc-xxxxx-xxxxxx".len(), "{made}");
    assert_eq!(app.audit_count().await, before + 1);

    // By slug and by id; the admin key's config went to the default workspace.
    for key in [&slug, &id] {
        let (status, got) = app.admin("GET", &format!("/v1/configs/{key}"), None).await;
        assert_eq!(status, 200, "{got}");
        assert_eq!(got["id"], id.as_str());
        assert_eq!(got["slug"], slug.as_str());
        assert_eq!(got["name"], "Fallback config");
        assert_eq!(got["config"], config);
        assert_eq!(got["is_default"], true);
        assert_eq!(got["version"], 1);
        assert_eq!(got["version_id"], first_version.as_str());
        assert_eq!(got["workspace_id"], app.default_ws.as_str());
        assert_eq!(got["object"], "config");
    }
    // The data plane serves it by slug and by id at once.
    let published = app.store.published();
    assert_eq!(*published.config(&slug).unwrap(), config);
    assert_eq!(*published.config(&id).unwrap(), config);

    // A second default config in the workspace takes the flag; one elsewhere does not.
    let ws = app.workspace("Team").await;
    let second = create(
        &app,
        json!({"name": "Second", "config": {"provider": "openai"}, "isDefault": 1}),
    )
    .await;
    let other = create(
        &app,
        json!({"name": "Elsewhere", "config": {"provider": "openai"}, "is_default": true, "workspace_id": ws}),
    )
    .await;
    let (_, got) = app.admin("GET", &format!("/v1/configs/{slug}"), None).await;
    assert_eq!(got["is_default"], false, "{got}");
    let (_, got) = app
        .admin(
            "GET",
            &format!("/v1/configs/{}", other["slug"].as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(got["is_default"], true, "{got}");
    assert_eq!(got["workspace_id"], ws.as_str());

    // Lists: all, by workspace (id or slug), paged.
    let (status, list) = app.admin("GET", "/v1/configs", None).await;
    assert_eq!(status, 200);
    assert_eq!(list["object"], "list");
    assert_eq!(list["total"], 3, "{list}");
    assert_eq!(list["data"][0]["slug"], other["slug"], "newest first");
    let (_, list) = app
        .admin("GET", &format!("/v1/configs?workspace_id={ws}"), None)
        .await;
    assert_eq!(list["total"], 1, "{list}");
    let (_, list) = app
        .admin(
            "GET",
            "/v1/configs?workspace_id=default&page_size=1&current_page=1",
            None,
        )
        .await;
    assert_eq!(list["total"], 2, "{list}");
    assert_eq!(list["data"].as_array().unwrap().len(), 1);
    assert_eq!(list["data"][0]["slug"], slug.as_str());

    // Every update is a version: the name, then the body, then the flag.
    let path = format!("/v1/configs/{slug}");
    let (status, got) = app
        .admin("PUT", &path, Some(json!({"name": "Renamed"})))
        .await;
    assert_eq!((status, &got), (200, &json!({})));
    let new_config = json!({"provider": "@a", "override_params": {"model": "m"}});
    let (status, _) = app
        .admin("PUT", &path, Some(json!({"config": new_config})))
        .await;
    assert_eq!(status, 200);
    let (status, _) = app
        .admin("PUT", &path, Some(json!({"isDefault": true})))
        .await;
    assert_eq!(status, 200);
    let (_, got) = app.admin("GET", &path, None).await;
    assert_eq!(got["name"], "Renamed");
    assert_eq!(got["config"], new_config);
    assert_eq!(got["version"], 4);
    assert_eq!(got["is_default"], true);
    let (_, second_now) = app
        .admin(
            "GET",
            &format!("/v1/configs/{}", second["slug"].as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(second_now["is_default"], false);
    assert_eq!(
        *published.config(&slug).unwrap(),
        new_config,
        "the data plane has the new body"
    );

    let (status, versions) = app.admin("GET", &format!("{path}/versions"), None).await;
    assert_eq!(status, 200, "{versions}");
    assert_eq!(versions["total"], 4);
    let v: Vec<i64> = versions["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["version"].as_i64().unwrap())
        .collect();
    assert_eq!(v, [4, 3, 2, 1]);
    assert_eq!(versions["data"][0]["is_current"], true);
    assert_eq!(versions["data"][0]["id"], got["version_id"]);
    assert_eq!(versions["data"][1]["config"], new_config);
    assert_eq!(versions["data"][2]["name"], "Renamed");
    assert_eq!(
        versions["data"][2]["config"], config,
        "a rename keeps the body"
    );
    assert_eq!(versions["data"][3]["id"], first_version.as_str());
    assert_eq!(versions["data"][3]["name"], "Fallback config");
    assert_eq!(versions["data"][3]["is_current"], false);
    let (_, page) = app
        .admin(
            "GET",
            &format!("{path}/versions?page_size=1&current_page=3"),
            None,
        )
        .await;
    assert_eq!(page["data"][0]["version"], 1, "{page}");

    // Audit: one record per write.
    let (_, log) = app
        .admin(
            "GET",
            "/v1/audit-logs?start_time=2000-01-01T00:00:00Z&end_time=2999-01-01T00:00:00Z&resource_type=config",
            None,
        )
        .await;
    assert_eq!(log["total"], 6, "3 creates and 3 updates: {log}");

    let (status, got) = app.admin("DELETE", &path, None).await;
    assert_eq!((status, &got), (200, &json!({})));
    let (status, got) = app.admin("GET", &path, None).await;
    assert_eq!((status, code(&got)), (404, "AB08"), "{got}");
    let (status, got) = app.admin("GET", &format!("{path}/versions"), None).await;
    assert_eq!((status, code(&got)), (404, "AB08"), "{got}");
    assert!(
        published.config(&slug).is_none(),
        "gone from the data plane"
    );
    assert!(published.config(&id).is_none());
}

async fn bad_input(db: TestDb) {
    let app = app_with_key(db).await;
    let made = create(&app, json!({"name": "c", "config": {"provider": "openai"}})).await;
    let slug = made["slug"].as_str().unwrap();
    let before = app.audit_count().await;
    let cases = [
        (
            "POST",
            "/v1/configs".to_owned(),
            json!({"config": {}}),
            400,
            "AB01",
            "missing field `name`",
        ),
        (
            "POST",
            "/v1/configs".to_owned(),
            json!({"name": "n"}),
            400,
            "AB01",
            "missing field `config`",
        ),
        (
            "POST",
            "/v1/configs".to_owned(),
            json!({"name": "", "config": {}}),
            400,
            "AB01",
            "name: must not be empty",
        ),
        (
            "POST",
            "/v1/configs".to_owned(),
            json!({"name": "x".repeat(256), "config": {}}),
            400,
            "AB01",
            "name: must be at most 255",
        ),
        (
            "POST",
            "/v1/configs".to_owned(),
            json!({"name": "n", "config": [1]}),
            400,
            "AB01",
            "config: must be a JSON object",
        ),
        (
            "POST",
            "/v1/configs".to_owned(),
            json!({"name": "n", "config": "{}"}),
            400,
            "AB01",
            "config: must be a JSON object",
        ),
        (
            "POST",
            "/v1/configs".to_owned(),
            json!({"name": "n", "config": {}, "isDefault": 2}),
            400,
            "AB01",
            "isDefault",
        ),
        (
            "POST",
            "/v1/configs".to_owned(),
            json!({"name": "n", "config": {}, "colour": 1}),
            400,
            "AB01",
            "colour: unknown field",
        ),
        (
            "POST",
            "/v1/configs".to_owned(),
            json!({"name": "n", "config": {}, "workspace_id": "nowhere"}),
            404,
            "AB02",
            "workspace_id: no workspace \"nowhere\"",
        ),
        (
            "PUT",
            format!("/v1/configs/{slug}"),
            json!({}),
            400,
            "AB01",
            "nothing to update",
        ),
        (
            "PUT",
            format!("/v1/configs/{slug}"),
            json!({"config": 5}),
            400,
            "AB01",
            "config: must be a JSON object",
        ),
        (
            "PUT",
            format!("/v1/configs/{slug}"),
            json!({"slug": "x"}),
            400,
            "AB01",
            "slug: unknown field",
        ),
        (
            "PUT",
            "/v1/configs/pc-nope-000000".to_owned(),
            json!({"name": "n"}),
            404,
            "AB08",
            "no config",
        ),
        (
            "DELETE",
            "/v1/configs/pc-nope-000000".to_owned(),
            json!({}),
            404,
            "AB08",
            "no config",
        ),
        (
            "GET",
            "/v1/configs/pc-nope-000000".to_owned(),
            json!(null),
            404,
            "AB08",
            "no config",
        ),
        (
            "GET",
            "/v1/configs/pc-nope-000000/versions".to_owned(),
            json!(null),
            404,
            "AB08",
            "no config",
        ),
        (
            "GET",
            "/v1/configs?page_size=101".to_owned(),
            json!(null),
            400,
            "AB01",
            "page_size",
        ),
        (
            "GET",
            "/v1/configs?current_page=-1".to_owned(),
            json!(null),
            400,
            "AB01",
            "current_page",
        ),
        (
            "GET",
            "/v1/configs?colour=red".to_owned(),
            json!(null),
            400,
            "AB01",
            "unknown field",
        ),
        (
            "GET",
            "/v1/configs?workspace_id=nowhere".to_owned(),
            json!(null),
            404,
            "AB02",
            "no workspace",
        ),
        (
            "GET",
            format!("/v1/configs/{slug}/versions?page_size=x"),
            json!(null),
            400,
            "AB01",
            "page_size",
        ),
    ];
    for (method, path, body, status, want_code, want) in cases {
        let body = (!body.is_null()).then_some(body);
        let (got, resp) = app.admin(method, &path, body.clone()).await;
        assert_eq!(
            (got, code(&resp)),
            (status, want_code),
            "{method} {path} {body:?}: {resp}"
        );
        assert!(message(&resp).contains(want), "want {want:?}: {resp}");
    }
    let (status, resp) = app
        .call(
            "POST",
            "/v1/configs",
            None,
            Some(json!({"name": "n", "config": {}})),
        )
        .await;
    assert_eq!((status, code(&resp)), (401, "AB05"));
    let (status, resp) = app
        .call("GET", "/v1/configs", Some("not-a-key-at-all"), None)
        .await;
    assert_eq!((status, code(&resp)), (401, "AB05"));
    let (status, _) = app.admin("PATCH", "/v1/configs", None).await;
    assert_eq!(status, 405);
    assert_eq!(
        app.audit_count().await,
        before,
        "nothing failed was recorded"
    );
    let (_, list) = app.admin("GET", "/v1/configs", None).await;
    assert_eq!(list["total"], 1);
}

/// The gateway hands the control plane its routing-config validator: a config it refuses is a
/// 400 naming the problem, on create and update.
async fn the_validator_decides(db: TestDb) {
    let mut app = app_with_key(db).await;
    let check = ConfigCheck::new(|v: &Value| match v.get("targets") {
        Some(t) if !t.is_array() => Err("targets must be an array".to_owned()),
        _ => Ok(()),
    });
    app.store = app
        .store
        .clone()
        .with_data_plane(DataPlaneOptions {
            secret_key: None,
            config_check: Some(check),
            guardrail_check: None,
        })
        .await
        .expect("same key, a check");
    app.router = admin::router(app.store.clone());
    let (status, got) = app
        .admin(
            "POST",
            "/v1/configs",
            Some(json!({"name": "n", "config": {"targets": 1}})),
        )
        .await;
    assert_eq!((status, code(&got)), (400, "AB01"), "{got}");
    assert_eq!(message(&got), "config: targets must be an array");
    let made = create(&app, json!({"name": "n", "config": {"targets": []}})).await;
    let (status, got) = app
        .admin(
            "PUT",
            &format!("/v1/configs/{}", made["slug"].as_str().unwrap()),
            Some(json!({"config": {"targets": "x"}})),
        )
        .await;
    assert_eq!((status, code(&got)), (400, "AB01"), "{got}");
}

/// Concurrent updates of one config each make their own version.
async fn concurrent_updates(db: TestDb) {
    let app = std::sync::Arc::new(app_with_key(db).await);
    let made = create(&app, json!({"name": "c", "config": {"provider": "openai"}})).await;
    let path = format!("/v1/configs/{}", made["slug"].as_str().unwrap());
    let tasks = (0..6).map(|i| {
        let app = app.clone();
        let path = path.clone();
        tokio::spawn(async move {
            app.admin("PUT", &path, Some(json!({"name": format!("v{i}")})))
                .await
                .0
        })
    });
    for status in futures_util::future::join_all(tasks).await {
        assert_eq!(status.unwrap(), 200);
    }
    let (_, versions) = app.admin("GET", &format!("{path}/versions"), None).await;
    let mut v: Vec<i64> = versions["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["version"].as_i64().unwrap())
        .collect();
    v.sort();
    assert_eq!(v, [1, 2, 3, 4, 5, 6, 7]);
    let (_, got) = app.admin("GET", &path, None).await;
    assert_eq!(got["version"], 7);
}

/// The admin key everywhere; a workspace key (admin or manager role) in its workspace only; a
/// workspace member reads but does not write; scopes narrow each.
async fn authorisation(db: TestDb) {
    let app = app_with_key(db).await;
    let ws = app.workspace("Team").await;
    let other = app.workspace("Other").await;
    let all = [
        "configs.create",
        "configs.read",
        "configs.update",
        "configs.delete",
        "configs.list",
    ];
    let (_, manager) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/workspace/service",
            json!({"name": "svc", "workspace_id": ws, "scopes": all}),
        )
        .await;
    let member_user = app
        .user(
            "m@example.com",
            OrgRole::Member,
            Some((&ws, WorkspaceRole::Member)),
        )
        .await;
    let (_, member) = app.user_key(&ws, &member_user, &all).await;
    let (_, read_only) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/workspace/service",
            json!({"name": "ro", "workspace_id": ws, "scopes": ["configs.read"]}),
        )
        .await;

    // The manager: its workspace by default, not another.
    let body = json!({"name": "mine", "config": {"provider": "openai"}});
    let (status, mine) = app
        .call("POST", "/v1/configs", Some(&manager), Some(body.clone()))
        .await;
    assert_eq!(status, 200, "{mine}");
    let mine_path = format!("/v1/configs/{}", mine["slug"].as_str().unwrap());
    let (_, got) = app.admin("GET", &mine_path, None).await;
    assert_eq!(got["workspace_id"], ws.as_str());
    let mut elsewhere = body.clone();
    elsewhere["workspace_id"] = json!(other);
    let (status, got) = app
        .call("POST", "/v1/configs", Some(&manager), Some(elsewhere))
        .await;
    assert_eq!((status, code(&got)), (403, "AB03"), "{got}");
    let theirs = create(
        &app,
        json!({"name": "theirs", "config": {}, "workspace_id": other}),
    )
    .await;
    let theirs_path = format!("/v1/configs/{}", theirs["slug"].as_str().unwrap());
    for (method, body) in [
        ("GET", None),
        ("PUT", Some(json!({"name": "x"}))),
        ("DELETE", None),
    ] {
        let (status, got) = app.call(method, &theirs_path, Some(&manager), body).await;
        assert_eq!((status, code(&got)), (403, "AB03"), "{method}: {got}");
    }
    let (status, list) = app.call("GET", "/v1/configs", Some(&manager), None).await;
    assert_eq!(
        (status, &list["total"]),
        (200, &json!(1)),
        "its workspace only: {list}"
    );
    let (status, _) = app
        .call(
            "GET",
            &format!("/v1/configs?workspace_id={other}"),
            Some(&manager),
            None,
        )
        .await;
    assert_eq!(status, 403);
    let (status, _) = app
        .call(
            "PUT",
            &mine_path,
            Some(&manager),
            Some(json!({"name": "renamed"})),
        )
        .await;
    assert_eq!(status, 200);

    // The member reads and lists; writes are refused.
    let (status, _) = app.call("GET", &mine_path, Some(&member), None).await;
    assert_eq!(status, 200);
    let (status, list) = app.call("GET", "/v1/configs", Some(&member), None).await;
    assert_eq!((status, &list["total"]), (200, &json!(1)));
    let (status, got) = app
        .call("POST", "/v1/configs", Some(&member), Some(body.clone()))
        .await;
    assert_eq!((status, code(&got)), (403, "AB03"), "{got}");
    assert!(
        message(&got).contains("workspace members read configs"),
        "{got}"
    );
    for (method, body) in [("PUT", Some(json!({"name": "x"}))), ("DELETE", None)] {
        let (status, got) = app.call(method, &mine_path, Some(&member), body).await;
        assert_eq!((status, code(&got)), (403, "AB03"), "{method}: {got}");
    }

    // Scopes: configs.read reads only.
    let (status, _) = app.call("GET", &mine_path, Some(&read_only), None).await;
    assert_eq!(status, 200);
    let (status, got) = app.call("GET", "/v1/configs", Some(&read_only), None).await;
    assert_eq!((status, code(&got)), (403, "AB03"), "{got}");
    assert!(message(&got).contains("configs.list"), "{got}");
    let (status, _) = app
        .call(
            "GET",
            &format!("{mine_path}/versions"),
            Some(&read_only),
            None,
        )
        .await;
    assert_eq!(status, 200);
    let (status, _) = app
        .call("POST", "/v1/configs", Some(&read_only), Some(body.clone()))
        .await;
    assert_eq!(status, 403);

    // The admin key reaches every workspace.
    let (status, _) = app.admin("DELETE", &mine_path, None).await;
    assert_eq!(status, 200);
    let (status, _) = app.admin("DELETE", &theirs_path, None).await;
    assert_eq!(status, 200);
}

crate::on_both_databases!(
    create_get_list_update_versions_delete,
    bad_input,
    the_validator_decides,
    concurrent_updates,
    authorisation,
);
