//! One suite, generated for every wire format the gateway translates: the client speaks OpenAI's
//! format; the mock provider speaks each provider's own and checks what it receives (required
//! headers, fields, a valid SigV4 signature), so a wrong request fails as surely as a wrong
//! translation.
//!
//! Each provider is addressed the way a client would (headers only); the gateway's
//! `provider_base_urls` points every provider at the mock.

use serde_json::{json, Value};

use crate::common::{expect_error, Env};

/// How a client reaches one provider through the gateway.
pub struct Case {
    /// `x-gw-provider`.
    pub id: &'static str,
    pub model: &'static str,
    /// An embeddings model, when the provider has embeddings.
    pub embed_model: Option<&'static str>,
    /// `dimensions` the embeddings model accepts.
    pub embed_dimensions: u64,
    /// Request headers besides `x-gw-provider` (credentials, provider settings).
    pub headers: &'static [(&'static str, &'static str)],
}

pub const OPENAI: Case = Case {
    id: "openai",
    model: "gpt-4o-mini",
    embed_model: Some("text-embedding-3-small"),
    embed_dimensions: 4,
    headers: &[("authorization", "Bearer sk-openai")],
};

pub const ANTHROPIC: Case = Case {
    id: "anthropic",
    model: "claude-3-5-haiku-latest",
    embed_model: None,
    embed_dimensions: 4,
    headers: &[("authorization", "Bearer sk-ant")],
};

pub const AZURE: Case = Case {
    id: "azure-openai",
    model: "gpt-4o",
    embed_model: Some("text-embedding-3-small"),
    embed_dimensions: 4,
    headers: &[
        ("authorization", "Bearer azure-key"),
        ("x-gw-azure-resource-name", "myresource"),
        ("x-gw-azure-deployment-id", "dep-1"),
        ("x-gw-azure-api-version", "2024-10-21"),
    ],
};

pub const GEMINI: Case = Case {
    id: "google",
    model: "gemini-2.0-flash",
    embed_model: Some("text-embedding-004"),
    embed_dimensions: 4,
    headers: &[("authorization", "Bearer gemini-key")],
};

pub const VERTEX: Case = Case {
    id: "vertex-ai",
    model: "gemini-2.0-flash",
    embed_model: Some("text-embedding-004"),
    embed_dimensions: 4,
    headers: &[
        ("authorization", "Bearer ya29.token"),
        ("x-gw-vertex-project-id", "proj-1"),
        ("x-gw-vertex-region", "us-central1"),
    ],
};

pub const BEDROCK: Case = Case {
    id: "bedrock",
    // A model id with `:` checks the path encoding that the signature covers.
    model: "anthropic.claude-3-5-sonnet-20240620-v1:0",
    embed_model: Some("amazon.titan-embed-text-v2:0"),
    embed_dimensions: 256,
    headers: &[
        ("x-gw-aws-access-key-id", mock_provider::AWS_ACCESS_KEY_ID),
        (
            "x-gw-aws-secret-access-key",
            mock_provider::AWS_SECRET_ACCESS_KEY,
        ),
        ("x-gw-aws-region", "us-east-1"),
    ],
};

pub const COHERE: Case = Case {
    id: "cohere",
    model: "command-r-plus",
    embed_model: Some("embed-english-v3.0"),
    embed_dimensions: 4,
    headers: &[("authorization", "Bearer co-key")],
};

/// The gateway's `provider_base_urls`: every provider at the mock, under its real base path.
const BASE_URLS: &str = "provider_base_urls:
  openai: {MOCK_ROOT}/v1
  anthropic: {MOCK_ROOT}/v1
  azure-openai: {MOCK_ROOT}/openai
  google: {MOCK_ROOT}/v1beta
  vertex-ai: {MOCK_ROOT}/v1
  bedrock: {MOCK_ROOT}
  cohere: {MOCK_ROOT}/v2
";

pub async fn env() -> Env {
    Env::start_with(BASE_URLS).await
}

