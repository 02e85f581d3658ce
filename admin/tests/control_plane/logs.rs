//! `/v1/logs`: logs written by the data plane's sink, listed with every filter and read one by
//! one; external logs inserted; exports made, started and downloaded; who may do which.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use admin::authz::{OrgRole, WorkspaceRole};
use admin::StoreSink;
use plugin_sdk::sinks::{ControlPlaneSink, LogRecord};
use serde_json::{json, Value};

use crate::common::{App, TestDb, ADMIN_KEY};

fn code(body: &Value) -> &str {
    body["data"]["errorCode"].as_str().unwrap_or_default()
}

async fn ok(app: &App, method: &str, path: &str, body: Option<Value>) -> Value {
    let (status, got) = app.admin(method, path, body).await;
    assert_eq!(status, 200, "{method} {path}: {got}");
    got
}

/// 2026-03-01T00:00:00Z plus `minutes`.
fn at(minutes: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_772_323_200 + minutes * 60)
}

struct Log<'a> {
    id: &'a str,
    minute: u64,
    workspace: Option<&'a str>,
    provider: &'a str,
    model: &'a str,
    status: u16,
    trace: &'a str,
}

fn record(app: &App, l: &Log<'_>) -> LogRecord {
    LogRecord {
        id: l.id.into(),
        trace_id: l.trace.into(),
        span_id: Some(format!("span-{}", l.id)),
        parent_span_id: None,
        span_name: Some("llm".into()),
        created_at: Some(at(l.minute)),
        organisation_id: Some(app.org.clone()),
        workspace_id: l.workspace.map(str::to_owned),
        api_key_id: Some(format!("key-{}", l.workspace.unwrap_or("none"))),
        user_id: None,
        metadata: BTreeMap::from([("_user".to_owned(), "alice".to_owned())]),
        route: "chat.completions".into(),
        method: "POST".into(),
        path: "/v1/chat/completions".into(),
        provider: Some(l.provider.into()),
        model: Some(l.model.into()),
        status: l.status,
        latency_ms: 120,
        upstream_latency_ms: Some(100),
        prompt_tokens: 10,
        completion_tokens: 5,
        cost: Some(0.25),
        cache_status: Some("MISS".into()),
        retries: 1,
        final_target: Some("config.targets[1]".into()),
        streamed: false,
        error: None,
        request_body: Some(r#"{"model":"gpt-4o","messages":[]}"#.into()),
        response_body: Some(TRICKY_TEXT.into()),
    }
}

/// A body that a batch's encoding must carry unchanged: quotes, escapes, control characters,
/// text outside ASCII and outside the Basic Multilingual Plane.
const TRICKY_TEXT: &str = "plain text, \"quoted\" \\ back\nnew line\ttab \u{1} é 日本 🦀 \\u0041";

/// Writes logs through the sink: `a` (team, openai), `b` (team, anthropic, 429), `c` (default
/// workspace), `d` (no workspace, no organisation), in time order a < b < c < d.
async fn seed(app: &App, team: &str) -> [String; 4] {
    let ids = [
        uuid::Uuid::new_v4().to_string(),
        uuid::Uuid::new_v4().to_string(),
        uuid::Uuid::new_v4().to_string(),
        uuid::Uuid::new_v4().to_string(),
    ];
    let logs = [
        Log {
            id: &ids[0],
            minute: 0,
            workspace: Some(team),
            provider: "openai",
            model: "gpt-4o",
            status: 200,
            trace: "trace-1",
        },
        Log {
            id: &ids[1],
            minute: 10,
            workspace: Some(team),
            provider: "anthropic",
            model: "claude-sonnet",
            status: 429,
            trace: "trace-1",
        },
        Log {
            id: &ids[2],
            minute: 20,
            workspace: Some(&app.default_ws),
            provider: "openai",
            model: "gpt-4o-mini",
            status: 200,
            trace: "trace-2",
        },
        Log {
            id: &ids[3],
            minute: 30,
            workspace: None,
            provider: "openai",
            model: "gpt-4o",
            status: 500,
            trace: "trace-3",
        },
    ];
    let mut records: Vec<LogRecord> = logs.iter().map(|l| record(app, l)).collect();
    records[3].organisation_id = None;
    let sink = StoreSink::new(app.store.clone(), tokio::runtime::Handle::current());
    sink.write_logs(records.clone()).await.unwrap();
    // The same batch again (a writer's retry) adds nothing.
    sink.write_logs(records[..1].to_vec()).await.unwrap();
    ids
}

/// A workspace `Team` with the slug `team`.
async fn team(app: &App) -> String {
    let made = ok(
        app,
        "POST",
        "/v1/admin/workspaces",
        Some(json!({"name": "Team", "slug": "team"})),
    )
    .await;
    made["id"].as_str().unwrap().to_owned()
}

fn ids_of(list: &Value) -> Vec<String> {
    list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["id"].as_str().unwrap().to_owned())
        .collect()
}

