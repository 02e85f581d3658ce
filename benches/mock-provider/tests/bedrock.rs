//! End-to-end tests of the Bedrock routes over a raw HTTP/1.1 client, with
//! requests signed by the crate's SigV4 signer and event streams decoded
//! (and CRC-checked) here independently of the mock's encoder.

mod common;

use std::time::SystemTime;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use common::{request, Conn, Response};
use mock_provider::sigv4::{self, Credentials, Unsigned};
use mock_provider::{MockProvider, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY};
use serde_json::{json, Value};

/// The host header the test client sends.
const HOST: &str = "127.0.0.1";
const CLAUDE: &str = "anthropic.claude-3-haiku-20240307-v1%3A0";

fn credentials(session_token: Option<&str>) -> Credentials<'_> {
    Credentials {
        access_key_id: AWS_ACCESS_KEY_ID,
        secret_access_key: AWS_SECRET_ACCESS_KEY,
        session_token,
    }
}

/// The headers of a signed JSON POST of `body` to `path` (besides `host`,
/// which the client always sends).
fn signed(path: &str, body: &[u8], creds: &Credentials<'_>, region: &str) -> Vec<(String, String)> {
    let unsigned = Unsigned {
        method: "POST",
        path_and_query: path,
        headers: &[("host", HOST), ("content-type", "application/json")],
        body,
    };
    let mut headers = vec![("content-type".to_owned(), "application/json".to_owned())];
    headers.extend(sigv4::sign(
        &unsigned,
        creds,
        region,
        "bedrock",
        SystemTime::now(),
    ));
    headers
}

async fn send(
    mock: &MockProvider,
    path: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> Response {
    let headers: Vec<(&str, &str)> = headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    request(mock.addr(), "POST", path, &headers, body).await
}

/// POSTs `body` to `path`, signed for `us-east-1`, plus unsigned `extra`
/// headers.
async fn post_with(
    mock: &MockProvider,
    path: &str,
    body: &Value,
    extra: &[(&str, &str)],
) -> Response {
    let bytes = body.to_string().into_bytes();
    let mut headers = signed(path, &bytes, &credentials(None), "us-east-1");
    headers.extend(
        extra
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned())),
    );
    send(mock, path, &headers, &bytes).await
}

async fn post(mock: &MockProvider, path: &str, body: &Value) -> Response {
    post_with(mock, path, body, &[]).await
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

/// Checks AWS's error shape and returns the message.
fn assert_aws_error(resp: &Response, status: u16, kind: &str) -> String {
    assert_eq!(
        resp.status(),
        status,
        "body: {}",
        String::from_utf8_lossy(&resp.body)
    );
    assert_eq!(resp.header("x-amzn-errortype"), Some(kind));
    assert!(resp.header("x-amzn-requestid").is_some());
    let body = resp.json();
    assert_eq!(body.as_object().map(|o| o.len()), Some(1), "{body}");
    body["message"]
        .as_str()
        .unwrap_or_else(|| panic!("no message: {body}"))
        .to_owned()
}

fn converse_body(text: &str) -> Value {
    json!({
        "messages": [
            {"role": "user", "content": [{"text": "an earlier question"}]},
            {"role": "assistant", "content": [{"text": "an answer"}]},
            {"role": "user", "content": [{"text": text}]},
        ],
        "system": [{"text": "be brief"}],
        "inferenceConfig": {"maxTokens": 100, "temperature": 0.2},
    })
}

fn tool_config() -> Value {
    json!({
        "tools": [
            {"toolSpec": {"name": "get_weather", "description": "weather", "inputSchema": {"json": {"type": "object"}}}},
            {"toolSpec": {"name": "search", "inputSchema": {"json": {"type": "object"}}}},
        ],
    })
}

// ---------------------------------------------------------------------------
// An eventstream decoder written from the format description, checking both
// CRCs of every message.
// ---------------------------------------------------------------------------

#[derive(Debug)]
struct Message {
    headers: Vec<(String, String)>,
    payload: Vec<u8>,
}

impl Message {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.payload).expect("payload is JSON")
    }

    /// `:event-type`, or `:exception-type` for exceptions.
    fn kind(&self) -> &str {
        self.header(":event-type")
            .or_else(|| self.header(":exception-type"))
            .unwrap_or("")
    }
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn decode_stream(mut bytes: &[u8]) -> Vec<Message> {
    let mut messages = Vec::new();
    while !bytes.is_empty() {
        assert!(bytes.len() >= 16, "truncated message");
        let total = u32_at(bytes, 0) as usize;
        let headers_len = u32_at(bytes, 4) as usize;
        assert_eq!(
            u32_at(bytes, 8),
            crc32fast::hash(&bytes[..8]),
            "prelude CRC"
        );
        assert!(total <= bytes.len() && 16 + headers_len <= total, "lengths");
        assert_eq!(
            u32_at(bytes, total - 4),
            crc32fast::hash(&bytes[..total - 4]),
            "message CRC"
        );
        let mut headers = Vec::new();
        let mut h = &bytes[12..12 + headers_len];
        while !h.is_empty() {
            let name_len = usize::from(h[0]);
            let name = std::str::from_utf8(&h[1..1 + name_len]).expect("name");
            assert_eq!(h[1 + name_len], 7, "string header");
            let value_len = usize::from(u16::from_be_bytes([h[2 + name_len], h[3 + name_len]]));
            let start = 4 + name_len;
            let value = std::str::from_utf8(&h[start..start + value_len]).expect("value");
            headers.push((name.to_owned(), value.to_owned()));
            h = &h[start + value_len..];
        }
        messages.push(Message {
            headers,
            payload: bytes[12 + headers_len..total - 4].to_vec(),
        });
        bytes = &bytes[total..];
    }
    messages
}

