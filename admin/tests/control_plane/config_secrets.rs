//! Secrets inside saved configs (issue 20): encrypted at rest, masked wherever the control
//! plane shows a config (get, list, versions, the audit log), in clear in the data plane's
//! snapshot; a mask sent back keeps the stored secret; versions written before sealing are
//! sealed when the store starts with its key.

use admin::authz::{OrgRole, WorkspaceRole};
use admin::store::DataPlaneOptions;
use serde_json::{json, Value};

use crate::common::{rebuild, App, TestDb};
use crate::integrations::app_with_key;

const TOP_KEY: &str = "sk-top-level-secret-0001";
const NESTED_KEY: &str = "sk-nested-target-secret-0002";
const AWS_ID: &str = "AKIAEXAMPLESECRET03";
const AWS_SECRET: &str = "aws/secret+access+key+0004";
const AWS_TOKEN: &str = "aws-session-token-0005";
const VERTEX_PK: &str = "-----BEGIN PRIVATE KEY-----0006";
const HOOK_SECRET: &str = "Bearer hook-header-secret-0007";
const SECRETS: [&str; 7] = [
    TOP_KEY,
    NESTED_KEY,
    AWS_ID,
    AWS_SECRET,
    AWS_TOKEN,
    VERTEX_PK,
    HOOK_SECRET,
];

fn config() -> Value {
    json!({
        "strategy": {"mode": "fallback"},
        "api_key": TOP_KEY,
        "targets": [
            {"strategy": {"mode": "loadbalance"}, "targets": [
                {"provider": "openai", "api_key": NESTED_KEY, "weight": 1},
                {"provider": "vertex-ai", "vertex_region": "eu",
                 "vertex_service_account_json": {"type": "service_account", "private_key": VERTEX_PK}}
            ]},
            {"provider": "bedrock", "aws_access_key_id": AWS_ID, "aws_secret_access_key": AWS_SECRET,
             "aws_session_token": AWS_TOKEN, "aws_region": "us-east-1"}
        ],
        "before_request_hooks": [{"id": "hook", "checks": [{"id": "default.webhook",
            "parameters": {"webhookURL": "https://hooks.example/check",
                           "headers": {"Authorization": HOOK_SECRET}}}]}]
    })
}

/// Fails when `text` holds any of the secrets.
fn no_secret_in(what: &str, text: &str) {
    for s in SECRETS {
        assert!(!text.contains(s), "{what} shows {s}: {text}");
    }
}

fn code(body: &Value) -> &str {
    body["data"]["errorCode"].as_str().unwrap_or_default()
}

/// Every stored version of a config, as text: what is at rest.
async fn at_rest(app: &App, config_id: &str) -> String {
    let rows: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT config, secrets FROM config_versions WHERE config_id = $1 ORDER BY version",
    )
    .bind(config_id)
    .fetch_all(app.store.db().pool())
    .await
    .expect("read the versions");
    assert!(!rows.is_empty());
    rows.iter()
        .map(|(c, s)| format!("{c} {}", s.as_deref().unwrap_or("NULL")))
        .collect::<Vec<_>>()
        .join("\n")
}

