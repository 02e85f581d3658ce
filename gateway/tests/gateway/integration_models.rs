//! An integration's model prices through the real gateway: a model priced with
//! `PUT /v1/integrations/{slug}/models` prices every request through the integration's
//! providers (the log's cost, the budget's spend), a new price applies to the next request,
//! and a cost budget spent at those prices refuses with 412.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use crate::common::{expect_error, Env, ADMIN_KEY};

/// A control-plane call with the bootstrap admin key.
async fn admin(env: &Env, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    env.admin_call(method, path, Some(ADMIN_KEY), body).await
}

/// A chat through `@priced-mock` with `key`, traced as `trace`: one prompt word and, by
/// `max_tokens`, a reservation of four completion tokens (the mock's reply to "x" is four
/// words).
async fn chat(env: &Env, key: &str, trace: &str) -> reqwest::Response {
    env.bare
        .post(env.url("/v1/chat/completions"))
        .header("x-gw-api-key", key)
        .header("x-gw-provider", "@priced-mock")
        .header("x-gw-trace-id", trace)
        .json(&json!({"model": "mock-model", "max_tokens": 4,
            "messages": [{"role": "user", "content": "x"}]}))
        .send()
        .await
        .expect("the gateway answers")
}

/// Polls `f` until it returns `Some`, for at most five seconds (background writers).
async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The log record of the request traced `trace`, once written.
async fn logged(env: &Env, trace: &str) -> Value {
    eventually(&format!("the log of {trace}"), || async {
        let (status, list) = admin(
            env,
            Method::GET,
            &format!("/v1/logs?trace_id={trace}"),
            None,
        )
        .await;
        assert_eq!(status, 200, "{list}");
        (list["total"] == 1).then(|| list["data"][0].clone())
    })
    .await
}

fn close(got: &Value, want: f64) -> bool {
    got.as_f64().is_some_and(|g| (g - want).abs() < 1e-9)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_integrations_prices_cost_requests_and_spend_budgets() {
    let env = Env::start().await;
    let ws = env.default_workspace().await;
    let (status, made) = admin(
        &env,
        Method::POST,
        "/v1/integrations",
        Some(
            json!({"name": "Priced mock", "slug": "priced-mock", "ai_provider_id": "openai",
            "key": "sk-priced-mock", "workspace_id": ws,
            "configurations": {"custom_host": env.mock.base_url()}}),
        ),
    )
    .await;
    assert_eq!(status, 200, "{made}");
    assert_eq!(made["default_provider_slug"], "priced-mock");
    // $0.10 per prompt token, $0.20 per completion token: far from any shipped price (the
    // shipped table does not know `mock-model` at all).
    let (status, got) = admin(
        &env,
        Method::PUT,
        "/v1/integrations/priced-mock/models",
        Some(json!({"models": [{"slug": "mock-model", "enabled": true,
            "pricing_config": {"input_per_million": 100000, "output_per_million": 200000}}]})),
    )
    .await;
    assert_eq!((status, &got), (200, &json!({})));

    // A key with a $2 budget: 1 prompt + 4 completion tokens cost $0.90 a request.
    let (key, key_id) = env
        .workspace_key(
            &ws,
            json!({"usage_limits": {"type": "cost", "credit_limit": 2}}),
        )
        .await;
    for trace in ["priced-1", "priced-2"] {
        let resp = chat(&env, &key, trace).await;
        assert_eq!(resp.status(), 200, "{trace}");
        // Let the settlement land before the next reservation.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let record = logged(&env, "priced-1").await;
    assert_eq!(record["prompt_tokens"], 1, "{record}");
    assert_eq!(record["completion_tokens"], 4, "{record}");
    assert!(
        close(&record["cost"], 0.9),
        "the integration's price: {record}"
    );
    assert_eq!(record["api_key_id"], key_id.as_str(), "{record}");
    assert!(close(&logged(&env, "priced-2").await["cost"], 0.9));

    // $1.80 spent: another $0.90 does not fit in $2.
    let body = expect_error(chat(&env, &key, "priced-3").await, 412, None).await;
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("the API key's budget has used") && message.contains("of 2 USD"),
        "{body}"
    );
    assert_eq!(
        env.mock.request_count(),
        2,
        "the refused request was not sent"
    );
    // The spend reaches the key's usage in the control plane, at the integration's prices.
    eventually("the key's charged usage", || async {
        let (_, got) = admin(&env, Method::GET, &format!("/v1/api-keys/{key_id}"), None).await;
        close(&got["usage_limits"]["current_usage"], 1.8).then_some(())
    })
    .await;

    // A new price applies to the next request: completion tokens only, $0.10 each.
    let (status, _) = admin(
        &env,
        Method::PUT,
        "/v1/integrations/priced-mock/models",
        Some(json!({"models": [{"slug": "MOCK-MODEL", "enabled": true,
            "pricing_config": {"input_per_million": 0, "output_per_million": 100000}}]})),
    )
    .await;
    assert_eq!(status, 200);
    let (free, _) = env.workspace_key(&ws, json!({})).await;
    assert_eq!(chat(&env, &free, "priced-4").await.status(), 200);
    assert!(close(&logged(&env, "priced-4").await["cost"], 0.4));

    // Without a price, the model costs nothing known: the log has no cost.
    let (status, _) = admin(
        &env,
        Method::PUT,
        "/v1/integrations/priced-mock/models",
        Some(json!({"models": [{"slug": "mock-model", "enabled": true, "pricing_config": null}]})),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(chat(&env, &free, "priced-5").await.status(), 200);
    let record = logged(&env, "priced-5").await;
    assert!(
        record["cost"].is_null() || close(&record["cost"], 0.0),
        "{record}"
    );
}
