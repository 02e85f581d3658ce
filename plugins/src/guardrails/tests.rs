//! Unit tests of the plugin's phases, driven with a hand-made request context.

use std::sync::Arc;

use http::{HeaderMap, Method, StatusCode};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use plugin_sdk::{PluginDescriptor, Target};

use super::*;

fn build(config: Value) -> (Arc<dyn Plugin>, prometheus::Registry) {
    let cx = BuildCx::standalone();
    let registry = cx.metrics.clone();
    let plugin = PluginDescriptor::find("guardrails")
        .expect("registered")
        .build(&config, &cx)
        .unwrap_or_else(|e| panic!("{e:?}"));
    (plugin, registry)
}

fn chat(content: &str) -> RequestCx {
    let mut cx = RequestCx::new(
        "t".into(),
        Route::ChatCompletions,
        Method::POST,
        "/v1/chat/completions".into(),
    );
    let body = json!({"model": "m", "messages": [
        {"role": "system", "content": "mail me at boss@corp.example"},
        {"role": "user", "content": content}
    ]});
    cx.body = Bytes::from(body.to_string());
    cx.request = LlmRequest::decode(cx.route, &cx.body).unwrap();
    cx.plan = Some(RoutePlan::Single(Target::default()));
    cx
}

fn answer(content: &str) -> ResponseParts {
    ResponseParts {
        status: StatusCode::OK,
        headers: HeaderMap::new(),
        body: Bytes::from(
            json!({"object": "chat.completion", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
            ]})
            .to_string(),
        ),
    }
}

fn body_of(r: &plugin_sdk::PluginResponse) -> Value {
    serde_json::from_slice(&r.body).unwrap()
}

fn issues(config: Value) -> Vec<String> {
    PluginDescriptor::find("guardrails")
        .unwrap()
        .check(&config)
        .unwrap_err()
        .into_iter()
        .map(|i| i.path)
        .collect()
}

#[test]
fn yaml_hooks_are_validated_with_their_paths() {
    assert_eq!(
        issues(json!({"before_request_hooks": [{"checks": [
            {"id": "default.contains", "parameters": {"words": ["a"]}},
            {"id": "default.regexMatch", "parameters": {"rule": "(("}}
        ]}]})),
        vec!["before_request_hooks[0].checks[1].parameters.rule"]
    );
    assert_eq!(
        issues(json!({"output_guardrails": [{"checks": [{"id": "default.what"}]}]})),
        vec!["output_guardrails[0].checks[0].id"]
    );
    assert_eq!(
        issues(json!({"after_request_hooks": [{"deny": "yes", "checks": []}]})),
        vec!["after_request_hooks[0].deny"]
    );
    assert_eq!(
        issues(
            json!({"input_guardrails": [], "before_request_hooks": [], "stream_check_bytes": 0})
        ),
        vec!["stream_check_bytes", "input_guardrails"]
    );
    assert_eq!(issues(json!({"hooks": []})), vec!["hooks"]);
    assert!(PluginDescriptor::find("guardrails")
        .unwrap()
        .check(&json!({}))
        .is_ok());
}

