//! The access part of the data plane's snapshot: API keys by the SHA-256 of their raw value,
//! workspaces, active policies with their counted usage — present at once after every change
//! made through the control plane, absent once deleted, archived or expired.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use admin::authz::{OrgRole, WorkspaceRole};
use plugin_sdk::access::{
    Condition, CountedUsage, KeyKind, KeyStatus, PeriodicReset, RateLimit, RateLimitKind, RateUnit,
    UsageKind,
};
use plugin_sdk::AccessStore;
use serde_json::{json, Value};

use crate::common::{digest, rebuild, App, TestDb, ADMIN_KEY};

const SERVICE: &str = "/v1/api-keys/workspace/service";

async fn ok(app: &App, method: &str, path: &str, body: Option<Value>) -> Value {
    let (status, got) = app.admin(method, path, body).await;
    assert_eq!(status, 200, "{method} {path}: {got}");
    got
}

async fn keys_follow_every_change(db: TestDb) {
    let app = App::start(db).await;
    let published = app.store.published();
    // The bootstrap key is there from the first snapshot after bootstrap.
    let admin = published
        .api_key(&digest(ADMIN_KEY))
        .expect("the admin key");
    assert_eq!(admin.id.to_string(), app.admin_key_id);
    assert_eq!(admin.kind, KeyKind::OrganisationService);
    assert_eq!(admin.workspace_id, None);
    assert_eq!(admin.organisation_id.to_string(), app.org);
    assert!(admin.scopes.iter().any(|s| s == "logs.export"));

    let config = ok(
        &app,
        "POST",
        "/v1/configs",
        Some(json!({"name": "default", "config": {}})),
    )
    .await;
    let config_slug = config["slug"].as_str().unwrap().to_owned();
    let before = published.version();
    let (id, raw) = app
        .key(
            ADMIN_KEY,
            SERVICE,
            json!({
                "name": "svc", "workspace_id": app.default_ws,
                "scopes": ["completions.write", "logs.list"],
                "rate_limits": [{"type": "requests", "unit": "rpm", "value": 10}],
                "usage_limits": {"credit_limit": 50, "type": "tokens", "alert_threshold": 40,
                                 "periodic_reset": "weekly"},
                "defaults": {"metadata": {"team": "a"}, "config_id": config_slug,
                             "allow_config_override": false},
            }),
        )
        .await;
    assert!(published.version() > before, "a new key bumps the version");
    let k = published
        .api_key(&digest(&raw))
        .expect("a new key is in this instance's snapshot at once");
    assert_eq!(k.id.to_string(), id);
    assert_eq!(k.workspace_id.as_deref(), Some(app.default_ws.as_str()));
    assert_eq!(k.kind, KeyKind::WorkspaceService);
    assert_eq!(k.status, KeyStatus::Active);
    assert_eq!(k.scopes.to_vec(), ["completions.write", "logs.list"]);
    assert_eq!(
        k.rate_limits,
        [RateLimit {
            kind: RateLimitKind::Requests,
            unit: RateUnit::Rpm,
            value: 10.0
        }]
    );
    let budget = k.usage_limits.clone().expect("a budget");
    assert_eq!(budget.credit_limit, 50.0);
    assert_eq!(budget.kind, UsageKind::Tokens);
    assert_eq!(budget.alert_threshold, Some(40.0));
    assert_eq!(budget.periodic_reset, Some(PeriodicReset::Weekly));
    assert_eq!(k.counted, CountedUsage::default());
    assert_eq!(k.defaults.metadata["team"], "a");
    assert_eq!(k.defaults.config_id.as_deref(), Some(config_slug.as_str()));
    assert_eq!(k.defaults.allow_config_override, Some(false));
    // Keys expire after a year unless their creator says otherwise.
    let expires = k.expires_at.expect("a default expiry");
    assert!(expires > SystemTime::now() + Duration::from_secs(364 * 86_400));
    assert!(published.api_key(&digest("not-a-key")).is_none());

    // An update is seen at once.
    let path = format!("/v1/api-keys/{id}");
    ok(
        &app,
        "PUT",
        &path,
        Some(json!({"scopes": ["completions.write"]})),
    )
    .await;
    let k = published.api_key(&digest(&raw)).unwrap();
    assert_eq!(k.scopes.to_vec(), ["completions.write"]);

    // A reset starts a new epoch.
    ok(&app, "PUT", &path, Some(json!({"reset_usage": true}))).await;
    assert_eq!(
        published
            .api_key(&digest(&raw))
            .unwrap()
            .counted
            .reset_epoch,
        1
    );

    // Rotation: the new value at once, the previous one until its transition ends.
    let rotated = ok(&app, "POST", &format!("{path}/rotate"), Some(json!({}))).await;
    let new_raw = rotated["key"].as_str().unwrap().to_owned();
    assert_eq!(
        published.api_key(&digest(&new_raw)).unwrap().id.to_string(),
        id
    );
    assert_eq!(
        published.api_key(&digest(&raw)).map(|k| k.id.to_string()),
        Some(id.clone()),
        "the previous value works during the transition"
    );
    let (_, stored) = published.api_key_with_digest(&digest(&raw)).unwrap();
    assert_eq!(stored, digest(&raw), "found under the previous digest");
    // The transition ends a second from now: the lookup itself checks the time.
    let soon = admin::time::format(admin::time::now() + chrono::Duration::milliseconds(1200));
    app.sql(
        "UPDATE api_keys SET previous_key_expires_at = $1 WHERE id = $2",
        &[&soon, &id],
    )
    .await;
    rebuild(&app).await;
    assert!(published.api_key(&digest(&raw)).is_some());
    let version = published.version();
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert_eq!(published.version(), version, "no rebuild in between");
    assert!(
        published.api_key(&digest(&raw)).is_none(),
        "the previous value stops at the end of its transition"
    );
    assert!(published.api_key(&digest(&new_raw)).is_some());

    // Expiry: the worker's sweep marks it expired; the snapshot keeps it, marked.
    let past = admin::time::format(admin::time::now() - chrono::Duration::seconds(5));
    app.sql(
        "UPDATE api_keys SET expires_at = $1 WHERE id = $2",
        &[&past, &id],
    )
    .await;
    assert_eq!(app.store.expire_api_keys().await.unwrap(), 1);
    let k = published
        .api_key(&digest(&new_raw))
        .expect("expired keys stay");
    assert_eq!(k.status, KeyStatus::Expired);
    assert!(k.expires_at.unwrap() < SystemTime::now());

    // Deletion: gone at once.
    ok(&app, "DELETE", &path, None).await;
    assert!(published.api_key(&digest(&new_raw)).is_none());
}