async fn logs_are_listed_filtered_and_read(db: TestDb) {
    let app = App::start(db).await;
    let team = team(&app).await;
    let [a, b, c, d] = seed(&app, &team).await;

    let list = ok(&app, "GET", "/v1/logs", None).await;
    assert_eq!(list["object"], "list");
    assert_eq!(list["total"], 4, "{list}");
    assert_eq!(ids_of(&list), [d.as_str(), &c, &b, &a], "newest first");
    let first = &list["data"][3];
    assert_eq!(first["object"], "log");
    assert_eq!(first["trace_id"], "trace-1");
    assert_eq!(first["workspace_id"], team.as_str());
    assert_eq!(first["organisation_id"], app.org.as_str());
    assert_eq!(first["metadata"], json!({"_user": "alice"}));
    assert_eq!(first["total_tokens"], 15);
    assert_eq!(first["cost"], 0.25);
    assert_eq!(first["cache_status"], "MISS");
    assert_eq!(first["final_target"], "config.targets[1]");
    assert_eq!(first["created_at"], "2026-03-01T00:00:00.000000Z");
    assert_eq!(first["source"], "gateway");
    assert!(
        first.get("request_body").is_none(),
        "a list leaves bodies out"
    );
    // The record without an organisation went to the bootstrap organisation.
    assert_eq!(list["data"][0]["organisation_id"], app.org.as_str());

    let filters = [
        (format!("workspace_id={team}"), vec![b.as_str(), &a]),
        ("workspace_id=team".to_owned(), vec![b.as_str(), &a]),
        ("trace_id=trace-1".to_owned(), vec![b.as_str(), &a]),
        ("status_code=429".to_owned(), vec![b.as_str()]),
        ("provider=openai".to_owned(), vec![d.as_str(), &c, &a]),
        ("model=gpt-4o".to_owned(), vec![d.as_str(), &a]),
        (format!("api_key_id=key-{}", app.default_ws), vec![c.as_str()]),
        (
            "time_of_generation_min=2026-03-01T00:10:00Z&time_of_generation_max=2026-03-01T01:20:00%2B01:00"
                .to_owned(),
            vec![c.as_str(), &b],
        ),
        ("page_size=2&current_page=1".to_owned(), vec![b.as_str(), &a]),
    ];
    for (query, want) in filters {
        let list = ok(&app, "GET", &format!("/v1/logs?{query}"), None).await;
        assert_eq!(ids_of(&list), want, "{query}");
        if !query.starts_with("page_size") {
            assert_eq!(list["total"], want.len(), "{query}");
        }
    }
    for bad in [
        "status_code=600",
        "time_of_generation_min=yesterday",
        "colour=red",
        "page_size=101",
    ] {
        let (status, got) = app.admin("GET", &format!("/v1/logs?{bad}"), None).await;
        assert_eq!((status, code(&got)), (400, "AB01"), "{bad}: {got}");
    }

    let one = ok(&app, "GET", &format!("/v1/logs/{a}"), None).await;
    assert_eq!(one["id"], a.as_str());
    assert_eq!(one["object"], "log");
    assert_eq!(
        one["request_body"],
        json!({"model": "gpt-4o", "messages": []})
    );
    assert_eq!(one["response_body"], TRICKY_TEXT, "stored as sent");
    assert_eq!(one["span_id"], format!("span-{a}"));
    assert_eq!(one["upstream_latency_ms"], 100);
    assert_eq!(one["retries"], 1);
    let (status, got) = app.admin("GET", "/v1/logs/no-such-log", None).await;
    assert_eq!((status, code(&got)), (404, "AB08"), "{got}");
}

