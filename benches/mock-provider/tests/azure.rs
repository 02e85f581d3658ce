//! End-to-end tests of the Azure OpenAI routes over a raw HTTP/1.1 client.

mod common;

use common::{post_json_with, Headers, Response};
use mock_provider::MockProvider;
use serde_json::{json, Value};

const API_KEY: (&str, &str) = ("api-key", "azure-test-key");
const VERSION: &str = "api-version=2024-10-21";

fn path(deployment: &str, operation: &str) -> String {
    format!("/openai/deployments/{deployment}/{operation}?{VERSION}")
}

async fn post_with(mock: &MockProvider, path: &str, extra: Headers<'_>, body: &Value) -> Response {
    let mut headers = vec![API_KEY];
    headers.extend_from_slice(extra);
    post_json_with(mock.addr(), path, &headers, body).await
}

fn chat_body(text: &str) -> Value {
    json!({"messages": [{"role": "system", "content": "be brief"},
                        {"role": "user", "content": text}]})
}

fn ok_json(resp: &Response) -> Value {
    assert_eq!(
        resp.status(),
        200,
        "body: {}",
        String::from_utf8_lossy(&resp.body)
    );
    assert_eq!(resp.header("content-type"), Some("application/json"));
    resp.json()
}

/// Checks Azure's `{"error":{"code","message"}}` shape; returns the message.
fn assert_azure_error(resp: &Response, status: u16) -> String {
    assert_eq!(
        resp.status(),
        status,
        "body: {}",
        String::from_utf8_lossy(&resp.body)
    );
    assert_eq!(resp.header("content-type"), Some("application/json"));
    let body = resp.json();
    let error = body["error"].as_object().expect("error object");
    assert_eq!(error.len(), 2, "{body}");
    assert_eq!(body["error"]["code"], status.to_string(), "{body}");
    body["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("no message: {body}"))
        .to_owned()
}

fn assert_echo(resp: &Response, deployment: &str) {
    assert_eq!(resp.header("x-mock-azure-deployment"), Some(deployment));
    assert_eq!(resp.header("x-mock-azure-api-version"), Some("2024-10-21"));
}

#[tokio::test]
async fn chat_completion_answers_as_openai() {
    let mock = MockProvider::start().await;
    let resp = post_with(
        &mock,
        &path("gpt4o-prod", "chat/completions"),
        &[],
        &chat_body("hello there"),
    )
    .await;
    assert_echo(&resp, "gpt4o-prod");
    let body = ok_json(&resp);
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "gpt4o-prod");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "mock reply to: hello there"
    );
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9})
    );

    // A model in the body wins; tool calls and limits work as on OpenAI.
    let mut named = chat_body("x");
    named["model"] = json!("gpt-4o");
    named["tools"] =
        json!([{"type": "function", "function": {"name": "lookup", "parameters": {}}}]);
    let body = ok_json(&post_with(&mock, &path("d", "chat/completions"), &[], &named).await);
    assert_eq!(body["model"], "gpt-4o");
    assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(
        body["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "lookup"
    );
    let mut limited = chat_body("one two three");
    limited["max_tokens"] = json!(2);
    let body = ok_json(&post_with(&mock, &path("d", "chat/completions"), &[], &limited).await);
    assert_eq!(body["choices"][0]["finish_reason"], "length");

    // The request reaches the mock as sent.
    let recorded = mock.requests();
    assert_eq!(
        recorded[0].path,
        "/openai/deployments/gpt4o-prod/chat/completions"
    );
    assert_eq!(recorded[0].query.as_deref(), Some(VERSION));
    assert_eq!(recorded[0].header("api-key"), Some("azure-test-key"));
}

#[tokio::test]
async fn chat_stream() {
    let mock = MockProvider::start().await;
    let mut body = chat_body("stream me");
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let resp = post_with(&mock, &path("dep", "chat/completions"), &[], &body).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.header("content-type"), Some("text/event-stream"));
    assert_echo(&resp, "dep");
    let text = String::from_utf8_lossy(&resp.body).into_owned();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let chunks: Vec<Value> = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).expect("chunk JSON"))
        .collect();
    let joined: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(joined, "mock reply to: stream me");
    assert!(chunks.iter().all(|c| c["model"] == "dep"));
    assert_eq!(
        chunks.last().expect("usage chunk")["usage"]["completion_tokens"],
        5
    );
}

