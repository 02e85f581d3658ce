//! Plugin-level tests: a small in-memory access store, requests carrying a Principal.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use plugin_sdk::access::{
    ApiKeyRecord, AuthMethod, Condition, KeyKind, RateLimit, RateLimitKind, RateLimitPolicy,
    RateUnit, ScopedRateLimit, UsageLimitPolicy, WorkspaceRecord,
};
use plugin_sdk::headers::GwHeaders;
use plugin_sdk::llm::{ChatRequest, LlmRequest};
use plugin_sdk::{
    AccessStore, BuildCx, ErrorKind, Flow, GatewayError, Plugin, PluginDescriptor, PluginFactory,
    Principal, ProviderStore, RequestCx, Route, RoutePlan, Target, Usage,
};

use super::*;

/// An access store holding only rate limits policies, which a test may replace.
#[derive(Default)]
struct TestAccess {
    policies: Mutex<Arc<[RateLimitPolicy]>>,
}

impl TestAccess {
    fn with(policies: Vec<RateLimitPolicy>) -> Arc<TestAccess> {
        Arc::new(TestAccess {
            policies: Mutex::new(Arc::from(policies)),
        })
    }

    fn replace(&self, policies: Vec<RateLimitPolicy>) {
        *self.policies.lock().unwrap() = Arc::from(policies);
    }
}

impl AccessStore for TestAccess {
    fn api_key(&self, _digest: &[u8; 32]) -> Option<Arc<ApiKeyRecord>> {
        None
    }
    fn workspace(&self, _id: &str) -> Option<Arc<WorkspaceRecord>> {
        None
    }
    fn rate_limit_policies(&self) -> Arc<[RateLimitPolicy]> {
        self.policies.lock().unwrap().clone()
    }
    fn usage_limit_policies(&self) -> Arc<[UsageLimitPolicy]> {
        Arc::from(Vec::new())
    }
    fn version(&self) -> i64 {
        0
    }
}

fn limit(kind: RateLimitKind, unit: RateUnit, value: f64) -> RateLimit {
    RateLimit { kind, unit, value }
}

fn rpm(value: f64) -> RateLimit {
    limit(RateLimitKind::Requests, RateUnit::Rpm, value)
}

fn scoped(id: &str, limit: RateLimit) -> ScopedRateLimit {
    ScopedRateLimit {
        id: id.into(),
        limit,
    }
}

fn key_principal(key: &str, workspace: &str, limits: Vec<ScopedRateLimit>) -> Principal {
    Principal {
        method: AuthMethod::ApiKey(KeyKind::WorkspaceService),
        organisation_id: Some("org-1".into()),
        workspace_id: Some(workspace.into()),
        api_key_id: Some(key.into()),
        user_id: None,
        scopes: vec!["completions.write".into()],
        rate_limits: limits,
        budgets: vec![],
    }
}

fn policy(
    id: &str,
    workspace: &str,
    name: Option<&str>,
    conditions: Vec<Condition>,
    group_by: &[&str],
    limit: RateLimit,
) -> RateLimitPolicy {
    RateLimitPolicy {
        id: id.into(),
        organisation_id: "org-1".into(),
        workspace_id: workspace.into(),
        name: name.map(str::to_string),
        conditions,
        group_by: group_by.iter().map(|g| g.to_string()).collect(),
        limit,
    }
}

fn cond(key: &str, value: &str) -> Condition {
    Condition {
        key: key.into(),
        value: value.into(),
        excludes: None,
    }
}

/// A chat request by `principal` (if any) for `model`, with `metadata`, to OpenAI.
fn request(principal: Option<&Principal>, model: &str, metadata: &[(&str, &str)]) -> RequestCx {
    let mut cx = RequestCx::new(
        "trace".into(),
        Route::ChatCompletions,
        http::Method::POST,
        "/v1/chat/completions".into(),
    );
    if let Some(p) = principal {
        cx.extensions.insert(p.clone());
    }
    let mut headers = http::HeaderMap::new();
    if !metadata.is_empty() {
        let m: BTreeMap<&str, &str> = metadata.iter().copied().collect();
        headers.insert(
            "x-gw-metadata",
            serde_json::to_string(&m).unwrap().parse().unwrap(),
        );
    }
    cx.gw = GwHeaders::parse(&headers).unwrap();
    let body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
    let chat: ChatRequest = serde_json::from_value(body).unwrap();
    cx.request = LlmRequest::Chat(Box::new(chat));
    cx.plan = Some(RoutePlan::Single(Target {
        provider: "openai".into(),
        ..Target::default()
    }));
    cx
}