async fn secrets_are_sealed_masked_and_served(db: TestDb) {
    let app = app_with_key(db).await;
    let ws = app.default_ws.clone();
    let member = app
        .user(
            "member@example.com",
            OrgRole::Member,
            Some((&ws, WorkspaceRole::Member)),
        )
        .await;
    let (_, member_key) = app
        .user_key(&ws, &member, &["configs.read", "configs.list"])
        .await;
    let (s, made) = app
        .admin(
            "POST",
            "/v1/configs",
            Some(json!({"name": "With secrets", "config": config()})),
        )
        .await;
    assert_eq!(s, 200, "{made}");
    let id = made["id"].as_str().unwrap().to_owned();
    let path = format!("/v1/configs/{id}");

    // At rest: masks in the body, ciphertexts beside it.
    let stored = at_rest(&app, &id).await;
    no_secret_in("the database", &stored);
    assert!(stored.contains("v1:"), "{stored}");

    // Read back: masked, the rest as written.
    for key in [admin_key(), member_key.as_str()] {
        let (s, got) = app.call("GET", &path, Some(key), None).await;
        assert_eq!(s, 200, "{got}");
        no_secret_in("GET", &got.to_string());
        let c = &got["config"];
        assert_eq!(c["api_key"], "sk*******01");
        assert_eq!(c["targets"][0]["targets"][0]["api_key"], "sk*******02");
        assert_eq!(c["targets"][0]["targets"][0]["weight"], 1);
        assert_eq!(
            c["targets"][0]["targets"][1]["vertex_service_account_json"],
            "*******"
        );
        assert_eq!(c["targets"][1]["aws_access_key_id"], "AK*******03");
        assert_eq!(c["targets"][1]["aws_region"], "us-east-1");
        let hook = &c["before_request_hooks"][0]["checks"][0]["parameters"];
        assert_eq!(hook["headers"]["Authorization"], "Be*******07");
        assert_eq!(hook["webhookURL"], "https://hooks.example/check");
        let (s, list) = app.call("GET", "/v1/configs", Some(key), None).await;
        assert_eq!(s, 200, "{list}");
        no_secret_in("the list", &list.to_string());
        assert_eq!(list["data"][0]["config"], *c);
    }

    // The data plane has them in clear.
    let snapshot = app.store.published().current();
    assert_eq!(*snapshot.config(&id).expect("served"), config());
    let slug = made["slug"].as_str().unwrap();
    assert_eq!(*snapshot.config(slug).expect("served"), config());

    // An update that sends the shown config back, with one secret changed: the others keep
    // their stored values.
    let (_, shown) = app.admin("GET", &path, None).await;
    let mut sent = shown["config"].clone();
    sent["targets"][0]["targets"][0]["api_key"] = json!("sk-a-new-nested-key-0008");
    sent["targets"][1]["aws_region"] = json!("eu-west-1");
    let (s, b) = app.admin("PUT", &path, Some(json!({"config": sent}))).await;
    assert_eq!(s, 200, "{b}");
    let mut want = config();
    want["targets"][0]["targets"][0]["api_key"] = json!("sk-a-new-nested-key-0008");
    want["targets"][1]["aws_region"] = json!("eu-west-1");
    let snapshot = app.store.published().current();
    assert_eq!(*snapshot.config(&id).unwrap(), want);
    let stored = at_rest(&app, &id).await;
    no_secret_in("the database", &stored);
    assert!(!stored.contains("sk-a-new-nested-key-0008"), "{stored}");
    // A rename copies the body and its secrets.
    let (s, _) = app
        .admin("PUT", &path, Some(json!({"name": "Renamed"})))
        .await;
    assert_eq!(s, 200);
    assert_eq!(*app.store.published().current().config(&id).unwrap(), want);

    // A mask that matches no stored secret is refused, not stored: a stale one (the nested
    // key has changed since `shown`), or a made-up one.
    let (s, b) = app
        .admin("PUT", &path, Some(json!({"config": shown["config"]})))
        .await;
    assert_eq!((s, code(&b)), (400, "AB01"), "{b}");
    assert!(
        b["data"]["message"]
            .as_str()
            .unwrap()
            .starts_with("config.targets[0].targets[0].api_key: is a masked value"),
        "{b}"
    );
    let (_, shown) = app.admin("GET", &path, None).await;
    let mut bad = shown["config"].clone();
    bad["targets"][1]["aws_secret_access_key"] = json!("zz*******zz");
    let (s, b) = app.admin("PUT", &path, Some(json!({"config": bad}))).await;
    assert_eq!((s, code(&b)), (400, "AB01"), "{b}");
    assert!(
        b["data"]["message"]
            .as_str()
            .unwrap()
            .starts_with("config.targets[1].aws_secret_access_key: is a masked value"),
        "{b}"
    );
    let (s, b) = app
        .admin(
            "POST",
            "/v1/configs",
            Some(json!({"name": "masked", "config": {"api_key": "sk*******01"}})),
        )
        .await;
    assert_eq!((s, code(&b)), (400, "AB01"), "{b}");

    // Versions: every one masked.
    let (s, versions) = app.admin("GET", &format!("{path}/versions"), None).await;
    assert_eq!(s, 200, "{versions}");
    assert_eq!(versions["total"], 3);
    no_secret_in("the versions", &versions.to_string());
    assert!(!versions.to_string().contains("sk-a-new-nested-key-0008"));

    // The audit log: the create and update records keep the bodies, masked.
    let (s, log) = app
        .admin(
            "GET",
            "/v1/audit-logs?start_time=2000-01-01T00:00:00Z&end_time=2999-01-01T00:00:00Z&resource_type=config",
            None,
        )
        .await;
    assert_eq!(s, 200, "{log}");
    let text = log.to_string();
    no_secret_in("the audit log", &text);
    assert!(!text.contains("sk-a-new-nested-key-0008"), "{text}");
    let records = log["records"].as_array().unwrap();
    assert!(records.len() >= 3, "{log}");
    let created = records
        .iter()
        .find(|r| r["action"] == "create")
        .expect("the create record");
    assert_eq!(
        created["request_body"]["config"]["targets"][1]["aws_access_key_id"], "AK*******03",
        "{created}"
    );
}

