//! End-to-end tests of the mock provider over a raw HTTP/1.1 client.

mod common;

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{get, post_json, post_json_with, request, Conn, Headers, Response, IO_TIMEOUT};
use mock_provider::{MockOptions, MockProvider};
use serde_json::{json, Value};
use tokio::net::TcpStream;

/// The `data:` payloads of an SSE body, in order.
fn sse_data(body: &[u8]) -> Vec<String> {
    let text = std::str::from_utf8(body).expect("SSE body is UTF-8");
    assert!(
        text.ends_with("\n\n"),
        "SSE body must end with a blank line"
    );
    text.split("\n\n")
        .filter(|event| !event.is_empty())
        .map(|event| {
            event
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not a data event: {event:?}"))
                .to_owned()
        })
        .collect()
}

/// Parses every event but the final `[DONE]`, which must be there.
fn sse_chunks(body: &[u8]) -> Vec<Value> {
    let mut data = sse_data(body);
    assert_eq!(data.pop().as_deref(), Some("[DONE]"), "[DONE] must be last");
    assert!(!data.iter().any(|d| d == "[DONE]"));
    data.iter()
        .map(|d| serde_json::from_str(d).expect("chunk is JSON"))
        .collect()
}

fn chat_body(text: &str) -> Value {
    json!({
        "model": "gpt-test",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "an earlier question"},
            {"role": "assistant", "content": "an answer"},
            {"role": "user", "content": text},
        ],
    })
}

fn assert_openai_error(resp: &Response, status: u16) -> Value {
    assert_eq!(
        resp.status(),
        status,
        "body: {}",
        String::from_utf8_lossy(&resp.body)
    );
    assert_eq!(resp.header("content-type"), Some("application/json"));
    let body = resp.json();
    let error = &body["error"];
    assert!(error["message"].is_string(), "{body}");
    assert!(error["type"].is_string(), "{body}");
    assert!(error.get("param").is_some(), "{body}");
    assert!(error.get("code").is_some(), "{body}");
    error.clone()
}

/// Deterministic pseudo-random bytes.
fn noise(len: usize) -> Vec<u8> {
    let mut state = 0x1234_5678_9abc_def0u64;
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (state >> 56) as u8
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Library surface
// ---------------------------------------------------------------------------

#[tokio::test]
async fn base_url_and_start_on() {
    let mock = MockProvider::start().await;
    assert_eq!(mock.addr().ip().to_string(), "127.0.0.1");
    assert_ne!(mock.addr().port(), 0);
    assert_eq!(
        mock.base_url(),
        format!("http://127.0.0.1:{}/v1", mock.addr().port())
    );

    let other = MockProvider::start_on("127.0.0.1:0".parse().unwrap())
        .await
        .expect("bind");
    assert_ne!(other.addr().port(), mock.addr().port());
    assert_eq!(get(other.addr(), "/v1/models").await.status(), 200);
}

#[tokio::test]
async fn records_requests_in_order() {
    let mock = MockProvider::start().await;
    let addr = mock.addr();
    post_json_with(
        addr,
        "/v1/chat/completions?api-version=2024",
        &[
            ("X-Custom-Header", "Value One"),
            ("authorization", "Bearer sk-test"),
        ],
        &chat_body("first"),
    )
    .await;
    request(
        addr,
        "PUT",
        "/x-mock/delay_ms=1/v1/echo/a",
        &[],
        b"raw bytes",
    )
    .await;

    let requests = mock.requests();
    assert_eq!(requests.len(), 2);
    let first = &requests[0];
    assert_eq!(first.method, "POST");
    assert_eq!(first.path, "/v1/chat/completions");
    assert_eq!(first.query.as_deref(), Some("api-version=2024"));
    assert_eq!(first.header("x-custom-header"), Some("Value One"));
    assert_eq!(first.header("X-CUSTOM-HEADER"), Some("Value One"));
    assert_eq!(first.header("authorization"), Some("Bearer sk-test"));
    assert!(first
        .headers
        .iter()
        .all(|(n, _)| *n == n.to_ascii_lowercase()));
    assert_eq!(first.json(), Some(chat_body("first")));

    let second = &requests[1];
    assert_eq!(second.method, "PUT");
    assert_eq!(second.path, "/x-mock/delay_ms=1/v1/echo/a");
    assert_eq!(second.query, None);
    assert_eq!(&second.body[..], b"raw bytes");
    assert_eq!(second.json(), None);

    assert_eq!(mock.request_count(), 2);
    mock.clear_requests();
    assert!(mock.requests().is_empty());
    get(addr, "/v1/models").await;
    assert_eq!(mock.requests().len(), 1);
    assert_eq!(mock.request_count(), 3);
}

#[tokio::test]
async fn recording_can_be_disabled() {
    let mock = MockProvider::start_with(MockOptions { record: false }).await;
    for _ in 0..3 {
        let resp = post_json(mock.addr(), "/v1/chat/completions", &chat_body("x")).await;
        assert_eq!(resp.status(), 200);
    }
    assert!(mock.requests().is_empty());
    assert_eq!(mock.request_count(), 3);
}

#[tokio::test]
async fn keep_alive_serves_many_requests_per_connection() {
    let mock = MockProvider::start().await;
    let mut conn = Conn::connect(mock.addr()).await;
    for i in 0..5 {
        let body = chat_body(&format!("message {i}")).to_string();
        let resp = conn
            .request(
                "POST",
                "/v1/chat/completions",
                &[("content-type", "application/json")],
                body.as_bytes(),
            )
            .await
            .expect("keep-alive request");
        assert_eq!(
            resp.json()["choices"][0]["message"]["content"],
            format!("mock reply to: message {i}")
        );
    }
    // Errors do not break the connection either.
    let resp = conn
        .request("POST", "/v1/chat/completions", &[], b"{nope")
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let resp = conn.request("GET", "/v1/models", &[], b"").await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(mock.request_count(), 7);
}

#[tokio::test]
async fn concurrent_requests() {
    let mock = MockProvider::start().await;
    let addr = mock.addr();
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            tokio::spawn(async move {
                post_json(addr, "/v1/chat/completions", &chat_body(&format!("q{i}"))).await
            })
        })
        .collect();
    for (i, task) in tasks.into_iter().enumerate() {
        let resp = task.await.unwrap();
        assert_eq!(
            resp.json()["choices"][0]["message"]["content"],
            format!("mock reply to: q{i}")
        );
    }
    assert_eq!(mock.request_count(), 64);
    assert_eq!(mock.requests().len(), 64);
}