/// Keys made or removed by other writes: a member's removal and a user's deletion take their
/// user keys out of the snapshot.
async fn keys_leave_with_their_users(db: TestDb) {
    let app = App::start(db).await;
    let published = app.store.published();
    let ws = app.workspace("Team").await;
    let alice = app
        .user(
            "alice@example.com",
            OrgRole::Member,
            Some((&ws, WorkspaceRole::Member)),
        )
        .await;
    let bob = app
        .user(
            "bob@example.com",
            OrgRole::Member,
            Some((&ws, WorkspaceRole::Member)),
        )
        .await;
    let (_, alice_key) = app.user_key(&ws, &alice, &["completions.write"]).await;
    let (_, bob_key) = app.user_key(&ws, &bob, &["completions.write"]).await;
    let k = published.api_key(&digest(&alice_key)).unwrap();
    assert_eq!(k.kind, KeyKind::WorkspaceUser);
    assert_eq!(k.user_id.as_deref(), Some(alice.as_str()));

    ok(
        &app,
        "DELETE",
        &format!("/v1/admin/workspaces/{ws}/users/{alice}"),
        None,
    )
    .await;
    assert!(published.api_key(&digest(&alice_key)).is_none());
    assert!(published.api_key(&digest(&bob_key)).is_some());
    ok(&app, "DELETE", &format!("/v1/admin/users/{bob}"), None).await;
    assert!(published.api_key(&digest(&bob_key)).is_none());
}

async fn workspaces_follow_every_change(db: TestDb) {
    let app = App::start(db).await;
    let published = app.store.published();
    let default = published
        .workspace(&app.default_ws)
        .expect("the default workspace");
    assert_eq!(default.slug, "default");
    assert!(default.usage_limits.is_empty());

    let made = ok(
        &app,
        "POST",
        "/v1/admin/workspaces",
        Some(json!({
            "name": "Team", "slug": "team",
            "defaults": {"metadata": {"env": "prod"}, "input_guardrails": ["pg-a"]},
            "rate_limits": [{"type": "tokens", "unit": "rpd", "value": 1000}],
            "usage_limits": [{"credit_limit": 5}, {"credit_limit": 100, "periodic_reset": "monthly"}],
        })),
    )
    .await;
    let id = made["id"].as_str().unwrap().to_owned();
    let ws = published.workspace(&id).expect("a new workspace at once");
    assert_eq!(ws.slug, "team");
    assert_eq!(ws.organisation_id, app.org);
    assert_eq!(ws.defaults.metadata["env"], "prod");
    assert_eq!(ws.defaults.input_guardrails, [json!("pg-a")]);
    assert!(ws.defaults.output_guardrails.is_empty());
    assert_eq!(ws.rate_limits[0].kind, RateLimitKind::Tokens);
    assert_eq!(ws.rate_limits[0].unit, RateUnit::Rpd);
    assert_eq!(ws.usage_limits.len(), 2);
    assert_eq!(ws.usage_limits[0].credit_limit, 5.0);
    assert_eq!(ws.usage_limits[0].kind, UsageKind::Cost);
    assert_eq!(
        ws.usage_limits[1].periodic_reset,
        Some(PeriodicReset::Monthly)
    );
    assert_eq!(ws.counted, [CountedUsage::default(); 2]);

    ok(
        &app,
        "PUT",
        &format!("/v1/admin/workspaces/{id}"),
        Some(json!({"defaults": {"output_guardrails": ["pg-b"]}, "usage_limits": []})),
    )
    .await;
    let ws = published.workspace(&id).unwrap();
    assert_eq!(ws.defaults.output_guardrails, [json!("pg-b")]);
    assert!(ws.defaults.metadata.is_empty());
    assert!(ws.usage_limits.is_empty() && ws.counted.is_empty());

    ok(&app, "DELETE", &format!("/v1/admin/workspaces/{id}"), None).await;
    assert!(published.workspace(&id).is_none());
}

