//! PostgreSQL going away under a running gateway: the data plane keeps serving from its snapshot,
//! budget charges made meanwhile wait in the charge writer, and once the database is back they
//! land, each once.
//!
//! The database is reached through a proxy the test cuts (every open connection dropped, new
//! ones refused) and restores. Runs when `GW_TEST_POSTGRES_URL` is set (`.ci/run` sets it); a set
//! variable whose server is unreachable fails the test.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use gateway::config::{GatewayConfig, Overrides, Secret};
use gateway::server::{free_local_addr, Gateway};
use mock_provider::MockProvider;

use crate::common::ADMIN_KEY;
use crate::shared_instances::{fresh_schema, service, SECRET_KEY};

/// A TCP proxy to one address that can be cut and restored.
struct CutProxy {
    addr: SocketAddr,
    up: Arc<watch::Sender<bool>>,
}

impl CutProxy {
    async fn start(target: String) -> CutProxy {
        let listener = TcpListener::bind(free_local_addr()).await.expect("bind");
        let addr = listener.local_addr().unwrap();
        let up = Arc::new(watch::Sender::new(true));
        let up_for_loop = up.clone();
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if !*up_for_loop.borrow() {
                    drop(client);
                    continue;
                }
                let target = target.clone();
                let mut down = up_for_loop.subscribe();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(&target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = down.wait_for(|up| !*up) => {}
                    }
                });
            }
        });
        CutProxy { addr, up }
    }

    /// Drops every open connection and refuses new ones.
    fn cut(&self) {
        self.up.send_replace(false);
    }

    fn restore(&self) {
        self.up.send_replace(true);
    }
}

/// `host:port` of a `postgres://user@host:port/db` URL.
fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    let host = rest.split(['/', '?']).next().unwrap_or(rest);
    if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:5432")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn charges_made_while_postgres_is_away_land_once_it_is_back() {
    let Some(pg) = service("GW_TEST_POSTGRES_URL") else {
        eprintln!("charges_made_while_postgres_is_away_land_once_it_is_back: skipped (GW_TEST_POSTGRES_URL is needed)");
        return;
    };
    let database_url = fresh_schema(&pg, "faults").await;
    let proxy = CutProxy::start(host_port(&pg)).await;
    let proxied = database_url.replacen(&host_port(&pg), &proxy.addr.to_string(), 1);
    assert_ne!(proxied, database_url, "the URL goes through the proxy");

    let mock = MockProvider::start().await;
    let yaml = format!(
        "listen: {}\nthreads: 1\nlog: error\nproviders:\n  - {{slug: mock, provider: openai, api_key: k, custom_host: \"{}\"}}\npipeline:\n  - kind: auth\n  - kind: provider_select\n  - kind: usage_limit\n    flush_interval_ms: 100\n",
        free_local_addr(),
        mock.base_url()
    );
    let overrides = Overrides {
        database_url: Some(proxied),
        bootstrap_admin_key: Some(Secret(ADMIN_KEY.into())),
        secret_key: Some(Secret(SECRET_KEY.into())),
        ..Overrides::default()
    };
    let config = GatewayConfig::from_yaml(&yaml, &overrides).expect("valid config");
    let gw = Gateway::new(config).expect("the gateway starts");
    let gw = tokio::task::spawn_blocking(move || gateway::server::spawn(gw))
        .await
        .expect("spawned");
    let client = reqwest::Client::new();
    let admin = |method: Method, path: String, body: Option<Value>| {
        let mut req = client
            .request(method, format!("{}{path}", gw.url()))
            .header("x-gw-api-key", ADMIN_KEY);
        if let Some(body) = body {
            req = req.json(&body);
        }
        async move {
            let resp = req.send().await.expect("the control plane answers");
            let status = resp.status().as_u16();
            let body: Value = resp.json().await.expect("JSON");
            assert_eq!(status, 200, "{body}");
            body
        }
    };
    let workspaces = admin(Method::GET, "/v1/admin/workspaces".into(), None).await;
    let ws = workspaces["data"][0]["id"].as_str().unwrap().to_owned();
    let key = admin(
        Method::POST,
        "/v1/api-keys/workspace/service".into(),
        Some(
            json!({"name": "k", "workspace_id": ws, "scopes": ["completions.write"],
                    "usage_limits": {"type": "tokens", "credit_limit": 1000}}),
        ),
    )
    .await;
    let (id, raw) = (key["id"].as_str().unwrap(), key["key"].as_str().unwrap());
    // 1 prompt word, 4 reply words: 5 tokens a call.
    let chat = || {
        client
            .post(format!("{}/v1/chat/completions", gw.url()))
            .header("x-gw-api-key", raw)
            .header("x-gw-provider", "@mock")
            .json(&json!({"model": "mock-model", "max_tokens": 4,
                          "messages": [{"role": "user", "content": "x"}]}))
            .send()
    };
    let used = || async {
        let got = admin(Method::GET, format!("/v1/api-keys/{id}"), None).await;
        got["usage_limits"]["current_usage"]
            .as_f64()
            .unwrap_or(-1.0)
    };
    let until_used = |want: f64| async move {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let got = used().await;
            if got == want {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "counted usage stayed {got}, {want} expected"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };

    assert_eq!(chat().await.unwrap().status(), 200);
    until_used(5.0).await;

    proxy.cut();
    for _ in 0..2 {
        let resp = chat().await.expect("the gateway answers");
        assert_eq!(
            resp.status(),
            200,
            "the data plane serves without its database"
        );
    }
    let away = client
        .get(format!("{}/v1/api-keys/{id}", gw.url()))
        .header("x-gw-api-key", ADMIN_KEY)
        .send()
        .await
        .expect("the gateway answers");
    assert!(
        away.status().is_server_error(),
        "the control plane is cut off from its database: {}",
        away.status()
    );
    // Several flushes fail while the database is away.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    proxy.restore();

    until_used(15.0).await;
    // And nothing is charged twice by a later flush.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(used().await, 15.0);
}
