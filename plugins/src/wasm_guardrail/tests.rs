//! The host against a component written by hand (`guardrails/wat/scripted.wat`), whose config
//! picks its behaviour: verdicts, and each way a guest can misbehave.

use std::path::PathBuf;
use std::time::Instant;

use http::Method;
use plugin_sdk::llm::LlmRequest;
use plugin_sdk::plugin::ResponseParts;

use super::*;

fn scripted_path() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/guardrails/wat/scripted.wat"
    ))
}

/// The export of `check-request` in the scripted component, removed to make a component that
/// lacks it.
const CHECK_REQUEST_EXPORT: &str = r#"(export "check-request" (func $check-request)
      (func (param "request" $request) (result $verdict)))"#;

fn config(mode: &str, extra: Value) -> WasmGuardrailConfig {
    let mut value = json!({
        "id": "scripted",
        "path": scripted_path(),
        "config": mode,
    });
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        value[k] = v;
    }
    serde_json::from_value(value).expect("a valid config")
}

fn loaded(mode: &str, extra: Value) -> Loaded {
    load(&config(mode, extra)).unwrap_or_else(|e| panic!("{}: {}", e.path, e.message))
}

fn request(texts: &[(&str, &str)]) -> Request {
    Request {
        api: abi::Api::ChatCompletions,
        model: Some("m".into()),
        messages: texts
            .iter()
            .map(|(role, content)| Message {
                role: (*role).into(),
                content: (*content).into(),
                ..Message::default()
            })
            .collect(),
        tools: vec!["get_weather".into()],
    }
}

fn text_answer(text: &str) -> Answer {
    Answer {
        text: text.into(),
        ..Answer::default()
    }
}

fn chat_cx(body: Value) -> RequestCx {
    let mut cx = RequestCx::new(
        "trace".into(),
        Route::ChatCompletions,
        Method::POST,
        "/v1/chat/completions".into(),
    );
    cx.body = Bytes::from(body.to_string());
    cx.request = LlmRequest::decode(cx.route, &cx.body).expect("a valid request");
    cx
}

fn plugin(mode: &str, extra: Value) -> WasmGuardrail {
    WasmGuardrail::new(config(mode, extra)).unwrap_or_else(|e| panic!("{}", e.message))
}

