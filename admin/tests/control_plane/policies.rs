//! `/v1/policies/rate-limits` and `/v1/policies/usage-limits`: every endpoint's success and
//! error statuses, list filters and paging, archiving, entities and their reset, reactivation
//! on a raised credit limit, who may do what, and concurrent updates.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::{json, Value};

use admin::authz::{OrgRole, WorkspaceRole};

use crate::common::{App, TestDb, ADMIN_KEY};

const RATE: &str = "/v1/policies/rate-limits";
const USAGE: &str = "/v1/policies/usage-limits";
const MISSING: &str = "7d1f0b1e-8a4c-4f3e-9b1a-2c3d4e5f6a7b";

const POLICY_SCOPES: &[&str] = &[
    "policies.create",
    "policies.read",
    "policies.update",
    "policies.delete",
    "policies.list",
];

fn code(body: &Value) -> &str {
    body["data"]["errorCode"].as_str().unwrap_or_default()
}

fn message(body: &Value) -> &str {
    body["data"]["message"].as_str().unwrap_or_default()
}

fn keys_of(v: &Value) -> BTreeSet<&str> {
    v.as_object()
        .unwrap_or_else(|| panic!("an object: {v}"))
        .keys()
        .map(String::as_str)
        .collect()
}

fn rate_body(ws: &str) -> Value {
    json!({
        "name": "100 requests a minute per user",
        "conditions": [{"key": "metadata._user", "value": "*", "excludes": ["admin"]}],
        "group_by": [{"key": "metadata._user"}],
        "type": "requests",
        "unit": "rpm",
        "value": 100,
        "workspace_id": ws,
    })
}

fn usage_body(ws: &str) -> Value {
    json!({
        "name": "monthly budget per user",
        "conditions": [{"key": "workspace_id", "value": ws}],
        "group_by": [{"key": "metadata._user"}],
        "type": "cost",
        "credit_limit": 100,
        "alert_threshold": 80,
        "periodic_reset": "monthly",
        "workspace_id": ws,
    })
}

/// Creates a policy with the admin key; returns its id.
async fn create(app: &App, path: &str, body: Value) -> String {
    let (status, resp) = app.admin("POST", path, Some(body)).await;
    assert_eq!(status, 200, "POST {path}: {resp}");
    resp["id"].as_str().expect("an id").to_owned()
}

async fn rate_limits_lifecycle(db: TestDb) {
    let app = App::start(db).await;
    let before = app.audit_count().await;
    let (status, created) = app.admin("POST", RATE, Some(rate_body("default"))).await;
    assert_eq!(status, 200, "{created}");
    assert_eq!(keys_of(&created), BTreeSet::from(["id", "object"]));
    assert_eq!(created["object"], "policy_rate_limits");
    let id = created["id"].as_str().unwrap().to_owned();
    let path = format!("{RATE}/{id}");

    // Exactly the spec's fields, with `object` on a single retrieval.
    let (status, got) = app.admin("GET", &path, None).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(
        keys_of(&got),
        BTreeSet::from([
            "id",
            "name",
            "conditions",
            "group_by",
            "type",
            "unit",
            "value",
            "status",
            "workspace_id",
            "organisation_id",
            "created_at",
            "last_updated_at",
            "object",
        ])
    );
    assert_eq!(got["object"], "policy_rate_limits");
    assert_eq!(got["type"], "requests");
    assert_eq!(got["unit"], "rpm");
    assert_eq!(got["value"], 100);
    assert_eq!(got["status"], "active");
    assert_eq!(
        got["workspace_id"],
        app.default_ws.as_str(),
        "the slug is stored as the id"
    );
    assert_eq!(got["organisation_id"], app.org.as_str());
    assert_eq!(
        got["conditions"],
        json!([{"key": "metadata._user", "value": "*", "excludes": ["admin"]}])
    );
    assert_eq!(got["group_by"], json!([{"key": "metadata._user"}]));
    assert_eq!(got["name"], "100 requests a minute per user");

    // Update: name, unit, value; each alone, and nothing at all.
    for body in [
        json!({"name": "renamed"}),
        json!({"unit": "rpd", "value": 5000}),
        json!({}),
    ] {
        let (status, resp) = app.admin("PUT", &path, Some(body.clone())).await;
        assert_eq!((status, &resp), (200, &json!({})), "{body}");
    }
    let (_, got) = app.admin("GET", &path, None).await;
    assert_eq!(
        (&got["name"], &got["unit"], &got["value"], &got["type"]),
        (
            &json!("renamed"),
            &json!("rpd"),
            &json!(5000),
            &json!("requests")
        )
    );
    assert!(got["last_updated_at"].as_str() > got["created_at"].as_str());

    // Archive: gone from the default (active) view, found with status=archived.
    let (status, resp) = app.admin("DELETE", &path, None).await;
    assert_eq!((status, &resp), (200, &json!({})));
    let (status, resp) = app.admin("GET", &path, None).await;
    assert_eq!((status, code(&resp)), (404, "AB08"), "{resp}");
    let (status, got) = app
        .admin("GET", &format!("{path}?status=archived"), None)
        .await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["status"], "archived");
    assert_eq!(got["name"], "renamed");
    let (status, resp) = app
        .admin("GET", &format!("{path}?status=active"), None)
        .await;
    assert_eq!(status, 404, "{resp}");
    // An archived policy is not updated, nor archived twice.
    let (status, resp) = app.admin("PUT", &path, Some(json!({"value": 1}))).await;
    assert_eq!((status, code(&resp)), (404, "AB08"), "{resp}");
    let (status, resp) = app.admin("DELETE", &path, None).await;
    assert_eq!((status, code(&resp)), (404, "AB08"), "{resp}");
    // create, 4 updates (the empty one too), archive.
    assert_eq!(app.audit_count().await, before + 5);
    let (_, audit) = app
        .admin(
            "GET",
            "/v1/audit-logs?start_time=2000-01-01T00:00:00Z&end_time=2999-01-01T00:00:00Z&resource_type=rate_limits_policy",
            None,
        )
        .await;
    assert_eq!(audit["total"], 5, "{audit}");
    let actions: BTreeSet<&str> = audit["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, BTreeSet::from(["create", "update", "archive"]));
}