fn stream_messages(resp: &Response) -> Vec<Message> {
    assert_eq!(
        resp.status(),
        200,
        "body: {}",
        String::from_utf8_lossy(&resp.body)
    );
    assert_eq!(
        resp.header("content-type"),
        Some("application/vnd.amazon.eventstream")
    );
    let messages = decode_stream(&resp.body);
    for m in &messages {
        assert_eq!(m.header(":content-type"), Some("application/json"));
    }
    messages
}

// ---------------------------------------------------------------------------
// Converse
// ---------------------------------------------------------------------------

#[tokio::test]
async fn converse_replies_to_the_last_user_text() {
    let mock = MockProvider::start().await;
    let path = format!("/model/{CLAUDE}/converse");
    let resp = post(&mock, &path, &converse_body("hello there")).await;
    let body = ok_json(&resp);
    assert_eq!(
        body["output"]["message"],
        json!({"role": "assistant", "content": [{"text": "mock reply to: hello there"}]})
    );
    assert_eq!(body["stopReason"], "end_turn");
    // be brief (2) + an earlier question (3) + an answer (2) + hello there (2)
    assert_eq!(
        body["usage"],
        json!({"inputTokens": 9, "outputTokens": 5, "totalTokens": 14})
    );
    assert_eq!(body["metrics"]["latencyMs"], 1);
    assert_eq!(resp.header("x-mock-aws-region"), Some("us-east-1"));
    assert_eq!(resp.header("x-mock-aws-session-token"), None);
    assert!(resp.header("x-amzn-requestid").is_some());
}

#[tokio::test]
async fn converse_exposes_region_and_session_token() {
    let mock = MockProvider::start().await;
    let path = format!("/model/{CLAUDE}/converse");
    let body = converse_body("hi").to_string().into_bytes();
    let headers = signed(
        &path,
        &body,
        &credentials(Some("FwoGZXIv/token+=")),
        "eu-central-1",
    );
    let resp = send(&mock, &path, &headers, &body).await;
    ok_json(&resp);
    assert_eq!(resp.header("x-mock-aws-region"), Some("eu-central-1"));
    assert_eq!(
        resp.header("x-mock-aws-session-token"),
        Some("FwoGZXIv/token+=")
    );
}

