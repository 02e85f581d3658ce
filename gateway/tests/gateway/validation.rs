//! Request validation through the gateway: every rule is a 400 naming `param`, before anything
//! reaches the provider.

use serde_json::{json, Value};

use crate::common::{expect_error, hello, Env};

fn with(field: &str, value: Value) -> Value {
    let mut body = hello("hi");
    body[field] = value;
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_chat_rule_is_a_400_naming_the_field() {
    let env = Env::start().await;
    let tools: Vec<Value> = (0..129)
        .map(|i| json!({"type": "function", "function": {"name": format!("f{i}")}}))
        .collect();
    let functions: Vec<Value> = (0..129).map(|i| json!({"name": format!("f{i}")})).collect();
    let mut logprobs_too_many = with("top_logprobs", json!(21));
    logprobs_too_many["logprobs"] = json!(true);
    let cases = vec![
        (json!({"model": "m", "messages": []}), "messages"),
        (json!({"model": "m"}), "messages"),
        (with("n", json!(0)), "n"),
        (with("n", json!(129)), "n"),
        (with("temperature", json!(2.5)), "temperature"),
        (with("top_p", json!(-0.1)), "top_p"),
        (with("frequency_penalty", json!(3)), "frequency_penalty"),
        (with("presence_penalty", json!(-3)), "presence_penalty"),
        (with("logit_bias", json!({"42": -101})), "logit_bias.42"),
        (with("top_logprobs", json!(3)), "top_logprobs"),
        (logprobs_too_many, "top_logprobs"),
        (with("stop", json!(["1", "2", "3", "4", "5"])), "stop"),
        (with("tools", json!(tools)), "tools"),
        (with("functions", json!([])), "functions"),
        (with("functions", json!(functions)), "functions"),
        (with("seed", json!(9.3e18)), "seed"),
        (
            with("stream_options", json!({"include_usage": true})),
            "stream_options",
        ),
    ];
    for (body, param) in cases {
        let resp = env.chat(body.clone()).await;
        expect_error(resp, 400, Some(param)).await;
    }
    assert!(env.mock.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_and_moderation_rules() {
    let env = Env::start().await;
    let many: Vec<String> = (0..2049).map(|i| format!("t{i}")).collect();
    for (body, param) in [
        (json!({"model": "e", "input": ""}), "input"),
        (json!({"model": "e", "input": []}), "input"),
        (json!({"model": "e", "input": many}), "input"),
        (
            json!({"model": "e", "input": "x", "dimensions": 0}),
            "dimensions",
        ),
        // " a" is one cl100k token: 8193 of them are one too many for the older model.
        (
            json!({"model": "text-embedding-ada-002", "input": ["ok", " a".repeat(8193)]}),
            "input",
        ),
    ] {
        let resp = env.post("/v1/embeddings").json(&body).send().await.unwrap();
        expect_error(resp, 400, Some(param)).await;
    }
    assert!(env.mock.requests().is_empty());
    let at_most = json!({"model": "text-embedding-ada-002", "input": " a".repeat(8192)});
    let resp = env
        .post("/v1/embeddings")
        .json(&at_most)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(env.mock.request_count(), 1);
    let resp = env
        .post("/v1/moderations")
        .json(&json!({"input": "x", "model": ""}))
        .send()
        .await
        .unwrap();
    expect_error(resp, 400, Some("model")).await;
    let resp = env
        .client
        .get(env.url("/v1/fine_tuning/jobs?limit=many"))
        .header("x-gw-provider", "@mock")
        .send()
        .await
        .unwrap();
    expect_error(resp, 400, Some("limit")).await;
    assert_eq!(
        env.mock.request_count(),
        1,
        "only the valid request went through"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_json_and_oversized_bodies() {
    let env = Env::start_with("max_body_bytes: 1048576\n").await;
    for bad in [
        "{\"messages\": [",
        "not json",
        "[]",
        "{\"messages\": \"hi\"}",
    ] {
        let resp = env
            .post("/v1/chat/completions")
            .header("content-type", "application/json")
            .body(bad)
            .send()
            .await
            .unwrap();
        expect_error(resp, 400, None).await;
    }
    let big = hello(&"x".repeat(2 * 1024 * 1024));
    let resp = env.chat(big).await;
    expect_error(resp, 413, None).await;
    // Invalid UTF-8 and random bytes do not hurt the process.
    let resp = env
        .post("/v1/chat/completions")
        .body(vec![0xff, 0xfe, 0x00, 0x01])
        .send()
        .await
        .unwrap();
    expect_error(resp, 400, None).await;
    let resp = env.chat(hello("still alive")).await;
    assert_eq!(resp.status(), 200);
}

/// A body sent in pieces without `content-length` (chunked): `pieces` of `piece_len` bytes whose
/// concatenation is a chat request padded with spaces.
fn chunked_chat(pieces: usize, piece_len: usize) -> reqwest::Body {
    let total = pieces * piece_len;
    let head =
        br#"{"model": "mock-model", "messages": [{"role": "user", "content": "in pieces"}]}"#;
    let mut bytes = head.to_vec();
    bytes.resize(total.max(head.len()), b' ');
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        bytes.chunks(piece_len).map(|c| Ok(c.to_vec())).collect();
    reqwest::Body::wrap_stream(futures_util::stream::iter(chunks))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_bodies_are_read_whole_and_held_to_the_limit() {
    let env = Env::start_with("max_body_bytes: 1048576\n").await;
    // Several pieces under the limit: read whole and answered.
    let resp = env
        .post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(chunked_chat(8, 16 * 1024))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let seen = env.mock.requests();
    let last = seen.last().expect("the mock got the request");
    assert_eq!(last.body.len(), 8 * 16 * 1024, "the body arrived whole");
    assert_eq!(
        last.json().expect("JSON")["messages"][0]["content"],
        "in pieces"
    );
    // Over the limit with no declared length: refused once the pieces pass it.
    let resp = env
        .post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(chunked_chat(40, 64 * 1024))
        .send()
        .await;
    match resp {
        Ok(resp) => {
            expect_error(resp, 413, None).await;
        }
        // The gateway may answer and close before the client has sent every piece.
        Err(e) => assert!(e.is_request() || e.is_body(), "{e}"),
    }
    assert_eq!(
        env.mock.requests().len(),
        seen.len(),
        "nothing oversized went upstream"
    );
    let resp = env.chat(hello("still alive")).await;
    assert_eq!(resp.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_gateway_headers_are_400s_naming_the_header() {
    let env = Env::start().await;
    for (name, value) in [
        ("x-gw-metadata", "{broken"),
        ("x-gw-metadata", "[1]"),
        ("x-gw-request-timeout", "soon"),
        ("x-gw-cache-force-refresh", "maybe"),
    ] {
        let resp = env
            .post("/v1/chat/completions")
            .header(name, value)
            .json(&hello("hi"))
            .send()
            .await
            .unwrap();
        expect_error(resp, 400, Some(name)).await;
    }
}