async fn rate_limits_list_filters_and_paging(db: TestDb) {
    let app = App::start(db).await;
    let ws_b = app.workspace("B").await;
    let slug_b = {
        let (_, ws) = app
            .admin("GET", &format!("/v1/admin/workspaces/{ws_b}"), None)
            .await;
        ws["slug"].as_str().unwrap().to_owned()
    };
    let mut ids = Vec::new();
    // default: requests/rpm x3, tokens/rph x1; B: tokens/rpm x2.
    for (ws, kind, unit) in [
        ("default", "requests", "rpm"),
        ("default", "requests", "rpm"),
        ("default", "requests", "rpm"),
        ("default", "tokens", "rph"),
        (ws_b.as_str(), "tokens", "rpm"),
        (ws_b.as_str(), "tokens", "rpm"),
    ] {
        let mut body = rate_body(ws);
        body["type"] = json!(kind);
        body["unit"] = json!(unit);
        ids.push(create(&app, RATE, body).await);
    }
    let (status, resp) = app
        .admin("DELETE", &format!("{RATE}/{}", ids[0]), None)
        .await;
    assert_eq!(status, 200, "{resp}");

    for (q, want) in [
        ("", 5),
        ("?status=active", 5),
        ("?status=archived", 1),
        ("?workspace_id=default", 3),
        ("?type=tokens", 3),
        ("?unit=rph", 1),
        ("?type=tokens&unit=rpm", 2),
        ("?type=requests&status=archived", 1),
    ] {
        let (status, list) = app.admin("GET", &format!("{RATE}{q}"), None).await;
        assert_eq!(status, 200, "{q}: {list}");
        assert_eq!(list["object"], "list", "{list}");
        assert_eq!(list["total"], want, "{q}: {list}");
    }
    let (_, by_id) = app
        .admin("GET", &format!("{RATE}?workspace_id={ws_b}"), None)
        .await;
    let (_, by_slug) = app
        .admin("GET", &format!("{RATE}?workspace_id={slug_b}"), None)
        .await;
    assert_eq!(by_id["total"], 2);
    assert_eq!(by_id, by_slug);

    // Items carry the policy fields without `object`.
    let (_, list) = app.admin("GET", RATE, None).await;
    for item in list["data"].as_array().unwrap() {
        assert!(item.get("object").is_none(), "{item}");
        assert_eq!(item["status"], "active");
        assert!(
            item["id"].is_string() && item["conditions"].is_array(),
            "{item}"
        );
    }
    // Paging: pages of 2 over 5, newest first, `total` on every page; an empty page of 0.
    let mut seen = Vec::new();
    for page in 0..3 {
        let (_, list) = app
            .admin(
                "GET",
                &format!("{RATE}?page_size=2&current_page={page}"),
                None,
            )
            .await;
        assert_eq!(list["total"], 5, "{list}");
        for item in list["data"].as_array().unwrap() {
            seen.push(item["id"].as_str().unwrap().to_owned());
        }
    }
    let want: Vec<String> = ids[1..].iter().rev().cloned().collect();
    assert_eq!(seen, want);
    let (_, list) = app.admin("GET", &format!("{RATE}?page_size=0"), None).await;
    assert_eq!(
        (
            list["total"].as_i64(),
            list["data"].as_array().unwrap().len()
        ),
        (Some(5), 0)
    );

    for bad in [
        "?status=gone",
        "?type=cost",
        "?unit=rps",
        "?page_size=-1",
        "?current_page=-1",
        "?page_size=101",
        "?colour=red",
    ] {
        let (status, resp) = app.admin("GET", &format!("{RATE}{bad}"), None).await;
        assert_eq!((status, code(&resp)), (400, "AB01"), "{bad}: {resp}");
    }
    let (status, resp) = app
        .admin("GET", &format!("{RATE}?workspace_id=nowhere"), None)
        .await;
    assert_eq!((status, code(&resp)), (404, "AB02"), "{resp}");
}

