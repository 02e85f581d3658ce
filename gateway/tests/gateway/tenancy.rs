//! Tenancy and egress through the real gateway: a key reaches only what its workspace owns, a
//! saved provider's key goes only to its saved host, and hosts that requests name may not be
//! internal unless the operator trusts them.

use std::io::{Read, Write};

use mock_provider::MockProvider;
use reqwest::Method;
use serde_json::{json, Value};

use crate::common::{expect_error, hello, Env, ADMIN_KEY};

/// Two workspaces, each with a provider on the mock and a service key.
struct Tenants {
    env: Env,
    a_key: String,
    b_key: String,
    /// Workspace B's provider, saved config and their slugs.
    b_provider: String,
    b_config: String,
}

async fn workspace(env: &Env, name: &str) -> String {
    let (status, made) = env
        .admin_call(
            Method::POST,
            "/v1/admin/workspaces",
            Some(ADMIN_KEY),
            Some(json!({"name": name})),
        )
        .await;
    assert_eq!(status, 200, "{made}");
    made["id"].as_str().unwrap().to_owned()
}

/// An integration of `ws` on the mock: its default provider's slug.
async fn provider_in(env: &Env, ws: &str, name: &str, key: &str) -> String {
    let (status, made) = env
        .admin_call(
            Method::POST,
            "/v1/integrations",
            Some(ADMIN_KEY),
            Some(json!({"name": name, "ai_provider_id": "openai", "key": key,
                        "workspace_id": ws,
                        "configurations": {"custom_host": env.mock.base_url()}})),
        )
        .await;
    assert_eq!(status, 200, "{made}");
    made["default_provider_slug"].as_str().unwrap().to_owned()
}

impl Tenants {
    async fn start() -> Tenants {
        let env = Env::start().await;
        let a = workspace(&env, "Team A").await;
        let b = workspace(&env, "Team B").await;
        provider_in(&env, &a, "A mock", "sk-of-team-a").await;
        let b_provider = provider_in(&env, &b, "B mock", "sk-of-team-b").await;
        let (status, made) = env
            .admin_call(
                Method::POST,
                "/v1/configs",
                Some(ADMIN_KEY),
                Some(json!({"name": "B routing", "workspace_id": b,
                            "config": {"provider": format!("@{b_provider}")}})),
            )
            .await;
        assert_eq!(status, 200, "{made}");
        let b_config = made["slug"].as_str().unwrap().to_owned();
        let (a_key, _) = env.workspace_key(&a, json!({})).await;
        let (b_key, _) = env.workspace_key(&b, json!({})).await;
        Tenants {
            env,
            a_key,
            b_key,
            b_provider,
            b_config,
        }
    }

    async fn chat(&self, key: &str, headers: &[(&str, &str)]) -> reqwest::Response {
        let mut req = self
            .env
            .bare
            .post(self.env.url("/v1/chat/completions"))
            .header("x-gw-api-key", key);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.json(&hello("hi")).send().await.unwrap()
    }

    fn upstream_calls(&self) -> usize {
        self.env.mock.requests().len()
    }
}

