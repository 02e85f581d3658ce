//! End-to-end tests of the Anthropic Messages route over a raw HTTP/1.1
//! client.

mod common;

use std::io;
use std::time::{Duration, Instant};

use common::{post_json_with, request, Conn, Headers, Response, IO_TIMEOUT};
use mock_provider::MockProvider;
use serde_json::{json, Value};

const API_KEY: (&str, &str) = ("x-api-key", "sk-ant-test");
const VERSION: (&str, &str) = ("anthropic-version", "2023-06-01");

/// POSTs `body` to `path` with valid Anthropic auth headers plus `extra`.
async fn post_with(mock: &MockProvider, path: &str, extra: Headers<'_>, body: &Value) -> Response {
    let mut headers = vec![API_KEY, VERSION];
    headers.extend_from_slice(extra);
    post_json_with(mock.addr(), path, &headers, body).await
}

async fn post(mock: &MockProvider, body: &Value) -> Response {
    post_with(mock, "/v1/messages", &[], body).await
}

fn messages_body(text: &str) -> Value {
    json!({
        "model": "claude-test",
        "max_tokens": 1024,
        "messages": [
            {"role": "user", "content": "an earlier question"},
            {"role": "assistant", "content": "an answer"},
            {"role": "user", "content": text},
        ],
    })
}

fn tools() -> Value {
    json!([
        {"name": "get_weather", "description": "weather", "input_schema": {"type": "object"}},
        {"name": "search", "input_schema": {"type": "object", "properties": {}}},
    ])
}

fn streamed(mut body: Value) -> Value {
    body["stream"] = json!(true);
    body
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

/// Checks Anthropic's error shape and returns the message.
fn assert_error(resp: &Response, status: u16, kind: &str) -> String {
    assert_eq!(
        resp.status(),
        status,
        "body: {}",
        String::from_utf8_lossy(&resp.body)
    );
    assert_eq!(resp.header("content-type"), Some("application/json"));
    let body = resp.json();
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], kind, "{body}");
    assert_eq!(body.as_object().map(|o| o.len()), Some(2), "{body}");
    body["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("no message: {body}"))
        .to_owned()
}

/// Parses an SSE body into `(event name, data)` pairs, checking that every
/// event has exactly an `event:` line and a `data:` line and that the name
/// matches the data's `type`.
fn sse_events(body: &[u8]) -> Vec<(String, Value)> {
    let text = std::str::from_utf8(body).expect("SSE body is UTF-8");
    if text.is_empty() {
        return Vec::new();
    }
    assert!(
        text.ends_with("\n\n"),
        "SSE body must end with a blank line"
    );
    assert!(!text.contains("[DONE]"), "Anthropic streams have no [DONE]");
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
            assert!(!data.contains('\n'), "one data line per event: {event:?}");
            let data: Value = serde_json::from_str(data).expect("data is JSON");
            assert_eq!(data["type"], name, "event name matches type");
            (name.to_owned(), data)
        })
        .collect()
}

fn names(events: &[(String, Value)]) -> Vec<&str> {
    events.iter().map(|(name, _)| name.as_str()).collect()
}

/// The deltas of block `index`, in order.
fn deltas(events: &[(String, Value)], index: u64) -> Vec<&Value> {
    events
        .iter()
        .filter(|(name, data)| name == "content_block_delta" && data["index"] == index)
        .map(|(_, data)| &data["delta"])
        .collect()
}

/// Concatenation of the `field` of every delta of block `index` whose type
/// is `kind`.
fn joined(events: &[(String, Value)], index: u64, kind: &str, field: &str) -> String {
    deltas(events, index)
        .into_iter()
        .filter(|d| d["type"] == kind)
        .map(|d| d[field].as_str().expect("delta text"))
        .collect()
}

