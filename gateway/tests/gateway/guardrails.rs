//! The `guardrails` plugin: hooks on input and output, from the pipeline and from
//! `x-gw-config`, answered with 446 (refused) or 246 (warned), redaction, streams, webhooks.

use std::process::Command;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::{hello, Env, MOCK_KEY};

/// A gateway whose pipeline runs `guardrails` (configured by `entry`, indented YAML lines
/// after `- kind: guardrails`) after provider selection.
async fn with_guardrails(entry: &str) -> Env {
    Env::start_with(&format!(
        "pipeline:\n  - kind: provider_select\n  - kind: guardrails\n{entry}\n  - kind: metrics\n"
    ))
    .await
}

/// The `data:` payloads of an SSE body.
fn events(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(str::to_owned)
        .collect()
}

async fn json_of(resp: reqwest::Response) -> (u16, Value) {
    let status = resp.status().as_u16();
    let body = resp.json().await.expect("a JSON body");
    (status, body)
}

const NO_SECRETS_DENY: &str = "    before_request_hooks:
      - id: no-secrets
        deny: true
        checks:
          - id: default.contains
            parameters: {words: [secret], operator: none}";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_input_deny_hook_is_a_446_and_the_provider_is_not_called() {
    let env = with_guardrails(NO_SECRETS_DENY).await;
    let (status, body) = json_of(env.chat(hello("tell me the secret")).await).await;
    assert_eq!(status, 446, "{body}");
    assert_eq!(body["error"]["type"], "hooks_failed");
    let hook = &body["hook_results"]["before_request_hooks"][0];
    assert_eq!(hook["id"], "no-secrets");
    assert_eq!(hook["verdict"], false);
    assert_eq!(hook["checks"][0]["id"], "default.contains");
    assert_eq!(hook["checks"][0]["data"]["foundWords"], json!(["secret"]));
    assert_eq!(env.mock.request_count(), 0);

    // A passing request goes through with the results, status 200.
    let (status, body) = json_of(env.chat(hello("tell me a joke")).await).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "mock reply to: tell me a joke"
    );
    assert_eq!(
        body["hook_results"]["before_request_hooks"][0]["verdict"],
        true
    );
    assert_eq!(env.mock.request_count(), 1);

    let metrics = env.metrics().await;
    assert!(
        metrics.contains(
            r#"gw_guardrail_checks_total{check="default.contains",side="input",verdict="fail"} 1"#
        ),
        "{metrics}"
    );
    assert!(metrics.contains(r#"gw_guardrail_hooks_total{outcome="deny",side="input"} 1"#));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_input_hook_without_deny_is_a_246_with_the_answer() {
    let env = with_guardrails(&NO_SECRETS_DENY.replace("deny: true", "deny: false")).await;
    let (status, body) = json_of(env.chat(hello("the secret word")).await).await;
    assert_eq!(status, 246, "{body}");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "mock reply to: the secret word"
    );
    assert_eq!(
        body["hook_results"]["before_request_hooks"][0]["verdict"],
        false
    );
    assert_eq!(body["hook_results"]["after_request_hooks"], json!([]));
    assert_eq!(env.mock.request_count(), 1);

    // Embeddings carry the input phase's results the same way.
    let resp = env
        .post("/v1/embeddings")
        .json(&json!({"model": "emb", "input": "a secret"}))
        .send()
        .await
        .unwrap();
    let (status, body) = json_of(resp).await;
    assert_eq!(status, 246, "{body}");
    assert_eq!(body["object"], "list");
    assert_eq!(
        body["hook_results"]["before_request_hooks"][0]["verdict"],
        false
    );
}

