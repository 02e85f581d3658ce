//! The data plane's snapshot is kept current by applying each write's changes to it: after any
//! sequence of writes it must serve exactly what a snapshot read from every row serves, on the
//! instance that wrote and on one that catches up later, also after falling behind the change
//! log.

use std::sync::atomic::Ordering;

use admin::store::snapshot::{Check, Refresh};
use admin::store::Store;
use serde_json::{json, Value};

use crate::common::{App, TestDb, ADMIN_KEY};
use crate::integrations::app_with_key;

/// A small deterministic generator: a failing sequence is replayed from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a>(&mut self, from: &'a [String]) -> Option<&'a String> {
        (!from.is_empty()).then(|| &from[self.below(from.len())])
    }
}

/// What the sequence has made so far (ids or slugs, as the API names them).
#[derive(Default)]
struct Made {
    workspaces: Vec<String>,
    keys: Vec<String>,
    integrations: Vec<String>,
    providers: Vec<String>,
    configs: Vec<String>,
    guardrails: Vec<String>,
    rate_policies: Vec<String>,
    usage_policies: Vec<String>,
}

async fn ok(app: &App, method: &str, path: &str, body: Option<Value>) -> Value {
    let (status, got) = app.call(method, path, Some(ADMIN_KEY), body).await;
    assert_eq!(status, 200, "{method} {path}: {got}");
    got
}