#[tokio::test]
async fn drop_stops_accepting() {
    let mock = MockProvider::start().await;
    let addr = mock.addr();
    assert_eq!(get(addr, "/v1/models").await.status(), 200);
    drop(mock);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if TcpStream::connect(addr).await.is_err() {
            break;
        }
        assert!(Instant::now() < deadline, "still accepting after drop");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn binary_serves_until_killed() {
    use std::io::BufRead;
    use std::process::{Command, Stdio};

    let mut child = Command::new(env!("CARGO_BIN_EXE_mock-provider"))
        .args(["--listen", "127.0.0.1:0", "--no-record"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn mock-provider");
    let stdout = child.stdout.take().expect("stdout");
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .map(|_| line)
    })
    .await
    .unwrap()
    .expect("read listening line");
    let addr: SocketAddr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .parse()
        .expect("address");
    let resp = post_json(addr, "/v1/chat/completions", &chat_body("from the binary")).await;
    assert_eq!(
        resp.json()["choices"][0]["message"]["content"],
        "mock reply to: from the binary"
    );
    child.kill().expect("kill");
    child.wait().expect("wait");

    let bad = Command::new(env!("CARGO_BIN_EXE_mock-provider"))
        .arg("--bogus")
        .stderr(Stdio::null())
        .status()
        .expect("run");
    assert_eq!(bad.code(), Some(2));
}

// ---------------------------------------------------------------------------
// Routes
// ---------------------------------------------------------------------------

#[tokio::test]
async fn models_route() {
    let mock = MockProvider::start().await;
    let expected = json!({"object":"list","data":[{"id":"mock-model","object":"model","created":0,"owned_by":"mock"}]});
    for path in ["/v1/models", "/models", "/v1/models/"] {
        let resp = get(mock.addr(), path).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.header("content-type"), Some("application/json"));
        assert_eq!(resp.json(), expected);
    }
}

#[tokio::test]
async fn unknown_routes_are_404() {
    let mock = MockProvider::start().await;
    let error = assert_openai_error(&get(mock.addr(), "/v1/nope/there").await, 404);
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("/v1/nope/there"),
        "{error}"
    );
    assert_eq!(error["type"], "invalid_request_error");
    // Known path, wrong method.
    let error = assert_openai_error(&get(mock.addr(), "/v1/chat/completions").await, 404);
    assert!(error["message"]
        .as_str()
        .unwrap()
        .contains("GET /v1/chat/completions"));
}

#[tokio::test]
async fn chat_completion() {
    let mock = MockProvider::start().await;
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let resp = post_json(
        mock.addr(),
        "/v1/chat/completions",
        &chat_body("hello there world"),
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.header("content-type"), Some("application/json"));
    let body = resp.json();
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-mock-"));
    assert_eq!(body["object"], "chat.completion");
    assert!(body["created"].as_u64().unwrap() >= before);
    assert_eq!(body["model"], "gpt-test");
    assert_eq!(body["system_fingerprint"], "fp_mock");
    assert_eq!(
        body["choices"],
        json!([{
            "index": 0,
            "message": {"role": "assistant", "content": "mock reply to: hello there world"},
            "logprobs": null,
            "finish_reason": "stop",
        }])
    );
    // Prompt: "be brief" 2 + "an earlier question" 3 + "an answer" 2 +
    // "hello there world" 3 = 10. Completion: 6 words.
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 10, "completion_tokens": 6, "total_tokens": 16})
    );

    // Ids are unique; no `/v1` prefix works too.
    let again = post_json(mock.addr(), "/chat/completions", &chat_body("x"))
        .await
        .json();
    assert_ne!(again["id"], body["id"]);
}

#[tokio::test]
async fn chat_content_parts_and_default_model() {
    let mock = MockProvider::start().await;
    let body = json!({
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "part one"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "text", "text": "part two"},
        ]}],
    });
    let resp = post_json(mock.addr(), "/v1/chat/completions", &body)
        .await
        .json();
    assert_eq!(resp["model"], "mock-model");
    assert_eq!(
        resp["choices"][0]["message"]["content"],
        "mock reply to: part one part two"
    );
    assert_eq!(resp["usage"]["prompt_tokens"], 4);
    assert_eq!(resp["usage"]["completion_tokens"], 7);

    // Escaped text and a null assistant content are fine.
    let body = json!({"messages": [
        {"role": "assistant", "content": null, "tool_calls": []},
        {"role": "user", "content": "line \"one\"\nline two"},
    ]});
    let resp = post_json(mock.addr(), "/v1/chat/completions", &body)
        .await
        .json();
    assert_eq!(
        resp["choices"][0]["message"]["content"],
        "mock reply to: line \"one\"\nline two"
    );
}

#[tokio::test]
async fn chat_n_choices() {
    let mock = MockProvider::start().await;
    let mut body = chat_body("three please");
    body["n"] = json!(3);
    let resp = post_json(mock.addr(), "/v1/chat/completions", &body)
        .await
        .json();
    let choices = resp["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, choice) in choices.iter().enumerate() {
        assert_eq!(choice["index"], i);
        assert_eq!(choice["message"]["content"], "mock reply to: three please");
        assert_eq!(choice["finish_reason"], "stop");
    }
    // 5 words per choice.
    assert_eq!(resp["usage"]["completion_tokens"], 15);
    assert_eq!(resp["usage"]["total_tokens"], 9 + 15);
}

