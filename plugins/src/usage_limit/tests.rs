//! The plugin's phases driven with hand-made requests, a movable clock, a fake access
//! snapshot and a sink that records what reaches the control plane.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use serde_json::{json, Value};

use plugin_sdk::access::{
    AccessStore, ApiKeyRecord, AuthMethod, Budget, Condition, CountedUsage, KeyKind, PeriodicReset,
    UsageKind, UsageLimit, UsageLimitPolicy, WorkspaceRecord,
};
use plugin_sdk::headers::GwHeaders;
use plugin_sdk::llm::LlmRequest;
use plugin_sdk::sinks::{AuditEvent, ControlPlaneSink, LogRecord, UsageCharge};
use plugin_sdk::store::ModelPrice;
use plugin_sdk::{PluginDescriptor, ProviderRecord, Route};

use super::*;

// ---------------------------------------------------------------- fixtures

#[derive(Default)]
struct FakeAccess {
    policies: Mutex<Vec<UsageLimitPolicy>>,
}

impl AccessStore for FakeAccess {
    fn api_key(&self, _digest: &[u8; 32]) -> Option<Arc<ApiKeyRecord>> {
        None
    }
    fn workspace(&self, _id: &str) -> Option<Arc<WorkspaceRecord>> {
        None
    }
    fn rate_limit_policies(&self) -> Arc<[plugin_sdk::access::RateLimitPolicy]> {
        Arc::from(Vec::new())
    }
    fn usage_limit_policies(&self) -> Arc<[UsageLimitPolicy]> {
        Arc::from(self.policies.lock().unwrap().clone())
    }
    fn version(&self) -> i64 {
        1
    }
}

/// Saved providers by slug, which a test may change.
#[derive(Default)]
struct FakeProviders(Mutex<BTreeMap<String, Arc<ProviderRecord>>>);

impl FakeProviders {
    /// Saves a provider of OpenAI with this budget and counted usage.
    fn save(&self, slug: &str, limit: Option<UsageLimit>, counted: CountedUsage) {
        let record = ProviderRecord {
            slug: slug.into(),
            provider: "openai".into(),
            usage_limits: limit,
            counted,
            ..ProviderRecord::default()
        };
        self.0.lock().unwrap().insert(slug.into(), Arc::new(record));
    }
}

impl FakeProviders {
    /// Saves a provider of OpenAI without a budget whose integration prices these models.
    fn save_priced(&self, slug: &str, prices: &[(&str, f64, f64)]) {
        let record = ProviderRecord {
            slug: slug.into(),
            provider: "openai".into(),
            model_prices: prices
                .iter()
                .map(|&(model, input, output)| ModelPrice {
                    model: model.into(),
                    input_per_million: input,
                    output_per_million: output,
                })
                .collect(),
            ..ProviderRecord::default()
        };
        self.0.lock().unwrap().insert(slug.into(), Arc::new(record));
    }
}

impl ProviderStore for FakeProviders {
    fn provider(&self, slug: &str) -> Option<Arc<ProviderRecord>> {
        self.0.lock().unwrap().get(slug).cloned()
    }
}

#[derive(Default)]
struct RecordingSink {
    charges: Mutex<Vec<UsageCharge>>,
    events: Mutex<Vec<AuditEvent>>,
}

#[async_trait]
impl ControlPlaneSink for RecordingSink {
    async fn audit(&self, events: Vec<AuditEvent>) -> Result<(), String> {
        self.events.lock().unwrap().extend(events);
        Ok(())
    }
    async fn charge_usage(&self, charges: Vec<UsageCharge>) -> Result<(), String> {
        self.charges.lock().unwrap().extend(charges);
        Ok(())
    }
    async fn write_logs(&self, _records: Vec<LogRecord>) -> Result<(), String> {
        Ok(())
    }
}

impl RecordingSink {
    fn charged(&self, budget_id: &str) -> f64 {
        self.charges
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.budget_id == budget_id)
            .map(|c| c.amount)
            .sum()
    }

    fn actions(&self) -> Vec<String> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .map(|e| e.action.clone())
            .collect()
    }
}

struct Env {
    plugin: UsageLimitPlugin,
    access: Arc<FakeAccess>,
    providers: Arc<FakeProviders>,
    sink: Arc<RecordingSink>,
    registry: prometheus::Registry,
    now: Arc<Mutex<SystemTime>>,
}

fn at(text: &str) -> SystemTime {
    let secs = plugin_sdk::time::parse_rfc3339(text).expect("a valid time");
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs as u64)
}

fn env_with(config: Value, redis_url: Option<String>) -> Env {
    let access = Arc::new(FakeAccess::default());
    let providers = Arc::new(FakeProviders::default());
    let sink = Arc::new(RecordingSink::default());
    let mut cx = BuildCx::standalone();
    cx.access = access.clone();
    cx.providers = providers.clone();
    cx.sink = sink.clone();
    cx.redis_url = redis_url;
    let registry = cx.metrics.clone();
    let now = Arc::new(Mutex::new(at("2026-03-10T12:00:00Z")));
    let clock_now = now.clone();
    let mut config = config;
    if config.get("flush_interval_ms").is_none() {
        config["flush_interval_ms"] = json!(5);
    }
    let config: UsageLimitConfig = serde_json::from_value(config).expect("a valid config");
    let plugin = UsageLimitPlugin::start(config, &cx, Arc::new(move || *clock_now.lock().unwrap()))
        .expect("built");
    Env {
        plugin,
        access,
        providers,
        sink,
        registry,
        now,
    }
}

fn env() -> Env {
    env_with(json!({"backend": "memory"}), None)
}

fn limit(kind: UsageKind, credit_limit: f64) -> UsageLimit {
    UsageLimit {
        credit_limit,
        kind,
        alert_threshold: None,
        periodic_reset: None,
        periodic_reset_days: None,
        next_usage_reset_at: None,
    }
}

fn budget(id: &str, limit: UsageLimit) -> Budget {
    Budget {
        id: id.into(),
        limit,
        counted: CountedUsage::default(),
    }
}

fn principal(budgets: Vec<Budget>) -> Principal {
    Principal {
        method: AuthMethod::ApiKey(KeyKind::WorkspaceService),
        organisation_id: Some("org-1".into()),
        workspace_id: Some("ws-1".into()),
        api_key_id: Some("key-1".into()),
        user_id: Some("user-1".into()),
        scopes: vec!["completions.write".into()],
        rate_limits: vec![],
        budgets,
    }
}