/// Reads a streamed response chunk by chunk until the end or an abrupt
/// close; returns the chunks and whether it ended cleanly.
async fn read_stream(conn: &mut Conn) -> (Vec<Vec<u8>>, bool) {
    let mut chunks = Vec::new();
    loop {
        match tokio::time::timeout(IO_TIMEOUT, conn.next_chunk())
            .await
            .expect("stream timed out")
        {
            Ok(Some(chunk)) => chunks.push(chunk),
            Ok(None) => return (chunks, true),
            Err(err) => {
                assert!(
                    matches!(
                        err.kind(),
                        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset
                    ),
                    "{err}"
                );
                return (chunks, false);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Replies
// ---------------------------------------------------------------------------

#[tokio::test]
async fn plain_reply_and_usage() {
    let mock = MockProvider::start().await;
    let resp = post(&mock, &messages_body("hello there")).await;
    let body = ok_json(&resp);
    let id = body["id"].as_str().expect("id");
    assert!(id.starts_with("msg_mock_"), "{id}");
    assert_eq!(
        body,
        json!({
            "id": id,
            "type": "message",
            "role": "assistant",
            "model": "claude-test",
            "content": [{"type": "text", "text": "mock reply to: hello there"}],
            "stop_reason": "end_turn",
            "stop_sequence": null,
            // 3 + 2 + 2 words in; 5 out.
            "usage": {"input_tokens": 7, "output_tokens": 5},
        })
    );
    assert_eq!(resp.header("x-mock-system"), None);

    // Without `/v1` and with a trailing slash; ids differ per response.
    for path in ["/messages", "/v1/messages/"] {
        let other = ok_json(&post_with(&mock, path, &[], &messages_body("hi")).await);
        assert_eq!(other["content"][0]["text"], "mock reply to: hi");
        assert_ne!(other["id"], body["id"]);
    }

    // Text blocks of the last user message are joined; tool results count
    // as input, tool_use and images do not.
    let body = json!({
        "model": "claude-test",
        "max_tokens": 50,
        "messages": [
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": "b c d"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                    {"type": "text", "text": "sunny and warm"},
                ]},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
                {"type": "text", "text": "first part"},
                {"type": "text", "text": "second"},
            ]},
        ],
    });
    let reply = ok_json(&post(&mock, &body).await);
    assert_eq!(
        reply["content"],
        json!([{"type": "text", "text": "mock reply to: first part second"}])
    );
    assert_eq!(reply["usage"]["input_tokens"], 3 + 2 + 1);
    assert_eq!(reply["usage"]["output_tokens"], 6);

    // Roles need not alternate.
    let body = json!({
        "model": "m", "max_tokens": 5,
        "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
    });
    assert_eq!(
        ok_json(&post(&mock, &body).await)["content"][0]["text"],
        "mock reply to: b"
    );
}

#[tokio::test]
async fn system_prompt_is_echoed_in_a_header() {
    let mock = MockProvider::start().await;
    let mut body = messages_body("x");
    body["system"] = json!("be brief\nand kind");
    let resp = post(&mock, &body).await;
    let reply = ok_json(&resp);
    assert_eq!(resp.header("x-mock-system"), Some("be brief and kind"));
    // The reply is not prefixed; the system words count as input.
    assert_eq!(reply["content"][0]["text"], "mock reply to: x");
    assert_eq!(reply["usage"]["input_tokens"], 4 + 3 + 2 + 1);

    body["system"] = json!([
        {"type": "text", "text": "first block"},
        {"type": "text", "text": "second", "cache_control": {"type": "ephemeral"}},
    ]);
    let resp = post(&mock, &body).await;
    assert_eq!(resp.header("x-mock-system"), Some("first block second"));
    assert_eq!(ok_json(&resp)["usage"]["input_tokens"], 3 + 3 + 2 + 1);

    // Only the first 200 characters; streams carry the header too.
    body["system"] = json!("s".repeat(500));
    let resp = post(&mock, &streamed(body.clone())).await;
    assert_eq!(resp.header("x-mock-system"), Some("s".repeat(200).as_str()));
    assert_eq!(resp.header("content-type"), Some("text/event-stream"));
}