async fn rate_limits_bad_input(db: TestDb) {
    let app = App::start(db).await;
    let ws_b = app.workspace("B").await;
    let (key_b, _) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/workspace/service",
            json!({"name": "b", "workspace_id": ws_b, "scopes": []}),
        )
        .await;
    let before = app.audit_count().await;
    let with = |patch: Value| {
        let mut b = rate_body("default");
        for (k, v) in patch.as_object().unwrap() {
            if v.is_null() {
                b.as_object_mut().unwrap().remove(k);
            } else {
                b[k] = v.clone();
            }
        }
        b
    };
    let cases: Vec<(Value, u16, &str, &str)> = vec![
        (
            with(json!({"name": "x".repeat(256)})),
            400,
            "AB01",
            "name: must be at most 255 characters",
        ),
        (
            with(json!({"name": " "})),
            400,
            "AB01",
            "name: must not be empty",
        ),
        (
            with(json!({"conditions": null})),
            400,
            "AB01",
            "missing field `conditions`",
        ),
        (
            with(json!({"conditions": []})),
            400,
            "AB01",
            "conditions: must hold at least one item",
        ),
        (
            with(json!({"group_by": null})),
            400,
            "AB01",
            "missing field `group_by`",
        ),
        (
            with(json!({"group_by": []})),
            400,
            "AB01",
            "group_by: must hold at least one item",
        ),
        (
            with(json!({"type": null})),
            400,
            "AB01",
            "missing field `type`",
        ),
        (
            with(json!({"unit": null})),
            400,
            "AB01",
            "missing field `unit`",
        ),
        (
            with(json!({"value": null})),
            400,
            "AB01",
            "missing field `value`",
        ),
        (
            with(
                json!({"conditions": [{"key": "metadata.team", "value": "a"}, {"key": "colour", "value": "red"}]}),
            ),
            400,
            "AB01",
            "conditions[1].key: unknown key \"colour\"",
        ),
        (
            with(json!({"conditions": [{"key": "metadata.", "value": "a"}]})),
            400,
            "AB01",
            "conditions[0].key: a metadata key is metadata.<name>",
        ),
        (
            with(
                json!({"conditions": [{"key": "model", "value": "a"}, {"key": "model", "value": "b"}]}),
            ),
            400,
            "AB01",
            "conditions[1].key: \"model\" repeats",
        ),
        (
            with(json!({"conditions": [{"key": "model"}]})),
            400,
            "AB01",
            "conditions[0]: missing field `value`",
        ),
        (
            with(json!({"conditions": [{"key": "model", "value": ""}]})),
            400,
            "AB01",
            "conditions[0].value: must not be empty",
        ),
        (
            with(json!({"conditions": [{"key": "model", "value": ["a", "b"]}]})),
            400,
            "AB01",
            "conditions[0].value: invalid type",
        ),
        (
            with(json!({"conditions": [{"key": "model", "value": "a", "excludes": 3}]})),
            400,
            "AB01",
            "conditions[0].excludes: must be a string or a list of strings",
        ),
        (
            with(json!({"conditions": [{"key": "model", "value": "a", "match": "x"}]})),
            400,
            "AB01",
            "conditions[0].match: unknown field",
        ),
        (
            with(json!({"conditions": [{"key": "api_key", "value": "sk-123"}]})),
            400,
            "AB01",
            "conditions[0].value: must be an API key's id or *",
        ),
        (
            with(json!({"conditions": [{"key": "api_key", "value": MISSING}]})),
            404,
            "AB02",
            "conditions[0].value: no API key",
        ),
        (
            with(json!({"conditions": [{"key": "api_key", "value": key_b}]})),
            400,
            "AB01",
            "conditions[0].value: the API key belongs to another workspace",
        ),
        (
            with(json!({"conditions": [{"key": "workspace_id", "value": "nowhere"}]})),
            404,
            "AB02",
            "conditions[0].value: no workspace \"nowhere\"",
        ),
        (
            with(json!({"conditions": [{"key": "workspace_id", "value": ws_b}]})),
            400,
            "AB01",
            "conditions[0].value: a policy applies only in its own workspace",
        ),
        (
            with(json!({"group_by": [{"key": "team"}]})),
            400,
            "AB01",
            "group_by[0].key: unknown key \"team\"",
        ),
        (
            with(json!({"group_by": [{"key": "api_key"}, {"key": "api_key"}]})),
            400,
            "AB01",
            "group_by[1].key",
        ),
        (
            with(json!({"group_by": ["api_key"]})),
            400,
            "AB01",
            "group_by[0]: invalid type",
        ),
        (
            with(json!({"type": "cost"})),
            400,
            "AB01",
            "type: unknown variant `cost`",
        ),
        (
            with(json!({"unit": "rps"})),
            400,
            "AB01",
            "unit: unknown variant `rps`",
        ),
        (
            with(json!({"value": -1})),
            400,
            "AB01",
            "value: must be a whole number",
        ),
        (
            with(json!({"value": 1.5})),
            400,
            "AB01",
            "value: must be a whole number",
        ),
        (
            with(json!({"value": "100"})),
            400,
            "AB01",
            "value: invalid type",
        ),
        (
            with(json!({"status": "archived"})),
            400,
            "AB01",
            "status: unknown field",
        ),
        (
            with(json!({"workspace_id": null})),
            400,
            "AB01",
            "workspace_id: is required with an admin key",
        ),
        (
            with(json!({"workspace_id": "nowhere"})),
            404,
            "AB02",
            "workspace_id: no workspace \"nowhere\"",
        ),
    ];
    for (body, status, want_code, msg) in cases {
        let (got, resp) = app.admin("POST", RATE, Some(body.clone())).await;
        assert_eq!((got, code(&resp)), (status, want_code), "{body}: {resp}");
        assert!(message(&resp).contains(msg), "want {msg:?} in {resp}");
    }
    let (status, resp) = app.admin("POST", RATE, None).await;
    assert_eq!(
        (status, code(&resp)),
        (400, "AB01"),
        "an empty body: {resp}"
    );

    let id = create(&app, RATE, rate_body("default")).await;
    let path = format!("{RATE}/{id}");
    let after_create = app.audit_count().await;
    let updates: Vec<(Value, &str)> = vec![
        (json!({"status": "archived"}), "status: cannot be updated"),
        (json!({"status": "active"}), "status: cannot be updated"),
        (json!({"status": null}), "status: cannot be updated"),
        (
            json!({"name": "x".repeat(256)}),
            "name: must be at most 255 characters",
        ),
        (json!({"unit": "rps"}), "unit: unknown variant"),
        (json!({"value": -5}), "value: must be a whole number"),
        (json!({"type": "tokens"}), "type: unknown field"),
        (json!({"conditions": []}), "conditions: unknown field"),
        (json!({"workspace_id": ws_b}), "workspace_id: unknown field"),
    ];
    for (body, msg) in updates {
        let (status, resp) = app.admin("PUT", &path, Some(body.clone())).await;
        assert_eq!((status, code(&resp)), (400, "AB01"), "{body}: {resp}");
        assert!(message(&resp).contains(msg), "want {msg:?} in {resp}");
    }
    let (status, resp) = app
        .admin(
            "PUT",
            &path,
            Some(json!({"name": "ok", "status": "archived"})),
        )
        .await;
    assert_eq!(status, 400, "{resp}");
    let (_, got) = app.admin("GET", &path, None).await;
    assert_eq!(
        got["name"], "100 requests a minute per user",
        "no partial write"
    );

    // Ids: malformed 400, unknown 404 (AB08) on each endpoint of one policy.
    for (method, body) in [
        ("GET", None),
        ("PUT", Some(json!({"value": 1}))),
        ("DELETE", None),
    ] {
        let (status, resp) = app
            .admin(method, &format!("{RATE}/not-a-uuid"), body.clone())
            .await;
        assert_eq!((status, code(&resp)), (400, "AB01"), "{method}: {resp}");
        assert!(message(&resp).starts_with("id: must be a UUID"), "{resp}");
        let (status, resp) = app.admin(method, &format!("{RATE}/{MISSING}"), body).await;
        assert_eq!((status, code(&resp)), (404, "AB08"), "{method}: {resp}");
        assert!(message(&resp).contains("policy not found"), "{resp}");
    }
    let (status, resp) = app
        .admin("GET", &format!("{path}?status=deleted"), None)
        .await;
    assert_eq!((status, code(&resp)), (400, "AB01"), "{resp}");
    let (status, resp) = app
        .admin("DELETE", &path, Some(json!({"force": true})))
        .await;
    assert_eq!((status, code(&resp)), (400, "AB01"), "{resp}");
    let (status, _) = app
        .admin("GET", &format!("{RATE}/{MISSING}/entities"), None)
        .await;
    assert_eq!(status, 404);

    // 401: no key, an unknown key; nothing is revealed or written.
    for key in [None, Some("not-a-key")] {
        for (method, p, body) in [
            ("POST", RATE.to_owned(), Some(rate_body("default"))),
            ("GET", RATE.to_owned(), None),
            ("GET", path.clone(), None),
            ("PUT", path.clone(), Some(json!({"value": 1}))),
            ("DELETE", path.clone(), None),
            ("GET", format!("{path}/entities"), None),
        ] {
            let (status, resp) = app.call(method, &p, key, body).await;
            assert_eq!((status, code(&resp)), (401, "AB05"), "{method} {p}: {resp}");
        }
    }
    assert_eq!(app.audit_count().await, after_create);
    assert_eq!(after_create, before + 1, "only the one policy made");
    let (_, list) = app.admin("GET", RATE, None).await;
    assert_eq!(list["total"], 1);
}