#[tokio::test]
async fn chat_max_tokens_truncates() {
    let mock = MockProvider::start().await;
    let mut body = chat_body("a long question here");
    body["max_tokens"] = json!(4);
    let resp = post_json(mock.addr(), "/v1/chat/completions", &body)
        .await
        .json();
    assert_eq!(resp["choices"][0]["message"]["content"], "mock reply to: a");
    assert_eq!(resp["choices"][0]["finish_reason"], "length");
    assert_eq!(resp["usage"]["completion_tokens"], 4);

    // A limit at least as long as the reply changes nothing.
    body["max_tokens"] = json!(7);
    let resp = post_json(mock.addr(), "/v1/chat/completions", &body)
        .await
        .json();
    assert_eq!(resp["choices"][0]["finish_reason"], "stop");
    assert_eq!(resp["usage"]["completion_tokens"], 7);

    // `max_completion_tokens` counts too.
    let mut body = chat_body("a long question here");
    body["max_completion_tokens"] = json!(2);
    let resp = post_json(mock.addr(), "/v1/chat/completions", &body)
        .await
        .json();
    assert_eq!(resp["choices"][0]["message"]["content"], "mock reply");
}

#[tokio::test]
async fn chat_bad_requests_are_400() {
    let mock = MockProvider::start().await;
    let addr = mock.addr();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("malformed", b"{\"messages\": [".to_vec()),
        ("empty", Vec::new()),
        ("not an object", b"[1,2,3]".to_vec()),
        ("no messages", br#"{"model":"m"}"#.to_vec()),
        (
            "bad content",
            br#"{"messages":[{"role":"user","content":42}]}"#.to_vec(),
        ),
        ("n zero", br#"{"messages":[],"n":0}"#.to_vec()),
        ("n huge", br#"{"messages":[],"n":100000}"#.to_vec()),
        ("n negative", br#"{"messages":[],"n":-1}"#.to_vec()),
        (
            "stream string",
            br#"{"messages":[],"stream":"yes"}"#.to_vec(),
        ),
        (
            "invalid utf8",
            b"{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}".to_vec(),
        ),
        (
            "nameless tool",
            br#"{"messages":[],"tools":[{"type":"function"}]}"#.to_vec(),
        ),
    ];
    for (name, body) in cases {
        let resp = request(addr, "POST", "/v1/chat/completions", &[], &body).await;
        let error = assert_openai_error(&resp, 400);
        assert_eq!(error["type"], "invalid_request_error", "{name}");
        assert_eq!(error["code"], Value::Null, "{name}");
    }
    let resp = request(addr, "POST", "/v1/chat/completions", &[], b"{").await;
    let body = resp.json();
    assert_eq!(body["error"]["param"], Value::Null);
    assert_eq!(body.as_object().unwrap().len(), 1);
    assert_eq!(body["error"].as_object().unwrap().len(), 4);
}

#[tokio::test]
async fn chat_tool_calls() {
    let mock = MockProvider::start().await;
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
    ]);
    let mut body = chat_body("weather?");
    body["tools"] = tools;
    let resp = post_json(mock.addr(), "/v1/chat/completions", &body)
        .await
        .json();
    let choice = &resp["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(
        choice["message"],
        json!({
            "role": "assistant",
            "content": null,
            "tool_calls": [{
                "id": "call_mock_0",
                "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"mock\":true,\"n\":1}"},
            }],
        })
    );
    let args: Value = serde_json::from_str(
        choice["message"]["tool_calls"][0]["function"]["arguments"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(args, json!({"mock": true, "n": 1}));

    body["tool_choice"] = json!({"type": "function", "function": {"name": "get_time"}});
    let resp = post_json(mock.addr(), "/v1/chat/completions", &body)
        .await
        .json();
    assert_eq!(
        resp["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "get_time"
    );

    for choice in ["auto", "required"] {
        body["tool_choice"] = json!(choice);
        let resp = post_json(mock.addr(), "/v1/chat/completions", &body)
            .await
            .json();
        assert_eq!(
            resp["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
            "get_weather"
        );
    }

    body["tool_choice"] = json!("none");
    let resp = post_json(mock.addr(), "/v1/chat/completions", &body)
        .await
        .json();
    assert_eq!(
        resp["choices"][0]["message"]["content"],
        "mock reply to: weather?"
    );
    assert_eq!(resp["choices"][0]["finish_reason"], "stop");
    assert!(resp["choices"][0]["message"].get("tool_calls").is_none());

    // Empty tools means a normal answer.
    body["tools"] = json!([]);
    body.as_object_mut().unwrap().remove("tool_choice");
    let resp = post_json(mock.addr(), "/v1/chat/completions", &body)
        .await
        .json();
    assert_eq!(resp["choices"][0]["finish_reason"], "stop");
}

#[tokio::test]
async fn chat_stream_matches_non_stream() {
    let mock = MockProvider::start().await;
    let addr = mock.addr();
    let plain = post_json(
        addr,
        "/v1/chat/completions",
        &chat_body("stream  me\tplease"),
    )
    .await
    .json();
    let expected_content = plain["choices"][0]["message"]["content"].as_str().unwrap();

    let mut body = chat_body("stream  me\tplease");
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let resp = post_json(addr, "/v1/chat/completions", &body).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.header("content-type"), Some("text/event-stream"));
    assert_eq!(resp.header("transfer-encoding"), Some("chunked"));
    let chunks = sse_chunks(&resp.body);

    let id = chunks[0]["id"].as_str().unwrap();
    assert!(id.starts_with("chatcmpl-mock-"));
    for chunk in &chunks {
        assert_eq!(chunk["id"], id);
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["model"], "gpt-test");
        assert_eq!(chunk["system_fingerprint"], "fp_mock");
        assert!(chunk["created"].is_u64());
    }
    let (usage_chunk, choice_chunks) = chunks.split_last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"], plain["usage"]);
    for chunk in choice_chunks {
        assert_eq!(chunk["usage"], Value::Null);
        assert!(
            chunk.get("usage").is_some(),
            "usage: null on every chunk with include_usage"
        );
        assert_eq!(chunk["choices"][0]["logprobs"], Value::Null);
    }

    assert_eq!(
        choice_chunks[0]["choices"][0],
        json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null})
    );
    let last = choice_chunks.last().unwrap();
    assert_eq!(last["choices"][0]["delta"], json!({}));
    assert_eq!(last["choices"][0]["finish_reason"], "stop");

    let words = &choice_chunks[1..choice_chunks.len() - 1];
    // One chunk per word: "mock reply to: stream me please".
    assert_eq!(words.len(), 6);
    let joined: String = words
        .iter()
        .map(|c| {
            assert_eq!(c["choices"][0]["finish_reason"], Value::Null);
            c["choices"][0]["delta"]["content"].as_str().unwrap()
        })
        .collect();
    assert_eq!(joined, expected_content);
    assert_eq!(words[3]["choices"][0]["delta"]["content"], "stream  ");
}