#[tokio::test]
async fn stop_sequences_and_max_tokens() {
    let mock = MockProvider::start().await;

    let mut body = messages_body("hello there friend");
    body["stop_sequences"] = json!(["friend", "there"]);
    let reply = ok_json(&post(&mock, &body).await);
    // The earliest match wins, and the text stops right before it.
    assert_eq!(reply["content"][0]["text"], "mock reply to: hello ");
    assert_eq!(reply["stop_reason"], "stop_sequence");
    assert_eq!(reply["stop_sequence"], "there");
    assert_eq!(reply["usage"]["output_tokens"], 4);

    let mut body = messages_body("hello there friend");
    body["max_tokens"] = json!(3);
    let reply = ok_json(&post(&mock, &body).await);
    assert_eq!(reply["content"][0]["text"], "mock reply to:");
    assert_eq!(reply["stop_reason"], "max_tokens");
    assert_eq!(reply["stop_sequence"], Value::Null);
    assert_eq!(reply["usage"]["output_tokens"], 3);

    // The word limit hits before a later stop sequence.
    body["stop_sequences"] = json!(["friend"]);
    let reply = ok_json(&post(&mock, &body).await);
    assert_eq!(reply["stop_reason"], "max_tokens");
    assert_eq!(reply["stop_sequence"], Value::Null);

    // Exactly enough tokens is a normal end.
    body["max_tokens"] = json!(6);
    body["stop_sequences"] = json!(["absent"]);
    let reply = ok_json(&post(&mock, &body).await);
    assert_eq!(reply["stop_reason"], "end_turn");
    assert_eq!(
        reply["content"][0]["text"],
        "mock reply to: hello there friend"
    );

    // `x-mock-words` replies go through the same limits.
    let mut body = messages_body("x");
    body["max_tokens"] = json!(4);
    let resp = post_with(&mock, "/v1/messages", &[("x-mock-words", "6")], &body).await;
    let reply = ok_json(&resp);
    assert_eq!(reply["content"][0]["text"], "w1 w2 w3 w4");
    assert_eq!(reply["stop_reason"], "max_tokens");
    let resp = post_with(
        &mock,
        "/x-mock/words=3/v1/messages",
        &[],
        &messages_body("x"),
    )
    .await;
    assert_eq!(ok_json(&resp)["content"][0]["text"], "w1 w2 w3");

    // Streams report the same stop in `message_delta`.
    let mut body = messages_body("hello there friend");
    body["stop_sequences"] = json!(["friend"]);
    let events = sse_events(&post(&mock, &streamed(body)).await.body);
    assert_eq!(
        joined(&events, 0, "text_delta", "text"),
        "mock reply to: hello there "
    );
    let (_, delta) = &events[events.len() - 2];
    assert_eq!(
        delta,
        &json!({
            "type": "message_delta",
            "delta": {"stop_reason": "stop_sequence", "stop_sequence": "friend"},
            "usage": {"output_tokens": 5},
        })
    );
}

#[tokio::test]
async fn tool_use() {
    let mock = MockProvider::start().await;
    let mut body = messages_body("weather?");
    body["tools"] = tools();
    let reply = ok_json(&post(&mock, &body).await);
    assert_eq!(
        reply["content"],
        json!([
            {"type": "text", "text": "calling get_weather"},
            {"type": "tool_use", "id": "toolu_mock_0", "name": "get_weather", "input": {"mock": true, "n": 1}},
        ])
    );
    assert_eq!(reply["stop_reason"], "tool_use");
    assert_eq!(reply["stop_sequence"], Value::Null);
    assert_eq!(reply["usage"]["output_tokens"], 3);

    let choices = [
        (json!({"type": "tool", "name": "search"}), Some("search")),
        (json!({"type": "any"}), Some("get_weather")),
        (json!({"type": "auto"}), Some("get_weather")),
        (json!({"type": "none"}), None),
    ];
    for (choice, expected) in choices {
        body["tool_choice"] = choice.clone();
        let reply = ok_json(&post(&mock, &body).await);
        match expected {
            Some(name) => {
                assert_eq!(reply["content"][1]["name"], name, "{choice}");
                assert_eq!(reply["content"][0]["text"], format!("calling {name}"));
            }
            None => {
                assert_eq!(reply["content"][0]["text"], "mock reply to: weather?");
                assert_eq!(reply["stop_reason"], "end_turn");
            }
        }
    }
}

#[tokio::test]
async fn tool_use_streamed() {
    let mock = MockProvider::start().await;
    let mut body = messages_body("weather?");
    body["tools"] = tools();
    body["tool_choice"] = json!({"type": "tool", "name": "search"});
    let whole = ok_json(&post(&mock, &body).await);
    let resp = post(&mock, &streamed(body)).await;
    assert_eq!(resp.status(), 200);
    let events = sse_events(&resp.body);
    assert_eq!(
        names(&events),
        [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
    );
    assert_eq!(
        events[6].1,
        json!({
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "tool_use", "id": "toolu_mock_0", "name": "search", "input": {}},
        })
    );
    let pieces = deltas(&events, 1);
    assert!(pieces.len() >= 2);
    assert!(pieces.iter().all(|d| d["type"] == "input_json_delta"));
    let json_text = joined(&events, 1, "input_json_delta", "partial_json");
    let input: Value = serde_json::from_str(&json_text).expect("pieces join to JSON");
    assert_eq!(input, whole["content"][1]["input"]);
    assert_eq!(joined(&events, 0, "text_delta", "text"), "calling search");
    assert_eq!(events[11].1["delta"]["stop_reason"], "tool_use");
    assert_eq!(events[11].1["usage"]["output_tokens"], 3);
}

