//! What each cloud needs beyond the shared provider suite: how requests are addressed and
//! authenticated (Azure deployments, Vertex projects and regions, SigV4), and the answers only
//! some providers give.

use serde_json::{json, Value};

use crate::common::{expect_error, Env};
use crate::providers::{env, request, AZURE, BEDROCK, COHERE, GEMINI, VERTEX};

fn hi(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_addresses_the_deployment_with_its_api_key() {
    let env = env().await;
    let resp = request(&env, &AZURE, "/v1/chat/completions")
        .json(&hi("gpt-4o"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    let seen = &env.mock.requests()[0];
    assert_eq!(seen.path, "/openai/deployments/dep-1/chat/completions");
    assert_eq!(seen.query.as_deref(), Some("api-version=2024-10-21"));
    assert_eq!(seen.header("api-key"), Some("azure-key"));
    assert_eq!(seen.header("authorization"), None);

    // Without a deployment there is nothing to address.
    let resp = env
        .gw_post("/v1/chat/completions")
        .header("x-gw-provider", "azure-openai")
        .header("authorization", "Bearer k")
        .json(&hi("gpt-4o"))
        .send()
        .await
        .unwrap();
    expect_error(resp, 400, Some("x-gw-azure-deployment-id")).await;
    assert_eq!(env.mock.request_count(), 1);
}

/// A deployment's name says nothing of its model: an Azure target's `azure_model_name` (on its
/// saved provider or config) is the model that logs, metrics and prices name, in whole answers
/// and streams. A request's own `x-gw-azure-model-name` does not rename the answer's model: a
/// client must not turn a priced model into an unpriced one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_azure_model_name_names_the_model() {
    let env = env().await;
    let config = json!({"provider": "azure-openai", "api_key": "azure-key",
        "azure_resource_name": "myresource", "azure_deployment_id": "dep-1",
        "azure_model_name": "gpt-4o-mini"});
    let mut stream = hi("my-deployment-alias");
    stream["stream"] = json!(true);
    for body in [hi("my-deployment-alias"), stream] {
        let resp = env
            .client
            .post(env.url("/v1/chat/completions"))
            .header("x-gw-config", config.to_string())
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        resp.text().await.unwrap();
    }
    let resp = request(&env, &AZURE, "/v1/chat/completions")
        .header("x-gw-azure-model-name", "a-model-nobody-prices")
        .json(&hi("gpt-4o"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let metrics = env.metrics().await;
    let named = metrics
        .lines()
        .find(|l| {
            l.starts_with("gw_requests_total{")
                && l.contains("provider=\"azure-openai\"")
                && l.contains("model=\"gpt-4o-mini\"")
        })
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(named.ends_with(" 2"), "{named}");
    assert!(
        !metrics.contains("model=\"my-deployment-alias\""),
        "{metrics}"
    );
    assert!(!metrics.contains("a-model-nobody-prices"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_takes_the_key_in_its_own_header() {
    let env = env().await;
    let resp = request(&env, &GEMINI, "/v1/chat/completions")
        .json(&hi("gemini-2.0-flash"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    let seen = &env.mock.requests()[0];
    assert_eq!(seen.path, "/v1beta/models/gemini-2.0-flash:generateContent");
    assert_eq!(seen.header("x-goog-api-key"), Some("gemini-key"));
    assert_eq!(seen.header("authorization"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_safety_stop_is_a_content_filter_finish() {
    let env = env().await;
    let resp = request(&env, &GEMINI, "/v1/chat/completions")
        .json(&json!({"model": "gemini-2.0-flash", "messages": [{"role": "user", "content": "something unsafe"}]}))
        .send()
        .await
        .unwrap();
    let body: Value = resp.json().await.unwrap();
    assert_eq!(
        body["choices"][0]["finish_reason"], "content_filter",
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vertex_addresses_project_and_region_and_serves_claude() {
    let env = env().await;
    let resp = request(&env, &VERTEX, "/v1/chat/completions")
        .json(&hi("gemini-2.0-flash"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-mock-vertex-project"], "proj-1");
    assert_eq!(resp.headers()["x-mock-vertex-region"], "us-central1");
    let seen = &env.mock.requests()[0];
    assert_eq!(
        seen.path,
        "/v1/projects/proj-1/locations/us-central1/publishers/google/models/gemini-2.0-flash:generateContent"
    );
    assert_eq!(seen.header("authorization"), Some("Bearer ya29.token"));
    assert_eq!(seen.header("x-vertex-ai-llm-request-type"), None);

    // Google's request type goes to Vertex, checked; never to another provider.
    for (sent, forwarded) in [("dedicated", "dedicated"), ("Shared", "shared")] {
        env.mock.clear_requests();
        let resp = request(&env, &VERTEX, "/v1/chat/completions")
            .header("x-vertex-ai-llm-request-type", sent)
            .json(&hi("gemini-2.0-flash"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let seen = &env.mock.requests()[0];
        assert_eq!(seen.header("x-vertex-ai-llm-request-type"), Some(forwarded));
    }
    let resp = request(&env, &VERTEX, "/v1/chat/completions")
        .header("x-vertex-ai-llm-request-type", "priority")
        .json(&hi("gemini-2.0-flash"))
        .send()
        .await
        .unwrap();
    expect_error(resp, 400, Some("x-vertex-ai-llm-request-type")).await;
    env.mock.clear_requests();
    let resp = request(&env, &GEMINI, "/v1/chat/completions")
        .header("x-vertex-ai-llm-request-type", "dedicated")
        .json(&hi("gemini-2.0-flash"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let seen = &env.mock.requests()[0];
    assert_eq!(seen.header("x-vertex-ai-llm-request-type"), None);
    env.mock.clear_requests();

    // Anthropic's models on Vertex speak Anthropic's format.
    let resp = request(&env, &VERTEX, "/v1/chat/completions")
        .json(
            &json!({"model": "claude-3-5-sonnet-v2@20241022", "stream": true,
            "messages": [{"role": "user", "content": "hello claude"}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    let content: String = crate::providers::data_events(&text)
        .iter()
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(content, "mock reply to: hello claude", "{text}");
    let seen = &env.mock.requests()[0];
    assert!(
        seen.path.ends_with(
            "/publishers/anthropic/models/claude-3-5-sonnet-v2@20241022:streamRawPredict"
        ),
        "{}",
        seen.path
    );
    let sent = seen.json().unwrap();
    assert_eq!(sent["anthropic_version"], "vertex-2023-10-16");
    assert!(sent.get("model").is_none());

    let resp = env
        .gw_post("/v1/chat/completions")
        .header("x-gw-provider", "vertex-ai")
        .header("authorization", "Bearer t")
        .header("x-gw-vertex-project-id", "p")
        .json(&hi("gemini-2.0-flash"))
        .send()
        .await
        .unwrap();
    expect_error(resp, 400, Some("x-gw-vertex-region")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bedrock_requests_are_signed_and_checked() {
    let env = env().await;
    let resp = request(&env, &BEDROCK, "/v1/chat/completions")
        .header("x-gw-aws-session-token", "session-1")
        .json(&hi(BEDROCK.model))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    let seen = &env.mock.requests()[0];
    assert_eq!(
        seen.path,
        "/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse"
    );
    assert!(seen
        .header("authorization")
        .is_some_and(|a| a.starts_with("AWS4-HMAC-SHA256 Credential=AKIDMOCKPROVIDER/")));
    assert_eq!(seen.header("x-amz-security-token"), Some("session-1"));

    // A wrong secret makes a signature the mock rejects, as AWS would.
    let resp = env
        .gw_post("/v1/chat/completions")
        .header("x-gw-provider", "bedrock")
        .header("x-gw-aws-access-key-id", mock_provider::AWS_ACCESS_KEY_ID)
        .header("x-gw-aws-secret-access-key", "not-the-secret")
        .header("x-gw-aws-region", "us-east-1")
        .json(&hi(BEDROCK.model))
        .send()
        .await
        .unwrap();
    let body = expect_error(resp, 403, None).await;
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("bedrock error: "));

    // Without credentials nothing is sent.
    let resp = env
        .gw_post("/v1/chat/completions")
        .header("x-gw-provider", "bedrock")
        .header("x-gw-aws-region", "us-east-1")
        .json(&hi(BEDROCK.model))
        .send()
        .await
        .unwrap();
    expect_error(resp, 400, Some("x-gw-aws-access-key-id")).await;
    assert_eq!(env.mock.request_count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bedrock_embeds_with_titan_and_cohere_models() {
    let env = env().await;
    let resp = request(&env, &BEDROCK, "/v1/embeddings")
        .json(&json!({"model": "cohere.embed-english-v3", "input": ["one", "two", "three"]}))
        .send()
        .await
        .unwrap();
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["data"].as_array().map(Vec::len), Some(3), "{body}");
    assert_eq!(body["data"][2]["index"], 2);

    // Titan embeds one text per call.
    let resp = request(&env, &BEDROCK, "/v1/embeddings")
        .json(&json!({"model": "amazon.titan-embed-text-v2:0", "input": ["one", "two"]}))
        .send()
        .await
        .unwrap();
    expect_error(resp, 400, Some("input")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cohere_embeds_many_inputs_with_usage() {
    let env = env().await;
    let resp = request(&env, &COHERE, "/v1/embeddings")
        .json(&json!({"model": "embed-english-v3.0", "input": ["one two", "three"]}))
        .send()
        .await
        .unwrap();
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["data"].as_array().map(Vec::len), Some(2), "{body}");
    assert!(
        body["usage"]["prompt_tokens"].as_u64().unwrap() > 0,
        "{body}"
    );
    let sent = env.mock.requests()[0].json().unwrap();
    assert_eq!(sent["texts"], json!(["one two", "three"]));
}

fn anthropic_body(stream: bool) -> Value {
    json!({"model": "claude-3-5-haiku-latest", "max_tokens": 64, "stream": stream,
        "messages": [{"role": "user", "content": "hello from an anthropic client"}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_format_clients_reach_anthropic_vertex_and_bedrock() {
    let env = env().await;
    let cases: [(&crate::providers::Case, &str); 3] = [
        (&crate::providers::ANTHROPIC, "/v1/messages"),
        (&VERTEX, ":rawPredict"),
        (&BEDROCK, "/invoke"),
    ];
    for (i, (case, path_end)) in cases.into_iter().enumerate() {
        let mut body = anthropic_body(false);
        if case.id == "bedrock" {
            body["model"] = json!("anthropic.claude-3-5-haiku-20241022-v1:0");
        }
        let resp = request(&env, case, "/v1/messages")
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let answer: Value = resp.json().await.unwrap();
        assert_eq!(status, 200, "{}: {answer}", case.id);
        // The answer is Anthropic's message, not an OpenAI completion.
        assert_eq!(answer["type"], "message", "{}: {answer}", case.id);
        assert_eq!(
            answer["content"][0]["text"],
            "mock reply to: hello from an anthropic client"
        );
        let seen = &env.mock.requests()[i];
        assert!(seen.path.ends_with(path_end), "{}: {}", case.id, seen.path);
        let sent = seen.json().unwrap();
        if case.id == "anthropic" {
            assert_eq!(sent, body, "anthropic gets the client's body untouched");
        } else {
            assert!(sent.get("model").is_none(), "{sent}");
            assert!(sent["anthropic_version"].is_string(), "{sent}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_format_streams_come_back_as_anthropic_events() {
    let env = env().await;
    for case in [&crate::providers::ANTHROPIC, &VERTEX, &BEDROCK] {
        let mut body = anthropic_body(true);
        if case.id == "bedrock" {
            body["model"] = json!("anthropic.claude-3-5-haiku-20241022-v1:0");
        }
        let resp = request(&env, case, "/v1/messages")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{}", case.id);
        assert!(resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream"));
        let text = resp.text().await.unwrap();
        let events = crate::providers::data_events(&text);
        assert_eq!(events[0]["type"], "message_start", "{}: {text}", case.id);
        assert_eq!(
            events.last().unwrap()["type"],
            "message_stop",
            "{}: {text}",
            case.id
        );
        let reply: String = events
            .iter()
            .filter_map(|e| e["delta"]["text"].as_str())
            .collect();
        assert_eq!(
            reply, "mock reply to: hello from an anthropic client",
            "{}",
            case.id
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_format_is_refused_for_providers_that_do_not_speak_it() {
    let env = env().await;
    let resp = request(&env, &COHERE, "/v1/messages")
        .json(&anthropic_body(false))
        .send()
        .await
        .unwrap();
    expect_error(resp, 400, Some("x-gw-provider")).await;
    let resp = request(&env, &crate::providers::ANTHROPIC, "/v1/messages")
        .json(&json!({"model": "claude", "messages": []}))
        .send()
        .await
        .unwrap();
    expect_error(resp, 400, Some("max_tokens")).await;
    assert_eq!(env.mock.request_count(), 0);
}

/// The cost counted for Vertex AI answers (`gw_cost_usd_total`), 0 when none was.
async fn vertex_cost(env: &Env) -> f64 {
    env.metrics()
        .await
        .lines()
        .filter(|l| l.starts_with("gw_cost_usd_total{") && l.contains("provider=\"vertex-ai\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `skipPtuCostAttribution` on a Vertex AI integration: an answer Vertex served from
/// Provisioned Throughput (its `usageMetadata.trafficType`) costs nothing, whole or streamed;
/// a pay-as-you-go answer is priced as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provisioned_throughput_answers_cost_nothing_when_the_integration_says_so() {
    let env = env().await;
    let (status, made) = env
        .admin_call(
            reqwest::Method::POST,
            "/v1/integrations",
            Some(crate::common::ADMIN_KEY),
            Some(
                json!({"name": "Vertex PTU", "ai_provider_id": "vertex-ai", "key": "ya29.token",
                "configurations": {"vertex_project_id": "proj-1", "vertex_region": "us-central1",
                                   "skipPtuCostAttribution": true}}),
            ),
        )
        .await;
    assert_eq!(status, 200, "{made}");
    let provider = format!("@{}", made["default_provider_slug"].as_str().unwrap());
    let ask = |dedicated: bool, stream: bool| {
        let mut body = hi("gemini-2.0-flash");
        if stream {
            body["stream"] = json!(true);
        }
        let mut req = env
            .gw_post("/v1/chat/completions")
            .header("x-gw-provider", provider.as_str());
        if dedicated {
            req = req.header("x-vertex-ai-llm-request-type", "dedicated");
        }
        async move {
            let resp = req.json(&body).send().await.unwrap();
            assert_eq!(resp.status(), 200);
            resp.text().await.unwrap()
        }
    };
    ask(true, false).await;
    ask(true, true).await;
    assert_eq!(
        vertex_cost(&env).await,
        0.0,
        "Provisioned Throughput is paid for"
    );
    ask(false, false).await;
    assert!(vertex_cost(&env).await > 0.0, "pay-as-you-go is priced");
}