fn build_with(access: Arc<dyn AccessStore>, config: RateLimitConfig) -> (RateLimiter, BuildCx) {
    let cx = BuildCx {
        access,
        ..BuildCx::standalone()
    };
    let plugin = RateLimiter::new(&config, &cx).expect("builds");
    (plugin, cx)
}

fn build(access: Arc<dyn AccessStore>) -> (RateLimiter, BuildCx) {
    build_with(access, RateLimitConfig::default())
}

/// `on_request`, then what the pipeline does next: complete the check the Redis backend
/// deferred (shared mode's admission).
async fn run(plugin: &RateLimiter, cx: &mut RequestCx) -> Result<(), GatewayError> {
    match plugin.on_request(cx).await? {
        Flow::Continue => cx.complete_deferred().await,
        Flow::Respond(r) => panic!("rate_limit answers with errors, not {r:?}"),
    }
}

async fn allowed(
    plugin: &RateLimiter,
    principal: Option<&Principal>,
    meta: &[(&str, &str)],
) -> bool {
    allowed_model(plugin, principal, "gpt-4o", meta).await
}

async fn allowed_model(
    plugin: &RateLimiter,
    principal: Option<&Principal>,
    model: &str,
    meta: &[(&str, &str)],
) -> bool {
    let mut cx = request(principal, model, meta);
    match run(plugin, &mut cx).await {
        Ok(()) => true,
        Err(e) if e.status().as_u16() == 429 => false,
        Err(e) => panic!("unexpected error {e}"),
    }
}

fn metrics_text(cx: &BuildCx) -> String {
    prometheus::TextEncoder::new()
        .encode_to_string(&cx.metrics.gather())
        .unwrap()
}

