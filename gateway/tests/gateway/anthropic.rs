//! Anthropic through the gateway: OpenAI-shaped requests in, Anthropic's Messages API to the
//! mock (which checks what it receives), OpenAI-shaped answers and streams back.

use serde_json::{json, Value};

use crate::common::{expect_error, hello, Env};

fn anthropic(env: &Env, path: &str) -> reqwest::RequestBuilder {
    env.gw_post(path)
        .header("x-gw-provider", "anthropic")
        .header("x-gw-custom-host", env.mock.base_url())
        .header("authorization", "Bearer sk-ant-test")
}

fn data_events(text: &str) -> Vec<Value> {
    text.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_is_translated_both_ways() {
    let env = Env::start().await;
    let resp = anthropic(&env, "/v1/chat/completions")
        .json(&json!({"model": "claude-test", "max_tokens": 50, "stop": ["never"],
            "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello claude"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-gw-provider"], "anthropic");
    assert_eq!(resp.headers()["x-mock-system"], "be brief");
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "claude-test");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "mock reply to: hello claude"
    );
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert_eq!(body["usage"]["prompt_tokens"], 4);
    assert!(body["usage"]["completion_tokens"].as_u64().unwrap() > 0);

    let seen = &env.mock.requests()[0];
    assert_eq!(seen.path, "/v1/messages");
    assert_eq!(seen.header("x-api-key"), Some("sk-ant-test"));
    assert_eq!(seen.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(seen.header("authorization"), None);
    let sent = seen.json().unwrap();
    assert_eq!(sent["system"], "be brief");
    assert_eq!(sent["stop_sequences"], json!(["never"]));
    assert!(sent.get("stop").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_tools_and_finish_reasons() {
    let env = Env::start().await;
    let resp = anthropic(&env, "/v1/chat/completions")
        .json(&json!({"model": "claude-test", "stream": true, "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": "stream it"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let chunks = data_events(&text);
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, "mock reply to: stream it");
    assert!(chunks
        .iter()
        .any(|c| c["choices"][0]["finish_reason"] == "stop"));
    assert!(
        chunks.last().unwrap()["usage"]["total_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );

    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]);
    let resp = anthropic(&env, "/v1/chat/completions")
        .json(&json!({"model": "claude-test", "tools": tools, "messages": [{"role": "user", "content": "weather?"}]}))
        .send()
        .await
        .unwrap();
    let body: Value = resp.json().await.unwrap();
    let call = &body["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather");
    assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"mock": true, "n": 1}));

    let resp = anthropic(&env, "/v1/chat/completions")
        .json(&json!({"model": "claude-test", "stream": true, "tools": tools, "messages": [{"role": "user", "content": "weather?"}]}))
        .send()
        .await
        .unwrap();
    let chunks = data_events(&resp.text().await.unwrap());
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str())
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&streamed).unwrap(),
        json!({"mock": true, "n": 1})
    );
    assert!(chunks
        .iter()
        .any(|c| c["choices"][0]["finish_reason"] == "tool_calls"));

    let resp = anthropic(&env, "/v1/chat/completions")
        .json(&json!({"model": "claude-test", "max_tokens": 2, "messages": [{"role": "user", "content": "a long question"}]}))
        .send()
        .await
        .unwrap();
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["choices"][0]["finish_reason"], "length");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_errors_stream_errors_and_unsupported_routes() {
    let env = Env::start().await;
    let resp = anthropic(&env, "/v1/chat/completions")
        .header("x-mock-status", "429")
        .header("x-gw-forward-headers", "x-mock-status")
        .json(&hello("hi"))
        .send()
        .await
        .unwrap();
    let body = expect_error(resp, 429, None).await;
    assert_eq!(body["provider"], "anthropic");
    assert_eq!(
        body["error"]["message"],
        "anthropic error: mock injected status 429"
    );
    assert_eq!(body["error"]["type"], "rate_limit_error");

    let mut streamed = hello("one two three");
    streamed["stream"] = json!(true);
    let resp = anthropic(&env, "/v1/chat/completions")
        .header("x-mock-stream-error", "1")
        .header("x-gw-forward-headers", "x-mock-stream-error")
        .json(&streamed)
        .send()
        .await
        .unwrap();
    let text = resp.text().await.unwrap();
    let last = data_events(&text).pop().unwrap();
    assert_eq!(last["error"]["message"], "anthropic error: Overloaded");
    assert!(!text.contains("[DONE]"));

    let resp = anthropic(&env, "/v1/embeddings")
        .json(&json!({"model": "m", "input": "x"}))
        .send()
        .await
        .unwrap();
    expect_error(resp, 400, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_crosses_wire_formats() {
    let env = Env::start().await;
    let failing = env.mock.base_url().replace("/v1", "/x-mock/status=503/v1");
    let config = json!({"strategy": {"mode": "fallback"}, "targets": [
        {"provider": "openai", "api_key": "sk-o", "custom_host": failing},
        {"provider": "anthropic", "api_key": "sk-a", "custom_host": env.mock.base_url(),
         "override_params": {"model": "claude-fallback"}}
    ]});
    for stream in [false, true] {
        let mut body =
            json!({"model": "gpt-x", "messages": [{"role": "user", "content": "either way"}]});
        if stream {
            body["stream"] = json!(true);
        }
        let resp = env
            .gw_post("/v1/chat/completions")
            .header("x-gw-config", config.to_string())
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(
            resp.headers()["x-gw-last-used-option-index"],
            "config.targets[1]"
        );
        assert_eq!(resp.headers()["x-gw-provider"], "anthropic");
        let text = resp.text().await.unwrap();
        if stream {
            let content: String = data_events(&text)
                .iter()
                .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
                .collect();
            assert_eq!(content, "mock reply to: either way");
        } else {
            let body: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(body["model"], "claude-fallback");
            assert_eq!(
                body["choices"][0]["message"]["content"],
                "mock reply to: either way"
            );
        }
    }
    // The Anthropic request was re-encoded from the OpenAI one.
    let to_anthropic: Vec<_> = env
        .mock
        .requests()
        .into_iter()
        .filter(|r| r.path == "/v1/messages")
        .collect();
    assert_eq!(to_anthropic.len(), 2);
    assert_eq!(to_anthropic[0].json().unwrap()["model"], "claude-fallback");
    assert_eq!(to_anthropic[0].header("x-api-key"), Some("sk-a"));
}

/// A model's thinking comes back as `content_blocks` only when the client turns strict OpenAI
/// compliance off; by default answers keep to OpenAI's shapes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thinking_shows_only_without_strict_compliance() {
    let env = Env::start().await;
    let body = json!({"model": "claude-test", "max_tokens": 50,
        "thinking": {"type": "enabled", "budget_tokens": 20},
        "messages": [{"role": "user", "content": "think first"}]});
    let strict: Value = anthropic(&env, "/v1/chat/completions")
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        strict["choices"][0]["message"]
            .get("content_blocks")
            .is_none(),
        "{strict}"
    );
    assert_eq!(
        strict["choices"][0]["message"]["content"],
        "mock reply to: think first"
    );
    let open: Value = anthropic(&env, "/v1/chat/completions")
        .header("x-gw-strict-open-ai-compliance", "false")
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let blocks = open["choices"][0]["message"]["content_blocks"]
        .as_array()
        .unwrap_or_else(|| panic!("{open}"));
    assert!(blocks.iter().any(|b| b["type"] == "thinking"), "{open}");
}
