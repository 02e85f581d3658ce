//! Automatic rotation by a key's `rotation_policy`: one pass of the rotation worker
//! (`Store::rotate_due_api_keys`, called directly) rotates exactly the keys that are due, the
//! old value works until its transition ends, the new one is in the data plane's snapshot at
//! once and is handed to its owner once (`GET /v1/api-keys/{id}/rotated-key`), the schedule
//! moves on, and two instances running a pass together rotate each key once.

use admin::store::DataPlaneOptions;
use admin::Store;
use plugin_sdk::AccessStore;
use serde_json::{json, Value};

use crate::common::{digest, rebuild, App, TestDb, ADMIN_KEY, WS_SCOPES};
use crate::integrations::{app_with_key, test_key};

const SERVICE: &str = "/v1/api-keys/workspace/service";

/// A stored time `minutes` from now (negative: in the past).
fn from_now(minutes: i64) -> String {
    admin::time::format(admin::time::now() + chrono::Duration::minutes(minutes))
}

fn parse(text: &Value) -> chrono::DateTime<chrono::Utc> {
    admin::time::parse(text.as_str().unwrap_or_else(|| panic!("a time: {text}")))
        .unwrap_or_else(|| panic!("an RFC 3339 time: {text}"))
}

fn code(body: &Value) -> &str {
    body["data"]["errorCode"].as_str().unwrap_or_default()
}

/// A workspace service key with this rotation policy (none: `null`); (id, raw key).
async fn key_with(app: &App, name: &str, policy: Value) -> (String, String) {
    app.key(
        ADMIN_KEY,
        SERVICE,
        json!({"name": name, "workspace_id": "default", "scopes": WS_SCOPES, "rotation_policy": policy}),
    )
    .await
}

/// The key as `GET /v1/api-keys/{id}` shows it.
async fn shown(app: &App, id: &str) -> Value {
    let (status, got) = app.admin("GET", &format!("/v1/api-keys/{id}"), None).await;
    assert_eq!(status, 200, "{got}");
    got
}

async fn fetch(app: &App, id: &str) -> (u16, Value) {
    app.admin("GET", &format!("/v1/api-keys/{id}/rotated-key"), None)
        .await
}

/// How many audit records have this action.
async fn audit_actions(app: &App, action: &str) -> Vec<Value> {
    let (status, got) = app
        .admin(
            "GET",
            &format!(
                "/v1/audit-logs?start_time=2000-01-01T00:00:00Z&end_time=2999-01-01T00:00:00Z&action={action}&page_size=100"
            ),
            None,
        )
        .await;
    assert_eq!(status, 200, "{got}");
    got["records"].as_array().expect("records").clone()
}

/// Sets a key's policy with `next_rotation_at` in the past again (through the API).
async fn make_due(app: &App, id: &str, period: Option<&str>) {
    let (status, got) = app
        .admin(
            "PUT",
            &format!("/v1/api-keys/{id}"),
            Some(json!({"rotation_policy": {"rotation_period": period, "next_rotation_at": from_now(-5)}})),
        )
        .await;
    assert_eq!(status, 200, "{got}");
}