#[tokio::test]
async fn thinking_blocks() {
    let mock = MockProvider::start().await;
    let mut body = messages_body("a riddle");
    body["thinking"] = json!({"type": "enabled", "budget_tokens": 2048});
    let reply = ok_json(&post(&mock, &body).await);
    assert_eq!(
        reply["content"],
        json!([
            {"type": "thinking", "thinking": "mock thinking about: a riddle", "signature": "sig_mock"},
            {"type": "text", "text": "mock reply to: a riddle"},
        ])
    );
    assert_eq!(reply["usage"]["output_tokens"], 5 + 5);

    // Thinking comes before a tool call too.
    let mut with_tools = body.clone();
    with_tools["tools"] = tools();
    let reply = ok_json(&post(&mock, &with_tools).await);
    let kinds: Vec<&str> = reply["content"]
        .as_array()
        .expect("content")
        .iter()
        .filter_map(|b| b["type"].as_str())
        .collect();
    assert_eq!(kinds, ["thinking", "text", "tool_use"]);

    let events = sse_events(&post(&mock, &streamed(body.clone())).await.body);
    assert_eq!(
        events[2].1,
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}})
    );
    let thinking = deltas(&events, 0);
    assert!(thinking.len() >= 2);
    assert_eq!(
        thinking.last().copied(),
        Some(&json!({"type": "signature_delta", "signature": "sig_mock"}))
    );
    assert!(thinking[..thinking.len() - 1]
        .iter()
        .all(|d| d["type"] == "thinking_delta"));
    assert_eq!(
        joined(&events, 0, "thinking_delta", "thinking"),
        "mock thinking about: a riddle"
    );
    assert_eq!(
        joined(&events, 1, "text_delta", "text"),
        "mock reply to: a riddle"
    );

    // Disabled thinking adds nothing.
    body["thinking"] = json!({"type": "disabled"});
    let reply = ok_json(&post(&mock, &body).await);
    assert_eq!(reply["content"][0]["type"], "text");
}

// ---------------------------------------------------------------------------
// Streaming
// ---------------------------------------------------------------------------

#[tokio::test]
async fn stream_event_order_and_text() {
    let mock = MockProvider::start().await;
    let body = messages_body("tell me  something");
    let whole = ok_json(&post(&mock, &body).await);
    let text = whole["content"][0]["text"].as_str().expect("text");

    let mut conn = Conn::connect(mock.addr()).await;
    let raw = streamed(body).to_string();
    conn.send("POST", "/v1/messages", &[API_KEY, VERSION], raw.as_bytes())
        .await
        .expect("send");
    let head = conn.read_head().await.expect("head");
    assert_eq!(head.status, 200);
    assert_eq!(head.header("content-type"), Some("text/event-stream"));
    assert_eq!(head.header("cache-control"), Some("no-cache"));
    let (chunks, clean) = read_stream(&mut conn).await;
    assert!(clean);
    // Every event is its own body frame.
    for chunk in &chunks {
        assert_eq!(
            sse_events(chunk).len(),
            1,
            "{}",
            String::from_utf8_lossy(chunk)
        );
    }
    let events = sse_events(&chunks.concat());
    let words = text.split_whitespace().count();
    let mut expected = vec!["message_start", "ping", "content_block_start"];
    expected.extend(std::iter::repeat_n("content_block_delta", words));
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names(&events), expected);

    let id = events[0].1["message"]["id"].as_str().expect("id");
    assert!(id.starts_with("msg_mock_"));
    assert_eq!(
        events[0].1,
        json!({
            "type": "message_start",
            "message": {
                "id": id, "type": "message", "role": "assistant", "model": "claude-test",
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": whole["usage"]["input_tokens"], "output_tokens": 1},
            },
        })
    );
    assert_eq!(events[1].1, json!({"type": "ping"}));
    assert_eq!(
        events[2].1,
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
    );
    assert_eq!(
        events[3].1,
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "mock "}})
    );
    assert_eq!(joined(&events, 0, "text_delta", "text"), text);
    assert_eq!(
        events[3 + words].1,
        json!({"type": "content_block_stop", "index": 0})
    );
    assert_eq!(
        events[4 + words].1,
        json!({
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": null},
            "usage": {"output_tokens": whole["usage"]["output_tokens"]},
        })
    );
    assert_eq!(events[5 + words].1, json!({"type": "message_stop"}));
}

