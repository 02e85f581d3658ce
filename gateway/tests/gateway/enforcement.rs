//! Enforcement through the real gateway with its default pipeline: a key made through the
//! control plane is refused (401, 403), limited (429), charged (412) and cached exactly as its
//! policies say, and every request lands in the log.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use crate::common::{expect_error, hello, Env, ADMIN_KEY};

impl Env {
    /// The id of the bootstrap workspace `default`.
    pub async fn default_workspace(&self) -> String {
        let (status, list) = self
            .admin_call(Method::GET, "/v1/admin/workspaces", Some(ADMIN_KEY), None)
            .await;
        assert_eq!(status, 200, "{list}");
        list["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["slug"] == "default")
            .expect("the bootstrap workspace")["id"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// A tokens usage limits policy counting per key in the default workspace (far from its
    /// limit) and a new key of that workspace: `(policy id, raw key, key id)`.
    pub async fn tokens_per_key(&self) -> (String, String, String) {
        let ws = self.default_workspace().await;
        let (status, policy) = self
            .admin_call(
                Method::POST,
                "/v1/policies/usage-limits",
                Some(ADMIN_KEY),
                Some(json!({
                    "name": "tokens per key", "workspace_id": ws, "type": "tokens",
                    "credit_limit": 100000, "group_by": [{"key": "api_key"}],
                    "conditions": [{"key": "workspace_id", "value": ws}]
                })),
            )
            .await;
        assert_eq!(status, 200, "{policy}");
        let (key, key_id) = self.workspace_key(&ws, json!({})).await;
        (policy["id"].as_str().unwrap().to_owned(), key, key_id)
    }

    /// What the control plane has counted for `key_id` under `policy_id`, once it has.
    pub async fn usage_of(&self, policy_id: &str, key_id: &str) -> Option<f64> {
        let (_, got) = self
            .admin_call(
                Method::GET,
                &format!("/v1/policies/usage-limits/{policy_id}?include_usage=true"),
                Some(ADMIN_KEY),
                None,
            )
            .await;
        got["value_key_usage_map"][format!("api_key:{key_id}")]["current_usage"].as_f64()
    }

    /// A new workspace service key with these extra fields; returns the raw key and its id.
    pub async fn workspace_key(&self, workspace: &str, fields: Value) -> (String, String) {
        let mut body =
            json!({"name": "enforced", "workspace_id": workspace, "scopes": ["completions.write"]});
        for (k, v) in fields.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (status, created) = self
            .admin_call(
                Method::POST,
                "/v1/api-keys/workspace/service",
                Some(ADMIN_KEY),
                Some(body),
            )
            .await;
        assert_eq!(status, 200, "{created}");
        (
            created["key"].as_str().unwrap().to_owned(),
            created["id"].as_str().unwrap().to_owned(),
        )
    }

    /// A chat through the saved mock provider with this gateway key.
    pub async fn chat_as(
        &self,
        key: &str,
        body: &Value,
        extra: &[(&str, &str)],
    ) -> reqwest::Response {
        let mut req = self
            .bare
            .post(self.url("/v1/chat/completions"))
            .header("x-gw-api-key", key)
            .header("x-gw-provider", "@mock");
        for (k, v) in extra {
            req = req.header(*k, *v);
        }
        req.json(body).send().await.expect("the gateway answers")
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_checked_before_anything_is_sent() {
    let env = Env::start().await;
    let ws = env.default_workspace().await;

    // No key, an unknown key: 401, and the provider never hears of it.
    let resp = env
        .bare
        .post(env.url("/v1/chat/completions"))
        .header("x-gw-provider", "@mock")
        .json(&hello("x"))
        .send()
        .await
        .unwrap();
    let body = expect_error(resp, 401, None).await;
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("x-gw-api-key"),
        "{body}"
    );
    expect_error(env.chat_as("not-a-key", &hello("x"), &[]).await, 401, None).await;
    assert_eq!(env.mock.request_count(), 0);

    // A key without completions.write: 403 naming the scope.
    let (logs_only, _) = env
        .workspace_key(&ws, json!({"scopes": ["logs.list"]}))
        .await;
    let body = expect_error(env.chat_as(&logs_only, &hello("x"), &[]).await, 403, None).await;
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("completions.write"),
        "{body}"
    );

    // A key with it: through.
    let (key, _) = env.workspace_key(&ws, json!({})).await;
    let resp = env.chat_as(&key, &hello("x"), &[]).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(env.mock.request_count(), 1);

    // Deleted: refused at once (the snapshot is rebuilt on the change).
    let (key2, id2) = env.workspace_key(&ws, json!({})).await;
    assert_eq!(env.chat_as(&key2, &hello("x"), &[]).await.status(), 200);
    let (status, _) = env
        .admin_call(
            Method::DELETE,
            &format!("/v1/api-keys/{id2}"),
            Some(ADMIN_KEY),
            None,
        )
        .await;
    assert_eq!(status, 200);
    expect_error(env.chat_as(&key2, &hello("x"), &[]).await, 401, None).await;

    // Expired: 401.
    let soon = chrono_like_in(Duration::from_secs(1));
    let (expiring, _) = env.workspace_key(&ws, json!({"expires_at": soon})).await;
    assert_eq!(env.chat_as(&expiring, &hello("x"), &[]).await.status(), 200);
    // It expires within 2 s (whole seconds, rounded up).
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let body = expect_error(env.chat_as(&expiring, &hello("x"), &[]).await, 401, None).await;
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("expired"),
        "{body}"
    );

    let metrics = env.metrics().await;
    assert!(metrics.contains("gw_auth_requests_total"), "{metrics}");
}

/// RFC 3339 UTC of now + `d`, whole seconds rounded up.
fn chrono_like_in(d: Duration) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + d.as_secs()
        + 1;
    let days = secs / 86_400;
    let tod = secs % 86_400;
    // Civil date from days since the epoch.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        tod / 3600,
        (tod / 60) % 60,
        tod % 60
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limits_answer_429_with_retry_after() {
    let env = Env::start().await;
    let ws = env.default_workspace().await;

    // The key's own limit: two requests a minute.
    let (key, _) = env
        .workspace_key(
            &ws,
            json!({"rate_limits": [{"type": "requests", "unit": "rpm", "value": 2}]}),
        )
        .await;
    for _ in 0..2 {
        assert_eq!(env.chat_as(&key, &hello("x"), &[]).await.status(), 200);
    }
    let resp = env.chat_as(&key, &hello("x"), &[]).await;
    let retry_after: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    // The sliding window weighs the previous minute: freeing one of two slots takes up to 1.5
    // windows.
    assert!((1..=90).contains(&retry_after), "{retry_after}");
    expect_error(resp, 429, None).await;
    assert_eq!(env.mock.request_count(), 2);

    // A policy per user: one request a minute for each `_user`, counted apart.
    let (status, created) = env
        .admin_call(
            Method::POST,
            "/v1/policies/rate-limits",
            Some(ADMIN_KEY),
            Some(json!({
                "name": "one per user", "workspace_id": ws, "type": "requests", "unit": "rpm", "value": 1,
                "conditions": [{"key": "workspace_id", "value": ws}],
                "group_by": [{"key": "metadata._user"}]
            })),
        )
        .await;
    assert_eq!(status, 200, "{created}");
    let (key, _) = env.workspace_key(&ws, json!({})).await;
    let as_user = |user: &'static str| {
        let meta = json!({"_user": user}).to_string();
        let env = &env;
        let key = key.clone();
        async move {
            env.chat_as(&key, &hello("x"), &[("x-gw-metadata", &meta)])
                .await
        }
    };
    assert_eq!(as_user("ann").await.status(), 200);
    assert_eq!(as_user("bob").await.status(), 200);
    let body = expect_error(as_user("ann").await, 429, None).await;
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("one per user"),
        "{body}"
    );