#[tokio::test]
async fn a_failed_deny_hook_refuses_the_request_with_446() {
    let (plugin, registry) = build(json!({"before_request_hooks": [{
        "id": "no-secrets", "deny": true,
        "on_fail": {"feedback": {"value": -1, "weight": 1}},
        "checks": [{"id": "default.contains", "parameters": {"words": ["secret"], "operator": "none"}}]
    }]}));
    let mut cx = chat("tell me the secret");
    let Flow::Respond(r) = plugin.on_request(&mut cx).await.unwrap() else {
        panic!("refused")
    };
    assert_eq!(r.status.as_u16(), 446);
    let body = body_of(&r);
    assert_eq!(body["error"]["type"], "hooks_failed");
    let hook = &body["hook_results"]["before_request_hooks"][0];
    assert_eq!(hook["id"], "no-secrets");
    assert_eq!(hook["verdict"], false);
    assert_eq!(hook["action"]["feedback"]["value"], -1);
    assert_eq!(hook["checks"][0]["data"]["foundWords"], json!(["secret"]));

    let mut cx = chat("tell me a joke");
    assert!(matches!(
        plugin.on_request(&mut cx).await.unwrap(),
        Flow::Continue
    ));
    let text = prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .unwrap();
    assert!(
        text.contains(
            r#"gw_guardrail_checks_total{check="default.contains",side="input",verdict="fail"} 1"#
        ),
        "{text}"
    );
    assert!(text.contains(r#"gw_guardrail_hooks_total{outcome="deny",side="input"} 1"#));
    assert!(text.contains(r#"gw_guardrail_hooks_total{outcome="pass",side="input"} 1"#));
}

#[tokio::test]
async fn redaction_rewrites_the_body_and_the_decoded_request() {
    let (plugin, _) = build(json!({"input_guardrails": [{
        "type": "mutator",
        "checks": [{"id": "default.pii", "parameters": {"redact": true, "categories": ["EMAIL_ADDRESS"]}}]
    }]}));
    let mut cx = chat("write to jane@example.com please");
    assert!(matches!(
        plugin.on_request(&mut cx).await.unwrap(),
        Flow::Continue
    ));
    let body: Value = serde_json::from_slice(&cx.body).unwrap();
    assert_eq!(
        body["messages"][1]["content"],
        "write to [EMAIL_ADDRESS] please"
    );
    assert_eq!(body["messages"][0]["content"], "mail me at [EMAIL_ADDRESS]");
    let LlmRequest::Chat(chat) = &cx.request else {
        panic!()
    };
    assert_eq!(
        chat.messages[1].content.as_ref().unwrap().text(),
        "write to [EMAIL_ADDRESS] please"
    );
    let results = HookResults::of(&cx);
    let hook = &results.before_request_hooks[0];
    assert!(hook.verdict && hook.transformed);
    assert_eq!(hook.kind, "mutator");
}

#[tokio::test]
async fn output_hooks_warn_with_246_or_refuse_with_446() {
    let (plugin, _) = build(json!({"after_request_hooks": [
        {"id": "ends", "checks": [{"id": "default.endsWith", "parameters": {"suffix": "."}}]},
        {"id": "short", "deny": true, "checks": [{"id": "default.wordCount", "parameters": {"maxWords": 5}}]}
    ]}));
    let mut cx = chat("hi");
    plugin.on_request(&mut cx).await.unwrap();
    let mut parts = answer("no full stop");
    assert!(matches!(
        plugin.on_response(&mut cx, &mut parts).await.unwrap(),
        Flow::Continue
    ));
    assert_eq!(parts.status.as_u16(), 246);
    let body: Value = serde_json::from_slice(&parts.body).unwrap();
    assert_eq!(body["choices"][0]["message"]["content"], "no full stop");
    assert_eq!(
        body["hook_results"]["after_request_hooks"][0]["verdict"],
        false
    );
    assert_eq!(
        body["hook_results"]["after_request_hooks"][1]["verdict"],
        true
    );

    let mut cx = chat("hi");
    plugin.on_request(&mut cx).await.unwrap();
    let mut parts = answer("one two three four five six.");
    let Flow::Respond(r) = plugin.on_response(&mut cx, &mut parts).await.unwrap() else {
        panic!("refused")
    };
    assert_eq!(r.status.as_u16(), 446);
    assert_eq!(
        body_of(&r)["hook_results"]["after_request_hooks"][1]["id"],
        "short"
    );

    // All passed: 200 with the results.
    let mut cx = chat("hi");
    plugin.on_request(&mut cx).await.unwrap();
    let mut parts = answer("fine.");
    plugin.on_response(&mut cx, &mut parts).await.unwrap();
    assert_eq!(parts.status.as_u16(), 200);
    let body: Value = serde_json::from_slice(&parts.body).unwrap();
    assert_eq!(
        body["hook_results"]["after_request_hooks"][0]["verdict"],
        true
    );
}

#[tokio::test]
async fn default_hooks_from_another_plugin_run_after_the_pipeline_s() {
    let (plugin, _) = build(json!({}));
    let defaults = DefaultHooks::from_json(&json!({
        "before_request_hooks": [{"id": "ws-in", "deny": true, "checks": [
            {"id": "default.modelWhitelist", "parameters": {"models": ["allowed"]}}
        ]}],
        "after_request_hooks": [{"id": "ws-out", "checks": [
            {"id": "default.regexMatch", "parameters": {"rule": "^ok"}}
        ]}]
    }))
    .unwrap();
    let mut cx = chat("hi");
    cx.extensions.insert(defaults.clone());
    let Flow::Respond(r) = plugin.on_request(&mut cx).await.unwrap() else {
        panic!("model m is not allowed")
    };
    assert_eq!(
        body_of(&r)["hook_results"]["before_request_hooks"][0]["id"],
        "ws-in"
    );

    let mut allowed = defaults;
    allowed.before.clear();
    let mut cx = chat("hi");
    cx.extensions.insert(allowed);
    plugin.on_request(&mut cx).await.unwrap();
    let mut parts = answer("not ok");
    plugin.on_response(&mut cx, &mut parts).await.unwrap();
    assert_eq!(parts.status.as_u16(), 246);

    assert!(
        DefaultHooks::from_json(&json!({"before_request_hooks": [{"checks": [{"id": "x"}]}]}))
            .is_err()
    );
}

#[tokio::test]
async fn config_hooks_are_read_after_provider_selection() {
    let (plugin, _) = build(json!({}));
    let mut cx = chat("hello");
    cx.plan = Some(RoutePlan::Config(Arc::new(json!({
        "provider": "openai",
        "before_request_hooks": [{"checks": [
            {"id": "default.wordCount", "parameters": {"minWords": 1}},
            {"id": "default.regexMatch", "parameters": {"rule": "["}}
        ]}]
    }))));
    let e = plugin.on_request(&mut cx).await.unwrap_err();
    assert_eq!(e.status().as_u16(), 400);
    assert_eq!(
        e.param.as_deref(),
        Some("before_request_hooks[0].checks[1].parameters.rule")
    );

    // Placed before provider_select, the plugin cannot see the config: say so.
    let mut cx = chat("hello");
    cx.plan = None;
    cx.gw.config = Some("{}".into());
    let e = plugin.on_request(&mut cx).await.unwrap_err();
    assert!(e.message.contains("after provider_select"), "{}", e.message);
}

#[tokio::test]
async fn network_checks_from_requests_are_off_by_default() {
    let request_webhook = || {
        let mut cx = chat("hello");
        cx.plan = Some(RoutePlan::Config(Arc::new(json!({
            "before_request_hooks": [{"deny": true, "checks": [
                {"id": "default.webhook", "parameters": {"webhookURL": "http://127.0.0.1:9/"}}
            ]}]
        }))));
        cx
    };
    for config in [json!({}), json!({"request_network_checks": false})] {
        let (plugin, _) = build(config);
        let e = plugin.on_request(&mut request_webhook()).await.unwrap_err();
        assert_eq!(
            e.param.as_deref(),
            Some("before_request_hooks[0].checks[0].id")
        );
        assert!(
            e.message.contains("request_network_checks"),
            "{}",
            e.message
        );
    }
    // Turned on, the webhook a request names goes through the egress policy: a loopback host
    // the operator does not trust is refused before anything is sent, and the check fails.
    let (plugin, _) = build(json!({"request_network_checks": true}));
    let mut cx = request_webhook();
    let flow = plugin.on_request(&mut cx).await.unwrap();
    let Flow::Respond(answer) = flow else {
        panic!("a failed deny check answers")
    };
    assert_eq!(answer.status.as_u16(), 446);
    let body: Value = serde_json::from_slice(&answer.body).unwrap();
    let check = &body["hook_results"]["before_request_hooks"][0]["checks"][0];
    assert!(
        check["error"]
            .as_str()
            .unwrap_or_default()
            .contains("egress policy"),
        "{body}"
    );
    // A host name that resolves to loopback is refused by the client's resolver, and the
    // result says so.
    let mut cx = chat("hello");
    cx.plan = Some(RoutePlan::Config(Arc::new(json!({
        "before_request_hooks": [{"deny": true, "checks": [
            {"id": "default.webhook", "parameters": {"webhookURL": "http://localhost:9/"}}
        ]}]
    }))));
    let Flow::Respond(answer) = plugin.on_request(&mut cx).await.unwrap() else {
        panic!("a failed deny check answers")
    };
    let body: Value = serde_json::from_slice(&answer.body).unwrap();
    let error = body["hook_results"]["before_request_hooks"][0]["checks"][0]["error"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(error.contains("refused by the egress policy"), "{error}");
}

fn sse(events: &[Value]) -> Chunk {
    let mut data = String::new();
    for e in events {
        data.push_str(&format!("data: {e}\n\n"));
    }
    Chunk {
        data: Bytes::from(data),
    }
}

fn delta(content: &str) -> Value {
    json!({"object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": {"content": content}, "finish_reason": null}
    ]})
}

#[tokio::test]
async fn a_stream_is_stopped_early_when_a_maximum_is_exceeded() {
    let (plugin, _) = build(json!({
        "stream_check_bytes": 10,
        "after_request_hooks": [
            {"id": "max", "deny": true, "checks": [
                {"id": "default.wordCount", "parameters": {"maxWords": 4}},
                {"id": "default.endsWith", "parameters": {"suffix": "."}}
            ]}
        ]
    }));
    let mut cx = chat("hi");
    plugin.on_request(&mut cx).await.unwrap();
    let mut stopped = None;
    for (i, word) in ["one ", "two ", "three ", "four ", "five ", "six "]
        .iter()
        .enumerate()
    {
        let mut chunk = sse(&[delta(word)]);
        if let Flow::Respond(r) = plugin.on_chunk(&mut cx, &mut chunk).unwrap() {
            stopped = Some((i, r));
            break;
        }
    }
    let (at, r) = stopped.expect("the stream is stopped");
    assert_eq!(at, 4, "stopped at the fifth word, not at the end");
    let body = body_of(&r);
    assert_eq!(body["error"]["type"], "hooks_failed");
    let checks = &body["hook_results"]["after_request_hooks"][0]["checks"];
    assert_eq!(checks.as_array().unwrap().len(), 1, "{checks}");
    assert_eq!(checks[0]["id"], "default.wordCount");
    assert_eq!(checks[0]["data"]["partial"], true);
    // Once stopped, later events pass untouched.
    let mut chunk = sse(&[delta("seven ")]);
    assert!(matches!(
        plugin.on_chunk(&mut cx, &mut chunk).unwrap(),
        Flow::Continue
    ));
}

#[tokio::test]
async fn end_only_checks_run_when_the_stream_ends() {
    let (plugin, _) = build(json!({"after_request_hooks": [
        {"id": "end", "deny": true, "checks": [
            {"id": "default.endsWith", "parameters": {"suffix": "."}},
            {"id": "default.webhook", "parameters": {"webhookURL": "http://127.0.0.1:9/"}}
        ]},
        {"id": "warn", "checks": [{"id": "default.wordCount", "parameters": {"minWords": 50}}]}
    ]}));
    let mut cx = chat("hi");
    plugin.on_request(&mut cx).await.unwrap();
    let mut chunk = sse(&[delta("no "), delta("stop")]);
    assert!(matches!(
        plugin.on_chunk(&mut cx, &mut chunk).unwrap(),
        Flow::Continue
    ));
    let mut done = Chunk {
        data: Bytes::from_static(b"data: [DONE]\n\n"),
    };
    let Flow::Respond(r) = plugin.on_chunk(&mut cx, &mut done).unwrap() else {
        panic!("ends without a full stop")
    };
    let body = body_of(&r);
    let hooks = &body["hook_results"]["after_request_hooks"];
    assert_eq!(hooks[0]["checks"][0]["data"]["textEnd"], "no stop");
    assert_eq!(hooks[0]["checks"][1]["data"]["skipped"], true);
    assert_eq!(hooks[1]["checks"][0]["data"]["count"], 2);

    // A stream that passes is only recorded; an answer's finish_reason ends it.
    let mut cx = chat("hi");
    plugin.on_request(&mut cx).await.unwrap();
    let mut chunk = sse(&[
        delta("Done."),
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
    ]);
    assert!(matches!(
        plugin.on_chunk(&mut cx, &mut chunk).unwrap(),
        Flow::Continue
    ));
    let results = HookResults::of(&cx);
    assert!(results.after_request_hooks[0].verdict);
    assert!(!results.after_request_hooks[1].verdict);
}

#[test]
fn deltas_of_every_choice_and_tool_call_are_gathered() {
    let mut text = String::new();
    let mut choices = Vec::new();
    let chunk = sse(&[
        delta("a"),
        json!({"choices": [{"index": 1, "delta": {"content": "B"}}]}),
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": "{\"x\":"}}]}}]}),
        delta("b"),
    ]);
    assert!(!gather(&chunk.data, &mut text, &mut choices, 2));
    assert_eq!(text, "aB{\"x\":b");
    // One choice finishing does not end the answer while another goes on.
    let first_done =
        sse(&[json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})]);
    assert!(!gather(&first_done.data, &mut text, &mut choices, 2));
    let second_done =
        sse(&[json!({"choices": [{"index": 1, "delta": {}, "finish_reason": "stop"}]})]);
    assert!(gather(&second_done.data, &mut text, &mut choices, 2));
    // With n = 2, the first choice finishing before the second appears is not the end.
    let mut early = Vec::new();
    assert!(!gather(&first_done.data, &mut text, &mut early, 2));
    let mut fresh = Vec::new();
    assert!(gather(
        b"data: {\"choices\": []}\n\ndata: [DONE]\n\n",
        &mut text,
        &mut fresh,
        1
    ));
    assert!(!gather(
        b"data: not json\n\n: comment\n\n",
        &mut text,
        &mut Vec::new(),
        1
    ));
}

