//! Two gateway instances sharing PostgreSQL (the control plane) and Redis (counters and cache): a
//! key made through one is known to the other, one rate limit holds exactly across both under
//! concurrent load, concurrent requests on both cannot overspend one budget, an answer cached
//! by one is a hit on the other, and a key deleted through one is refused by the other. Three
//! instances under mixed load (streams, clients leaving, cache hits, passthrough) admit exactly
//! a rate limit and overspend a budget by at most one request's estimate; two count an
//! organisation integration's rate limit on a workspace as one, over both of its providers.
//!
//! Runs when `GW_TEST_POSTGRES_URL` and `GW_TEST_REDIS_URL` are set (`.ci/run` sets both); a
//! set variable whose service is unreachable fails the test.

use std::time::Duration;

use futures_util::future::join_all;
use reqwest::Method;
use serde_json::{json, Value};

use gateway::config::{GatewayConfig, Overrides, Secret};
use gateway::server::{free_local_addr, Gateway, RunningGateway};
use mock_provider::MockProvider;

use crate::common::{hello, ADMIN_KEY};

/// `GW_SECRET_KEY` shared by both instances: 32 bytes in base64.
pub(crate) const SECRET_KEY: &str = "c2hhcmVkLWluc3RhbmNlcy10ZXN0LWtleS0zMi1ieXQ=";

pub(crate) fn service(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|s| !s.is_empty())
}