async fn rate_limits_entities(db: TestDb) {
    let app = App::start(db).await;
    let (key_id, _) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/workspace/service",
            json!({"name": "ci key", "workspace_id": "default", "scopes": []}),
        )
        .await;
    let body = json!({
        "conditions": [
            {"key": "api_key", "value": key_id.to_uppercase()},
            {"key": "workspace_id", "value": "default"},
            {"key": "metadata._user", "value": "*", "excludes": "bot"},
            {"key": "model", "value": "@openai/gpt-4o*"},
        ],
        "group_by": [{"key": "api_key"}, {"key": "metadata._user"}],
        "type": "tokens",
        "unit": "rph",
        "value": 0,
        "workspace_id": app.default_ws,
    });
    let id = create(&app, RATE, body).await;
    let (_, got) = app.admin("GET", &format!("{RATE}/{id}"), None).await;
    assert_eq!(got["value"], 0, "0 lets nothing through");
    assert_eq!(got["name"], Value::Null);
    assert_eq!(
        got["conditions"][0]["value"],
        key_id.as_str(),
        "ids are stored lowercase"
    );
    assert_eq!(got["conditions"][1]["value"], app.default_ws.as_str());
    assert_eq!(got["conditions"][2]["excludes"], json!(["bot"]));

    let (status, list) = app
        .admin("GET", &format!("{RATE}/{id}/entities"), None)
        .await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["object"], "list");
    assert_eq!(list["total"], 4);
    let data = list["data"].as_array().unwrap();
    assert_eq!(data[0]["value_key"], format!("api_key:{key_id}"));
    assert_eq!(data[0]["type"], "api_key");
    assert_eq!(data[0]["id"], key_id.as_str());
    assert_eq!(data[0]["name"], "ci key");
    assert_eq!(data[1]["type"], "workspace");
    assert_eq!(data[1]["id"], app.default_ws.as_str());
    assert_eq!(data[1]["name"], "Default");
    assert_eq!(data[2]["value_key"], "metadata._user:*");
    assert_eq!(data[2]["type"], "metadata");
    assert_eq!(data[2]["id"], Value::Null);
    assert_eq!(data[2]["excludes"], json!(["bot"]));
    assert_eq!(data[3]["value_key"], "model:@openai/gpt-4o*");
    let (_, page) = app
        .admin(
            "GET",
            &format!("{RATE}/{id}/entities?page_size=1&current_page=3"),
            None,
        )
        .await;
    assert_eq!(page["total"], 4);
    assert_eq!(page["data"][0]["type"], "model", "{page}");

    // The entities of an archived policy can still be read.
    app.admin("DELETE", &format!("{RATE}/{id}"), None).await;
    let (status, list) = app
        .admin("GET", &format!("{RATE}/{id}/entities"), None)
        .await;
    assert_eq!((status, &list["total"]), (200, &json!(4)), "{list}");
    let (status, resp) = app
        .admin("GET", &format!("{RATE}/{id}/entities?status=active"), None)
        .await;
    assert_eq!((status, code(&resp)), (400, "AB01"), "{resp}");
}

async fn usage_limits_lifecycle(db: TestDb) {
    let app = App::start(db).await;
    let before = app.audit_count().await;
    let (status, created) = app.admin("POST", USAGE, Some(usage_body("default"))).await;
    assert_eq!(status, 200, "{created}");
    assert_eq!(keys_of(&created), BTreeSet::from(["id", "object"]));
    assert_eq!(created["object"], "policy_usage_limits");
    let id = created["id"].as_str().unwrap().to_owned();
    let path = format!("{USAGE}/{id}");

    let (status, got) = app.admin("GET", &path, None).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["object"], "policy_usage_limits");
    assert_eq!(got["type"], "cost");
    assert_eq!(got["credit_limit"], 100);
    assert_eq!(got["alert_threshold"], 80);
    assert_eq!(got["periodic_reset"], "monthly");
    assert_eq!(got["periodic_reset_days"], Value::Null);
    assert_eq!(got["next_usage_reset_at"], Value::Null);
    assert_eq!(got["status"], "active");
    assert_eq!(got["workspace_id"], app.default_ws.as_str());
    assert_eq!(got["organisation_id"], app.org.as_str());
    assert_eq!(
        got["conditions"],
        json!([{"key": "workspace_id", "value": app.default_ws}])
    );
    assert!(got.get("value_key_usage_map").is_none(), "{got}");

    // include_usage: what each entity has used.
    let store = &app.store;
    store
        .charge_usage_limits_policy(&id, "metadata._user:alice", 12.25)
        .await
        .unwrap();
    store
        .charge_usage_limits_policy(&id, "metadata._user:alice", 0.5)
        .await
        .unwrap();
    let bob = store
        .charge_usage_limits_policy(&id, "metadata._user:bob", 100.0)
        .await
        .unwrap();
    assert_eq!(bob.status, "exhausted", "usage at the limit exhausts");
    let (status, got) = app
        .admin("GET", &format!("{path}?include_usage=true"), None)
        .await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(
        got["value_key_usage_map"],
        json!({
            "metadata._user:alice": {"current_usage": 12.75, "status": "active"},
            "metadata._user:bob": {"current_usage": 100.0, "status": "exhausted"},
        })
    );
    let (_, got) = app
        .admin("GET", &format!("{path}?include_usage=false"), None)
        .await;
    assert!(got.get("value_key_usage_map").is_none(), "{got}");

    // Update every field; one reset schedule replaces the other.
    let next = "2099-03-01T00:00:00+02:00";
    let (status, resp) = app
        .admin(
            "PUT",
            &path,
            Some(json!({
                "name": "weekly budget",
                "credit_limit": 250.5,
                "alert_threshold": 200,
                "periodic_reset_days": 7,
                "next_usage_reset_at": next,
            })),
        )
        .await;
    assert_eq!((status, &resp), (200, &json!({})));
    let (_, got) = app.admin("GET", &path, None).await;
    assert_eq!(got["name"], "weekly budget");
    assert_eq!(got["credit_limit"], 250.5);
    assert_eq!(got["alert_threshold"], 200);
    assert_eq!(got["periodic_reset_days"], 7);
    assert_eq!(
        got["periodic_reset"],
        Value::Null,
        "replaced by periodic_reset_days"
    );
    assert_eq!(got["next_usage_reset_at"], "2099-02-28T22:00:00.000000Z");
    let (status, _) = app
        .admin(
            "PUT",
            &path,
            Some(json!({"periodic_reset": "weekly", "alert_threshold": null, "next_usage_reset_at": null})),
        )
        .await;
    assert_eq!(status, 200);
    let (_, got) = app.admin("GET", &path, None).await;
    assert_eq!(
        (
            &got["periodic_reset"],
            &got["periodic_reset_days"],
            &got["alert_threshold"],
            &got["next_usage_reset_at"]
        ),
        (&json!("weekly"), &Value::Null, &Value::Null, &Value::Null)
    );

    // A tokens policy, in another workspace.
    let ws_b = app.workspace("B").await;
    let tokens = create(
        &app,
        USAGE,
        json!({
            "conditions": [{"key": "api_key", "value": "*"}],
            "group_by": [{"key": "api_key"}],
            "type": "tokens",
            "credit_limit": 1000000,
            "periodic_reset_days": 30,
            "next_usage_reset_at": "2099-01-01T00:00:00Z",
            "workspace_id": ws_b,
        }),
    )
    .await;
    let (_, list) = app.admin("GET", USAGE, None).await;
    assert_eq!(list["total"], 2, "{list}");
    for item in list["data"].as_array().unwrap() {
        assert!(item.get("object").is_none(), "{item}");
    }
    assert_eq!(list["data"][0]["id"], tokens.as_str(), "newest first");
    let (_, list) = app
        .admin("GET", &format!("{USAGE}?type=tokens"), None)
        .await;
    assert_eq!(list["total"], 1);
    let (_, list) = app
        .admin("GET", &format!("{USAGE}?workspace_id=default"), None)
        .await;
    assert_eq!(list["total"], 1);
    assert_eq!(list["data"][0]["id"], id.as_str());
    let (_, list) = app
        .admin("GET", &format!("{USAGE}?page_size=1&current_page=1"), None)
        .await;
    assert_eq!(
        (list["total"].as_i64(), list["data"][0]["id"].as_str()),
        (Some(2), Some(id.as_str()))
    );

    // Archive.
    let (status, resp) = app.admin("DELETE", &path, None).await;
    assert_eq!((status, &resp), (200, &json!({})));
    let (status, resp) = app.admin("GET", &path, None).await;
    assert_eq!((status, code(&resp)), (404, "AB08"), "{resp}");
    let (status, got) = app
        .admin(
            "GET",
            &format!("{path}?status=archived&include_usage=true"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["status"], "archived");
    assert_eq!(
        got["value_key_usage_map"]["metadata._user:alice"]["current_usage"],
        12.75
    );
    let (_, list) = app
        .admin("GET", &format!("{USAGE}?status=archived"), None)
        .await;
    assert_eq!(list["total"], 1);
    let (status, _) = app.admin("PUT", &path, Some(json!({"name": "x"}))).await;
    assert_eq!(status, 404);
    let (status, _) = app.admin("DELETE", &path, None).await;
    assert_eq!(status, 404);
    let err = app
        .store
        .charge_usage_limits_policy(&id, "metadata._user:alice", 1.0)
        .await
        .unwrap_err();
    assert_eq!(
        err.kind,
        admin::ErrorKind::NotFound,
        "an archived policy is not charged"
    );
    // create x2, update x2, archive, and the workspace B.
    assert_eq!(app.audit_count().await, before + 6);
}