#[test]
fn anthropic_stream_text_and_tool_input_are_gathered() {
    let mut text = String::new();
    let events = concat!(
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi \"}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"q\\\":1}\"}}\n\n",
    );
    assert!(!gather_anthropic(events.as_bytes(), &mut text));
    assert_eq!(text, "Hi {\"q\":1}");
    assert!(gather_anthropic(
        b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        &mut text
    ));
}

/// A one-route HTTP server answering every POST with `answer`, after `delay_ms`; returns its
/// URL and a receiver of the bodies it got.
async fn webhook(
    status: u16,
    answer: &'static str,
    delay_ms: u64,
) -> (String, tokio::sync::mpsc::UnboundedReceiver<Value>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut piece = [0u8; 4096];
                loop {
                    let Ok(n) = socket.read(&mut piece).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&piece[..n]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let length = text[..end]
                            .lines()
                            .find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.eq_ignore_ascii_case("content-length")
                                    .then(|| v.trim().parse::<usize>().ok())?
                            })
                            .unwrap_or(0);
                        if buf.len() >= end + 4 + length {
                            let body = &buf[end + 4..end + 4 + length];
                            let _ = tx.send(serde_json::from_slice(body).unwrap_or(Value::Null));
                            break;
                        }
                    }
                }
                tokio::time::sleep(std::time::Duration::from_millis(delay_ms)).await;
                let reply = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
                    answer.len()
                );
                let _ = socket.write_all(reply.as_bytes()).await;
            });
        }
    });
    (format!("http://{addr}/hook"), rx)
}