#[tokio::test]
async fn chat_stream_several_choices_without_usage() {
    let mock = MockProvider::start().await;
    let mut body = chat_body("two streams");
    body["stream"] = json!(true);
    body["n"] = json!(2);
    body["max_tokens"] = json!(4);
    let resp = post_json(mock.addr(), "/v1/chat/completions", &body).await;
    let chunks = sse_chunks(&resp.body);
    // Per choice: role + 4 words + finish.
    assert_eq!(chunks.len(), 2 * 6);
    for index in 0..2u64 {
        let mine: Vec<&Value> = chunks
            .iter()
            .filter(|c| c["choices"][0]["index"] == index)
            .collect();
        assert_eq!(mine.len(), 6);
        assert_eq!(mine[0]["choices"][0]["delta"]["role"], "assistant");
        let text: String = mine
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, "mock reply to: two");
        assert_eq!(mine[5]["choices"][0]["finish_reason"], "length");
    }
    assert!(chunks.iter().all(|c| c.get("usage").is_none()));
}

#[tokio::test]
async fn chat_stream_tool_call() {
    let mock = MockProvider::start().await;
    let mut body = chat_body("use a tool");
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    body["tools"] = json!([{"type": "function", "function": {"name": "lookup"}}]);
    let resp = post_json(mock.addr(), "/v1/chat/completions", &body).await;
    let chunks = sse_chunks(&resp.body);

    let first = &chunks[0]["choices"][0]["delta"];
    assert_eq!(first["role"], "assistant");
    assert_eq!(
        first["tool_calls"],
        json!([{"index": 0, "id": "call_mock_0", "type": "function", "function": {"name": "lookup", "arguments": ""}}])
    );
    let finish = chunks
        .iter()
        .position(|c| c["choices"][0]["finish_reason"] == "tool_calls")
        .unwrap();
    let pieces: Vec<&str> = chunks[1..finish]
        .iter()
        .map(|c| {
            let call = &c["choices"][0]["delta"]["tool_calls"][0];
            assert_eq!(call["index"], 0);
            call["function"]["arguments"].as_str().unwrap()
        })
        .collect();
    assert!(pieces.len() >= 2, "arguments must be split: {pieces:?}");
    assert_eq!(pieces.concat(), "{\"mock\":true,\"n\":1}");
    assert_eq!(chunks[finish]["choices"][0]["delta"], json!({}));
    // Usage chunk follows the finish chunk.
    assert_eq!(chunks.len(), finish + 2);
    assert_eq!(chunks[finish + 1]["usage"]["completion_tokens"], 1);
}

