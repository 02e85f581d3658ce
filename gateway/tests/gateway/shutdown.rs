//! Ctrl-C drains in-flight streams before the process exits (the real binary, a real signal).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::json;

use crate::common::{hello, ADMIN_KEY};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_drains_an_open_stream_then_exits() {
    let mock = mock_provider::MockProvider::start().await;
    let (dir, config, listen) = draining_config("gw-shutdown", &mock, "log: info\n");
    let mut child = start_binary(&config, listen, Stdio::piped());

    let client = reqwest::Client::new();
    let mut body = hello("x");
    body["stream"] = json!(true);
    let resp = client
        .post(format!("http://{listen}/v1/chat/completions"))
        .header("x-gw-api-key", ADMIN_KEY)
        .header("x-gw-provider", "@mock")
        .header("x-mock-words", "10")
        .header("x-mock-chunk-delay-ms", "100")
        .header("x-gw-forward-headers", "x-mock-words,x-mock-chunk-delay-ms")
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut stream = resp.bytes_stream();
    let mut text = String::from_utf8(stream.next().await.unwrap().unwrap().to_vec()).unwrap();

    let interrupted_at = Instant::now();
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());

    // The open stream runs to its end...
    while let Some(piece) = stream.next().await {
        text.push_str(std::str::from_utf8(&piece.unwrap()).unwrap());
    }
    assert!(
        text.ends_with("data: [DONE]\n\n"),
        "the stream was cut: {text}"
    );

    // ...new connections are refused while draining or after...
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        client
            .get(format!("http://{listen}/health"))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .is_err(),
        "the gateway still accepts requests after Ctrl-C"
    );

    // ...and the process exits cleanly soon after the last stream, not after the 20 s window.
    let exit = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            interrupted_at.elapsed() < Duration::from_secs(10),
            "the gateway did not exit after draining"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(exit.success(), "{exit:?}");
    let log: Vec<String> = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .collect();
    assert!(
        log.iter()
            .any(|l| l.contains("request") && l.contains("chat.completions")),
        "no request log line in {log:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_plugins_and_keeps_the_old_version_when_reload_fails() {
    let mock = mock_provider::MockProvider::start().await;
    let listen = gateway::server::free_local_addr();
    let dir = std::env::temp_dir().join(format!("gw-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap();
    let component = dir.join("guardrail.wat");
    std::fs::copy(root.join("plugins/guardrails/wat/scripted.wat"), &component).unwrap();
    let config = dir.join("gateway.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: {listen}\nthreads: 1\nlog: info\ndatabase_url: \"sqlite://{db}\"\nproviders:\n  - {{slug: mock, provider: openai, api_key: k, custom_host: \"{base}\"}}\npipeline:\n  - kind: provider_select\n  - kind: wasm_guardrail\n    id: reloadable\n    path: {path}\n    config: allow\n",
            db = dir.join("gateway.db").display(),
            base = mock.base_url(),
            path = component.display(),
        ),
    )
    .unwrap();
    let mut child = start_binary(&config, listen, Stdio::piped());
    let (lines_tx, lines_rx) = std::sync::mpsc::channel::<String>();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    let wait_for = |needle: &str| {
        let until = Instant::now() + Duration::from_secs(10);
        while let Some(left) = until.checked_duration_since(Instant::now()) {
            match lines_rx.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(_) => break,
            }
        }
        panic!("no log line with {needle:?}");
    };
    let hup = |pid: u32| {
        let status = Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    };
    let client = reqwest::Client::new();
    let ask = || {
        client
            .post(format!("http://{listen}/v1/chat/completions"))
            .header("x-gw-provider", "@mock")
            .json(&hello("still here?"))
            .send()
    };

    hup(child.id());
    wait_for("SIGHUP: pipeline reloaded");
    assert_eq!(ask().await.unwrap().status(), 200);

    // A component that is gone cannot be reloaded: the loaded one keeps serving.
    std::fs::remove_file(&component).unwrap();
    hup(child.id());
    let line = wait_for("SIGHUP: reload failed");
    assert!(line.contains("reloadable"), "{line}");
    assert_eq!(ask().await.unwrap().status(), 200);
    assert!(
        child.try_wait().unwrap().is_none(),
        "SIGHUP must not stop the gateway"
    );

    let _ = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A config in a new folder named after `name`: a free loopback address, one thread, a 20 s
/// drain, SQLite in the folder, the mock as the saved provider `mock`, then `extra` (YAML).
fn draining_config(
    name: &str,
    mock: &mock_provider::MockProvider,
    extra: &str,
) -> (std::path::PathBuf, std::path::PathBuf, std::net::SocketAddr) {
    let listen = gateway::server::free_local_addr();
    let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("gateway.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: {listen}\nthreads: 1\nshutdown: {{drain_timeout_secs: 20}}\ndatabase_url: \"sqlite://{}\"\nproviders:\n  - {{slug: mock, provider: openai, api_key: k, custom_host: \"{}\"}}\n{extra}",
            dir.join("gateway.db").display(),
            mock.base_url()
        ),
    )
    .unwrap();
    (dir, config, listen)
}