pub fn request(env: &Env, case: &Case, path: &str) -> reqwest::RequestBuilder {
    let mut req = env
        .client
        .post(env.url(path))
        .header("x-gw-provider", case.id);
    for (k, v) in case.headers {
        req = req.header(*k, *v);
    }
    req
}

pub fn data_events(text: &str) -> Vec<Value> {
    text.split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("bad event {d:?}: {e}")))
        .collect()
}

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
}

async fn chat(env: &Env, case: &Case, body: Value) -> reqwest::Response {
    request(env, case, "/v1/chat/completions")
        .json(&body)
        .send()
        .await
        .expect("the gateway answers")
}

async fn ok_json(resp: reqwest::Response) -> Value {
    let status = resp.status();
    let text = resp.text().await.unwrap();
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

async fn ok_stream(resp: reqwest::Response) -> (String, Vec<Value>) {
    let status = resp.status();
    let ct = resp.headers()["content-type"].to_str().unwrap().to_owned();
    let text = resp.text().await.unwrap();
    assert_eq!(status, 200, "{text}");
    assert!(ct.starts_with("text/event-stream"), "{ct}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let events = data_events(&text);
    (text, events)
}

pub async fn plain_chat(case: &Case) {
    let env = env().await;
    let resp = chat(
        &env,
        case,
        json!({"model": case.model, "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hello there"}]}),
    )
    .await;
    assert_eq!(resp.headers()["x-gw-provider"], case.id);
    let body = ok_json(resp).await;
    assert_eq!(body["object"], "chat.completion", "{body}");
    assert!(body["id"].as_str().is_some_and(|s| !s.is_empty()), "{body}");
    assert!(
        body["model"].as_str().is_some_and(|s| !s.is_empty()),
        "{body}"
    );
    let choice = &body["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["message"]["content"], "mock reply to: hello there");
    assert_eq!(choice["finish_reason"], "stop");
    let usage = &body["usage"];
    assert!(usage["prompt_tokens"].as_u64().unwrap() > 0, "{body}");
    assert!(usage["completion_tokens"].as_u64().unwrap() > 0, "{body}");
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
    );
    assert_eq!(env.mock.request_count(), 1);
}

pub async fn streamed_chat(case: &Case) {
    let env = env().await;
    let resp = chat(
        &env,
        case,
        json!({"model": case.model, "stream": true, "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": "stream me a reply"}]}),
    )
    .await;
    let (_, chunks) = ok_stream(resp).await;
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk" && c["id"] == chunks[0]["id"]));
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "mock reply to: stream me a reply");
    let content_chunks = chunks
        .iter()
        .filter(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|s| !s.is_empty())
        })
        .count();
    assert!(content_chunks > 1, "the reply should arrive in pieces");
    let finishes: Vec<&str> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["finish_reason"].as_str())
        .collect();
    assert_eq!(finishes, ["stop"]);
    let usage = &chunks.last().unwrap()["usage"];
    assert!(usage["prompt_tokens"].as_u64().unwrap() > 0, "{usage}");
    assert!(usage["completion_tokens"].as_u64().unwrap() > 0, "{usage}");
}

pub async fn tool_call(case: &Case) {
    let env = env().await;
    let resp = chat(
        &env,
        case,
        json!({"model": case.model, "tools": tools(), "tool_choice": "required",
            "messages": [{"role": "user", "content": "weather in Paris?"}]}),
    )
    .await;
    let body = ok_json(resp).await;
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{body}");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    assert!(call["id"].as_str().is_some_and(|s| !s.is_empty()), "{body}");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"mock": true, "n": 1}));

    // The call's result goes back, and the provider sees it.
    let id = call["id"].as_str().unwrap();
    let resp = chat(
        &env,
        case,
        json!({"model": case.model, "tools": tools(), "messages": [
            {"role": "user", "content": "weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [call.clone()]},
            {"role": "tool", "tool_call_id": id, "content": "sunny"}]}),
    )
    .await;
    let body = ok_json(resp).await;
    let content = body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default();
    assert!(
        content.contains("sunny"),
        "the tool result did not arrive: {body}"
    );
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
}

pub async fn streamed_tool_call(case: &Case) {
    let env = env().await;
    let resp = chat(
        &env,
        case,
        json!({"model": case.model, "stream": true, "tools": tools(), "tool_choice": "required",
            "messages": [{"role": "user", "content": "weather in Paris?"}]}),
    )
    .await;
    let (text, chunks) = ok_stream(resp).await;
    let calls: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .collect();
    assert!(!calls.is_empty(), "{text}");
    assert!(calls.iter().all(|c| c["index"] == 0), "{text}");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert!(calls[0]["id"].as_str().is_some_and(|s| !s.is_empty()));
    let args: String = calls
        .iter()
        .filter_map(|c| c["function"]["arguments"].as_str())
        .collect();
    let args: Value = serde_json::from_str(&args).unwrap_or_else(|e| panic!("{e}: {args}"));
    assert_eq!(args, json!({"mock": true, "n": 1}));
    let finishes: Vec<&str> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["finish_reason"].as_str())
        .collect();
    assert_eq!(finishes, ["tool_calls"]);
}