    // Tokens: the provider's reported usage (1 prompt word + 4 reply words) spends a window of 5.
    let (key, _) = env
        .workspace_key(
            &ws,
            json!({"rate_limits": [{"type": "tokens", "unit": "rph", "value": 5}]}),
        )
        .await;
    assert_eq!(env.chat_as(&key, &hello("x"), &[]).await.status(), 200);
    let refused = eventually("the token charge", || async {
        let resp = env.chat_as(&key, &hello("x"), &[]).await;
        (resp.status() == 429).then_some(resp)
    })
    .await;
    expect_error(refused, 429, None).await;
    let metrics = env.metrics().await;
    assert!(
        metrics.contains("gw_rate_limit_rejections_total"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_answer_412_once_spent_and_show_their_usage() {
    let env = Env::start().await;
    let ws = env.default_workspace().await;
    // Each request below uses 5 tokens (1 prompt word, 4 reply words); the budget holds 10.
    let (status, policy) = env
        .admin_call(
            Method::POST,
            "/v1/policies/usage-limits",
            Some(ADMIN_KEY),
            Some(json!({
                "name": "ten tokens", "workspace_id": ws, "type": "tokens", "credit_limit": 10,
                "conditions": [{"key": "workspace_id", "value": ws}],
                "group_by": [{"key": "api_key"}]
            })),
        )
        .await;
    assert_eq!(status, 200, "{policy}");
    let policy_id = policy["id"].as_str().unwrap().to_owned();
    let (key, key_id) = env.workspace_key(&ws, json!({})).await;
    let small = json!({"model": "mock-model", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]});
    let mut passed = 0;
    for _ in 0..4 {
        let resp = env.chat_as(&key, &small, &[]).await;
        match resp.status().as_u16() {
            200 => passed += 1,
            412 => {
                let body: Value = resp.json().await.unwrap();
                assert!(
                    body["error"]["message"]
                        .as_str()
                        .unwrap()
                        .contains("ten tokens"),
                    "{body}"
                );
            }
            other => panic!("unexpected status {other}"),
        }
        // Let the settlement of the request land before the next reservation.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(passed, 2, "10 tokens pay for two 5-token requests");

    // The usage shows through the policy endpoint once the background writer ran.
    let usage = eventually("the charged usage", || async {
        let (_, got) = env
            .admin_call(
                Method::GET,
                &format!("/v1/policies/usage-limits/{policy_id}?include_usage=true"),
                Some(ADMIN_KEY),
                None,
            )
            .await;
        let entry = got["value_key_usage_map"][format!("api_key:{key_id}")].clone();
        (entry["current_usage"].as_f64() == Some(10.0)).then_some(entry)
    })
    .await;
    assert_eq!(usage["status"], "exhausted", "{usage}");

    // Raising the limit reactivates the budget at once.
    let (status, _) = env
        .admin_call(
            Method::PUT,
            &format!("/v1/policies/usage-limits/{policy_id}"),
            Some(ADMIN_KEY),
            Some(json!({"credit_limit": 15})),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(env.chat_as(&key, &small, &[]).await.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_are_cached_per_config_and_namespace() {
    let env = Env::start().await;
    let config =
        json!({"virtual_key": "mock", "cache": {"mode": "simple", "max_age": 60}}).to_string();
    let send = |body: Value, extra: Vec<(&'static str, String)>| {
        let env = &env;
        let config = config.clone();
        async move {
            let mut req = env
                .client
                .post(env.url("/v1/chat/completions"))
                .header("x-gw-config", config);
            for (k, v) in extra {
                req = req.header(k, v);
            }
            req.json(&body).send().await.unwrap()
        }
    };
    let status_of = |resp: &reqwest::Response| {
        resp.headers()
            .get("x-gw-cache-status")
            .map(|v| v.to_str().unwrap().to_owned())
    };

    let first = send(hello("cache me"), vec![]).await;
    assert_eq!(status_of(&first).as_deref(), Some("MISS"));
    let first: Value = first.json().await.unwrap();
    let second = send(hello("cache me"), vec![]).await;
    assert_eq!(status_of(&second).as_deref(), Some("HIT"));
    let second: Value = second.json().await.unwrap();
    assert_eq!(first["choices"], second["choices"]);
    assert_eq!(
        env.mock.request_count(),
        1,
        "a hit never reaches the provider"
    );

    // Another namespace is another cache; force-refresh calls the provider and stores again.
    let other = send(
        hello("cache me"),
        vec![("x-gw-cache-namespace", "tenant-b".into())],
    )
    .await;
    assert_eq!(status_of(&other).as_deref(), Some("MISS"));
    let refreshed = send(
        hello("cache me"),
        vec![("x-gw-cache-force-refresh", "true".into())],
    )
    .await;
    assert_eq!(status_of(&refreshed).as_deref(), Some("REFRESH"));
    assert_eq!(env.mock.request_count(), 3);

    // A stream is answered from the cached answer by re-streaming it.
    let mut streamed = hello("cache me");
    streamed["stream"] = json!(true);
    let resp = send(streamed, vec![]).await;
    assert_eq!(status_of(&resp).as_deref(), Some("HIT"));
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let text = resp.text().await.unwrap();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let content: String = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(
        content,
        first["choices"][0]["message"]["content"].as_str().unwrap()
    );
    assert_eq!(env.mock.request_count(), 3);

    // Errors are never cached.
    let failing = json!({"provider": "openai", "api_key": "k", "custom_host": env.mock.base_url().replace("/v1", "/x-mock/status=500/v1"), "cache": {"mode": "simple"}}).to_string();
    for _ in 0..2 {
        let resp = env
            .client
            .post(env.url("/v1/chat/completions"))
            .header("x-gw-config", failing.clone())
            .json(&hello("fail"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 500);
        assert_eq!(status_of(&resp).as_deref(), Some("MISS"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_is_logged_and_listed() {
    let env = Env::start().await;
    let resp = env
        .post("/v1/chat/completions")
        .header("x-gw-trace-id", "logged-trace-1")
        .header("x-gw-metadata", json!({"_user": "ann"}).to_string())
        .json(&hello("log me"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let list = eventually("the log record", || async {
        let (status, list) = env
            .admin_call(
                Method::GET,
                "/v1/logs?trace_id=logged-trace-1",
                Some(ADMIN_KEY),
                None,
            )
            .await;
        assert_eq!(status, 200, "{list}");
        (list["total"] == 1).then_some(list)
    })
    .await;
    let record = &list["data"][0];
    assert_eq!(record["status_code"], 200, "{record}");
    assert_eq!(record["provider"], "openai", "{record}");
    assert_eq!(record["prompt_tokens"], 2, "{record}");
    assert_eq!(record["metadata"]["_user"], "ann", "{record}");
    // The admin key made the call: its id and organisation are on the record.
    assert!(record["api_key_id"].is_string(), "{record}");
    assert!(record["organisation_id"].is_string(), "{record}");
    assert_eq!(record["route"], "chat.completions", "{record}");
    let id = record["id"].as_str().unwrap();
    let (status, one) = env
        .admin_call(
            Method::GET,
            &format!("/v1/logs/{id}"),
            Some(ADMIN_KEY),
            None,
        )
        .await;
    assert_eq!(status, 200, "{one}");
    assert_eq!(one["trace_id"], "logged-trace-1");

    // A refused request is logged too, with its status and reason and no caller.
    let resp = env
        .bare
        .post(env.url("/v1/chat/completions"))
        .header("x-gw-api-key", "not-a-key")
        .header("x-gw-provider", "@mock")
        .header("x-gw-trace-id", "refused-trace-1")
        .json(&hello("log me"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    let list = eventually("the refused request's record", || async {
        let (_, list) = env
            .admin_call(
                Method::GET,
                "/v1/logs?trace_id=refused-trace-1",
                Some(ADMIN_KEY),
                None,
            )
            .await;
        (list["total"] == 1).then_some(list)
    })
    .await;
    let record = &list["data"][0];
    assert_eq!(record["status_code"], 401, "{record}");
    assert_eq!(record["api_key_id"], Value::Null, "{record}");
    assert!(
        record["error"].as_str().unwrap().contains("x-gw-api-key"),
        "{record}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saved_providers_hold_their_own_budgets_and_rate_limits() {
    let env = Env::start().await;
    let ws = env.default_workspace().await;
    let admin = |method: Method, path: &str, body: Option<Value>| {
        let path = path.to_owned();
        let env = &env;
        async move { env.admin_call(method, &path, Some(ADMIN_KEY), body).await }
    };
    // An integration pointing at the mock, and two providers of it with limits of their own.
    let (status, made) = admin(
        Method::POST,
        "/v1/integrations",
        Some(
            json!({"name": "Limited mock", "slug": "limited-int", "ai_provider_id": "openai",
            "key": "sk-limited-mock", "create_default_provider": false, "workspace_id": ws,
            "configurations": {"custom_host": env.mock.base_url()}}),
        ),
    )
    .await;
    assert_eq!(status, 200, "{made}");
    for body in [
        json!({"name": "Capped", "integration_id": "limited-int", "slug": "capped-mock",
            "usage_limits": {"type": "tokens", "credit_limit": 10}}),
        json!({"name": "Throttled", "integration_id": "limited-int", "slug": "throttled-mock",
            "rate_limits": [{"type": "requests", "unit": "rpm", "value": 2}]}),
    ] {
        let (status, made) = admin(Method::POST, "/v1/providers", Some(body)).await;
        assert_eq!(status, 200, "{made}");
    }
    // Keys without limits of their own: only the providers' limits apply.
    let (ann, _) = env.workspace_key(&ws, json!({})).await;
    let (bob, _) = env.workspace_key(&ws, json!({})).await;
    let chat = |key: &str, provider: &str, body: &Value| {
        env.bare
            .post(env.url("/v1/chat/completions"))
            .header("x-gw-api-key", key)
            .header("x-gw-provider", provider)
            .json(body)
            .send()
    };

    // The budget: 10 tokens pay for two 5-token answers (1 prompt word, 4 reply words),
    // whoever sends them.
    let small = json!({"model": "mock-model", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]});
    let mut passed = 0;
    for key in [&ann, &bob, &ann, &bob] {
        let resp = chat(key, "@capped-mock", &small).await.unwrap();
        match resp.status().as_u16() {
            200 => passed += 1,
            412 => {
                let body: Value = resp.json().await.unwrap();
                assert!(
                    body["error"]["message"]
                        .as_str()
                        .unwrap()
                        .contains("the provider @capped-mock's budget has used 10 of 10 tokens"),
                    "{body}"
                );
            }
            other => panic!("unexpected status {other}"),
        }
        // Let the settlement of the request land before the next reservation.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(passed, 2, "10 tokens pay for two 5-token requests");
    assert_eq!(env.mock.request_count(), 2);
    // The spend reaches the provider's usage in the control plane.
    let shown = eventually("the provider's charged usage", || async {
        let (_, got) = admin(Method::GET, "/v1/providers/capped-mock", None).await;
        (got["usage_limits"]["current_usage"].as_f64() == Some(10.0)).then_some(got)
    })
    .await;
    assert_eq!(shown["status"], "exhausted", "{shown}");
    // Raising its credit limit lets requests through again at once.
    let (status, got) = admin(
        Method::PUT,
        "/v1/providers/capped-mock",
        Some(json!({"usage_limits": {"type": "tokens", "credit_limit": 15}})),
    )
    .await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(
        chat(&ann, "@capped-mock", &small).await.unwrap().status(),
        200
    );

    // The rate limit: two requests a minute through the provider, whoever sends them.
    for key in [&ann, &bob] {
        let resp = chat(key, "@throttled-mock", &hello("x")).await.unwrap();
        assert_eq!(resp.status(), 200);
    }
    let resp = chat(&ann, "@throttled-mock", &hello("x")).await.unwrap();
    assert!(resp.headers().contains_key("retry-after"));
    let body = expect_error(resp, 429, None).await;
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("the provider's rate limit allows 2 requests per minute"),
        "{body}"
    );
    // Another provider is not limited by it.
    assert_eq!(
        chat(&ann, "@mock", &hello("x")).await.unwrap().status(),
        200
    );
    // A config target chosen by the router is checked when routed: the spent provider's
    // attempt is refused and the fallback group tries its next target.
    let before = env.mock.request_count();
    let config = json!({"strategy": {"mode": "fallback"},
        "targets": [{"provider": "@throttled-mock"}, {"provider": "@mock"}]});
    let resp = env
        .bare
        .post(env.url("/v1/chat/completions"))
        .header("x-gw-api-key", &bob)
        .header("x-gw-config", config.to_string())
        .json(&hello("x"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        env.mock.request_count(),
        before + 1,
        "only @mock was called"
    );
    let metrics = env.metrics().await;
    assert!(
        metrics.contains(r#"gw_rate_limit_rejections_total{scope="provider"} 2"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"gw_usage_limit_rejections_total{scope="provider"}"#),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_is_metered_by_the_usage_its_answer_reports_else_its_estimate() {
    let env = Env::start().await;
    let ws = env.default_workspace().await;
    // 7 reported tokens + the 1024 a passthrough POST without usage is charged.
    let (key, _) = env
        .workspace_key(
            &ws,
            json!({"usage_limits": {"type": "tokens", "credit_limit": 1031}}),
        )
        .await;
    let send = |method: Method, path: &str, content_type: &str, body: Value| {
        env.bare
            .request(method, env.url(path))
            .header("x-gw-api-key", &key)
            .header("x-gw-provider", "@mock")
            .header("content-type", content_type)
            .body(body.to_string())
            .send()
    };
    // The mock's echo route answers with the request's body: a Responses API answer here.
    let answer = json!({"id": "resp_1", "object": "response", "model": "mock-model",
        "output": [], "usage": {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7}});
    let resp = send(
        Method::POST,
        "/v1/echo/responses",
        "application/json",
        answer,
    )
    .await
    .unwrap();
    assert_eq!(resp.status(), 200);
    tokio::time::sleep(Duration::from_millis(50)).await;
    // An answer that reports nothing: the estimate.
    let resp = send(
        Method::POST,
        "/v1/echo/images",
        "application/octet-stream",
        json!("x"),
    )
    .await
    .unwrap();
    assert_eq!(resp.status(), 200);
    // Spent: every route that reaches the provider is refused now, passthrough included.
    eventually("the spent budget", || async {
        let resp = send(Method::GET, "/v1/models", "application/json", json!(null))
            .await
            .unwrap();
        (resp.status() == 412).then_some(())
    })
    .await;
    let resp = send(
        Method::POST,
        "/v1/echo/responses",
        "application/json",
        json!({}),
    )
    .await
    .unwrap();
    let body = expect_error(resp, 412, None).await;
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("has used 1031 of 1031 tokens"),
        "{body}"
    );
    let small = json!({"model": "mock-model", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]});
    assert_eq!(env.chat_as(&key, &small, &[]).await.status(), 412);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_without_usage_is_charged_the_text_it_relayed() {
    let env = Env::start().await;
    let (policy_id, key, key_id) = env.tokens_per_key().await;
    // The provider drops the connection after two events: no usage ever comes.
    let body = json!({"model": "mock-model", "stream": true, "max_tokens": 500,
        "messages": [{"role": "user", "content": "one two three four five"}]});
    let resp = env
        .chat_as(
            &key,
            &body,
            &[
                ("x-mock-disconnect-after", "2"),
                ("x-gw-forward-headers", "x-mock-disconnect-after"),
            ],
        )
        .await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(!text.contains("\"usage\":{"), "{text}");
    // Charged the prompt's estimate (23 characters: 6 tokens) and the relayed text, far
    // below the 506 reserved, and not 0.
    let used = eventually("the charge", || env.usage_of(&policy_id, &key_id)).await;
    assert!((7.0..100.0).contains(&used), "charged {used}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_stream_is_charged_the_usage_the_gateway_asked_for_unseen() {
    let env = Env::start().await;
    let (policy_id, key, key_id) = env.tokens_per_key().await;
    // 1 prompt word and 4 reply words: 5 tokens, as the mock reports them.
    let body = json!({"model": "mock-model", "stream": true, "max_tokens": 4,
        "messages": [{"role": "user", "content": "x"}]});
    let resp = env.chat_as(&key, &body, &[]).await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.contains("[DONE]"), "{text}");
    assert!(
        !text.contains("\"usage\":{"),
        "the client did not ask for usage: {text}"
    );
    let sent = env.mock.requests().last().unwrap().json().unwrap();
    assert_eq!(sent["stream_options"]["include_usage"], true, "{sent}");
    let used = eventually("the charge", || env.usage_of(&policy_id, &key_id)).await;
    assert_eq!(used, 5.0);

    // A client that asks for usage gets it, as it asked.
    let mut body = body;
    body["stream_options"] = json!({"include_usage": true});
    let text = env.chat_as(&key, &body, &[]).await.text().await.unwrap();
    assert!(text.contains("\"usage\":{"), "{text}");
}

impl Env {
    /// An organisation integration `shared` on the mock, enabled in workspace `ws` with these
    /// `rate_limits` and `usage_limits`, and two providers of it there, `shared-one` and
    /// `shared-two`.
    async fn shared_integration(&self, ws: &str, rate: Value, usage: Value) {
        self.admin_ok(
            Method::POST,
            "/v1/integrations",
            json!({"name": "Shared", "slug": "shared", "ai_provider_id": "openai",
                   "key": "sk-shared-123456", "create_default_provider": false,
                   "configurations": {"custom_host": self.mock.base_url()}}),
        )
        .await;
        self.shared_limits(ws, rate, usage).await;
        for slug in ["shared-one", "shared-two"] {
            self.admin_ok(
                Method::POST,
                "/v1/providers",
                json!({"name": slug, "slug": slug, "integration_id": "shared", "workspace_id": ws}),
            )
            .await;
        }
    }

    /// New limits of the integration `shared` on workspace `ws`.
    async fn shared_limits(&self, ws: &str, rate: Value, usage: Value) {
        self.admin_ok(
            Method::PUT,
            "/v1/integrations/shared/workspaces",
            json!({"workspaces": [{"id": ws, "enabled": true, "rate_limits": rate,
                                   "usage_limits": usage}]}),
        )
        .await;
    }

    async fn admin_ok(&self, method: Method, path: &str, body: Value) -> Value {
        let (status, got) = self
            .admin_call(method, path, Some(ADMIN_KEY), Some(body))
            .await;
        assert_eq!(status, 200, "{path}: {got}");
        got
    }

    /// A 5-token chat with `key` under a fallback config over these saved providers, the
    /// mock failing the first `fail_first` requests of its kind (503).
    async fn fallback_between(
        &self,
        key: &str,
        slugs: &[&str],
        fail_first: u32,
    ) -> reqwest::Result<reqwest::Response> {
        let targets: Vec<Value> = slugs
            .iter()
            .map(|s| json!({"provider": format!("@{s}")}))
            .collect();
        let config = json!({"strategy": {"mode": "fallback"}, "targets": targets});
        self.bare
            .post(self.url("/v1/chat/completions"))
            .header("x-gw-api-key", key)
            .header("x-gw-config", config.to_string())
            .header("x-mock-fail-first", fail_first.to_string())
            .header("x-gw-forward-headers", "x-mock-fail-first")
            .json(&five_tokens())
            .send()
            .await
    }

    /// The stored usage (and status) of budget 0 of the integration `shared` in workspace `ws`.
    async fn shared_usage(&self, ws: &str) -> Option<(f64, String)> {
        use sqlx::{Connection, Row};
        sqlx::any::install_default_drivers();
        let mut conn = sqlx::AnyConnection::connect(&self.db.sqlite_url())
            .await
            .expect("the test's database");
        let row = sqlx::query(
            "SELECT u.current_usage, u.status FROM integration_budget_usage u
             JOIN integrations i ON i.id = u.integration_id
             WHERE i.slug = 'shared' AND u.workspace_id = $1 AND u.budget_index = 0",
        )
        .bind(ws)
        .fetch_optional(&mut conn)
        .await
        .expect("query");
        row.map(|r| {
            (
                r.get::<f64, _>("current_usage"),
                r.get::<String, _>("status"),
            )
        })
    }
}

/// 1 prompt word, 4 reply words: 5 tokens a call.
fn five_tokens() -> Value {
    json!({"model": "mock-model", "max_tokens": 4,
           "messages": [{"role": "user", "content": "x"}]})
}

/// Limits an organisation integration sets on a workspace (`PUT
/// /v1/integrations/{slug}/workspaces`) hold over the workspace's requests through every
/// provider of that integration: its rate limit answers 429, its budget 412, and what was spent
/// is stored, so the next start knows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_integrations_limits_on_a_workspace_hold_across_its_providers() {
    let env = &Env::start().await;
    let ws = env.default_workspace().await;
    env.shared_integration(
        &ws,
        json!([{"type": "requests", "unit": "rpm", "value": 2}]),
        json!([]),
    )
    .await;
    let (key, _) = env.workspace_key(&ws, json!({})).await;
    let small = five_tokens();
    let through = |slug: &'static str| {
        env.bare
            .post(env.url("/v1/chat/completions"))
            .header("x-gw-api-key", &key)
            .header("x-gw-provider", format!("@{slug}"))
            .json(&small)
            .send()
    };

    // Two requests a minute, counted over both providers.
    assert_eq!(through("shared-one").await.unwrap().status(), 200);
    assert_eq!(through("shared-two").await.unwrap().status(), 200);
    let resp = through("shared-one").await.unwrap();
    let body = expect_error(resp, 429, None).await;
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("the integration's rate limit for this workspace allows 2 requests"),
        "{body}"
    );
    // The provider @mock, of another integration, is not limited by it.
    assert_eq!(env.chat_as(&key, &small, &[]).await.status(), 200);

    // A budget of 15 tokens instead: three calls of 5 spend it, over both providers.
    env.shared_limits(
        &ws,
        json!([]),
        json!([{"type": "tokens", "credit_limit": 15}]),
    )
    .await;
    for slug in ["shared-one", "shared-two", "shared-one"] {
        assert_eq!(through(slug).await.unwrap().status(), 200, "{slug}");
    }
    let body = expect_error(through("shared-two").await.unwrap(), 412, None).await;
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("the integration's budget for this workspace"),
        "{body}"
    );
    assert_eq!(env.chat_as(&key, &small, &[]).await.status(), 200);

    // Stored for the next start, and shown.
    let (used, status) = eventually("the stored charge", || async {
        env.shared_usage(&ws)
            .await
            .filter(|(used, _)| *used == 15.0)
    })
    .await;
    assert_eq!((used, status.as_str()), (15.0, "exhausted"));
    let listed = env
        .admin_ok(
            Method::GET,
            "/v1/integrations/shared/workspaces",
            json!(null),
        )
        .await;
    let shown = &listed["data"][0];
    assert_eq!(shown["usage_limits"][0]["current_usage"], 15.0, "{listed}");

    // Raised: the usage carries over, and requests pass again.
    env.shared_limits(
        &ws,
        json!([]),
        json!([{"type": "tokens", "credit_limit": 25}]),
    )
    .await;
    assert_eq!(env.shared_usage(&ws).await, Some((15.0, "active".into())));
    assert_eq!(through("shared-two").await.unwrap().status(), 200);
}

/// A request that falls back from one provider of an integration to another is counted once
/// against the integration's rate limit, and charged to its budget through the provider that
/// answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_between_providers_of_one_integration_counts_once() {
    let env = &Env::start().await;
    let ws = env.default_workspace().await;
    env.shared_integration(
        &ws,
        json!([{"type": "requests", "unit": "rpm", "value": 2}]),
        json!([{"type": "tokens", "credit_limit": 100}]),
    )
    .await;
    let (key, _) = env.workspace_key(&ws, json!({})).await;
    // The mock fails the first request of this kind (503): @shared-one's attempt.
    let send = || env.fallback_between(&key, &["shared-one", "shared-two"], 1);
    let before = env.mock.request_count();
    assert_eq!(send().await.unwrap().status(), 200);
    assert_eq!(env.mock.request_count(), before + 2, "one fallback");
    assert_eq!(send().await.unwrap().status(), 200, "counted once");
    assert_eq!(send().await.unwrap().status(), 429);
    // Both answers spent 5 tokens each, the first through the second provider.
    eventually("the stored charges", || async {
        env.shared_usage(&ws)
            .await
            .filter(|(used, _)| *used == 10.0)
    })
    .await;
}

/// An integration's token limit is charged what its answer spent whichever of its providers
/// answered, also when the attempts come back to a provider tried before (A, B, then A).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_integrations_token_limit_is_charged_through_the_provider_that_answered() {
    let env = &Env::start().await;
    let ws = env.default_workspace().await;
    env.shared_integration(
        &ws,
        json!([{"type": "tokens", "unit": "rpm", "value": 5}]),
        json!([]),
    )
    .await;
    let (key, _) = env.workspace_key(&ws, json!({})).await;
    // The mock fails the first two requests of this kind (503).
    let send = || env.fallback_between(&key, &["shared-one", "shared-two", "shared-one"], 2);
    let before = env.mock.request_count();
    assert_eq!(send().await.unwrap().status(), 200);
    assert_eq!(
        env.mock.request_count(),
        before + 3,
        "A, B, then A answered"
    );
    // The 5 tokens spent the limit (charged in the background, in-process at once): the
    // next request waits. (Polling would not do: a request let through spends it too.)
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(send().await.unwrap().status(), 429);
}