#[tokio::test]
async fn embeddings() {
    let mock = MockProvider::start().await;
    let addr = mock.addr();

    let resp = post_json(
        addr,
        "/v1/embeddings",
        &json!({"input": "hello embedding world", "model": "emb-test"}),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let single = resp.json();
    assert_eq!(single["object"], "list");
    assert_eq!(single["model"], "emb-test");
    assert_eq!(
        single["usage"],
        json!({"prompt_tokens": 3, "total_tokens": 3})
    );
    let data = single["data"].as_array().unwrap();
    assert_eq!(data.len(), 1);
    assert_eq!(data[0]["object"], "embedding");
    assert_eq!(data[0]["index"], 0);
    let vector: Vec<f64> = data[0]["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(vector.len(), 8);
    assert!(vector.iter().all(|v| (-1.0..=1.0).contains(v)));
    assert!(
        vector.windows(2).any(|w| w[0] != w[1]),
        "values vary by position"
    );

    // Several strings, custom dimensions, deterministic per text.
    let resp = post_json(
        addr,
        "/embeddings",
        &json!({"input": ["hello embedding world", "other text", "hello embedding world"], "dimensions": 32}),
    )
    .await
    .json();
    let data = resp["data"].as_array().unwrap();
    assert_eq!(data.len(), 3);
    assert_eq!(resp["usage"]["prompt_tokens"], 3 + 2 + 3);
    assert_eq!(resp["model"], "text-embedding-mock");
    for (i, item) in data.iter().enumerate() {
        assert_eq!(item["index"], i);
        assert_eq!(item["embedding"].as_array().unwrap().len(), 32);
    }
    assert_eq!(data[0]["embedding"], data[2]["embedding"]);
    assert_ne!(data[0]["embedding"], data[1]["embedding"]);
    // The same text with 8 dimensions is a prefix of the 32-dimension vector.
    assert_eq!(
        data[0]["embedding"].as_array().unwrap()[..8],
        single["data"][0]["embedding"].as_array().unwrap()[..]
    );

    // Token arrays: one, or several; usage counts tokens.
    let resp = post_json(
        addr,
        "/v1/embeddings",
        &json!({"input": [[1, 2, 3], [4, 5]]}),
    )
    .await
    .json();
    assert_eq!(resp["data"].as_array().unwrap().len(), 2);
    assert_eq!(resp["usage"]["prompt_tokens"], 5);
    let resp = post_json(addr, "/v1/embeddings", &json!({"input": [1, 2, 3]}))
        .await
        .json();
    assert_eq!(resp["data"].as_array().unwrap().len(), 1);
    assert_eq!(resp["usage"]["prompt_tokens"], 3);

    // base64: little-endian f32s of the same vector.
    let resp = post_json(
        addr,
        "/v1/embeddings",
        &json!({"input": "hello embedding world", "encoding_format": "base64"}),
    )
    .await
    .json();
    let encoded = resp["data"][0]["embedding"].as_str().unwrap();
    let bytes = base64_decode(encoded);
    assert_eq!(bytes.len(), 8 * 4);
    let decoded: Vec<f32> = bytes
        .chunks(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    // JSON carries the shortest decimal that round-trips the f32.
    let as_f32: Vec<f32> = vector.iter().map(|&v| v as f32).collect();
    assert_eq!(decoded, as_f32);

    for bad in [
        json!({}),
        json!({"input": 5}),
        json!({"input": []}),
        json!({"input": [1, "a"]}),
        json!({"input": [[1, -2]]}),
        json!({"input": "x", "dimensions": 0}),
        json!({"input": "x", "encoding_format": "hex"}),
    ] {
        assert_openai_error(&post_json(addr, "/v1/embeddings", &bad).await, 400);
    }
}

fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("bad base64 byte {c}"),
        }
    };
    let mut out = Vec::new();
    for quad in text.as_bytes().chunks(4) {
        let pad = quad.iter().filter(|&&c| c == b'=').count();
        let n = quad
            .iter()
            .map(|&c| if c == b'=' { 0 } else { value(c) })
            .fold(0u32, |acc, v| (acc << 6) | v);
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    out
}

#[tokio::test]
async fn moderations() {
    let mock = MockProvider::start().await;
    let keys = [
        "hate",
        "hate/threatening",
        "harassment",
        "harassment/threatening",
        "self-harm",
        "self-harm/intent",
        "self-harm/instructions",
        "sexual",
        "sexual/minors",
        "violence",
        "violence/graphic",
    ];
    let resp = post_json(
        mock.addr(),
        "/v1/moderations",
        &json!({"input": ["I will KILL the process", "I hate mondays", "a nice day", "Attack at dawn"]}),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let body = resp.json();
    assert!(body["id"].as_str().unwrap().starts_with("modr-mock-"));
    assert_eq!(body["model"], "text-moderation-latest");
    let results = body["results"].as_array().unwrap();
    assert_eq!(results.len(), 4);
    for result in results {
        let categories = result["categories"].as_object().unwrap();
        let scores = result["category_scores"].as_object().unwrap();
        let mut names: Vec<&str> = categories.keys().map(String::as_str).collect();
        names.sort_unstable();
        let mut expected = keys.to_vec();
        expected.sort_unstable();
        assert_eq!(names, expected);
        assert_eq!(scores.len(), 11);
        for key in keys {
            let hit = categories[key].as_bool().unwrap();
            let score = scores[key].as_f64().unwrap();
            assert_eq!(score, if hit { 0.9 } else { 0.01 }, "{key}");
        }
    }
    let flags = |i: usize| {
        (
            results[i]["flagged"].as_bool().unwrap(),
            results[i]["categories"]["violence"].as_bool().unwrap(),
            results[i]["categories"]["hate"].as_bool().unwrap(),
        )
    };
    assert_eq!(flags(0), (true, true, false));
    assert_eq!(flags(1), (true, false, true));
    assert_eq!(flags(2), (false, false, false));
    assert_eq!(flags(3), (true, true, false));

    let single = post_json(
        mock.addr(),
        "/moderations",
        &json!({"input": "fine", "model": "omni-moderation-latest"}),
    )
    .await
    .json();
    assert_eq!(single["model"], "omni-moderation-latest");
    assert_eq!(single["results"].as_array().unwrap().len(), 1);
    assert_eq!(single["results"][0]["flagged"], false);

    assert_openai_error(
        &post_json(mock.addr(), "/v1/moderations", &json!({"input": 3})).await,
        400,
    );
}

#[tokio::test]
async fn fine_tuning_jobs_paging() {
    let mock = MockProvider::start().await;
    let addr = mock.addr();
    let ids = |body: &Value| -> Vec<String> {
        body["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let expected = |range: std::ops::Range<usize>| -> Vec<String> {
        range.map(|i| format!("ftjob-mock-{i:03}")).collect()
    };

    let page = get(addr, "/v1/fine_tuning/jobs").await.json();
    assert_eq!(page["object"], "list");
    assert_eq!(ids(&page), expected(0..20));
    assert_eq!(page["has_more"], true);

    let page = get(addr, "/v1/fine_tuning/jobs?after=ftjob-mock-019")
        .await
        .json();
    assert_eq!(ids(&page), expected(20..25));
    assert_eq!(page["has_more"], false);

    let page = get(addr, "/v1/fine_tuning/jobs?limit=3&after=ftjob-mock-004")
        .await
        .json();
    assert_eq!(ids(&page), expected(5..8));
    assert_eq!(page["has_more"], true);

    let page = get(addr, "/fine_tuning/jobs?after=ftjob-unknown&limit=2")
        .await
        .json();
    assert_eq!(ids(&page), expected(0..2));

    let page = get(addr, "/v1/fine_tuning/jobs?after=ftjob-mock-024")
        .await
        .json();
    assert!(ids(&page).is_empty());
    assert_eq!(page["has_more"], false);

    // Walking with `after` visits every job once.
    let mut seen = Vec::new();
    let mut after = String::new();
    loop {
        let path = if after.is_empty() {
            "/v1/fine_tuning/jobs?limit=7".to_owned()
        } else {
            format!("/v1/fine_tuning/jobs?limit=7&after={after}")
        };
        let page = get(addr, &path).await.json();
        let page_ids = ids(&page);
        after = page_ids.last().cloned().unwrap_or_default();
        seen.extend(page_ids);
        if page["has_more"] == false {
            break;
        }
    }
    assert_eq!(seen, expected(0..25));

    // Job objects look like OpenAI's.
    let page = get(addr, "/v1/fine_tuning/jobs?limit=25").await.json();
    let jobs = page["data"].as_array().unwrap();
    let statuses: std::collections::BTreeSet<&str> =
        jobs.iter().map(|j| j["status"].as_str().unwrap()).collect();
    assert_eq!(
        statuses.into_iter().collect::<Vec<_>>(),
        ["running", "succeeded", "validating_files"]
    );
    for job in jobs {
        assert_eq!(job["object"], "fine_tuning.job");
        for field in [
            "created_at",
            "error",
            "fine_tuned_model",
            "finished_at",
            "hyperparameters",
            "model",
            "organization_id",
            "result_files",
            "status",
            "trained_tokens",
            "training_file",
            "validation_file",
            "seed",
            "integrations",
            "estimated_finish",
        ] {
            assert!(job.get(field).is_some(), "missing {field} in {job}");
        }
        let epochs = &job["hyperparameters"]["n_epochs"];
        assert!(epochs == "auto" || epochs.is_u64(), "{epochs}");
        let succeeded = job["status"] == "succeeded";
        assert_eq!(job["fine_tuned_model"].is_string(), succeeded);
        assert_eq!(job["finished_at"].is_u64(), succeeded);
    }

    for bad in ["limit=abc", "limit=-1", "limit=", "limit=1.5"] {
        let resp = get(addr, &format!("/v1/fine_tuning/jobs?{bad}")).await;
        let error = assert_openai_error(&resp, 400);
        assert_eq!(error["param"], "limit");
    }
}

#[tokio::test]
async fn echo_large_body_byte_for_byte() {
    let payload = noise(9 * 1024 * 1024);
    for record in [true, false] {
        let mock = MockProvider::start_with(MockOptions { record }).await;
        let resp = request(
            mock.addr(),
            "POST",
            "/v1/echo/some/thing?x=1&y=two",
            &[("content-type", "application/x-test")],
            &payload,
        )
        .await;
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.header("content-type"), Some("application/x-test"));
        assert_eq!(resp.header("x-mock-method"), Some("POST"));
        assert_eq!(
            resp.header("x-mock-path"),
            Some("/v1/echo/some/thing?x=1&y=two")
        );
        assert_eq!(
            resp.header("x-mock-body-len"),
            Some(payload.len().to_string().as_str())
        );
        assert_eq!(resp.header("x-mock-custom"), Some("yes"));
        assert_eq!(resp.body.len(), payload.len(), "record={record}");
        assert!(
            resp.body == payload,
            "echoed body differs (record={record})"
        );
        if record {
            let recorded = mock.requests();
            assert_eq!(recorded.len(), 1);
            assert!(recorded[0].body == payload);
        }
    }
}

#[tokio::test]
async fn echo_any_method() {
    let mock = MockProvider::start().await;
    for method in ["GET", "PUT", "DELETE", "PATCH", "POST"] {
        let resp = request(mock.addr(), method, "/echo", &[], b"abc").await;
        assert_eq!(resp.status(), 200, "{method}");
        assert_eq!(resp.body, b"abc");
        assert_eq!(
            resp.header("content-type"),
            Some("application/octet-stream")
        );
        assert_eq!(resp.header("x-mock-method"), Some(method));
        assert_eq!(resp.header("x-mock-path"), Some("/echo"));
    }
    let resp = get(mock.addr(), "/x-mock/delay_ms=0/v1/echo/").await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.header("x-mock-body-len"), Some("0"));
    assert_eq!(
        resp.header("x-mock-path"),
        Some("/x-mock/delay_ms=0/v1/echo/")
    );
    assert!(resp.body.is_empty());
    // `/echoes` is not the echo route.
    assert_eq!(get(mock.addr(), "/v1/echoes").await.status(), 404);
}

// ---------------------------------------------------------------------------
// Faults
// ---------------------------------------------------------------------------

#[tokio::test]
async fn status_fault_by_header_and_prefix_on_every_route() {
    let mock = MockProvider::start().await;
    let addr = mock.addr();

    let resp = post_json_with(
        addr,
        "/v1/chat/completions",
        &[("x-mock-status", "500")],
        &chat_body("x"),
    )
    .await;
    assert_eq!(resp.status(), 500);
    assert_eq!(
        resp.json(),
        json!({"error": {"message": "mock injected status 500", "type": "mock_error", "param": null, "code": "500"}})
    );
    assert_eq!(resp.header("retry-after-ms"), None);

    let routes: [(&str, &str); 6] = [
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/embeddings"),
        ("POST", "/v1/moderations"),
        ("GET", "/v1/fine_tuning/jobs"),
        ("GET", "/v1/models"),
        ("POST", "/v1/echo"),
    ];
    for (method, path) in routes {
        let resp = request(
            addr,
            method,
            &format!("/x-mock/status=502{path}"),
            &[],
            b"{}",
        )
        .await;
        assert_eq!(resp.status(), 502, "{method} {path}");
        assert_eq!(resp.json()["error"]["code"], "502");
        let resp = request(addr, method, path, &[("x-mock-status", "404")], b"{}").await;
        assert_eq!(resp.status(), 404, "{method} {path}");
        assert_eq!(resp.json()["error"]["type"], "mock_error");
    }

    // Headers override the prefix.
    let resp = request(
        addr,
        "GET",
        "/x-mock/status=500/v1/models",
        &[("x-mock-status", "418")],
        b"",
    )
    .await;
    assert_eq!(resp.status(), 418);

    // Retry hints for 429 and 503.
    let resp = request(addr, "GET", "/x-mock/status=429/v1/models", &[], b"").await;
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.header("retry-after-ms"), Some("10"));
    let resp = request(
        addr,
        "GET",
        "/v1/models",
        &[("x-mock-status", "503"), ("x-mock-retry-after-ms", "250")],
        b"",
    )
    .await;
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.header("retry-after-ms"), Some("250"));
    let resp = request(
        addr,
        "GET",
        "/x-mock/status=503;retry_after_ms=70/models",
        &[],
        b"",
    )
    .await;
    assert_eq!(resp.header("retry-after-ms"), Some("70"));

    // Faulted requests are still recorded.
    assert_eq!(mock.requests().len(), mock.request_count());
}