/// A URL of `server` whose connections use a schema of their own, `gwtest_<name>_<pid>`, made
/// anew.
pub(crate) async fn fresh_schema(server: &str, name: &str) -> String {
    use sqlx::Connection;
    sqlx::any::install_default_drivers();
    let schema = format!("gwtest_{name}_{}", std::process::id());
    let mut conn = sqlx::AnyConnection::connect(server)
        .await
        .unwrap_or_else(|e| panic!("GW_TEST_POSTGRES_URL is set but unreachable: {e}"));
    for sql in [
        format!("DROP SCHEMA IF EXISTS {schema} CASCADE"),
        format!("CREATE SCHEMA {schema}"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await
            .expect("schema statement");
    }
    conn.close().await.ok();
    let sep = if server.contains('?') { '&' } else { '?' };
    format!("{server}{sep}options=-c%20search_path%3D{schema}")
}

/// For the test named `test`: a fresh schema `name` on `GW_TEST_POSTGRES_URL`'s server (its URL)
/// and `GW_TEST_REDIS_URL`; `None`, said on stderr, when either variable is unset.
async fn shared_services(test: &str, name: &str) -> Option<(String, String)> {
    let (Some(pg), Some(redis_url)) = (
        service("GW_TEST_POSTGRES_URL"),
        service("GW_TEST_REDIS_URL"),
    ) else {
        eprintln!("{test}: skipped (GW_TEST_POSTGRES_URL and GW_TEST_REDIS_URL are needed)");
        return None;
    };
    Some((fresh_schema(&pg, name).await, redis_url))
}

/// The id of the first workspace `gw`'s control plane lists (the bootstrap's default).
async fn first_workspace(client: &reqwest::Client, gw: &RunningGateway) -> String {
    let workspaces = admin(client, gw, Method::GET, "/v1/admin/workspaces", None).await;
    workspaces["data"][0]["id"].as_str().unwrap().to_owned()
}

async fn instance(database_url: &str, redis_url: &str, mock: &MockProvider) -> RunningGateway {
    instance_with(database_url, redis_url, mock, "").await
}

/// An instance with `extra_yaml` (a `pipeline:`, say) added to its configuration.
async fn instance_with(
    database_url: &str,
    redis_url: &str,
    mock: &MockProvider,
    extra_yaml: &str,
) -> RunningGateway {
    let yaml = format!(
        "listen: {}\nthreads: 2\nredis_url: \"{redis_url}\"\nproviders:\n  - {{slug: mock, provider: openai, api_key: k, custom_host: \"{}\"}}\n{extra_yaml}",
        free_local_addr(),
        mock.base_url()
    );
    let overrides = Overrides {
        database_url: Some(database_url.to_owned()),
        bootstrap_admin_key: Some(Secret(ADMIN_KEY.into())),
        secret_key: Some(Secret(SECRET_KEY.into())),
        ..Overrides::default()
    };
    let config = GatewayConfig::from_yaml(&yaml, &overrides).expect("valid config");
    let gw = Gateway::new(config).expect("the instance starts");
    tokio::task::spawn_blocking(move || gateway::server::spawn(gw))
        .await
        .expect("spawned")
}

async fn admin(
    client: &reqwest::Client,
    gw: &RunningGateway,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> Value {
    let mut req = client
        .request(method, format!("{}{path}", gw.url()))
        .header("x-gw-api-key", ADMIN_KEY);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req.send().await.expect("the control plane answers");
    let status = resp.status().as_u16();
    let body: Value = resp.json().await.expect("JSON");
    assert_eq!(status, 200, "{path}: {body}");
    body
}

async fn chat(client: &reqwest::Client, gw: &RunningGateway, key: &str, body: &Value) -> u16 {
    client
        .post(format!("{}/v1/chat/completions", gw.url()))
        .header("x-gw-api-key", key)
        .header("x-gw-provider", "@mock")
        .json(body)
        .send()
        .await
        .expect("the gateway answers")
        .status()
        .as_u16()
}

/// Waits until `gw` knows `key` (its snapshot follows the other instance's change).
async fn known_to(client: &reqwest::Client, gw: &RunningGateway, key: &str, body: &Value) -> u16 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let status = chat(client, gw, key, body).await;
        if status != 401 {
            return status;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the second instance never saw the key"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_hold_one_limit_and_one_budget() {
    let Some((database_url, redis_url)) =
        shared_services("two_instances_hold_one_limit_and_one_budget", "shared").await
    else {
        return;
    };
    let mock = MockProvider::start().await;
    let a = instance(&database_url, &redis_url, &mock).await;
    let b = instance(&database_url, &redis_url, &mock).await;
    let client = reqwest::Client::new();

    let ws = first_workspace(&client, &a).await;

    // One rate limit of 10 requests a minute, made through instance A.
    let limit = 10;
    let created = admin(
        &client,
        &a,
        Method::POST,
        "/v1/api-keys/workspace/service",
        Some(
            json!({"name": "shared limit", "workspace_id": ws, "scopes": ["completions.write"],
                    "rate_limits": [{"type": "requests", "unit": "rpm", "value": limit}]}),
        ),
    )
    .await;
    let key = created["key"].as_str().unwrap().to_owned();
    assert_eq!(known_to(&client, &b, &key, &hello("x")).await, 200);
    // 30 concurrent requests, half on each instance: exactly the 9 left pass.
    let body = hello("x");
    let sends = (0..30).map(|i| {
        let gw = if i % 2 == 0 { &a } else { &b };
        chat(&client, gw, &key, &body)
    });
    let statuses = join_all(sends).await;
    let passed = statuses.iter().filter(|s| **s == 200).count();
    let limited = statuses.iter().filter(|s| **s == 429).count();
    assert_eq!(
        (passed, limited),
        (limit - 1, 30 - (limit - 1)),
        "{statuses:?}"
    );

    // One budget of 50 tokens; each request below costs 5 (1 prompt word, 4 reply words).
    let created = admin(
        &client,
        &b,
        Method::POST,
        "/v1/api-keys/workspace/service",
        Some(
            json!({"name": "shared budget", "workspace_id": ws, "scopes": ["completions.write"],
                    "usage_limits": {"type": "tokens", "credit_limit": 50}}),
        ),
    )
    .await;
    let key = created["key"].as_str().unwrap().to_owned();
    let key_id = created["id"].as_str().unwrap().to_owned();
    let small = json!({"model": "mock-model", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]});
    let first = known_to(&client, &a, &key, &small).await;
    assert_eq!(first, 200);
    let sends = (0..40).map(|i| {
        let gw = if i % 2 == 0 { &a } else { &b };
        chat(&client, gw, &key, &small)
    });
    let statuses = join_all(sends).await;
    let passed = 1 + statuses.iter().filter(|s| **s == 200).count();
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 412),
        "{statuses:?}"
    );
    assert!(
        passed * 5 <= 50,
        "{passed} requests of 5 tokens overspent 50: {statuses:?}"
    );
    assert!(
        passed >= 5,
        "reservations were too cautious: only {passed} passed"
    );

    // What the control plane counted matches what passed, and never exceeds the limit.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let got = admin(
            &client,
            &a,
            Method::GET,
            &format!("/v1/api-keys/{key_id}"),
            None,
        )
        .await;
        let used = got["usage_limits"]["current_usage"]
            .as_f64()
            .unwrap_or_default();
        if used == (passed * 5) as f64 {
            break;
        }
        assert!(used <= 50.0, "{got}");
        assert!(
            tokio::time::Instant::now() < deadline,
            "usage never settled: {got}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // One cache: an answer stored through A is a hit on B.
    let config =
        json!({"virtual_key": "mock", "cache": {"mode": "simple", "max_age": 60}}).to_string();
    let cached = |gw: &RunningGateway| {
        client
            .post(format!("{}/v1/chat/completions", gw.url()))
            .header("x-gw-api-key", ADMIN_KEY)
            .header("x-gw-config", config.clone())
            .json(&hello("shared cache"))
            .send()
    };
    let first = cached(&a).await.unwrap();
    assert_eq!(first.headers()["x-gw-cache-status"], "MISS");
    // A writes the answer to Redis off the answer's path: wait until it is written.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let metrics = client
            .get(format!("{}/metrics", a.url()))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if metrics.lines().any(|l| l == "gw_cache_stores_total 1") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "A never stored the answer"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let calls = mock.request_count();
    let second = cached(&b).await.unwrap();
    assert_eq!(second.headers()["x-gw-cache-status"], "HIT");
    assert_eq!(
        mock.request_count(),
        calls,
        "B answered from the shared cache"
    );

    // A key deleted through B is refused by A as soon as A's snapshot follows.
    admin(
        &client,
        &b,
        Method::DELETE,
        &format!("/v1/api-keys/{key_id}"),
        None,
    )
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while chat(&client, &a, &key, &small).await != 401 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "A kept a deleted key"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One of the kinds of request [`three_instances_hold_limits_under_mixed_load`] mixes, by
/// `kind % 5`: a chat, a stream read whole, a stream the client leaves after its first event, a
/// chat answered from the shared cache after the first, and a passthrough answer that reports
/// its usage. Returns the status.
async fn mixed(client: &reqwest::Client, gw: &RunningGateway, key: &str, kind: usize) -> u16 {
    let small = json!({"model": "mock-model", "max_tokens": 4,
                       "messages": [{"role": "user", "content": "x"}]});
    let mut streamed = small.clone();
    streamed["stream"] = json!(true);
    let chat = |body: &Value| {
        client
            .post(format!("{}/v1/chat/completions", gw.url()))
            .header("x-gw-api-key", key)
            .json(body)
    };
    let resp = match kind % 5 {
        0 => chat(&small).header("x-gw-provider", "@mock").send().await,
        1 | 2 => {
            chat(&streamed)
                .header("x-gw-provider", "@mock")
                .send()
                .await
        }
        3 => {
            let config = json!({"virtual_key": "mock", "cache": {"mode": "simple", "max_age": 60}});
            chat(&small)
                .header("x-gw-config", config.to_string())
                .send()
                .await
        }
        _ => {
            let answer = json!({"id": "resp_1", "object": "response", "model": "mock-model",
                "output": [], "usage": {"input_tokens": 2, "output_tokens": 3, "total_tokens": 5}});
            client
                .post(format!("{}/v1/echo/responses", gw.url()))
                .header("x-gw-api-key", key)
                .header("x-gw-provider", "@mock")
                .json(&answer)
                .send()
                .await
        }
    };
    let mut resp = resp.expect("the gateway answers");
    let status = resp.status().as_u16();
    if kind % 5 == 2 {
        // The client leaves after the first piece of the stream.
        let _ = resp.chunk().await;
        drop(resp);
    } else {
        let _ = resp.bytes().await;
    }
    status
}

/// Three instances sharing Redis and PostgreSQL under mixed concurrent load (chats, streams,
/// streams the client leaves, cache hits, passthrough): a rate limit admits exactly its limit,
/// and a budget is overspent by at most one request's estimate.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_hold_limits_under_mixed_load() {
    let Some((database_url, redis_url)) =
        shared_services("three_instances_hold_limits_under_mixed_load", "three").await
    else {
        return;
    };
    let mock = MockProvider::start().await;
    // A passthrough POST reserves 8 completion tokens here (not 1024), so that one request's
    // estimate, the most a budget may be overspent by, is small.
    let pipeline = "pipeline:\n  - kind: auth\n  - kind: provider_select\n  - kind: rate_limit\n  - kind: usage_limit\n    default_completion_tokens: 8\n    flush_interval_ms: 100\n  - kind: cache\n";
    let mut gws = Vec::new();
    for _ in 0..3 {
        gws.push(instance_with(&database_url, &redis_url, &mock, pipeline).await);
    }
    let client = reqwest::Client::new();
    let ws = first_workspace(&client, &gws[0]).await;
    let make_key = |limits: Value| {
        let mut body =
            json!({"name": "mixed", "workspace_id": ws, "scopes": ["completions.write"]});
        body.as_object_mut()
            .unwrap()
            .extend(limits.as_object().unwrap().clone());
        admin(
            &client,
            &gws[0],
            Method::POST,
            "/v1/api-keys/workspace/service",
            Some(body),
        )
    };
    let limit = 20;
    let rated =
        make_key(json!({"rate_limits": [{"type": "requests", "unit": "rpm", "value": limit}]}))
            .await;
    let rated = rated["key"].as_str().unwrap().to_owned();
    let budget = 60;
    let budgeted =
        make_key(json!({"usage_limits": {"type": "tokens", "credit_limit": budget}})).await;
    let (budgeted_id, budgeted) = (
        budgeted["id"].as_str().unwrap().to_owned(),
        budgeted["key"].as_str().unwrap().to_owned(),
    );
    // Every instance knows both keys: one chat each on the two others (5 tokens, 1 request).
    let small = json!({"model": "mock-model", "max_tokens": 4,
                       "messages": [{"role": "user", "content": "x"}]});
    for gw in &gws[1..] {
        assert_eq!(known_to(&client, gw, &rated, &small).await, 200);
        assert_eq!(known_to(&client, gw, &budgeted, &small).await, 200);
    }

    let sends = (0..90).map(|i| {
        let key = if i % 2 == 0 { &rated } else { &budgeted };
        mixed(&client, &gws[i % 3], key, i / 2)
    });
    let statuses = join_all(sends).await;
    let (rated_statuses, budgeted_statuses): (Vec<_>, Vec<_>) =
        statuses.iter().enumerate().partition(|(i, _)| i % 2 == 0);
    let admitted = rated_statuses.iter().filter(|(_, s)| **s == 200).count();
    assert!(
        rated_statuses.iter().all(|(_, s)| **s == 200 || **s == 429),
        "{rated_statuses:?}"
    );
    assert_eq!(admitted + 2, limit, "{rated_statuses:?}");
    assert!(
        budgeted_statuses
            .iter()
            .all(|(_, s)| **s == 200 || **s == 412),
        "{budgeted_statuses:?}"
    );
    assert!(
        budgeted_statuses.iter().any(|(_, s)| **s == 412),
        "the budget was never reached: {budgeted_statuses:?}"
    );

    // What the control plane counts once every charge has landed: the budget, plus at most
    // one request's estimate (a chat here reserves 5 tokens, a passthrough POST 8).
    let mut last = -1.0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let got = admin(
            &client,
            &gws[1],
            Method::GET,
            &format!("/v1/api-keys/{budgeted_id}"),
            None,
        )
        .await;
        let used = got["usage_limits"]["current_usage"]
            .as_f64()
            .unwrap_or(-1.0);
        if used == last && used > 0.0 {
            break;
        }
        last = used;
        assert!(
            tokio::time::Instant::now() < deadline,
            "charges kept moving: {got}"
        );
    }
    eprintln!(
        "three instances: {admitted} + 2 admitted under a limit of {limit}; {last} tokens spent of {budget}, {} refused",
        budgeted_statuses.iter().filter(|(_, s)| **s == 412).count()
    );
    let one_estimate = 8;
    assert!(
        last <= f64::from(budget + one_estimate),
        "spent {last} of a {budget} budget: {budgeted_statuses:?}"
    );
}

