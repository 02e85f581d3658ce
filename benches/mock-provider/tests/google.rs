//! End-to-end tests of the Gemini API and Vertex AI routes over a raw
//! HTTP/1.1 client.

mod common;

use std::io;
use std::time::{Duration, Instant};

use common::{post_json_with, Conn, Headers, Response, IO_TIMEOUT};
use mock_provider::MockProvider;
use serde_json::{json, Value};

const API_KEY: (&str, &str) = ("x-goog-api-key", "AIza-test");
const BEARER: (&str, &str) = ("authorization", "Bearer ya29.test");
const GEMINI: &str = "/v1beta/models/gemini-test";
const VERTEX: &str = "/v1/projects/proj-1/locations/europe-west4/publishers";

async fn gemini(mock: &MockProvider, action: &str, body: &Value) -> Response {
    gemini_with(mock, action, &[API_KEY], body).await
}

async fn gemini_with(
    mock: &MockProvider,
    action: &str,
    headers: Headers<'_>,
    body: &Value,
) -> Response {
    post_json_with(mock.addr(), &format!("{GEMINI}:{action}"), headers, body).await
}

/// POSTs to a Vertex route, `tail` being `google/models/m:action` or such.
async fn vertex(mock: &MockProvider, tail: &str, extra: Headers<'_>, body: &Value) -> Response {
    let mut headers = vec![BEARER];
    headers.extend_from_slice(extra);
    post_json_with(mock.addr(), &format!("{VERTEX}/{tail}"), &headers, body).await
}

fn contents(text: &str) -> Value {
    json!([
        {"role": "user", "parts": [{"text": "an earlier question"}]},
        {"role": "model", "parts": [{"text": "an answer"}]},
        {"role": "user", "parts": [{"text": text}]},
    ])
}

fn generate_body(text: &str) -> Value {
    json!({
        "contents": contents(text),
        "systemInstruction": {"parts": [{"text": "be brief"}]},
    })
}