async fn logs_scopes(db: TestDb) {
    let app = App::start(db).await;
    let team = team(&app).await;
    let [a, b, c, _] = seed(&app, &team).await;
    let manager = app
        .user(
            "m@example.com",
            OrgRole::Member,
            Some((&team, WorkspaceRole::Manager)),
        )
        .await;
    let (_, no_logs) = app.user_key(&team, &manager, &["configs.read"]).await;
    let (_, lister) = app.user_key(&team, &manager, &["logs.list"]).await;
    let (_, viewer) = app
        .user_key(&team, &manager, &["logs.list", "logs.view", "logs.write"])
        .await;

    // Without logs.list a workspace key lists nothing.
    let (status, got) = app.call("GET", "/v1/logs", Some(&no_logs), None).await;
    assert_eq!((status, code(&got)), (403, "AB03"), "{got}");
    assert!(got["data"]["message"]
        .as_str()
        .unwrap()
        .contains("logs.list"));
    // With it: its own workspace's logs only, and no other workspace's.
    let (status, list) = app.call("GET", "/v1/logs", Some(&lister), None).await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(ids_of(&list), [b.as_str(), &a]);
    let (status, got) = app
        .call(
            "GET",
            &format!("/v1/logs?workspace_id={}", app.default_ws),
            Some(&lister),
            None,
        )
        .await;
    assert_eq!((status, code(&got)), (403, "AB03"), "{got}");
    // One log needs logs.view, and one of its workspace.
    let (status, got) = app
        .call("GET", &format!("/v1/logs/{a}"), Some(&lister), None)
        .await;
    assert_eq!((status, code(&got)), (403, "AB03"), "{got}");
    let (status, got) = app
        .call("GET", &format!("/v1/logs/{a}"), Some(&viewer), None)
        .await;
    assert_eq!(status, 200, "{got}");
    let (status, got) = app
        .call("GET", &format!("/v1/logs/{c}"), Some(&viewer), None)
        .await;
    assert_eq!((status, code(&got)), (403, "AB03"), "{got}");

    // Inserting an external log: logs.write; it lands in the key's workspace.
    let external = json!({
        "request": {"url": "https://api.example.com/v1/generate", "provider": "example",
                    "headers": {"authorization": "Bearer sk-secret"}, "method": "post",
                    "body": {"model": "ex-1", "api_key": "sk-in-body", "prompt": "hi"}},
        "response": {"status": 201, "body": {"text": "hello", "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
                     "response_time": 42.4, "streamingMode": true},
        "metadata": {"traceId": "ext-trace", "spanName": "outside", "_user": "bob", "n": 1},
    });
    let (status, got) = app
        .call("POST", "/v1/logs", Some(&lister), Some(external.clone()))
        .await;
    assert_eq!((status, code(&got)), (403, "AB03"), "{got}");
    let before = app.audit_count().await;
    let (status, made) = app
        .call("POST", "/v1/logs", Some(&viewer), Some(external.clone()))
        .await;
    assert_eq!(status, 200, "{made}");
    assert_eq!(made["total"], 1);
    assert_eq!(app.audit_count().await, before + 1);
    let (_, audit) = app
        .admin(
            "GET",
            "/v1/audit-logs?start_time=2000-01-01T00:00:00Z&end_time=2999-01-01T00:00:00Z&resource_type=log",
            None,
        )
        .await;
    assert_eq!(
        audit["records"][0]["request_body"],
        json!({"logs": 1}),
        "{audit}"
    );
    let id = made["data"][0]["id"].as_str().unwrap().to_owned();
    let (_, got) = app
        .call("GET", &format!("/v1/logs/{id}"), Some(&viewer), None)
        .await;
    assert_eq!(got["workspace_id"], team.as_str());
    assert_eq!(got["source"], "external");
    assert_eq!(got["trace_id"], "ext-trace");
    assert_eq!(got["span_name"], "outside");
    assert_eq!(got["metadata"], json!({"_user": "bob", "n": "1"}));
    assert_eq!(got["method"], "POST");
    assert_eq!(got["path"], "https://api.example.com/v1/generate");
    assert_eq!(got["provider"], "example");
    assert_eq!(got["model"], "ex-1");
    assert_eq!(got["status_code"], 201);
    assert_eq!(got["latency_ms"], 42);
    assert_eq!(
        (
            got["prompt_tokens"].clone(),
            got["completion_tokens"].clone()
        ),
        (json!(3), json!(2))
    );
    assert_eq!(got["streamed"], true);
    assert_eq!(got["request_body"]["api_key"], "[REDACTED]");
    assert_eq!(got["request_body"]["prompt"], "hi");
    assert!(
        !got.to_string().contains("sk-secret"),
        "headers are not kept"
    );
    // A list of logs; a bad one names its place.
    let (status, made) = app
        .admin(
            "POST",
            "/v1/logs",
            Some(json!([external.clone(), external.clone()])),
        )
        .await;
    assert_eq!((status, made["total"].clone()), (200, json!(2)), "{made}");
    let (status, got) = app
        .admin(
            "POST",
            "/v1/logs",
            Some(json!([external, {"request": {}, "response": {"status": 42}}])),
        )
        .await;
    assert_eq!((status, code(&got)), (400, "AB01"), "{got}");
    assert!(
        got["data"]["message"]
            .as_str()
            .unwrap()
            .starts_with("[1].response.status"),
        "{got}"
    );
    let (status, got) = app
        .admin("POST", "/v1/logs", Some(json!({"request": {}})))
        .await;
    assert_eq!((status, code(&got)), (400, "AB01"), "{got}");
}

async fn exports_are_started_and_downloaded(db: TestDb) {
    let app = App::start(db).await;
    let team = team(&app).await;
    let [a, b, _, _] = seed(&app, &team).await;

    let (status, got) = app
        .admin(
            "POST",
            "/v1/logs/exports",
            Some(json!({"workspace_id": team, "requested_data": ["id", "colour"]})),
        )
        .await;
    assert_eq!((status, code(&got)), (400, "AB01"), "{got}");
    let made = ok(
        &app,
        "POST",
        "/v1/logs/exports",
        Some(json!({"workspace_id": "team", "description": "team logs",
                    "filters": {"provider": "openai"},
                    "requested_data": ["model", "id", "status_code"]})),
    )
    .await;
    assert_eq!(made["object"], "export");
    assert_eq!(made["total"], 1);
    let id = made["id"].as_str().unwrap().to_owned();
    let path = format!("/v1/logs/exports/{id}");
    let got = ok(&app, "GET", &path, None).await;
    assert_eq!(got["status"], "draft");
    assert_eq!(got["workspace_id"], team.as_str());
    assert_eq!(
        got["filters"],
        json!({"workspace_id": team, "provider": "openai"})
    );
    assert_eq!(got["requested_data"], json!(["model", "id", "status_code"]));
    assert_eq!(got["description"], "team logs");
    let (status, _, _) = app
        .call_raw("GET", &format!("{path}/download"), Some(ADMIN_KEY), None)
        .await;
    assert_eq!(status, 409, "a draft has nothing to download");

    // A draft is changed: the filters widen to the whole workspace.
    let updated = ok(&app, "PUT", &path, Some(json!({"filters": {}}))).await;
    assert_eq!(updated["total"], 2);
    let started = ok(&app, "POST", &format!("{path}/start"), None).await;
    assert_eq!(
        (started["status"].clone(), started["total"].clone()),
        (json!("success"), json!(2))
    );
    let (status, content_type, body) = app
        .call_raw("GET", &format!("{path}/download"), Some(ADMIN_KEY), None)
        .await;
    assert_eq!(status, 200);
    assert_eq!(content_type, "application/x-ndjson");
    let lines: Vec<Value> = std::str::from_utf8(&body)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines,
        [
            json!({"id": a, "model": "gpt-4o", "status_code": 200}),
            json!({"id": b, "model": "claude-sonnet", "status_code": 429}),
        ],
        "oldest first, the requested fields only"
    );
    let (status, got) = app.admin("PUT", &path, Some(json!({"filters": {}}))).await;
    assert_eq!(
        (status, code(&got)),
        (409, "AB07"),
        "a started export: {got}"
    );
    let (status, got) = app.admin("POST", &format!("{path}/cancel"), None).await;
    assert_eq!(
        (status, code(&got)),
        (409, "AB07"),
        "a finished export: {got}"
    );

    // Another export, cancelled; the list has both.
    let other = ok(&app, "POST", "/v1/logs/exports", Some(json!({}))).await;
    assert_eq!(other["total"], 4, "the whole organisation");
    let other_path = format!("/v1/logs/exports/{}", other["id"].as_str().unwrap());
    let got = ok(&app, "POST", &format!("{other_path}/cancel"), None).await;
    assert_eq!(got["status"], "cancelled");
    let (status, _) = app
        .admin("POST", &format!("{other_path}/start"), None)
        .await;
    assert_eq!(status, 409);
    let list = ok(&app, "GET", "/v1/logs/exports", None).await;
    assert_eq!(list["total"], 2);
    let list = ok(
        &app,
        "GET",
        &format!("/v1/logs/exports?workspace_id={team}"),
        None,
    )
    .await;
    assert_eq!(list["total"], 1);
    let (status, got) = app
        .admin(
            "GET",
            "/v1/logs/exports/00000000-0000-4000-8000-000000000000",
            None,
        )
        .await;
    assert_eq!((status, code(&got)), (404, "AB08"), "{got}");

    // A workspace key: logs.export in its own workspace only.
    let manager = app
        .user(
            "m@example.com",
            OrgRole::Member,
            Some((&team, WorkspaceRole::Manager)),
        )
        .await;
    let (_, lister) = app.user_key(&team, &manager, &["logs.list"]).await;
    let (_, exporter) = app.user_key(&team, &manager, &["logs.export"]).await;
    let (status, got) = app
        .call("POST", "/v1/logs/exports", Some(&lister), Some(json!({})))
        .await;
    assert_eq!((status, code(&got)), (403, "AB03"), "{got}");
    let (status, made) = app
        .call("POST", "/v1/logs/exports", Some(&exporter), Some(json!({})))
        .await;
    assert_eq!(status, 200, "{made}");
    assert_eq!(made["total"], 2, "confined to its workspace");
    let (status, list) = app
        .call("GET", "/v1/logs/exports", Some(&exporter), None)
        .await;
    assert_eq!((status, list["total"].clone()), (200, json!(2)), "{list}");
    let (status, got) = app.call("GET", &other_path, Some(&exporter), None).await;
    assert_eq!(
        (status, code(&got)),
        (403, "AB03"),
        "an organisation-wide export: {got}"
    );
    let (status, got) = app
        .call(
            "POST",
            "/v1/logs/exports",
            Some(&exporter),
            Some(json!({"filters": {"workspace_id": app.default_ws}})),
        )
        .await;
    assert_eq!((status, code(&got)), (403, "AB03"), "{got}");
    let (status, _, body) = app
        .call_raw("GET", &format!("{path}/download"), Some(&exporter), None)
        .await;
    assert_eq!(status, 200);
    assert_eq!(std::str::from_utf8(&body).unwrap().lines().count(), 2);
}