#[tokio::test]
async fn invalid_fault_values_are_400() {
    let mock = MockProvider::start().await;
    let addr = mock.addr();
    for headers in [
        [("x-mock-status", "abc")],
        [("x-mock-status", "99")],
        [("x-mock-delay-ms", "-1")],
        [("x-mock-words", "99999999999")],
    ] {
        assert_openai_error(
            &request(addr, "GET", "/v1/models", &headers, b"").await,
            400,
        );
    }
    for path in [
        "/x-mock/nope=1/v1/models",
        "/x-mock/status/v1/models",
        "/x-mock/delay_ms=x/v1/models",
    ] {
        let error = assert_openai_error(&get(addr, path).await, 400);
        assert_eq!(error["type"], "invalid_request_error");
    }
    // Unrelated x-mock-* headers are ignored; an empty prefix is fine.
    assert_eq!(
        request(addr, "GET", "/v1/models", &[("x-mock-other", "1")], b"")
            .await
            .status(),
        200
    );
    assert_eq!(get(addr, "/x-mock//v1/models").await.status(), 200);
    // Percent-encoded separators in the prefix work.
    assert_eq!(
        get(addr, "/x-mock/status%3D409/v1/models").await.status(),
        409
    );
}

#[tokio::test]
async fn delay_fault() {
    let mock = MockProvider::start().await;
    let addr = mock.addr();
    let start = Instant::now();
    let resp = post_json_with(
        addr,
        "/v1/chat/completions",
        &[("x-mock-delay-ms", "300")],
        &chat_body("slow"),
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert!(
        start.elapsed() >= Duration::from_millis(300),
        "{:?}",
        start.elapsed()
    );

    let start = Instant::now();
    let resp = get(addr, "/x-mock/delay_ms=200/v1/models").await;
    assert_eq!(resp.status(), 200);
    assert!(start.elapsed() >= Duration::from_millis(200));

    // Delay applies before an injected status too.
    let start = Instant::now();
    let resp = get(addr, "/x-mock/delay_ms=150;status=500/v1/models").await;
    assert_eq!(resp.status(), 500);
    assert!(start.elapsed() >= Duration::from_millis(150));
}

#[tokio::test]
async fn delay_is_before_the_response_head() {
    let mock = MockProvider::start().await;
    let mut conn = Conn::connect(mock.addr()).await;
    let body = {
        let mut b = chat_body("x");
        b["stream"] = json!(true);
        b.to_string()
    };
    let start = Instant::now();
    conn.send(
        "POST",
        "/x-mock/delay_ms=250/v1/chat/completions",
        &[],
        body.as_bytes(),
    )
    .await
    .unwrap();
    let head = conn.read_head().await.unwrap();
    assert_eq!(head.status, 200);
    assert!(start.elapsed() >= Duration::from_millis(250));
}

#[tokio::test]
async fn chunk_delay_paces_the_stream() {
    let mock = MockProvider::start().await;
    let mut conn = Conn::connect(mock.addr()).await;
    let mut body = chat_body("ignored");
    body["stream"] = json!(true);
    let body = body.to_string();
    let start = Instant::now();
    conn.send(
        "POST",
        "/v1/chat/completions",
        &[("x-mock-chunk-delay-ms", "100"), ("x-mock-words", "4")],
        body.as_bytes(),
    )
    .await
    .unwrap();
    let head = conn.read_head().await.unwrap();
    assert_eq!(head.status, 200);
    let mut arrivals = Vec::new();
    let mut data = Vec::new();
    while let Some(chunk) = tokio::time::timeout(IO_TIMEOUT, conn.next_chunk())
        .await
        .unwrap()
        .unwrap()
    {
        arrivals.push(start.elapsed());
        data.extend_from_slice(&chunk);
    }
    // role + 4 words + finish + [DONE] = 7 events, 6 gaps of 100 ms.
    let events = sse_data(&data);
    assert_eq!(events.len(), 7);
    let total = *arrivals.last().unwrap();
    assert!(total >= Duration::from_millis(600), "{arrivals:?}");
    // Events really arrive spread out, not in one burst at the end.
    assert!(
        arrivals[3] - arrivals[0] >= Duration::from_millis(150),
        "{arrivals:?}"
    );

    let chunks = sse_chunks(&data);
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "w1 w2 w3 w4");

    // The same via the prefix on a fresh connection.
    let start = Instant::now();
    let resp = request(
        mock.addr(),
        "POST",
        "/x-mock/chunk_delay_ms=50;words=2/v1/chat/completions",
        &[],
        body.as_bytes(),
    )
    .await;
    assert_eq!(sse_data(&resp.body).len(), 5);
    assert!(start.elapsed() >= Duration::from_millis(200));
}

