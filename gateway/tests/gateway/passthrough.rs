//! Any other provider path: bodies stream both ways untouched.

use serde_json::Value;

use crate::common::{Env, MOCK_KEY};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_is_proxied_with_the_provider_key_and_without_gateway_headers() {
    let env = Env::start().await;
    let resp = env
        .client
        .get(env.url("/v1/models"))
        .header("x-gw-provider", "@mock")
        .header("x-gw-trace-id", "trace-pt-1")
        .header("authorization", "Bearer client-token-not-for-provider")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-gw-trace-id"], "trace-pt-1");
    assert_eq!(resp.headers()["x-gw-provider"], "openai");
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["data"][0]["id"], "mock-model");
    let req = &env.mock.requests()[0];
    assert_eq!(req.path, "/v1/models");
    assert_eq!(
        req.header("authorization"),
        Some(format!("Bearer {MOCK_KEY}").as_str())
    );
    assert!(req.headers.iter().all(|(n, _)| !n.starts_with("x-gw-")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_8_mb_body_passes_intact_both_ways() {
    let env = Env::start().await;
    let body: Vec<u8> = (0..8 * 1024 * 1024u32)
        .map(|i| (i * 31 % 251) as u8)
        .collect();
    let resp = env
        .post("/v1/echo/upload?purpose=test")
        .header("content-type", "application/octet-stream")
        .header("x-custom-client", "kept")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-mock-custom"], "yes");
    assert_eq!(
        resp.headers()["x-mock-path"],
        "/v1/echo/upload?purpose=test"
    );
    let back = resp.bytes().await.unwrap();
    assert_eq!(back.len(), body.len());
    assert!(back[..] == body[..], "the echoed body differs");
    let req = &env.mock.requests()[0];
    assert_eq!(req.body.len(), body.len());
    // Other client headers are forwarded untouched in passthrough mode.
    assert_eq!(req.header("x-custom-client"), Some("kept"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_and_delete_are_proxied() {
    let env = Env::start().await;
    for method in [reqwest::Method::PUT, reqwest::Method::DELETE] {
        let resp = env
            .client
            .request(method.clone(), env.url("/v1/echo/item-1"))
            .header("x-gw-provider", "@mock")
            .body("payload")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{method}");
        assert_eq!(resp.headers()["x-mock-method"], method.as_str());
        assert_eq!(resp.text().await.unwrap(), "payload");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_statuses_and_bodies_pass_through_unchanged() {
    let env = Env::start().await;
    let resp = env
        .client
        .get(env.url("/v1/no-such-thing"))
        .header("x-gw-provider", "@mock")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    let body: Value = resp.json().await.unwrap();
    // The provider's own body, not the gateway's error shape.
    assert!(body.get("provider").is_none(), "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("/v1/no-such-thing"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_8_mb_chat_request_reaches_the_provider_intact() {
    let env = Env::start().await;
    let content = "word ".repeat(8 * 1024 * 1024 / 5);
    let resp = env.chat(crate::common::hello(&content)).await;
    assert_eq!(resp.status(), 200);
    let req = &env.mock.requests()[0];
    assert!(req.body.len() > 8 * 1024 * 1024 - 100);
    // Byte for byte: the request leaves in partial writes, and a misplaced piece would keep the
    // length.
    assert!(req.json().unwrap()["messages"][0]["content"] == content.as_str());
}

/// `x-gw-request-timeout` holds on passthrough paths too: a provider that has not answered in
/// time is a 408 in the same shape as on the first-class routes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_timeout_holds_on_passthrough() {
    let env = Env::start().await;
    let slow = env
        .mock
        .base_url()
        .replace("/v1", "/x-mock/delay_ms=1500/v1");
    let get = |timeout: Option<&str>| {
        let mut req = env
            .client
            .get(env.url("/v1/models"))
            .header("x-gw-custom-host", &slow)
            .header("x-gw-provider", "openai")
            .header("authorization", "Bearer k");
        if let Some(ms) = timeout {
            req = req.header("x-gw-request-timeout", ms);
        }
        req.send()
    };
    // The provider answers after 1.5 s: a 408 means the gateway did not wait for it.
    let resp = get(Some("200")).await.unwrap();
    assert_eq!(resp.status(), 408);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(
        body["error"]["message"],
        "Request exceeded the timeout sent in the request: 200ms"
    );
    assert_eq!(body["error"]["type"], "timeout_error");
    // Without one, the slow provider is waited for.
    assert_eq!(get(None).await.unwrap().status(), 200);
}
