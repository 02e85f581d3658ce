//! Upstreams that cannot be reached, or misbehave, never crash the gateway.

use serde_json::Value;

use crate::common::{expect_error, hello, Env};

async fn chat_via_custom_host(env: &Env, host: &str) -> reqwest::Response {
    env.gw_post("/v1/chat/completions")
        .header("x-gw-custom-host", host)
        .header("x-gw-provider", "openai")
        .header("authorization", "Bearer k")
        .json(&hello("hi"))
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unresolvable_and_unreachable_hosts_are_502s() {
    // Loopback is trusted here, so that a closed local port is connected to (and refused).
    let env = Env::start_with("egress:\n  trusted_hosts: [127.0.0.1]\n").await;
    let resp = chat_via_custom_host(&env, "http://no-such-host.invalid/v1").await;
    let body = expect_error(resp, 502, None).await;
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no-such-host.invalid"),
        "{body}"
    );

    let closed = gateway::server::free_local_addr();
    let resp = chat_via_custom_host(&env, &format!("http://{closed}/v1")).await;
    let body = expect_error(resp, 502, None).await;
    // The host as named, never the address and port it resolved to.
    assert_eq!(
        body["error"]["message"],
        format!("cannot connect to {}: connection refused", closed.ip())
    );

    // Passthrough too.
    let resp = env
        .client
        .get(env.url("/v1/models"))
        .header("x-gw-api-key", crate::common::ADMIN_KEY)
        .header("x-gw-custom-host", "http://no-such-host.invalid/v1")
        .header("x-gw-provider", "openai")
        .header("authorization", "Bearer k")
        .send()
        .await
        .unwrap();
    expect_error(resp, 502, None).await;

    // And the gateway still serves.
    assert_eq!(env.chat(hello("ok")).await.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_hangs_up_is_a_502() {
    let env = Env::start().await;
    let resp = env
        .post("/v1/chat/completions")
        .header("x-mock-disconnect-after", "0")
        .header("x-gw-forward-headers", "x-mock-disconnect-after")
        .json(&hello("hi"))
        .send()
        .await
        .unwrap();
    expect_error(resp, 502, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_timeout_is_a_408_with_the_reference_body() {
    let env = Env::start().await;
    let resp = env
        .post("/v1/chat/completions")
        .header("x-gw-request-timeout", "150")
        .header("x-mock-delay-ms", "2000")
        .header("x-gw-forward-headers", "x-mock-delay-ms")
        .json(&hello("hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 408);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(
        body,
        serde_json::json!({"error": {
            "message": "Request exceeded the timeout sent in the request: 150ms",
            "type": "timeout_error", "param": null, "code": null
        }})
    );
    // A timeout that is long enough lets the answer through.
    let resp = env
        .post("/v1/chat/completions")
        .header("x-portkey-request-timeout", "5000")
        .header("x-mock-delay-ms", "50")
        .header("x-gw-forward-headers", "x-mock-delay-ms")
        .json(&hello("hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_read_timeouts_apply_to_every_connection() {
    let env = Env::start_with("upstream: {read_timeout_ms: 200}\n").await;
    let resp = env
        .post("/v1/chat/completions")
        .header("x-mock-delay-ms", "3000")
        .header("x-gw-forward-headers", "x-mock-delay-ms")
        .json(&hello("hi"))
        .send()
        .await
        .unwrap();
    expect_error(resp, 504, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_body_without_a_valid_key_is_refused_unread() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let env = Env::start().await;
    for key_header in ["", "x-gw-api-key: not-a-key\r\n"] {
        // 32 MiB announced, 1 KiB sent: a gateway that waited for the body would never answer.
        let mut conn = tokio::net::TcpStream::connect(env.gw.addr()).await.unwrap();
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nx-gw-provider: @mock\r\n{key_header}\r\n",
            32 * 1024 * 1024
        );
        conn.write_all(head.as_bytes()).await.unwrap();
        conn.write_all(&[b' '; 1024]).await.unwrap();
        let mut answer = Vec::new();
        let mut buf = [0u8; 4096];
        let read = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = conn.read(&mut buf).await.unwrap();
                assert!(n > 0, "the connection closed without an answer");
                answer.extend_from_slice(&buf[..n]);
            }
        })
        .await;
        assert!(read.is_ok(), "no answer while the body was unsent");
        let text = String::from_utf8_lossy(&answer);
        assert!(text.starts_with("HTTP/1.1 401"), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_answer_over_max_answer_bytes_is_a_502() {
    let env = Env::start_with("max_answer_bytes: 100\n").await;
    let resp = env
        .chat(hello("a few words are more than a hundred bytes of answer"))
        .await;
    let body = expect_error(resp, 502, None).await;
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("larger than 100 bytes"),
        "{body}"
    );
}