#[tokio::test]
async fn words_fault() {
    let mock = MockProvider::start().await;
    let addr = mock.addr();
    let resp = post_json_with(
        addr,
        "/v1/chat/completions",
        &[("x-mock-words", "50")],
        &chat_body("x"),
    )
    .await
    .json();
    let content = resp["choices"][0]["message"]["content"].as_str().unwrap();
    let expected: Vec<String> = (1..=50).map(|i| format!("w{i}")).collect();
    assert_eq!(content, expected.join(" "));
    assert_eq!(resp["usage"]["completion_tokens"], 50);

    let mut body = chat_body("x");
    body["stream"] = json!(true);
    let resp = post_json(addr, "/x-mock/words=2000/v1/chat/completions", &body).await;
    let chunks = sse_chunks(&resp.body);
    assert_eq!(chunks.len(), 2000 + 2);
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text.split(' ').count(), 2000);
    assert!(text.ends_with("w1999 w2000"));

    // A reply too big to buffer is refused instead of exhausting memory.
    let mut body = chat_body("x");
    body["n"] = json!(128);
    let resp = post_json_with(
        addr,
        "/v1/chat/completions",
        &[("x-mock-words", "1000000")],
        &body,
    )
    .await;
    assert_openai_error(&resp, 400);

    // Zero words: an empty reply.
    let resp = post_json_with(
        addr,
        "/v1/chat/completions",
        &[("x-mock-words", "0")],
        &chat_body("x"),
    )
    .await
    .json();
    assert_eq!(resp["choices"][0]["message"]["content"], "");
    assert_eq!(resp["usage"]["completion_tokens"], 0);
}