async fn usage_limits_bad_input(db: TestDb) {
    let app = App::start(db).await;
    let before = app.audit_count().await;
    let with = |patch: Value| {
        let mut b = usage_body("default");
        for (k, v) in patch.as_object().unwrap() {
            if v.is_null() {
                b.as_object_mut().unwrap().remove(k);
            } else {
                b[k] = v.clone();
            }
        }
        b
    };
    let cases: Vec<(Value, u16, &str, &str)> = vec![
        (
            with(json!({"credit_limit": null})),
            400,
            "AB01",
            "missing field `credit_limit`",
        ),
        (
            with(json!({"type": null})),
            400,
            "AB01",
            "missing field `type`",
        ),
        (
            with(json!({"type": "requests"})),
            400,
            "AB01",
            "type: unknown variant `requests`",
        ),
        (
            with(json!({"credit_limit": -1})),
            400,
            "AB01",
            "credit_limit: must be a number >= 0",
        ),
        (
            with(json!({"credit_limit": "10"})),
            400,
            "AB01",
            "credit_limit: invalid type",
        ),
        (
            with(json!({"alert_threshold": 100})),
            400,
            "AB01",
            "alert_threshold: must be below credit_limit (100)",
        ),
        (
            with(json!({"alert_threshold": -1})),
            400,
            "AB01",
            "alert_threshold: must be a number >= 0",
        ),
        (
            with(json!({"periodic_reset": "daily"})),
            400,
            "AB01",
            "periodic_reset: unknown variant `daily`",
        ),
        (
            with(json!({"periodic_reset": null, "periodic_reset_days": 0})),
            400,
            "AB01",
            "periodic_reset_days: must be between 1 and 365, got 0",
        ),
        (
            with(json!({"periodic_reset": null, "periodic_reset_days": 366})),
            400,
            "AB01",
            "periodic_reset_days: must be between 1 and 365, got 366",
        ),
        (
            with(json!({"periodic_reset_days": 30})),
            400,
            "AB01",
            "periodic_reset and periodic_reset_days are mutually exclusive",
        ),
        (
            with(json!({"next_usage_reset_at": "next monday"})),
            400,
            "AB01",
            "next_usage_reset_at: must be an RFC 3339 time",
        ),
        (
            with(json!({"next_usage_reset_at": "2020-01-01T00:00:00Z"})),
            400,
            "AB01",
            "next_usage_reset_at: must be in the future",
        ),
        (
            with(json!({"type": "tokens", "credit_limit": 10.5, "alert_threshold": null})),
            400,
            "AB01",
            "credit_limit: must be a whole number of tokens",
        ),
        (
            with(json!({"conditions": [{"key": "virtual-key", "value": "a"}]})),
            400,
            "AB01",
            "conditions[0].key: unknown key",
        ),
        (
            with(json!({"group_by": []})),
            400,
            "AB01",
            "group_by: must hold at least one item",
        ),
        (
            with(json!({"name": "x".repeat(256)})),
            400,
            "AB01",
            "name: must be at most 255 characters",
        ),
        (
            with(json!({"current_usage": 5})),
            400,
            "AB01",
            "current_usage: unknown field",
        ),
        (
            with(json!({"workspace_id": null})),
            400,
            "AB01",
            "workspace_id: is required",
        ),
        (
            with(json!({"workspace_id": "nowhere"})),
            404,
            "AB02",
            "workspace_id: no workspace",
        ),
    ];
    for (body, status, want_code, msg) in cases {
        let (got, resp) = app.admin("POST", USAGE, Some(body.clone())).await;
        assert_eq!((got, code(&resp)), (status, want_code), "{body}: {resp}");
        assert!(message(&resp).contains(msg), "want {msg:?} in {resp}");
    }
    // The mutually exclusive fields are both named.
    let (_, resp) = app
        .admin("POST", USAGE, Some(with(json!({"periodic_reset_days": 7}))))
        .await;
    assert!(
        message(&resp).contains("periodic_reset") && message(&resp).contains("periodic_reset_days"),
        "{resp}"
    );
    assert_eq!(app.audit_count().await, before, "no failed write recorded");

    let id = create(&app, USAGE, usage_body("default")).await;
    let path = format!("{USAGE}/{id}");
    app.store
        .charge_usage_limits_policy(&id, "metadata._user:alice", 1.0)
        .await
        .unwrap();
    let after_create = app.audit_count().await;
    let updates: Vec<(Value, u16, &str, &str)> = vec![
        (
            json!({"status": "archived"}),
            400,
            "AB01",
            "status: cannot be updated",
        ),
        (
            json!({"periodic_reset": "weekly", "periodic_reset_days": 7}),
            400,
            "AB01",
            "periodic_reset and periodic_reset_days are mutually exclusive",
        ),
        (
            json!({"credit_limit": 50}),
            400,
            "AB01",
            "alert_threshold: must be below credit_limit (50), got 80",
        ),
        (
            json!({"alert_threshold": 150}),
            400,
            "AB01",
            "alert_threshold: must be below credit_limit (100), got 150",
        ),
        (
            json!({"credit_limit": -5}),
            400,
            "AB01",
            "credit_limit: must be a number >= 0",
        ),
        (
            json!({"periodic_reset_days": 400}),
            400,
            "AB01",
            "periodic_reset_days: must be between 1 and 365",
        ),
        (
            json!({"next_usage_reset_at": "2001-01-01T00:00:00Z"}),
            400,
            "AB01",
            "next_usage_reset_at: must be in the future",
        ),
        (
            json!({"type": "tokens"}),
            400,
            "AB01",
            "type: unknown field",
        ),
        (
            json!({"reset_usage_for_value": ""}),
            400,
            "AB01",
            "reset_usage_for_value: must not be empty",
        ),
        (
            json!({"reset_usage_for_value": "metadata._user:nobody", "name": "changed"}),
            404,
            "AB02",
            "reset_usage_for_value: the policy has no entity",
        ),
    ];
    for (body, status, want_code, msg) in updates {
        let (got, resp) = app.admin("PUT", &path, Some(body.clone())).await;
        assert_eq!((got, code(&resp)), (status, want_code), "{body}: {resp}");
        assert!(message(&resp).contains(msg), "want {msg:?} in {resp}");
    }
    let (_, got) = app.admin("GET", &path, None).await;
    assert_eq!(got["name"], "monthly budget per user", "no partial write");
    assert_eq!(got["credit_limit"], 100);
    assert_eq!(app.audit_count().await, after_create);

    for (method, suffix, body) in [
        ("GET", "", None),
        ("PUT", "", Some(json!({"name": "x"}))),
        ("DELETE", "", None),
        ("GET", "/entities", None),
        ("PUT", "/entities/metadata._user:alice/reset", None),
    ] {
        let (status, resp) = app
            .admin(method, &format!("{USAGE}/nope{suffix}"), body.clone())
            .await;
        assert_eq!(
            (status, code(&resp)),
            (400, "AB01"),
            "{method} {suffix}: {resp}"
        );
        let (status, resp) = app
            .admin(method, &format!("{USAGE}/{MISSING}{suffix}"), body.clone())
            .await;
        assert_eq!(
            (status, code(&resp)),
            (404, "AB08"),
            "{method} {suffix}: {resp}"
        );
        for key in [None, Some("not-a-key")] {
            let (status, resp) = app
                .call(method, &format!("{path}{suffix}"), key, body.clone())
                .await;
            assert_eq!(
                (status, code(&resp)),
                (401, "AB05"),
                "{method} {suffix}: {resp}"
            );
        }
    }
    for bad in ["?include_usage=maybe", "?status=exhausted", "?colour=1"] {
        let (status, resp) = app.admin("GET", &format!("{path}{bad}"), None).await;
        assert_eq!((status, code(&resp)), (400, "AB01"), "{bad}: {resp}");
    }
    for bad in ["?type=requests", "?unit=rpm", "?status=x", "?page_size=-1"] {
        let (status, resp) = app.admin("GET", &format!("{USAGE}{bad}"), None).await;
        assert_eq!((status, code(&resp)), (400, "AB01"), "{bad}: {resp}");
    }
    let long_search = format!("?search={}", "x".repeat(256));
    for bad in [
        "?status=archived",
        "?page_size=500",
        "?current_page=-2",
        long_search.as_str(),
    ] {
        let (status, resp) = app
            .admin("GET", &format!("{path}/entities{bad}"), None)
            .await;
        assert_eq!((status, code(&resp)), (400, "AB01"), "{bad}: {resp}");
    }
    let (status, resp) = app
        .admin(
            "PUT",
            &format!("{path}/entities/metadata._user:alice/reset"),
            Some(json!({"all": true})),
        )
        .await;
    assert_eq!((status, code(&resp)), (400, "AB01"), "{resp}");
    assert_eq!(app.audit_count().await, after_create);
}

