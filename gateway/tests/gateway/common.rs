//! Starting a mock provider and a gateway for one test.

use gateway::config::{GatewayConfig, Overrides};
use gateway::server::{free_local_addr, spawn, Gateway, RunningGateway};
use mock_provider::MockProvider;
use serde_json::{json, Value};

pub struct Env {
    pub mock: MockProvider,
    pub gw: RunningGateway,
    pub client: reqwest::Client,
}

/// The saved provider every test can use: `x-gw-provider: @mock`.
pub const MOCK_KEY: &str = "sk-mock-saved";

impl Env {
    /// A gateway with the default pipeline and a saved provider `mock` pointing at the mock.
    pub async fn start() -> Env {
        Env::start_with("").await
    }

    /// Like [`Env::start`], with extra top-level YAML appended (it may not repeat `providers`).
    pub async fn start_with(extra_yaml: &str) -> Env {
        let mock = MockProvider::start().await;
        let yaml = format!(
            "listen: {listen}\nthreads: 1\nproviders:\n  - slug: mock\n    provider: openai\n    api_key: {MOCK_KEY}\n    custom_host: {base}\n{extra_yaml}",
            listen = free_local_addr(),
            base = mock.base_url(),
        );
        let yaml = yaml
            .replace("{MOCK_BASE}", &mock.base_url())
            .replace("{MOCK_ROOT}", &format!("http://{}", mock.addr()));
        let config = GatewayConfig::from_yaml(&yaml, &Overrides::default())
            .unwrap_or_else(|e| panic!("test config is invalid:\n{e}\n---\n{yaml}"));
        let gateway = Gateway::new(config).expect("pipeline builds");
        let gw = tokio::task::spawn_blocking(move || spawn(gateway))
            .await
            .expect("gateway starts");
        Env {
            mock,
            gw,
            client: reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .expect("client"),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.gw.url())
    }

    /// A POST through the saved mock provider.
    pub fn post(&self, path: &str) -> reqwest::RequestBuilder {
        self.client
            .post(self.url(path))
            .header("x-gw-provider", "@mock")
    }

    pub async fn chat(&self, body: Value) -> reqwest::Response {
        self.post("/v1/chat/completions")
            .json(&body)
            .send()
            .await
            .expect("gateway answers")
    }

    pub async fn metrics(&self) -> String {
        self.client
            .get(self.url("/metrics"))
            .send()
            .await
            .expect("metrics answer")
            .text()
            .await
            .expect("metrics text")
    }
}

pub fn hello(content: &str) -> Value {
    json!({"model": "mock-model", "messages": [{"role": "user", "content": content}]})
}

/// Asserts an OpenAI-shaped error with this status and `param`, returning its body.
pub async fn expect_error(resp: reqwest::Response, status: u16, param: Option<&str>) -> Value {
    let got = resp.status().as_u16();
    let body: Value = resp.json().await.expect("error body is JSON");
    assert_eq!(got, status, "body: {body}");
    assert!(body["error"]["message"].is_string(), "no message: {body}");
    if let Some(param) = param {
        assert_eq!(body["error"]["param"], param, "body: {body}");
    }
    body
}
