//! Starting a mock provider and a gateway for one test.

use gateway::config::{GatewayConfig, Overrides, Secret};
use gateway::server::{free_local_addr, spawn, Gateway, RunningGateway};
use mock_provider::MockProvider;
use serde_json::{json, Value};

pub struct Env {
    pub mock: MockProvider,
    pub gw: RunningGateway,
    /// Sends the bootstrap admin key as `x-gw-api-key` unless a request sets its own (the
    /// default pipeline's `auth` plugin asks every provider request for a key).
    pub client: reqwest::Client,
    /// Sends no key (refusals, the control plane's own checks).
    pub bare: reqwest::Client,
    /// The gateway's own control-plane database, removed with the `Env`.
    pub db: TempDir,
}

/// The saved provider every test can use: `x-gw-provider: @mock`.
pub const MOCK_KEY: &str = "sk-mock-saved";

/// The control plane's bootstrap admin key in every test gateway.
pub const ADMIN_KEY: &str = "test-admin-key-0123456789";

/// A folder under the system's temporary folder, removed when dropped.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("gw-{name}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("make a temporary folder");
        TempDir(dir)
    }

    /// A SQLite URL for a database file in this folder.
    pub fn sqlite_url(&self) -> String {
        format!("sqlite://{}", self.0.join("gateway.db").display())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

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
        // Each gateway has a control-plane database of its own, bootstrapped with ADMIN_KEY.
        let db = TempDir::new("test-db");
        let overrides = Overrides {
            database_url: Some(db.sqlite_url()),
            bootstrap_admin_key: Some(Secret(ADMIN_KEY.into())),
            ..Overrides::default()
        };
        let config = GatewayConfig::from_yaml(&yaml, &overrides)
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
                .default_headers(
                    [(
                        reqwest::header::HeaderName::from_static("x-gw-api-key"),
                        reqwest::header::HeaderValue::from_static(ADMIN_KEY),
                    )]
                    .into_iter()
                    .collect(),
                )
                .build()
                .expect("client"),
            bare: reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .expect("client"),
            db,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.gw.url())
    }

    /// A POST to a provider route with the gateway key (the bootstrap admin key), which the
    /// default pipeline's `auth` plugin asks for; no provider chosen.
    pub fn gw_post(&self, path: &str) -> reqwest::RequestBuilder {
        self.client
            .post(self.url(path))
            .header("x-gw-api-key", ADMIN_KEY)
    }

    /// A POST through the saved mock provider.
    pub fn post(&self, path: &str) -> reqwest::RequestBuilder {
        self.gw_post(path).header("x-gw-provider", "@mock")
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

impl Env {
    /// A control-plane call with `key`; returns the status and JSON body.
    pub async fn admin_call(
        &self,
        method: reqwest::Method,
        path: &str,
        key: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self.bare.request(method, self.url(path));
        if let Some(key) = key {
            req = req.header("x-gw-api-key", key);
        }
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await.expect("the gateway answers");
        let status = resp.status().as_u16();
        assert_eq!(resp.headers()["content-type"], "application/json", "{path}");
        (status, resp.json().await.expect("a JSON body"))
    }
}
