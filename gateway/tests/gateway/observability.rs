//! Trace ids, metadata, and the metrics endpoint.

use serde_json::json;

use crate::common::{hello, Env};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_ids_are_echoed_or_generated() {
    let env = Env::start().await;
    let resp = env
        .post("/v1/chat/completions")
        .header("x-gw-trace-id", "my-trace-42")
        .json(&hello("hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["x-gw-trace-id"], "my-trace-42");
    let resp = env
        .post("/v1/chat/completions")
        .header("x-portkey-trace-id", "pk-trace")
        .json(&hello("hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["x-gw-trace-id"], "pk-trace");
    let resp = env.chat(hello("hi")).await;
    let generated = resp.headers()["x-gw-trace-id"].to_str().unwrap().to_owned();
    let other = env.chat(hello("hi")).await.headers()["x-gw-trace-id"]
        .to_str()
        .unwrap()
        .to_owned();
    // Generated ids are time-ordered UUIDs: a later request's sorts after an earlier one's.
    for id in [&generated, &other] {
        let uuid = uuid::Uuid::parse_str(id).expect("a UUID trace id");
        assert_eq!(uuid.get_version_num(), 7, "{id}");
    }
    assert!(generated < other, "{generated} then {other}");
    // Errors carry the trace id too.
    let resp = env
        .gw_post("/v1/chat/completions")
        .header("x-gw-trace-id", "err-trace")
        .json(&hello("hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    assert_eq!(resp.headers()["x-gw-trace-id"], "err-trace");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_requests_latency_tokens_and_in_flight() {
    let env = Env::start().await;
    let body =
        json!({"model": "metrics-model", "messages": [{"role": "user", "content": "a b c"}]});
    for _ in 0..3 {
        assert_eq!(env.chat(body.clone()).await.status(), 200);
    }
    let resp = env
        .post("/v1/chat/completions")
        .header("x-mock-status", "503")
        .header("x-gw-forward-headers", "x-mock-status")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    let text = env.metrics().await;
    let line = |prefix: &str, needles: &[&str]| {
        text.lines()
            .find(|l| l.starts_with(prefix) && needles.iter().all(|n| l.contains(n)))
            .unwrap_or_else(|| panic!("no {prefix} {needles:?} in\n{text}"))
            .to_owned()
    };
    let ok = line(
        "gw_requests_total{",
        &[
            "route=\"chat.completions\"",
            "provider=\"openai\"",
            "model=\"metrics-model\"",
            "status_class=\"2xx\"",
        ],
    );
    assert!(ok.ends_with(" 3"), "{ok}");
    let failed = line(
        "gw_requests_total{",
        &["model=\"metrics-model\"", "status_class=\"5xx\""],
    );
    assert!(failed.ends_with(" 1"), "{failed}");
    let count = line(
        "gw_request_duration_seconds_count{",
        &["model=\"metrics-model\"", "status_class=\"2xx\""],
    );
    assert!(count.ends_with(" 3"), "{count}");
    line(
        "gw_upstream_duration_seconds_bucket{",
        &["provider=\"openai\""],
    );
    let tokens_in = line(
        "gw_tokens_total{",
        &["model=\"metrics-model\"", "direction=\"in\""],
    );
    // The mock counts 3 words per request as prompt tokens.
    assert!(tokens_in.ends_with(" 9"), "{tokens_in}");
    assert_eq!(
        line("gw_requests_in_flight", &[]),
        "gw_requests_in_flight 0"
    );
}