/// A chat request for gpt-4o through OpenAI, with `max_tokens`.
fn chat(p: Option<Principal>, max_tokens: u64) -> RequestCx {
    let mut cx = RequestCx::new(
        uuid::Uuid::new_v4().to_string(),
        Route::ChatCompletions,
        Method::POST,
        "/v1/chat/completions".into(),
    );
    let body = json!({"model": "gpt-4o", "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "12345678"}]});
    cx.body = Bytes::from(body.to_string());
    cx.request = LlmRequest::decode(cx.route, &cx.body).unwrap();
    cx.plan = Some(RoutePlan::Single(Target {
        provider: "openai".into(),
        ..Target::default()
    }));
    if let Some(p) = p {
        cx.extensions.insert(p);
    }
    cx
}

fn with_metadata(mut cx: RequestCx, metadata: Value) -> RequestCx {
    let mut headers = HeaderMap::new();
    headers.insert("x-gw-metadata", metadata.to_string().parse().unwrap());
    cx.gw = GwHeaders::parse(&headers).unwrap();
    cx
}

/// Runs the response phases of an answer with `usage` (or a failure without) from the
/// planned target (a single one; else OpenAI without a saved provider), then `on_log`.
async fn finish(
    plugin: &UsageLimitPlugin,
    cx: &mut RequestCx,
    status: u16,
    usage: Option<(u64, u64)>,
) {
    let mut target = match &cx.plan {
        Some(RoutePlan::Single(t)) => t.clone(),
        _ => Target {
            provider: "openai".into(),
            ..Target::default()
        },
    };
    plugin.on_route(cx, &mut target).await.unwrap();
    answer(plugin, cx, status, usage).await;
}

/// The answer of the last attempt routed: the response phases, then `on_log`.
async fn answer(
    plugin: &UsageLimitPlugin,
    cx: &mut RequestCx,
    status: u16,
    usage: Option<(u64, u64)>,
) {
    cx.response.status = Some(status);
    cx.response.provider = Some("openai".into());
    cx.response.model = Some("gpt-4o-2024-08-06".into());
    cx.response.usage = usage.map(|(p, c)| Usage {
        prompt_tokens: p,
        completion_tokens: c,
    });
    if (200..300).contains(&status) {
        let mut parts = ResponseParts {
            status: StatusCode::from_u16(status).unwrap(),
            headers: HeaderMap::new(),
            body: Bytes::new(),
        };
        plugin.on_response(cx, &mut parts).await.unwrap();
    }
    plugin.on_log(cx);
}

/// One request answered with `usage`; panics when refused.
async fn spend(plugin: &UsageLimitPlugin, p: &Principal, usage: (u64, u64)) {
    let mut cx = chat(Some(p.clone()), 10);
    plugin.on_request(&mut cx).await.expect("allowed");
    finish(plugin, &mut cx, 200, Some(usage)).await;
}

async fn refused(plugin: &UsageLimitPlugin, cx: &mut RequestCx) -> GatewayError {
    match admit(plugin, cx).await {
        Err(e) => e,
        Ok(_) => panic!("expected a refusal"),
    }
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn metric(registry: &prometheus::Registry, name: &str, label: &str) -> u64 {
    registry
        .gather()
        .iter()
        .filter(|f| f.name() == name)
        .flat_map(|f| f.get_metric().iter())
        .filter(|m| m.get_label().iter().any(|l| l.value() == label))
        .map(|m| m.get_counter().get_value() as u64)
        .sum()
}

// ---------------------------------------------------------------- tests

#[tokio::test]
async fn refuses_with_412_once_spent() {
    let e = env();
    let p = principal(vec![budget(
        "api_key:key-1",
        limit(UsageKind::Requests, 2.0),
    )]);
    spend(&e.plugin, &p, (5, 5)).await;
    spend(&e.plugin, &p, (5, 5)).await;
    let err = refused(&e.plugin, &mut chat(Some(p), 10)).await;
    assert_eq!(err.status(), StatusCode::PRECONDITION_FAILED);
    let body = err.body();
    assert_eq!(
        body["error"]["message"],
        "Usage limit exceeded: the API key's budget has used 2 of 2 requests"
    );
    assert_eq!(body["error"]["code"], "budget_exhausted");
    assert_eq!(body["error"]["param"], Value::Null);
    assert_eq!(
        metric(&e.registry, "gw_usage_limit_rejections_total", "api_key"),
        1
    );
}

#[tokio::test]
async fn requests_without_budgets_pass_untouched() {
    let e = env();
    let mut cx = chat(None, 10);
    assert!(matches!(
        e.plugin.on_request(&mut cx).await.unwrap(),
        Flow::Continue
    ));
    assert!(cx.extensions.get::<Reservation>().is_none());
    finish(&e.plugin, &mut cx, 200, Some((1, 1))).await;
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert!(e.sink.charges.lock().unwrap().is_empty());
}

#[tokio::test]
async fn settling_releases_the_unused_reservation() {
    let e = env();
    let p = principal(vec![budget(
        "api_key:key-1",
        limit(UsageKind::Tokens, 1000.0),
    )]);
    // Reserves 2 prompt tokens + 600.
    let mut first = chat(Some(p.clone()), 600);
    e.plugin.on_request(&mut first).await.unwrap();
    let err = refused(&e.plugin, &mut chat(Some(p.clone()), 600)).await;
    assert_eq!(
        err.message,
        "Usage limit exceeded: the API key's budget has used 0 of 1000 tokens \
         (602 more held by requests in flight), and this request may need up to 602 more"
    );
    finish(&e.plugin, &mut first, 200, Some((40, 60))).await;
    // 100 used: 602 fits again.
    let mut second = chat(Some(p.clone()), 600);
    e.plugin.on_request(&mut second).await.expect("room again");
    finish(&e.plugin, &mut second, 200, Some((400, 490))).await;
    // 990 used: a request of 2 + 10 tokens does not fit.
    let err = refused(&e.plugin, &mut chat(Some(p), 10)).await;
    assert!(
        err.message.contains("has used 990 of 1000 tokens"),
        "{}",
        err.message
    );
    eventually("charges", || e.sink.charged("api_key:key-1") == 990.0).await;
}

#[tokio::test]
async fn a_failed_request_releases_everything() {
    let e = env();
    let p = principal(vec![
        budget("api_key:key-1", limit(UsageKind::Requests, 1.0)),
        budget("workspace:ws-1:0", limit(UsageKind::Tokens, 100.0)),
    ]);
    let mut cx = chat(Some(p.clone()), 50);
    e.plugin.on_request(&mut cx).await.unwrap();
    // While it is in flight, the request budget is full.
    let err = refused(&e.plugin, &mut chat(Some(p.clone()), 50)).await;
    assert!(
        err.message.contains("the API key's budget"),
        "{}",
        err.message
    );
    finish(&e.plugin, &mut cx, 502, None).await;
    // Nothing was spent: both budgets have all their room.
    let mut again = chat(Some(p.clone()), 98);
    e.plugin.on_request(&mut again).await.expect("released");
    finish(&e.plugin, &mut again, 200, Some((2, 3))).await;
    eventually("charges", || e.sink.charged("workspace:ws-1:0") == 5.0).await;
    assert_eq!(e.sink.charged("api_key:key-1"), 1.0);
}

#[tokio::test]
async fn reservations_are_all_or_nothing_across_budgets() {
    let e = env();
    let roomy = budget("api_key:key-1", limit(UsageKind::Requests, 10.0));
    let tight = budget("workspace:ws-1:0", limit(UsageKind::Tokens, 20.0));
    let p = principal(vec![roomy, tight]);
    // 2 + 100 tokens do not fit the workspace's 20: the key's budget must not move.
    for _ in 0..5 {
        let err = refused(&e.plugin, &mut chat(Some(p.clone()), 100)).await;
        assert!(
            err.message
                .starts_with("Usage limit exceeded: the workspace's budget"),
            "{}",
            err.message
        );
    }
    let only_key = principal(vec![budget(
        "api_key:key-1",
        limit(UsageKind::Requests, 1.0),
    )]);
    let mut cx = chat(Some(only_key), 10);
    e.plugin
        .on_request(&mut cx)
        .await
        .expect("the key's budget is untouched");
    assert_eq!(
        metric(&e.registry, "gw_usage_limit_rejections_total", "workspace"),
        5
    );
}

#[tokio::test]
async fn the_period_rollover_starts_a_fresh_counter() {
    let e = env();
    *e.now.lock().unwrap() = at("2026-01-31T23:59:00Z");
    let mut monthly = limit(UsageKind::Requests, 1.0);
    monthly.periodic_reset = Some(PeriodicReset::Monthly);
    let p = principal(vec![budget("api_key:key-1", monthly.clone())]);
    spend(&e.plugin, &p, (1, 1)).await;
    refused(&e.plugin, &mut chat(Some(p.clone()), 10)).await;
    *e.now.lock().unwrap() = at("2026-02-01T00:00:01Z");
    spend(&e.plugin, &p, (1, 1)).await;
    refused(&e.plugin, &mut chat(Some(p), 10)).await;
    // The charges name their periods.
    eventually("two charges", || e.sink.charges.lock().unwrap().len() == 2).await;
    let mut periods: Vec<i64> = e
        .sink
        .charges
        .lock()
        .unwrap()
        .iter()
        .map(|c| c.period)
        .collect();
    periods.sort();
    let jan = monthly.period_at(at("2026-01-15T00:00:00Z"));
    assert_eq!(periods, vec![jan, jan + 1]);
}

#[tokio::test]
async fn a_manual_reset_starts_a_fresh_counter() {
    let e = env();
    let mut b = budget("api_key:key-1", limit(UsageKind::Requests, 1.0));
    spend(&e.plugin, &principal(vec![b.clone()]), (1, 1)).await;
    refused(&e.plugin, &mut chat(Some(principal(vec![b.clone()])), 10)).await;
    // The control plane reset it: the epoch moves, its counted usage is 0.
    b.counted = CountedUsage {
        current_usage: 0.0,
        period: 0,
        reset_epoch: 1,
    };
    spend(&e.plugin, &principal(vec![b.clone()]), (1, 1)).await;
    refused(&e.plugin, &mut chat(Some(principal(vec![b])), 10)).await;
    eventually("two charges", || e.sink.charges.lock().unwrap().len() == 2).await;
    let mut epochs: Vec<i64> = e
        .sink
        .charges
        .lock()
        .unwrap()
        .iter()
        .map(|c| c.reset_epoch)
        .collect();
    epochs.sort();
    assert_eq!(epochs, vec![0, 1]);
}

#[tokio::test]
async fn counters_start_from_what_the_control_plane_counted() {
    let e = env();
    let mut weekly = limit(UsageKind::Requests, 10.0);
    weekly.periodic_reset = Some(PeriodicReset::Weekly);
    let period = weekly.period_at(*e.now.lock().unwrap());
    let mut b = budget("api_key:key-1", weekly);
    b.counted = CountedUsage {
        current_usage: 9.0,
        period,
        reset_epoch: 0,
    };
    let p = principal(vec![b.clone()]);
    spend(&e.plugin, &p, (1, 1)).await;
    let err = refused(&e.plugin, &mut chat(Some(p), 10)).await;
    assert!(err.message.contains("has used 10 of 10"), "{}", err.message);
    // Usage counted in an earlier week does not count.
    let mut old = b.clone();
    old.id = "api_key:key-2".into();
    old.counted.period = period - 1;
    let p = principal(vec![old]);
    for _ in 0..10 {
        spend(&e.plugin, &p, (1, 1)).await;
    }
    refused(&e.plugin, &mut chat(Some(p), 10)).await;
}

#[tokio::test]
async fn raising_the_credit_limit_reactivates_at_once() {
    let e = env();
    let b = budget("workspace:ws-1:0", limit(UsageKind::Requests, 1.0));
    spend(&e.plugin, &principal(vec![b.clone()]), (1, 1)).await;
    let err = refused(&e.plugin, &mut chat(Some(principal(vec![b.clone()])), 10)).await;
    assert!(
        err.message
            .contains("the workspace's budget has used 1 of 1"),
        "{}",
        err.message
    );
    let mut raised = b;
    raised.limit.credit_limit = 2.0;
    spend(&e.plugin, &principal(vec![raised.clone()]), (1, 1)).await;
    refused(&e.plugin, &mut chat(Some(principal(vec![raised])), 10)).await;
}

#[tokio::test]
async fn alert_and_exhaustion_events_are_sent_once() {
    let e = env();
    let mut l = limit(UsageKind::Requests, 3.0);
    l.alert_threshold = Some(2.0);
    let p = principal(vec![budget("api_key:key-1", l)]);
    spend(&e.plugin, &p, (1, 1)).await;
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert!(e.sink.actions().is_empty(), "below the threshold");
    spend(&e.plugin, &p, (1, 1)).await;
    eventually("the alert", || e.sink.actions() == ["usage_limits.alert"]).await;
    spend(&e.plugin, &p, (1, 1)).await;
    eventually("exhaustion", || e.sink.actions().len() == 2).await;
    refused(&e.plugin, &mut chat(Some(p.clone()), 10)).await;
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(
        e.sink.actions(),
        ["usage_limits.alert", "usage_limits.exhausted"]
    );
    let events = e.sink.events.lock().unwrap().clone();
    let alert = &events[0];
    assert_eq!(alert.resource_type, "api_key");
    assert_eq!(alert.resource_id.as_deref(), Some("key-1"));
    assert_eq!(alert.organisation_id.as_deref(), Some("org-1"));
    assert_eq!(alert.workspace_id.as_deref(), Some("ws-1"));
    assert_eq!(alert.user_id.as_deref(), Some("user-1"));
    assert_eq!(alert.uri, "/v1/chat/completions");
    assert_eq!(alert.method, "POST");
    assert_eq!(alert.status, 200);
    uuid::Uuid::parse_str(&alert.request_id).expect("the request's trace id");
    assert_eq!(events[1].user_id.as_deref(), Some("user-1"));
    assert_eq!(alert.details["current_usage"], 2.0);
    assert_eq!(alert.details["alert_threshold"], 2.0);
    assert_eq!(events[1].details["current_usage"], 3.0);
    assert_eq!(
        metric(&e.registry, "gw_usage_limit_alerts_total", "alert"),
        1
    );
    assert_eq!(
        metric(&e.registry, "gw_usage_limit_alerts_total", "exhausted"),
        1
    );
}

#[tokio::test]
async fn cost_budgets_are_priced_and_charged() {
    let e = env_with(
        json!({"backend": "memory", "prices": [
            {"provider": "openai", "model": "gpt-4o", "input_per_million": 1000000, "output_per_million": 2000000}
        ]}),
        None,
    );
    // $1 per prompt token, $2 per completion token.
    let p = principal(vec![budget("api_key:key-1", limit(UsageKind::Cost, 30.0))]);
    let mut cx = chat(Some(p.clone()), 10);
    e.plugin.on_request(&mut cx).await.unwrap();
    // Reserved: 2 prompt tokens + 10 completion = $22; another such request does not fit.
    let err = refused(&e.plugin, &mut chat(Some(p.clone()), 10)).await;
    assert!(
        err.message.contains("has used 0 of 30 USD (22 more held"),
        "{}",
        err.message
    );
    finish(&e.plugin, &mut cx, 200, Some((3, 2))).await;
    assert_eq!(cx.response.cost, Some(7.0), "on_response prices the answer");
    eventually("the charge", || e.sink.charged("api_key:key-1") == 7.0).await;
    let charge = e.sink.charges.lock().unwrap()[0].clone();
    assert_eq!(charge.value_key, "");
    assert_eq!(charge.period, 0);
    // 7 used: 22 fits.
    let mut cx = chat(Some(p), 10);
    e.plugin.on_request(&mut cx).await.expect("room");
}

#[tokio::test]
async fn a_saved_providers_prices_apply_through_it() {
    let e = env_with(
        json!({"backend": "memory", "prices": [
            {"slug": "cheap", "model": "gpt-4o", "input_per_million": 0, "output_per_million": 0}
        ]}),
        None,
    );
    let mut cx = chat(None, 10);
    let mut target = Target {
        provider: "openai".into(),
        slug: Some("cheap".into()),
        ..Target::default()
    };
    e.plugin.on_route(&mut cx, &mut target).await.unwrap();
    cx.response.provider = Some("openai".into());
    cx.response.usage = Some(Usage {
        prompt_tokens: 1_000_000,
        completion_tokens: 0,
    });
    let mut parts = ResponseParts {
        status: StatusCode::OK,
        headers: HeaderMap::new(),
        body: Bytes::new(),
    };
    e.plugin.on_response(&mut cx, &mut parts).await.unwrap();
    assert_eq!(cx.response.cost, Some(0.0));
    // Without the slug: the shipped price.
    let mut cx = chat(None, 10);
    cx.response.provider = Some("openai".into());
    cx.response.usage = Some(Usage {
        prompt_tokens: 1_000_000,
        completion_tokens: 0,
    });
    let mut chunk = Chunk { data: Bytes::new() };
    e.plugin.on_chunk(&mut cx, &mut chunk).unwrap();
    assert_eq!(cx.response.cost, Some(2.5));
}

#[tokio::test]
async fn an_integrations_prices_come_before_the_yaml_and_the_table() {
    let e = env_with(
        json!({"backend": "memory", "prices": [
            {"slug": "priced", "model": "gpt-4o", "input_per_million": 5, "output_per_million": 5},
            {"slug": "yaml-priced", "model": "gpt-4o", "input_per_million": 4, "output_per_million": 4},
            {"provider": "openai", "model": "gpt-4o", "input_per_million": 3, "output_per_million": 3}
        ]}),
        None,
    );
    // Through @priced: $1 per prompt token, $2 per completion token, from its integration.
    e.providers
        .save_priced("priced", &[("gpt-4o", 1_000_000.0, 2_000_000.0)]);
    // Its integration prices another model only: the YAML's slug row applies.
    e.providers
        .save_priced("yaml-priced", &[("other-model", 9.0, 9.0)]);
    e.providers.save_priced("unpriced", &[]);
    let p = principal(vec![budget("api_key:key-1", limit(UsageKind::Cost, 30.0))]);
    let mut cx = through(chat(Some(p.clone()), 10), "priced");
    e.plugin.on_request(&mut cx).await.unwrap();
    // The estimate is priced the integration's way: 2 prompt + 10 completion tokens = $22.
    let err = refused(&e.plugin, &mut through(chat(Some(p.clone()), 10), "priced")).await;
    assert!(
        err.message.contains("has used 0 of 30 USD (22 more held"),
        "{}",
        err.message
    );
    // The answer's dated model is priced by the listed `gpt-4o`.
    finish(&e.plugin, &mut cx, 200, Some((3, 2))).await;
    assert_eq!(cx.response.cost, Some(7.0));
    eventually("the charge", || e.sink.charged("api_key:key-1") == 7.0).await;

    let million = Some((1_000_000, 0));
    for (slug, want) in [("yaml-priced", 4.0), ("unpriced", 3.0)] {
        let mut cx = through(chat(None, 10), slug);
        finish(&e.plugin, &mut cx, 200, million).await;
        assert_eq!(cx.response.cost, Some(want), "through @{slug}");
    }
    // Without the YAML's rows, the shipped table: gpt-4o costs $2.5 per million input tokens.
    let e = env();
    e.providers.save_priced("unpriced", &[]);
    let mut cx = through(chat(None, 10), "unpriced");
    finish(&e.plugin, &mut cx, 200, million).await;
    assert_eq!(cx.response.cost, Some(2.5));
}

#[tokio::test]
async fn cache_hits_cost_no_tokens() {
    let e = env();
    let p = principal(vec![
        budget("api_key:key-1", limit(UsageKind::Tokens, 1000.0)),
        budget("workspace:ws-1:0", limit(UsageKind::Requests, 1000.0)),
    ]);
    let mut cx = chat(Some(p), 10);
    e.plugin.on_request(&mut cx).await.unwrap();
    cx.response.cache_status = Some("HIT");
    finish(&e.plugin, &mut cx, 200, Some((10, 10))).await;
    eventually("the request charge", || {
        e.sink.charged("workspace:ws-1:0") == 1.0
    })
    .await;
    assert_eq!(e.sink.charged("api_key:key-1"), 0.0);
}

fn policy(
    id: &str,
    workspace: &str,
    conditions: Vec<Condition>,
    group_by: &[&str],
) -> UsageLimitPolicy {
    UsageLimitPolicy {
        id: id.into(),
        organisation_id: "org-1".into(),
        workspace_id: workspace.into(),
        name: Some("per-user cap".into()),
        conditions,
        group_by: group_by.iter().map(|g| g.to_string()).collect(),
        limit: limit(UsageKind::Requests, 1.0),
        usage: BTreeMap::new(),
    }
}

#[tokio::test]
async fn policies_count_per_group_by_value() {
    let e = env();
    let any_user = Condition {
        key: "metadata._user".into(),
        value: "*".into(),
        excludes: Some(vec!["root".into()]),
    };
    let mut counted = policy("pol-1", "ws-1", vec![any_user], &["metadata._user"]);
    // The control plane already counted bob's request of this lifetime budget.
    counted.usage.insert(
        "metadata._user:bob".into(),
        CountedUsage {
            current_usage: 1.0,
            period: 0,
            reset_epoch: 0,
        },
    );
    *e.access.policies.lock().unwrap() = vec![counted, policy("pol-other-ws", "ws-2", vec![], &[])];
    let request =
        |user: &str| with_metadata(chat(Some(principal(vec![])), 10), json!({"_user": user}));

    let mut cx = request("alice");
    e.plugin.on_request(&mut cx).await.expect("alice's first");
    finish(&e.plugin, &mut cx, 200, Some((1, 1))).await;
    let err = refused(&e.plugin, &mut request("alice")).await;
    assert_eq!(
        err.message,
        "Usage limit exceeded: usage limits policy \"per-user cap\" for metadata._user:alice \
         has used 1 of 1 requests"
    );
    let err = refused(&e.plugin, &mut request("bob")).await;
    assert!(
        err.message.contains("metadata._user:bob"),
        "{}",
        err.message
    );
    // Excluded and absent users, and other workspaces, are not governed.
    for mut cx in [request("root"), chat(Some(principal(vec![])), 10), {
        let mut p = principal(vec![]);
        p.workspace_id = Some("ws-3".into());
        with_metadata(chat(Some(p), 10), json!({"_user": "alice"}))
    }] {
        e.plugin.on_request(&mut cx).await.expect("not governed");
        assert!(cx.extensions.get::<Reservation>().is_none());
    }
    eventually("alice's charge", || e.sink.charged("policy:pol-1") == 1.0).await;
    let charge = e.sink.charges.lock().unwrap()[0].clone();
    assert_eq!(charge.value_key, "metadata._user:alice");

    // A policy grouped by a key without conditions on it governs requests without a value
    // too: they share the entity of the empty value.
    *e.access.policies.lock().unwrap() = vec![policy("pol-2", "ws-1", vec![], &["metadata._user"])];
    let mut cx = chat(Some(principal(vec![])), 10);
    e.plugin
        .on_request(&mut cx)
        .await
        .expect("the first without a user");
    finish(&e.plugin, &mut cx, 200, Some((1, 1))).await;
    let err = refused(&e.plugin, &mut request("")).await;
    assert!(
        err.message.contains("for metadata._user:"),
        "{}",
        err.message
    );
    assert_eq!(
        metric(&e.registry, "gw_usage_limit_rejections_total", "policy"),
        3
    );
}

#[tokio::test]
async fn a_store_failure_allows_or_refuses_as_configured() {
    // Nothing listens on port 1: the connection is refused at once.
    let url = Some("redis://127.0.0.1:1".to_string());
    let p = principal(vec![budget(
        "api_key:key-1",
        limit(UsageKind::Requests, 1.0),
    )]);
    let allow = env_with(json!({"backend": "redis"}), url.clone());
    let mut cx = chat(Some(p.clone()), 10);
    admit(&allow.plugin, &mut cx)
        .await
        .expect("allowed unchecked");
    assert_eq!(
        metric(
            &allow.registry,
            "gw_usage_limit_backend_errors_total",
            "reserve"
        ),
        1
    );
    let refuse = env_with(
        json!({"backend": "redis", "on_backend_error": "refuse"}),
        url,
    );
    let err = refused(&refuse.plugin, &mut chat(Some(p), 10)).await;
    assert_eq!(err.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(err.message.contains("usage limit store"), "{}", err.message);
}

#[test]
fn config_is_validated_naming_the_field() {
    let d = PluginDescriptor::find("usage_limit").expect("registered");
    assert!(d.check(&json!({})).is_ok());
    let paths = |config: Value| -> Vec<String> {
        d.check(&config)
            .unwrap_err()
            .into_iter()
            .map(|i| i.path)
            .collect()
    };
    assert_eq!(paths(json!({"backend": "disk"})), vec!["backend"]);
    assert_eq!(paths(json!({"bogus": 1})), vec!["bogus"]);
    assert_eq!(paths(json!({"queue_capacity": 0})), vec!["queue_capacity"]);
    assert_eq!(
        paths(json!({"default_completion_tokens": 5_000_000})),
        vec!["default_completion_tokens"]
    );
    assert_eq!(
        paths(json!({"flush_interval_ms": 0})),
        vec!["flush_interval_ms"]
    );
    assert_eq!(paths(json!({"key_prefix": ""})), vec!["key_prefix"]);
    assert_eq!(
        paths(json!({"prices": [
            {"provider": "openai", "model": "m", "input_per_million": 1, "output_per_million": 1},
            {"model": "m", "input_per_million": 1, "output_per_million": -1}
        ]})),
        vec!["prices[1]", "prices[1].output_per_million"]
    );
    assert_eq!(
        paths(json!({"prices": [{"provider": "p", "model": "m", "input_per_million": 1}]})),
        vec!["prices[0]"]
    );
}

#[test]
fn a_redis_backend_needs_a_redis_url() {
    let d = PluginDescriptor::find("usage_limit").expect("registered");
    let err = d
        .build(&json!({"backend": "redis"}), &BuildCx::standalone())
        .err()
        .expect("refused");
    assert!(err[0].message.contains("GW_REDIS_URL"), "{err:?}");
    assert!(d.build(&json!({}), &BuildCx::standalone()).is_ok());
}

#[test]
fn counters_expire_after_their_period() {
    let mut l = limit(UsageKind::Cost, 1.0);
    assert_eq!(ttl_of(&l), Some(Duration::from_secs(30 * DAY)));
    l.periodic_reset = Some(PeriodicReset::Weekly);
    assert_eq!(ttl_of(&l), Some(Duration::from_secs(8 * DAY)));
    l.periodic_reset_days = Some(3);
    assert_eq!(ttl_of(&l), Some(Duration::from_secs(4 * DAY)));
}

// ---------------------------------------------------------------- saved providers' budgets

/// `cx` planned through the saved provider `slug` (`x-gw-provider: @slug`).
fn through(mut cx: RequestCx, slug: &str) -> RequestCx {
    cx.plan = Some(RoutePlan::Single(saved_target(slug)));
    cx
}

/// The target of a saved provider of OpenAI.
fn saved_target(slug: &str) -> Target {
    Target {
        provider: "openai".into(),
        slug: Some(slug.into()),
        ..Target::default()
    }
}

/// A fallback config over two saved providers: no provider is known before routing.
fn fallback_plan() -> Option<RoutePlan> {
    Some(RoutePlan::Config(Arc::new(json!({
        "strategy": {"mode": "fallback"},
        "targets": [{"provider": "@capped"}, {"provider": "@backup"}]
    }))))
}

#[tokio::test]
async fn a_saved_providers_budget_holds_for_every_caller() {
    let e = env();
    // 20 tokens; each request below reserves 2 + 10 and spends 8.
    e.providers.save(
        "capped",
        Some(limit(UsageKind::Tokens, 20.0)),
        CountedUsage::default(),
    );
    e.providers.save("free", None, CountedUsage::default());
    // A key's request and one with no caller at all share the provider's budget.
    for p in [Some(principal(vec![])), None] {
        let mut cx = through(chat(p, 10), "capped");
        e.plugin.on_request(&mut cx).await.expect("room");
        finish(&e.plugin, &mut cx, 200, Some((4, 4))).await;
    }
    let mut cx = through(chat(Some(principal(vec![])), 10), "capped");
    let err = refused(&e.plugin, &mut cx).await;
    assert_eq!(err.status(), StatusCode::PRECONDITION_FAILED);
    assert_eq!(
        err.message,
        "Usage limit exceeded: the provider @capped's budget has used 16 of 20 tokens, \
         and this request may need up to 12 more"
    );
    assert_eq!(
        metric(&e.registry, "gw_usage_limit_rejections_total", "provider"),
        1
    );
    // A provider without a budget holds nothing.
    let mut cx = through(chat(None, 10), "free");
    e.plugin.on_request(&mut cx).await.expect("no budget");
    assert!(cx.extensions.get::<Reservation>().is_none());
    // The spend reaches the control plane under the provider's counter id.
    eventually("the provider's charges", || {
        e.sink.charged("provider:capped") == 16.0
    })
    .await;
    assert!(e
        .sink
        .charges
        .lock()
        .unwrap()
        .iter()
        .all(|c| c.budget_id == "provider:capped" && c.value_key.is_empty()));
}

#[tokio::test]
async fn a_config_naming_a_provider_reserves_from_its_counted_usage() {
    let e = env();
    // The control plane already counted 10 of the provider's 20 tokens.
    e.providers.save(
        "capped",
        Some(limit(UsageKind::Tokens, 20.0)),
        CountedUsage {
            current_usage: 10.0,
            period: 0,
            reset_epoch: 0,
        },
    );
    let mut cx = chat(None, 10);
    cx.plan = Some(RoutePlan::Config(Arc::new(json!({"provider": "@capped"}))));
    let err = refused(&e.plugin, &mut cx).await;
    assert!(
        err.message
            .contains("the provider @capped's budget has used 10 of 20 tokens"),
        "{}",
        err.message
    );
    // The legacy form names the same provider; 2 + 8 tokens fit exactly.
    let mut cx = chat(None, 8);
    cx.plan = Some(RoutePlan::Config(Arc::new(
        json!({"virtual_key": "capped"}),
    )));
    e.plugin.on_request(&mut cx).await.expect("fits");
    let held = cx.extensions.get::<Reservation>().expect("held");
    assert_eq!(held.items.len(), 1);
    assert_eq!(held.items[0].0.budget_id, "provider:capped");
    assert_eq!(held.items[0].1, 10.0);
}

#[tokio::test]
async fn a_config_target_reserves_its_providers_budget_when_routed() {
    let e = env();
    e.providers.save(
        "capped",
        Some(limit(UsageKind::Tokens, 20.0)),
        CountedUsage::default(),
    );
    let mut first = chat(None, 10);
    first.plan = fallback_plan();
    e.plugin.on_request(&mut first).await.unwrap();
    assert!(first.extensions.get::<Reservation>().is_none());
    // Held at the first attempt through it, once however many retries follow.
    for _ in 0..3 {
        e.plugin
            .on_route(&mut first, &mut saved_target("capped"))
            .await
            .expect("room");
    }
    assert_eq!(
        first.extensions.get::<Reservation>().unwrap().items.len(),
        1
    );
    // Meanwhile another request's attempt through it has no room: a 412 for that attempt.
    let mut second = chat(None, 10);
    second.plan = fallback_plan();
    e.plugin.on_request(&mut second).await.unwrap();
    let err = e
        .plugin
        .on_route(&mut second, &mut saved_target("capped"))
        .await
        .unwrap_err();
    assert_eq!(err.status(), StatusCode::PRECONDITION_FAILED);
    assert_eq!(
        err.message,
        "Usage limit exceeded: the provider @capped's budget has used 0 of 20 tokens \
         (12 more held by requests in flight), and this request may need up to 12 more"
    );
    // It falls back to a provider without a budget, which answers.
    e.plugin
        .on_route(&mut second, &mut saved_target("backup"))
        .await
        .expect("no budget");
    answer(&e.plugin, &mut second, 200, Some((4, 4))).await;
    // The first one is answered through `capped`: 8 spent, the rest released.
    answer(&e.plugin, &mut first, 200, Some((4, 4))).await;
    eventually("the provider's charge", || {
        e.sink.charged("provider:capped") == 8.0
    })
    .await;
    let mut third = chat(None, 10);
    third.plan = fallback_plan();
    e.plugin.on_request(&mut third).await.unwrap();
    e.plugin
        .on_route(&mut third, &mut saved_target("capped"))
        .await
        .expect("8 used: 12 fit");
}

#[tokio::test]
async fn a_provider_given_up_for_another_target_is_charged_nothing() {
    let e = env();
    e.providers.save(
        "capped",
        Some(limit(UsageKind::Tokens, 20.0)),
        CountedUsage::default(),
    );
    let p = principal(vec![budget(
        "api_key:key-1",
        limit(UsageKind::Tokens, 1000.0),
    )]);
    let mut cx = chat(Some(p), 10);
    cx.plan = fallback_plan();
    e.plugin.on_request(&mut cx).await.unwrap();
    // `capped` is tried (12 held) and fails; `backup` answers.
    e.plugin
        .on_route(&mut cx, &mut saved_target("capped"))
        .await
        .unwrap();
    e.plugin
        .on_route(&mut cx, &mut saved_target("backup"))
        .await
        .unwrap();
    answer(&e.plugin, &mut cx, 200, Some((4, 4))).await;
    eventually("the key's charge", || {
        e.sink.charged("api_key:key-1") == 8.0
    })
    .await;
    assert_eq!(e.sink.charged("provider:capped"), 0.0);
    // Its reservation was released: 2 + 18 tokens fit its whole budget.
    let mut cx = through(chat(None, 18), "capped");
    e.plugin.on_request(&mut cx).await.expect("all 20 free");
}

#[tokio::test]
async fn a_cache_hit_costs_the_provider_nothing() {
    let e = env();
    e.providers.save(
        "capped",
        Some(limit(UsageKind::Tokens, 20.0)),
        CountedUsage::default(),
    );
    let mut cx = through(chat(None, 18), "capped");
    e.plugin.on_request(&mut cx).await.unwrap();
    // Answered from the cache: never routed.
    cx.response.cache_status = Some("HIT");
    answer(&e.plugin, &mut cx, 200, Some((10, 10))).await;
    let mut cx = through(chat(None, 18), "capped");
    e.plugin.on_request(&mut cx).await.expect("released");
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(e.sink.charged("provider:capped"), 0.0);
}

/// `on_request`, then what the pipeline does next: complete the Redis reservation the plugin
/// deferred.
async fn admit(plugin: &UsageLimitPlugin, cx: &mut RequestCx) -> Result<Flow, GatewayError> {
    let flow = plugin.on_request(cx).await?;
    cx.complete_deferred().await?;
    Ok(flow)
}

/// `GW_TEST_REDIS_URL` and a connection to it, or `None` (the test is skipped) when unset;
/// panics when it is set and Redis does not answer.
async fn test_redis() -> Option<(String, ::redis::aio::MultiplexedConnection)> {
    let url = crate::limits::redis::test_url()?;
    let client = ::redis::Client::open(url.as_str()).expect("GW_TEST_REDIS_URL is a Redis URL");
    let conn = client
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("GW_TEST_REDIS_URL is set but Redis is unreachable: {e}"));
    Some((url, conn))
}

/// Deletes the test's keys (those under `prefix`); returns how many there were.
async fn delete_keys(conn: &mut ::redis::aio::MultiplexedConnection, prefix: &str) -> usize {
    let keys: Vec<String> = ::redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(conn)
        .await
        .unwrap();
    if !keys.is_empty() {
        let _: () = ::redis::cmd("DEL")
            .arg(&keys)
            .query_async(conn)
            .await
            .unwrap();
    }
    keys.len()
}

/// Two plugins over one Redis stand for two gateway instances.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_share_a_budget_in_redis() {
    let Some((url, mut conn)) = test_redis().await else {
        return;
    };
    let prefix = two_instances_share_a_budget(url.clone()).await;
    assert!(delete_keys(&mut conn, &prefix).await > 0);
}

/// The same through a Redis Cluster of three primaries (settlements grouped by slot).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_share_a_budget_in_a_redis_cluster() {
    let Some(cluster) = crate::limits::redis::test_cluster() else {
        return;
    };
    two_instances_share_a_budget(cluster.url.clone()).await;
}

/// Runs the budget exactness checks through `url`; returns the counters' key prefix.
async fn two_instances_share_a_budget(url: String) -> String {
    let prefix = format!("gw:test:{}:", uuid::Uuid::new_v4());
    let config = json!({"backend": "redis", "key_prefix": prefix, "on_backend_error": "refuse"});
    let a = Arc::new(env_with(config.clone(), Some(url.clone())));
    let b = Arc::new(env_with(config, Some(url)));
    let p = principal(vec![budget(
        "api_key:key-1",
        limit(UsageKind::Tokens, 300.0),
    )]);
    // Each request reserves 2 + 10 tokens and spends 10: at most 25 reservations fit at once.
    let mut tasks = Vec::new();
    for i in 0..60 {
        let e = if i % 2 == 0 { a.clone() } else { b.clone() };
        let p = p.clone();
        tasks.push(tokio::spawn(async move {
            let mut cx = chat(Some(p), 10);
            match admit(&e.plugin, &mut cx).await {
                Ok(_) => Some(cx),
                Err(err) => {
                    assert_eq!(err.status(), StatusCode::PRECONDITION_FAILED, "{err}");
                    None
                }
            }
        }));
    }
    let mut held = Vec::new();
    for t in tasks {
        if let Some(cx) = t.await.unwrap() {
            held.push(cx);
        }
    }
    assert_eq!(
        held.len(),
        25,
        "300 tokens hold exactly 25 reservations of 12"
    );
    // Settle them all (5 + 5 each): 250 used; 50 left = 4 more reservations.
    for (i, mut cx) in held.into_iter().enumerate() {
        let e = if i % 2 == 0 { &a } else { &b };
        finish(&e.plugin, &mut cx, 200, Some((5, 5))).await;
    }
    let total = || a.sink.charged("api_key:key-1") + b.sink.charged("api_key:key-1");
    eventually("every charge", || total() == 250.0).await;
    let mut granted = 0;
    for i in 0..10 {
        let e = if i % 2 == 0 { &a } else { &b };
        if admit(&e.plugin, &mut chat(Some(p.clone()), 10))
            .await
            .is_ok()
        {
            granted += 1;
        }
    }
    assert_eq!(granted, 4);
    prefix
}

/// A request of 12 estimated tokens by `p`: when admitted, answered at once spending its
/// estimate (true); else a 412 (false).
async fn spend_or_412(plugin: &UsageLimitPlugin, p: Principal) -> bool {
    let mut cx = chat(Some(p), 10);
    match admit(plugin, &mut cx).await {
        Ok(_) => {
            finish(plugin, &mut cx, 200, Some((2, 10))).await;
            true
        }
        Err(err) => {
            assert_eq!(err.status(), StatusCode::PRECONDITION_FAILED, "{err}");
            false
        }
    }
}

/// Settlements that Redis takes long to apply still never let spend pass the limit: each
/// request's reservation keeps counting until its settlement lands, so the requests sent
/// meanwhile are refused, not admitted against spend that is not written yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_settlement_never_lets_spend_pass_the_limit() {
    let Some((url, mut conn)) = test_redis().await else {
        return;
    };
    // Redis slow to settle: every write carrying a settlement (its token key) is held.
    let slow = crate::limits::redis::test_proxy(&url, |chunk| {
        if memchr::memmem::find(chunk, b"settled:").is_some() {
            Duration::from_millis(600)
        } else {
            Duration::ZERO
        }
    })
    .await;
    let prefix = format!("gw:test:{}:", uuid::Uuid::new_v4());
    let config = json!({"backend": "redis", "key_prefix": prefix, "on_backend_error": "refuse"});
    let e = Arc::new(env_with(config, Some(slow)));
    let budget_id = format!("api_key:{}", uuid::Uuid::new_v4());
    let p = principal(vec![budget(&budget_id, limit(UsageKind::Tokens, 300.0))]);
    // Each request is estimated at 12 tokens (2 of prompt, 10 of max_tokens) and spends 12
    // as soon as it is admitted: the limit holds exactly 25.
    let wave = |n: usize| {
        let tasks: Vec<_> = (0..n)
            .map(|_| {
                let (e, p) = (e.clone(), p.clone());
                tokio::spawn(async move { spend_or_412(&e.plugin, p).await })
            })
            .collect::<Vec<_>>();
        async move {
            let mut admitted = 0;
            for t in tasks {
                admitted += usize::from(t.await.unwrap());
            }
            admitted
        }
    };
    let mut admitted = wave(40).await;
    assert_eq!(admitted, 25);
    // The settlements are held back: the counter shows the reservations, and no spend.
    let keys: Vec<String> = ::redis::cmd("KEYS")
        .arg(format!("{prefix}*{budget_id}:*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    let (used, held): (f64, f64) = ::redis::cmd("HMGET")
        .arg(&keys[0])
        .arg("used")
        .arg("held")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!((used, held), (0.0, 300.0), "settlements not written yet");
    assert_eq!(e.sink.charged(&budget_id), 0.0);
    // Requests keep coming while the settlements wait, and after they land.
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(1500) {
        admitted += wave(8).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // One request's estimate is the most the limit may be passed by; here it is not passed.
    assert!(admitted * 12 <= 300 + 12, "{admitted} admitted");
    assert_eq!(admitted, 25);
    eventually("every settlement", || e.sink.charged(&budget_id) == 300.0).await;
    delete_keys(&mut conn, &prefix).await;
}

/// Organisations spread over a Redis Cluster's slots: each request is admitted in its
/// organisation's slot, and a batch of settlements from several organisations is written one
/// script call per slot; every organisation's budget holds exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn budgets_of_many_organisations_hold_exactly_in_a_redis_cluster() {
    let Some(cluster) = crate::limits::redis::test_cluster() else {
        return;
    };
    let prefix = format!("gw:test:{}:", uuid::Uuid::new_v4());
    let config = json!({"backend": "redis", "key_prefix": prefix, "on_backend_error": "refuse"});
    let a = Arc::new(env_with(config.clone(), Some(cluster.url.clone())));
    let b = Arc::new(env_with(config, Some(cluster.url.clone())));
    let orgs: Vec<String> = (0..6)
        .map(|i| format!("org-{i}-{}", uuid::Uuid::new_v4()))
        .collect();
    let caller = |org: &str| {
        let mut p = principal(vec![budget(
            &format!("api_key:{org}"),
            limit(UsageKind::Requests, 3.0),
        )]);
        p.organisation_id = Some(org.to_owned());
        p
    };
    // Ten requests per organisation at once, half on each instance; each admitted one is
    // answered at once, so settlements of every organisation share the batches.
    let mut tasks = Vec::new();
    for (i, org) in orgs.iter().cycle().take(60).enumerate() {
        let e = if i % 2 == 0 { a.clone() } else { b.clone() };
        let p = caller(org);
        tasks.push(tokio::spawn(
            async move { spend_or_412(&e.plugin, p).await },
        ));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += usize::from(t.await.unwrap());
    }
    assert_eq!(admitted, 3 * orgs.len());
    for org in &orgs {
        let id = format!("api_key:{org}");
        eventually("every settlement", || {
            a.sink.charged(&id) + b.sink.charged(&id) == 3.0
        })
        .await;
        // Settled and full: the next request of the organisation is refused.
        let err = refused(&a.plugin, &mut chat(Some(caller(org)), 10)).await;
        assert_eq!(err.status(), StatusCode::PRECONDITION_FAILED);
    }
    assert_eq!(
        metric(&a.registry, "gw_usage_limit_backend_errors_total", "settle")
            + metric(&b.registry, "gw_usage_limit_backend_errors_total", "settle"),
        0
    );
}

/// A passthrough request with `method` (its body is not read).
fn passthrough(p: Principal, method: Method, path: &str) -> RequestCx {
    let mut cx = RequestCx::new(
        uuid::Uuid::new_v4().to_string(),
        Route::Passthrough,
        method,
        path.into(),
    );
    cx.plan = Some(RoutePlan::Single(Target {
        provider: "openai".into(),
        ..Target::default()
    }));
    cx.extensions.insert(p);
    cx
}

#[tokio::test]
async fn answers_without_usage_are_charged_their_reservation() {
    let e = env();
    let p = principal(vec![budget(
        "api_key:key-1",
        limit(UsageKind::Tokens, 10_000.0),
    )]);
    // A chat answer without usage: its estimate (2 prompt + 10 completion tokens).
    let mut cx = chat(Some(p.clone()), 10);
    e.plugin.on_request(&mut cx).await.unwrap();
    finish(&e.plugin, &mut cx, 200, None).await;
    eventually("the estimate", || e.sink.charged("api_key:key-1") == 12.0).await;
    // A failed one releases it.
    let mut cx = chat(Some(p.clone()), 10);
    e.plugin.on_request(&mut cx).await.unwrap();
    finish(&e.plugin, &mut cx, 500, None).await;
    // A stream the client left before the provider's usage came: the prompt's estimate and
    // the text relayed (41 characters: 11 tokens).
    let mut cx = chat(Some(p.clone()), 500);
    e.plugin.on_request(&mut cx).await.unwrap();
    cx.response.streamed = true;
    cx.response.relayed_text_chars = 41;
    finish(&e.plugin, &mut cx, 200, None).await;
    eventually("the relayed text", || {
        e.sink.charged("api_key:key-1") == 25.0
    })
    .await;
    // A passthrough POST reserves and is charged default_completion_tokens (1024); a GET
    // reserves and is charged no tokens.
    let mut cx = passthrough(p.clone(), Method::POST, "/v1/images/generations");
    e.plugin.on_request(&mut cx).await.unwrap();
    answer(&e.plugin, &mut cx, 200, None).await;
    eventually("the passthrough POST", || {
        e.sink.charged("api_key:key-1") == 1049.0
    })
    .await;
    let mut cx = passthrough(p.clone(), Method::GET, "/v1/files");
    e.plugin.on_request(&mut cx).await.unwrap();
    answer(&e.plugin, &mut cx, 200, None).await;
    // A passthrough answer that reports usage is charged it.
    let mut cx = passthrough(p.clone(), Method::POST, "/v1/responses");
    e.plugin.on_request(&mut cx).await.unwrap();
    answer(&e.plugin, &mut cx, 200, Some((7, 3))).await;
    eventually("the reported usage", || {
        e.sink.charged("api_key:key-1") == 1059.0
    })
    .await;

    // An exhausted token budget refuses passthrough too.
    let spent = principal(vec![budget("api_key:key-2", limit(UsageKind::Tokens, 5.0))]);
    let mut cx = chat(Some(spent.clone()), 0);
    e.plugin.on_request(&mut cx).await.unwrap();
    finish(&e.plugin, &mut cx, 200, Some((5, 0))).await;
    for method in [Method::POST, Method::GET] {
        let err = refused(
            &e.plugin,
            &mut passthrough(spent.clone(), method, "/v1/files"),
        )
        .await;
        assert_eq!(err.status().as_u16(), 412, "{}", err.message);
    }
}

#[tokio::test]
async fn an_unpriced_model_under_a_cost_budget_is_refused_or_priced_by_default() {
    let p = principal(vec![budget("api_key:key-1", limit(UsageKind::Cost, 100.0))]);
    let unpriced = |p: &Principal| {
        let mut cx = chat(Some(p.clone()), 10);
        let body = json!({"model": "house-model-7", "max_tokens": 10,
            "messages": [{"role": "user", "content": "12345678"}]});
        cx.body = Bytes::from(body.to_string());
        cx.request = LlmRequest::decode(cx.route, &cx.body).unwrap();
        cx
    };
    let e = env();
    let err = refused(&e.plugin, &mut unpriced(&p)).await;
    assert_eq!(err.status().as_u16(), 412);
    assert_eq!(err.code.as_deref(), Some("model_unpriced"));
    assert!(err.message.contains("house-model-7"), "{}", err.message);
    let err = refused(
        &e.plugin,
        &mut passthrough(p.clone(), Method::POST, "/v1/images/edits"),
    )
    .await;
    assert_eq!(err.code.as_deref(), Some("model_unpriced"));
    assert!(err.message.contains("/v1/images/edits"), "{}", err.message);
    assert_eq!(
        metric(&e.registry, "gw_usage_limit_unpriced_total", "request"),
        2
    );
    // Without a cost budget nothing needs a price.
    let tokens_only = principal(vec![budget(
        "api_key:key-3",
        limit(UsageKind::Tokens, 100.0),
    )]);
    e.plugin
        .on_request(&mut unpriced(&tokens_only))
        .await
        .unwrap();

    // With default_price: $1 per prompt token and $2 per completion token.
    let e = env_with(
        json!({"backend": "memory",
               "default_price": {"input_per_million": 1000000, "output_per_million": 2000000}}),
        None,
    );
    let mut cx = unpriced(&p);
    e.plugin
        .on_request(&mut cx)
        .await
        .expect("priced by default");
    cx.response.status = Some(200);
    cx.response.model = Some("house-model-7".into());
    cx.response.usage = Some(Usage {
        prompt_tokens: 3,
        completion_tokens: 1,
    });
    e.plugin.on_log(&cx);
    eventually("the default price", || {
        e.sink.charged("api_key:key-1") == 5.0
    })
    .await;
    // A default price must be a price.
    assert!(UsageLimitConfig {
        default_price: Some(super::config::DefaultPrice {
            input_per_million: -1.0,
            output_per_million: 0.0,
        }),
        ..UsageLimitConfig::default()
    }
    .issues()
    .iter()
    .any(|i| i.path == "default_price.input_per_million"));
}

#[tokio::test]
async fn an_answer_from_an_unpriced_model_is_charged_its_reservation() {
    let e = env_with(
        json!({"backend": "memory", "prices": [
            {"provider": "openai", "model": "gpt-4o", "input_per_million": 1000000, "output_per_million": 1000000}
        ]}),
        None,
    );
    let p = principal(vec![budget("api_key:key-1", limit(UsageKind::Cost, 100.0))]);
    // Reserved: 2 + 10 tokens at $1 = $12; the provider answers as a model no price knows.
    let mut cx = chat(Some(p), 10);
    e.plugin.on_request(&mut cx).await.unwrap();
    cx.response.status = Some(200);
    cx.response.provider = Some("openai".into());
    cx.response.model = Some("surprise-model".into());
    cx.response.usage = Some(Usage {
        prompt_tokens: 1,
        completion_tokens: 1,
    });
    e.plugin.on_log(&cx);
    eventually("the reservation", || {
        e.sink.charged("api_key:key-1") == 12.0
    })
    .await;
    assert_eq!(
        metric(&e.registry, "gw_usage_limit_unpriced_total", "answer"),
        1
    );
}

#[tokio::test]
async fn full_counters_refuse_whatever_on_backend_error_says() {
    // Two counters at most; `allow` is for a store that is down, not for one that is full.
    let e = env_with(
        json!({"backend": "memory", "max_counters": 2, "on_backend_error": "allow"}),
        None,
    );
    let p = |key: &str| principal(vec![budget(key, limit(UsageKind::Requests, 100.0))]);
    for key in ["api_key:a", "api_key:b"] {
        let mut cx = chat(Some(p(key)), 10);
        e.plugin.on_request(&mut cx).await.expect("room");
    }
    let err = refused(&e.plugin, &mut chat(Some(p("api_key:c")), 10)).await;
    assert_eq!(err.status().as_u16(), 412);
    assert_eq!(err.code.as_deref(), Some("budget_counters_full"));
    assert!(err.message.contains("max_counters"), "{}", err.message);
    // Counters that exist keep counting.
    let mut cx = chat(Some(p("api_key:a")), 10);
    e.plugin
        .on_request(&mut cx)
        .await
        .expect("an existing counter");
}

/// A private `redis-server` on `port` (no persistence), stopped by PID when dropped.
struct PrivateRedis(std::process::Child);

impl PrivateRedis {
    fn start(port: u16) -> PrivateRedis {
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server (scripts/test installs it for the Redis tests)");
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "the private redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        PrivateRedis(child)
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Redis goes down between a reservation and its settlement, and comes back: the settlement is
/// retried and lands; requests admitted while Redis is down (`on_backend_error: allow`) are let
/// through unchecked and their spend is still counted (their estimate when they report none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settlement_across_a_redis_restart_is_retried_and_lands() {
    if crate::limits::redis::test_url().is_none() {
        return;
    }
    let port = plugin_sdk::testing::free_local_port();
    let mut redis = Some(PrivateRedis::start(port));
    let url = format!("redis://127.0.0.1:{port}");
    let e = env_with(
        json!({"backend": "redis", "on_backend_error": "allow"}),
        Some(url.clone()),
    );
    let budget_id = format!("api_key:{}", uuid::Uuid::new_v4());
    let p = principal(vec![budget(&budget_id, limit(UsageKind::Tokens, 1000.0))]);

    let mut a = chat(Some(p.clone()), 10);
    admit(&e.plugin, &mut a).await.expect("reserved");
    drop(redis.take()); // Redis stops.
    finish(&e.plugin, &mut a, 200, Some((2, 8))).await;
    // While it is down: let through unchecked, counted as a store error.
    let mut b = chat(Some(p.clone()), 10);
    admit(&e.plugin, &mut b).await.expect("allowed unchecked");
    finish(&e.plugin, &mut b, 200, Some((1, 4))).await;
    // One without usage held nothing (the store was down), and is charged its estimate: 12.
    let mut c = chat(Some(p.clone()), 10);
    admit(&e.plugin, &mut c).await.expect("allowed unchecked");
    finish(&e.plugin, &mut c, 200, None).await;
    assert!(
        metric(
            &e.registry,
            "gw_usage_limit_backend_errors_total",
            "reserve"
        ) >= 1
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _back = PrivateRedis::start(port);

    // The control plane gets both spends, and the restarted Redis the settled usage.
    eventually("every charge", || e.sink.charged(&budget_id) == 27.0).await;
    let client = ::redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = ::redis::cmd("KEYS")
        .arg(format!("*{budget_id}*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let (used, held): (f64, f64) = ::redis::cmd("HMGET")
        .arg(&keys[0])
        .arg("used")
        .arg("held")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!((used, held), (27.0, 0.0));
}
