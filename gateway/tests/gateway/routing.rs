//! Routing configs executed against the mock provider's fault injection: each target is the
//! same mock behind a different fault prefix in its custom host.

use serde_json::{json, Value};

use crate::common::{expect_error, hello, Env};

/// A target on the mock whose answers carry the given fault spec (`status=503`...).
fn faulty(env: &Env, spec: &str) -> Value {
    let base = env
        .mock
        .base_url()
        .replace("/v1", &format!("/x-mock/{spec}/v1"));
    json!({"provider": "openai", "api_key": "sk-t", "custom_host": base})
}

fn healthy(env: &Env) -> Value {
    json!({"provider": "openai", "api_key": "sk-t", "custom_host": env.mock.base_url()})
}

async fn chat_with_config(env: &Env, config: &Value, body: Value) -> reqwest::Response {
    env.gw_post("/v1/chat/completions")
        .header("x-gw-config", config.to_string())
        .json(&body)
        .send()
        .await
        .unwrap()
}

fn header(resp: &reqwest::Response, name: &str) -> String {
    resp.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_goes_on_to_a_healthy_target_and_says_which_answered() {
    let env = Env::start().await;
    let config = json!({"strategy": {"mode": "fallback"},
                        "targets": [faulty(&env, "status=503"), faulty(&env, "status=500"), healthy(&env)]});
    let resp = chat_with_config(&env, &config, hello("hi")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        header(&resp, "x-gw-last-used-option-index"),
        "config.targets[2]"
    );
    assert_eq!(header(&resp, "x-gw-retry-attempt-count"), "0");
    let paths: Vec<String> = env.mock.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(paths.len(), 3, "{paths:?}");
    assert!(
        paths[0].contains("status=503") && paths[1].contains("status=500"),
        "{paths:?}"
    );

    // Streams fall back too: nothing has reached the client before the healthy target answers.
    let mut body = hello("stream");
    body["stream"] = json!(true);
    let resp = chat_with_config(&env, &config, body).await;
    assert_eq!(resp.status(), 200);
    assert!(resp.text().await.unwrap().ends_with("data: [DONE]\n\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_only_on_the_listed_statuses_and_never_on_the_gateways_own_errors() {
    // Loopback is trusted here, so that a closed local port is connected to (and refused).
    let env = Env::start_with("egress:\n  trusted_hosts: [127.0.0.1]\n").await;
    let config = json!({"strategy": {"mode": "fallback", "on_status_codes": [429]},
                        "targets": [faulty(&env, "status=500"), healthy(&env)]});
    let resp = chat_with_config(&env, &config, hello("hi")).await;
    assert_eq!(
        header(&resp, "x-gw-last-used-option-index"),
        "config.targets[0]"
    );
    let body = expect_error(resp, 500, None).await;
    assert_eq!(body["provider"], "openai");
    assert_eq!(env.mock.requests().len(), 1);

    let config = json!({"strategy": {"mode": "fallback"},
                        "targets": [{"provider": "@nobody"}, healthy(&env)]});
    let resp = chat_with_config(&env, &config, hello("hi")).await;
    expect_error(resp, 400, Some("x-gw-config")).await;
    assert_eq!(
        env.mock.requests().len(),
        1,
        "the gateway's own 400 must not fall back"
    );

    // A connection failure counts as 503 and falls back.
    let closed = gateway::server::free_local_addr();
    let config = json!({"strategy": {"mode": "fallback"}, "targets": [
        {"provider": "openai", "api_key": "k", "custom_host": format!("http://{closed}/v1")},
        healthy(&env)]});
    let resp = chat_with_config(&env, &config, hello("hi")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        header(&resp, "x-gw-last-used-option-index"),
        "config.targets[1]"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_balancing_follows_weights_and_never_picks_weight_zero() {
    let env = Env::start().await;
    let mut a = faulty(&env, "words=1");
    a["weight"] = json!(1);
    let mut b = faulty(&env, "words=2");
    b["weight"] = json!(0);
    let mut c = faulty(&env, "words=3");
    c["weight"] = json!(1);
    let config = json!({"strategy": {"mode": "loadbalance"}, "targets": [a, b, c]});
    let mut seen = [0usize; 3];
    for _ in 0..40 {
        let resp = chat_with_config(&env, &config, hello("x")).await;
        assert_eq!(resp.status(), 200);
        let index = header(&resp, "x-gw-last-used-option-index");
        let i: usize = index
            .trim_start_matches("config.targets[")
            .trim_end_matches(']')
            .parse()
            .unwrap();
        seen[i] += 1;
    }
    assert_eq!(seen[1], 0, "{seen:?}");
    assert!(
        seen[0] >= 8 && seen[2] >= 8,
        "an even split of 40 gave {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditional_routing_on_metadata_and_params() {
    let env = Env::start().await;
    let mut paid = faulty(&env, "words=1");
    paid["name"] = json!("paid");
    let mut free = faulty(&env, "words=2");
    free["name"] = json!("free");
    let config = json!({
        "strategy": {"mode": "conditional", "conditions": [
            {"query": {"metadata.tier": {"$eq": "paid"}}, "then": "paid"},
            {"query": {"params.model": {"$regex": "^mini-"}}, "then": "free"}
        ]},
        "targets": [paid, free]
    });
    let send = |meta: Option<&str>, model: &str| {
        let mut req = env
            .client
            .post(env.url("/v1/chat/completions"))
            .header("x-gw-config", config.to_string())
            .json(&json!({"model": model, "messages": [{"role": "user", "content": "x"}]}));
        if let Some(m) = meta {
            req = req.header("x-gw-metadata", m);
        }
        req.send()
    };
    let resp = send(Some(r#"{"tier":"paid"}"#), "big").await.unwrap();
    assert_eq!(
        header(&resp, "x-gw-last-used-option-index"),
        "config.targets[0]"
    );
    let resp = send(None, "mini-1").await.unwrap();
    assert_eq!(
        header(&resp, "x-gw-last-used-option-index"),
        "config.targets[1]"
    );
    // Nothing matches and there is no default: a 400.
    let resp = send(Some(r#"{"tier":"trial"}"#), "big").await.unwrap();
    expect_error(resp, 400, Some("x-gw-config")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_back_off_then_succeed_or_report_exhaustion() {
    let env = Env::start().await;
    let mut target = faulty(&env, "fail_first=2;status=503");
    target["retry"] = json!({"attempts": 3});
    let resp = chat_with_config(&env, &target, hello("hi")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(header(&resp, "x-gw-retry-attempt-count"), "2");
    assert_eq!(
        env.mock.requests().len(),
        3,
        "two failures, then the success"
    );

    let mut target = faulty(&env, "status=429");
    target["retry"] = json!({"attempts": 2, "use_retry_after_header": true});
    let resp = chat_with_config(&env, &target, hello("hi")).await;
    assert_eq!(header(&resp, "x-gw-retry-attempt-count"), "-1");
    expect_error(resp, 429, None).await;
    assert_eq!(env.mock.requests().len(), 6, "three more attempts");

    // Statuses outside the retry list are not retried.
    let mut target = faulty(&env, "status=400");
    target["retry"] = json!({"attempts": 3});
    let resp = chat_with_config(&env, &target, hello("hi")).await;
    assert_eq!(header(&resp, "x-gw-retry-attempt-count"), "0");
    assert_eq!(env.mock.requests().len(), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_timeout_is_a_408_that_can_fall_back() {
    let env = Env::start().await;
    let mut slow = faulty(&env, "delay_ms=2000");
    slow["request_timeout"] = json!(150);
    let resp = chat_with_config(&env, &slow, hello("hi")).await;
    let body = expect_error(resp, 408, None).await;
    assert_eq!(
        body["error"]["message"],
        "Request exceeded the timeout sent in the request: 150ms"
    );

    let config = json!({"strategy": {"mode": "fallback", "on_status_codes": [408]},
                        "targets": [slow, healthy(&env)]});
    let resp = chat_with_config(&env, &config, hello("hi")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        header(&resp, "x-gw-last-used-option-index"),
        "config.targets[1]"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_circuit_breaker_opens_skips_probes_and_closes() {
    let env = Env::start().await;
    // Target 0 fails its first three requests, then recovers.
    let config = json!({
        "strategy": {"mode": "fallback"},
        "cb_config": {"failure_threshold": 2, "cooldown_interval": 300},
        "targets": [faulty(&env, "fail_first=3;status=503"), healthy(&env)]
    });
    let to_zero = |env: &Env| {
        env.mock
            .requests()
            .iter()
            .filter(|r| r.path.contains("fail_first"))
            .count()
    };
    let mut used = Vec::new();
    for step in 0..7 {
        if step == 3 || step == 5 {
            tokio::time::sleep(std::time::Duration::from_millis(350)).await;
        }
        let resp = chat_with_config(&env, &config, hello("hi")).await;
        assert_eq!(resp.status(), 200, "step {step}");
        used.push((header(&resp, "x-gw-last-used-option-index"), to_zero(&env)));
    }
    let expected = [
        ("config.targets[1]", 1), // failure 1
        ("config.targets[1]", 2), // failure 2: the breaker opens
        ("config.targets[1]", 2), // open: target 0 is skipped
        ("config.targets[1]", 3), // cooldown over: a probe fails, open again
        ("config.targets[1]", 3), // open
        ("config.targets[0]", 4), // cooldown over: the probe succeeds, closed
        ("config.targets[0]", 5), // closed: target 0 serves again
    ];
    let got: Vec<(&str, usize)> = used.iter().map(|(i, n)| (i.as_str(), *n)).collect();
    assert_eq!(got, expected);

    let metrics = env.metrics().await;
    let count = |state: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with("gw_circuit_breaker_transitions_total")
                    && l.contains(&format!("state=\"{state}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
            .unwrap_or("0")
            .to_owned()
    };
    assert_eq!(
        (
            count("open").as_str(),
            count("half_open").as_str(),
            count("closed").as_str()
        ),
        ("2", "2", "1"),
        "{metrics}"
    );
    let fallbacks = metrics
        .lines()
        .find(|l| l.starts_with("gw_fallbacks_total"))
        .unwrap_or_default();
    assert!(fallbacks.ends_with(" 3"), "{fallbacks}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sticky_load_balancing_keeps_each_user_on_one_target() {
    let env = Env::start().await;
    let config = json!({
        "strategy": {"mode": "loadbalance", "sticky": {"hash_fields": ["metadata.user"]}},
        "targets": [faulty(&env, "words=1"), faulty(&env, "words=2")]
    });
    let mut first_choice = std::collections::BTreeMap::new();
    for round in 0..3 {
        for user in 0..12 {
            let resp = env
                .client
                .post(env.url("/v1/chat/completions"))
                .header("x-gw-config", config.to_string())
                .header("x-gw-metadata", format!(r#"{{"user":"u{user}"}}"#))
                .json(&hello("hi"))
                .send()
                .await
                .unwrap();
            let index = header(&resp, "x-gw-last-used-option-index");
            let first = first_choice.entry(user).or_insert_with(|| index.clone());
            assert_eq!(*first, index, "user {user} moved in round {round}");
        }
    }
    let distinct: std::collections::BTreeSet<_> = first_choice.values().collect();
    assert_eq!(
        distinct.len(),
        2,
        "12 users all went to one target: {first_choice:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_are_counted_by_provider() {
    let env = Env::start().await;
    let mut target = faulty(&env, "fail_first=1;status=500");
    target["retry"] = json!({"attempts": 2});
    assert_eq!(
        chat_with_config(&env, &target, hello("hi")).await.status(),
        200
    );
    let metrics = env.metrics().await;
    let line = metrics
        .lines()
        .find(|l| l.starts_with("gw_retries_total{provider=\"openai\"}"))
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(line.ends_with(" 1"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_forwards_the_client_headers_its_config_names() {
    let env = Env::start().await;
    let mut target = healthy(&env);
    target["forward_headers"] = json!(["X-Team"]);
    let resp = env
        .client
        .post(env.url("/v1/chat/completions"))
        .header("x-gw-config", target.to_string())
        .header("x-team", "search")
        .header("x-other", "not forwarded")
        .json(&hello("hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let seen = &env.mock.requests()[0];
    assert_eq!(seen.header("x-team"), Some("search"));
    assert_eq!(seen.header("x-other"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_paths_route_by_selection() {
    let env = Env::start().await;
    let get = |config: Value, metadata: Option<&str>| {
        let mut req = env
            .client
            .get(env.url("/v1/models"))
            .header("x-gw-config", config.to_string());
        if let Some(m) = metadata {
            req = req.header("x-gw-metadata", m);
        }
        req.send()
    };
    let mut a = healthy(&env);
    a["name"] = json!("a");
    a["weight"] = json!(0);
    let mut b = healthy(&env);
    b["name"] = json!("b");
    let conditional = json!({"strategy": {"mode": "conditional",
        "conditions": [{"query": {"metadata.team": "a"}, "then": "a"}], "default": "b"},
        "targets": [a.clone(), b.clone()]});
    let resp = get(conditional.clone(), Some(r#"{"team":"a"}"#))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        header(&resp, "x-gw-last-used-option-index"),
        "config.targets[0]"
    );
    let resp = get(conditional, None).await.unwrap();
    assert_eq!(
        header(&resp, "x-gw-last-used-option-index"),
        "config.targets[1]"
    );

    let weighted = json!({"strategy": {"mode": "loadbalance"}, "targets": [a, b]});
    for _ in 0..5 {
        let resp = get(weighted.clone(), None).await.unwrap();
        assert_eq!(
            header(&resp, "x-gw-last-used-option-index"),
            "config.targets[1]"
        );
    }

    // A passthrough body is not kept, so a fallback takes its first available target and
    // returns what it answers, as documented.
    let fallback = json!({"strategy": {"mode": "fallback"}, "targets": [faulty(&env, "status=503"), healthy(&env)]});
    let resp = get(fallback, None).await.unwrap();
    assert_eq!(resp.status(), 503);
    assert_eq!(
        header(&resp, "x-gw-last-used-option-index"),
        "config.targets[0]"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_count_is_that_of_the_target_that_answered() {
    let env = Env::start().await;
    let mut failing = faulty(&env, "status=503");
    failing["retry"] = json!({"attempts": 2});
    let config = json!({"strategy": {"mode": "fallback"}, "targets": [failing, healthy(&env)]});
    let resp = chat_with_config(&env, &config, hello("hi")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        header(&resp, "x-gw-last-used-option-index"),
        "config.targets[1]"
    );
    assert_eq!(header(&resp, "x-gw-retry-attempt-count"), "0");
    assert_eq!(
        env.mock.requests().len(),
        4,
        "three attempts on the first target, one on the second"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parents_retry_and_cache_hold_for_its_targets_unless_a_child_has_its_own() {
    let env = Env::start().await;
    let retry = |attempts: u32| json!({"attempts": attempts, "on_status_codes": [503], "use_retry_after_header": true});
    // Three groups deep, the retry written only at the top: one call and two retries.
    let deep = |leaf: Value| {
        json!({"retry": retry(2), "strategy": {"mode": "fallback"}, "targets": [
            {"strategy": {"mode": "fallback"}, "targets": [
                {"strategy": {"mode": "loadbalance"}, "targets": [leaf]}]}]})
    };
    let resp = chat_with_config(&env, &deep(faulty(&env, "status=503")), hello("hi")).await;
    assert_eq!(resp.status(), 503);
    assert_eq!(header(&resp, "x-gw-retry-attempt-count"), "-1");
    assert_eq!(env.mock.requests().len(), 3);

    // A child's own retry replaces the parent's whole.
    let mut leaf = faulty(&env, "status=503");
    leaf["retry"] = retry(1);
    let resp = chat_with_config(&env, &deep(leaf), hello("hi")).await;
    assert_eq!(resp.status(), 503);
    assert_eq!(env.mock.requests().len(), 3 + 2);

    // A top-level cache caches the answers of the target the router chose.
    let cached = json!({"cache": {"mode": "simple", "max_age": 60},
                        "strategy": {"mode": "fallback"}, "targets": [healthy(&env)]});
    let first = chat_with_config(&env, &cached, hello("cache me")).await;
    assert_eq!(header(&first, "x-gw-cache-status"), "MISS");
    let second = chat_with_config(&env, &cached, hello("cache me")).await;
    assert_eq!(header(&second, "x-gw-cache-status"), "HIT");
    assert_eq!(env.mock.requests().len(), 3 + 2 + 1);
}
