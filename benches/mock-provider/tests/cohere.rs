//! End-to-end tests of the Cohere v2 routes over a raw HTTP/1.1 client.

mod common;

use std::io;

use common::{post_json_with, Conn, Headers, Response, IO_TIMEOUT};
use mock_provider::MockProvider;
use serde_json::{json, Value};

const AUTH: (&str, &str) = ("authorization", "Bearer co-test");

async fn post_with(mock: &MockProvider, path: &str, extra: Headers<'_>, body: &Value) -> Response {
    let mut headers = vec![AUTH];
    headers.extend_from_slice(extra);
    post_json_with(mock.addr(), path, &headers, body).await
}

async fn chat(mock: &MockProvider, body: &Value) -> Response {
    post_with(mock, "/v2/chat", &[], body).await
}

fn chat_body(text: &str) -> Value {
    json!({
        "model": "command-r-test",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "an earlier question"},
            {"role": "assistant", "content": "an answer"},
            {"role": "user", "content": [{"type": "text", "text": text}]},
        ],
    })
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "weather",
         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
        {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}},
    ])
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

/// Checks Cohere's `{"message"}` error shape and returns the message.
fn assert_cohere_error(resp: &Response, status: u16) -> String {
    assert_eq!(
        resp.status(),
        status,
        "body: {}",
        String::from_utf8_lossy(&resp.body)
    );
    assert_eq!(resp.header("content-type"), Some("application/json"));
    let body = resp.json();
    assert_eq!(body.as_object().map(|o| o.len()), Some(1), "{body}");
    body["message"]
        .as_str()
        .unwrap_or_else(|| panic!("no message: {body}"))
        .to_owned()
}

/// `(event name, data)` pairs, checking that every event has exactly an
/// `event:` and a `data:` line and that the name is the data's `type`.
fn sse_events(body: &[u8]) -> Vec<(String, Value)> {
    let text = std::str::from_utf8(body).expect("SSE body is UTF-8");
    if text.is_empty() {
        return Vec::new();
    }
    assert!(text.ends_with("\n\n"), "SSE body ends with a blank line");
    text.split("\n\n")
        .filter(|event| !event.is_empty())
        .map(|event| {
            let (name, data) = event
                .split_once('\n')
                .unwrap_or_else(|| panic!("event without two lines: {event:?}"));
            let name = name
                .strip_prefix("event: ")
                .unwrap_or_else(|| panic!("no event line: {event:?}"));
            let data = data
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("no data line: {event:?}"));
            let data: Value = serde_json::from_str(data).expect("data is JSON");
            assert_eq!(data["type"], name, "event name matches type");
            (name.to_owned(), data)
        })
        .collect()
}

fn names(events: &[(String, Value)]) -> Vec<&str> {
    events.iter().map(|(name, _)| name.as_str()).collect()
}

#[tokio::test]
async fn chat_plain_reply_and_usage() {
    let mock = MockProvider::start().await;
    let resp = chat(&mock, &chat_body("hello there")).await;
    let body = ok_json(&resp);
    let id = body["id"].as_str().expect("id");
    assert_eq!(id.len(), 36, "{id}");
    assert_eq!(
        body,
        json!({
            "id": id,
            "finish_reason": "COMPLETE",
            "message": {
                "role": "assistant",
                "content": [{"type": "text", "text": "mock reply to: hello there"}],
            },
            // 2 + 3 + 2 + 2 words in; 5 out.
            "usage": {
                "billed_units": {"input_tokens": 9, "output_tokens": 5},
                "tokens": {"input_tokens": 9, "output_tokens": 5},
            },
        })
    );

    let mut limited = chat_body("one two three");
    limited["max_tokens"] = json!(4);
    let body = ok_json(&chat(&mock, &limited).await);
    assert_eq!(body["finish_reason"], "MAX_TOKENS");
    assert_eq!(body["message"]["content"][0]["text"], "mock reply to: one");

    let mut stopped = chat_body("one two three");
    stopped["stop_sequences"] = json!(["two"]);
    stopped["p"] = json!(0.9);
    stopped["k"] = json!(5);
    let body = ok_json(&chat(&mock, &stopped).await);
    assert_eq!(body["finish_reason"], "STOP_SEQUENCE");
    assert_eq!(body["message"]["content"][0]["text"], "mock reply to: one ");

    let resp = post_with(&mock, "/v2/chat", &[("x-mock-words", "2")], &chat_body("x")).await;
    assert_eq!(ok_json(&resp)["message"]["content"][0]["text"], "w1 w2");
}