#[tokio::test]
async fn embeddings() {
    let mock = MockProvider::start().await;
    let body = json!({"input": ["hello world", "x"], "dimensions": 4});
    let resp = post_with(&mock, &path("ada", "embeddings"), &[], &body).await;
    assert_echo(&resp, "ada");
    let answer = ok_json(&resp);
    assert_eq!(answer["model"], "ada");
    assert_eq!(answer["data"].as_array().map(Vec::len), Some(2));
    assert_eq!(
        answer["data"][0]["embedding"].as_array().map(Vec::len),
        Some(4)
    );

    let openai = common::post_json(mock.addr(), "/v1/embeddings", &body)
        .await
        .json();
    assert_eq!(openai["data"], answer["data"]);
}

#[tokio::test]
async fn azure_checks_key_version_and_path() {
    let mock = MockProvider::start().await;
    let body = chat_body("x");
    let chat = path("dep", "chat/completions");

    let resp = post_json_with(mock.addr(), &chat, &[], &body).await;
    let message = assert_azure_error(&resp, 401);
    assert!(message.starts_with("Access denied"), "{message}");
    assert_echo(&resp, "dep");
    // OpenAI's bearer header is not Azure's key header.
    let resp = post_json_with(
        mock.addr(),
        &chat,
        &[("authorization", "Bearer sk-x")],
        &body,
    )
    .await;
    assert_azure_error(&resp, 401);

    for bad in [
        "/openai/deployments/dep/chat/completions",
        "/openai/deployments/dep/chat/completions?api-version=",
        "/openai/deployments/dep/chat/completions?api-version=latest",
        "/openai/deployments/dep/completions/chat?api-version=2024-10-21",
        "/openai/chat/completions?api-version=2024-10-21",
        "/openai/deployments//chat/completions?api-version=2024-10-21",
    ] {
        let resp = post_with(&mock, bad, &[], &body).await;
        assert_eq!(
            assert_azure_error(&resp, 404),
            "Resource not found",
            "{bad}"
        );
    }
    let preview = "/openai/deployments/dep/chat/completions?api-version=2025-04-01-preview";
    let resp = post_with(&mock, preview, &[], &body).await;
    assert_eq!(
        resp.header("x-mock-azure-api-version"),
        Some("2025-04-01-preview")
    );
    ok_json(&resp);
}

#[tokio::test]
async fn wrong_requests_and_faults() {
    let mock = MockProvider::start().await;
    // Past Azure's own checks, OpenAI's request checks and error shape apply.
    let resp = post_with(
        &mock,
        &path("dep", "chat/completions"),
        &[],
        &json!({"n": 1}),
    )
    .await;
    assert_eq!(resp.status(), 400);
    assert_eq!(resp.json()["error"]["type"], "invalid_request_error");
    let resp = post_with(
        &mock,
        &path("dep", "embeddings"),
        &[],
        &json!({"input": []}),
    )
    .await;
    assert_eq!(resp.status(), 400);

    let resp = post_with(
        &mock,
        &path("dep", "chat/completions"),
        &[("x-mock-status", "429")],
        &chat_body("x"),
    )
    .await;
    let message = assert_azure_error(&resp, 429);
    assert!(message.contains("429"), "{message}");
    assert_eq!(resp.header("retry-after-ms"), Some("10"));
    let resp = post_with(
        &mock,
        &format!("/x-mock/status=500{}", path("dep", "chat/completions")),
        &[],
        &chat_body("x"),
    )
    .await;
    assert_azure_error(&resp, 500);
    let resp = post_with(
        &mock,
        &format!("/x-mock/words=x{}", path("dep", "chat/completions")),
        &[],
        &chat_body("x"),
    )
    .await;
    assert_azure_error(&resp, 400);
}