async fn a_due_key_is_rotated_and_its_new_value_handed_out_once(db: TestDb) {
    let app = app_with_key(db).await;
    let published = app.store.published();
    let due_at = from_now(-60);
    let (weekly, weekly_old) = key_with(
        &app,
        "weekly",
        json!({"rotation_period": "weekly", "next_rotation_at": due_at, "key_transition_period_ms": 3_600_000}),
    )
    .await;
    let (once, once_old) = key_with(&app, "once", json!({"next_rotation_at": from_now(-10)})).await;
    let later_at = from_now(24 * 60);
    let (later, later_raw) = key_with(
        &app,
        "later",
        json!({"rotation_period": "monthly", "next_rotation_at": later_at}),
    )
    .await;
    let (plain, plain_raw) = key_with(&app, "plain", Value::Null).await;
    let untouched = [
        (later.clone(), shown(&app, &later).await),
        (plain.clone(), shown(&app, &plain).await),
    ];

    // Nothing is waiting before a rotation.
    let (status, body) = fetch(&app, &weekly).await;
    assert_eq!((status, code(&body)), (404, "AB08"), "{body}");
    assert!(
        body["data"]["message"]
            .as_str()
            .unwrap()
            .contains("no rotated key waiting"),
        "{body}"
    );

    let version = published.version();
    assert_eq!(app.store.rotate_due_api_keys().await.expect("a pass"), 2);
    assert!(
        published.version() > version,
        "the rotations reach the data plane"
    );
    // The schedule moved on: a second pass finds nothing due.
    assert_eq!(app.store.rotate_due_api_keys().await.expect("a pass"), 0);

    // The new value is stored encrypted until it is fetched.
    let stored: Option<String> =
        sqlx::query_scalar("SELECT rotated_key FROM api_keys WHERE id = $1")
            .bind(&weekly)
            .fetch_one(app.store.db().pool())
            .await
            .unwrap();
    let stored = stored.expect("the new value is kept for its owner");
    assert!(stored.starts_with("v1:"), "{stored}");

    let fetches_before = audit_actions(&app, "fetch_rotated_key").await.len();
    let (status, got) = fetch(&app, &weekly).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["id"], weekly.as_str());
    assert_eq!(got["object"], "api-key");
    let new = got["key"].as_str().expect("the new key").to_owned();
    assert_ne!(new, weekly_old);
    assert!(!stored.contains(&new), "stored encrypted, not in clear");
    let rotated_at = parse(&got["rotated_at"]);
    assert!(
        (chrono::Utc::now() - rotated_at).num_seconds().abs() < 60,
        "{got}"
    );
    let until = parse(&got["key_transition_expires_at"]);
    assert_eq!(
        (until - rotated_at).num_minutes(),
        60,
        "the policy's transition: {got}"
    );
    // Once only.
    let (status, body) = fetch(&app, &weekly).await;
    assert_eq!((status, code(&body)), (404, "AB08"), "{body}");
    assert_eq!(
        audit_actions(&app, "fetch_rotated_key").await.len(),
        fetches_before + 1
    );
    let cleared: Option<String> =
        sqlx::query_scalar("SELECT rotated_key FROM api_keys WHERE id = $1")
            .bind(&weekly)
            .fetch_one(app.store.db().pool())
            .await
            .unwrap();
    assert_eq!(cleared, None);

    // The new value is in the snapshot at once, the old one until its transition ends.
    let (hash, mask) = app.store.api_key_at_rest(&weekly).await.unwrap().unwrap();
    assert_eq!(hash, admin::keys::hash(&new));
    assert_eq!(shown(&app, &weekly).await["key"], mask.as_str());
    assert_eq!(
        published
            .api_key(&digest(&new))
            .expect("new")
            .id
            .to_string(),
        weekly
    );
    assert_eq!(
        published
            .api_key(&digest(&weekly_old))
            .expect("old, during the transition")
            .id
            .to_string(),
        weekly
    );
    let (status, _) = app.call("GET", "/v1/api-keys", Some(&new), None).await;
    assert_eq!(status, 200);

    // The next rotation is one week after the one made.
    let policy = &shown(&app, &weekly).await["rotation_policy"];
    assert_eq!(policy["rotation_period"], "weekly");
    assert_eq!(policy["key_transition_period_ms"], 3_600_000);
    assert_eq!(
        parse(&policy["next_rotation_at"]),
        parse(&json!(due_at)) + chrono::Duration::days(7),
        "{policy}"
    );

    // Without a period the key rotated once and has no next rotation; its new value waits,
    // and its old one works for the default 30 minutes.
    let policy = &shown(&app, &once).await["rotation_policy"];
    assert!(policy["next_rotation_at"].is_null(), "{policy}");
    let (status, got) = fetch(&app, &once).await;
    assert_eq!(status, 200, "{got}");
    let until = parse(&got["key_transition_expires_at"]);
    assert_eq!(
        (until - parse(&got["rotated_at"])).num_minutes(),
        30,
        "{got}"
    );
    assert!(published.api_key(&digest(&once_old)).is_some());

    // Keys not due, and keys without a policy, are untouched.
    for (id, before) in &untouched {
        assert_eq!(&shown(&app, id).await, before, "{id}");
        let (status, _) = fetch(&app, id).await;
        assert_eq!(status, 404);
    }
    assert_eq!(
        app.store.api_key_at_rest(&later).await.unwrap().unwrap().0,
        admin::keys::hash(&later_raw)
    );
    assert_eq!(
        app.store.api_key_at_rest(&plain).await.unwrap().unwrap().0,
        admin::keys::hash(&plain_raw)
    );
    assert_eq!(
        shown(&app, &later).await["rotation_policy"]["next_rotation_at"],
        later_at
    );

    // Each rotation is a system record of the audit log.
    let rotations = audit_actions(&app, "rotate").await;
    let mut rotated: Vec<&str> = rotations
        .iter()
        .map(|r| {
            assert_eq!(r["user_type"], "system", "{r}");
            r["resource_id"].as_str().unwrap()
        })
        .collect();
    rotated.sort();
    let mut want = vec![weekly.as_str(), once.as_str()];
    want.sort();
    assert_eq!(rotated, want);

    // When the transition ends, the old value stops working.
    app.sql(
        "UPDATE api_keys SET previous_key_expires_at = '2000-01-01T00:00:00.000000Z' WHERE id = $1",
        &[&weekly],
    )
    .await;
    rebuild(&app).await;
    assert!(published.api_key(&digest(&weekly_old)).is_none());
    assert_eq!(
        published
            .api_key(&digest(&new))
            .expect("new")
            .id
            .to_string(),
        weekly
    );
    let (status, _) = app
        .call("GET", "/v1/api-keys", Some(&weekly_old), None)
        .await;
    assert_eq!(status, 401);
}

