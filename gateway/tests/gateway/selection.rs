//! The four ways of selecting a provider, their aliases and their errors.

use serde_json::{json, Value};

use crate::common::{expect_error, hello, Env, MOCK_KEY};

async fn chat_with(env: &Env, headers: &[(&str, String)]) -> reqwest::Response {
    let mut req = env
        .client
        .post(env.url("/v1/chat/completions"))
        .json(&hello("hi"));
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    req.send().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn way_1_saved_provider_and_legacy_virtual_key() {
    let env = Env::start().await;
    for headers in [
        vec![("x-gw-provider", "@mock".to_owned())],
        vec![("x-gw-virtual-key", "mock".to_owned())],
        vec![("x-portkey-virtual-key", "mock".to_owned())],
    ] {
        let resp = chat_with(&env, &headers).await;
        assert_eq!(resp.status(), 200, "{headers:?}");
    }
    for r in env.mock.requests() {
        assert_eq!(
            r.header("authorization"),
            Some(format!("Bearer {MOCK_KEY}").as_str())
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn way_2_provider_id_with_bearer() {
    // The operator points the openai row at the mock; the client names the provider by id.
    let env = Env::start_with("provider_base_urls:\n  openai: \"{MOCK_BASE}\"\n").await;
    let resp = chat_with(
        &env,
        &[
            ("x-gw-provider", "openai".to_owned()),
            ("authorization", "Bearer sk-client".to_owned()),
        ],
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        env.mock.requests()[0].header("authorization"),
        Some("Bearer sk-client")
    );

    // Without a key the provider cannot be called.
    let resp = chat_with(&env, &[("x-gw-provider", "openai".to_owned())]).await;
    let body = expect_error(resp, 401, None).await;
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("Authorization: Bearer"));

    let resp = chat_with(
        &env,
        &[
            ("x-gw-provider", "not-a-provider".to_owned()),
            ("authorization", "Bearer k".to_owned()),
        ],
    )
    .await;
    let body = expect_error(resp, 400, Some("x-gw-provider")).await;
    assert!(body["error"]["message"].as_str().unwrap().contains("groq"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn way_3_inline_and_saved_configs() {
    let env = Env::start_with(
        "configs:\n  - id: pc-saved\n    config: {provider: openai, api_key: sk-from-saved-config, custom_host: \"{MOCK_BASE}\"}\n",
    )
    .await;
    let inline = json!({
        "provider": "openai",
        "api_key": "sk-from-config",
        "custom_host": env.mock.base_url(),
        "override_params": {"model": "overridden-model"}
    });
    let resp = chat_with(&env, &[("x-gw-config", inline.to_string())]).await;
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["model"], "overridden-model");
    let req = &env.mock.requests()[0];
    assert_eq!(req.header("authorization"), Some("Bearer sk-from-config"));
    assert_eq!(req.json().unwrap()["model"], "overridden-model");

    let resp = chat_with(&env, &[("x-portkey-config", "pc-saved".to_owned())]).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        env.mock.requests()[1].header("authorization"),
        Some("Bearer sk-from-saved-config")
    );

    let resp = chat_with(&env, &[("x-gw-config", "{not json".to_owned())]).await;
    expect_error(resp, 400, Some("x-gw-config")).await;
    let resp = chat_with(&env, &[("x-gw-config", "pc-missing".to_owned())]).await;
    expect_error(resp, 400, Some("x-gw-config")).await;
    let resp = chat_with(&env, &[("x-gw-config", r#"{"api_key":"k"}"#.to_owned())]).await;
    let body = expect_error(resp, 400, Some("x-gw-config")).await;
    assert_eq!(body["error"]["code"], "AB01");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn way_4_custom_host() {
    let env = Env::start().await;
    let resp = chat_with(
        &env,
        &[
            ("x-gw-custom-host", env.mock.base_url()),
            ("x-gw-provider", "openai".to_owned()),
            ("authorization", "Bearer sk-custom".to_owned()),
        ],
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        env.mock.requests()[0].header("authorization"),
        Some("Bearer sk-custom")
    );

    // The x-portkey- spelling of every header works the same.
    let resp = chat_with(
        &env,
        &[
            ("x-portkey-custom-host", env.mock.base_url()),
            ("x-portkey-provider", "openai".to_owned()),
            ("authorization", "Bearer sk-custom".to_owned()),
        ],
    )
    .await;
    assert_eq!(resp.status(), 200);

    let resp = chat_with(
        &env,
        &[
            ("x-gw-custom-host", "not a url".to_owned()),
            ("x-gw-provider", "openai".to_owned()),
            ("authorization", "Bearer k".to_owned()),
        ],
    )
    .await;
    expect_error(resp, 400, Some("x-gw-custom-host")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn none_or_two_ways_is_a_400_that_names_the_headers() {
    let env = Env::start().await;
    let resp = chat_with(&env, &[]).await;
    let body = expect_error(resp, 400, Some("x-gw-provider")).await;
    let message = body["error"]["message"].as_str().unwrap();
    for header in [
        "x-gw-provider",
        "x-gw-virtual-key",
        "x-gw-config",
        "x-gw-custom-host",
    ] {
        assert!(message.contains(header), "{message} lacks {header}");
    }
    let resp = chat_with(
        &env,
        &[
            ("x-gw-provider", "@mock".to_owned()),
            ("x-gw-config", r#"{"provider":"openai"}"#.to_owned()),
        ],
    )
    .await;
    let body = expect_error(resp, 400, Some("x-gw-provider")).await;
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("only one way"));

    let resp = chat_with(&env, &[("x-gw-provider", "@unknown".to_owned())]).await;
    expect_error(resp, 400, Some("x-gw-provider")).await;
    assert!(
        env.mock.requests().is_empty(),
        "nothing may reach the provider"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_targets_can_name_saved_providers_and_nest() {
    let env = Env::start().await;
    for config in [
        json!({"provider": "@mock"}),
        json!({"virtual_key": "mock", "override_params": {"model": "from-config"}}),
        json!({"strategy": {"mode": "single"}, "override_params": {"model": "from-parent"},
               "targets": [{"provider": "@mock"}]}),
    ] {
        let resp = chat_with(&env, &[("x-gw-config", config.to_string())]).await;
        assert_eq!(resp.status(), 200, "{config}");
    }
    let seen = env.mock.requests();
    assert!(seen
        .iter()
        .all(|r| r.header("authorization") == Some(format!("Bearer {MOCK_KEY}").as_str())));
    assert_eq!(seen[1].json().unwrap()["model"], "from-config");
    assert_eq!(seen[2].json().unwrap()["model"], "from-parent");

    // Validation names the offending path, in the AB01 family, before anything goes upstream.
    let bad = json!({"strategy": {"mode": "loadbalance"},
                     "targets": [{"provider": "@mock"}, {"provider": "@mock", "weight": -1}]});
    let resp = chat_with(&env, &[("x-gw-config", bad.to_string())]).await;
    let body = expect_error(resp, 400, Some("x-gw-config")).await;
    assert_eq!(body["error"]["code"], "AB01");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("targets[1].weight must be >= 0"),
        "{body}"
    );
    let resp = chat_with(
        &env,
        &[("x-gw-config", json!({"provider": "@nobody"}).to_string())],
    )
    .await;
    expect_error(resp, 400, Some("x-gw-config")).await;
    assert_eq!(env.mock.requests().len(), 3);
}