#[tokio::test]
async fn chat_tool_calls() {
    let mock = MockProvider::start().await;
    let mut body = chat_body("weather in Paris?");
    body["tools"] = tools();
    let answer = ok_json(&chat(&mock, &body).await);
    assert_eq!(answer["finish_reason"], "TOOL_CALL");
    assert_eq!(
        answer["message"],
        json!({
            "role": "assistant",
            "tool_plan": "I will call get_weather.",
            "tool_calls": [{
                "id": "call_mock_0",
                "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"mock\":true,\"n\":1}"},
            }],
        })
    );
    // Four plan words and the arguments.
    assert_eq!(answer["usage"]["tokens"]["output_tokens"], 5);

    body["tool_choice"] = json!("REQUIRED");
    assert_eq!(
        ok_json(&chat(&mock, &body).await)["finish_reason"],
        "TOOL_CALL"
    );
    body["tool_choice"] = json!("NONE");
    let answer = ok_json(&chat(&mock, &body).await);
    assert_eq!(answer["finish_reason"], "COMPLETE");
    assert_eq!(
        answer["message"]["content"][0]["text"],
        "mock reply to: weather in Paris?"
    );

    // After the tool result, the reply shows what arrived.
    let body = json!({
        "model": "command-r-test",
        "tools": tools(),
        "messages": [
            {"role": "user", "content": "weather in Paris?"},
            {"role": "assistant", "tool_plan": "I will call get_weather.", "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees"},
        ],
    });
    let answer = ok_json(&chat(&mock, &body).await);
    assert_eq!(answer["finish_reason"], "COMPLETE");
    assert_eq!(
        answer["message"]["content"][0]["text"],
        "mock reply to: 21 degrees"
    );
}

#[tokio::test]
async fn chat_stream_text() {
    let mock = MockProvider::start().await;
    let whole = ok_json(&chat(&mock, &chat_body("stream me")).await);
    let mut body = chat_body("stream me");
    body["stream"] = json!(true);
    let resp = chat(&mock, &body).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.header("content-type"), Some("text/event-stream"));
    let events = sse_events(&resp.body);
    assert_eq!(
        names(&events),
        [
            "message-start",
            "content-start",
            "content-delta",
            "content-delta",
            "content-delta",
            "content-delta",
            "content-delta",
            "content-end",
            "message-end"
        ]
    );
    assert_eq!(events[0].1["delta"]["message"]["role"], "assistant");
    assert!(events[0].1["id"].is_string());
    assert_eq!(
        events[1].1["delta"]["message"]["content"],
        json!({"type": "text", "text": ""})
    );
    let text: String = events
        .iter()
        .filter(|(name, _)| name == "content-delta")
        .map(|(_, data)| {
            data["delta"]["message"]["content"]["text"]
                .as_str()
                .expect("delta text")
        })
        .collect();
    assert_eq!(text, "mock reply to: stream me");
    assert_eq!(
        events[8].1["delta"],
        json!({"finish_reason": "COMPLETE", "usage": whole["usage"]})
    );
}