async fn webhook_verdict(url: &str, timeout: Option<u64>) -> HookResult {
    let mut parameters = json!({"webhookURL": url, "headers": {"x-token": "t1"}});
    if let Some(t) = timeout {
        parameters["timeout"] = json!(t);
    }
    let (plugin, _) = build(json!({"before_request_hooks": [{"checks": [
        {"id": "default.webhook", "parameters": parameters}
    ]}]}));
    let mut cx = chat("check me");
    plugin.on_request(&mut cx).await.unwrap();
    HookResults::of(&cx).before_request_hooks.remove(0)
}

#[tokio::test]
async fn webhooks_decide_and_fail_closed() {
    let (url, mut seen) = webhook(200, r#"{"verdict": true, "data": {"score": 1}}"#, 0).await;
    let hook = webhook_verdict(&url, None).await;
    assert!(hook.verdict, "{:?}", hook.checks[0]);
    assert_eq!(hook.checks[0].data["responseData"]["score"], 1);
    let sent = seen.recv().await.unwrap();
    assert_eq!(sent["eventType"], "beforeRequestHook");
    // The checked text is every turn: the system prompt too.
    assert_eq!(
        sent["request"]["text"],
        "mail me at boss@corp.example\ncheck me"
    );
    assert_eq!(sent["request"]["json"]["model"], "m");

    let (url, _) = webhook(200, r#"{"verdict": false}"#, 0).await;
    let hook = webhook_verdict(&url, None).await;
    assert!(!hook.verdict && hook.checks[0].error.is_none());

    for (status, answer, delay, error) in [
        (500, r#"{"verdict": true}"#, 0, "status 500"),
        (200, r#"{"ok": true}"#, 0, "boolean `verdict`"),
        (
            200,
            r#"{"verdict": true}"#,
            2000,
            "did not answer within 100 ms",
        ),
    ] {
        let (url, _) = webhook(status, answer, delay).await;
        let hook = webhook_verdict(&url, Some(100)).await;
        assert!(!hook.verdict);
        let e = hook.checks[0].error.as_deref().unwrap();
        assert!(e.contains(error), "{e}");
    }
}

#[tokio::test]
async fn async_hooks_do_not_hold_or_refuse_the_request() {
    let (url, mut seen) = webhook(200, r#"{"verdict": false}"#, 0).await;
    let (plugin, registry) = build(
        json!({"before_request_hooks": [{"async": true, "deny": true, "checks": [
            {"id": "default.webhook", "parameters": {"webhookURL": url}}
        ]}]}),
    );
    let mut cx = chat("in the background");
    assert!(matches!(
        plugin.on_request(&mut cx).await.unwrap(),
        Flow::Continue
    ));
    assert!(HookResults::of(&cx).before_request_hooks.is_empty());
    let sent = tokio::time::timeout(std::time::Duration::from_secs(5), seen.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        sent["request"]["text"],
        "mail me at boss@corp.example\nin the background"
    );
    // Counted once it finished.
    for _ in 0..50 {
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .unwrap();
        if text.contains(r#"gw_guardrail_hooks_total{outcome="fail",side="input"} 1"#) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("the async hook was not counted");
}

/// An access store holding workspaces only, whose version the test moves.
#[derive(Default)]
struct Workspaces {
    list: std::sync::Mutex<Vec<Arc<plugin_sdk::access::WorkspaceRecord>>>,
    guardrails: std::sync::Mutex<Vec<Arc<plugin_sdk::access::SavedGuardrail>>>,
    version: std::sync::atomic::AtomicI64,
}

impl Workspaces {
    fn set(&self, id: &str, input: Vec<Value>, output: Vec<Value>) {
        let ws = plugin_sdk::access::WorkspaceRecord {
            id: id.into(),
            slug: id.into(),
            organisation_id: "org".into(),
            defaults: plugin_sdk::access::Defaults {
                input_guardrails: input,
                output_guardrails: output,
                ..Default::default()
            },
            rate_limits: Vec::new(),
            usage_limits: Vec::new(),
            counted: Vec::new(),
        };
        let mut list = self.list.lock().unwrap();
        list.retain(|w| w.id != id);
        list.push(Arc::new(ws));
        self.version
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Workspaces {
    /// Saves (or replaces) a guardrail of `workspace`, named `slug`.
    fn save(&self, workspace: &str, slug: &str, hook: Value) {
        let saved = plugin_sdk::access::SavedGuardrail {
            id: format!("id-{slug}"),
            slug: slug.into(),
            owner: plugin_sdk::store::Owner {
                organisation_id: "org".into(),
                workspace_id: workspace.into(),
            },
            hook,
        };
        let mut list = self.guardrails.lock().unwrap();
        list.retain(|g| g.slug != slug);
        list.push(Arc::new(saved));
        self.version
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl plugin_sdk::AccessStore for Workspaces {
    fn guardrail(&self, id_or_slug: &str) -> Option<Arc<plugin_sdk::access::SavedGuardrail>> {
        self.guardrails
            .lock()
            .unwrap()
            .iter()
            .find(|g| g.slug == id_or_slug || g.id == id_or_slug)
            .cloned()
    }
    fn api_key(&self, _: &[u8; 32]) -> Option<Arc<plugin_sdk::access::ApiKeyRecord>> {
        None
    }
    fn workspace(&self, id: &str) -> Option<Arc<plugin_sdk::access::WorkspaceRecord>> {
        self.list
            .lock()
            .unwrap()
            .iter()
            .find(|w| w.id == id)
            .cloned()
    }
    fn rate_limit_policies(&self) -> Arc<[plugin_sdk::access::RateLimitPolicy]> {
        Arc::from(Vec::new())
    }
    fn usage_limit_policies(&self) -> Arc<[plugin_sdk::access::UsageLimitPolicy]> {
        Arc::from(Vec::new())
    }
    fn version(&self) -> i64 {
        self.version.load(std::sync::atomic::Ordering::SeqCst)
    }
}

fn in_workspace(content: &str, workspace: Option<&str>) -> RequestCx {
    let mut cx = chat(content);
    cx.extensions.insert(plugin_sdk::Principal {
        method: plugin_sdk::access::AuthMethod::ApiKey(
            plugin_sdk::access::KeyKind::WorkspaceService,
        ),
        organisation_id: Some("org".into()),
        workspace_id: workspace.map(str::to_owned),
        api_key_id: Some("key".into()),
        user_id: None,
        scopes: Vec::new(),
        rate_limits: Vec::new(),
        budgets: Vec::new(),
    });
    cx
}

#[tokio::test]
async fn workspace_defaults_name_library_hooks_or_hold_their_own() {
    let store = Arc::new(Workspaces::default());
    let mut build_cx = BuildCx::standalone();
    build_cx.access = store.clone();
    let plugin = PluginDescriptor::find("guardrails")
        .unwrap()
        .build(
            &json!({"library": [{"id": "no-drop", "deny": true, "checks": [
                {"id": "default.regexMatch", "parameters": {"rule": "(?i)drop\\s+table", "not": true}}
            ]}]}),
            &build_cx,
        )
        .unwrap();
    store.set(
        "ws-a",
        vec![json!("no-drop")],
        vec![json!({"id": "polite", "checks": [{"id": "default.endsWith", "parameters": {"suffix": "!"}}]})],
    );

    // The workspace's library hook refuses; another workspace, and no workspace, pass.
    let mut cx = in_workspace("DROP TABLE users", Some("ws-a"));
    let Flow::Respond(r) = plugin.on_request(&mut cx).await.unwrap() else {
        panic!("the workspace's guardrail did not refuse");
    };
    assert_eq!(r.status.as_u16(), 446);
    assert_eq!(
        body_of(&r)["hook_results"]["before_request_hooks"][0]["id"],
        "no-drop"
    );
    for ws in [Some("ws-b"), None] {
        let mut cx = in_workspace("DROP TABLE users", ws);
        assert!(matches!(
            plugin.on_request(&mut cx).await.unwrap(),
            Flow::Continue
        ));
    }

    // Its inline output hook runs on the answer: it does not end with "!", a warning (246).
    let mut cx = in_workspace("hello", Some("ws-a"));
    assert!(matches!(
        plugin.on_request(&mut cx).await.unwrap(),
        Flow::Continue
    ));
    let mut parts = answer("fine.");
    plugin.on_response(&mut cx, &mut parts).await.unwrap();
    assert_eq!(parts.status.as_u16(), 246);

    // A change of the workspace applies at the next snapshot version.
    store.set("ws-a", Vec::new(), Vec::new());
    let mut cx = in_workspace("DROP TABLE users", Some("ws-a"));
    assert!(matches!(
        plugin.on_request(&mut cx).await.unwrap(),
        Flow::Continue
    ));

    // A guardrail the library lacks refuses the workspace's requests instead of skipping it.
    store.set("ws-a", vec![json!("nope")], Vec::new());
    let mut cx = in_workspace("hello", Some("ws-a"));
    let e = plugin.on_request(&mut cx).await.unwrap_err();
    assert_eq!(e.status().as_u16(), 500);
    assert!(e.message.contains("\"nope\""), "{}", e.message);
}

#[test]
fn library_hooks_need_unique_ids() {
    let found = issues(json!({"library": [
        {"checks": [{"id": "default.contains", "parameters": {"words": ["x"]}}]},
        {"id": "a", "checks": [{"id": "default.contains", "parameters": {"words": ["x"]}}]},
        {"id": "a", "checks": [{"id": "default.contains", "parameters": {"words": ["x"]}}]}
    ]}));
    assert!(
        found.iter().any(|i| i.starts_with("library[0].id")),
        "{found:?}"
    );
    assert!(
        found.iter().any(|i| i.starts_with("library[2].id")),
        "{found:?}"
    );
}

/// A plugin reading `store`, built from `config`.
fn with_store(config: Value, store: &Arc<Workspaces>) -> Arc<dyn Plugin> {
    let mut build_cx = BuildCx::standalone();
    build_cx.access = store.clone();
    PluginDescriptor::find("guardrails")
        .unwrap()
        .build(&config, &build_cx)
        .unwrap()
}

/// A request of `workspace` whose routing config names `hooks` as its input guardrails.
fn with_config(content: &str, workspace: Option<&str>, hooks: Value) -> RequestCx {
    let mut cx = in_workspace(content, workspace);
    cx.plan = Some(RoutePlan::Config(Arc::new(
        json!({"provider": "openai", "input_guardrails": hooks}),
    )));
    cx
}

fn no_drop(deny: bool) -> Value {
    json!({"deny": deny, "checks": [
        {"id": "default.regexMatch", "parameters": {"rule": "(?i)drop\\s+table", "not": true}}
    ]})
}

#[tokio::test]
async fn configs_name_the_saved_guardrails_their_caller_may_use() {
    let store = Arc::new(Workspaces::default());
    let plugin = with_store(json!({}), &store);
    store.save("ws-a", "pg-nodrop", no_drop(true));

    // Its own workspace's caller: by slug, by id, and as {id}.
    for named in [
        json!("pg-nodrop"),
        json!("id-pg-nodrop"),
        json!({"id": "pg-nodrop"}),
    ] {
        let mut cx = with_config("DROP TABLE users", Some("ws-a"), json!([named]));
        let Flow::Respond(r) = plugin.on_request(&mut cx).await.unwrap() else {
            panic!("the saved guardrail did not refuse");
        };
        assert_eq!(r.status.as_u16(), 446);
        assert_eq!(
            body_of(&r)["hook_results"]["before_request_hooks"][0]["id"],
            "pg-nodrop",
            "results name a saved guardrail by its slug"
        );
    }

    // Its organisation's admin key may name it too.
    let mut cx = with_config("DROP TABLE users", None, json!(["pg-nodrop"]));
    assert!(matches!(
        plugin.on_request(&mut cx).await.unwrap(),
        Flow::Respond(_)
    ));

    // Another workspace's caller, and a caller without a key, get the 400 of an unknown name.
    for anonymous in [false, true] {
        let mut cx = with_config("DROP TABLE users", Some("ws-b"), json!(["pg-nodrop"]));
        if anonymous {
            cx.extensions.remove::<plugin_sdk::Principal>();
        }
        let e = plugin.on_request(&mut cx).await.unwrap_err();
        assert_eq!(e.status().as_u16(), 400);
        assert_eq!(e.param.as_deref(), Some("input_guardrails[0]"));
        assert!(
            e.message.contains("no guardrail \"pg-nodrop\""),
            "{}",
            e.message
        );
    }

    // An update applies at the next snapshot version.
    store.save("ws-a", "pg-nodrop", no_drop(false));
    let mut cx = with_config("DROP TABLE users", Some("ws-a"), json!(["pg-nodrop"]));
    assert!(matches!(
        plugin.on_request(&mut cx).await.unwrap(),
        Flow::Continue
    ));
    assert!(
        !HookResults::of(&cx).before_request_hooks[0].verdict,
        "the check still fails; the new action only warns"
    );

    // A stored guardrail that cannot run refuses (fail closed), naming the problem.
    store.save(
        "ws-a",
        "pg-broken",
        json!({"checks": [{"id": "default.nope"}]}),
    );
    let mut cx = with_config("hello", Some("ws-a"), json!(["pg-broken"]));
    let e = plugin.on_request(&mut cx).await.unwrap_err();
    assert!(e.message.contains("cannot run"), "{}", e.message);
}

#[tokio::test]
async fn workspace_defaults_and_the_yaml_name_saved_guardrails() {
    let store = Arc::new(Workspaces::default());
    store.save("ws-a", "pg-nodrop", no_drop(true));
    store.set("ws-a", vec![json!("pg-nodrop")], Vec::new());
    // A workspace may not name another workspace's guardrail in its defaults.
    store.set("ws-b", vec![json!({"id": "pg-nodrop"})], Vec::new());
    let plugin = with_store(json!({}), &store);

    let mut cx = in_workspace("DROP TABLE users", Some("ws-a"));
    let Flow::Respond(r) = plugin.on_request(&mut cx).await.unwrap() else {
        panic!("the workspace's saved guardrail did not refuse");
    };
    assert_eq!(r.status.as_u16(), 446);
    let mut cx = in_workspace("hello", Some("ws-b"));
    let e = plugin.on_request(&mut cx).await.unwrap_err();
    assert_eq!(e.status().as_u16(), 500);
    assert!(e.message.contains("\"pg-nodrop\""), "{}", e.message);

    // The operator's YAML names any workspace's guardrail, for every request.
    let yaml = with_store(json!({"before_request_hooks": ["pg-nodrop"]}), &store);
    for ws in [Some("ws-c"), None] {
        let mut cx = in_workspace("DROP TABLE users", ws);
        let Flow::Respond(r) = yaml.on_request(&mut cx).await.unwrap() else {
            panic!("the pipeline's saved guardrail did not refuse");
        };
        assert_eq!(r.status.as_u16(), 446);
    }
    // A name the YAML gives that nothing holds refuses every request rather than skip it.
    let missing = with_store(json!({"after_request_hooks": ["pg-gone"]}), &store);
    let mut cx = in_workspace("hello", None);
    let e = missing.on_request(&mut cx).await.unwrap_err();
    assert_eq!(e.status().as_u16(), 500);
    assert!(e.message.contains("pg-gone"), "{}", e.message);
}