const OUTPUT_HOOKS: &str = "    after_request_hooks:
      - id: short
        deny: true
        checks:
          - id: default.wordCount
            parameters: {maxWords: 6}
      - id: polite
        checks:
          - id: default.contains
            parameters: {words: [please]}";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_hooks_refuse_with_446_or_warn_with_246() {
    let env = with_guardrails(OUTPUT_HOOKS).await;
    // "mock reply to: " + 5 words = 8 words: too long.
    let (status, body) = json_of(env.chat(hello("one two three four five")).await).await;
    assert_eq!(status, 446, "{body}");
    assert_eq!(body["error"]["type"], "hooks_failed");
    assert!(
        body.get("choices").is_none(),
        "the answer is replaced: {body}"
    );
    let after = &body["hook_results"]["after_request_hooks"];
    assert_eq!(after[0]["id"], "short");
    assert_eq!(after[0]["checks"][0]["data"]["count"], 8);
    assert_eq!(env.mock.request_count(), 1, "the provider answered");

    // Short but impolite: let through with 246.
    let (status, body) = json_of(env.chat(hello("hi")).await).await;
    assert_eq!(status, 246, "{body}");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "mock reply to: hi"
    );
    let after = &body["hook_results"]["after_request_hooks"];
    assert_eq!(after[0]["verdict"], true);
    assert_eq!(after[1]["verdict"], false);

    let (status, body) = json_of(env.chat(hello("please")).await).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pii_is_redacted_on_input_and_on_output() {
    let env = with_guardrails(
        "    input_guardrails:
      - id: redact-in
        type: mutator
        checks:
          - id: default.pii
            parameters: {redact: true, categories: [EMAIL_ADDRESS, CREDIT_CARD]}",
    )
    .await;
    let (status, body) = json_of(
        env.chat(hello("I am jane@example.com, card 4111 1111 1111 1111"))
            .await,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "mock reply to: I am [EMAIL_ADDRESS], card [CREDIT_CARD]"
    );
    let hook = &body["hook_results"]["before_request_hooks"][0];
    assert_eq!(hook["transformed"], true);
    assert_eq!(hook["type"], "mutator");
    assert_eq!(hook["checks"][0]["data"]["found"]["CREDIT_CARD"], 1);
    let sent = env.mock.requests()[0].json().unwrap();
    assert_eq!(
        sent["messages"][0]["content"],
        "I am [EMAIL_ADDRESS], card [CREDIT_CARD]"
    );

    let env = with_guardrails(
        "    output_guardrails:
      - type: mutator
        checks:
          - id: default.pii
            parameters: {redact: true}",
    )
    .await;
    let (status, body) = json_of(env.chat(hello("call +1 (555) 123-4567")).await).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "mock reply to: call [PHONE_NUMBER]"
    );
    // The provider saw the number; the client did not get it back.
    assert_eq!(
        env.mock.requests()[0].json().unwrap()["messages"][0]["content"],
        "call +1 (555) 123-4567"
    );
    assert_eq!(
        body["hook_results"]["after_request_hooks"][0]["transformed"],
        true
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_is_stopped_by_an_output_guardrail_with_a_final_error_event() {
    let env = with_guardrails(
        "    after_request_hooks:
      - id: brief
        deny: true
        checks:
          - id: default.wordCount
            parameters: {maxWords: 20}",
    )
    .await;
    let mut body = hello("talk");
    body["stream"] = json!(true);
    let resp = env
        .post("/v1/chat/completions")
        .header("x-mock-words", "300")
        .header("x-gw-forward-headers", "x-mock-words")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    let events = events(&text);
    assert!(!text.contains("[DONE]"), "{text}");
    let last: Value = serde_json::from_str(events.last().unwrap()).unwrap();
    assert_eq!(last["error"]["type"], "hooks_failed", "{last}");
    let check = &last["hook_results"]["after_request_hooks"][0]["checks"][0];
    assert_eq!(check["id"], "default.wordCount");
    assert_eq!(check["data"]["partial"], true);
    let mut content = String::new();
    for e in &events[..events.len() - 1] {
        let chunk: Value = serde_json::from_str(e).unwrap();
        if let Some(c) = chunk["choices"][0]["delta"]["content"].as_str() {
            content.push_str(c);
        }
    }
    let words = content.split_whitespace().count();
    // Checked every 256 bytes: stopped within about 70 words, long before the 300th.
    assert!((20..100).contains(&words), "{words} words got through");

    // A short stream passes whole.
    let mut body = hello("hi");
    body["stream"] = json!(true);
    let text = env.chat(body).await.text().await.unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
}

/// The routing config of the mock, with hooks.
fn config_with(env: &Env, hooks: Value) -> Value {
    let mut config =
        json!({"provider": "openai", "api_key": MOCK_KEY, "custom_host": env.mock.base_url()});
    for (k, v) in hooks.as_object().unwrap() {
        config[k] = v.clone();
    }
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_come_from_x_gw_config_and_are_validated_per_request() {
    let env = with_guardrails("    stream_check_bytes: 256").await;
    let config = config_with(
        &env,
        json!({"before_request_hooks": [{"deny": true, "checks": [
            {"id": "default.regexMatch", "parameters": {"rule": "(?i)drop\\s+table", "not": true}}
        ]}], "output_guardrails": [{"checks": [
            {"id": "default.endsWith", "parameters": {"suffix": "!"}}
        ]}]}),
    );
    let send = |config: &Value, content: &str| {
        env.gw_post("/v1/chat/completions")
            .header("x-gw-config", config.to_string())
            .json(&hello(content))
            .send()
    };
    let (status, body) = json_of(send(&config, "please DROP  TABLE users").await.unwrap()).await;
    assert_eq!(status, 446, "{body}");
    assert_eq!(
        body["hook_results"]["before_request_hooks"][0]["id"],
        "before_request_hooks[0]"
    );
    assert_eq!(env.mock.request_count(), 0);

    let (status, body) = json_of(send(&config, "hello").await.unwrap()).await;
    assert_eq!(status, 246, "{body}");
    assert_eq!(
        body["hook_results"]["after_request_hooks"][0]["verdict"],
        false
    );

    let bad = config_with(
        &env,
        json!({"before_request_hooks": [{"checks": [
            {"id": "default.wordCount", "parameters": {"maxWords": 3}},
            {"id": "default.regexMatch", "parameters": {"rule": "(unclosed"}}
        ]}]}),
    );
    let (status, body) = json_of(send(&bad, "hello").await.unwrap()).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        body["error"]["param"],
        "before_request_hooks[0].checks[1].parameters.rule"
    );
    let unknown = config_with(
        &env,
        json!({"after_request_hooks": [{"checks": [{"id": "default.nope"}]}]}),
    );
    let (status, body) = json_of(send(&unknown, "hello").await.unwrap()).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("default.jsonSchema"),
        "{body}"
    );
}