fn admin_key() -> &'static str {
    crate::common::ADMIN_KEY
}

/// A version written before secrets were sealed (secrets in clear, `secrets` NULL): masked
/// when read, served in clear, and sealed when the store starts again with its key.
async fn versions_from_before_are_sealed_at_start(db: TestDb) {
    let app = app_with_key(db).await;
    let (s, made) = app
        .admin(
            "POST",
            "/v1/configs",
            Some(json!({"name": "Old", "config": {"provider": "openai"}})),
        )
        .await;
    assert_eq!(s, 200, "{made}");
    let id = made["id"].as_str().unwrap().to_owned();
    let legacy = json!({"provider": "openai", "api_key": TOP_KEY});
    app.sql(
        "UPDATE config_versions SET config = $1, secrets = NULL WHERE config_id = $2",
        &[&legacy.to_string(), &id],
    )
    .await;
    rebuild(&app).await;
    let (s, got) = app.admin("GET", &format!("/v1/configs/{id}"), None).await;
    assert_eq!(s, 200, "{got}");
    assert_eq!(got["config"]["api_key"], "sk*******01", "{got}");
    let (_, versions) = app
        .admin("GET", &format!("/v1/configs/{id}/versions"), None)
        .await;
    no_secret_in("the versions", &versions.to_string());
    assert_eq!(
        *app.store.published().current().config(&id).unwrap(),
        legacy
    );
    assert!(at_rest(&app, &id).await.contains(TOP_KEY));

    // The store starts again with its key (kept when none is given): the version is sealed,
    // and still served.
    let store = app
        .store
        .clone()
        .with_data_plane(DataPlaneOptions {
            secret_key: None,
            config_check: None,
            guardrail_check: None,
        })
        .await
        .expect("the same key");
    let stored = at_rest(&app, &id).await;
    no_secret_in("the database", &stored);
    assert!(!stored.contains("NULL"), "{stored}");
    assert_eq!(*store.published().current().config(&id).unwrap(), legacy);
    assert_eq!(store.seal_legacy_config_secrets().await.unwrap(), 0, "once");
}

/// A manager who may update a config cannot send the secret an admin entered to a host of
/// their choosing by sending its mask back beside another host or provider.
async fn a_mask_does_not_move_its_secret_to_another_host(db: TestDb) {
    let app = app_with_key(db).await;
    let ws = app.default_ws.clone();
    let manager = app
        .user(
            "manager@example.com",
            OrgRole::Member,
            Some((&ws, WorkspaceRole::Manager)),
        )
        .await;
    let (_, manager_key) = app
        .user_key(&ws, &manager, &["configs.read", "configs.update"])
        .await;
    let entered = json!({"provider": "openai", "api_key": "sk-entered-by-an-admin-4242",
                         "custom_host": "https://llm.example/v1"});
    let (s, made) = app
        .admin(
            "POST",
            "/v1/configs",
            Some(json!({"name": "Admin's", "config": entered})),
        )
        .await;
    assert_eq!(s, 200, "{made}");
    let path = format!("/v1/configs/{}", made["id"].as_str().unwrap());
    let (s, shown) = app.call("GET", &path, Some(&manager_key), None).await;
    assert_eq!(s, 200, "{shown}");
    let mask = shown["config"]["api_key"].clone();
    assert_ne!(mask, "sk-entered-by-an-admin-4242");
    for moved in [
        json!({"provider": "openai", "api_key": mask, "custom_host": "https://attacker.example/v1"}),
        json!({"provider": "groq", "api_key": mask, "custom_host": "https://llm.example/v1"}),
        json!({"strategy": {"mode": "single"}, "custom_host": "https://attacker.example/v1",
               "targets": [{"provider": "openai", "api_key": mask}]}),
    ] {
        let (s, b) = app
            .call(
                "PUT",
                &path,
                Some(&manager_key),
                Some(json!({"config": moved})),
            )
            .await;
        assert_eq!((s, code(&b)), (400, "AB01"), "{b}");
        assert!(
            b["data"]["message"].as_str().unwrap().contains("api_key"),
            "{b}"
        );
    }
    // Sent back where it was, the mask keeps the secret.
    let (s, b) = app
        .call(
            "PUT",
            &path,
            Some(&manager_key),
            Some(json!({"config": shown["config"]})),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    let id = made["id"].as_str().unwrap();
    assert_eq!(
        app.store.published().current().config(id).unwrap()["api_key"],
        "sk-entered-by-an-admin-4242"
    );
}

crate::on_both_databases!(
    secrets_are_sealed_masked_and_served,
    versions_from_before_are_sealed_at_start,
    a_mask_does_not_move_its_secret_to_another_host,
);
