//! The first-class routes against the mock provider.

use serde_json::{json, Value};

use crate::common::{hello, Env, MOCK_KEY};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_completion_is_relayed_with_gateway_headers() {
    let env = Env::start().await;
    let resp = env
        .chat(json!({"model": "gpt-test", "n": 2, "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hello there"}
        ]}))
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-gw-provider"], "openai");
    assert!(!resp.headers()["x-gw-trace-id"].is_empty());
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "gpt-test");
    assert_eq!(body["choices"].as_array().unwrap().len(), 2);
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "mock reply to: hello there"
    );
    assert!(body["usage"]["total_tokens"].as_u64().unwrap() > 0);

    // The provider saw the saved key, the client's body byte for byte, and none of our headers.
    let seen = env.mock.requests();
    assert_eq!(seen.len(), 1);
    let req = &seen[0];
    assert_eq!(req.path, "/v1/chat/completions");
    assert_eq!(
        req.header("authorization"),
        Some(format!("Bearer {MOCK_KEY}").as_str())
    );
    assert_eq!(req.json().unwrap()["messages"][1]["content"], "hello there");
    assert!(
        req.headers.iter().all(|(n, _)| !n.starts_with("x-gw-")),
        "{:?}",
        req.headers
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_come_back_as_sent_by_the_provider() {
    let env = Env::start().await;
    let mut body = hello("weather?");
    body["tools"] = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]);
    let resp = env.chat(body).await;
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    let call = &body["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather");
    assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_and_moderations() {
    let env = Env::start().await;
    let resp = env
        .post("/v1/embeddings")
        .json(&json!({"model": "emb", "input": ["one two", "three"], "dimensions": 4}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["object"], "list");
    assert_eq!(body["data"].as_array().unwrap().len(), 2);
    assert_eq!(body["data"][1]["embedding"].as_array().unwrap().len(), 4);
    assert_eq!(body["usage"]["prompt_tokens"], 3);

    let resp = env
        .post("/v1/moderations")
        .json(&json!({"input": "I will attack", "model": "text-moderation-stable"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["results"][0]["flagged"], true);
    assert_eq!(body["results"][0]["categories"]["violence"], true);

    // Any model name goes to the provider (providers add models); the spec's are not a list.
    let resp = env
        .post("/v1/moderations")
        .json(&json!({"input": "hello", "model": "omni-moderation-latest"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let seen = env.mock.requests();
    let sent: Value = serde_json::from_slice(&seen.last().unwrap().body).unwrap();
    assert_eq!(sent["model"], "omni-moderation-latest");
}

/// An answer of several megabytes reaches the gateway in many reads; it is relayed whole, the
/// same bytes the provider sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_megabyte_answer_arrives_whole() {
    let env = Env::start().await;
    let inputs: Vec<String> = (0..64).map(|i| format!("input number {i}")).collect();
    let request = json!({"model": "emb", "input": inputs, "dimensions": 3072});
    let direct = env
        .bare
        .post(format!("{}/embeddings", env.mock.base_url()))
        .bearer_auth(MOCK_KEY)
        .json(&request)
        .send()
        .await
        .unwrap();
    assert_eq!(direct.status(), 200);
    let direct = direct.bytes().await.unwrap();
    assert!(
        direct.len() > 1 << 20,
        "the answer is {} bytes",
        direct.len()
    );

    let resp = env
        .post("/v1/embeddings")
        .json(&request)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let relayed = resp.bytes().await.unwrap();
    assert_eq!(relayed.len(), direct.len());
    assert!(
        relayed == direct,
        "the relayed answer differs from the provider's"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fine_tuning_jobs_pass_after_and_limit() {
    let env = Env::start().await;
    let resp = env
        .client
        .get(env.url("/v1/fine_tuning/jobs?after=ftjob-mock-004&limit=3"))
        .header("x-gw-provider", "@mock")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    let ids: Vec<_> = body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].clone())
        .collect();
    assert_eq!(
        ids,
        vec!["ftjob-mock-005", "ftjob-mock-006", "ftjob-mock-007"]
    );
    assert_eq!(body["has_more"], true);
    assert_eq!(body["object"], "list");
    assert_eq!(
        env.mock.requests()[0].query.as_deref(),
        Some("after=ftjob-mock-004&limit=3")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_unknown_routes() {
    let env = Env::start().await;
    let resp = env.client.get(env.url("/health")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.json::<Value>().await.unwrap()["status"], "ok");
    let resp = env.client.get(env.url("/nope")).send().await.unwrap();
    assert_eq!(resp.status(), 404);
    let resp = env
        .client
        .patch(env.url("/v1/files/x"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_hop_by_hop_headers_stay_behind() {
    let env = Env::start().await;
    let resp = env
        .post("/v1/chat/completions")
        .header("x-team", "blue")
        .header("keep-alive", "timeout=5")
        .header("proxy-authorization", "Basic c2VjcmV0")
        .header(
            "x-gw-forward-headers",
            "x-team, keep-alive, proxy-authorization",
        )
        .json(&hello("hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let req = &env.mock.requests()[0];
    assert_eq!(req.header("x-team"), Some("blue"));
    assert_eq!(req.header("keep-alive"), None);
    assert_eq!(req.header("proxy-authorization"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_errors_keep_their_status_and_name_the_provider() {
    let env = Env::start().await;
    let resp = env
        .post("/v1/chat/completions")
        .header("x-mock-status", "429")
        .header("x-gw-forward-headers", "x-mock-status")
        .json(&hello("hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 429);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["provider"], "openai");
    assert_eq!(
        body["error"]["message"],
        "openai error: mock injected status 429"
    );
    // Forwarded because the client asked for it.
    assert_eq!(env.mock.requests()[0].header("x-mock-status"), Some("429"));
}

/// Clients built for the reference product read its names of the gateway's response headers:
/// they come beside the `x-gw-*` ones on every answer (whole, streamed, errors, passthrough),
/// unless `compat.reference_response_headers: false`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_response_headers_come_beside_the_gateways_own() {
    let env = Env::start().await;
    let same = |resp: &reqwest::Response, names: &[&str]| {
        for name in names {
            let ours = resp.headers().get(format!("x-gw-{name}"));
            let theirs = resp.headers().get(format!("x-portkey-{name}"));
            assert!(ours.is_some(), "x-gw-{name} missing");
            assert_eq!(ours, theirs, "x-portkey-{name}");
        }
    };
    let resp = env.chat(hello("hi")).await;
    assert_eq!(resp.status(), 200);
    same(&resp, &["trace-id", "provider"]);
    let mut stream = hello("hi");
    stream["stream"] = json!(true);
    let resp = env.chat(stream).await;
    same(&resp, &["trace-id", "provider"]);
    let resp = env.chat(json!({"model": "m", "messages": []})).await;
    assert_eq!(resp.status(), 400);
    same(&resp, &["trace-id"]);
    let config = json!({"strategy": {"mode": "fallback"}, "cache": {"mode": "simple"},
        "targets": [{"provider": "openai", "api_key": "k", "custom_host": env.mock.base_url()}]});
    for _ in 0..2 {
        let resp = env
            .gw_post("/v1/chat/completions")
            .header("x-gw-config", config.to_string())
            .json(&hello("cached"))
            .send()
            .await
            .unwrap();
        same(
            &resp,
            &[
                "trace-id",
                "provider",
                "cache-status",
                "last-used-option-index",
                "retry-attempt-count",
            ],
        );
    }
    let resp = env
        .client
        .get(env.url("/v1/models"))
        .header("x-gw-provider", "@mock")
        .send()
        .await
        .unwrap();
    same(&resp, &["trace-id", "provider"]);

    let off = Env::start_with("compat:\n  reference_response_headers: false\n").await;
    let resp = off.chat(hello("hi")).await;
    assert!(resp.headers().get("x-gw-trace-id").is_some());
    assert!(resp.headers().get("x-portkey-trace-id").is_none());
}
