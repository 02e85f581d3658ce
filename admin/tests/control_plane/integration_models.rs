//! `GET/PUT /v1/integrations/{slug}/models`: models listed and upserted (one per id in any
//! case), custom prices checked and carried to every provider of the integration in the data
//! plane's snapshot, audited, refused input naming the field, and the integration's rights.

use admin::authz::{OrgRole, WorkspaceRole};
use plugin_sdk::store::{ModelPrice, ProviderStore};
use serde_json::{json, Value};

use crate::common::{App, TestDb, ADMIN_KEY};
use crate::integrations::{app_with_key, create_integration};

const ALL_TIME: &str = "start_time=2000-01-01T00:00:00Z&end_time=2999-01-01T00:00:00Z";

fn code(body: &Value) -> &str {
    body["data"]["errorCode"].as_str().unwrap_or_default()
}

fn message(body: &Value) -> &str {
    body["data"]["message"].as_str().unwrap_or_default()
}

fn priced(model: &str, input: f64, output: f64) -> ModelPrice {
    ModelPrice {
        model: model.into(),
        input_per_million: input,
        output_per_million: output,
    }
}

async fn models(app: &App, slug: &str) -> Value {
    let (status, got) = app
        .admin("GET", &format!("/v1/integrations/{slug}/models"), None)
        .await;
    assert_eq!(status, 200, "{got}");
    got
}

async fn listed_upserted_and_priced_in_the_data_plane(db: TestDb) {
    let app = app_with_key(db).await;
    create_integration(
        &app,
        json!({"name": "Priced", "slug": "priced", "ai_provider_id": "openai", "key": "sk-priced-123456"}),
    )
    .await;
    let (status, _) = app
        .admin(
            "POST",
            "/v1/providers",
            Some(json!({"name": "second", "integration_id": "priced", "slug": "priced-2"})),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        models(&app, "priced").await,
        json!({"object": "list", "total": 0, "data": []})
    );

    let version = app.store.published().version();
    let before = app.audit_count().await;
    let path = "/v1/integrations/priced/models";
    let (status, got) = app
        .admin(
            "PUT",
            path,
            Some(json!({"models": [
                {"slug": "gpt-4o", "enabled": true, "pricing_config": {"input_per_million": 2.5, "output_per_million": 10}},
                {"slug": "gpt-4o-mini", "enabled": false},
                {"slug": "Custom-1", "enabled": true, "pricing_config": {"input_per_million": 0, "output_per_million": 0.5}},
            ]})),
        )
        .await;
    assert_eq!((status, &got), (200, &json!({})));
    assert_eq!(app.audit_count().await, before + 1);
    let got = models(&app, "priced").await;
    assert_eq!(
        got,
        json!({"object": "list", "total": 3, "data": [
            {"slug": "Custom-1", "enabled": true, "pricing_config": {"input_per_million": 0.0, "output_per_million": 0.5}, "object": "integration-model"},
            {"slug": "gpt-4o", "enabled": true, "pricing_config": {"input_per_million": 2.5, "output_per_million": 10.0}, "object": "integration-model"},
            {"slug": "gpt-4o-mini", "enabled": false, "pricing_config": null, "object": "integration-model"},
        ]})
    );

    // The data plane has the priced models at once, on every provider of the integration.
    let published = app.store.published();
    assert!(published.version() > version, "the version was bumped");
    for slug in ["priced", "priced-2"] {
        let record = published.provider(slug).expect("served");
        assert_eq!(
            record.model_prices,
            vec![priced("Custom-1", 0.0, 0.5), priced("gpt-4o", 2.5, 10.0)],
            "{slug}"
        );
    }

    // An upsert: the same model in another case replaces it; `null` removes a price; models
    // not listed stay.
    let (status, _) = app
        .admin(
            "PUT",
            path,
            Some(json!({"models": [
                {"slug": "GPT-4o", "enabled": false, "pricing_config": {"input_per_million": 3, "output_per_million": 12}},
                {"slug": "custom-1", "enabled": true, "pricing_config": null},
            ]})),
        )
        .await;
    assert_eq!(status, 200);
    let got = models(&app, "priced").await;
    assert_eq!(got["total"], 3, "{got}");
    assert_eq!(got["data"][0]["slug"], "custom-1", "{got}");
    assert_eq!(got["data"][0]["pricing_config"], Value::Null, "{got}");
    assert_eq!(got["data"][1]["slug"], "GPT-4o", "{got}");
    assert_eq!(got["data"][1]["enabled"], false, "{got}");
    assert_eq!(got["data"][2]["slug"], "gpt-4o-mini", "{got}");
    assert_eq!(
        published.provider("priced").unwrap().model_prices,
        vec![priced("GPT-4o", 3.0, 12.0)],
        "a disabled model keeps its price"
    );
    // Pages.
    let (_, page) = app
        .admin("GET", &format!("{path}?page_size=1&current_page=2"), None)
        .await;
    assert_eq!(page["total"], 3, "{page}");
    assert_eq!(page["data"][0]["slug"], "gpt-4o-mini", "{page}");

    // Audited as the integration's update, with the body.
    let (_, log) = app
        .admin(
            "GET",
            &format!("/v1/audit-logs?{ALL_TIME}&action=update_models"),
            None,
        )
        .await;
    assert_eq!(log["total"], 2, "{log}");
    let r = &log["records"][0];
    assert_eq!(r["resource_type"], "integration");
    assert_eq!(r["uri"], path);
    assert_eq!(r["request_body"]["models"][0]["slug"], "GPT-4o");
    let (_, integration) = app.admin("GET", "/v1/integrations/priced", None).await;
    assert_eq!(r["resource_id"], integration["id"]);

    // Deleting the integration takes its models.
    let (status, _) = app.admin("DELETE", "/v1/integrations/priced", None).await;
    assert_eq!(status, 200);
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM integration_models")
        .fetch_one(app.store.db().pool())
        .await
        .unwrap();
    assert_eq!(n, 0);
}