#[tokio::test]
async fn chat_stream_tool_call() {
    let mock = MockProvider::start().await;
    let mut body = chat_body("weather?");
    body["tools"] = tools();
    body["stream"] = json!(true);
    let events = sse_events(&chat(&mock, &body).await.body);
    assert_eq!(
        names(&events),
        [
            "message-start",
            "tool-plan-delta",
            "tool-plan-delta",
            "tool-plan-delta",
            "tool-plan-delta",
            "tool-call-start",
            "tool-call-delta",
            "tool-call-delta",
            "tool-call-delta",
            "tool-call-end",
            "message-end"
        ]
    );
    let plan: String = events[1..5]
        .iter()
        .map(|(_, d)| d["delta"]["message"]["tool_plan"].as_str().expect("plan"))
        .collect();
    assert_eq!(plan, "I will call get_weather.");
    assert_eq!(
        events[5].1["delta"]["message"]["tool_calls"],
        json!({"id": "call_mock_0", "type": "function",
               "function": {"name": "get_weather", "arguments": ""}})
    );
    let arguments: String = events[6..9]
        .iter()
        .map(|(_, d)| {
            d["delta"]["message"]["tool_calls"]["function"]["arguments"]
                .as_str()
                .expect("arguments")
        })
        .collect();
    assert_eq!(arguments, r#"{"mock":true,"n":1}"#);
    assert_eq!(events[10].1["delta"]["finish_reason"], "TOOL_CALL");
}

#[tokio::test]
async fn chat_stream_disconnect() {
    let mock = MockProvider::start().await;
    let mut conn = Conn::connect(mock.addr()).await;
    let mut body = chat_body("several words in this one");
    body["stream"] = json!(true);
    let body = body.to_string();
    conn.send(
        "POST",
        "/v2/chat",
        &[AUTH, ("x-mock-disconnect-after", "3")],
        body.as_bytes(),
    )
    .await
    .expect("send");
    assert_eq!(conn.read_head().await.expect("head").status, 200);
    let mut bytes = Vec::new();
    let clean = loop {
        match tokio::time::timeout(IO_TIMEOUT, conn.next_chunk())
            .await
            .expect("stream timed out")
        {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            Ok(None) => break true,
            Err(err) => {
                assert!(matches!(
                    err.kind(),
                    io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset
                ));
                break false;
            }
        }
    };
    assert!(!clean, "expected an abrupt close");
    assert_eq!(
        names(&sse_events(&bytes)),
        ["message-start", "content-start", "content-delta"]
    );
}

#[tokio::test]
async fn chat_wrong_shapes_are_refused() {
    let mock = MockProvider::start().await;
    let with = |field: &str, value: Value| {
        let mut body = chat_body("x");
        body[field] = value;
        body
    };
    let cases = [
        (with("n", json!(2)), "'n'"),
        (with("top_p", json!(0.5)), "Cohere calls it 'p'"),
        (with("stop", json!(["x"])), "stop_sequences"),
        (with("max_completion_tokens", json!(5)), "max_tokens"),
        (
            with("stream_options", json!({"include_usage": true})),
            "stream_options",
        ),
        (with("tool_choice", json!("auto")), "REQUIRED"),
        (with("tool_choice", json!("REQUIRED")), "at least one tool"),
        (with("max_tokens", json!(0)), "max_tokens"),
        (
            json!({"messages": [{"role": "user", "content": "x"}]}),
            "model",
        ),
        (json!({"model": "m", "messages": []}), "messages"),
        (
            json!({"model": "m", "messages": [{"role": "tool", "content": "x"}]}),
            "tool_call_id",
        ),
        (
            json!({"model": "m", "messages": [{"role": "developer", "content": "x"}]}),
            "role",
        ),
        (
            json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "input_text", "text": "x"}]}]}),
            "type",
        ),
        (
            json!({"model": "m", "messages": [{"role": "assistant", "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]}]}),
            "arguments",
        ),
    ];
    for (body, needle) in cases {
        let message = assert_cohere_error(&chat(&mock, &body).await, 400);
        assert!(message.contains(needle), "{body}: {message}");
    }
}

#[tokio::test]
async fn auth_errors_and_faults() {
    let mock = MockProvider::start().await;
    let body = chat_body("x");
    let resp = post_json_with(mock.addr(), "/v2/chat", &[], &body).await;
    assert_eq!(assert_cohere_error(&resp, 401), "no api key supplied");
    let resp = post_json_with(
        mock.addr(),
        "/v2/embed",
        &[("authorization", "co-test")],
        &body,
    )
    .await;
    assert_cohere_error(&resp, 401);

    let resp = post_with(&mock, "/v2/chat", &[("x-mock-status", "429")], &body).await;
    let message = assert_cohere_error(&resp, 429);
    assert!(message.contains("429"), "{message}");
    assert_eq!(resp.header("retry-after-ms"), Some("10"));
    let resp = post_with(&mock, "/x-mock/status=500/v2/embed", &[], &body).await;
    assert_cohere_error(&resp, 500);
    let resp = post_with(&mock, "/x-mock/nope=1/v2/chat", &[], &body).await;
    assert_cohere_error(&resp, 400);
    let resp = post_with(&mock, "/v2/rerank", &[], &body).await;
    assert_cohere_error(&resp, 404);
}

#[tokio::test]
async fn embed() {
    let mock = MockProvider::start().await;
    let body = json!({"model": "embed-v4.0", "texts": ["hello world", "other text here"],
                      "input_type": "search_document", "embedding_types": ["float", "int8"]});
    let resp = post_with(&mock, "/v2/embed", &[], &body).await;
    let answer = ok_json(&resp);
    let floats = answer["embeddings"]["float"].as_array().expect("floats");
    assert_eq!(floats.len(), 2);
    assert_eq!(floats[0].as_array().map(Vec::len), Some(8));
    let ints = answer["embeddings"]["int8"].as_array().expect("ints");
    assert!(ints[1]
        .as_array()
        .expect("int vector")
        .iter()
        .all(|v| v.as_i64().is_some_and(|n| (-128..=127).contains(&n))));
    assert_eq!(answer["texts"], json!(["hello world", "other text here"]));
    assert_eq!(answer["meta"]["billed_units"], json!({"input_tokens": 5}));
    assert_eq!(answer["response_type"], "embeddings_by_type");
    assert!(answer["id"].is_string());

    // The same text embeds as on the OpenAI route; output_dimension sizes it.
    let openai = common::post_json(
        mock.addr(),
        "/v1/embeddings",
        &json!({"input": "hello world", "dimensions": 8}),
    )
    .await
    .json();
    assert_eq!(openai["data"][0]["embedding"], floats[0]);
    let sized =
        json!({"model": "m", "texts": ["x"], "input_type": "search_query", "output_dimension": 3});
    let answer = ok_json(&post_with(&mock, "/v2/embed", &[], &sized).await);
    assert_eq!(
        answer["embeddings"]["float"][0].as_array().map(Vec::len),
        Some(3)
    );

    let cases = [
        (json!({"model": "m", "texts": ["x"]}), "input_type"),
        (
            json!({"model": "m", "texts": ["x"], "input_type": "query"}),
            "input_type",
        ),
        (
            json!({"model": "m", "input": ["x"], "input_type": "search_query"}),
            "'texts'",
        ),
        (
            json!({"model": "m", "texts": [], "input_type": "search_query"}),
            "texts",
        ),
        (
            json!({"texts": ["x"], "input_type": "search_query"}),
            "model",
        ),
        (
            json!({"model": "m", "texts": ["x"], "input_type": "search_query", "encoding_format": "float"}),
            "embedding_types",
        ),
    ];
    for (body, needle) in cases {
        let message = assert_cohere_error(&post_with(&mock, "/v2/embed", &[], &body).await, 400);
        assert!(message.contains(needle), "{body}: {message}");
    }
}