#[test]
fn verdicts_come_back_typed() {
    let req = request(&[("system", "be brief"), ("user", "hello")]);
    assert!(matches!(
        check_request(&loaded("allow", json!({})), &req),
        Ok(RequestDecision::Allow)
    ));
    match check_request(&loaded("deny", json!({})), &req) {
        Ok(RequestDecision::Deny(reason)) => assert_eq!(reason, "denied by the scripted guardrail"),
        other => panic!("{other:?}"),
    }
    match check_request(&loaded("rewrite", json!({})), &req) {
        Ok(RequestDecision::Rewrite(messages)) => {
            assert_eq!(messages.len(), 2);
            assert_eq!(messages[0].role, "system");
            assert!(messages.iter().all(|m| m.content == "[redacted]"));
        }
        other => panic!("{other:?}"),
    }
    let texts = vec![(0, text_answer("one")), (1, text_answer("two"))];
    match check_response(&loaded("rewrite", json!({})), &req, &texts) {
        Ok(ResponseDecision::Rewrite(r)) => {
            assert_eq!(r, vec![(0, "[redacted]".into()), (1, "[redacted]".into())])
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn misbehaviour_becomes_a_typed_error() {
    let req = request(&[("user", "hello")]);
    match check_request(&loaded("trap", json!({})), &req) {
        Err(CallError::Trap(m)) => assert!(m.contains("unreachable"), "{m}"),
        other => panic!("{other:?}"),
    }
    let started = Instant::now();
    let result = check_request(&loaded("loop", json!({"timeout_ms": 20})), &req);
    assert_eq!(result.unwrap_err(), CallError::Timeout(20));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let result = check_request(&loaded("memory", json!({"memory_limit_mb": 2})), &req);
    assert_eq!(result.unwrap_err(), CallError::Memory(2));
    match check_request(&loaded("bad", json!({})), &req) {
        Err(CallError::BadVerdict(m)) => assert!(m.contains("rewrite-text"), "{m}"),
        other => panic!("{other:?}"),
    }
    match check_response(&loaded("bad", json!({})), &req, &[(0, text_answer("x"))]) {
        Err(CallError::BadVerdict(m)) => assert!(m.contains("rewrite-messages"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_rewrite_must_keep_the_messages() {
    let req = request(&[("user", "a"), ("assistant", "b")]);
    let same_shape = request(&[("user", "x"), ("assistant", "y")]).messages;
    assert!(matches!(
        fit_rewrite(same_shape, &req),
        Ok(RequestDecision::Rewrite(m)) if m[1].content == "y"
    ));
    let fewer = request(&[("user", "x")]).messages;
    assert!(matches!(
        fit_rewrite(fewer, &req),
        Err(CallError::BadVerdict(_))
    ));
    let roles_swapped = request(&[("assistant", "x"), ("user", "y")]).messages;
    assert!(matches!(
        fit_rewrite(roles_swapped, &req),
        Err(CallError::BadVerdict(m)) if m.contains("2 messages")
    ));
}

#[test]
fn load_errors_name_the_field() {
    let issue = load(&config("init", json!({})))
        .err()
        .expect("init refuses");
    assert_eq!(issue.path, "config");
    assert!(issue.message.contains("bad config"), "{}", issue.message);

    let mut missing = config("allow", json!({}));
    missing.path = PathBuf::from("/nonexistent/guardrail.wasm");
    let issue = load(&missing).err().expect("no file");
    assert_eq!(issue.path, "path");
    assert!(issue.message.contains("cannot read"), "{}", issue.message);

    let dir = std::env::temp_dir().join(format!("gw-wasm-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = std::fs::read_to_string(scripted_path()).unwrap();
    assert!(text.contains(CHECK_REQUEST_EXPORT));
    let lacking = dir.join("lacking.wat");
    std::fs::write(&lacking, text.replace(CHECK_REQUEST_EXPORT, "")).unwrap();
    let mut cfg = config("allow", json!({}));
    cfg.path = lacking;
    let issue = load(&cfg).err().expect("a missing export");
    assert_eq!(issue.path, "path");
    assert!(issue.message.contains("check-request"), "{}", issue.message);

    let core = dir.join("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0").unwrap();
    cfg.path = core;
    let issue = load(&cfg).err().expect("a core module");
    assert!(
        issue.message.contains("not a component"),
        "{}",
        issue.message
    );

    let junk = dir.join("junk.wasm");
    std::fs::write(&junk, b"not wasm at all").unwrap();
    cfg.path = junk;
    let issue = load(&cfg).err().expect("junk");
    assert!(
        issue.message.contains("not a valid component"),
        "{}",
        issue.message
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_reload_swaps_in_the_changed_file() {
    let dir = std::env::temp_dir().join(format!("gw-wasm-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("g.wat");
    let text = std::fs::read_to_string(scripted_path()).unwrap();
    std::fs::write(&path, &text).unwrap();
    let mut cfg = config("deny", json!({}));
    cfg.path = path.clone();
    let p = WasmGuardrail::new(cfg).unwrap();
    let req = request(&[("user", "hi")]);
    assert!(matches!(
        check_request(&p.loaded.load(), &req),
        Ok(RequestDecision::Deny(_))
    ));
    // The new file denies with another reason; a broken file leaves the old one in place.
    let changed = text.replace(
        "denied by the scripted guardrail",
        "refused by the newest guardrail!",
    );
    std::fs::write(&path, &changed).unwrap();
    p.reload().unwrap();
    match check_request(&p.loaded.load(), &req) {
        Ok(RequestDecision::Deny(reason)) => assert_eq!(reason, "refused by the newest guardrail!"),
        other => panic!("{other:?}"),
    }
    std::fs::write(&path, "(component").unwrap();
    assert_eq!(p.reload().unwrap_err().path, "path");
    assert!(matches!(
        check_request(&p.loaded.load(), &req),
        Ok(RequestDecision::Deny(_))
    ));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn config_fields_are_checked() {
    let bad = config(
        "allow",
        json!({"id": "no spaces", "timeout_ms": 0, "memory_limit_mb": 1024}),
    );
    let paths: Vec<String> = check_fields(&bad).into_iter().map(|i| i.path).collect();
    assert_eq!(paths, ["id", "timeout_ms", "memory_limit_mb"]);
    let parsed: Result<WasmGuardrailConfig, _> =
        serde_json::from_value(json!({"id": "x", "path": "x.wasm", "grants": ["network"]}));
    assert!(parsed.unwrap_err().to_string().contains("network"));
    let parsed: Result<WasmGuardrailConfig, _> =
        serde_json::from_value(json!({"id": "x", "path": "x.wasm", "fuel": 3}));
    assert!(parsed.unwrap_err().to_string().contains("fuel"));
    let defaults = config("allow", json!({}));
    assert_eq!(defaults.side, Sides::Both);
    assert!(defaults.deny);
    assert_eq!(defaults.on_error, OnError::FailClosed);
    assert_eq!((defaults.timeout_ms, defaults.memory_limit_mb), (50, 16));
    assert!(defaults.grants.is_empty());
}

#[test]
fn guest_counters_are_bounded() {
    let shared = Shared::new("counting".into(), &[]);
    for i in 0..40 {
        shared.count(&format!("name{i}"), 1);
    }
    shared.count(&"x".repeat(65), 1);
    shared.count("name0", 2);
    assert_eq!(shared.counter_names(), runtime::MAX_COUNTERS);
}

#[test]
fn a_check_costs_microseconds() {
    let l = loaded("allow", json!({}));
    let req = request(&[("user", "hello")]);
    check_request(&l, &req).unwrap();
    let n = 200;
    let started = Instant::now();
    for _ in 0..n {
        check_request(&l, &req).unwrap();
    }
    let per_call = started.elapsed() / n;
    println!("fresh instance + init + check-request: {per_call:?} per call");
    let mut session = l.session().unwrap();
    let started = Instant::now();
    for _ in 0..n {
        session.arm();
        session.check_request(&req).unwrap();
    }
    println!(
        "check-request on a live instance: {:?} per call",
        started.elapsed() / n
    );
    assert!(per_call < Duration::from_millis(5), "{per_call:?}");

    // Another component, e.g. a built example: GW_WASM_COST_COMPONENT=target/guardrails/pii_redactor.wasm
    if let Some(path) = std::env::var_os("GW_WASM_COST_COMPONENT") {
        let mut cfg = config("allow", json!({"config": {}}));
        cfg.path = PathBuf::from(path);
        let l = load(&cfg).unwrap_or_else(|e| panic!("{}", e.message));
        let started = Instant::now();
        for _ in 0..n {
            check_request(&l, &req).unwrap();
        }
        println!(
            "{}: fresh instance + init + check-request: {:?} per call",
            cfg.path.display(),
            started.elapsed() / n
        );
    }
}

#[test]
fn messages_are_rewritten_in_place() {
    let mut cx = chat_cx(json!({
        "model": "m",
        "custom_field": 1,
        "messages": [
            {"role": "system", "content": "keep"},
            {"role": "user", "content": [
                {"type": "text", "text": "a@b.c"},
                {"type": "image_url", "image_url": {"url": "http://x/y.png"}},
                {"type": "text", "text": " more"}
            ]}
        ]
    }));
    let messages = vec![
        Message {
            role: "system".into(),
            content: "keep".into(),
            ..Message::default()
        },
        Message {
            role: "user".into(),
            content: "[email] more".into(),
            ..Message::default()
        },
    ];
    let before = subject::request(&cx).unwrap();
    assert!(subject::rewrite_request(&mut cx, &before, &messages).unwrap());
    let body: Value = serde_json::from_slice(&cx.body).unwrap();
    assert_eq!(body["custom_field"], 1);
    assert_eq!(body["messages"][0]["content"], "keep");
    let parts = body["messages"][1]["content"].as_array().unwrap();
    assert_eq!(parts.len(), 2);
    assert_eq!(parts[0]["text"], "[email] more");
    assert_eq!(parts[1]["type"], "image_url");
    let LlmRequest::Chat(chat) = &cx.request else {
        panic!()
    };
    assert_eq!(
        chat.messages[1].content.as_ref().unwrap().text(),
        "[email] more"
    );
    let after = subject::request(&cx).unwrap();
    assert!(!subject::rewrite_request(&mut cx, &after, &messages).unwrap());
}

#[tokio::test]
async fn the_plugin_refuses_rewrites_and_fails_as_configured() {
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hello"}]});

    let mut cx = chat_cx(body.clone());
    let Flow::Respond(r) = plugin("deny", json!({})).on_request(&mut cx).await.unwrap() else {
        panic!("a refusal")
    };
    assert_eq!(r.status.as_u16(), 446);
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    let check = &v["hook_results"]["before_request_hooks"][0]["checks"][0];
    assert_eq!(check["id"], "wasm.scripted");
    assert_eq!(check["data"]["reason"], "denied by the scripted guardrail");

    let mut cx = chat_cx(body.clone());
    let p = plugin("rewrite", json!({"side": "input"}));
    assert!(matches!(
        p.on_request(&mut cx).await.unwrap(),
        Flow::Continue
    ));
    let sent: Value = serde_json::from_slice(&cx.body).unwrap();
    assert_eq!(sent["messages"][0]["content"], "[redacted]");
    assert!(HookResults::of(&cx).before_request_hooks[0].transformed);

    // An error: closed refuses, open lets through with the error recorded.
    let mut cx = chat_cx(body.clone());
    let Flow::Respond(r) = plugin("trap", json!({})).on_request(&mut cx).await.unwrap() else {
        panic!("fail_closed refuses")
    };
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    let error = v["hook_results"]["before_request_hooks"][0]["checks"][0]["error"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(error.contains("trapped"), "{error}");
    let mut cx = chat_cx(body.clone());
    let p = plugin("trap", json!({"on_error": "fail_open"}));
    assert!(matches!(
        p.on_request(&mut cx).await.unwrap(),
        Flow::Continue
    ));
    let hook = &HookResults::of(&cx).before_request_hooks[0];
    assert!(hook.verdict && hook.checks[0].error.is_some());

    // A deny without `deny: true`: the answer goes out as 246 with the results.
    let mut cx = chat_cx(body);
    let p = plugin("deny", json!({"deny": false}));
    assert!(matches!(
        p.on_request(&mut cx).await.unwrap(),
        Flow::Continue
    ));
    let mut parts = ResponseParts {
        status: http::StatusCode::OK,
        headers: http::HeaderMap::new(),
        body: Bytes::from(
            json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}]})
                .to_string(),
        ),
    };
    assert!(matches!(
        p.on_response(&mut cx, &mut parts).await.unwrap(),
        Flow::Continue
    ));
    assert_eq!(parts.status.as_u16(), 246);
    let v: Value = serde_json::from_slice(&parts.body).unwrap();
    assert_eq!(
        v["hook_results"]["before_request_hooks"][0]["verdict"],
        false
    );
    assert_eq!(
        v["hook_results"]["after_request_hooks"][0]["verdict"],
        false
    );
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

fn delta(text: &str) -> Value {
    json!({"id": "c1", "object": "chat.completion.chunk", "model": "m",
           "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]})
}

#[test]
fn streams_are_checked_delta_by_delta() {
    let body =
        json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]});

    let p = plugin("rewrite", json!({}));
    let mut cx = chat_cx(body.clone());
    let mut chunk = sse(&[delta("secret"), delta("more")]);
    assert!(matches!(
        p.on_chunk(&mut cx, &mut chunk).unwrap(),
        Flow::Continue
    ));
    let text = String::from_utf8(chunk.data.to_vec()).unwrap();
    assert_eq!(text.matches("[redacted]").count(), 2, "{text}");
    assert!(!text.contains("secret"));
    let mut done = Chunk {
        data: Bytes::from_static(b"data: [DONE]\n\n"),
    };
    assert!(matches!(
        p.on_chunk(&mut cx, &mut done).unwrap(),
        Flow::Continue
    ));
    assert!(HookResults::of(&cx).after_request_hooks[0].transformed);

    let p = plugin("deny", json!({}));
    let mut cx = chat_cx(body.clone());
    let mut chunk = sse(&[delta("hello")]);
    let Flow::Respond(r) = p.on_chunk(&mut cx, &mut chunk).unwrap() else {
        panic!("the stream is stopped")
    };
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["error"]["type"], "hooks_failed");

    let p = plugin("loop", json!({"timeout_ms": 10, "on_error": "fail_open"}));
    let mut cx = chat_cx(body);
    let mut chunk = sse(&[delta("hello")]);
    assert!(matches!(
        p.on_chunk(&mut cx, &mut chunk).unwrap(),
        Flow::Continue
    ));
    let hook = &HookResults::of(&cx).after_request_hooks[0];
    assert!(hook.checks[0]
        .error
        .as_deref()
        .unwrap()
        .contains("deadline"));
    // After a fail-open error the rest of the stream passes unchecked.
    let mut chunk = sse(&[delta("again")]);
    let started = Instant::now();
    assert!(matches!(
        p.on_chunk(&mut cx, &mut chunk).unwrap(),
        Flow::Continue
    ));
    assert!(started.elapsed() < Duration::from_millis(10));
}

#[test]
fn events_are_split_and_read() {
    assert_eq!(stream::event_data("data: {\"a\":1}\n\n"), "{\"a\":1}");
    assert_eq!(stream::event_data("event: x\ndata:[DONE]\n\n"), "[DONE]");
}