async fn entities_reset_and_reactivation(db: TestDb) {
    let app = App::start(db).await;
    let mut body = usage_body("default");
    body["alert_threshold"] = json!(null);
    let id = create(&app, USAGE, body).await;
    let path = format!("{USAGE}/{id}");
    let charge = |who: &'static str, amount: f64| {
        let store = app.store.clone();
        let id = id.clone();
        async move {
            store
                .charge_usage_limits_policy(
                    &id,
                    &admin::store::value_key([("metadata._user", who)]),
                    amount,
                )
                .await
                .unwrap()
        }
    };
    charge("alice", 60.0).await;
    let bob = charge("bob", 120.5).await;
    charge("carol", 99.5).await;
    let carol = charge("carol", 0.5).await;
    assert_eq!(
        (bob.status.as_str(), carol.status.as_str()),
        ("exhausted", "exhausted")
    );
    assert_eq!(carol.current_usage, 100.0);

    let (status, list) = app.admin("GET", &format!("{path}/entities"), None).await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["object"], "list");
    assert_eq!(list["total"], 3);
    let first = &list["data"][0];
    for field in [
        "id",
        "value_key",
        "current_usage",
        "status",
        "last_reset_at",
    ] {
        assert!(first.get(field).is_some(), "{field} in {first}");
    }
    let (_, list) = app
        .admin("GET", &format!("{path}/entities?status=exhausted"), None)
        .await;
    assert_eq!(list["total"], 2, "{list}");
    let (_, list) = app
        .admin("GET", &format!("{path}/entities?status=active"), None)
        .await;
    assert_eq!(
        list["data"][0]["value_key"], "metadata._user:alice",
        "{list}"
    );
    assert_eq!(list["data"][0]["current_usage"], 60.0);
    let (_, list) = app
        .admin("GET", &format!("{path}/entities?search=BO"), None)
        .await;
    assert_eq!(
        (list["total"].as_i64(), &list["data"][0]["value_key"]),
        (Some(1), &json!("metadata._user:bob"))
    );
    let (_, list) = app
        .admin("GET", &format!("{path}/entities?search=%25"), None)
        .await;
    assert_eq!(list["total"], 0, "a % is a character: {list}");
    let (_, list) = app
        .admin(
            "GET",
            &format!("{path}/entities?page_size=2&current_page=1"),
            None,
        )
        .await;
    assert_eq!(
        (
            list["total"].as_i64(),
            list["data"].as_array().unwrap().len()
        ),
        (Some(3), 1)
    );

    // Reset one entity by its id: usage zero, active, last_reset_at set.
    let before = app.audit_count().await;
    let (status, resp) = app
        .admin("PUT", &format!("{path}/entities/{}/reset", bob.id), None)
        .await;
    assert_eq!((status, &resp), (200, &json!({})));
    let (_, got) = app
        .admin("GET", &format!("{path}?include_usage=true"), None)
        .await;
    assert_eq!(
        got["value_key_usage_map"]["metadata._user:bob"],
        json!({"current_usage": 0.0, "status": "active"})
    );
    let (_, list) = app
        .admin("GET", &format!("{path}/entities?search=bob"), None)
        .await;
    assert!(list["data"][0]["last_reset_at"].is_string(), "{list}");
    // ... or by its value key; an unknown one is a 404.
    let (status, _) = app
        .admin(
            "PUT",
            &format!("{path}/entities/metadata._user:carol/reset"),
            None,
        )
        .await;
    assert_eq!(status, 200);
    for unknown in [MISSING, "metadata._user:dave"] {
        let (status, resp) = app
            .admin("PUT", &format!("{path}/entities/{unknown}/reset"), None)
            .await;
        assert_eq!((status, code(&resp)), (404, "AB08"), "{resp}");
    }
    assert_eq!(app.audit_count().await, before + 2);
    let (_, audit) = app
        .admin(
            "GET",
            "/v1/audit-logs?start_time=2000-01-01T00:00:00Z&end_time=2999-01-01T00:00:00Z&action=reset_usage",
            None,
        )
        .await;
    assert_eq!(audit["total"], 2, "{audit}");
    assert_eq!(
        audit["records"][1]["resource_type"],
        "usage_limits_policy_entity"
    );

    // Raising the credit limit above an exhausted entity's usage reactivates it at once;
    // lowering it below an active one's exhausts it.
    charge("carol", 150.0).await;
    let map = |got: &Value, who: &str| {
        got["value_key_usage_map"][format!("metadata._user:{who}")].clone()
    };
    let (_, got) = app
        .admin("GET", &format!("{path}?include_usage=true"), None)
        .await;
    assert_eq!(map(&got, "carol")["status"], "exhausted");
    let (status, _) = app
        .admin("PUT", &path, Some(json!({"credit_limit": 150.5})))
        .await;
    assert_eq!(status, 200);
    let (_, got) = app
        .admin("GET", &format!("{path}?include_usage=true"), None)
        .await;
    assert_eq!(
        map(&got, "carol"),
        json!({"current_usage": 150.0, "status": "active"})
    );
    assert_eq!(map(&got, "alice")["status"], "active");
    let (status, _) = app
        .admin("PUT", &path, Some(json!({"credit_limit": 50})))
        .await;
    assert_eq!(status, 200);
    let (_, got) = app
        .admin("GET", &format!("{path}?include_usage=true"), None)
        .await;
    assert_eq!(map(&got, "alice")["status"], "exhausted", "60 >= 50");
    assert_eq!(map(&got, "carol")["status"], "exhausted");
    assert_eq!(map(&got, "bob")["status"], "active", "0 < 50");
    // An unchanged limit changes no entity; reset_usage_for_value resets one in the update.
    let (status, _) = app
        .admin(
            "PUT",
            &path,
            Some(json!({"credit_limit": 50, "reset_usage_for_value": "metadata._user:alice"})),
        )
        .await;
    assert_eq!(status, 200);
    let (_, got) = app
        .admin("GET", &format!("{path}?include_usage=true"), None)
        .await;
    assert_eq!(
        map(&got, "alice"),
        json!({"current_usage": 0.0, "status": "active"})
    );
    assert_eq!(map(&got, "carol")["status"], "exhausted");

    // An archived policy's entities are listed but not reset.
    app.admin("DELETE", &path, None).await;
    let (status, list) = app.admin("GET", &format!("{path}/entities"), None).await;
    assert_eq!((status, &list["total"]), (200, &json!(3)));
    let (status, resp) = app
        .admin(
            "PUT",
            &format!("{path}/entities/metadata._user:carol/reset"),
            None,
        )
        .await;
    assert_eq!((status, code(&resp)), (404, "AB08"), "{resp}");
}