fn tools() -> Value {
    json!([{"functionDeclarations": [
        {"name": "get_weather", "description": "weather",
         "parameters": {"type": "OBJECT", "properties": {"city": {"type": "STRING"}}, "required": ["city"]}},
        {"name": "search", "parameters": {"type": "object", "properties": {}}},
    ]}])
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

/// Checks Google's error shape and returns the message.
fn assert_google_error(resp: &Response, code: u16, status: &str) -> String {
    assert_eq!(
        resp.status(),
        code,
        "body: {}",
        String::from_utf8_lossy(&resp.body)
    );
    assert_eq!(resp.header("content-type"), Some("application/json"));
    let body = resp.json();
    assert_eq!(body.as_object().map(|o| o.len()), Some(1), "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    assert_eq!(body["error"]["status"], status, "{body}");
    body["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("no message: {body}"))
        .to_owned()
}

/// The responses of an `alt=sse` stream, checking the `data: ...\r\n\r\n`
/// framing of every event.
fn sse_responses(body: &[u8]) -> Vec<Value> {
    let text = std::str::from_utf8(body).expect("SSE body is UTF-8");
    if text.is_empty() {
        return Vec::new();
    }
    assert!(text.ends_with("\r\n\r\n"), "events end with CRLF CRLF");
    text.split("\r\n\r\n")
        .filter(|event| !event.is_empty())
        .map(|event| {
            let data = event
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("no data line: {event:?}"));
            assert!(!data.contains('\n'), "one line per event: {event:?}");
            serde_json::from_str(data).expect("data is JSON")
        })
        .collect()
}

/// The text of candidate 0 across `responses`.
fn joined_text(responses: &[Value]) -> String {
    responses
        .iter()
        .filter_map(|r| r["candidates"][0]["content"]["parts"][0]["text"].as_str())
        .collect()
}

/// Reads a streamed response until its end or an abrupt close; returns the
/// bytes and whether it ended cleanly.
async fn read_stream(conn: &mut Conn) -> (Vec<u8>, bool) {
    let mut body = Vec::new();
    loop {
        match tokio::time::timeout(IO_TIMEOUT, conn.next_chunk())
            .await
            .expect("stream timed out")
        {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) => return (body, true),
            Err(err) => {
                assert!(
                    matches!(
                        err.kind(),
                        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset
                    ),
                    "{err}"
                );
                return (body, false);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Gemini API: generateContent
// ---------------------------------------------------------------------------

#[tokio::test]
async fn gemini_plain_reply_and_usage() {
    let mock = MockProvider::start().await;
    let resp = gemini(&mock, "generateContent", &generate_body("hello there")).await;
    let body = ok_json(&resp);
    let id = body["responseId"].as_str().expect("responseId");
    assert_eq!(
        body,
        json!({
            "candidates": [{
                "content": {"parts": [{"text": "mock reply to: hello there"}], "role": "model"},
                "finishReason": "STOP",
                "index": 0,
            }],
            // 2 (system) + 3 + 2 + 2 words in; 5 out.
            "usageMetadata": {"promptTokenCount": 9, "candidatesTokenCount": 5, "totalTokenCount": 14},
            "modelVersion": "gemini-test",
            "responseId": id,
        })
    );

    // The key may come as `?key=`, and the stable `/v1` path works too;
    // snake_case field names are accepted as Google's parser accepts them.
    let snake =
        json!({"contents": contents("hi"), "system_instruction": {"parts": [{"text": "x"}]}});
    for path in [
        "/v1beta/models/gemini-test:generateContent?key=AIza-test",
        "/v1/models/gemini-test:generateContent?key=AIza-test",
    ] {
        let resp = post_json_with(mock.addr(), path, &[], &snake).await;
        let body = ok_json(&resp);
        assert_eq!(
            body["candidates"][0]["content"]["parts"][0]["text"],
            "mock reply to: hi"
        );
        assert_ne!(body["responseId"], json!(id));
    }

    // The `words` fault, and a request recorded as sent.
    let resp = gemini_with(
        &mock,
        "generateContent",
        &[API_KEY, ("x-mock-words", "3")],
        &generate_body("x"),
    )
    .await;
    assert_eq!(
        ok_json(&resp)["candidates"][0]["content"]["parts"][0]["text"],
        "w1 w2 w3"
    );
    let recorded = mock.requests();
    assert_eq!(
        recorded[0].path,
        "/v1beta/models/gemini-test:generateContent"
    );
    assert_eq!(recorded[0].header("x-goog-api-key"), Some("AIza-test"));
}

#[tokio::test]
async fn gemini_generation_config() {
    let mock = MockProvider::start().await;
    let with_config = |config: Value| {
        let mut body = generate_body("one two three four");
        body["generationConfig"] = config;
        body
    };
    let candidate = |resp: &Response| ok_json(resp)["candidates"][0].clone();

    let resp = gemini(
        &mock,
        "generateContent",
        &with_config(json!({"maxOutputTokens": 4})),
    )
    .await;
    let first = candidate(&resp);
    assert_eq!(first["content"]["parts"][0]["text"], "mock reply to: one");
    assert_eq!(first["finishReason"], "MAX_TOKENS");
    assert_eq!(ok_json(&resp)["usageMetadata"]["candidatesTokenCount"], 4);

    let stops = json!({"stopSequences": ["three", "two"], "temperature": 0.2});
    let resp = gemini(&mock, "generateContent", &with_config(stops)).await;
    let first = candidate(&resp);
    assert_eq!(first["content"]["parts"][0]["text"], "mock reply to: one ");
    assert_eq!(first["finishReason"], "STOP");

    let two = json!({"candidate_count": 2, "max_output_tokens": 2});
    let body = ok_json(&gemini(&mock, "generateContent", &with_config(two)).await);
    let candidates = body["candidates"].as_array().expect("candidates");
    assert_eq!(candidates.len(), 2);
    assert_eq!(candidates[1]["index"], 1);
    assert_eq!(candidates[1]["content"]["parts"][0]["text"], "mock reply");
    assert_eq!(body["usageMetadata"]["candidatesTokenCount"], 4);

    // OpenAI's names inside generationConfig are unknown to Google.
    let resp = gemini(
        &mock,
        "generateContent",
        &with_config(json!({"max_tokens": 4})),
    )
    .await;
    let message = assert_google_error(&resp, 400, "INVALID_ARGUMENT");
    assert!(
        message.contains("Unknown name \"max_tokens\" at 'generation_config'"),
        "{message}"
    );
    let many = json!({"stopSequences": ["a", "b", "c", "d", "e", "f"]});
    let resp = gemini(&mock, "generateContent", &with_config(many)).await;
    assert_google_error(&resp, 400, "INVALID_ARGUMENT");
}

#[tokio::test]
async fn gemini_function_calls() {
    let mock = MockProvider::start().await;
    let mut body = generate_body("weather in Paris?");
    body["tools"] = tools();
    let resp = gemini(&mock, "generateContent", &body).await;
    let answer = ok_json(&resp);
    assert_eq!(
        answer["candidates"][0],
        json!({
            "content": {"parts": [{"functionCall": {"name": "get_weather", "args": {"mock": true, "n": 1}}}],
                        "role": "model"},
            "finishReason": "STOP",
            "index": 0,
        })
    );
    assert_eq!(answer["usageMetadata"]["candidatesTokenCount"], 1);

    // The named function with mode ANY; no call with mode NONE.
    body["toolConfig"] =
        json!({"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["search"]}});
    let answer = ok_json(&gemini(&mock, "generateContent", &body).await);
    assert_eq!(
        answer["candidates"][0]["content"]["parts"][0]["functionCall"]["name"],
        "search"
    );
    body["toolConfig"] = json!({"functionCallingConfig": {"mode": "NONE"}});
    let answer = ok_json(&gemini(&mock, "generateContent", &body).await);
    assert_eq!(
        answer["candidates"][0]["content"]["parts"][0]["text"],
        "mock reply to: weather in Paris?"
    );

    // After the function's response, the reply shows what arrived.
    let mut turns = contents("weather in Paris?");
    let turns_list = turns.as_array_mut().expect("list");
    turns_list.push(json!({"role": "model", "parts": [
        {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}}]}));
    turns_list.push(json!({"role": "user", "parts": [
        {"functionResponse": {"name": "get_weather", "response": {"temp": 21, "sky": "clear"}}}]}));
    let body = json!({"contents": turns, "tools": tools()});
    let answer = ok_json(&gemini(&mock, "generateContent", &body).await);
    assert_eq!(
        answer["candidates"][0]["content"]["parts"][0]["text"],
        r#"mock reply to: {"sky":"clear","temp":21}"#
    );
    assert_eq!(answer["candidates"][0]["finishReason"], "STOP");

    // A name not declared is refused, as is an OpenAI-shaped tool.
    let bad = json!({"contents": contents("x"), "tools": tools(),
        "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["nope"]}}});
    assert_google_error(
        &gemini(&mock, "generateContent", &bad).await,
        400,
        "INVALID_ARGUMENT",
    );
    let openai_tool = json!({"contents": contents("x"),
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]});
    let message = assert_google_error(
        &gemini(&mock, "generateContent", &openai_tool).await,
        400,
        "INVALID_ARGUMENT",
    );
    assert!(message.contains("at 'tools[0]'"), "{message}");
}

#[tokio::test]
async fn gemini_safety_block() {
    let mock = MockProvider::start().await;
    let resp = gemini(
        &mock,
        "generateContent",
        &generate_body("tell me something Unsafe"),
    )
    .await;
    let answer = ok_json(&resp);
    let candidate = &answer["candidates"][0];
    assert!(candidate.get("content").is_none(), "{candidate}");
    assert_eq!(candidate["finishReason"], "SAFETY");
    assert_eq!(candidate["safetyRatings"][0]["blocked"], true);
    assert_eq!(
        answer["usageMetadata"],
        json!({"promptTokenCount": 11, "totalTokenCount": 11})
    );
}

#[tokio::test]
async fn gemini_wrong_shapes_are_refused() {
    let mock = MockProvider::start().await;
    let openai = json!({"model": "gemini-test", "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 5});
    let message = assert_google_error(
        &gemini(&mock, "generateContent", &openai).await,
        400,
        "INVALID_ARGUMENT",
    );
    assert!(
        message.starts_with("Invalid JSON payload received. Unknown name \""),
        "{message}"
    );

    let cases = [
        (json!({"contents": []}), "contents is not specified"),
        (
            json!({"contents": [{"role": "assistant", "parts": [{"text": "x"}]}]}),
            "valid role",
        ),
        (
            json!({"contents": [{"role": "user", "parts": []}]}),
            "parts",
        ),
        (
            json!({"contents": [{"role": "user", "parts": [{"text": "x", "functionCall": {"name": "f"}}]}]}),
            "Oneof",
        ),
        (
            json!({"contents": [{"role": "user", "parts": [{"type": "text", "text": "x"}]}]}),
            "Unknown name \"type\"",
        ),
        (
            json!({"contents": contents("x"), "model": "gemini-test"}),
            "Unknown name \"model\"",
        ),
        (
            json!({"contents": contents("x"), "systemInstruction": "be brief"}),
            "system_instruction",
        ),
        (
            json!({"contents": contents("x"), "tools": [{"functionDeclarations": [{"name": "f",
                "parameters": {"type": "object", "additionalProperties": false}}]}]}),
            "Unknown name \"additionalProperties\"",
        ),
        (
            json!({"contents": contents("x"), "tools": [{"functionDeclarations": [{"name": "f",
                "parameters": {"type": "object", "properties": {"a": {"type": ["string", "null"]}}}}]}]}),
            ".type",
        ),
    ];
    for (body, needle) in cases {
        let resp = gemini(&mock, "generateContent", &body).await;
        let message = assert_google_error(&resp, 400, "INVALID_ARGUMENT");
        assert!(message.contains(needle), "{body}: {message}");
    }
    let resp = post_json_with(
        mock.addr(),
        &format!("{GEMINI}:generateContent"),
        &[API_KEY],
        &json!([1]),
    )
    .await;
    assert_google_error(&resp, 400, "INVALID_ARGUMENT");
}

#[tokio::test]
async fn gemini_auth_failures() {
    let mock = MockProvider::start().await;
    let body = generate_body("x");
    let resp = gemini_with(&mock, "generateContent", &[], &body).await;
    assert_google_error(&resp, 403, "PERMISSION_DENIED");
    let resp = gemini_with(&mock, "generateContent", &[("x-goog-api-key", " ")], &body).await;
    assert_google_error(&resp, 403, "PERMISSION_DENIED");
    // An OpenAI-style bearer token is not a Gemini API key.
    let resp = gemini_with(&mock, "generateContent", &[BEARER], &body).await;
    let message = assert_google_error(&resp, 401, "UNAUTHENTICATED");
    assert!(message.contains("x-goog-api-key"), "{message}");
    let resp = gemini_with(&mock, "embedContent", &[], &json!({})).await;
    assert_google_error(&resp, 403, "PERMISSION_DENIED");
}

#[tokio::test]
async fn gemini_errors_and_faults_are_google_shaped() {
    let mock = MockProvider::start().await;
    let body = generate_body("x");
    let resp = gemini_with(
        &mock,
        "generateContent",
        &[API_KEY, ("x-mock-status", "429")],
        &body,
    )
    .await;
    let message = assert_google_error(&resp, 429, "RESOURCE_EXHAUSTED");
    assert!(message.contains("429"), "{message}");
    assert_eq!(resp.header("retry-after-ms"), Some("10"));

    for (status, name) in [
        (500, "INTERNAL"),
        (503, "UNAVAILABLE"),
        (401, "UNAUTHENTICATED"),
    ] {
        let path = format!("/x-mock/status={status}{GEMINI}:streamGenerateContent?alt=sse");
        let resp = post_json_with(mock.addr(), &path, &[API_KEY], &body).await;
        assert_google_error(&resp, status, name);
    }
    // A bad fault spec and an unknown method are Google-shaped too.
    let path = format!("/x-mock/status=abc{GEMINI}:generateContent");
    let resp = post_json_with(mock.addr(), &path, &[API_KEY], &body).await;
    assert_google_error(&resp, 400, "INVALID_ARGUMENT");
    let resp = gemini(&mock, "countTokens", &body).await;
    assert_google_error(&resp, 404, "NOT_FOUND");
    let resp = common::get(mock.addr(), &format!("{GEMINI}:generateContent")).await;
    assert_google_error(&resp, 404, "NOT_FOUND");

    // fail_first: the first request fails, the retry succeeds.
    let headers = [API_KEY, ("x-mock-fail-first", "1")];
    let first = gemini_with(&mock, "generateContent", &headers, &body).await;
    assert_google_error(&first, 503, "UNAVAILABLE");
    let second = gemini_with(&mock, "generateContent", &headers, &body).await;
    assert_eq!(second.status(), 200);
}

// ---------------------------------------------------------------------------
// Gemini API: streaming
// ---------------------------------------------------------------------------

#[tokio::test]
async fn gemini_sse_stream_matches_the_plain_reply() {
    let mock = MockProvider::start().await;
    let body = generate_body("stream me please");
    let whole = ok_json(&gemini(&mock, "generateContent", &body).await);
    let resp = gemini(&mock, "streamGenerateContent?alt=sse", &body).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.header("content-type"), Some("text/event-stream"));
    let events = sse_responses(&resp.body);
    // "mock reply to: stream me please": one event per word.
    assert_eq!(events.len(), 6);
    assert_eq!(
        joined_text(&events),
        whole["candidates"][0]["content"]["parts"][0]["text"]
    );
    let id = &events[0]["responseId"];
    for (i, event) in events.iter().enumerate() {
        assert_eq!(&event["responseId"], id);
        assert_eq!(event["modelVersion"], "gemini-test");
        assert_eq!(event["candidates"][0]["content"]["role"], "model");
        let usage = &event["usageMetadata"];
        assert_eq!(usage["promptTokenCount"], 10);
        assert_eq!(usage["candidatesTokenCount"], i + 1);
        let last = i + 1 == events.len();
        assert_eq!(
            event["candidates"][0].get("finishReason").is_some(),
            last,
            "{event}"
        );
    }
    assert_eq!(events[5]["usageMetadata"], whole["usageMetadata"]);
    assert_eq!(events[5]["candidates"][0]["finishReason"], "STOP");
}

#[tokio::test]
async fn gemini_stream_without_alt_is_a_json_array() {
    let mock = MockProvider::start().await;
    let body = generate_body("array please");
    let resp = gemini(&mock, "streamGenerateContent", &body).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.header("content-type"), Some("application/json"));
    let text = String::from_utf8_lossy(&resp.body).into_owned();
    assert!(text.starts_with("[{") && text.ends_with("}]"), "{text}");
    assert!(text.contains("},\r\n{"), "{text}");
    let responses = resp.json();
    let responses = responses.as_array().expect("array");
    assert_eq!(responses.len(), 5);
    assert_eq!(joined_text(responses), "mock reply to: array please");
    assert_eq!(responses[4]["candidates"][0]["finishReason"], "STOP");
}

#[tokio::test]
async fn gemini_stream_function_call_and_limits() {
    let mock = MockProvider::start().await;
    let mut body = generate_body("weather?");
    body["tools"] = tools();
    let resp = gemini(&mock, "streamGenerateContent?alt=sse", &body).await;
    let events = sse_responses(&resp.body);
    assert_eq!(events.len(), 1);
    assert_eq!(
        events[0]["candidates"][0]["content"]["parts"][0]["functionCall"],
        json!({"name": "get_weather", "args": {"mock": true, "n": 1}})
    );
    assert_eq!(events[0]["candidates"][0]["finishReason"], "STOP");

    let mut body = generate_body("a b c d e");
    body["generationConfig"] = json!({"maxOutputTokens": 5});
    let events = sse_responses(
        &gemini(&mock, "streamGenerateContent?alt=sse", &body)
            .await
            .body,
    );
    assert_eq!(joined_text(&events), "mock reply to: a b");
    assert_eq!(events[4]["candidates"][0]["finishReason"], "MAX_TOKENS");

    let events = sse_responses(
        &gemini(
            &mock,
            "streamGenerateContent?alt=sse",
            &generate_body("unsafe"),
        )
        .await
        .body,
    );
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["candidates"][0]["finishReason"], "SAFETY");
}

#[tokio::test]
async fn gemini_stream_faults() {
    let mock = MockProvider::start().await;
    let start = Instant::now();
    let path = format!("/x-mock/chunk_delay_ms=30;words=4{GEMINI}:streamGenerateContent?alt=sse");
    let resp = post_json_with(mock.addr(), &path, &[API_KEY], &generate_body("x")).await;
    let events = sse_responses(&resp.body);
    assert_eq!(joined_text(&events), "w1 w2 w3 w4");
    // Four events, three gaps.
    assert!(
        start.elapsed() >= Duration::from_millis(90),
        "{:?}",
        start.elapsed()
    );

    for (n, query) in [(0usize, "?alt=sse"), (2, "?alt=sse"), (2, "")] {
        let mut conn = Conn::connect(mock.addr()).await;
        let value = n.to_string();
        let body = generate_body("several words in this one").to_string();
        conn.send(
            "POST",
            &format!("{GEMINI}:streamGenerateContent{query}"),
            &[API_KEY, ("x-mock-disconnect-after", &value)],
            body.as_bytes(),
        )
        .await
        .expect("send");
        let head = conn.read_head().await.expect("head");
        assert_eq!(head.status, 200);
        let (bytes, clean) = read_stream(&mut conn).await;
        assert!(
            !clean,
            "stream of {n} ended cleanly; expected an abrupt close"
        );
        if query.is_empty() {
            let text = String::from_utf8_lossy(&bytes).into_owned();
            assert!(text.starts_with("[{") && !text.ends_with(']'), "{text}");
        } else {
            assert_eq!(sse_responses(&bytes).len(), n);
        }
    }
}

// ---------------------------------------------------------------------------
// Gemini API: embeddings
// ---------------------------------------------------------------------------

#[tokio::test]
async fn gemini_embeddings() {
    let mock = MockProvider::start().await;
    let single =
        json!({"content": {"parts": [{"text": "hello world"}]}, "taskType": "RETRIEVAL_QUERY"});
    let body = ok_json(&gemini(&mock, "embedContent", &single).await);
    let values = body["embedding"]["values"].as_array().expect("values");
    assert_eq!(values.len(), 8);
    assert_eq!(body.as_object().map(|o| o.len()), Some(1), "{body}");

    // The same text embeds as on the OpenAI route.
    let openai = common::post_json(
        mock.addr(),
        "/v1/embeddings",
        &json!({"input": "hello world", "model": "m"}),
    )
    .await
    .json();
    assert_eq!(
        &openai["data"][0]["embedding"],
        &body["embedding"]["values"]
    );

    let batch = json!({"requests": [
        {"model": "models/gemini-test", "content": {"parts": [{"text": "hello world"}]}},
        {"model": "models/gemini-test", "content": {"parts": [{"text": "other"}]}, "outputDimensionality": 3},
    ]});
    let body = ok_json(&gemini(&mock, "batchEmbedContents", &batch).await);
    let embeddings = body["embeddings"].as_array().expect("embeddings");
    assert_eq!(embeddings.len(), 2);
    assert_eq!(embeddings[0]["values"], json!(values));
    assert_eq!(embeddings[1]["values"].as_array().map(Vec::len), Some(3));

    let cases = [
        json!({"requests": [{"model": "models/other", "content": {"parts": [{"text": "x"}]}}]}),
        json!({"requests": [{"content": {"parts": [{"text": "x"}]}}]}),
        json!({"requests": []}),
        json!({"input": ["x"], "model": "gemini-test"}),
    ];
    for body in cases {
        let resp = gemini(&mock, "batchEmbedContents", &body).await;
        assert_google_error(&resp, 400, "INVALID_ARGUMENT");
    }
    let too_big = json!({"content": {"parts": [{"text": "x"}]}, "outputDimensionality": 0});
    assert_google_error(
        &gemini(&mock, "embedContent", &too_big).await,
        400,
        "INVALID_ARGUMENT",
    );
}

// ---------------------------------------------------------------------------
// Vertex AI
// ---------------------------------------------------------------------------

fn assert_vertex_echo(resp: &Response) {
    assert_eq!(resp.header("x-mock-vertex-project"), Some("proj-1"));
    assert_eq!(resp.header("x-mock-vertex-region"), Some("europe-west4"));
}

#[tokio::test]
async fn vertex_gemini_generate_and_stream() {
    let mock = MockProvider::start().await;
    let mut body = generate_body("hello vertex");
    body["labels"] = json!({"team": "a"});
    let resp = vertex(
        &mock,
        "google/models/gemini-2.0-flash:generateContent",
        &[],
        &body,
    )
    .await;
    assert_vertex_echo(&resp);
    let answer = ok_json(&resp);
    assert_eq!(
        answer["candidates"][0]["content"]["parts"][0]["text"],
        "mock reply to: hello vertex"
    );
    assert_eq!(answer["modelVersion"], "gemini-2.0-flash");

    let resp = vertex(
        &mock,
        "google/models/gemini-2.0-flash:streamGenerateContent?alt=sse",
        &[],
        &body,
    )
    .await;
    assert_vertex_echo(&resp);
    assert_eq!(
        joined_text(&sse_responses(&resp.body)),
        "mock reply to: hello vertex"
    );

    // Vertex's Schema knows additionalProperties; the Gemini API's does not.
    let mut body = generate_body("weather?");
    body["tools"] = json!([{"functionDeclarations": [{"name": "f",
        "parameters": {"type": "object", "additionalProperties": false, "properties": {}}}]}]);
    let resp = vertex(
        &mock,
        "google/models/gemini-2.0-flash:generateContent",
        &[],
        &body,
    )
    .await;
    assert_eq!(
        ok_json(&resp)["candidates"][0]["content"]["parts"][0]["functionCall"]["name"],
        "f"
    );
    let resp = gemini(&mock, "generateContent", &body).await;
    assert_google_error(&resp, 400, "INVALID_ARGUMENT");

    // Same checks as the Gemini API, same error shape.
    let openai = json!({"messages": [{"role": "user", "content": "hi"}]});
    let resp = vertex(
        &mock,
        "google/models/gemini-2.0-flash:generateContent",
        &[],
        &openai,
    )
    .await;
    assert_vertex_echo(&resp);
    let message = assert_google_error(&resp, 400, "INVALID_ARGUMENT");
    assert!(message.contains("Unknown name \"messages\""), "{message}");
}

#[tokio::test]
async fn vertex_auth_and_faults() {
    let mock = MockProvider::start().await;
    let body = generate_body("x");
    let path = format!("{VERTEX}/google/models/g:generateContent");
    for headers in [&[][..], &[API_KEY][..], &[("authorization", "Bearer ")][..]] {
        let resp = post_json_with(mock.addr(), &path, headers, &body).await;
        assert_vertex_echo(&resp);
        assert_google_error(&resp, 401, "UNAUTHENTICATED");
    }
    let resp = vertex(&mock, "anthropic/models/claude:rawPredict", &[], &json!({})).await;
    assert_eq!(resp.status(), 400);
    let resp = post_json_with(
        mock.addr(),
        &format!("{VERTEX}/anthropic/models/claude:rawPredict"),
        &[],
        &json!({}),
    )
    .await;
    assert_google_error(&resp, 401, "UNAUTHENTICATED");

    let resp = vertex(
        &mock,
        "google/models/g:generateContent",
        &[("x-mock-status", "429")],
        &body,
    )
    .await;
    assert_google_error(&resp, 429, "RESOURCE_EXHAUSTED");
    let resp = vertex(&mock, "google/models/g:countTokens", &[], &body).await;
    assert_vertex_echo(&resp);
    assert_google_error(&resp, 404, "NOT_FOUND");
    let resp = vertex(&mock, "meta/models/llama:rawPredict", &[], &body).await;
    assert_google_error(&resp, 404, "NOT_FOUND");
}

#[tokio::test]
async fn vertex_embeddings_predict() {
    let mock = MockProvider::start().await;
    let body = json!({"instances": [{"content": "hello world", "task_type": "RETRIEVAL_DOCUMENT"},
                                    {"content": "three more words"}],
                      "parameters": {"outputDimensionality": 4}});
    let resp = vertex(
        &mock,
        "google/models/text-embedding-005:predict",
        &[],
        &body,
    )
    .await;
    assert_vertex_echo(&resp);
    let answer = ok_json(&resp);
    let predictions = answer["predictions"].as_array().expect("predictions");
    assert_eq!(predictions.len(), 2);
    assert_eq!(
        predictions[0]["embeddings"]["values"]
            .as_array()
            .map(Vec::len),
        Some(4)
    );
    assert_eq!(
        predictions[1]["embeddings"]["statistics"],
        json!({"token_count": 3, "truncated": false})
    );
    assert_eq!(answer["metadata"]["billableCharacterCount"], 24);

    let gemini_body =
        json!({"content": {"parts": [{"text": "hello world"}]}, "outputDimensionality": 4});
    let gemini_answer = ok_json(&gemini(&mock, "embedContent", &gemini_body).await);
    assert_eq!(
        predictions[0]["embeddings"]["values"],
        gemini_answer["embedding"]["values"]
    );

    for bad in [
        json!({"instances": []}),
        json!({"instances": [{"text": "x"}]}),
        json!({"input": "x"}),
    ] {
        let resp = vertex(&mock, "google/models/text-embedding-005:predict", &[], &bad).await;
        assert_google_error(&resp, 400, "INVALID_ARGUMENT");
    }
}

fn claude_body() -> Value {
    json!({
        "anthropic_version": "vertex-2023-10-16",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "hello claude"}],
    })
}

#[tokio::test]
async fn vertex_anthropic_raw_predict() {
    let mock = MockProvider::start().await;
    let resp = vertex(
        &mock,
        "anthropic/models/claude-sonnet-4@20250514:rawPredict",
        &[],
        &claude_body(),
    )
    .await;
    assert_vertex_echo(&resp);
    let answer = ok_json(&resp);
    assert_eq!(answer["type"], "message");
    assert_eq!(answer["model"], "claude-sonnet-4@20250514");
    assert_eq!(
        answer["content"],
        json!([{"type": "text", "text": "mock reply to: hello claude"}])
    );
    assert_eq!(
        answer["usage"],
        json!({"input_tokens": 2, "output_tokens": 5})
    );

    // Tools work as on Anthropic's own API.
    let mut body = claude_body();
    body["tools"] = json!([{"name": "lookup", "input_schema": {"type": "object"}}]);
    let answer = ok_json(&vertex(&mock, "anthropic/models/claude:rawPredict", &[], &body).await);
    assert_eq!(answer["stop_reason"], "tool_use");
    assert_eq!(answer["content"][1]["input"], json!({"mock": true, "n": 1}));

    let mut body = claude_body();
    body["stream"] = json!(true);
    let resp = vertex(
        &mock,
        "anthropic/models/claude:streamRawPredict",
        &[],
        &body,
    )
    .await;
    assert_vertex_echo(&resp);
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.header("content-type"), Some("text/event-stream"));
    let text = String::from_utf8_lossy(&resp.body).into_owned();
    assert!(text.starts_with("event: message_start\n"), "{text}");
    assert!(text.contains("\"model\":\"claude\""), "{text}");
    assert!(text.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"));

    // What Vertex adds to the Messages format is checked; errors are
    // Anthropic-shaped as Vertex passes them through.
    let mut with_model = claude_body();
    with_model["model"] = json!("claude");
    let mut old_version = claude_body();
    old_version["anthropic_version"] = json!("2023-06-01");
    let mut no_version = claude_body();
    no_version
        .as_object_mut()
        .map(|o| o.remove("anthropic_version"));
    let mut streamed = claude_body();
    streamed["stream"] = json!(true);
    let cases = [
        ("rawPredict", with_model, "model"),
        ("rawPredict", old_version, "vertex-2023-10-16"),
        ("rawPredict", no_version, "anthropic_version"),
        ("rawPredict", streamed, "streamRawPredict"),
        ("streamRawPredict", claude_body(), "stream"),
        (
            "rawPredict",
            json!({"anthropic_version": "vertex-2023-10-16", "messages": []}),
            "max_tokens",
        ),
    ];
    for (action, body, needle) in cases {
        let resp = vertex(
            &mock,
            &format!("anthropic/models/claude:{action}"),
            &[],
            &body,
        )
        .await;
        assert_vertex_echo(&resp);
        assert_eq!(resp.status(), 400, "{body}");
        let error = resp.json();
        assert_eq!(error["type"], "error", "{error}");
        assert_eq!(error["error"]["type"], "invalid_request_error");
        let message = error["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(needle), "{body}: {message}");
    }
}
