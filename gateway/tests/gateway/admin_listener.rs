//! `admin_listen`: the control plane served on an address of its own beside the main listener,
//! with the client's address in the audit log; `admin_on_main_listener: false` takes it off the
//! main listener (404 there) while provider routes stay; an address in use is refused at
//! start; the listener stops with the gateway.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};

use gateway::config::{GatewayConfig, Overrides, Secret};
use gateway::server::{free_local_addr, Gateway};

use crate::common::{expect_error, hello, Env, TempDir, ADMIN_KEY};

/// A call to `url` with `key`; the status and the JSON body.
async fn call(
    env: &Env,
    method: Method,
    url: &str,
    key: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = env.bare.request(method, url);
    if let Some(key) = key {
        req = req.header("x-gw-api-key", key);
    }
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req.send().await.expect("the listener answers");
    let status = resp.status().as_u16();
    (status, resp.json().await.expect("a JSON body"))
}

fn code(body: &Value) -> &str {
    body["data"]["errorCode"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn the_control_plane_is_served_on_its_own_listener_too() {
    let admin = free_local_addr();
    let env = Env::start_with(&format!("admin_listen: {admin}\n")).await;
    assert_eq!(env.gw.gateway.control_plane.listen_addr(), Some(admin));
    let base = format!("http://{admin}");

    let (status, list) = call(
        &env,
        Method::GET,
        &format!("{base}/v1/admin/workspaces"),
        Some(ADMIN_KEY),
        None,
    )
    .await;
    assert_eq!(status, 200, "{list}");
    assert!(
        list["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["slug"] == "default"),
        "{list}"
    );
    let (status, body) = call(
        &env,
        Method::GET,
        &format!("{base}/v1/admin/workspaces"),
        None,
        None,
    )
    .await;
    assert_eq!((status, code(&body)), (401, "AB05"), "{body}");

    // A change made there is recorded with the client's address.
    let (status, ws) = call(
        &env,
        Method::POST,
        &format!("{base}/v1/admin/workspaces"),
        Some(ADMIN_KEY),
        Some(json!({"name": "Over the admin listener"})),
    )
    .await;
    assert_eq!(status, 200, "{ws}");
    let (status, log) = call(
        &env,
        Method::GET,
        &format!("{base}/v1/audit-logs?start_time=2000-01-01T00:00:00Z&end_time=2999-01-01T00:00:00Z&method=POST"),
        Some(ADMIN_KEY),
        None,
    )
    .await;
    assert_eq!(status, 200, "{log}");
    assert_eq!(log["total"], 1, "{log}");
    assert_eq!(log["records"][0]["resource_id"], ws["id"], "{log}");
    assert_eq!(log["records"][0]["client_ip"], "127.0.0.1", "{log}");

    // Only the control plane is served there: provider routes and /health are its 404s.
    let (status, body) = call(
        &env,
        Method::POST,
        &format!("{base}/v1/chat/completions"),
        Some(ADMIN_KEY),
        Some(hello("wrong door")),
    )
    .await;
    assert_eq!((status, code(&body)), (404, "AB08"), "{body}");
    let (status, _) = call(&env, Method::GET, &format!("{base}/health"), None, None).await;
    assert_eq!(status, 404);

    // By default the main listener serves the control plane too, on the same database.
    let (status, got) = env
        .admin_call(
            Method::GET,
            &format!("/v1/admin/workspaces/{}", ws["id"].as_str().unwrap()),
            Some(ADMIN_KEY),
            None,
        )
        .await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["name"], "Over the admin listener");
    let resp = env.chat(hello("main")).await;
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn off_the_main_listener_control_plane_paths_are_not_found_there() {
    let admin = free_local_addr();
    let env = Env::start_with(&format!(
        "admin_listen: {admin}\nadmin_on_main_listener: false\n"
    ))
    .await;
    let base = format!("http://{admin}");

    // The main listener answers as for any path it does not serve, with or without a key.
    for (method, path) in [
        (Method::GET, "/v1/admin/workspaces"),
        (Method::POST, "/v1/api-keys/workspace/service"),
        (Method::GET, "/v1/openapi.json"),
    ] {
        let resp = env
            .client
            .request(method.clone(), env.url(path))
            .json(&json!({"name": "x"}))
            .send()
            .await
            .unwrap();
        let body = expect_error(resp, 404, None).await;
        let message = body["error"]["message"].as_str().unwrap();
        assert_eq!(message, format!("no route for {method} {path}"), "{body}");
    }

    // Its own listener serves it: a key made there calls providers on the main listener.
    let (status, made) = call(
        &env,
        Method::POST,
        &format!("{base}/v1/api-keys/workspace/service"),
        Some(ADMIN_KEY),
        Some(json!({"name": "app", "workspace_id": "default", "scopes": ["completions.write"]})),
    )
    .await;
    assert_eq!(status, 200, "{made}");
    let key = made["key"].as_str().unwrap();
    let resp = env
        .bare
        .post(env.url("/v1/chat/completions"))
        .header("x-gw-api-key", key)
        .header("x-gw-provider", "@mock")
        .json(&hello("through the main listener"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "mock reply to: through the main listener"
    );
    let resp = env.chat(hello("admin key")).await;
    assert_eq!(resp.status(), 200);
    let (status, list) = call(
        &env,
        Method::GET,
        &format!("{base}/v1/api-keys?workspace_id=default"),
        Some(ADMIN_KEY),
        None,
    )
    .await;
    assert_eq!((status, &list["total"]), (200, &json!(1)), "{list}");
}

#[tokio::test]
async fn the_admin_listener_stops_on_its_own_and_with_the_gateway() {
    // Stopped on its own: at once when nothing is under way; the main listener runs on.
    let admin = free_local_addr();
    let env = Env::start_with(&format!("admin_listen: {admin}\n")).await;
    let (status, _) = call(
        &env,
        Method::GET,
        &format!("http://{admin}/v1/api-keys"),
        Some(ADMIN_KEY),
        None,
    )
    .await;
    assert_eq!(status, 200);
    let gateway = env.gw.gateway.clone();
    let (stopped, took) = tokio::task::spawn_blocking(move || {
        let start = Instant::now();
        let stopped = gateway.control_plane.stop_listener(Duration::from_secs(10));
        (stopped, start.elapsed())
    })
    .await
    .unwrap();
    assert!(stopped, "requests still running");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(
        std::net::TcpStream::connect(admin).is_err(),
        "the control plane's listener still accepts once stopped"
    );
    let (status, _) = env
        .admin_call(Method::GET, "/v1/api-keys", Some(ADMIN_KEY), None)
        .await;
    assert_eq!(status, 200);
    assert_eq!(env.chat(hello("still here")).await.status(), 200);

    // With the gateway's graceful stop.
    let admin = free_local_addr();
    let env = Env::start_with(&format!(
        "admin_listen: {admin}\nshutdown: {{drain_timeout_secs: 1}}\n"
    ))
    .await;
    assert!(std::net::TcpStream::connect(admin).is_ok());
    let gw = env.gw;
    tokio::task::spawn_blocking(move || gw.shutdown_gracefully())
        .await
        .expect("the gateway stops");
    assert!(
        std::net::TcpStream::connect(admin).is_err(),
        "the control plane's listener still accepts after a shutdown"
    );
}

#[tokio::test]
async fn an_admin_address_in_use_is_refused_at_start() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let db = TempDir::new("admin-listen-taken");
    let overrides = Overrides {
        database_url: Some(db.sqlite_url()),
        bootstrap_admin_key: Some(Secret(ADMIN_KEY.into())),
        ..Overrides::default()
    };
    let config = GatewayConfig::from_yaml(
        &format!(
            "listen: {}\nthreads: 1\nadmin_listen: {addr}\n",
            free_local_addr()
        ),
        &overrides,
    )
    .expect("a valid config");
    let errors = match Gateway::new(config) {
        Ok(_) => panic!("the gateway started on a taken address"),
        Err(errors) => errors,
    };
    assert_eq!(errors.0.len(), 1, "{errors}");
    assert_eq!(errors.0[0].path, "admin_listen", "{errors}");
    assert!(errors.0[0].message.contains(&addr.to_string()), "{errors}");
}