async fn who_may_do_what(db: TestDb) {
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
    let (_, manager_key) = app.user_key(&a, &manager, POLICY_SCOPES).await;
    let (_, member_key) = app.user_key(&a, &member, POLICY_SCOPES).await;
    let (_, read_only) = app
        .user_key(&a, &manager, &["policies.read", "policies.list"])
        .await;

    // A workspace key: its own workspace, named or not.
    for (key, base, body) in [
        (&manager_key, RATE, rate_body("default")),
        (&member_key, USAGE, usage_body("default")),
    ] {
        let mut unnamed = body.clone();
        unnamed.as_object_mut().unwrap().remove("workspace_id");
        if base == USAGE {
            unnamed["conditions"] = json!([{"key": "metadata.team", "value": "a"}]);
        }
        for b in [body.clone(), unnamed] {
            let (status, resp) = app.call("POST", base, Some(key), Some(b)).await;
            assert_eq!(status, 200, "{resp}");
            let id = resp["id"].as_str().unwrap();
            let (_, got) = app.admin("GET", &format!("{base}/{id}"), None).await;
            assert_eq!(got["workspace_id"], a.as_str());
        }
        let (status, resp) = app
            .call(
                "POST",
                base,
                Some(key),
                Some({
                    let mut b = body.clone();
                    b["workspace_id"] = json!(ws_b);
                    if base == USAGE {
                        b["conditions"] = json!([{"key": "model", "value": "*"}]);
                    }
                    b
                }),
            )
            .await;
        assert_eq!((status, code(&resp)), (403, "AB03"), "{resp}");
    }
    // Policies of B, made by the admin key.
    let rate_b = create(&app, RATE, rate_body(&ws_b)).await;
    let usage_b = create(&app, USAGE, usage_body(&ws_b)).await;
    let rate_a = create(&app, RATE, rate_body("default")).await;
    app.store
        .charge_usage_limits_policy(&usage_b, "metadata._user:x", 1.0)
        .await
        .unwrap();
    for key in [&manager_key, &member_key] {
        for (method, p, body) in [
            ("GET", format!("{RATE}/{rate_b}"), None),
            ("PUT", format!("{RATE}/{rate_b}"), Some(json!({"value": 1}))),
            ("DELETE", format!("{RATE}/{rate_b}"), None),
            ("GET", format!("{RATE}/{rate_b}/entities"), None),
            ("GET", format!("{USAGE}/{usage_b}"), None),
            (
                "PUT",
                format!("{USAGE}/{usage_b}"),
                Some(json!({"name": "x"})),
            ),
            ("DELETE", format!("{USAGE}/{usage_b}"), None),
            ("GET", format!("{USAGE}/{usage_b}/entities"), None),
            (
                "PUT",
                format!("{USAGE}/{usage_b}/entities/metadata._user:x/reset"),
                None,
            ),
            ("GET", format!("{RATE}?workspace_id={ws_b}"), None),
            ("GET", format!("{USAGE}?workspace_id={ws_b}"), None),
        ] {
            let (status, resp) = app.call(method, &p, Some(key), body).await;
            assert_eq!((status, code(&resp)), (403, "AB03"), "{method} {p}: {resp}");
        }
        // Its own workspace's policies only, without a filter.
        let (status, list) = app.call("GET", RATE, Some(key), None).await;
        assert_eq!(status, 200, "{list}");
        assert_eq!(
            list["total"], 3,
            "two made by the manager, one by the admin key: {list}"
        );
        for item in list["data"].as_array().unwrap() {
            assert_eq!(item["workspace_id"], a.as_str());
        }
        let (status, _) = app
            .call(
                "PUT",
                &format!("{RATE}/{rate_a}"),
                Some(key),
                Some(json!({"value": 7})),
            )
            .await;
        assert_eq!(status, 200);
    }
    // The admin key sees every workspace's.
    let (_, list) = app.admin("GET", RATE, None).await;
    assert_eq!(list["total"], 4);

    // Scopes narrow: a read-only key reads and lists, nothing else.
    let (status, _) = app
        .call("GET", &format!("{RATE}/{rate_a}"), Some(&read_only), None)
        .await;
    assert_eq!(status, 200);
    let (status, _) = app.call("GET", USAGE, Some(&read_only), None).await;
    assert_eq!(status, 200);
    for (method, p, body) in [
        ("POST", RATE.to_owned(), Some(rate_body("default"))),
        ("PUT", format!("{RATE}/{rate_a}"), Some(json!({"value": 1}))),
        ("DELETE", format!("{RATE}/{rate_a}"), None),
    ] {
        let (status, resp) = app.call(method, &p, Some(&read_only), body).await;
        assert_eq!((status, code(&resp)), (403, "AB03"), "{method} {p}: {resp}");
        assert!(message(&resp).contains("policies."), "{resp}");
    }
    // An admin key without the scope is refused too.
    let (_, scoped_admin) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/organisation/service",
            json!({"name": "lister", "scopes": ["policies.list"]}),
        )
        .await;
    let (status, _) = app.call("GET", RATE, Some(&scoped_admin), None).await;
    assert_eq!(status, 200);
    let (status, resp) = app
        .call(
            "GET",
            &format!("{RATE}/{rate_b}"),
            Some(&scoped_admin),
            None,
        )
        .await;
    assert_eq!((status, code(&resp)), (403, "AB03"), "{resp}");

    // A deleted workspace takes its policies, and what they counted, with it.
    let (status, resp) = app
        .admin("DELETE", &format!("/v1/admin/workspaces/{ws_b}"), None)
        .await;
    assert_eq!(status, 200, "{resp}");
    for p in [format!("{RATE}/{rate_b}"), format!("{USAGE}/{usage_b}")] {
        for status_query in ["active", "archived"] {
            let (status, _) = app
                .admin("GET", &format!("{p}?status={status_query}"), None)
                .await;
            assert_eq!(status, 404, "{p}");
        }
    }
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM usage_limits_policy_entities")
        .fetch_one(app.store.db().pool())
        .await
        .unwrap();
    assert_eq!(left, 0);
    let (_, list) = app.admin("GET", RATE, None).await;
    assert_eq!(list["total"], 3);
}