#[tokio::test]
async fn converse_limits_stops_and_words() {
    let mock = MockProvider::start().await;
    let path = format!("/model/{CLAUDE}/converse");
    let mut body = converse_body("one two three");
    body["inferenceConfig"] = json!({"maxTokens": 4});
    let reply = ok_json(&post(&mock, &path, &body).await);
    assert_eq!(
        reply["output"]["message"]["content"][0]["text"],
        "mock reply to: one"
    );
    assert_eq!(reply["stopReason"], "max_tokens");

    body["inferenceConfig"] = json!({"stopSequences": ["two"]});
    let reply = ok_json(&post(&mock, &path, &body).await);
    assert_eq!(
        reply["output"]["message"]["content"][0]["text"],
        "mock reply to: one "
    );
    assert_eq!(reply["stopReason"], "stop_sequence");

    // The words fault, given as a path prefix that is signed with the rest
    // of the path.
    let prefixed = format!("/x-mock/words=3/model/{CLAUDE}/converse");
    let reply = ok_json(&post(&mock, &prefixed, &converse_body("x")).await);
    assert_eq!(reply["output"]["message"]["content"][0]["text"], "w1 w2 w3");
    assert_eq!(reply["usage"]["outputTokens"], 3);
}

#[tokio::test]
async fn converse_calls_tools_then_answers_the_result() {
    let mock = MockProvider::start().await;
    let path = format!("/model/{CLAUDE}/converse");
    let mut body = converse_body("weather in Paris?");
    body["toolConfig"] = tool_config();
    let reply = ok_json(&post(&mock, &path, &body).await);
    assert_eq!(reply["stopReason"], "tool_use");
    assert_eq!(
        reply["output"]["message"]["content"],
        json!([{"toolUse": {"toolUseId": "tooluse_mock_0", "name": "get_weather", "input": {"mock": true, "n": 1}}}])
    );

    body["toolConfig"]["toolChoice"] = json!({"tool": {"name": "search"}});
    let reply = ok_json(&post(&mock, &path, &body).await);
    assert_eq!(
        reply["output"]["message"]["content"][0]["toolUse"]["name"],
        "search"
    );

    let messages = body["messages"].as_array_mut().expect("messages");
    messages.push(json!({"role": "assistant", "content": [
        {"toolUse": {"toolUseId": "tooluse_mock_0", "name": "search", "input": {"mock": true, "n": 1}}}
    ]}));
    messages.push(json!({"role": "user", "content": [
        {"toolResult": {"toolUseId": "tooluse_mock_0", "content": [{"json": {"temp": 21}}], "status": "success"}}
    ]}));
    let reply = ok_json(&post(&mock, &path, &body).await);
    assert_eq!(reply["stopReason"], "end_turn");
    assert_eq!(
        reply["output"]["message"]["content"][0]["text"],
        "mock reply to: {\"temp\":21}"
    );
}

#[tokio::test]
async fn converse_refuses_wrong_shapes() {
    let mock = MockProvider::start().await;
    let path = format!("/model/{CLAUDE}/converse");
    // An OpenAI chat body sent as is.
    let openai = json!({
        "model": "gpt-4o",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}],
    });
    let message = assert_aws_error(
        &post(&mock, &path, &openai).await,
        400,
        "ValidationException",
    );
    // Keys are checked in name order: max_tokens is met first.
    assert!(message.contains("extraneous key [max_tokens]"), "{message}");

    let cases = [
        (
            json!({"messages": [{"role": "user", "content": "hi"}]}),
            "got a string",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}),
            "unknown member 'type'",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"text": "a"}]}, {"role": "user", "content": [{"text": "b"}]}]}),
            "alternate",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"image": {"format": "png", "source": {"bytes": "%%%"}}}]}]}),
            "base64",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"text": "x"}]}], "tools": []}),
            "toolConfig.tools",
        ),
    ];
    for (body, expected) in cases {
        let message =
            assert_aws_error(&post(&mock, &path, &body).await, 400, "ValidationException");
        assert!(message.contains(expected), "{body}: {message}");
    }

    // Not JSON at all.
    let headers = signed(&path, b"nope", &credentials(None), "us-east-1");
    let resp = send(&mock, &path, &headers, b"nope").await;
    assert_aws_error(&resp, 400, "ValidationException");

    // An embedding model cannot converse.
    let path = "/model/amazon.titan-embed-text-v2%3A0/converse";
    let resp = post(&mock, path, &converse_body("hi")).await;
    assert_aws_error(&resp, 400, "ValidationException");
}

// ---------------------------------------------------------------------------
// ConverseStream
// ---------------------------------------------------------------------------