#[test]
fn config_check_refuses_a_bad_hook_naming_its_path() {
    let dir = std::env::temp_dir().join(format!("gw-guardrails-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("gateway.yaml");
    std::fs::write(
        &file,
        "pipeline:
  - kind: provider_select
  - kind: guardrails
    before_request_hooks:
      - checks:
          - id: default.regexMatch
            parameters: {rule: \"[\"}
    after_request_hooks:
      - checks:
          - id: default.wordCount
            parameters: {maxWrods: 3}
",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gateway"))
        .args(["config", "check"])
        .arg(&file)
        .output()
        .expect("run gateway config check");
    let _ = std::fs::remove_dir_all(dir);
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("pipeline[1].before_request_hooks[0].checks[0].parameters.rule"),
        "{text}"
    );
    assert!(
        text.contains("pipeline[1].after_request_hooks[0].checks[0].parameters.maxWrods"),
        "{text}"
    );
}

/// A webhook service on a local port answering every POST with `answer`; returns its URL and
/// a receiver of the bodies it got.
async fn webhook(answer: &'static str) -> (String, tokio::sync::mpsc::UnboundedReceiver<Value>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut piece = [0u8; 8192];
                let body = loop {
                    match socket.read(&mut piece).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&piece[..n]),
                    }
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                    let length = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    if buf.len() >= end + 4 + length {
                        break buf[end + 4..end + 4 + length].to_vec();
                    }
                };
                let _ = tx.send(serde_json::from_slice(&body).unwrap_or(Value::Null));
                let reply = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
                    answer.len()
                );
                let _ = socket.write_all(reply.as_bytes()).await;
            });
        }
    });
    (format!("http://{addr}/guard"), rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_allow_and_deny() {
    let (allow, mut allow_seen) = webhook(r#"{"verdict": true, "data": {"reason": "fine"}}"#).await;
    let (deny, mut deny_seen) = webhook(r#"{"verdict": false, "data": {"reason": "no"}}"#).await;
    let env = with_guardrails(&format!(
        "    before_request_hooks:
      - id: gatekeeper
        deny: true
        checks:
          - id: default.webhook
            parameters: {{webhookURL: \"{allow}\", headers: {{x-api-key: k1}}}}
    after_request_hooks:
      - id: reviewer
        checks:
          - id: default.webhook
            parameters: {{webhookURL: \"{deny}\"}}"
    ))
    .await;
    let (status, body) = json_of(env.chat(hello("is this fine")).await).await;
    // The input webhook allowed it; the output one failed it without deny: 246.
    assert_eq!(status, 246, "{body}");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "mock reply to: is this fine"
    );
    let results = &body["hook_results"];
    assert_eq!(results["before_request_hooks"][0]["verdict"], true);
    assert_eq!(
        results["before_request_hooks"][0]["checks"][0]["data"]["responseData"]["reason"],
        "fine"
    );
    assert_eq!(results["after_request_hooks"][0]["verdict"], false);

    let sent = allow_seen.recv().await.unwrap();
    assert_eq!(sent["eventType"], "beforeRequestHook");
    assert_eq!(sent["request"]["text"], "is this fine");
    let sent = deny_seen.recv().await.unwrap();
    assert_eq!(sent["eventType"], "afterRequestHook");
    assert_eq!(
        sent["response"]["json"]["choices"][0]["message"]["content"],
        "mock reply to: is this fine"
    );

    // A denying webhook on the input refuses before the provider is called.
    let env = with_guardrails(&format!(
        "    before_request_hooks:
      - deny: true
        checks:
          - id: default.webhook
            parameters: {{webhookURL: \"{deny}\"}}"
    ))
    .await;
    let (status, body) = json_of(env.chat(hello("anything")).await).await;
    assert_eq!(status, 446, "{body}");
    assert_eq!(env.mock.request_count(), 0);
}

/// A workspace's default guardrails (ids of the plugin's `library`, set through the control
/// plane) run for the requests of the workspace's keys, and only for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workspace_default_guardrails_apply_to_the_workspace_s_keys() {
    use reqwest::Method;
    let env = Env::start_with(
        "pipeline:
  - kind: auth
  - kind: provider_select
  - kind: guardrails
    library:
      - id: no-drop
        deny: true
        checks:
          - id: default.regexMatch
            parameters: {rule: \"(?i)drop\\\\s+table\", not: true}
",
    )
    .await;
    let ws = env.default_workspace().await;
    let (status, body) = env
        .admin_call(
            Method::PUT,
            &format!("/v1/admin/workspaces/{ws}"),
            Some(crate::common::ADMIN_KEY),
            Some(json!({"defaults": {"input_guardrails": ["no-drop"]}})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (key, _) = env.workspace_key(&ws, json!({})).await;

    let (status, body) = json_of(
        env.chat_as(&key, &hello("please DROP TABLE users"), &[])
            .await,
    )
    .await;
    assert_eq!(status, 446, "{body}");
    assert_eq!(
        body["hook_results"]["before_request_hooks"][0]["id"],
        "no-drop"
    );
    assert_eq!(env.mock.request_count(), 0);
    let (status, _) = json_of(env.chat_as(&key, &hello("hello"), &[]).await).await;
    assert_eq!(status, 200);
    // The admin key belongs to no workspace: the workspace's guardrails are not its.
    let (status, body) = json_of(env.chat(hello("please DROP TABLE users")).await).await;
    assert_eq!(status, 200, "{body}");

    // Naming a guardrail the library lacks refuses the workspace's requests (never unguarded).
    let (status, _) = env
        .admin_call(
            Method::PUT,
            &format!("/v1/admin/workspaces/{ws}"),
            Some(crate::common::ADMIN_KEY),
            Some(json!({"defaults": {"input_guardrails": ["missing"]}})),
        )
        .await;
    assert_eq!(status, 200);
    let (status, body) = json_of(env.chat_as(&key, &hello("hello"), &[]).await).await;
    assert_eq!(status, 500, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("missing"),
        "{body}"
    );
}

/// A stateless API lets a client put anything in "earlier" turns: input checks read them all,
/// tool-call arguments included, and `/v1/messages` is checked like chat, both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_read_every_turn_and_the_messages_route() {
    let env = with_guardrails(&format!(
        "{NO_SECRETS_DENY}
    after_request_hooks:
      - id: no-replies
        deny: true
        checks:
          - id: default.contains
            parameters: {{words: [reply], operator: none}}"
    ))
    .await;
    let hidden = json!({"model": "m", "messages": [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function",
            "function": {"name": "f", "arguments": "{\"q\": \"the secret\"}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "ok"},
        {"role": "user", "content": "go on"}]});
    let (status, body) = json_of(env.chat(hidden).await).await;
    assert_eq!(status, 446, "{body}");
    assert_eq!(env.mock.request_count(), 0);

    // Anthropic's format, to Anthropic: a refused input, then an answer the output hook refuses
    // (the mock's answer is "mock reply to: ...").
    let messages = |system: &str| {
        env.gw_post("/v1/messages")
            .header("x-gw-provider", "anthropic")
            .header("x-gw-custom-host", env.mock.base_url())
            .header("authorization", "Bearer sk-ant")
            .json(
                &json!({"model": "claude-test", "max_tokens": 20, "system": system,
                "messages": [{"role": "user", "content": "hi"}]}),
            )
            .send()
    };
    let (status, body) = json_of(messages("never tell the secret").await.unwrap()).await;
    assert_eq!(status, 446, "{body}");
    assert_eq!(
        body["hook_results"]["before_request_hooks"][0]["id"],
        "no-secrets"
    );
    assert_eq!(env.mock.request_count(), 0);
    let (status, body) = json_of(messages("be brief").await.unwrap()).await;
    assert_eq!(status, 446, "{body}");
    assert_eq!(
        body["hook_results"]["after_request_hooks"][0]["id"],
        "no-replies"
    );
    assert_eq!(env.mock.request_count(), 1);
}

/// The default pipeline runs `guardrails`: a request's own hooks are enforced with no YAML
/// change, and a workspace whose default guardrails name a hook the gateway lacks is refused
/// rather than served unguarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_pipeline_enforces_hooks() {
    let env = Env::start().await;
    let config = json!({"provider": "@mock", "before_request_hooks": [{"id": "no-secrets",
        "deny": true, "checks": [{"id": "default.contains",
        "parameters": {"words": ["secret"], "operator": "none"}}]}]});
    let resp = env
        .gw_post("/v1/chat/completions")
        .header("x-gw-config", config.to_string())
        .json(&hello("the secret"))
        .send()
        .await
        .unwrap();
    let (status, body) = json_of(resp).await;
    assert_eq!(status, 446, "{body}");
    assert_eq!(env.mock.request_count(), 0);
    // No hook applies: the request goes through.
    assert_eq!(env.chat(hello("hi")).await.status(), 200);

    let ws = env.default_workspace().await;
    let (status, body) = env
        .admin_call(
            reqwest::Method::PUT,
            &format!("/v1/admin/workspaces/{ws}"),
            Some(crate::common::ADMIN_KEY),
            Some(json!({"defaults": {"input_guardrails": ["not-in-the-library"]}})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (key, _) = env.workspace_key(&ws, json!({})).await;
    let resp = env.chat_as(&key, &hello("hi"), &[]).await;
    assert_eq!(resp.status(), 500);
    assert_eq!(env.mock.request_count(), 1);
}

/// Guardrails saved through `/v1/guardrails` apply with the default pipeline: named by the
/// workspace's defaults (to its keys, with no YAML change) and by configs, only within their
/// workspace; the data plane's own validator checks them when they are saved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saved_guardrails_are_named_by_workspace_defaults_and_configs() {
    use reqwest::Method;
    let env = Env::start().await;
    let admin = Some(crate::common::ADMIN_KEY);
    // The data plane's validator names the field it refuses.
    let (status, body) = env
        .admin_call(
            Method::POST,
            "/v1/guardrails",
            admin,
            Some(json!({"name": "bad", "checks": [
                {"id": "default.regexMatch", "parameters": {"rule": "("}}]})),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["data"]["message"]
            .as_str()
            .unwrap()
            .starts_with("checks[0].parameters.rule"),
        "{body}"
    );
    let (status, made) = env
        .admin_call(
            Method::POST,
            "/v1/guardrails",
            admin,
            Some(
                json!({"name": "No drop", "checks": [{"id": "default.regexMatch",
                "parameters": {"rule": "(?i)drop\\s+table", "not": true}}],
                "actions": {"deny": true}}),
            ),
        )
        .await;
    assert_eq!(status, 200, "{made}");
    let slug = made["slug"].as_str().unwrap().to_owned();
    let ws = env.default_workspace().await;
    let (key, _) = env.workspace_key(&ws, json!({})).await;

    // A config of the workspace names it: refused before the provider is called.
    let config = json!({"provider": "@mock", "input_guardrails": [slug]});
    let ask = |key: String, config: Value, text: &'static str| {
        let env = &env;
        async move {
            let resp = env
                .gw_post("/v1/chat/completions")
                .header("x-gw-api-key", key)
                .header("x-gw-config", config.to_string())
                .json(&hello(text))
                .send()
                .await
                .unwrap();
            json_of(resp).await
        }
    };
    let (status, body) = ask(key.clone(), config.clone(), "DROP TABLE users").await;
    assert_eq!(status, 446, "{body}");
    assert_eq!(
        body["hook_results"]["before_request_hooks"][0]["id"],
        slug.as_str()
    );
    assert_eq!(env.mock.request_count(), 0);
    let (status, _) = ask(key.clone(), config.clone(), "hello").await;
    assert_eq!(status, 200);

    // Another workspace's key cannot name it: the 400 of an unknown name.
    let (status, other) = env
        .admin_call(
            Method::POST,
            "/v1/admin/workspaces",
            admin,
            Some(json!({"name": "Other"})),
        )
        .await;
    assert_eq!(status, 200, "{other}");
    let other = other["id"].as_str().unwrap().to_owned();
    let (other_key, _) = env.workspace_key(&other, json!({})).await;
    let (status, body) = ask(other_key, config, "DROP TABLE users").await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["param"], "input_guardrails[0]");

    // The workspace's defaults name it: its keys are guarded with no config.
    let (status, body) = env
        .admin_call(
            Method::PUT,
            &format!("/v1/admin/workspaces/{ws}"),
            admin,
            Some(json!({"defaults": {"input_guardrails": [slug]}})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = json_of(env.chat_as(&key, &hello("DROP TABLE users"), &[]).await).await;
    assert_eq!(status, 446, "{body}");
    // An update applies to the next request: the guardrail now only warns (246).
    let (status, body) = env
        .admin_call(
            Method::PUT,
            &format!("/v1/guardrails/{slug}"),
            admin,
            Some(json!({"actions": {"deny": false}})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = json_of(env.chat_as(&key, &hello("DROP TABLE users"), &[]).await).await;
    assert_eq!(status, 246, "{body}");
}