#[tokio::test]
async fn a_key_limit_refuses_with_429_retry_after_and_a_body_naming_it() {
    let (plugin, bcx) = build(Arc::new(plugin_sdk::access::NoAccess));
    assert_eq!(plugin.backend(), "memory");
    let p = key_principal("k1", "ws-1", vec![scoped("api_key:k1:0", rpm(3.0))]);
    for _ in 0..3 {
        assert!(allowed(&plugin, Some(&p), &[]).await);
    }
    let mut cx = request(Some(&p), "gpt-4o", &[]);
    let err = run(&plugin, &mut cx)
        .await
        .expect_err("the fourth is refused");
    assert_eq!(err.status().as_u16(), 429);
    let ErrorKind::RateLimited { retry_after_secs } = err.kind else {
        panic!("{err:?}")
    };
    // The rest of this minute, then a third of the next one for one of 3 to slide out.
    assert!((20..=80).contains(&retry_after_secs), "{retry_after_secs}");
    assert_eq!(
        err.body(),
        json!({"error": {
            "message": "Rate limit exceeded: the API key's rate limit allows 3 requests per minute",
            "type": "rate_limit_error",
            "param": null,
            "code": "rate_limit_exceeded",
        }})
    );
    let text = metrics_text(&bcx);
    assert!(
        text.contains(r#"gw_rate_limit_checks_total{outcome="allowed"} 3"#),
        "{text}"
    );
    assert!(
        text.contains(r#"gw_rate_limit_checks_total{outcome="limited"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"gw_rate_limit_rejections_total{scope="api_key"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"gw_rate_limit_rejections_total{scope="policy"} 0"#),
        "{text}"
    );
    assert!(!text.contains("k1"), "no ids in labels: {text}");
}

#[tokio::test]
async fn a_workspace_limit_is_shared_by_its_keys_and_named() {
    let (plugin, bcx) = build(Arc::new(plugin_sdk::access::NoAccess));
    let ws = scoped(
        "workspace:ws-1:0",
        limit(RateLimitKind::Requests, RateUnit::Rph, 2.0),
    );
    let a = key_principal("ka", "ws-1", vec![ws.clone()]);
    let b = key_principal("kb", "ws-1", vec![ws]);
    assert!(allowed(&plugin, Some(&a), &[]).await);
    assert!(allowed(&plugin, Some(&b), &[]).await);
    let mut cx = request(Some(&a), "gpt-4o", &[]);
    let err = run(&plugin, &mut cx).await.unwrap_err();
    assert_eq!(
        err.message,
        "Rate limit exceeded: the workspace's rate limit allows 2 requests per hour"
    );
    assert!(metrics_text(&bcx).contains(r#"gw_rate_limit_rejections_total{scope="workspace"} 1"#));
}

#[tokio::test]
async fn a_refused_request_charges_none_of_its_limits() {
    let (plugin, _) = build(Arc::new(plugin_sdk::access::NoAccess));
    let key = scoped("api_key:k1:0", rpm(5.0));
    let tight = key_principal(
        "k1",
        "ws-1",
        vec![key.clone(), scoped("workspace:ws-1:0", rpm(1.0))],
    );
    assert!(allowed(&plugin, Some(&tight), &[]).await);
    for _ in 0..5 {
        assert!(!allowed(&plugin, Some(&tight), &[]).await);
    }
    // The key's own counter was charged once only: four more fit under its limit of 5.
    let loose = key_principal("k1", "ws-1", vec![key]);
    let passed =
        futures_util::future::join_all((0..6).map(|_| allowed(&plugin, Some(&loose), &[])))
            .await
            .into_iter()
            .filter(|ok| *ok)
            .count();
    assert_eq!(passed, 4);
}

#[tokio::test]
async fn a_policy_counts_each_group_by_value_apart() {
    let access = TestAccess::with(vec![policy(
        "pol-1",
        "ws-1",
        Some("per-user"),
        vec![cond("model", "gpt-4*")],
        &["metadata._user"],
        rpm(2.0),
    )]);
    let (plugin, bcx) = build(access);
    let p = key_principal("k1", "ws-1", vec![]);
    let alice = [("_user", "alice")];
    assert!(allowed(&plugin, Some(&p), &alice).await);
    assert!(allowed(&plugin, Some(&p), &alice).await);
    let mut cx = request(Some(&p), "gpt-4o", &alice);
    let err = run(&plugin, &mut cx).await.unwrap_err();
    assert_eq!(
        err.message,
        "Rate limit exceeded: policy per-user allows 2 requests per minute"
    );
    // Another user has a counter of their own.
    assert!(allowed(&plugin, Some(&p), &[("_user", "bob")]).await);
    assert!(allowed(&plugin, Some(&p), &[("_user", "bob")]).await);
    assert!(!allowed(&plugin, Some(&p), &[("_user", "bob")]).await);
    // No _user (or an empty one): not a way around the policy. Such requests share the
    // counter of the empty value.
    assert!(allowed(&plugin, Some(&p), &[]).await);
    assert!(allowed(&plugin, Some(&p), &[("_user", "")]).await);
    assert!(!allowed(&plugin, Some(&p), &[]).await);
    // A model its conditions exclude is not governed.
    for _ in 0..5 {
        assert!(allowed_model(&plugin, Some(&p), "claude-3", &alice).await);
    }
    // Nor is a caller of another workspace, nor one without a Principal.
    let other = key_principal("k2", "ws-2", vec![]);
    for _ in 0..5 {
        assert!(allowed(&plugin, Some(&other), &alice).await);
        assert!(allowed(&plugin, None, &alice).await);
    }
    assert!(metrics_text(&bcx).contains(r#"gw_rate_limit_rejections_total{scope="policy"} 3"#));
}

#[tokio::test]
async fn policies_by_conditions_on_key_and_provider_and_unnamed_policies() {
    let access = TestAccess::with(vec![
        policy(
            "pol-key",
            "ws-1",
            None,
            vec![cond("api_key", "k1"), cond("model", "@openai/*")],
            &["api_key", "model"],
            rpm(1.0),
        ),
        policy(
            "pol-groq",
            "ws-1",
            Some("groq only"),
            vec![cond("provider", "groq")],
            &[],
            rpm(1.0),
        ),
    ]);
    let (plugin, _) = build(access);
    let k1 = key_principal("k1", "ws-1", vec![]);
    assert!(allowed_model(&plugin, Some(&k1), "gpt-4o", &[]).await);
    // A policy without a name is named by its id; the value key separates models.
    let mut cx = request(Some(&k1), "gpt-4o", &[]);
    let err = run(&plugin, &mut cx).await.unwrap_err();
    assert_eq!(
        err.message,
        "Rate limit exceeded: policy pol-key allows 1 request per minute"
    );
    assert!(allowed_model(&plugin, Some(&k1), "gpt-4o-mini", &[]).await);
    // Another key is not governed by pol-key; nobody here goes to groq.
    let k2 = key_principal("k2", "ws-1", vec![]);
    for _ in 0..3 {
        assert!(allowed_model(&plugin, Some(&k2), "gpt-4o", &[]).await);
    }
}

#[tokio::test]
async fn new_policies_apply_as_soon_as_the_store_changes() {
    let access = TestAccess::with(vec![]);
    let (plugin, _) = build(access.clone());
    let p = key_principal("k1", "ws-1", vec![]);
    for _ in 0..3 {
        assert!(allowed(&plugin, Some(&p), &[]).await);
    }
    access.replace(vec![policy(
        "pol-1",
        "ws-1",
        Some("all"),
        vec![cond("workspace_id", "ws-1")],
        &["workspace_id"],
        rpm(1.0),
    )]);
    assert!(allowed(&plugin, Some(&p), &[]).await);
    assert!(!allowed(&plugin, Some(&p), &[]).await);
    // Archived (no longer listed): no longer enforced.
    access.replace(vec![]);
    assert!(allowed(&plugin, Some(&p), &[]).await);
}

/// Polls until `check` holds (a background charge landed), for at most 2 s.
async fn eventually<F, Fut>(mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..200 {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

#[tokio::test]
async fn a_token_limit_is_charged_after_the_response_then_refuses() {
    let (plugin, bcx) = build(Arc::new(plugin_sdk::access::NoAccess));
    let jwt = Principal {
        method: AuthMethod::Jwt,
        api_key_id: None,
        user_id: Some("user-7".into()),
        ..key_principal(
            "unused",
            "ws-1",
            vec![scoped(
                "jwt:user-7:0",
                limit(RateLimitKind::Tokens, RateUnit::Rpm, 100.0),
            )],
        )
    };
    // Checking a token limit charges nothing: any number of requests pass before usage.
    for _ in 0..3 {
        assert!(allowed(&plugin, Some(&jwt), &[]).await);
    }
    let mut cx = request(Some(&jwt), "gpt-4o", &[]);
    run(&plugin, &mut cx).await.unwrap();
    // 150 of 100 spent: refused for at least a third of a minute, even across a window edge.
    cx.response.usage = Some(Usage {
        prompt_tokens: 90,
        completion_tokens: 60,
    });
    plugin.on_log(&cx);
    let refused = eventually(|| async { !allowed(&plugin, Some(&jwt), &[]).await }).await;
    assert!(refused, "the window's tokens are spent: refused");
    let mut cx = request(Some(&jwt), "gpt-4o", &[]);
    let err = run(&plugin, &mut cx).await.unwrap_err();
    assert_eq!(
        err.message,
        "Rate limit exceeded: the token's rate limit allows 100 tokens per minute"
    );
    assert!(metrics_text(&bcx).contains(r#"gw_rate_limit_rejections_total{scope="jwt"} "#));
}

#[tokio::test]
async fn a_request_without_usage_charges_no_tokens() {
    let (plugin, _) = build(Arc::new(plugin_sdk::access::NoAccess));
    let p = key_principal(
        "k1",
        "ws-1",
        vec![scoped(
            "api_key:k1:0",
            limit(RateLimitKind::Tokens, RateUnit::Rpm, 10.0),
        )],
    );
    let mut cx = request(Some(&p), "gpt-4o", &[]);
    run(&plugin, &mut cx).await.unwrap();
    plugin.on_log(&cx); // the provider failed: no usage
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(allowed(&plugin, Some(&p), &[]).await);
}

#[tokio::test]
async fn requests_without_limits_are_not_counted() {
    let (plugin, bcx) = build(Arc::new(plugin_sdk::access::NoAccess));
    assert!(allowed(&plugin, None, &[]).await);
    let p = key_principal("k1", "ws-1", vec![]);
    assert!(allowed(&plugin, Some(&p), &[]).await);
    let text = metrics_text(&bcx);
    assert!(
        text.contains(r#"gw_rate_limit_checks_total{outcome="allowed"} 0"#),
        "{text}"
    );
    assert!(
        text.contains(r#"gw_rate_limit_checks_total{outcome="limited"} 0"#),
        "{text}"
    );
}

/// A backend that always fails.
struct Broken;

#[async_trait::async_trait]
impl Counters for Broken {
    fn name(&self) -> &'static str {
        "broken"
    }
    async fn check_and_charge(
        &self,
        _specs: &[CounterSpec],
        _now_ms: u64,
    ) -> Result<Decision, CounterError> {
        Err(CounterError("down".into()))
    }
    async fn charge(
        &self,
        _id: &str,
        _window_secs: u64,
        _amount: u64,
        _now_ms: u64,
    ) -> Result<(), CounterError> {
        Err(CounterError("down".into()))
    }
}

#[tokio::test]
async fn backend_errors_fail_open_by_default_and_closed_when_asked() {
    let p = key_principal("k1", "ws-1", vec![scoped("api_key:k1:0", rpm(1.0))]);

    let bcx = BuildCx::standalone();
    let open =
        RateLimiter::with_counters(&RateLimitConfig::default(), &bcx, Arc::new(Broken)).unwrap();
    assert!(allowed(&open, Some(&p), &[]).await);
    assert!(allowed(&open, Some(&p), &[]).await);
    let text = metrics_text(&bcx);
    assert!(
        text.contains(r#"gw_rate_limit_checks_total{outcome="error"} 2"#),
        "{text}"
    );
    assert!(
        text.contains(r#"gw_rate_limit_backend_errors_total{op="check"} 2"#),
        "{text}"
    );

    let bcx = BuildCx::standalone();
    let config = RateLimitConfig {
        on_backend_error: OnBackendError::Deny,
        ..RateLimitConfig::default()
    };
    let closed = RateLimiter::with_counters(&config, &bcx, Arc::new(Broken)).unwrap();
    let mut cx = request(Some(&p), "gpt-4o", &[]);
    let err = run(&closed, &mut cx).await.unwrap_err();
    assert_eq!(
        err.kind,
        ErrorKind::RateLimited {
            retry_after_secs: 1
        }
    );
    assert_eq!(err.code.as_deref(), Some("rate_limit_backend_unavailable"));
}

#[tokio::test]
async fn failed_token_charges_are_counted() {
    let bcx = BuildCx::standalone();
    let plugin =
        RateLimiter::with_counters(&RateLimitConfig::default(), &bcx, Arc::new(Broken)).unwrap();
    let p = key_principal(
        "k1",
        "ws-1",
        vec![scoped(
            "api_key:k1:1",
            limit(RateLimitKind::Tokens, RateUnit::Rpm, 10.0),
        )],
    );
    let mut cx = request(Some(&p), "gpt-4o", &[]);
    assert!(run(&plugin, &mut cx).await.is_ok());
    cx.response.usage = Some(Usage {
        prompt_tokens: 1,
        completion_tokens: 1,
    });
    plugin.on_log(&cx);
    let counted = eventually(|| async {
        metrics_text(&bcx).contains(r#"gw_rate_limit_backend_errors_total{op="charge"} 1"#)
    })
    .await;
    assert!(counted, "{}", metrics_text(&bcx));
}

// ---------------------------------------------------------------- saved providers' limits

/// Saved providers of OpenAI by slug, each with its own rate limits.
struct TestProviders(BTreeMap<&'static str, Vec<RateLimit>>);

impl ProviderStore for TestProviders {
    fn provider(&self, slug: &str) -> Option<Arc<plugin_sdk::ProviderRecord>> {
        let limits = self.0.get(slug)?;
        Some(Arc::new(plugin_sdk::ProviderRecord {
            slug: slug.into(),
            provider: "openai".into(),
            rate_limits: limits.clone(),
            ..plugin_sdk::ProviderRecord::default()
        }))
    }
}

/// A plugin over these saved providers (and no policies).
fn build_with_providers(providers: &[(&'static str, Vec<RateLimit>)]) -> (RateLimiter, BuildCx) {
    let cx = BuildCx {
        providers: Arc::new(TestProviders(providers.iter().cloned().collect())),
        ..BuildCx::standalone()
    };
    let plugin = RateLimiter::new(&RateLimitConfig::default(), &cx).expect("builds");
    (plugin, cx)
}

fn saved_target(slug: &str) -> Target {
    Target {
        provider: "openai".into(),
        slug: Some(slug.into()),
        ..Target::default()
    }
}

/// A request by `principal` planned through the saved provider `slug` (`x-gw-provider: @slug`).
fn via(principal: Option<&Principal>, slug: &str) -> RequestCx {
    let mut cx = request(principal, "gpt-4o", &[]);
    cx.plan = Some(RoutePlan::Single(saved_target(slug)));
    cx
}

/// A request routed by a fallback config over saved providers: none is known before routing.
fn by_config(principal: Option<&Principal>) -> RequestCx {
    let mut cx = request(principal, "gpt-4o", &[]);
    cx.plan = Some(RoutePlan::Config(Arc::new(json!({
        "strategy": {"mode": "fallback"},
        "targets": [{"provider": "@shared"}, {"provider": "@backup"}]
    }))));
    cx
}

#[tokio::test]
async fn a_providers_limit_counts_every_caller_and_names_the_provider() {
    let (plugin, bcx) = build_with_providers(&[("shared", vec![rpm(2.0)]), ("free", vec![])]);
    let ann = key_principal("k1", "ws-1", vec![]);
    let bob = key_principal("k2", "ws-2", vec![]);
    run(&plugin, &mut via(Some(&ann), "shared")).await.unwrap();
    run(&plugin, &mut via(Some(&bob), "shared")).await.unwrap();
    // A third caller (no key at all) finds the provider's minute spent.
    let err = run(&plugin, &mut via(None, "shared")).await.unwrap_err();
    assert!(matches!(err.kind, ErrorKind::RateLimited { .. }), "{err:?}");
    assert_eq!(
        err.message,
        "Rate limit exceeded: the provider's rate limit allows 2 requests per minute"
    );
    assert!(metrics_text(&bcx).contains(r#"gw_rate_limit_rejections_total{scope="provider"} 1"#));
    // The same callers through another provider, or a config naming it, are other counters.
    assert!(run(&plugin, &mut via(Some(&ann), "free")).await.is_ok());
    let mut cx = request(Some(&ann), "gpt-4o", &[]);
    cx.plan = Some(RoutePlan::Config(Arc::new(json!({"provider": "@shared"}))));
    assert!(
        run(&plugin, &mut cx).await.is_err(),
        "a config's top-level provider counts"
    );
    let mut cx = request(Some(&ann), "gpt-4o", &[]);
    cx.plan = Some(RoutePlan::Config(Arc::new(
        json!({"virtual_key": "shared"}),
    )));
    assert!(
        run(&plugin, &mut cx).await.is_err(),
        "so does its virtual key"
    );
}

#[tokio::test]
async fn a_config_targets_provider_is_counted_when_routed_once_per_request() {
    let (plugin, bcx) = build_with_providers(&[("shared", vec![rpm(2.0)]), ("backup", vec![])]);
    // Named at on_request, routed there: counted once, not again at on_route.
    let mut cx = via(None, "shared");
    run(&plugin, &mut cx).await.unwrap();
    plugin
        .on_route(&mut cx, &mut saved_target("shared"))
        .await
        .unwrap();
    // Chosen by the router: counted at its first attempt, not at its retries.
    let mut cx = by_config(None);
    run(&plugin, &mut cx).await.unwrap();
    for _ in 0..3 {
        plugin
            .on_route(&mut cx, &mut saved_target("shared"))
            .await
            .expect("one request counted once");
    }
    // The minute is spent: the next request's attempt through it is refused (a fallback
    // group then tries its next target, whose provider has no limit).
    let mut cx = by_config(None);
    run(&plugin, &mut cx).await.unwrap();
    let err = plugin
        .on_route(&mut cx, &mut saved_target("shared"))
        .await
        .unwrap_err();
    assert_eq!(err.status().as_u16(), 429);
    assert!(err.message.contains("the provider's rate limit"), "{err}");
    plugin
        .on_route(&mut cx, &mut saved_target("backup"))
        .await
        .expect("no limit");
    let text = metrics_text(&bcx);
    assert!(
        text.contains(r#"gw_rate_limit_checks_total{outcome="allowed"} 2"#),
        "{text}"
    );
    assert!(
        text.contains(r#"gw_rate_limit_checks_total{outcome="limited"} 1"#),
        "{text}"
    );
}

#[tokio::test]
async fn a_providers_token_limit_is_charged_only_for_answers_through_it() {
    let tokens = limit(RateLimitKind::Tokens, RateUnit::Rpm, 100.0);
    let (plugin, _) = build_with_providers(&[("shared", vec![tokens]), ("backup", vec![])]);
    let usage = Some(Usage {
        prompt_tokens: 90,
        completion_tokens: 60,
    });
    // Tried through `shared`, answered by `backup`: nothing charged to `shared`.
    let mut cx = by_config(None);
    run(&plugin, &mut cx).await.unwrap();
    for slug in ["shared", "backup"] {
        plugin
            .on_route(&mut cx, &mut saved_target(slug))
            .await
            .unwrap();
    }
    cx.response.usage = usage;
    plugin.on_log(&cx);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(run(&plugin, &mut via(None, "shared")).await.is_ok());
    // Answered through it: 150 of 100 spent, refused.
    let mut cx = via(None, "shared");
    run(&plugin, &mut cx).await.unwrap();
    plugin
        .on_route(&mut cx, &mut saved_target("shared"))
        .await
        .unwrap();
    cx.response.usage = usage;
    plugin.on_log(&cx);
    let refused =
        eventually(|| async { run(&plugin, &mut via(None, "shared")).await.is_err() }).await;
    assert!(refused, "the provider's tokens are spent");
}

#[test]
fn config_is_validated_and_unknown_fields_refused() {
    let d = PluginDescriptor::find(RateLimitFactory::KIND).expect("registered");
    assert!(d.check(&json!({})).is_ok());
    assert!(d
        .check(&json!({"backend": "redis", "on_backend_error": "deny", "max_counters": 10}))
        .is_ok());
    let issues = d.check(&json!({"backend": "disk"})).unwrap_err();
    assert_eq!(issues[0].path, "backend");
    let issues = d.check(&json!({"max_counter": 5})).unwrap_err();
    assert!(issues[0].message.contains("max_counter"), "{issues:?}");
    let issues = d.check(&json!({"max_counters": 0})).unwrap_err();
    assert_eq!(issues[0].path, "max_counters");
    let issues = d.check(&json!({"redis_prefix": "a b"})).unwrap_err();
    assert_eq!(issues[0].path, "redis_prefix");
    let issues = d.check(&json!({"redis_timeout_ms": 0})).unwrap_err();
    assert_eq!(issues[0].path, "redis_timeout_ms");
    // The example in `gateway plugins list` is a valid entry.
    let example: serde_json::Value =
        serde_json::to_value(serde_yaml_like(RateLimitFactory::EXAMPLE)).unwrap();
    assert!(d.check(&example).is_ok(), "{example}");
}

/// The example's `key: value` lines as JSON (it is flat YAML).
fn serde_yaml_like(example: &str) -> serde_json::Map<String, serde_json::Value> {
    example
        .lines()
        .filter_map(|l| {
            let l = l.trim_start_matches("- ").split('#').next()?.trim();
            let (k, v) = l.split_once(':')?;
            if k.trim() == "kind" {
                return None;
            }
            let v = v.trim();
            let v = v
                .parse::<u64>()
                .map(serde_json::Value::from)
                .unwrap_or_else(|_| serde_json::Value::from(v));
            Some((k.trim().to_owned(), v))
        })
        .collect()
}

#[test]
fn the_backend_follows_the_config_and_the_redis_url() {
    let none: Arc<dyn AccessStore> = Arc::new(plugin_sdk::access::NoAccess);
    let (auto, _) = build(none.clone());
    assert_eq!(auto.backend(), "memory");

    let with_url = BuildCx {
        redis_url: Some("redis://127.0.0.1:1".into()),
        ..BuildCx::standalone()
    };
    // Built without connecting (there is no server on port 1).
    let auto = RateLimiter::new(&RateLimitConfig::default(), &with_url).unwrap();
    assert_eq!(auto.backend(), "redis");
    let memory = RateLimiter::new(
        &RateLimitConfig {
            backend: Backend::Memory,
            ..RateLimitConfig::default()
        },
        &BuildCx {
            redis_url: Some("redis://127.0.0.1:1".into()),
            ..BuildCx::standalone()
        },
    )
    .unwrap();
    assert_eq!(memory.backend(), "memory");

    let redis = RateLimitConfig {
        backend: Backend::Redis,
        ..RateLimitConfig::default()
    };
    let err = RateLimiter::new(&redis, &BuildCx::standalone())
        .err()
        .expect("no URL");
    assert!(err.contains("GW_REDIS_URL"), "{err}");
    let bad = BuildCx {
        redis_url: Some("nonsense://user:pw@host".into()),
        ..BuildCx::standalone()
    };
    let err = RateLimiter::new(&redis, &bad).err().expect("bad URL");
    assert!(err.contains("GW_REDIS_URL") && !err.contains("pw"), "{err}");
    // Registering twice in one registry is a clear error.
    let err = RateLimiter::new(&RateLimitConfig::default(), &with_url)
        .err()
        .expect("metrics already registered");
    assert!(err.contains("listed twice"), "{err}");
}

#[test]
fn rate_texts() {
    assert_eq!(rate_text(&rpm(10.0)), "10 requests per minute");
    assert_eq!(rate_text(&rpm(1.0)), "1 request per minute");
    assert_eq!(
        rate_text(&limit(RateLimitKind::Tokens, RateUnit::Rpd, 2.5)),
        "2.5 tokens per day"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_pass_exactly_up_to_the_limit() {
    let access = TestAccess::with(vec![policy(
        "pol-1",
        "ws-1",
        Some("shared"),
        vec![],
        &[],
        rpm(25.0),
    )]);
    let (plugin, _) = build(access);
    let plugin = Arc::new(plugin);
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let plugin = plugin.clone();
            tokio::spawn(async move {
                let p = key_principal(&format!("k{}", i % 7), "ws-1", vec![]);
                allowed(&plugin, Some(&p), &[]).await
            })
        })
        .collect();
    let mut passed = 0;
    for t in tasks {
        passed += usize::from(t.await.unwrap());
    }
    assert_eq!(passed, 25);
}

/// Two gateway instances (two plugins, each with its own Redis connection) hold one policy
/// limit exactly under concurrent load, and share token usage.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_share_limits_through_redis() {
    let Some(url) = crate::limits::redis::test_url() else {
        return;
    };
    // Fail loudly if the server is not there.
    crate::limits::redis::test_conn(&url).await;
    two_instances_share_limits(url).await;
}

/// The same through a Redis Cluster of three primaries: each request's counters share its
/// workspace's slot, and the workspaces' slots spread over the nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_share_limits_through_a_redis_cluster() {
    let Some(cluster) = crate::limits::redis::test_cluster() else {
        return;
    };
    two_instances_share_limits(cluster.url.clone()).await;
}

async fn two_instances_share_limits(url: String) {
    let prefix = format!("gw:test:rl:{}:", uuid::Uuid::new_v4());
    let config = RateLimitConfig {
        redis_prefix: prefix,
        redis_timeout_ms: 5_000,
        ..RateLimitConfig::default()
    };
    let policy_id = format!("pol-{}", uuid::Uuid::new_v4());
    let access = TestAccess::with(vec![policy(
        &policy_id,
        "ws-1",
        Some("shared"),
        vec![],
        &["workspace_id"],
        limit(RateLimitKind::Requests, RateUnit::Rpd, 30.0),
    )]);
    let instance = || {
        let cx = BuildCx {
            access: access.clone(),
            redis_url: Some(url.clone()),
            ..BuildCx::standalone()
        };
        let plugin = RateLimiter::new(&config, &cx).expect("builds");
        assert_eq!(plugin.backend(), "redis");
        Arc::new(plugin)
    };
    let (a, b) = (instance(), instance());
    let tasks: Vec<_> = (0..120)
        .map(|i| {
            let plugin = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move {
                let p = key_principal("k1", "ws-1", vec![]);
                allowed(&plugin, Some(&p), &[]).await
            })
        })
        .collect();
    let mut passed = 0;
    for t in tasks {
        passed += usize::from(t.await.unwrap());
    }
    assert_eq!(passed, 30);

    // Tokens charged through one instance are refused by the other.
    let tokens = key_principal(
        "k-tok",
        "ws-2",
        vec![scoped(
            &format!("api_key:{}:0", uuid::Uuid::new_v4()),
            limit(RateLimitKind::Tokens, RateUnit::Rpd, 500.0),
        )],
    );
    let mut cx = request(Some(&tokens), "gpt-4o", &[]);
    run(&a, &mut cx).await.unwrap();
    cx.response.usage = Some(Usage {
        prompt_tokens: 500,
        completion_tokens: 300,
    });
    a.on_log(&cx);
    let refused = eventually(|| async { !allowed(&b, Some(&tokens), &[]).await }).await;
    assert!(refused, "the other instance sees the spent tokens");
}

/// A limiter with room for one live counter and a policy of `limit` per `metadata._user`, and
/// a key of the policy's workspace.
fn one_counter_per_user(limit: RateLimit) -> (RateLimiter, Principal) {
    let access = TestAccess::with(vec![policy(
        "pol-1",
        "ws-1",
        None,
        vec![],
        &["metadata._user"],
        limit,
    )]);
    let config = RateLimitConfig {
        max_counters: 1,
        ..RateLimitConfig::default()
    };
    let (plugin, _) = build_with(access, config);
    (plugin, key_principal("k1", "ws-1", vec![]))
}

#[tokio::test]
async fn full_counters_refuse_whatever_on_backend_error_says() {
    // One live counter at most, and `allow` (meant for a store that is down).
    let (plugin, p) = one_counter_per_user(rpm(100.0));
    let mut cx = request(Some(&p), "gpt-4o", &[("_user", "u1")]);
    run(&plugin, &mut cx).await.expect("the first counter");
    // Made-up users fill no more counters and get no free pass.
    let mut cx = request(Some(&p), "gpt-4o", &[("_user", "made-up")]);
    let err = run(&plugin, &mut cx).await.unwrap_err();
    assert_eq!(err.status().as_u16(), 429);
    assert_eq!(err.code.as_deref(), Some("rate_limit_counters_full"));
    assert!(allowed(&plugin, Some(&p), &[("_user", "u1")]).await);
}

#[tokio::test]
async fn a_full_store_refuses_a_token_limit_for_a_new_value_too() {
    // A tokens-per-minute policy per user; room for one counter, taken by u1's charge.
    let (plugin, p) = one_counter_per_user(limit(RateLimitKind::Tokens, RateUnit::Rpm, 1000.0));
    let mut cx = request(Some(&p), "gpt-4o", &[("_user", "u1")]);
    run(&plugin, &mut cx).await.expect("checked at cost 0");
    cx.response.status = Some(200);
    cx.response.usage = Some(plugin_sdk::Usage {
        prompt_tokens: 5,
        completion_tokens: 5,
    });
    plugin.on_log(&cx);
    // The charge made u1's counter: the store is full.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let mut cx = request(Some(&p), "gpt-4o", &[("_user", "u2")]);
        match run(&plugin, &mut cx).await {
            Err(e) => {
                assert_eq!(e.code.as_deref(), Some("rate_limit_counters_full"));
                break;
            }
            Ok(()) => assert!(std::time::Instant::now() < deadline, "never refused"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut cx = request(Some(&p), "gpt-4o", &[("_user", "u1")]);
    run(&plugin, &mut cx).await.expect("u1 keeps counting");
}