/// A batch larger than one INSERT statement holds (32 rows on SQLite, 8 on PostgreSQL) is
/// stored whole, its last statement a partial one, and sent again adds nothing.
async fn a_large_batch_is_stored_whole(db: TestDb) {
    let app = App::start(db).await;
    let ids: Vec<String> = (0..70).map(|_| uuid::Uuid::new_v4().to_string()).collect();
    let records: Vec<LogRecord> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let mut r = record(
                &app,
                &Log {
                    id,
                    minute: 0,
                    workspace: None,
                    provider: "openai",
                    model: "gpt-4o",
                    status: 200,
                    trace: "batch",
                },
            );
            r.prompt_tokens = i as u64;
            r
        })
        .collect();
    let sink = StoreSink::new(app.store.clone(), tokio::runtime::Handle::current());
    sink.write_logs(records.clone()).await.unwrap();
    sink.write_logs(records).await.unwrap();
    let list = ok(&app, "GET", "/v1/logs?trace_id=batch&page_size=100", None).await;
    assert_eq!(list["total"], 70, "{list}");
    let one = ok(&app, "GET", &format!("/v1/logs/{}", ids[69]), None).await;
    assert_eq!(
        one["prompt_tokens"], 69,
        "the last row kept its own values: {one}"
    );
}

crate::on_both_databases!(
    a_large_batch_is_stored_whole,
    logs_are_listed_filtered_and_read,
    logs_scopes,
    exports_are_started_and_downloaded,
);