#[tokio::test]
async fn converse_stream_sends_crc_checked_frames() {
    let mock = MockProvider::start().await;
    let path = format!("/model/{CLAUDE}/converse-stream");
    let resp = post(&mock, &path, &converse_body("hello there")).await;
    let messages = stream_messages(&resp);
    let kinds: Vec<&str> = messages.iter().map(Message::kind).collect();
    assert_eq!(kinds.first(), Some(&"messageStart"));
    assert_eq!(
        kinds[kinds.len() - 3..],
        ["contentBlockStop", "messageStop", "metadata"]
    );
    assert!(kinds[1..kinds.len() - 3]
        .iter()
        .all(|k| *k == "contentBlockDelta"));
    assert!(kinds.len() - 4 > 1, "several deltas");
    for m in &messages {
        assert_eq!(m.header(":message-type"), Some("event"));
        assert!(m.json()["p"].is_string(), "padding field");
    }
    assert_eq!(messages[0].json()["role"], "assistant");
    let text: String = messages
        .iter()
        .filter(|m| m.kind() == "contentBlockDelta")
        .map(|m| {
            let json = m.json();
            assert_eq!(json["contentBlockIndex"], 0);
            json["delta"]["text"]
                .as_str()
                .expect("text delta")
                .to_owned()
        })
        .collect();
    assert_eq!(text, "mock reply to: hello there");
    let n = messages.len();
    assert_eq!(messages[n - 2].json()["stopReason"], "end_turn");
    let metadata = messages[n - 1].json();
    assert_eq!(
        metadata["usage"],
        json!({"inputTokens": 9, "outputTokens": 5, "totalTokens": 14})
    );
    assert_eq!(metadata["metrics"]["latencyMs"], 1);
}

#[tokio::test]
async fn converse_stream_tool_use() {
    let mock = MockProvider::start().await;
    let path = format!("/model/{CLAUDE}/converse-stream");
    let mut body = converse_body("weather?");
    body["toolConfig"] = tool_config();
    let messages = stream_messages(&post(&mock, &path, &body).await);
    let kinds: Vec<&str> = messages.iter().map(Message::kind).collect();
    assert_eq!(
        kinds,
        [
            "messageStart",
            "contentBlockStart",
            "contentBlockDelta",
            "contentBlockDelta",
            "contentBlockDelta",
            "contentBlockStop",
            "messageStop",
            "metadata"
        ]
    );
    let start = messages[1].json();
    assert_eq!(start["contentBlockIndex"], 0);
    assert_eq!(
        start["start"]["toolUse"],
        json!({"toolUseId": "tooluse_mock_0", "name": "get_weather"})
    );
    let input: String = messages[2..5]
        .iter()
        .map(|m| {
            m.json()["delta"]["toolUse"]["input"]
                .as_str()
                .expect("piece")
                .to_owned()
        })
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&input).expect("input JSON"),
        json!({"mock": true, "n": 1})
    );
    assert_eq!(messages[6].json()["stopReason"], "tool_use");
}

#[tokio::test]
async fn converse_stream_error_and_disconnect() {
    let mock = MockProvider::start().await;
    let path = format!("/model/{CLAUDE}/converse-stream");
    let body = converse_body("hello there");
    let resp = post_with(&mock, &path, &body, &[("x-mock-stream-error", "1")]).await;
    let messages = stream_messages(&resp);
    let kinds: Vec<&str> = messages.iter().map(Message::kind).collect();
    assert_eq!(
        kinds,
        ["messageStart", "contentBlockDelta", "throttlingException"]
    );
    assert_eq!(messages[2].header(":message-type"), Some("exception"));
    assert!(messages[2].json()["message"].is_string());

    // disconnect_after: two frames, then the connection drops without the
    // terminating chunk.
    let bytes = body.to_string().into_bytes();
    let headers = signed(&path, &bytes, &credentials(None), "us-east-1");
    let mut all: Vec<(&str, &str)> = headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    all.push(("x-mock-disconnect-after", "2"));
    let mut conn = Conn::connect(mock.addr()).await;
    conn.send("POST", &path, &all, &bytes).await.expect("send");
    let head = conn.read_head().await.expect("head");
    assert_eq!(head.status, 200);
    let mut received = Vec::new();
    let end = loop {
        match conn.next_chunk().await {
            Ok(Some(chunk)) => received.extend_from_slice(&chunk),
            other => break other,
        }
    };
    assert!(end.is_err(), "the stream must end without its last chunk");
    let kinds: Vec<String> = decode_stream(&received)
        .iter()
        .map(|m| m.kind().to_owned())
        .collect();
    assert_eq!(kinds, ["messageStart", "contentBlockDelta"]);
}