/// Starts the gateway binary on `config` and waits until it listens on `listen`.
fn start_binary(
    config: &std::path::Path,
    listen: std::net::SocketAddr,
    stdout: Stdio,
) -> std::process::Child {
    let child = Command::new(env!("CARGO_BIN_EXE_gateway"))
        .env("GW_BOOTSTRAP_ADMIN_KEY", ADMIN_KEY)
        .args(["serve", "--config"])
        .arg(config)
        .stdout(stdout)
        .stderr(Stdio::null())
        .spawn()
        .expect("start the gateway binary");
    let deadline = Instant::now() + Duration::from_secs(15);
    while std::net::TcpStream::connect(listen).is_err() {
        assert!(
            Instant::now() < deadline,
            "the binary did not start listening"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_charges_are_written_before_the_process_exits() {
    let mock = mock_provider::MockProvider::start().await;
    // Charges reach the control plane once an hour: only the exit can write this one.
    let (dir, config, listen) = draining_config(
        "gw-exit-charges",
        &mock,
        "log: warn\npipeline:\n  - kind: auth\n  - kind: provider_select\n  - kind: usage_limit\n    flush_interval_ms: 3600000\n",
    );
    let mut child = start_binary(&config, listen, Stdio::null());
    let client = reqwest::Client::new();
    let admin = |method: reqwest::Method, path: &str, body: Option<serde_json::Value>| {
        let mut req = client
            .request(method, format!("http://{listen}{path}"))
            .header("x-gw-api-key", ADMIN_KEY);
        if let Some(body) = body {
            req = req.json(&body);
        }
        async move {
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            let body: serde_json::Value = resp.json().await.unwrap();
            assert_eq!(status, 200, "{body}");
            body
        }
    };
    let workspaces = admin(reqwest::Method::GET, "/v1/admin/workspaces", None).await;
    let ws = workspaces["data"][0]["id"].as_str().unwrap().to_owned();
    let policy = admin(
        reqwest::Method::POST,
        "/v1/policies/usage-limits",
        Some(json!({"name": "exit", "workspace_id": ws, "type": "tokens", "credit_limit": 1000,
            "conditions": [{"key": "workspace_id", "value": ws}], "group_by": [{"key": "api_key"}]})),
    )
    .await;
    let policy_id = policy["id"].as_str().unwrap().to_owned();
    let key = admin(
        reqwest::Method::POST,
        "/v1/api-keys/workspace/service",
        Some(json!({"name": "k", "workspace_id": ws, "scopes": ["completions.write"]})),
    )
    .await;
    // 1 prompt word, 4 reply words: 5 tokens.
    let body = json!({"model": "mock-model", "max_tokens": 4,
        "messages": [{"role": "user", "content": "x"}]});
    let resp = client
        .post(format!("http://{listen}/v1/chat/completions"))
        .header("x-gw-api-key", key["key"].as_str().unwrap())
        .header("x-gw-provider", "@mock")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);

    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(15);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the gateway did not exit");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The next start reads the charge from the database.
    let mut child = start_binary(&config, listen, Stdio::null());
    let got = admin(
        reqwest::Method::GET,
        &format!("/v1/policies/usage-limits/{policy_id}?include_usage=true"),
        None,
    )
    .await;
    let _ = child.kill();
    let _ = child.wait();
    let entry = &got["value_key_usage_map"][format!("api_key:{}", key["id"].as_str().unwrap())];
    assert_eq!(entry["current_usage"], 5.0, "{got}");
    let _ = std::fs::remove_dir_all(dir);
}