/// The message a refusal must share with an unknown slug's, the slug aside.
async fn same_as_unknown(t: &Tenants, resp: reqwest::Response, param: &str, unknown: Value) {
    let body = expect_error(resp, 400, Some(param)).await;
    let text = body["error"]["message"].as_str().unwrap();
    let unknown_text = unknown["error"]["message"].as_str().unwrap();
    assert_eq!(
        text.replace(&t.b_provider, "X").replace(&t.b_config, "X"),
        unknown_text.replace("nobody-here", "X"),
        "another workspace's resource must look unknown"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reaches_only_what_its_workspace_owns() {
    let t = Tenants::start().await;
    let b_ref = format!("@{}", t.b_provider);
    let unknown_provider: Value = t
        .chat(&t.a_key, &[("x-gw-provider", "@nobody-here")])
        .await
        .json()
        .await
        .unwrap();

    // Workspace A tries B's provider every way there is; nothing is sent.
    let resp = t.chat(&t.a_key, &[("x-gw-provider", &b_ref)]).await;
    same_as_unknown(&t, resp, "x-gw-provider", unknown_provider.clone()).await;
    let resp = t
        .chat(&t.a_key, &[("x-gw-virtual-key", &t.b_provider)])
        .await;
    let body = expect_error(resp, 400, Some("x-gw-virtual-key")).await;
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("no saved provider"));
    for config in [
        json!({"provider": b_ref}),
        json!({"virtual_key": t.b_provider}),
        json!({"strategy": {"mode": "fallback"}, "targets": [
            {"strategy": {"mode": "loadbalance"}, "targets": [{"provider": b_ref}]}]}),
    ] {
        let resp = t
            .chat(&t.a_key, &[("x-gw-config", &config.to_string())])
            .await;
        let body = expect_error(resp, 400, Some("x-gw-config")).await;
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("no saved provider"),
            "{body}"
        );
    }
    let resp = t.chat(&t.a_key, &[("x-gw-config", &t.b_config)]).await;
    let body = expect_error(resp, 400, Some("x-gw-config")).await;
    let unknown: Value = t
        .chat(&t.a_key, &[("x-gw-config", "nobody-here")])
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .replace(&t.b_config, "X"),
        unknown["error"]["message"]
            .as_str()
            .unwrap()
            .replace("nobody-here", "X")
    );
    // Passthrough too.
    let resp = t
        .env
        .bare
        .get(t.env.url("/v1/models"))
        .header("x-gw-api-key", &t.a_key)
        .header("x-gw-provider", &b_ref)
        .send()
        .await
        .unwrap();
    expect_error(resp, 400, Some("x-gw-provider")).await;
    assert_eq!(t.upstream_calls(), 0, "nothing reached the provider");

    // B's own key, and the organisation's admin key, may use it.
    let resp = t.chat(&t.b_key, &[("x-gw-provider", &b_ref)]).await;
    assert_eq!(resp.status(), 200);
    let resp = t.chat(&t.b_key, &[("x-gw-config", &t.b_config)]).await;
    assert_eq!(resp.status(), 200);
    let resp = t.chat(ADMIN_KEY, &[("x-gw-provider", &b_ref)]).await;
    assert_eq!(resp.status(), 200);
    let seen = t.env.mock.requests();
    assert_eq!(seen.len(), 3);
    assert!(seen
        .iter()
        .all(|r| r.header("authorization") == Some("Bearer sk-of-team-b")));
    // The provider declared in the YAML file is the operator's: every key may use it.
    let resp = t.chat(&t.a_key, &[("x-gw-provider", "@mock")]).await;
    assert_eq!(resp.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saved_providers_key_goes_only_to_its_saved_host() {
    let env = Env::start().await;
    let elsewhere = MockProvider::start().await;
    let send = |headers: Vec<(&'static str, String)>| {
        let mut req = env.gw_post("/v1/chat/completions");
        for (k, v) in headers {
            req = req.header(k, v);
        }
        req.json(&hello("hi")).send()
    };
    let resp = send(vec![
        ("x-gw-provider", "@mock".into()),
        ("x-gw-custom-host", elsewhere.base_url()),
    ])
    .await
    .unwrap();
    expect_error(resp, 400, Some("x-gw-custom-host")).await;
    // On the saved target itself, or inherited from a group above it (three deep).
    for config in [
        json!({"provider": "@mock", "custom_host": elsewhere.base_url()}),
        json!({"custom_host": elsewhere.base_url(), "strategy": {"mode": "fallback"},
               "targets": [{"strategy": {"mode": "fallback"},
                            "targets": [{"provider": "@mock"}]}]}),
    ] {
        let resp = send(vec![("x-gw-config", config.to_string())])
            .await
            .unwrap();
        let body = expect_error(resp, 400, Some("x-gw-config")).await;
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("custom_host"),
            "{body}"
        );
    }
    assert!(elsewhere.requests().is_empty(), "the saved key never left");
    assert!(env.mock.requests().is_empty());
}

/// A chat with the admin key, routed by `config`.
async fn with_config(env: &Env, config: &Value) -> reqwest::Response {
    env.gw_post("/v1/chat/completions")
        .header("x-gw-config", config.to_string())
        .json(&hello("hi"))
        .send()
        .await
        .unwrap()
}

