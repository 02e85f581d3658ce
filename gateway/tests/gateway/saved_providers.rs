//! Providers and configs saved through the control plane, used by requests through the real
//! gateway: `x-gw-provider: @slug`, `x-gw-virtual-key: slug` and `x-gw-config: <slug>` resolve
//! them with no database query on the request path; the YAML file's own come first.

use serde_json::{json, Value};

use crate::common::{hello, Env, ADMIN_KEY, MOCK_KEY};

impl Env {
    /// A control-plane call with the bootstrap admin key.
    async fn admin(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self
            .client
            .request(method, self.url(path))
            .header("x-gw-api-key", ADMIN_KEY);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await.expect("the gateway answers");
        let status = resp.status().as_u16();
        (status, resp.json().await.expect("a JSON body"))
    }

    /// A chat request with these headers (and no other provider selection).
    async fn chat_with(&self, headers: &[(&str, &str)], content: &str) -> reqwest::Response {
        let mut req = self.gw_post("/v1/chat/completions");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.json(&hello(content))
            .send()
            .await
            .expect("the gateway answers")
    }
}

const SAVED_KEY: &str = "sk-saved-through-the-api";

#[tokio::test]
async fn a_provider_saved_through_the_api_answers_requests() {
    use reqwest::Method;
    let env = Env::start().await;
    // An integration pointing at the mock, and its default provider.
    let (status, made) = env
        .admin(
            Method::POST,
            "/v1/integrations",
            Some(
                json!({"name": "Mock OpenAI", "ai_provider_id": "openai", "key": SAVED_KEY,
                "configurations": {"custom_host": env.mock.base_url()}}),
            ),
        )
        .await;
    assert_eq!(status, 200, "{made}");
    let slug = made["default_provider_slug"].as_str().unwrap().to_owned();
    assert_eq!(slug, "mock-openai");

    // At once, by @slug: the mock answers, with the saved key.
    let resp = env
        .chat_with(&[("x-gw-provider", &format!("@{slug}"))], "via the API")
        .await;
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "mock reply to: via the API"
    );
    let seen = env.mock.requests();
    assert_eq!(
        seen.last().unwrap().header("authorization"),
        Some(format!("Bearer {SAVED_KEY}").as_str())
    );

    // A second provider of the same integration, used the legacy way.
    let (status, made) = env
        .admin(
            Method::POST,
            "/v1/providers",
            Some(json!({"name": "Legacy", "integration_id": "mock-openai", "slug": "legacy-mock"})),
        )
        .await;
    assert_eq!(status, 200, "{made}");
    let resp = env
        .chat_with(&[("x-gw-virtual-key", "legacy-mock")], "legacy")
        .await;
    assert_eq!(resp.status(), 200);

    // A new key reaches the data plane with the next request.
    let (status, _) = env
        .admin(
            Method::PUT,
            "/v1/integrations/mock-openai",
            Some(json!({"key": "sk-rotated-key-1"})),
        )
        .await;
    assert_eq!(status, 200);
    let resp = env
        .chat_with(&[("x-gw-provider", "@legacy-mock")], "rotated")
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        env.mock.requests().last().unwrap().header("authorization"),
        Some("Bearer sk-rotated-key-1")
    );

    // Deleted: unknown to the next request.
    let (status, _) = env
        .admin(Method::DELETE, "/v1/providers/legacy-mock", None)
        .await;
    assert_eq!(status, 200);
    let resp = env
        .chat_with(&[("x-gw-virtual-key", "legacy-mock")], "gone")
        .await;
    let body = crate::common::expect_error(resp, 400, Some("x-gw-virtual-key")).await;
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("legacy-mock"),
        "{body}"
    );
}

#[tokio::test]
async fn a_saved_config_routes_requests() {
    use reqwest::Method;
    let env = Env::start().await;
    let (status, made) = env
        .admin(
            Method::POST,
            "/v1/integrations",
            Some(json!({"name": "Mock", "slug": "api-mock", "ai_provider_id": "openai", "key": SAVED_KEY,
                "configurations": {"custom_host": env.mock.base_url()}})),
        )
        .await;
    assert_eq!(status, 200, "{made}");
    // A fallback group whose target is the saved provider, with a model override.
    let config = json!({
        "strategy": {"mode": "fallback"},
        "targets": [{"provider": "@api-mock", "override_params": {"model": "saved-config-model"}}],
    });
    let (status, made) = env
        .admin(
            Method::POST,
            "/v1/configs",
            Some(json!({"name": "Saved", "config": config})),
        )
        .await;
    assert_eq!(status, 200, "{made}");
    let slug = made["slug"].as_str().unwrap().to_owned();
    let id = made["id"].as_str().unwrap().to_owned();
    for reference in [&slug, &id] {
        let resp = env
            .chat_with(&[("x-gw-config", reference)], "configured")
            .await;
        assert_eq!(resp.status(), 200, "{reference}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(
            body["choices"][0]["message"]["content"],
            "mock reply to: configured"
        );
        let sent = env.mock.requests().last().unwrap().json().unwrap();
        assert_eq!(sent["model"], "saved-config-model");
    }
    // A new version is what the next request uses.
    let (status, _) = env
        .admin(
            Method::PUT,
            &format!("/v1/configs/{slug}"),
            Some(json!({"config": {"provider": "@api-mock", "override_params": {"model": "version-two"}}})),
        )
        .await;
    assert_eq!(status, 200);
    let resp = env.chat_with(&[("x-gw-config", &slug)], "again").await;
    assert_eq!(resp.status(), 200);
    let sent = env.mock.requests().last().unwrap().json().unwrap();
    assert_eq!(sent["model"], "version-two");

    // The control plane checks configs with the router's own validation.
    let (status, got) = env
        .admin(
            Method::POST,
            "/v1/configs",
            Some(json!({"name": "Bad", "config": {"strategy": {"mode": "fallback"}, "targets": [{"provider": "nope"}]}})),
        )
        .await;
    assert_eq!(status, 400, "{got}");
    assert_eq!(got["data"]["errorCode"], "AB01");
    let message = got["data"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("config: targets[0].provider"),
        "{message}"
    );
}

/// The file's provider `mock` wins over one saved through the API under the same slug.
#[tokio::test]
async fn the_yaml_file_comes_first() {
    use reqwest::Method;
    let env = Env::start().await;
    let (status, made) = env
        .admin(
            Method::POST,
            "/v1/integrations",
            Some(json!({"name": "Shadow", "slug": "shadow", "ai_provider_id": "openai", "key": "sk-shadow-123",
                "default_provider_slug": "mock",
                "configurations": {"custom_host": "http://127.0.0.1:9/v1"}})),
        )
        .await;
    assert_eq!(status, 200, "{made}");
    let resp = env.chat(hello("which one")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        env.mock.requests().last().unwrap().header("authorization"),
        Some(format!("Bearer {MOCK_KEY}").as_str())
    );
}