pub async fn length_finish(case: &Case) {
    let env = env().await;
    let resp = chat(
        &env,
        case,
        json!({"model": case.model, "max_tokens": 2,
            "messages": [{"role": "user", "content": "a long answer please"}]}),
    )
    .await;
    let body = ok_json(resp).await;
    assert_eq!(body["choices"][0]["finish_reason"], "length", "{body}");
    let content = body["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(content.split_whitespace().count(), 2, "{body}");
}

pub async fn provider_error(case: &Case) {
    let env = env().await;
    let resp = request(&env, case, "/v1/chat/completions")
        .header("x-gw-forward-headers", "x-mock-status")
        .header("x-mock-status", "429")
        .json(&json!({"model": case.model, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    let body = expect_error(resp, 429, None).await;
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!("{} error: ", case.id)),
        "{body}"
    );
    assert!(message.len() > case.id.len() + 8, "{body}");
    assert_eq!(body["provider"], case.id);
}

pub async fn embeddings(case: &Case) {
    let env = env().await;
    let Some(model) = case.embed_model else {
        let resp = request(&env, case, "/v1/embeddings")
            .json(&json!({"model": "any", "input": "hi"}))
            .send()
            .await
            .unwrap();
        expect_error(resp, 400, None).await;
        assert_eq!(env.mock.request_count(), 0);
        return;
    };
    let resp = request(&env, case, "/v1/embeddings")
        .json(&json!({"model": model, "input": "the quick brown fox",
            "dimensions": case.embed_dimensions}))
        .send()
        .await
        .unwrap();
    let body = ok_json(resp).await;
    assert_eq!(body["object"], "list", "{body}");
    let data = body["data"].as_array().unwrap();
    assert_eq!(data.len(), 1);
    assert_eq!(data[0]["object"], "embedding");
    assert_eq!(data[0]["index"], 0);
    let vector = data[0]["embedding"].as_array().unwrap();
    assert_eq!(vector.len() as u64, case.embed_dimensions, "{body}");
    assert!(vector.iter().all(Value::is_f64), "{body}");
    assert!(body["usage"]["prompt_tokens"].is_u64(), "{body}");
    assert!(body["usage"]["total_tokens"].is_u64(), "{body}");
}

/// The suite, once per provider.
macro_rules! provider_suite {
    ($($name:ident => $case:expr),* $(,)?) => {$(
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn plain_chat() {
                super::plain_chat(&$case).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn streamed_chat() {
                super::streamed_chat(&$case).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn tool_call() {
                super::tool_call(&$case).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn streamed_tool_call() {
                super::streamed_tool_call(&$case).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn length_finish() {
                super::length_finish(&$case).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn provider_error() {
                super::provider_error(&$case).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn embeddings() {
                super::embeddings(&$case).await
            }
        }
    )*};
}

provider_suite! {
    openai => OPENAI,
    anthropic => ANTHROPIC,
    azure_openai => AZURE,
    google => GEMINI,
    vertex_ai => VERTEX,
    bedrock => BEDROCK,
    cohere => COHERE,
}
