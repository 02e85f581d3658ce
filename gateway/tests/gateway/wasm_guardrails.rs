//! Wasm guardrails (`kind: wasm_guardrail`) in the pipeline, with components built from this
//! repository: `scripts/build-guardrails` builds `plugins/guardrails/*` once per test run. On a
//! machine that cannot build them (offline, no wasm32-wasip2 target), the tests use the
//! hand-written component `plugins/guardrails/wat/scripted.wat` instead, and say so
//! (`GW_TEST_WASM_FALLBACK=1` forces that path).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use gateway::config::{GatewayConfig, Overrides};

use crate::common::{hello, Env};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

fn scripted() -> PathBuf {
    repo_root().join("plugins/guardrails/wat/scripted.wat")
}

/// The directory of the built example components, or `None` when they could not be built.
fn built() -> Option<&'static Path> {
    static BUILT: OnceLock<Option<PathBuf>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let root = repo_root();
            if std::env::var_os("GW_TEST_WASM_FALLBACK").is_some() {
                eprintln!("wasm_guardrails: GW_TEST_WASM_FALLBACK is set: using the scripted WAT component");
                return None;
            }
            let out = Command::new(root.join("scripts/build-guardrails"))
                .output()
                .map_err(|e| e.to_string())
                .and_then(|o| {
                    if o.status.success() {
                        Ok(())
                    } else {
                        Err(String::from_utf8_lossy(&o.stderr).into_owned())
                    }
                });
            match out {
                Ok(()) => Some(root.join("target/guardrails")),
                Err(e) => {
                    let tail: Vec<&str> = e.lines().rev().take(5).collect();
                    eprintln!(
                        "wasm_guardrails: the example guardrails could not be built, so these \
                         tests use the scripted WAT component instead ({})",
                        tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                    );
                    None
                }
            }
        })
        .as_deref()
}

/// A built example (`pii_redactor`...), or the scripted component in `mode`, with the config
/// each needs.
fn guardrail(example: &str, config: Value, fallback_mode: &str) -> (PathBuf, Value) {
    match built() {
        Some(dir) => (dir.join(format!("{example}.wasm")), config),
        None => (scripted(), json!(fallback_mode)),
    }
}

/// A pipeline with one wasm guardrail (`fields` are added to its entry).
fn yaml(id: &str, path: &Path, config: &Value, fields: &str) -> String {
    format!(
        "pipeline:\n  - kind: provider_select\n  - kind: wasm_guardrail\n    id: {id}\n    path: {path}\n    config: {config}\n{fields}  - kind: metrics\n",
        path = path.display(),
    )
}

fn field(lines: &[&str]) -> String {
    lines.iter().map(|l| format!("    {l}\n")).collect()
}

async fn start(id: &str, example: &str, config: Value, fallback: &str, fields: &[&str]) -> Env {
    let (path, config) = guardrail(example, config, fallback);
    Env::start_with(&yaml(id, &path, &config, &field(fields))).await
}

fn content(body: &Value) -> &str {
    body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
}

/// The first check result of a hook list (`before_request_hooks`...).
fn check<'a>(body: &'a Value, hooks: &str) -> &'a Value {
    &body["hook_results"][hooks][0]["checks"][0]
}

/// The `data:` payloads of an SSE body.
fn events(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(str::to_owned)
        .collect()
}

/// The text of a streamed answer, and the JSON of the last event.
fn streamed(text: &str) -> (String, Value) {
    let mut content = String::new();
    let mut last = Value::Null;
    for e in events(text) {
        let Ok(v) = serde_json::from_str::<Value>(&e) else {
            continue;
        };
        if let Some(c) = v["choices"][0]["delta"]["content"].as_str() {
            content.push_str(c);
        }
        last = v;
    }
    (content, last)
}