// ---------------------------------------------------------------------------
// InvokeModel
// ---------------------------------------------------------------------------

#[tokio::test]
async fn invoke_titan_embeddings() {
    let mock = MockProvider::start().await;
    let v1 = "/model/amazon.titan-embed-text-v1/invoke";
    let resp = post(&mock, v1, &json!({"inputText": "hello embedding world"})).await;
    let body = ok_json(&resp);
    assert_eq!(body["inputTextTokenCount"], 3);
    assert_eq!(body["embedding"].as_array().map(Vec::len), Some(1536));
    assert_eq!(resp.header("x-amzn-bedrock-input-token-count"), Some("3"));
    // Deterministic.
    let again = ok_json(&post(&mock, v1, &json!({"inputText": "hello embedding world"})).await);
    assert_eq!(body["embedding"], again["embedding"]);
    // v1 takes no dimensions.
    let resp = post(&mock, v1, &json!({"inputText": "x", "dimensions": 256})).await;
    let message = assert_aws_error(&resp, 400, "ValidationException");
    assert!(message.contains("extraneous key [dimensions]"), "{message}");

    let v2 = "/model/amazon.titan-embed-text-v2%3A0/invoke";
    let body = ok_json(&post(&mock, v2, &json!({"inputText": "hello", "dimensions": 256})).await);
    let vector = body["embedding"].as_array().expect("embedding");
    assert_eq!(vector.len(), 256);
    let norm: f64 = vector
        .iter()
        .map(|v| v.as_f64().expect("number").powi(2))
        .sum();
    assert!((norm - 1.0).abs() < 1e-3, "normalized by default: {norm}");
    assert_eq!(body["embeddingsByType"]["float"], body["embedding"]);
    let resp = post(&mock, v2, &json!({"inputText": "hello", "dimensions": 8})).await;
    assert_aws_error(&resp, 400, "ValidationException");
    let resp = post(&mock, v2, &json!({"input": "hello"})).await;
    assert_aws_error(&resp, 400, "ValidationException");
}

#[tokio::test]
async fn invoke_cohere_embeddings() {
    let mock = MockProvider::start().await;
    let path = "/model/cohere.embed-english-v3/invoke";
    let texts = json!(["first text", "second"]);
    let body = ok_json(
        &post(
            &mock,
            path,
            &json!({"texts": texts, "input_type": "search_document"}),
        )
        .await,
    );
    assert_eq!(body["response_type"], "embeddings_floats");
    assert_eq!(body["texts"], texts);
    assert!(body["id"].is_string());
    let embeddings = body["embeddings"].as_array().expect("embeddings");
    assert_eq!(embeddings.len(), 2);
    assert_eq!(embeddings[0].as_array().map(Vec::len), Some(1024));
    assert_ne!(embeddings[0], embeddings[1]);

    let body = ok_json(
        &post(
            &mock,
            path,
            &json!({"texts": ["a"], "input_type": "search_query", "embedding_types": ["float", "int8"]}),
        )
        .await,
    );
    assert_eq!(body["response_type"], "embeddings_by_type");
    assert_eq!(
        body["embeddings"]["int8"][0].as_array().map(Vec::len),
        Some(1024)
    );
    assert!(body["embeddings"]["float"][0].is_array());

    // input_type is required.
    let resp = post(&mock, path, &json!({"texts": ["a"]})).await;
    let message = assert_aws_error(&resp, 400, "ValidationException");
    assert!(message.contains("input_type"), "{message}");
}

fn anthropic_body() -> Value {
    json!({
        "anthropic_version": "bedrock-2023-05-31",
        "max_tokens": 100,
        "system": "be brief",
        "messages": [{"role": "user", "content": "hello claude"}],
    })
}