/// Two instances sharing Redis count an organisation integration's rate limit on a workspace
/// as one, over both of the integration's providers there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_hold_an_integrations_limit_over_its_providers() {
    let Some((database_url, redis_url)) = shared_services(
        "two_instances_hold_an_integrations_limit_over_its_providers",
        "integration",
    )
    .await
    else {
        return;
    };
    let mock = MockProvider::start().await;
    let a = instance(&database_url, &redis_url, &mock).await;
    let b = instance(&database_url, &redis_url, &mock).await;
    let client = reqwest::Client::new();
    let ws = first_workspace(&client, &a).await;
    admin(
        &client,
        &a,
        Method::POST,
        "/v1/integrations",
        Some(
            json!({"name": "Shared", "slug": "shared", "ai_provider_id": "openai",
                    "key": "sk-shared-123456", "create_default_provider": false,
                    "configurations": {"custom_host": mock.base_url()}}),
        ),
    )
    .await;
    let limit = 4;
    admin(
        &client,
        &a,
        Method::PUT,
        "/v1/integrations/shared/workspaces",
        Some(json!({"workspaces": [{"id": ws, "enabled": true,
            "rate_limits": [{"type": "requests", "unit": "rpm", "value": limit}]}]})),
    )
    .await;
    for slug in ["shared-one", "shared-two"] {
        admin(
            &client,
            &a,
            Method::POST,
            "/v1/providers",
            Some(
                json!({"name": slug, "slug": slug, "integration_id": "shared",
                        "workspace_id": ws}),
            ),
        )
        .await;
    }
    let created = admin(
        &client,
        &a,
        Method::POST,
        "/v1/api-keys/workspace/service",
        Some(json!({"name": "k", "workspace_id": ws, "scopes": ["completions.write"]})),
    )
    .await;
    let key = created["key"].as_str().unwrap().to_owned();
    let through = |gw: &RunningGateway, slug: &str| {
        client
            .post(format!("{}/v1/chat/completions", gw.url()))
            .header("x-gw-api-key", &key)
            .header("x-gw-provider", format!("@{slug}"))
            .json(&hello("x"))
            .send()
    };
    assert_eq!(through(&a, "shared-one").await.unwrap().status(), 200);
    // B learns of the key and the providers from the change log: each call until then is a
    // 401 or 400; the first that passes is the second counted.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let status = through(&b, "shared-two").await.unwrap().status().as_u16();
        if status == 200 {
            break;
        }
        assert!(
            [400, 401].contains(&status) && tokio::time::Instant::now() < deadline,
            "B answered {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Ten at once over both instances and both providers: exactly the two left pass.
    let sends = (0..10).map(|i| {
        let gw = if i % 2 == 0 { &a } else { &b };
        let slug = if i % 3 == 0 {
            "shared-one"
        } else {
            "shared-two"
        };
        async move { through(gw, slug).await.unwrap().status().as_u16() }
    });
    let statuses = join_all(sends).await;
    let passed = statuses.iter().filter(|s| **s == 200).count();
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 429),
        "{statuses:?}"
    );
    assert_eq!(passed, limit - 2, "{statuses:?}");
}