/// A custom host on loopback at the second mock's port: not trusted (the YAML trusts only the
/// first mock's host and port).
async fn via_host(env: &Env, host: &str) -> reqwest::Response {
    env.gw_post("/v1/chat/completions")
        .header("x-gw-custom-host", host)
        .header("x-gw-provider", "openai")
        .header("authorization", "Bearer sk-client")
        .json(&hello("hi"))
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_that_requests_name_may_not_be_internal() {
    let env = Env::start().await;
    let internal = MockProvider::start().await;
    let port = internal.addr().port();
    for host in [
        format!("http://127.0.0.1:{port}/v1"),
        format!("http://127.1:{port}/v1"),
        format!("http://2130706433:{port}/v1"),
        format!("http://localhost:{port}/v1"),
        format!("http://0.0.0.0:{port}/v1"),
        format!("http://[::ffff:127.0.0.1]:{port}/v1"),
        format!("http://[::1]:{port}/v1"),
    ] {
        let resp = via_host(&env, &host).await;
        let body = expect_error(resp, 403, None).await;
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("egress.trusted_hosts"),
            "{host}: {message}"
        );
        assert!(
            message.contains("GW_TRUSTED_CUSTOM_HOSTS"),
            "{host}: {message}"
        );
        if !host.contains("127.0.0.1") {
            assert!(!message.contains("127.0.0.1"), "{host}: {message}");
        }
    }
    // Passthrough, and a config's custom_host.
    let resp = env
        .client
        .get(env.url("/v1/models"))
        .header("x-gw-custom-host", format!("http://localhost:{port}/v1"))
        .header("x-gw-provider", "openai")
        .header("authorization", "Bearer k")
        .send()
        .await
        .unwrap();
    expect_error(resp, 403, None).await;
    let config = json!({"provider": "openai", "api_key": "k",
                        "custom_host": format!("http://localhost:{port}/v1")});
    let resp = with_config(&env, &config).await;
    expect_error(resp, 403, None).await;
    assert!(internal.requests().is_empty(), "nothing was sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_trusts_a_host() {
    let internal = MockProvider::start().await;
    let port = internal.addr().port();
    let env = Env::start_with(&format!(
        "egress:\n  trusted_hosts: [\"localhost:{port}\"]\n"
    ))
    .await;
    let resp = via_host(&env, &format!("http://localhost:{port}/v1")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(internal.requests().len(), 1);
    // Trust is by name (and port): another spelling of the same address is not trusted.
    let resp = via_host(&env, &format!("http://127.0.0.1:{port}/v1")).await;
    expect_error(resp, 403, None).await;
    assert_eq!(internal.requests().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_paths_stay_below_the_providers_base_path() {
    let env = Env::start().await;
    // Sent raw: an HTTP client would resolve the dot segments itself.
    let addr = env.gw.url().trim_start_matches("http://").to_owned();
    let mut stream = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        stream,
        "GET /v1/files/../../../secret HTTP/1.1\r\nhost: {addr}\r\nx-gw-api-key: {ADMIN_KEY}\r\n\
         x-gw-provider: @mock\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 "), "{answer}");
    let seen = env.mock.requests();
    assert_eq!(seen.len(), 1, "{answer}");
    assert_eq!(seen[0].path, "/v1/secret");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_makes_a_bounded_number_of_upstream_attempts() {
    let env = Env::start().await;
    let failing = env.mock.base_url().replace("/v1", "/x-mock/status=503/v1");
    let target = json!({"provider": "openai", "api_key": "k", "custom_host": failing,
                        "retry": {"attempts": 10, "on_status_codes": [503],
                                  "use_retry_after_header": true}});
    // Three targets of eleven attempts each would be 33 calls.
    let config = json!({"strategy": {"mode": "fallback"},
                        "targets": [target, target, target]});
    let resp = with_config(&env, &config).await;
    // The answer is the last provider answer (11 calls on the first target, 5 on the second),
    // and the target named is the one that gave it.
    assert_eq!(resp.status(), 503);
    assert_eq!(
        resp.headers()["x-gw-last-used-option-index"],
        "config.targets[1]"
    );
    assert_eq!(
        env.mock.requests().len(),
        gateway::llm::MAX_UPSTREAM_ATTEMPTS as usize
    );

    // Every saved provider a config names is checked before anything is sent: an unknown one
    // in a later fallback target is a 400 at once, not after the first target was tried.
    let config = json!({"strategy": {"mode": "fallback"},
                        "targets": [{"provider": "@mock"}, {"provider": "@nobody"}]});
    let resp = with_config(&env, &config).await;
    expect_error(resp, 400, Some("x-gw-config")).await;
    assert_eq!(
        env.mock.requests().len(),
        gateway::llm::MAX_UPSTREAM_ATTEMPTS as usize
    );
}