async fn bad_input(db: TestDb) {
    let app = app_with_key(db).await;
    create_integration(
        &app,
        json!({"name": "m", "slug": "m", "ai_provider_id": "openai", "create_default_provider": false}),
    )
    .await;
    let path = "/v1/integrations/m/models";
    let long = "x".repeat(256);
    let cases = [
        (json!({}), "missing field `models`"),
        (json!({"models": [{"slug": "a"}]}), "models[0]: missing field `enabled`"),
        (
            json!({"models": [{"slug": "a", "enabled": "yes"}]}),
            "models[0].enabled: invalid type",
        ),
        (
            json!({"models": [{"slug": "", "enabled": true}]}),
            "models[0].slug: a model id is 1 to 255 printable characters without spaces",
        ),
        (
            json!({"models": [{"slug": "a", "enabled": true}, {"slug": long, "enabled": true}]}),
            "models[1].slug: must be at most 255 characters, got 256",
        ),
        (
            json!({"models": [{"slug": "gpt 4", "enabled": true}]}),
            "models[0].slug: a model id is",
        ),
        (
            json!({"models": [{"slug": "a", "enabled": true}, {"slug": "A", "enabled": true}]}),
            "models[1].slug: repeats models[0]",
        ),
        (
            json!({"models": [{"slug": "a", "enabled": true, "pricing_config": {"input_per_million": -0.5, "output_per_million": 1}}]}),
            "models[0].pricing_config.input_per_million: must be a number of US dollars, 0 or more, got -0.5",
        ),
        (
            json!({"models": [{"slug": "a", "enabled": true, "pricing_config": {"input_per_million": 1}}]}),
            "models[0].pricing_config: missing field `output_per_million`",
        ),
        (
            json!({"models": [{"slug": "a", "enabled": true, "pricing_config": {"input_per_million": 1, "output_per_million": 1, "currency": "EUR"}}]}),
            "models[0].pricing_config.currency: unknown field",
        ),
        (
            json!({"models": [{"slug": "a", "enabled": true, "custom": true}]}),
            "models[0].custom: unknown field",
        ),
    ];
    let before = app.audit_count().await;
    for (body, want) in cases {
        let (status, got) = app.admin("PUT", path, Some(body.clone())).await;
        assert_eq!((status, code(&got)), (400, "AB01"), "{body}: {got}");
        assert!(message(&got).contains(want), "want {want:?}: {got}");
    }
    let many: Vec<Value> = (0..1001)
        .map(|i| json!({"slug": format!("m{i}"), "enabled": true}))
        .collect();
    let (status, got) = app
        .admin("PUT", path, Some(json!({ "models": many })))
        .await;
    assert_eq!((status, code(&got)), (400, "AB01"), "{got}");
    assert!(
        message(&got).starts_with("models: at most 1000 models per request"),
        "{got}"
    );
    assert_eq!(app.audit_count().await, before, "nothing was changed");
    assert_eq!(models(&app, "m").await["total"], 0);
    for (method, body) in [
        ("GET", None),
        (
            "PUT",
            Some(json!({"models": [{"slug": "a", "enabled": true}]})),
        ),
    ] {
        let (status, got) = app
            .admin(method, "/v1/integrations/nowhere/models", body)
            .await;
        assert_eq!((status, code(&got)), (404, "AB08"), "{method}: {got}");
    }
    let (status, got) = app
        .admin("GET", &format!("{path}?page_size=101"), None)
        .await;
    assert_eq!((status, code(&got)), (400, "AB01"), "{got}");
}

