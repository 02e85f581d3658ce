//! `/v1/admin/workspaces`: every endpoint's success and error statuses, by id and by slug,
//! delete with and without `force_delete`, concurrent creation of one slug.

use serde_json::{json, Value};

use crate::common::{App, TestDb, ADMIN_KEY, WS_SCOPES};

fn code(body: &Value) -> &str {
    body["data"]["errorCode"].as_str().unwrap_or_default()
}

async fn create_get_list_update(db: TestDb) {
    let app = App::start(db).await;
    let body = json!({
        "name": "Team A",
        "description": "the first team",
        "defaults": {"metadata": {"team": "a"}, "input_guardrails": ["pii"]},
        "usage_limits": [{"credit_limit": 100, "type": "tokens", "periodic_reset_days": 30}],
        "rate_limits": [{"type": "requests", "unit": "rpm", "value": 60}],
        "users": [{"id": app.owner, "role": "manager"}],
    });
    let (status, ws) = app.admin("POST", "/v1/admin/workspaces", Some(body)).await;
    assert_eq!(status, 200, "{ws}");
    let id = ws["id"].as_str().unwrap().to_owned();
    let slug = ws["slug"].as_str().unwrap().to_owned();
    assert!(slug.starts_with("ws-team-a-"), "{ws}");
    assert_eq!(ws["name"], "Team A");
    assert_eq!(ws["defaults"]["metadata"]["team"], "a");
    assert_eq!(ws["usage_limits"][0]["periodic_reset_days"], 30);
    assert_eq!(ws["usage_limits"][0]["current_usage"], 0.0);
    assert_eq!(ws["rate_limits"][0]["value"], 60);

    for key in [&id, &slug] {
        let (status, got) = app
            .admin("GET", &format!("/v1/admin/workspaces/{key}"), None)
            .await;
        assert_eq!(status, 200, "{got}");
        assert_eq!(got["id"], id.as_str());
        assert_eq!(got["users"][0]["id"], app.owner.as_str());
        assert_eq!(got["users"][0]["role"], "manager");
        assert_eq!(got["users"][0]["org_role"], "owner");
    }
    let (status, got) = app
        .admin("GET", "/v1/admin/workspaces/no-such-slug", None)
        .await;
    assert_eq!((status, code(&got)), (404, "AB08"), "{got}");

    // A chosen slug; a taken one is a conflict.
    let (status, got) = app
        .admin(
            "POST",
            "/v1/admin/workspaces",
            Some(json!({"name": "Team B", "slug": "team-b"})),
        )
        .await;
    assert_eq!(status, 200, "{got}");
    let (status, got) = app
        .admin(
            "POST",
            "/v1/admin/workspaces",
            Some(json!({"name": "Other", "slug": "team-b"})),
        )
        .await;
    assert_eq!((status, code(&got)), (409, "AB07"), "{got}");

    let (status, list) = app.admin("GET", "/v1/admin/workspaces", None).await;
    assert_eq!(status, 200);
    assert_eq!(list["object"], "list");
    assert_eq!(list["total"], 3, "default, Team A, Team B: {list}");
    let (_, list) = app
        .admin("GET", "/v1/admin/workspaces?name=team", None)
        .await;
    assert_eq!(list["total"], 2, "{list}");
    let (_, list) = app
        .admin("GET", "/v1/admin/workspaces?exact_name=Team%20B", None)
        .await;
    assert_eq!(list["total"], 1, "{list}");
    let (_, list) = app
        .admin("GET", "/v1/admin/workspaces?name=%25", None)
        .await;
    assert_eq!(
        list["total"], 0,
        "a % is a character, not a wildcard: {list}"
    );
    let (_, list) = app
        .admin(
            "GET",
            "/v1/admin/workspaces?page_size=1&current_page=2",
            None,
        )
        .await;
    assert_eq!(list["data"].as_array().unwrap().len(), 1, "{list}");
    for bad in [
        "/v1/admin/workspaces?status=gone",
        "/v1/admin/workspaces?page_size=500",
        "/v1/admin/workspaces?current_page=-1",
    ] {
        let (status, got) = app.admin("GET", bad, None).await;
        assert_eq!((status, code(&got)), (400, "AB01"), "{bad}: {got}");
    }

    let path = format!("/v1/admin/workspaces/{slug}");
    let (status, got) = app
        .admin(
            "PUT",
            &path,
            Some(
                json!({"name": "Team A2", "description": null, "rate_limits": [],
                "defaults": {"output_guardrails": ["tone"]}}),
            ),
        )
        .await;
    assert_eq!((status, &got), (200, &json!({})));
    let (_, got) = app.admin("GET", &path, None).await;
    assert_eq!(got["name"], "Team A2");
    assert_eq!(got["description"], Value::Null);
    assert_eq!(got["rate_limits"], json!([]));
    assert_eq!(got["defaults"], json!({"output_guardrails": ["tone"]}));
    assert_eq!(got["usage_limits"][0]["credit_limit"], 100, "untouched");
}