#[tokio::test]
async fn invoke_anthropic_messages() {
    let mock = MockProvider::start().await;
    let path = format!("/model/{CLAUDE}/invoke");
    let resp = post(&mock, &path, &anthropic_body()).await;
    let body = ok_json(&resp);
    assert_eq!(body["type"], "message");
    assert_eq!(body["role"], "assistant");
    assert_eq!(
        body["content"],
        json!([{"type": "text", "text": "mock reply to: hello claude"}])
    );
    assert_eq!(body["stop_reason"], "end_turn");
    assert_eq!(body["usage"]["input_tokens"], 4);
    assert_eq!(body["usage"]["output_tokens"], 5);
    assert_eq!(resp.header("x-amzn-bedrock-output-token-count"), Some("5"));

    // The Anthropic API's own fields are not Bedrock's.
    for (field, value) in [("model", json!("claude-3")), ("stream", json!(true))] {
        let mut wrong = anthropic_body();
        wrong[field] = value;
        let message = assert_aws_error(
            &post(&mock, &path, &wrong).await,
            400,
            "ValidationException",
        );
        assert!(
            message.contains(&format!("extraneous key [{field}]")),
            "{message}"
        );
    }
    let mut wrong = anthropic_body();
    wrong["anthropic_version"] = json!("2023-06-01");
    assert_aws_error(
        &post(&mock, &path, &wrong).await,
        400,
        "ValidationException",
    );
    let mut wrong = anthropic_body();
    wrong
        .as_object_mut()
        .expect("object")
        .remove("anthropic_version");
    assert_aws_error(
        &post(&mock, &path, &wrong).await,
        400,
        "ValidationException",
    );
    // Checked as the Messages API checks it.
    let mut wrong = anthropic_body();
    wrong["messages"] = json!([{"role": "system", "content": "x"}]);
    assert_aws_error(
        &post(&mock, &path, &wrong).await,
        400,
        "ValidationException",
    );

    // A model family the mock does not host.
    let resp = post(
        &mock,
        "/model/meta.llama3-8b-instruct-v1%3A0/invoke",
        &anthropic_body(),
    )
    .await;
    assert_aws_error(&resp, 400, "ValidationException");
}

#[tokio::test]
async fn invoke_with_response_stream_wraps_anthropic_events() {
    let mock = MockProvider::start().await;
    let path = format!("/model/{CLAUDE}/invoke-with-response-stream");
    let messages = stream_messages(&post(&mock, &path, &anthropic_body()).await);
    let events: Vec<Value> = messages
        .iter()
        .map(|m| {
            assert_eq!(m.header(":event-type"), Some("chunk"));
            assert_eq!(m.header(":message-type"), Some("event"));
            let payload = m.json();
            assert!(payload["p"].is_string());
            let bytes = STANDARD
                .decode(payload["bytes"].as_str().expect("bytes"))
                .expect("base64");
            serde_json::from_slice(&bytes).expect("event JSON")
        })
        .collect();
    let types: Vec<&str> = events
        .iter()
        .map(|e| e["type"].as_str().expect("type"))
        .collect();
    assert_eq!(types.first(), Some(&"message_start"));
    assert_eq!(types.last(), Some(&"message_stop"));
    assert!(types.contains(&"content_block_start"));
    let text: String = events
        .iter()
        .filter_map(|e| e["delta"]["text"].as_str())
        .collect();
    assert_eq!(text, "mock reply to: hello claude");
    let metrics = &events[events.len() - 1]["amazon-bedrock-invocationMetrics"];
    assert_eq!(metrics["inputTokenCount"], 4);
    assert_eq!(metrics["outputTokenCount"], 5);

    // An embedding model does not stream.
    let resp = post(
        &mock,
        "/model/amazon.titan-embed-text-v1/invoke-with-response-stream",
        &json!({"inputText": "x"}),
    )
    .await;
    assert_aws_error(&resp, 400, "ValidationException");
}

// ---------------------------------------------------------------------------
// Authentication and errors
// ---------------------------------------------------------------------------