#[tokio::test]
async fn chunk_delay_paces_the_stream() {
    let mock = MockProvider::start().await;
    let start = Instant::now();
    let resp = post_with(
        &mock,
        "/x-mock/chunk_delay_ms=30;words=2/v1/messages",
        &[],
        &streamed(messages_body("x")),
    )
    .await;
    // start, ping, block start, 2 deltas, block stop, delta, stop: 7 gaps.
    assert_eq!(sse_events(&resp.body).len(), 8);
    assert!(
        start.elapsed() >= Duration::from_millis(210),
        "{:?}",
        start.elapsed()
    );
}

// ---------------------------------------------------------------------------
// Request checks
// ---------------------------------------------------------------------------

#[tokio::test]
async fn auth_and_version_headers() {
    let mock = MockProvider::start().await;
    let addr = mock.addr();
    let body = messages_body("x");
    let cases: [(&str, Headers<'_>, u16, &str); 5] = [
        ("no x-api-key", &[VERSION], 401, "authentication_error"),
        (
            "empty x-api-key",
            &[("x-api-key", " "), VERSION],
            401,
            "authentication_error",
        ),
        (
            "bearer auth instead of x-api-key",
            &[("authorization", "Bearer sk-ant-test"), VERSION],
            401,
            "authentication_error",
        ),
        (
            "no anthropic-version",
            &[API_KEY],
            400,
            "invalid_request_error",
        ),
        (
            "empty anthropic-version",
            &[API_KEY, ("anthropic-version", "")],
            400,
            "invalid_request_error",
        ),
    ];
    for (rule, headers, status, kind) in cases {
        let resp = post_json_with(addr, "/v1/messages", headers, &body).await;
        let message = assert_error(&resp, status, kind);
        assert!(
            message.contains("x-api-key") || message.contains("anthropic-version"),
            "{rule}: {message}"
        );
    }
}

#[tokio::test]
async fn bad_requests_are_400() {
    let mock = MockProvider::start().await;
    let base = messages_body("x");
    let with = |key: &str, value: Value| {
        let mut body = base.clone();
        body[key] = value;
        body
    };
    let without = |key: &str| {
        let mut body = base.clone();
        body.as_object_mut().map(|o| o.remove(key));
        body
    };
    let one_message = |message: Value| with("messages", json!([message]));
    let user_blocks = |blocks: Value| one_message(json!({"role": "user", "content": blocks}));
    let tool_result = |content: Value| {
        user_blocks(json!([{"type": "tool_result", "tool_use_id": "toolu_1", "content": content}]))
    };

    // (rule, body, a piece of the expected message)
    let cases: Vec<(&str, Value, &str)> = vec![
        ("model missing", without("model"), "model: Field required"),
        ("model not a string", with("model", json!(5)), "model:"),
        ("max_tokens missing", without("max_tokens"), "max_tokens: Field required"),
        ("max_tokens zero", with("max_tokens", json!(0)), "max_tokens:"),
        ("max_tokens negative", with("max_tokens", json!(-5)), "max_tokens:"),
        ("max_tokens fractional", with("max_tokens", json!(1.5)), "max_tokens:"),
        ("max_tokens a string", with("max_tokens", json!("100")), "max_tokens:"),
        ("messages missing", without("messages"), "messages: Field required"),
        ("messages empty", with("messages", json!([])), "messages:"),
        ("messages not a list", with("messages", json!("hi")), "messages:"),
        (
            "system role in messages",
            one_message(json!({"role": "system", "content": "be brief"})),
            "messages.0.role: Input should be 'user' or 'assistant', got 'system' (system prompts go in the top-level 'system' field)",
        ),
        ("tool role", one_message(json!({"role": "tool", "content": "x"})), "messages.0.role"),
        ("role missing", one_message(json!({"content": "x"})), "messages.0.role: Field required"),
        ("content missing", one_message(json!({"role": "user"})), "messages.0.content: Field required"),
        ("content a number", one_message(json!({"role": "user", "content": 3})), "messages.0.content"),
        (
            "unknown block type",
            user_blocks(json!([{"type": "image_url", "image_url": {"url": "x"}}])),
            "messages.0.content.0.type: unknown content block type 'image_url'",
        ),
        ("block without type", user_blocks(json!([{"text": "x"}])), "messages.0.content.0.type: Field required"),
        ("text block without text", user_blocks(json!([{"type": "text"}])), "messages.0.content.0.text"),
        ("image without source", user_blocks(json!([{"type": "image"}])), "messages.0.content.0.source"),
        (
            "tool_use without input",
            user_blocks(json!([{"type": "tool_use", "id": "t", "name": "f"}])),
            "messages.0.content.0.input",
        ),
        (
            "tool_use input not an object",
            user_blocks(json!([{"type": "tool_use", "id": "t", "name": "f", "input": "{}"}])),
            "messages.0.content.0.input",
        ),
        (
            "tool_use without id",
            user_blocks(json!([{"type": "tool_use", "name": "f", "input": {}}])),
            "messages.0.content.0.id",
        ),
        (
            "tool_result without tool_use_id",
            user_blocks(json!([{"type": "tool_result", "content": "x"}])),
            "messages.0.content.0.tool_use_id",
        ),
        ("tool_result content a number", tool_result(json!(5)), "messages.0.content.0.content"),
        (
            "tool_result with a nested tool_use",
            tool_result(json!([{"type": "tool_use", "id": "t", "name": "f", "input": {}}])),
            "messages.0.content.0.content.0.type",
        ),
        (
            "thinking without signature",
            user_blocks(json!([{"type": "thinking", "thinking": "hmm"}])),
            "messages.0.content.0.signature",
        ),
        ("system a number", with("system", json!(1)), "system:"),
        ("system block not text", with("system", json!([{"type": "image"}])), "system.0.type"),
        ("tools not a list", with("tools", json!({})), "tools:"),
        (
            "tool in OpenAI's shape",
            with("tools", json!([{"type": "function", "function": {"name": "f", "parameters": {}}}])),
            "tools.0.name: Field required (OpenAI's",
        ),
        ("tool without input_schema", with("tools", json!([{"name": "f"}])), "tools.0.input_schema"),
        ("tool without name", with("tools", json!([{"input_schema": {}}])), "tools.0.name"),
        ("n", with("n", json!(1)), "n: Extra inputs are not permitted"),
        ("frequency_penalty", with("frequency_penalty", json!(0)), "frequency_penalty: Extra inputs"),
        ("presence_penalty", with("presence_penalty", json!(0)), "presence_penalty: Extra inputs"),
        ("logit_bias", with("logit_bias", json!({})), "logit_bias: Extra inputs"),
        ("stop", with("stop", json!(["x"])), "stop: Extra inputs are not permitted (Anthropic uses 'stop_sequences')"),
        ("response_format", with("response_format", json!({"type": "json_object"})), "response_format: Extra inputs"),
        ("tool_choice a string", with("tool_choice", json!("auto")), "tool_choice: Input should be an object"),
        ("tool_choice unknown type", with("tool_choice", json!({"type": "required"})), "tool_choice.type"),
        (
            "tool_choice tool without name",
            with("tool_choice", json!({"type": "tool"})),
            "tool_choice.name: Field required",
        ),
        ("stop_sequences a string", with("stop_sequences", json!("x")), "stop_sequences:"),
        ("stop_sequences with a number", with("stop_sequences", json!(["a", 1])), "stop_sequences.1"),
        ("thinking without budget", with("thinking", json!({"type": "enabled"})), "thinking.budget_tokens"),
        ("thinking unknown type", with("thinking", json!({"type": "on"})), "thinking.type"),
        ("stream not a boolean", with("stream", json!("yes")), "stream:"),
        ("body not an object", json!([1, 2]), "JSON object"),
    ];
    for (rule, body, expected) in cases {
        let message = assert_error(&post(&mock, &body).await, 400, "invalid_request_error");
        assert!(
            message.contains(expected),
            "{rule}: {message:?} lacks {expected:?}"
        );
    }

    // A tool_choice naming a tool that is not offered.
    let mut body = with("tools", tools());
    body["tool_choice"] = json!({"type": "tool", "name": "nope"});
    let message = assert_error(&post(&mock, &body).await, 400, "invalid_request_error");
    assert!(message.contains("tool_choice.name"), "{message}");

    // Raw bodies that are not JSON at all.
    for raw in [&b""[..], b"{nope", b"\xff\xfe"] {
        let resp = request(
            mock.addr(),
            "POST",
            "/v1/messages",
            &[API_KEY, VERSION],
            raw,
        )
        .await;
        let message = assert_error(&resp, 400, "invalid_request_error");
        assert!(message.contains("JSON"), "{message}");
    }

    // Bad requests are recorded like any other, and the mock keeps serving.
    assert_eq!(mock.requests().len(), mock.request_count());
    assert_eq!(post(&mock, &base).await.status(), 200);
}

#[tokio::test]
async fn other_methods_and_subpaths_are_anthropic_404s() {
    let mock = MockProvider::start().await;
    let addr = mock.addr();
    let message = assert_error(
        &request(addr, "GET", "/v1/messages", &[API_KEY, VERSION], b"").await,
        404,
        "not_found_error",
    );
    assert!(message.contains("GET /v1/messages"), "{message}");
    assert_error(
        &request(addr, "POST", "/v1/messages/count_tokens", &[], b"{}").await,
        404,
        "not_found_error",
    );
}

// ---------------------------------------------------------------------------
// Faults and recording
// ---------------------------------------------------------------------------

#[tokio::test]
async fn injected_status_uses_anthropic_errors() {
    let mock = MockProvider::start().await;
    let body = messages_body("x");
    let cases = [
        (500, "api_error"),
        (429, "rate_limit_error"),
        (529, "overloaded_error"),
        (503, "api_error"),
    ];
    for (status, kind) in cases {
        let value = status.to_string();
        let resp = post_with(&mock, "/v1/messages", &[("x-mock-status", &value)], &body).await;
        let message = assert_error(&resp, status, kind);
        assert_eq!(message, format!("mock injected status {status}"));
        let retry = resp.header("retry-after-ms");
        assert_eq!(retry, (status != 500).then_some("10"), "{status}");
    }
    // The prefix form; faults come before the request checks.
    let resp = request(mock.addr(), "POST", "/x-mock/status=502/messages", &[], b"").await;
    assert_error(&resp, 502, "api_error");
    // Bad fault values answer in Anthropic's shape too.
    let resp = post_with(&mock, "/v1/messages", &[("x-mock-status", "abc")], &body).await;
    assert_error(&resp, 400, "invalid_request_error");
    // fail_first counts per route, then lets requests through.
    let path = "/x-mock/fail_first=1;status=529/v1/messages";
    assert_error(
        &post_with(&mock, path, &[], &body).await,
        529,
        "overloaded_error",
    );
    assert_eq!(post_with(&mock, path, &[], &body).await.status(), 200);
}

#[tokio::test]
async fn stream_error_event() {
    let mock = MockProvider::start().await;
    let expected_error =
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
    for (path, headers) in [
        ("/v1/messages", &[("x-mock-stream-error", "1")][..]),
        ("/x-mock/stream_error=1/v1/messages", &[][..]),
    ] {
        let resp = post_with(&mock, path, headers, &streamed(messages_body("a b c"))).await;
        assert_eq!(resp.status(), 200);
        let events = sse_events(&resp.body);
        assert_eq!(
            names(&events),
            [
                "message_start",
                "ping",
                "content_block_start",
                "content_block_delta",
                "error"
            ],
            "{path}"
        );
        assert_eq!(events[4].1, expected_error);
    }

    // With thinking on, the first delta is a thinking delta.
    let mut body = streamed(messages_body("q"));
    body["thinking"] = json!({"type": "enabled", "budget_tokens": 1024});
    let resp = post_with(
        &mock,
        "/v1/messages",
        &[("x-mock-stream-error", "1")],
        &body,
    )
    .await;
    let events = sse_events(&resp.body);
    assert_eq!(events[3].1["delta"]["type"], "thinking_delta");
    assert_eq!(names(&events).last(), Some(&"error"));
    assert_eq!(events.len(), 5);

    // An empty reply has no delta: the error replaces `message_delta`.
    let resp = post_with(
        &mock,
        "/x-mock/words=0;stream_error=1/v1/messages",
        &[],
        &streamed(messages_body("q")),
    )
    .await;
    let events = sse_events(&resp.body);
    assert_eq!(
        names(&events),
        [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_stop",
            "error"
        ]
    );

    // Non-stream requests ignore it; fail_first limits it.
    let resp = post_with(
        &mock,
        "/v1/messages",
        &[("x-mock-stream-error", "1")],
        &messages_body("q"),
    )
    .await;
    assert_eq!(ok_json(&resp)["stop_reason"], "end_turn");
    let path = "/x-mock/fail_first=1;stream_error=1/v1/messages";
    let first = sse_events(
        &post_with(&mock, path, &[], &streamed(messages_body("q")))
            .await
            .body,
    );
    assert_eq!(names(&first).last(), Some(&"error"));
    let second = sse_events(
        &post_with(&mock, path, &[], &streamed(messages_body("q")))
            .await
            .body,
    );
    assert_eq!(names(&second).last(), Some(&"message_stop"));

    // Only 0 and 1 are valid.
    let resp = post_with(
        &mock,
        "/v1/messages",
        &[("x-mock-stream-error", "2")],
        &messages_body("q"),
    )
    .await;
    assert_error(&resp, 400, "invalid_request_error");
}

#[tokio::test]
async fn disconnect_after() {
    let mock = MockProvider::start().await;
    for n in [0usize, 1, 4] {
        let mut conn = Conn::connect(mock.addr()).await;
        let value = n.to_string();
        let body = streamed(messages_body("several words in this one")).to_string();
        conn.send(
            "POST",
            "/v1/messages",
            &[API_KEY, VERSION, ("x-mock-disconnect-after", &value)],
            body.as_bytes(),
        )
        .await
        .expect("send");
        let head = conn.read_head().await.expect("head");
        assert_eq!(head.status, 200);
        let (chunks, clean) = read_stream(&mut conn).await;
        assert!(
            !clean,
            "stream of {n} ended cleanly; expected an abrupt close"
        );
        let events = sse_events(&chunks.concat());
        assert_eq!(events.len(), n);
        assert!(names(&events).iter().all(|&e| e != "message_stop"));
    }

    // Non-stream requests get no answer at all.
    let mut conn = Conn::connect(mock.addr()).await;
    let body = messages_body("x").to_string();
    let result = conn
        .request(
            "POST",
            "/x-mock/disconnect_after=0/v1/messages",
            &[API_KEY, VERSION],
            body.as_bytes(),
        )
        .await;
    assert!(result.is_err(), "no response expected");
    assert_eq!(post(&mock, &messages_body("x")).await.status(), 200);
}

#[tokio::test]
async fn requests_are_recorded() {
    let mock = MockProvider::start().await;
    let mut body = messages_body("record me");
    body["system"] = json!("sys");
    post_with(
        &mock,
        "/x-mock/delay_ms=1/v1/messages?beta=true",
        &[("anthropic-beta", "tools-2024")],
        &body,
    )
    .await;
    let bad = json!({"model": "m"});
    post(&mock, &bad).await;

    let requests = mock.requests();
    assert_eq!(requests.len(), 2);
    let first = &requests[0];
    assert_eq!(first.method, "POST");
    assert_eq!(first.path, "/x-mock/delay_ms=1/v1/messages");
    assert_eq!(first.query.as_deref(), Some("beta=true"));
    assert_eq!(first.header("x-api-key"), Some("sk-ant-test"));
    assert_eq!(first.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(first.header("anthropic-beta"), Some("tools-2024"));
    assert_eq!(first.json(), Some(body));
    assert_eq!(requests[1].json(), Some(bad));
    assert_eq!(mock.request_count(), 2);
}

#[tokio::test]
async fn oversized_bodies_are_anthropic_413s() {
    let mock = MockProvider::start().await;
    let body = vec![b' '; 65 * 1024 * 1024];
    let resp = request(
        mock.addr(),
        "POST",
        "/v1/messages",
        &[API_KEY, VERSION],
        &body,
    )
    .await;
    assert_error(&resp, 413, "request_too_large");
}