/// One random write through the API; returns what it did, for the failure message.
async fn random_write(app: &App, rng: &mut Rng, made: &mut Made, n: usize) -> String {
    let ws = rng
        .pick(&made.workspaces)
        .cloned()
        .unwrap_or_else(|| app.default_ws.clone());
    match rng.below(20) {
        0 => {
            let got = ok(
                app,
                "POST",
                "/v1/admin/workspaces",
                Some(json!({"name": format!("ws {n}"),
                            "defaults": {"metadata": {"team": format!("t{n}")}}})),
            )
            .await;
            made.workspaces.push(got["id"].as_str().unwrap().into());
            "create workspace".into()
        }
        1 => {
            let body = json!({"defaults": {"metadata": {"team": format!("u{n}")}},
                              "rate_limits": [{"type": "requests", "unit": "rpm", "value": n + 1}]});
            ok(
                app,
                "PUT",
                &format!("/v1/admin/workspaces/{ws}"),
                Some(body),
            )
            .await;
            format!("update workspace {ws}")
        }
        2..=5 => {
            let got = ok(
                app,
                "POST",
                "/v1/api-keys/workspace/service",
                Some(json!({"name": format!("k{n}"), "workspace_id": ws,
                            "scopes": ["completions.write"],
                            "rate_limits": [{"type": "requests", "unit": "rpm", "value": 10}],
                            "defaults": {"metadata": {"n": n.to_string()}}})),
            )
            .await;
            made.keys.push(got["id"].as_str().unwrap().into());
            "create key".into()
        }
        6 => match rng.pick(&made.keys).cloned() {
            Some(id) => {
                let body = json!({"scopes": ["completions.write", "logs.list"],
                                  "usage_limits": {"credit_limit": n + 5, "type": "tokens"}});
                ok(app, "PUT", &format!("/v1/api-keys/{id}"), Some(body)).await;
                format!("update key {id}")
            }
            None => "nothing".into(),
        },
        7 => match rng.pick(&made.keys).cloned() {
            Some(id) => {
                ok(
                    app,
                    "POST",
                    &format!("/v1/api-keys/{id}/rotate"),
                    Some(json!({})),
                )
                .await;
                format!("rotate key {id}")
            }
            None => "nothing".into(),
        },
        8 => match made.keys.pop() {
            Some(id) => {
                ok(app, "DELETE", &format!("/v1/api-keys/{id}"), None).await;
                format!("delete key {id}")
            }
            None => "nothing".into(),
        },
        9 => {
            let slug = format!("integ-{n}");
            ok(
                app,
                "POST",
                "/v1/integrations",
                Some(
                    json!({"name": slug, "slug": slug, "ai_provider_id": "openai",
                            "key": format!("sk-{n}-123456789")}),
                ),
            )
            .await;
            made.integrations.push(slug);
            "create integration".into()
        }
        10 => match rng.pick(&made.integrations).cloned() {
            Some(slug) => {
                let body = json!({"models": [{"slug": "gpt-4o", "enabled": true,
                    "pricing_config": {"input_per_million": n, "output_per_million": 1}}]});
                ok(
                    app,
                    "PUT",
                    &format!("/v1/integrations/{slug}/models"),
                    Some(body),
                )
                .await;
                let body = json!({"key": format!("sk-new-{n}-123456789")});
                ok(app, "PUT", &format!("/v1/integrations/{slug}"), Some(body)).await;
                format!("price and rekey integration {slug}")
            }
            None => "nothing".into(),
        },
        11 => match rng.pick(&made.integrations).cloned() {
            Some(integration) => {
                let slug = format!("prov-{n}");
                ok(
                    app,
                    "POST",
                    "/v1/providers",
                    Some(
                        json!({"name": slug, "slug": slug, "integration_id": integration,
                                "workspace_id": app.default_ws,
                                "rate_limits": [{"type": "requests", "unit": "rpm", "value": 5}]}),
                    ),
                )
                .await;
                made.providers.push(slug);
                "create provider".into()
            }
            None => "nothing".into(),
        },
        12 => match rng.pick(&made.providers).cloned() {
            Some(slug) => {
                let body = json!({"usage_limits": {"credit_limit": n + 1, "type": "cost"}});
                ok(app, "PUT", &format!("/v1/providers/{slug}"), Some(body)).await;
                format!("update provider {slug}")
            }
            None => "nothing".into(),
        },
        13 => match made.providers.pop() {
            Some(slug) => {
                ok(app, "DELETE", &format!("/v1/providers/{slug}"), None).await;
                format!("delete provider {slug}")
            }
            None => "nothing".into(),
        },
        14 => {
            let got = ok(
                app,
                "POST",
                "/v1/configs",
                Some(
                    json!({"name": format!("c{n}"), "workspace_id": app.default_ws,
                            "config": {"retry": {"attempts": 1 + n % 3}}}),
                ),
            )
            .await;
            made.configs.push(got["slug"].as_str().unwrap().into());
            "create config".into()
        }
        15 => match rng.pick(&made.configs).cloned() {
            Some(slug) => {
                let body = json!({"config": {"retry": {"attempts": 1 + n % 4}}});
                ok(app, "PUT", &format!("/v1/configs/{slug}"), Some(body)).await;
                format!("update config {slug}")
            }
            None => "nothing".into(),
        },
        16 => match made.configs.pop() {
            Some(slug) => {
                ok(app, "DELETE", &format!("/v1/configs/{slug}"), None).await;
                format!("delete config {slug}")
            }
            None => "nothing".into(),
        },
        17 => {
            let got = ok(
                app,
                "POST",
                "/v1/guardrails",
                Some(json!({"name": format!("g{n}"), "workspace_id": app.default_ws,
                            "checks": [{"id": "default.contains",
                                        "parameters": {"words": [format!("w{n}")], "operator": "any"}}]})),
            )
            .await;
            made.guardrails.push(got["slug"].as_str().unwrap().into());
            if let Some(slug) = made
                .guardrails
                .first()
                .cloned()
                .filter(|_| n.is_multiple_of(2))
            {
                ok(app, "DELETE", &format!("/v1/guardrails/{slug}"), None).await;
                made.guardrails.remove(0);
            }
            "create (and delete) guardrails".into()
        }
        18 => {
            let got = ok(
                app,
                "POST",
                "/v1/policies/rate-limits",
                Some(json!({"conditions": [{"key": "workspace_id", "value": ws}],
                            "group_by": [{"key": "api_key"}], "type": "requests",
                            "unit": "rpm", "value": 100 + n, "workspace_id": ws})),
            )
            .await;
            made.rate_policies.push(got["id"].as_str().unwrap().into());
            if let Some(id) = made
                .rate_policies
                .first()
                .cloned()
                .filter(|_| n.is_multiple_of(3))
            {
                let body = json!({"value": 7});
                ok(
                    app,
                    "PUT",
                    &format!("/v1/policies/rate-limits/{id}"),
                    Some(body),
                )
                .await;
            }
            "rate limits policy".into()
        }
        _ => {
            let got = ok(
                app,
                "POST",
                "/v1/policies/usage-limits",
                Some(json!({"conditions": [{"key": "workspace_id", "value": ws}],
                            "group_by": [{"key": "metadata._user"}], "type": "cost",
                            "credit_limit": 10 + n, "workspace_id": ws})),
            )
            .await;
            made.usage_policies.push(got["id"].as_str().unwrap().into());
            if let Some(id) = made.usage_policies.pop_if(|_| n.is_multiple_of(2)) {
                ok(
                    app,
                    "DELETE",
                    &format!("/v1/policies/usage-limits/{id}"),
                    None,
                )
                .await;
            }
            "usage limits policy".into()
        }
    }
}

/// Another store on `app`'s database, with the same secret key.
async fn second_instance(app: &App) -> Store {
    let store = Store::open(&app.db_url()).await.expect("a second store");
    if store.has_secret_key() {
        return store;
    }
    store
        .with_data_plane(admin::store::DataPlaneOptions {
            secret_key: Some(crate::integrations::test_key()),
            ..Default::default()
        })
        .await
        .expect("the same key")
}