#[tokio::test]
async fn bad_signatures_are_refused() {
    let mock = MockProvider::start().await;
    let path = format!("/model/{CLAUDE}/converse");
    let body = converse_body("hi").to_string().into_bytes();

    // Signed for one body, sent with another.
    let headers = signed(&path, &body, &credentials(None), "us-east-1");
    let other = converse_body("bye").to_string().into_bytes();
    let resp = send(&mock, &path, &headers, &other).await;
    let message = assert_aws_error(&resp, 403, "InvalidSignatureException");
    assert!(
        message.starts_with(
            "The request signature we calculated does not match the signature you provided."
        ),
        "{message}"
    );
    assert_eq!(resp.header("x-mock-aws-region"), None);

    // A content hash header, signed or not, must be the body's.
    let mut headers = signed(&path, &other, &credentials(None), "us-east-1");
    headers.push(("x-amz-content-sha256".to_owned(), sigv4::sha256_hex(&body)));
    let resp = send(&mock, &path, &headers, &other).await;
    let message = assert_aws_error(&resp, 403, "InvalidSignatureException");
    assert!(message.contains("x-amz-content-sha256"), "{message}");
    headers.pop();
    headers.push(("x-amz-content-sha256".to_owned(), sigv4::sha256_hex(&other)));
    ok_json(&send(&mock, &path, &headers, &other).await);

    // The wrong secret.
    let wrong_secret = Credentials {
        secret_access_key: "not/the/secret",
        ..credentials(None)
    };
    let headers = signed(&path, &body, &wrong_secret, "us-east-1");
    let resp = send(&mock, &path, &headers, &body).await;
    assert_aws_error(&resp, 403, "InvalidSignatureException");

    // Signed for a path the request does not go to: the model id encoded
    // once in the signature but sent differently.
    let headers = signed(
        "/model/anthropic.claude-3-haiku-20240307-v1:0/converse",
        &body,
        &credentials(None),
        "us-east-1",
    );
    let resp = send(&mock, &path, &headers, &body).await;
    let message = assert_aws_error(&resp, 403, "InvalidSignatureException");
    assert!(
        message.contains("anthropic.claude-3-haiku-20240307-v1%253A0"),
        "{message}"
    );
}

#[tokio::test]
async fn unknown_keys_and_missing_auth_are_refused() {
    let mock = MockProvider::start().await;
    let path = format!("/model/{CLAUDE}/converse");
    let body = converse_body("hi").to_string().into_bytes();

    let stranger = Credentials {
        access_key_id: "AKIDSOMEONEELSE",
        ..credentials(None)
    };
    let headers = signed(&path, &body, &stranger, "us-east-1");
    let resp = send(&mock, &path, &headers, &body).await;
    let message = assert_aws_error(&resp, 403, "UnrecognizedClientException");
    assert_eq!(
        message,
        "The security token included in the request is invalid."
    );

    let headers = vec![("content-type".to_owned(), "application/json".to_owned())];
    let resp = send(&mock, &path, &headers, &body).await;
    assert_aws_error(&resp, 403, "MissingAuthenticationTokenException");

    // A bearer token is not a signature.
    let headers = vec![("authorization".to_owned(), "Bearer sk-test".to_owned())];
    let resp = send(&mock, &path, &headers, &body).await;
    assert_aws_error(&resp, 403, "IncompleteSignatureException");
}

#[tokio::test]
async fn injected_statuses_use_aws_error_names() {
    let mock = MockProvider::start().await;
    let path = format!("/model/{CLAUDE}/converse");
    for (status, name) in [
        ("400", "ValidationException"),
        ("403", "AccessDeniedException"),
        ("404", "ResourceNotFoundException"),
        ("429", "ThrottlingException"),
        ("500", "InternalServerException"),
        ("503", "ServiceUnavailableException"),
    ] {
        let resp = post_with(
            &mock,
            &path,
            &converse_body("hi"),
            &[("x-mock-status", status)],
        )
        .await;
        assert_aws_error(&resp, status.parse().expect("status"), name);
    }
}

#[tokio::test]
async fn unknown_operations_are_404() {
    let mock = MockProvider::start().await;
    // An ARN whose `/` was not percent-encoded splits the model id.
    let path = "/model/arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude/converse";
    let resp = post(&mock, path, &converse_body("hi")).await;
    assert_aws_error(&resp, 404, "UnknownOperationException");
    let resp = post(
        &mock,
        &format!("/model/{CLAUDE}/chat"),
        &converse_body("hi"),
    )
    .await;
    assert_aws_error(&resp, 404, "UnknownOperationException");

    // The same ARN percent-encoded is one segment and works.
    let path = "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fus.anthropic.claude/converse";
    ok_json(&post(&mock, path, &converse_body("hi")).await);
}
