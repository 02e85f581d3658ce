//! Server-sent event streams: relayed as they arrive, whole, and cancelled with the client.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::common::{hello, Env};

/// The `data:` payloads of an SSE body.
fn events(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_is_relayed_event_by_event_and_ends_with_done() {
    let env = Env::start().await;
    let mut body = hello("stream me please");
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let resp = env.chat(body).await;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    assert_eq!(resp.headers()["x-gw-provider"], "openai");
    let text = resp.text().await.unwrap();
    let events = events(&text);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let mut content = String::new();
    let mut usage = None;
    for e in &events[..events.len() - 1] {
        let chunk: Value = serde_json::from_str(e).unwrap();
        assert_eq!(chunk["object"], "chat.completion.chunk");
        if let Some(c) = chunk["choices"][0]["delta"]["content"].as_str() {
            content.push_str(c);
        }
        if chunk["usage"].is_object() {
            usage = Some(chunk["usage"].clone());
        }
    }
    assert_eq!(content, "mock reply to: stream me please");
    let usage = usage.expect("a usage chunk");
    // The gateway read the usage out of the stream for its metrics.
    let metrics = env.metrics().await;
    let out_line = metrics
        .lines()
        .find(|l| l.starts_with("gw_tokens_total") && l.contains("direction=\"out\""))
        .unwrap_or_else(|| panic!("no token metric in\n{metrics}"));
    assert!(
        out_line.ends_with(&format!(" {}", usage["completion_tokens"])),
        "{out_line} vs {usage}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_chunk_arrives_before_the_provider_finishes() {
    let env = Env::start().await;
    let mut body = hello("x");
    body["stream"] = json!(true);
    let resp = env
        .post("/v1/chat/completions")
        .header("x-mock-words", "6")
        .header("x-mock-chunk-delay-ms", "150")
        .header("x-gw-forward-headers", "x-mock-words,x-mock-chunk-delay-ms")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream();
    let mut arrivals = Vec::new();
    let mut all = Vec::new();
    while let Some(piece) = stream.next().await {
        arrivals.push(Instant::now());
        all.extend_from_slice(&piece.unwrap());
    }
    // The mock sleeps 150 ms between events (at least 8 events): a buffering gateway would
    // deliver everything at once at the end.
    let first = arrivals[0];
    let last = *arrivals.last().unwrap();
    assert!(
        arrivals.len() >= 5,
        "only {} pieces arrived",
        arrivals.len()
    );
    assert!(
        last - first >= Duration::from_millis(600),
        "first and last pieces arrived {:?} apart",
        last - first
    );
    let text = String::from_utf8(all).unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_cancels_the_upstream_call() {
    let env = Env::start().await;
    let mut body = hello("x");
    body["stream"] = json!(true);
    let resp = env
        .post("/v1/chat/completions")
        .header("x-mock-words", "100")
        .header("x-mock-chunk-delay-ms", "100")
        .header("x-gw-forward-headers", "x-mock-words,x-mock-chunk-delay-ms")
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut stream = resp.bytes_stream();
    stream.next().await.unwrap().unwrap();
    let in_flight = |m: &str| {
        m.lines()
            .find(|l| l.starts_with("gw_requests_in_flight "))
            .map(|l| l.trim_start_matches("gw_requests_in_flight ").to_owned())
    };
    assert_eq!(in_flight(&env.metrics().await).as_deref(), Some("1"));
    drop(stream);
    // The full stream would take 10 s; the gateway lets go as soon as the client is gone.
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        if in_flight(&env.metrics().await).as_deref() == Some("0") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the request stayed in flight after the client left"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_drops_mid_stream_ends_the_stream_with_an_error_event() {
    let env = Env::start().await;
    let mut body = hello("one two three four five");
    body["stream"] = json!(true);
    let resp = env
        .post("/v1/chat/completions")
        .header("x-mock-disconnect-after", "2")
        .header("x-gw-forward-headers", "x-mock-disconnect-after")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    let events = events(&text);
    assert!(events.len() >= 3, "{text}");
    let last: Value = serde_json::from_str(events.last().unwrap()).unwrap();
    assert!(last["error"]["message"].is_string(), "{text}");
    assert!(!text.contains("[DONE]"));
}