/// The published snapshot serves exactly what a full read of the database serves.
async fn assert_same_as_rebuilt(store: &Store, context: &str) {
    let published = store.published().current();
    let rebuilt = store.rebuilt_snapshot().await.expect("a rebuild");
    assert_eq!(published.version, rebuilt.version, "{context}");
    assert_eq!(published.digest(true), rebuilt.digest(true), "{context}");
}

async fn incremental_equals_rebuilt(db: TestDb) {
    let app = app_with_key(db).await;
    // A second instance on the same database that is told nothing: it catches up by itself.
    let late = second_instance(&app).await;
    let stats = app.store.published();
    let rebuilt_before = stats.stats().rebuilt.load(Ordering::Relaxed);
    let applied_before = stats.stats().applied.load(Ordering::Relaxed);
    let mut made = Made::default();
    let mut writes = 0;
    for seed in [0x9e37_79b9_7f4a_7c15_u64, 42, 7_777_777] {
        let mut rng = Rng(seed);
        let mut done = Vec::new();
        for _ in 0..40 {
            let what = random_write(&app, &mut rng, &mut made, writes).await;
            writes += 1;
            done.push(what);
            assert_same_as_rebuilt(&app.store, &format!("seed {seed}, after {done:?}")).await;
        }
        let refresh = late.refresh_data_plane().await.expect("catch up");
        assert!(
            matches!(refresh, Refresh::Applied(_)),
            "the late instance applies the log: {refresh:?}"
        );
        assert_eq!(
            late.published().current().digest(true),
            app.store.published().current().digest(true),
            "seed {seed}: the late instance serves what the writer serves"
        );
    }
    // Every write was applied as a change: none fell back to reading every row.
    assert_eq!(
        stats.stats().rebuilt.load(Ordering::Relaxed),
        rebuilt_before,
        "no full rebuild on the writing instance"
    );
    assert!(stats.stats().applied.load(Ordering::Relaxed) >= applied_before + writes as u64 / 2);
    // The consistency check finds nothing to correct.
    assert_eq!(app.store.check_data_plane().await.unwrap(), Check::Same);
}

async fn an_instance_behind_the_log_rebuilds(db: TestDb) {
    let app = App::start(db).await;
    let late = second_instance(&app).await;
    for n in 0..3 {
        ok(
            &app,
            "POST",
            "/v1/api-keys/workspace/service",
            Some(
                json!({"name": format!("k{n}"), "workspace_id": app.default_ws,
                        "scopes": ["completions.write"]}),
            ),
        )
        .await;
    }
    // The log no longer holds what the late instance missed.
    admin::store::changes::prune_through(app.store.db(), app.store.published().version())
        .await
        .unwrap();
    assert_eq!(late.refresh_data_plane().await.unwrap(), Refresh::Rebuilt);
    assert_eq!(
        late.published().current().digest(true),
        app.store.published().current().digest(true)
    );
    // A bump without a change row (a hand-made edit) also reads every row.
    app.sql(
        "UPDATE data_plane_version SET version = version + 1 WHERE id = 1",
        &[],
    )
    .await;
    assert_eq!(late.refresh_data_plane().await.unwrap(), Refresh::Rebuilt);
    assert_eq!(late.refresh_data_plane().await.unwrap(), Refresh::Current);
}

/// A snapshot that drifted from the database (here: edited behind the log's back) is found
/// and replaced by the consistency check.
async fn the_check_corrects_a_drift(db: TestDb) {
    let app = App::start(db).await;
    let (_, raw) = app
        .key(
            ADMIN_KEY,
            "/v1/api-keys/workspace/service",
            json!({"name": "k", "workspace_id": app.default_ws, "scopes": ["completions.write"]}),
        )
        .await;
    use plugin_sdk::AccessStore;
    let published = app.store.published();
    assert!(published.api_key(&crate::common::digest(&raw)).is_some());
    app.sql(
        "UPDATE api_keys SET scopes = '[\"logs.list\"]' WHERE key_hash = $1",
        &[&admin::keys::hash(&raw)],
    )
    .await;
    assert_eq!(app.store.check_data_plane().await.unwrap(), Check::Differed);
    assert_eq!(
        published
            .api_key(&crate::common::digest(&raw))
            .unwrap()
            .scopes
            .to_vec(),
        vec!["logs.list".to_string()]
    );
    assert_eq!(published.stats().differed.load(Ordering::Relaxed), 1);
    assert_eq!(app.store.check_data_plane().await.unwrap(), Check::Same);
}

crate::on_both_databases!(
    incremental_equals_rebuilt,
    an_instance_behind_the_log_rebuilds,
    the_check_corrects_a_drift,
);