/// Reading models takes the right to read the integration; changing them the right to update
/// it.
async fn authorisation(db: TestDb) {
    let app = app_with_key(db).await;
    let ws = app.workspace("Team").await;
    let scopes = [
        "workspace_integrations.read",
        "workspace_integrations.update",
        "workspace_integrations.create",
        "providers.create",
    ];
    let (_, manager) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/workspace/service",
            json!({"name": "m", "workspace_id": ws, "scopes": scopes}),
        )
        .await;
    let (_, reader) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/workspace/service",
            json!({"name": "r", "workspace_id": ws, "scopes": ["workspace_integrations.read"]}),
        )
        .await;
    let member_user = app
        .user(
            "member@example.com",
            OrgRole::Member,
            Some((&ws, WorkspaceRole::Member)),
        )
        .await;
    let (_, member) = app.user_key(&ws, &member_user, &scopes).await;
    let (status, made) = app
        .call(
            "POST",
            "/v1/integrations",
            Some(&manager),
            Some(json!({"name": "Team", "slug": "team", "ai_provider_id": "openai", "key": "sk-team-123456"})),
        )
        .await;
    assert_eq!(status, 200, "{made}");
    let set = json!({"models": [{"slug": "gpt-4o", "enabled": true}]});
    let path = "/v1/integrations/team/models";

    // The workspace's manager reads and changes; a reader and a member only read.
    let (status, got) = app
        .call("PUT", path, Some(&manager), Some(set.clone()))
        .await;
    assert_eq!((status, &got), (200, &json!({})));
    for key in [&manager, &reader, &member] {
        let (status, got) = app.call("GET", path, Some(key), None).await;
        assert_eq!((status, &got["total"]), (200, &json!(1)), "{got}");
    }
    for (key, want) in [
        (&reader, "workspace_integrations.update"),
        (&member, "workspace members read"),
    ] {
        let (status, got) = app.call("PUT", path, Some(key), Some(set.clone())).await;
        assert_eq!((status, code(&got)), (403, "AB03"), "{got}");
        assert!(message(&got).contains(want), "{got}");
    }

    // An organisation integration: the admin key's; a workspace key it is shared with reads
    // its models but does not change them; one it is not shared with does not see it.
    create_integration(
        &app,
        json!({"name": "Org", "slug": "org", "ai_provider_id": "openai", "create_default_provider": false}),
    )
    .await;
    let org_path = "/v1/integrations/org/models";
    let (status, _) = app.call("GET", org_path, Some(&manager), None).await;
    assert_eq!(status, 404, "not shared");
    let (status, _) = app
        .admin(
            "PUT",
            "/v1/integrations/org/workspaces",
            Some(json!({"workspaces": [{"id": ws, "enabled": true, "create_default_provider": false}]})),
        )
        .await;
    assert_eq!(status, 200);
    let (status, _) = app.call("GET", org_path, Some(&manager), None).await;
    assert_eq!(status, 200, "shared: read");
    let (status, got) = app
        .call("PUT", org_path, Some(&manager), Some(set.clone()))
        .await;
    assert_eq!((status, code(&got)), (403, "AB03"), "{got}");
    let (status, _) = app.admin("PUT", org_path, Some(set)).await;
    assert_eq!(status, 200);
    assert_eq!(models(&app, "org").await["total"], 1);
}

crate::on_both_databases!(
    listed_upserted_and_priced_in_the_data_plane,
    bad_input,
    authorisation,
);