async fn policies_follow_every_change(db: TestDb) {
    let app = App::start(db).await;
    let published = app.store.published();
    assert!(published.rate_limit_policies().is_empty());
    let rate = ok(
        &app,
        "POST",
        "/v1/policies/rate-limits",
        Some(json!({
            "name": "per user", "workspace_id": "default",
            "conditions": [{"key": "metadata._user", "value": "*", "excludes": ["bot"]},
                           {"key": "model", "value": "gpt-4o,gpt-4o-mini"}],
            "group_by": [{"key": "metadata._user"}, {"key": "model"}],
            "type": "requests", "unit": "rph", "value": 100,
        })),
    )
    .await;
    let rate_id = rate["id"].as_str().unwrap().to_owned();
    let got = published.rate_limit_policies();
    assert_eq!(got.len(), 1);
    let p = &got[0];
    assert_eq!(p.id, rate_id);
    assert_eq!(p.workspace_id, app.default_ws);
    assert_eq!(p.name.as_deref(), Some("per user"));
    assert_eq!(
        p.conditions,
        [
            Condition {
                key: "metadata._user".into(),
                value: "*".into(),
                excludes: Some(vec!["bot".into()])
            },
            Condition {
                key: "model".into(),
                value: "gpt-4o,gpt-4o-mini".into(),
                excludes: None
            },
        ]
    );
    assert_eq!(p.group_by, ["metadata._user", "model"]);
    assert_eq!(
        p.limit,
        RateLimit {
            kind: RateLimitKind::Requests,
            unit: RateUnit::Rph,
            value: 100.0
        }
    );
    ok(
        &app,
        "PUT",
        &format!("/v1/policies/rate-limits/{rate_id}"),
        Some(json!({"value": 7})),
    )
    .await;
    assert_eq!(published.rate_limit_policies()[0].limit.value, 7.0);
    ok(
        &app,
        "DELETE",
        &format!("/v1/policies/rate-limits/{rate_id}"),
        None,
    )
    .await;
    assert!(
        published.rate_limit_policies().is_empty(),
        "an archived policy no longer applies"
    );

    let usage = ok(
        &app,
        "POST",
        "/v1/policies/usage-limits",
        Some(json!({
            "workspace_id": "default", "conditions": [{"key": "workspace_id", "value": "*"}],
            "group_by": [{"key": "metadata._user"}], "type": "cost", "credit_limit": 10,
            "alert_threshold": 8, "periodic_reset_days": 7,
        })),
    )
    .await;
    let usage_id = usage["id"].as_str().unwrap().to_owned();
    let p = published.usage_limit_policies()[0].clone();
    assert_eq!(p.id, usage_id);
    assert_eq!(p.limit.credit_limit, 10.0);
    assert_eq!(p.limit.periodic_reset_days, Some(7));
    assert_eq!(p.limit.alert_threshold, Some(8.0));
    assert!(p.usage.is_empty());

    // A charge does not rebuild the snapshot; the next change through the API brings it in.
    let version = published.version();
    app.store
        .charge_usage_limits_policy(&usage_id, "metadata._user:alice", 2.5)
        .await
        .unwrap();
    assert_eq!(
        published.version(),
        version,
        "charges do not bump the version"
    );
    ok(
        &app,
        "PUT",
        &format!("/v1/policies/usage-limits/{usage_id}"),
        Some(json!({"credit_limit": 20})),
    )
    .await;
    let p = published.usage_limit_policies()[0].clone();
    assert_eq!(p.limit.credit_limit, 20.0);
    let alice = p.usage["metadata._user:alice"];
    assert_eq!(alice.current_usage, 2.5);
    assert_eq!(alice.period, p.limit.period_at(SystemTime::now()));
    assert_eq!(alice.reset_epoch, 0);

    // An entity reset: usage 0 in a new epoch, at once.
    ok(
        &app,
        "PUT",
        &format!("/v1/policies/usage-limits/{usage_id}/entities/metadata._user:alice/reset"),
        None,
    )
    .await;
    let alice = published.usage_limit_policies()[0].usage["metadata._user:alice"];
    assert_eq!((alice.current_usage, alice.reset_epoch), (0.0, 1));
    ok(
        &app,
        "PUT",
        &format!("/v1/policies/usage-limits/{usage_id}"),
        Some(json!({"reset_usage_for_value": "metadata._user:alice"})),
    )
    .await;
    let alice = published.usage_limit_policies()[0].usage["metadata._user:alice"];
    assert_eq!(alice.reset_epoch, 2);

    ok(
        &app,
        "DELETE",
        &format!("/v1/policies/usage-limits/{usage_id}"),
        None,
    )
    .await;
    assert!(published.usage_limit_policies().is_empty());
}