async fn bad_input(db: TestDb) {
    let app = App::start(db).await;
    let before = app.audit_count().await;
    let cases = [
        (json!({}), 400, "AB01", "missing field `name`"),
        (json!({"name": " "}), 400, "AB01", "name: must not be empty"),
        (
            json!({"name": "a", "slug": "a b"}),
            400,
            "AB01",
            "slug: must be",
        ),
        (
            json!({"name": "a", "colour": 1}),
            400,
            "AB01",
            "colour: unknown field",
        ),
        (
            json!({"name": "a", "defaults": {"metadata": {"n": 1}}}),
            400,
            "AB01",
            "defaults.metadata.n: invalid type",
        ),
        (
            json!({"name": "a", "defaults": {"other": 1}}),
            400,
            "AB01",
            "defaults.other: unknown field",
        ),
        (
            json!({"name": "a", "usage_limits": [{"credit_limit": 5, "alert_threshold": 9}]}),
            400,
            "AB01",
            "usage_limits[0].alert_threshold",
        ),
        (
            json!({"name": "a", "usage_limits": [{"credit_limit": 5, "periodic_reset": "weekly", "periodic_reset_days": 7}]}),
            400,
            "AB01",
            "cannot be set together with periodic_reset",
        ),
        (
            json!({"name": "a", "rate_limits": [{"type": "requests", "unit": "rpm"}]}),
            400,
            "AB01",
            "rate_limits[0]: missing field `value`",
        ),
        (
            json!({"name": "a", "users": [{"id": "x", "role": "member"}]}),
            400,
            "AB01",
            "users[0].id: must be a UUID",
        ),
        (
            json!({"name": "a", "users": [{"id": "7d1f0b1e-8a4c-4f3e-9b1a-2c3d4e5f6a7b", "role": "member"}]}),
            404,
            "AB02",
            "users[0].id: no user",
        ),
        (
            json!({"name": "a", "users": [{"id": "7d1f0b1e-8a4c-4f3e-9b1a-2c3d4e5f6a7b", "role": "owner"}]}),
            400,
            "AB01",
            "users[0].role: unknown variant `owner`",
        ),
    ];
    for (body, status, want_code, msg) in cases {
        let (got, resp) = app
            .admin("POST", "/v1/admin/workspaces", Some(body.clone()))
            .await;
        assert_eq!((got, code(&resp)), (status, want_code), "{body}: {resp}");
        let text = resp["data"]["message"].as_str().unwrap();
        assert!(text.contains(msg), "want {msg:?} in {resp}");
    }
    let (status, resp) = app
        .admin(
            "PUT",
            "/v1/admin/workspaces/default",
            Some(json!({"slug": "x"})),
        )
        .await;
    assert_eq!((status, code(&resp)), (400, "AB01"), "{resp}");
    let (status, resp) = app
        .admin(
            "PUT",
            "/v1/admin/workspaces/nowhere",
            Some(json!({"name": "x"})),
        )
        .await;
    assert_eq!((status, code(&resp)), (404, "AB08"), "{resp}");
    // No failed write was recorded, and none left a workspace behind.
    assert_eq!(app.audit_count().await, before);
    let (_, list) = app.admin("GET", "/v1/admin/workspaces", None).await;
    assert_eq!(list["total"], 1);
    // Wrong method on a known path; unknown path.
    let (status, resp) = app.admin("PATCH", "/v1/admin/workspaces", None).await;
    assert_eq!(status, 405, "{resp}");
    let (status, resp) = app.admin("GET", "/v1/admin/nothing-here", None).await;
    assert_eq!((status, code(&resp)), (404, "AB08"), "{resp}");
}

async fn delete_with_and_without_force(db: TestDb) {
    let app = App::start(db).await;
    let ws = app.workspace("Doomed").await;
    let (_, raw) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/workspace/service",
            json!({"name": "k", "workspace_id": ws, "scopes": WS_SCOPES}),
        )
        .await;
    let path = format!("/v1/admin/workspaces/{ws}");
    let (status, resp) = app.admin("DELETE", &path, None).await;
    assert_eq!((status, code(&resp)), (409, "AB07"), "{resp}");
    assert!(resp["data"]["message"]
        .as_str()
        .unwrap()
        .contains("force_delete"));
    let (status, resp) = app
        .admin("DELETE", &path, Some(json!({"force_delete": "yes"})))
        .await;
    assert_eq!((status, code(&resp)), (400, "AB01"), "{resp}");
    let (status, _) = app.call("GET", "/v1/api-keys", Some(&raw), None).await;
    assert_eq!(status, 200, "the refused delete changed nothing");

    let (status, resp) = app
        .admin("DELETE", &path, Some(json!({"force_delete": true})))
        .await;
    assert_eq!((status, &resp), (200, &json!({})));
    let (status, _) = app.admin("GET", &path, None).await;
    assert_eq!(status, 404);
    let (status, _) = app.call("GET", "/v1/api-keys", Some(&raw), None).await;
    assert_eq!(status, 401, "its keys went with it");
    let (status, _) = app.admin("DELETE", &path, None).await;
    assert_eq!(status, 404);

    // An empty workspace needs no force.
    let empty = app.workspace("Empty").await;
    let (status, _) = app
        .admin("DELETE", &format!("/v1/admin/workspaces/{empty}"), None)
        .await;
    assert_eq!(status, 200);
}

async fn concurrent_creation_of_one_slug(db: TestDb) {
    let app = std::sync::Arc::new(App::start(db).await);
    let tasks = (0..8).map(|_| {
        let app = app.clone();
        tokio::spawn(async move {
            app.admin(
                "POST",
                "/v1/admin/workspaces",
                Some(json!({"name": "Same", "slug": "same"})),
            )
            .await
        })
    });
    let mut statuses: Vec<u16> = futures_util::future::join_all(tasks)
        .await
        .into_iter()
        .map(|r| r.unwrap().0)
        .collect();
    statuses.sort();
    assert_eq!(statuses, [200, 409, 409, 409, 409, 409, 409, 409]);
    let (_, list) = app
        .admin("GET", "/v1/admin/workspaces?exact_name=Same", None)
        .await;
    assert_eq!(list["total"], 1);
}

crate::on_both_databases!(
    create_get_list_update,
    bad_input,
    delete_with_and_without_force,
    concurrent_creation_of_one_slug,
);