fn topics() -> Value {
    json!({"words": ["falcon", "secret plan"]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_request_and_answer_pass() {
    // Metrics are counted per process: each test that reads them has an id of its own.
    let env = start("allowing", "banned_topics", topics(), "allow", &[]).await;
    let resp = env.chat(hello("hello there")).await;
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(content(&body), "mock reply to: hello there");
    assert!(body.get("hook_results").is_none(), "{body}");
    assert_eq!(env.mock.request_count(), 1);
    let metrics = env.metrics().await;
    assert!(
        metrics.contains("gw_wasm_guardrail_calls_total{outcome=\"allow\",plugin=\"allowing\"} 2"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_request_is_refused_before_the_provider() {
    let env = start("topics", "banned_topics", topics(), "deny", &[]).await;
    let resp = env.chat(hello("tell me about the Falcon, please")).await;
    assert_eq!(resp.status(), 446);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["type"], "hooks_failed");
    let hook = &body["hook_results"]["before_request_hooks"][0];
    assert_eq!(hook["id"], "topics");
    assert_eq!(hook["verdict"], false);
    let check = check(&body, "before_request_hooks");
    assert_eq!(check["id"], "wasm.topics");
    assert_eq!(check["data"]["verdict"], "deny");
    let reason = check["data"]["reason"].as_str().unwrap();
    if built().is_some() {
        assert_eq!(reason, "the request mentions a banned topic: falcon");
    }
    assert_eq!(env.mock.request_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deny_without_deny_true_lets_the_answer_through_as_246() {
    let env = start(
        "topics",
        "banned_topics",
        topics(),
        "deny",
        &["deny: false", "side: input"],
    )
    .await;
    let resp = env.chat(hello("the secret plan")).await;
    assert_eq!(resp.status(), 246);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(content(&body), "mock reply to: the secret plan");
    assert_eq!(check(&body, "before_request_hooks")["verdict"], false);
    assert_eq!(env.mock.request_count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_rewrite_reaches_the_provider_redacted() {
    let env = start(
        "pii-in",
        "pii_redactor",
        json!({}),
        "rewrite",
        &["side: input"],
    )
    .await;
    let resp = env
        .chat(hello("mail jane.doe@example.com or call +1 555 123 4567"))
        .await;
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    let expected = if built().is_some() {
        "mock reply to: mail [EMAIL] or call [PHONE]"
    } else {
        "mock reply to: [redacted]"
    };
    assert_eq!(content(&body), expected);
    let seen = env.mock.requests()[0].json().unwrap();
    assert!(
        !seen.to_string().contains("jane.doe"),
        "the provider saw {seen}"
    );
    if built().is_some() {
        let metrics = env.metrics().await;
        assert!(
            metrics.contains(
                "gw_wasm_guardrail_counter_total{name=\"emails_redacted\",plugin=\"pii-in\"} 1"
            ),
            "{metrics}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_rewrite_changes_the_answer() {
    let env = start(
        "pii",
        "pii_redactor",
        json!({}),
        "rewrite",
        &["side: output"],
    )
    .await;
    let resp = env.chat(hello("write to jane@example.com")).await;
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    let expected = if built().is_some() {
        "mock reply to: write to [EMAIL]"
    } else {
        "[redacted]"
    };
    assert_eq!(content(&body), expected);
    // The provider saw the request as the client sent it.
    let seen = env.mock.requests()[0].json().unwrap();
    assert_eq!(seen["messages"][0]["content"], "write to jane@example.com");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_is_stopped_as_soon_as_a_banned_word_is_complete() {
    let env = start(
        "topics",
        "banned_topics",
        topics(),
        "deny",
        &["side: output"],
    )
    .await;
    let mut body = hello("falcon one two three four");
    body["stream"] = json!(true);
    let resp = env.chat(body).await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    let (content, last) = streamed(&text);
    assert_eq!(last["error"]["type"], "hooks_failed", "{text}");
    assert_eq!(
        last["hook_results"]["after_request_hooks"][0]["checks"][0]["id"],
        "wasm.topics"
    );
    assert!(!text.contains("[DONE]"), "{text}");
    // Refused at the delta that completed the word: that delta and everything after it
    // never went out.
    assert!(
        "mock reply to: falcon".starts_with(&content)
            && (built().is_none() || content.starts_with("mock reply")),
        "{content:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_is_redacted_across_deltas() {
    if built().is_none() {
        eprintln!("wasm_guardrails: skipped (needs the built pii_redactor)");
        return;
    }
    let env = start(
        "pii",
        "pii_redactor",
        json!({}),
        "rewrite",
        &["side: output"],
    )
    .await;
    let mut body = hello("write to jane@example.com or +1 555 123 4567 today");
    body["stream"] = json!(true);
    let resp = env.chat(body).await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    let (content, _) = streamed(&text);
    assert_eq!(
        content, "mock reply to: write to [EMAIL] or [PHONE] today",
        "{text}"
    );
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trap_fails_closed_or_open_as_configured() {
    let mode = json!({"mode": "trap"});
    let env = start("trapping", "misbehaving", mode.clone(), "trap", &[]).await;
    let resp = env.chat(hello("hi")).await;
    assert_eq!(resp.status(), 446);
    let body: Value = resp.json().await.unwrap();
    let check = check(&body, "before_request_hooks");
    assert_eq!(check["data"]["outcome"], "trap");
    assert!(
        check["error"].as_str().unwrap().contains("trapped"),
        "{check}"
    );
    assert_eq!(env.mock.request_count(), 0);

    let env = start(
        "trapping",
        "misbehaving",
        mode,
        "trap",
        &["on_error: fail_open"],
    )
    .await;
    let resp = env.chat(hello("hi")).await;
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(content(&body), "mock reply to: hi");
    assert_eq!(env.mock.request_count(), 1);
    let metrics = env.metrics().await;
    assert!(
        metrics.contains("gw_wasm_guardrail_calls_total{outcome=\"trap\",plugin=\"trapping\"}"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_is_reported_with_its_message() {
    if built().is_none() {
        eprintln!("wasm_guardrails: skipped (needs the built misbehaving guardrail)");
        return;
    }
    let env = start("bad", "misbehaving", json!({"mode": "panic"}), "trap", &[]).await;
    let resp = env.chat(hello("hi")).await;
    assert_eq!(resp.status(), 446);
    let body: Value = resp.json().await.unwrap();
    let error = check(&body, "before_request_hooks")["error"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(error.contains("misbehaving on purpose"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_loop_is_stopped_by_its_deadline() {
    let env = start(
        "bad",
        "misbehaving",
        json!({"mode": "loop"}),
        "loop",
        &["timeout_ms: 30"],
    )
    .await;
    let started = Instant::now();
    let resp = env.chat(hello("hi")).await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(resp.status(), 446);
    let body: Value = resp.json().await.unwrap();
    let check = check(&body, "before_request_hooks");
    assert_eq!(check["data"]["outcome"], "timeout");
    assert!(
        check["error"]
            .as_str()
            .unwrap()
            .contains("deadline of 30 ms"),
        "{check}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_past_the_limit_fails() {
    let env = start(
        "bad",
        "misbehaving",
        json!({"mode": "allocate"}),
        "memory",
        &["memory_limit_mb: 4"],
    )
    .await;
    let resp = env.chat(hello("hi")).await;
    assert_eq!(resp.status(), 446);
    let body: Value = resp.json().await.unwrap();
    let check = check(&body, "before_request_hooks");
    assert_eq!(check["data"]["outcome"], "memory");
    assert!(
        check["error"]
            .as_str()
            .unwrap()
            .contains("memory limit of 4 MiB"),
        "{check}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verdict_that_does_not_fit_is_an_error() {
    let env = start(
        "bad",
        "misbehaving",
        json!({"mode": "bad-verdict"}),
        "bad",
        &[],
    )
    .await;
    let resp = env.chat(hello("hi")).await;
    assert_eq!(resp.status(), 446);
    let body: Value = resp.json().await.unwrap();
    let check = check(&body, "before_request_hooks");
    assert_eq!(check["data"]["outcome"], "bad_verdict");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wasi_capabilities_are_reachable_only_when_granted() {
    if built().is_none() {
        eprintln!("wasm_guardrails: skipped (needs the built misbehaving guardrail)");
        return;
    }
    let mode = json!({"mode": "uses-wasi"});
    // stdout, stderr and HashMap's seed are always there; the clock is not.
    let env = start(
        "wasi",
        "misbehaving",
        mode.clone(),
        "allow",
        &["side: input"],
    )
    .await;
    let resp = env.chat(hello("hi")).await;
    assert_eq!(resp.status(), 446);
    let body: Value = resp.json().await.unwrap();
    let error = check(&body, "before_request_hooks")["error"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(error.contains("wasi:clocks/wall-clock"), "{error}");

    let env = start(
        "wasi",
        "misbehaving",
        mode,
        "allow",
        &["side: input", "grants: [clock, stderr]"],
    )
    .await;
    let resp = env.chat(hello("hi")).await;
    assert_eq!(resp.status(), 200);
}

/// The config errors of a pipeline with one wasm guardrail, as `config check` reports them.
fn config_errors(path: &Path, config: &Value) -> String {
    let text = format!(
        "listen: 127.0.0.1:0\n{}",
        yaml("g", path, config, &field(&[]))
    );
    match GatewayConfig::from_yaml(&text, &Overrides::default()) {
        Ok(_) => String::new(),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_component_missing_an_export_is_a_startup_error_naming_it() {
    let dir = std::env::temp_dir().join(format!("gw-wasm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = std::fs::read_to_string(scripted()).unwrap();
    let export = r#"(export "check-request" (func $check-request)
      (func (param "request" $request) (result $verdict)))"#;
    assert!(text.contains(export));
    let lacking = dir.join("lacking.wat");
    std::fs::write(&lacking, text.replace(export, "")).unwrap();
    let errors = config_errors(&lacking, &json!("allow"));
    assert!(errors.starts_with("pipeline[1].path: "), "{errors}");
    assert!(errors.contains("check-request"), "{errors}");

    let errors = config_errors(&dir.join("absent.wasm"), &json!({}));
    assert!(
        errors.starts_with("pipeline[1].path: cannot read"),
        "{errors}"
    );
    let errors = config_errors(&scripted(), &json!("init"));
    assert!(
        errors.starts_with("pipeline[1].config: the guardrail refused its config"),
        "{errors}"
    );

    // The same through the command.
    let file = dir.join("gateway.yaml");
    std::fs::write(
        &file,
        format!(
            "listen: 127.0.0.1:9\n{}",
            yaml("g", &lacking, &json!("allow"), "")
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gateway"))
        .args(["config", "check"])
        .arg(&file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("pipeline[1].path") && stderr.contains("check-request"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn an_example_refuses_a_bad_config_at_start() {
    let Some(dir) = built() else {
        eprintln!("wasm_guardrails: skipped (needs the built banned_topics)");
        return;
    };
    let errors = config_errors(&dir.join("banned_topics.wasm"), &json!({"word": ["x"]}));
    assert!(errors.starts_with("pipeline[1].config: "), "{errors}");
    assert!(errors.contains("word"), "{errors}");
}

/// A 0.2.0 guardrail sees the arguments of tool calls, and `/v1/messages` is checked like chat,
/// both ways and in streams. (The scripted fallback is a 0.1.0 component, which sees text only:
/// then only what it can see is asserted.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_and_the_messages_route_are_checked() {
    let env = start("topics", "banned_topics", topics(), "deny", &[]).await;
    // An earlier assistant turn calling a tool with a banned word in its arguments.
    let body = json!({"model": "m", "messages": [
        {"role": "user", "content": "what is next?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "lookup", "arguments": "{\"project\": \"falcon\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "nothing found"}]});
    let resp = env.chat(body).await;
    let status = resp.status().as_u16();
    if built().is_some() {
        assert_eq!(status, 446, "{}", resp.text().await.unwrap());
    }
    let messages = |side_body: Value| {
        env.gw_post("/v1/messages")
            .header("x-gw-provider", "anthropic")
            .header("x-gw-custom-host", env.mock.base_url())
            .header("authorization", "Bearer sk-ant")
            .json(&side_body)
            .send()
    };
    let before = env.mock.request_count();
    let resp = messages(json!({"model": "claude-test", "max_tokens": 20,
        "system": "mind the falcon",
        "messages": [{"role": "user", "content": "hi"}]}))
    .await
    .unwrap();
    assert_eq!(resp.status(), 446);
    assert_eq!(
        env.mock.request_count(),
        before,
        "refused before the provider"
    );
    if built().is_some() {
        let resp = messages(
            json!({"model": "claude-test", "max_tokens": 20, "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "tu_1", "name": "lookup",
                "input": {"project": "secret plan"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1",
                "content": "ok"}]}]}),
        )
        .await
        .unwrap();
        assert_eq!(resp.status(), 446, "tool_use input is read");
    }

    // The output side on /v1/messages: the mock echoes the question into its answer.
    let env = start(
        "topics_out",
        "banned_topics",
        topics(),
        "deny",
        &["side: output"],
    )
    .await;
    let ask = |stream: bool| {
        env.gw_post("/v1/messages")
            .header("x-gw-provider", "anthropic")
            .header("x-gw-custom-host", env.mock.base_url())
            .header("authorization", "Bearer sk-ant")
            .json(
                &json!({"model": "claude-test", "max_tokens": 50, "stream": stream,
                "messages": [{"role": "user", "content": "say falcon"}]}),
            )
            .send()
    };
    let resp = ask(false).await.unwrap();
    assert_eq!(resp.status(), 446);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(check(&body, "after_request_hooks")["id"], "wasm.topics_out");
    let resp = ask(true).await.unwrap();
    assert_eq!(resp.status(), 200, "the status went out before the answer");
    let text = resp.text().await.unwrap();
    assert!(text.contains("\"hooks_failed\""), "{text}");
    assert!(
        !text.contains("\"message_stop\""),
        "the stream ends with the refusal: {text}"
    );
}