/// A key exhausted in a reset period that has since elapsed is active again, in the snapshot
/// and in the API, without anything being written.
async fn an_elapsed_period_reactivates(db: TestDb) {
    let app = App::start(db).await;
    let published = app.store.published();
    let (id, raw) = app
        .key(
            ADMIN_KEY,
            SERVICE,
            json!({"name": "svc", "workspace_id": "default", "scopes": ["completions.write"],
                   "usage_limits": {"credit_limit": 5, "periodic_reset": "monthly"}}),
        )
        .await;
    let period = published
        .api_key(&digest(&raw))
        .unwrap()
        .usage_limits
        .clone()
        .unwrap()
        .period_at(SystemTime::now());
    let last_month = (period - 1).to_string();
    app.sql(
        &format!(
            "UPDATE api_keys SET status = 'exhausted', current_usage = 7, usage_period = {last_month}
             WHERE id = $1"
        ),
        &[&id],
    )
    .await;
    rebuild(&app).await;
    let k = published.api_key(&digest(&raw)).unwrap();
    assert_eq!(k.status, KeyStatus::Active);
    assert_eq!(k.counted.in_period(period), 0.0);
    let got = ok(&app, "GET", &format!("/v1/api-keys/{id}"), None).await;
    assert_eq!(got["status"], "active");
    assert_eq!(got["usage_limits"]["current_usage"], 0.0);
    // In the current period, the same stored state is exhausted.
    app.sql(
        &format!("UPDATE api_keys SET usage_period = {period} WHERE id = $1"),
        &[&id],
    )
    .await;
    rebuild(&app).await;
    assert_eq!(
        published.api_key(&digest(&raw)).unwrap().status,
        KeyStatus::Exhausted
    );
    let got = ok(&app, "GET", &format!("/v1/api-keys/{id}"), None).await;
    assert_eq!(got["status"], "exhausted");
    assert_eq!(got["usage_limits"]["current_usage"], 7.0);
}

/// What keys repeat (organisation and workspace ids, a scope list, empty defaults) is held once
/// in the snapshot, whether the keys were applied one change at a time or read all at once.
async fn keys_share_what_they_repeat(db: TestDb) {
    let app = App::start(db).await;
    let published = app.store.published();
    let body =
        || json!({"name": "svc", "workspace_id": app.default_ws, "scopes": ["completions.write"]});
    let (_, first) = app.key(ADMIN_KEY, SERVICE, body()).await;
    let (_, second) = app.key(ADMIN_KEY, SERVICE, body()).await;
    let shared = |published: &admin::store::Published| {
        let a = published.api_key(&digest(&first)).unwrap();
        let b = published.api_key(&digest(&second)).unwrap();
        assert!(Arc::ptr_eq(&a.organisation_id, &b.organisation_id));
        assert!(Arc::ptr_eq(
            a.workspace_id.as_ref().unwrap(),
            b.workspace_id.as_ref().unwrap()
        ));
        assert!(Arc::ptr_eq(&a.scopes, &b.scopes));
        assert!(Arc::ptr_eq(&a.defaults, &b.defaults));
        assert!(!Arc::ptr_eq(&a.id, &b.id));
    };
    shared(&published);
    rebuild(&app).await;
    shared(&published);
}

crate::on_both_databases!(
    keys_share_what_they_repeat,
    keys_follow_every_change,
    keys_leave_with_their_users,
    workspaces_follow_every_change,
    policies_follow_every_change,
    an_elapsed_period_reactivates,
);