async fn a_later_rotation_replaces_an_unread_value(db: TestDb) {
    let app = app_with_key(db).await;
    let published = app.store.published();
    let (id, original) = key_with(
        &app,
        "k",
        json!({"rotation_period": "monthly", "next_rotation_at": from_now(-1)}),
    )
    .await;
    assert_eq!(app.store.rotate_due_api_keys().await.unwrap(), 1);
    make_due(&app, &id, Some("monthly")).await;
    assert_eq!(app.store.rotate_due_api_keys().await.unwrap(), 1);
    // The second value is handed out; the first one is now the previous value, and the
    // original no longer works.
    let (status, got) = fetch(&app, &id).await;
    assert_eq!(status, 200, "{got}");
    let second = got["key"].as_str().unwrap().to_owned();
    assert_eq!(
        published
            .api_key(&digest(&second))
            .expect("current")
            .id
            .to_string(),
        id
    );
    assert!(published.api_key(&digest(&original)).is_none());
    let (status, _) = fetch(&app, &id).await;
    assert_eq!(status, 404);

    // A manual rotation drops an unread value: its caller gets the new key.
    make_due(&app, &id, None).await;
    assert_eq!(app.store.rotate_due_api_keys().await.unwrap(), 1);
    let (status, manual) = app
        .admin("POST", &format!("/v1/api-keys/{id}/rotate"), None)
        .await;
    assert_eq!(status, 200, "{manual}");
    let (status, body) = fetch(&app, &id).await;
    assert_eq!((status, code(&body)), (404, "AB08"), "{body}");
    let manual = manual["key"].as_str().unwrap();
    assert_eq!(
        published
            .api_key(&digest(manual))
            .expect("manual")
            .id
            .to_string(),
        id
    );

    // An expired key is not rotated, even when due.
    make_due(&app, &id, Some("weekly")).await;
    app.sql(
        "UPDATE api_keys SET expires_at = '2000-01-01T00:00:00.000000Z' WHERE id = $1",
        &[&id],
    )
    .await;
    assert_eq!(app.store.rotate_due_api_keys().await.unwrap(), 0);
    let (status, _) = fetch(&app, &id).await;
    assert_eq!(status, 404);
}