#[tokio::test]
async fn disconnect_without_response_for_non_streams() {
    let mock = MockProvider::start().await;
    let addr = mock.addr();
    let cases: [(&str, &str, Headers<'_>); 3] = [
        (
            "POST",
            "/v1/chat/completions",
            &[("x-mock-disconnect-after", "0")],
        ),
        ("GET", "/x-mock/disconnect_after=0/v1/models", &[]),
        ("POST", "/x-mock/disconnect_after=5/v1/echo", &[]),
    ];
    for (method, path, headers) in cases {
        let mut conn = Conn::connect(addr).await;
        let result = conn
            .request(method, path, headers, chat_body("x").to_string().as_bytes())
            .await;
        let err = result.expect_err("no response expected");
        assert!(
            matches!(
                err.kind(),
                io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset
            ),
            "{method} {path}: {err}"
        );
    }
    // The mock is still fine afterwards, and recorded the aborted requests.
    assert_eq!(get(addr, "/v1/models").await.status(), 200);
    assert_eq!(mock.requests().len(), 4);
}

#[tokio::test]
async fn disconnect_mid_stream() {
    let mock = MockProvider::start().await;
    for (n, path, headers) in [
        (
            3usize,
            "/v1/chat/completions",
            vec![("x-mock-disconnect-after", "3")],
        ),
        (
            0,
            "/v1/chat/completions",
            vec![("x-mock-disconnect-after", "0")],
        ),
        (
            5,
            "/x-mock/disconnect_after=5;words=20;chunk_delay_ms=5/v1/chat/completions",
            vec![],
        ),
    ] {
        let mut conn = Conn::connect(mock.addr()).await;
        let mut body = chat_body("a reply with plenty of words in it");
        body["stream"] = json!(true);
        conn.send("POST", path, &headers, body.to_string().as_bytes())
            .await
            .unwrap();
        let head = conn.read_head().await.unwrap();
        assert_eq!(head.status, 200);
        assert_eq!(head.header("content-type"), Some("text/event-stream"));
        let mut data = Vec::new();
        let end = loop {
            match tokio::time::timeout(IO_TIMEOUT, conn.next_chunk())
                .await
                .unwrap()
            {
                Ok(Some(chunk)) => data.extend_from_slice(&chunk),
                Ok(None) => panic!("stream ended cleanly; expected an abrupt close"),
                Err(err) => break err,
            }
        };
        assert!(
            matches!(
                end.kind(),
                io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset
            ),
            "{end}"
        );
        let events = if data.is_empty() {
            Vec::new()
        } else {
            sse_data(&data)
        };
        assert_eq!(events.len(), n, "{path}");
        assert!(!events.iter().any(|e| e == "[DONE]"));
        for event in &events {
            let chunk: Value = serde_json::from_str(event).unwrap();
            assert_eq!(chunk["object"], "chat.completion.chunk");
        }
    }
}

#[tokio::test]
async fn fail_first_then_succeed() {
    let mock = MockProvider::start().await;
    let addr = mock.addr();
    let chat = "/x-mock/fail_first=2/v1/chat/completions";
    let statuses: Vec<u16> = {
        let mut out = Vec::new();
        for _ in 0..4 {
            out.push(post_json(addr, chat, &chat_body("retry me")).await.status());
        }
        out
    };
    assert_eq!(statuses, [503, 503, 200, 200]);

    // Counters are per spec and per route.
    assert_eq!(
        get(addr, "/x-mock/fail_first=2/v1/models").await.status(),
        503
    );
    let resp = get(addr, "/x-mock/fail_first=1;status=500/v1/models").await;
    assert_eq!(resp.status(), 500);
    assert_eq!(resp.json()["error"]["code"], "500");
    assert_eq!(
        get(addr, "/x-mock/fail_first=1;status=500/v1/models")
            .await
            .status(),
        200
    );
    assert_eq!(
        get(addr, "/x-mock/fail_first=2/v1/models").await.status(),
        503
    );
    assert_eq!(
        get(addr, "/x-mock/fail_first=2/v1/models").await.status(),
        200
    );

    // Injected 503s carry the retry hint.
    let resp = get(
        addr,
        "/x-mock/fail_first=1;retry_after_ms=5/v1/fine_tuning/jobs",
    )
    .await;
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.header("retry-after-ms"), Some("5"));

    // The header form.
    let headers = [("x-mock-fail-first", "1"), ("x-mock-status", "429")];
    assert_eq!(
        request(addr, "GET", "/v1/models", &headers, b"")
            .await
            .status(),
        429
    );
    assert_eq!(
        request(addr, "GET", "/v1/models", &headers, b"")
            .await
            .status(),
        200
    );

    // Failing by disconnect, then answering.
    let path = "/x-mock/fail_first=1;disconnect_after=0/v1/embeddings";
    let body = json!({"input": "x"}).to_string();
    let mut conn = Conn::connect(addr).await;
    assert!(conn
        .request("POST", path, &[], body.as_bytes())
        .await
        .is_err());
    let resp = request(addr, "POST", path, &[], body.as_bytes()).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.json()["object"], "list");

    // A separate mock has its own counters.
    let other = MockProvider::start().await;
    assert_eq!(
        post_json(other.addr(), chat, &chat_body("again"))
            .await
            .status(),
        503
    );
}

#[tokio::test]
async fn oversized_bodies_are_413() {
    let mock = MockProvider::start().await;
    let body = vec![b' '; 65 * 1024 * 1024];
    let resp = request(mock.addr(), "POST", "/v1/chat/completions", &[], &body).await;
    assert_openai_error(&resp, 413);
}
