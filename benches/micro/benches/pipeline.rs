//! The per-request cost of the gateway's own work, without network I/O:
//! header parsing and body validation, the default pipeline's phases, stream splitting and
//! answer summaries.

use std::time::Duration;

use bytes::Bytes;
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use http::{HeaderMap, HeaderValue, Method};

use gateway::config::{GatewayConfig, Overrides};
use gateway::providers::openai;
use gateway::sse::EventSplitter;
use gateway::Gateway;
use plugin_sdk::headers::GwHeaders;
use plugin_sdk::llm::LlmRequest;
use plugin_sdk::{RequestCx, Route, Usage};

fn chat_body() -> Bytes {
    let content = "The quick brown fox jumps over the lazy dog. ".repeat(20);
    Bytes::from(
        serde_json::json!({
            "model": "gpt-bench",
            "temperature": 0.7,
            "messages": [
                {"role": "system", "content": "You are a benchmark."},
                {"role": "user", "content": content}
            ]
        })
        .to_string(),
    )
}

fn headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("content-type", HeaderValue::from_static("application/json"));
    h.insert("x-gw-provider", HeaderValue::from_static("@mock"));
    h.insert(
        "x-gw-metadata",
        HeaderValue::from_static(r#"{"_user":"ann","team":"a"}"#),
    );
    h.insert("user-agent", HeaderValue::from_static("bench/1.0"));
    h
}

fn gateway() -> Gateway {
    // The pipeline this bench has always measured (the default before enforcement plugins
    // joined it), pinned so its numbers stay comparable over time; the default pipeline of
    // today, with auth, limits, cache and the log store, is measured in `plugins.rs`.
    let yaml = "providers:\n  - {slug: mock, provider: openai, api_key: k, custom_host: \"http://127.0.0.1:9/v1\"}\npipeline:\n  - kind: provider_select\n  - kind: request_log\n  - kind: metrics\n";
    // The control plane is started too: keep its database in memory.
    let overrides = Overrides {
        database_url: Some("sqlite::memory:".into()),
        ..Overrides::default()
    };
    let config = GatewayConfig::from_yaml(yaml, &overrides).expect("valid config");
    Gateway::new(config).expect("pipeline builds")
}

fn request_decoding(c: &mut Criterion) {
    let body = chat_body();
    let headers = headers();
    c.bench_function("headers + chat body decode and validate (1 KB)", |b| {
        b.iter(|| {
            let gw = GwHeaders::parse(black_box(&headers)).unwrap();
            let req = LlmRequest::decode(Route::ChatCompletions, black_box(&body)).unwrap();
            black_box((gw, req))
        })
    });
}

fn default_pipeline(c: &mut Criterion) {
    // The request line is formatted for real, into a sink, as a server would.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::sink)
        .with_env_filter("info")
        .try_init();
    let gw = gateway();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let body = chat_body();
    let headers = headers();
    c.bench_function(
        "default pipeline: on_request + on_log (provider_select, request_log, metrics)",
        |b| {
            b.iter(|| {
                let mut cx = RequestCx::new(
                    "trace".into(),
                    Route::ChatCompletions,
                    Method::POST,
                    "/v1/chat/completions".into(),
                );
                cx.headers = headers.clone();
                cx.gw = GwHeaders::parse(&cx.headers).unwrap();
                cx.body = body.clone();
                cx.request = LlmRequest::decode(Route::ChatCompletions, &cx.body).unwrap();
                rt.block_on(gw.pipeline.on_request(&mut cx)).unwrap();
                cx.response.status = Some(200);
                cx.response.provider = Some("openai".into());
                cx.response.usage = Some(Usage {
                    prompt_tokens: 190,
                    completion_tokens: 12,
                });
                cx.response.upstream_latency = Some(Duration::from_micros(300));
                gw.pipeline.on_log(&cx);
                black_box(cx)
            })
        },
    );
}

fn answers(c: &mut Criterion) {
    let answer = serde_json::json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-bench",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "word ".repeat(60)}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 190, "completion_tokens": 60, "total_tokens": 250}
    })
    .to_string();
    c.bench_function("usage summary of a chat answer", |b| {
        b.iter(|| black_box(openai::summarize_answer(black_box(answer.as_bytes()))))
    });
    let event = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"word \"},\"finish_reason\":null}]}\n\n";
    let stream = event.repeat(60);
    c.bench_function("SSE split of a 60-event stream in 1460-byte reads", |b| {
        b.iter(|| {
            let mut s = EventSplitter::default();
            let mut n = 0;
            for read in stream.as_bytes().chunks(1460) {
                n += s.push(read).len();
            }
            black_box(n)
        })
    });
}

criterion_group!(benches, request_decoding, default_pipeline, answers);
criterion_main!(benches);