async fn concurrent_passes_rotate_each_key_once(db: TestDb) {
    let url = db.url.clone();
    let app = app_with_key(db).await;
    // A second instance on the same database, with the same secret key (SQLite's key file, or
    // the PostgreSQL tests' GW_SECRET_KEY).
    let secret_key = (!url.starts_with("sqlite")).then(test_key);
    let other = Store::open_with(
        &url,
        DataPlaneOptions {
            secret_key,
            config_check: None,
            guardrail_check: None,
        },
    )
    .await
    .expect("a second instance");
    let mut ids = Vec::new();
    for i in 0..6 {
        let (id, _) = key_with(
            &app,
            &format!("k{i}"),
            json!({"rotation_period": "weekly", "next_rotation_at": from_now(-1 - i)}),
        )
        .await;
        ids.push(id);
    }
    for round in 0..3 {
        if round > 0 {
            for id in &ids {
                make_due(&app, id, Some("weekly")).await;
            }
        }
        let (a, b) = tokio::join!(app.store.rotate_due_api_keys(), other.rotate_due_api_keys());
        let (a, b) = (a.expect("a pass"), b.expect("a pass"));
        assert_eq!(a + b, ids.len(), "round {round}: {a} + {b}");
        assert_eq!(
            audit_actions(&app, "rotate").await.len(),
            ids.len() * (round + 1),
            "round {round}: one rotation per key"
        );
    }
    // Both instances see every key's new value, which is fetched once, even by two callers at
    // the same moment.
    app.store.refresh_data_plane().await.unwrap();
    other.refresh_data_plane().await.unwrap();
    for id in &ids {
        let ((s1, b1), (s2, b2)) = tokio::join!(fetch(&app, id), fetch(&app, id));
        let mut statuses = [s1, s2];
        statuses.sort();
        assert_eq!(statuses, [200, 404], "{b1} {b2}");
        let got = if s1 == 200 { b1 } else { b2 };
        let raw = got["key"].as_str().unwrap();
        assert_eq!(
            &app.store
                .published()
                .api_key(&digest(raw))
                .expect("here")
                .id
                .to_string(),
            id
        );
        assert_eq!(
            &other
                .published()
                .api_key(&digest(raw))
                .expect("there")
                .id
                .to_string(),
            id
        );
    }
    other.close().await;
}

async fn rotation_needs_the_secret_key(db: TestDb) {
    let app = App::start(db).await;
    if app.store.has_secret_key() {
        // SQLite keeps a key file beside its database: there is always a key.
        eprintln!("rotation_needs_the_secret_key: the store has a key file; nothing to check");
        return;
    }
    let (id, raw) = key_with(
        &app,
        "k",
        json!({"rotation_period": "weekly", "next_rotation_at": from_now(-1)}),
    )
    .await;
    let err = app.store.rotate_due_api_keys().await.unwrap_err();
    assert!(err.message.contains("GW_SECRET_KEY"), "{}", err.message);
    assert_eq!(
        app.store.api_key_at_rest(&id).await.unwrap().unwrap().0,
        admin::keys::hash(&raw),
        "not rotated without a place for the new value"
    );
}

crate::on_both_databases!(
    a_due_key_is_rotated_and_its_new_value_handed_out_once,
    a_later_rotation_replaces_an_unread_value,
    concurrent_passes_rotate_each_key_once,
    rotation_needs_the_secret_key,
);