/// Updates of one policy at the same time each run in one transaction that reads the policy
/// locked: every change lands, none overwrites another's field with a stale value.
async fn concurrent_updates(db: TestDb) {
    let app = Arc::new(App::start(db).await);
    let mut body = usage_body("default");
    body["alert_threshold"] = json!(10);
    let usage = create(&app, USAGE, body).await;
    let rate = create(&app, RATE, rate_body("default")).await;
    app.store
        .charge_usage_limits_policy(&usage, "metadata._user:alice", 40.0)
        .await
        .unwrap();
    let before = app.audit_count().await;
    let usage_path = format!("{USAGE}/{usage}");
    let rate_path = format!("{RATE}/{rate}");
    let updates = vec![
        (usage_path.clone(), json!({"name": "renamed"})),
        (usage_path.clone(), json!({"credit_limit": 500})),
        (usage_path.clone(), json!({"alert_threshold": 50})),
        (usage_path.clone(), json!({"periodic_reset_days": 10})),
        (
            usage_path.clone(),
            json!({"next_usage_reset_at": "2099-01-01T00:00:00Z"}),
        ),
        (
            usage_path.clone(),
            json!({"reset_usage_for_value": "metadata._user:alice"}),
        ),
        (rate_path.clone(), json!({"name": "rate renamed"})),
        (rate_path.clone(), json!({"unit": "rph"})),
        (rate_path.clone(), json!({"value": 42})),
    ];
    let n = updates.len() as i64;
    let tasks = updates.into_iter().map(|(path, body)| {
        let app = app.clone();
        tokio::spawn(async move { app.admin("PUT", &path, Some(body)).await })
    });
    for r in futures_util::future::join_all(tasks).await {
        let (status, resp) = r.unwrap();
        assert_eq!(status, 200, "{resp}");
    }
    let (_, got) = app
        .admin("GET", &format!("{usage_path}?include_usage=true"), None)
        .await;
    assert_eq!(got["name"], "renamed");
    assert_eq!(got["credit_limit"], 500);
    assert_eq!(got["alert_threshold"], 50);
    assert_eq!(got["periodic_reset_days"], 10);
    assert_eq!(got["periodic_reset"], Value::Null);
    assert_eq!(got["next_usage_reset_at"], "2099-01-01T00:00:00.000000Z");
    assert_eq!(
        got["value_key_usage_map"]["metadata._user:alice"]["current_usage"],
        0.0
    );
    let (_, got) = app.admin("GET", &rate_path, None).await;
    assert_eq!(
        (&got["name"], &got["unit"], &got["value"]),
        (&json!("rate renamed"), &json!("rph"), &json!(42))
    );
    assert_eq!(app.audit_count().await, before + n, "one record per update");

    // Concurrent charges of one entity: no increment is lost.
    let tasks = (0..20).map(|_| {
        let app = app.clone();
        let usage = usage.clone();
        tokio::spawn(async move {
            app.store
                .charge_usage_limits_policy(&usage, "metadata._user:bob", 2.5)
                .await
                .unwrap()
        })
    });
    for r in futures_util::future::join_all(tasks).await {
        r.unwrap();
    }
    let (_, got) = app
        .admin("GET", &format!("{usage_path}?include_usage=true"), None)
        .await;
    assert_eq!(
        got["value_key_usage_map"]["metadata._user:bob"],
        json!({"current_usage": 50.0, "status": "active"})
    );

    // A credit limit raised while an exhausted entity is charged: it ends up decided against
    // the limit in force after both.
    app.store
        .charge_usage_limits_policy(&usage, "metadata._user:carol", 500.0)
        .await
        .unwrap();
    let raise = {
        let app = app.clone();
        let path = usage_path.clone();
        tokio::spawn(async move {
            app.admin("PUT", &path, Some(json!({"credit_limit": 1000})))
                .await
        })
    };
    let more = {
        let app = app.clone();
        let usage = usage.clone();
        tokio::spawn(async move {
            app.store
                .charge_usage_limits_policy(&usage, "metadata._user:carol", 1.0)
                .await
                .unwrap()
        })
    };
    assert_eq!(raise.await.unwrap().0, 200);
    more.await.unwrap();
    let (_, got) = app
        .admin("GET", &format!("{usage_path}?include_usage=true"), None)
        .await;
    assert_eq!(
        got["value_key_usage_map"]["metadata._user:carol"],
        json!({"current_usage": 501.0, "status": "active"})
    );
}

crate::on_both_databases!(
    rate_limits_lifecycle,
    rate_limits_list_filters_and_paging,
    rate_limits_bad_input,
    rate_limits_entities,
    usage_limits_lifecycle,
    usage_limits_bad_input,
    entities_reset_and_reactivation,
    who_may_do_what,
    concurrent_updates,
);
