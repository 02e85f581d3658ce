//! The plugin driven with hand-made request contexts and a sink that records what it is given.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use http::{HeaderMap, Method, StatusCode};
use serde_json::{json, Value};

use plugin_sdk::access::{AuthMethod, KeyKind};
use plugin_sdk::llm::LlmRequest;
use plugin_sdk::sinks::{AuditEvent, ControlPlaneSink, UsageCharge};
use plugin_sdk::{PluginDescriptor, Route};

use super::*;

/// Records every batch it is asked to write; may fail a number of calls first, or hold each
/// write until the test lets it through.
#[derive(Default)]
struct Recording {
    /// Every call's record ids, failed ones included.
    attempts: Mutex<Vec<Vec<String>>>,
    /// Batches written.
    batches: Mutex<Vec<Vec<LogRecord>>>,
    /// Calls that fail before writes succeed; `usize::MAX`: every call fails.
    failures: AtomicUsize,
    /// When set, each write waits for a permit.
    gate: Option<tokio::sync::Semaphore>,
    entered: AtomicUsize,
}

impl Recording {
    fn failing(calls: usize) -> Arc<Recording> {
        Arc::new(Recording {
            failures: AtomicUsize::new(calls),
            ..Recording::default()
        })
    }

    fn gated() -> Arc<Recording> {
        Arc::new(Recording {
            gate: Some(tokio::sync::Semaphore::new(0)),
            ..Recording::default()
        })
    }

    fn records(&self) -> Vec<LogRecord> {
        self.batches.lock().unwrap().concat()
    }

    fn batch_sizes(&self) -> Vec<usize> {
        self.batches.lock().unwrap().iter().map(Vec::len).collect()
    }
}

#[async_trait]
impl ControlPlaneSink for Recording {
    async fn audit(&self, _events: Vec<AuditEvent>) -> Result<(), String> {
        Ok(())
    }
    async fn charge_usage(&self, _charges: Vec<UsageCharge>) -> Result<(), String> {
        Ok(())
    }
    async fn write_logs(&self, records: Vec<LogRecord>) -> Result<(), String> {
        self.entered.fetch_add(1, Ordering::SeqCst);
        if let Some(gate) = &self.gate {
            gate.acquire().await.expect("open gate").forget();
        }
        self.attempts
            .lock()
            .unwrap()
            .push(records.iter().map(|r| r.id.clone()).collect());
        let left = self.failures.load(Ordering::SeqCst);
        if left > 0 {
            if left != usize::MAX {
                self.failures.store(left - 1, Ordering::SeqCst);
            }
            return Err("database unavailable".into());
        }
        self.batches.lock().unwrap().push(records);
        Ok(())
    }
}

const WAIT: Duration = Duration::from_secs(5);

fn settings(batch_size: usize, flush_interval_ms: u64) -> WriterSettings {
    let mut s = WriterSettings::new(
        10_000,
        batch_size,
        Duration::from_millis(flush_interval_ms),
        64 * 1024,
    );
    s.backoff = Duration::from_millis(1);
    s
}

fn start(
    s: WriterSettings,
    bodies: bool,
    sink: &Arc<Recording>,
) -> (LogStore, prometheus::Registry) {
    let registry = prometheus::Registry::new();
    let plugin = LogStore::start(s, bodies, sink.clone(), &registry).expect("starts");
    (plugin, registry)
}

fn build(config: Value, sink: &Arc<Recording>) -> (Arc<dyn Plugin>, prometheus::Registry) {
    let mut cx = BuildCx::standalone();
    cx.sink = sink.clone();
    let plugin = PluginDescriptor::find("log_store")
        .expect("registered")
        .build(&config, &cx)
        .unwrap_or_else(|e| panic!("{e:?}"));
    (plugin, cx.metrics)
}

/// Waits until `done` holds, failing the test after [`WAIT`].
fn wait_for(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A metric's value by name and (optional) `outcome` label, from the text exposition; 0 when
/// the series does not exist yet.
fn metric(registry: &prometheus::Registry, name: &str, outcome: Option<&str>) -> f64 {
    use prometheus::Encoder;
    let mut text = Vec::new();
    prometheus::TextEncoder::new()
        .encode(&registry.gather(), &mut text)
        .expect("encodes");
    let series = match outcome {
        None => format!("{name} "),
        Some(o) => format!("{name}{{outcome=\"{o}\"}} "),
    };
    String::from_utf8(text)
        .expect("UTF-8")
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .map_or(0.0, |v| v.trim().parse().expect("a number"))
}

fn principal() -> Principal {
    Principal {
        method: AuthMethod::ApiKey(KeyKind::WorkspaceService),
        organisation_id: Some("org-1".into()),
        workspace_id: Some("ws-1".into()),
        api_key_id: Some("key-1".into()),
        user_id: Some("user-1".into()),
        scopes: vec!["completions.write".into()],
        rate_limits: Vec::new(),
        budgets: Vec::new(),
    }
}

/// A finished chat completion of `trace`.
fn request(trace: &str) -> RequestCx {
    let mut cx = RequestCx::new(
        trace.into(),
        Route::ChatCompletions,
        Method::POST,
        "/v1/chat/completions".into(),
    );
    let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]});
    cx.body = Bytes::from(body.to_string());
    cx.request = LlmRequest::decode(cx.route, &cx.body).expect("valid body");
    cx.gw.span_id = Some("span-1".into());
    cx.gw.parent_span_id = Some("span-0".into());
    cx.gw.span_name = Some("chat".into());
    cx.gw.metadata = BTreeMap::from([
        ("_user".to_string(), "alice".to_string()),
        ("env".to_string(), "prod".to_string()),
    ]);
    cx.extensions.insert(principal());
    cx.response.status = Some(200);
    cx.response.provider = Some("openai".into());
    cx.response.model = Some("gpt-4o-mini-2024-07-18".into());
    cx.response.usage = Some(Usage {
        prompt_tokens: 12,
        completion_tokens: 34,
    });
    cx.response.cost = Some(0.25);
    cx.response.upstream_latency = Some(Duration::from_millis(7));
    cx.response.cache_status = Some("MISS");
    cx.response.retries = 2;
    cx.response.option_index = Some("config.targets[1]".into());
    cx
}

#[test]
fn records_arrive_in_batches_with_the_request_fields() {
    let sink = Arc::new(Recording::default());
    let (plugin, registry) = start(settings(3, 60_000), false, &sink);
    for i in 0..7 {
        plugin.on_log(&request(&format!("trace-{i}")));
    }
    // Two full batches go at once; the seventh waits for the interval or a flush.
    wait_for("two batches", || sink.batch_sizes().len() == 2);
    assert_eq!(sink.batch_sizes(), vec![3, 3]);
    assert!(plugin.flush(WAIT));
    assert_eq!(sink.batch_sizes(), vec![3, 3, 1]);

    let records = sink.records();
    let traces: Vec<&str> = records.iter().map(|r| r.trace_id.as_str()).collect();
    assert_eq!(
        traces,
        (0..7).map(|i| format!("trace-{i}")).collect::<Vec<_>>()
    );
    let ids: Vec<&str> = records.iter().map(|r| r.id.as_str()).collect();
    for id in &ids {
        let id = uuid::Uuid::parse_str(id).expect("a UUID id");
        assert_eq!(id.get_version_num(), 7, "a time-ordered id: {id}");
    }
    // Ids grow in the order records are written, so the index on them is appended to.
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "ids in write order, each its own: {ids:?}"
    );

    let r = &records[0];
    assert_eq!(r.span_id.as_deref(), Some("span-1"));
    assert_eq!(r.parent_span_id.as_deref(), Some("span-0"));
    assert_eq!(r.span_name.as_deref(), Some("chat"));
    assert_eq!(r.organisation_id.as_deref(), Some("org-1"));
    assert_eq!(r.workspace_id.as_deref(), Some("ws-1"));
    assert_eq!(r.api_key_id.as_deref(), Some("key-1"));
    assert_eq!(r.user_id.as_deref(), Some("user-1"));
    assert_eq!(r.metadata.get("_user").map(String::as_str), Some("alice"));
    assert_eq!(r.metadata.get("env").map(String::as_str), Some("prod"));
    assert_eq!(r.route, "chat.completions");
    assert_eq!(r.method, "POST");
    assert_eq!(r.path, "/v1/chat/completions");
    assert_eq!(r.provider.as_deref(), Some("openai"));
    assert_eq!(r.model.as_deref(), Some("gpt-4o-mini-2024-07-18"));
    assert_eq!(r.status, 200);
    assert_eq!(r.upstream_latency_ms, Some(7));
    assert_eq!((r.prompt_tokens, r.completion_tokens), (12, 34));
    assert_eq!(r.cost, Some(0.25));
    assert_eq!(r.cache_status.as_deref(), Some("MISS"));
    assert_eq!(r.retries, 2);
    assert_eq!(r.final_target.as_deref(), Some("config.targets[1]"));
    assert!(!r.streamed);
    assert_eq!(r.error, None);
    let created = r.created_at.expect("a creation time");
    assert!(created <= SystemTime::now());
    assert!(SystemTime::now().duration_since(created).unwrap() < Duration::from_secs(60));
    // Bodies are off unless configured.
    assert!(records
        .iter()
        .all(|r| r.request_body.is_none() && r.response_body.is_none()));

    assert_eq!(
        metric(&registry, "gw_log_records_total", Some("written")),
        7.0
    );
    assert_eq!(
        metric(&registry, "gw_log_batches_total", Some("written")),
        3.0
    );
    assert_eq!(metric(&registry, "gw_log_queue_depth", None), 0.0);
}

#[test]
fn a_request_without_caller_or_answer_is_still_logged() {
    let sink = Arc::new(Recording::default());
    let (plugin, _registry) = start(settings(10, 60_000), false, &sink);
    let mut cx = RequestCx::new(
        "t-failed".into(),
        Route::Passthrough,
        Method::GET,
        "/v1/files".into(),
    );
    cx.response.error = Some("no provider".into());
    cx.response.streamed = true;
    plugin.on_log(&cx);
    assert!(plugin.flush(WAIT));
    let r = &sink.records()[0];
    assert_eq!(r.route, "passthrough");
    assert_eq!(r.method, "GET");
    assert_eq!(r.status, 0, "no status was sent");
    assert_eq!(r.error.as_deref(), Some("no provider"));
    assert!(r.streamed);
    assert_eq!(
        (
            &r.organisation_id,
            &r.workspace_id,
            &r.api_key_id,
            &r.user_id
        ),
        (&None, &None, &None, &None)
    );
    assert_eq!((r.provider.as_deref(), r.model.as_deref()), (None, None));
    assert_eq!(r.cost, None);
}

#[test]
fn the_requested_model_stands_in_when_the_provider_named_none() {
    let sink = Arc::new(Recording::default());
    let (plugin, _registry) = start(settings(10, 60_000), false, &sink);
    let mut cx = request("t");
    cx.response.model = None;
    plugin.on_log(&cx);
    assert!(plugin.flush(WAIT));
    assert_eq!(sink.records()[0].model.as_deref(), Some("gpt-4o-mini"));
}

#[test]
fn without_a_cost_the_price_table_prices_the_usage() {
    let sink = Arc::new(Recording::default());
    let (plugin, _registry) = start(settings(10, 60_000), false, &sink);
    let mut priced = request("t-priced");
    priced.response.cost = None;
    plugin.on_log(&priced);
    let mut no_usage = request("t-no-usage");
    no_usage.response.cost = None;
    no_usage.response.usage = None;
    plugin.on_log(&no_usage);
    let mut no_price = request("t-no-price");
    no_price.response.cost = None;
    no_price.response.model = Some("a-model-nobody-prices".into());
    plugin.on_log(&no_price);
    assert!(plugin.flush(WAIT));
    let records = sink.records();
    let usage = Usage {
        prompt_tokens: 12,
        completion_tokens: 34,
    };
    let expected = crate::pricing::PriceTable::shipped()
        .cost("openai", "gpt-4o-mini-2024-07-18", usage)
        .expect("the shipped table prices gpt-4o-mini");
    assert!(expected > 0.0);
    assert_eq!(records[0].cost, Some(expected));
    assert_eq!(records[1].cost, None, "no usage, no cost");
    assert_eq!(records[2].cost, None, "no price, no cost");
}

#[test]
fn a_partial_batch_is_written_after_the_flush_interval() {
    let sink = Arc::new(Recording::default());
    let (plugin, _registry) = build(json!({"batch_size": 200, "flush_interval_ms": 20}), &sink);
    plugin.on_log(&request("t-alone"));
    wait_for("the interval's write", || !sink.records().is_empty());
    assert_eq!(sink.batch_sizes(), vec![1]);
}

#[test]
fn a_full_queue_drops_and_counts_without_blocking() {
    let sink = Recording::gated();
    let mut s = settings(1, 60_000);
    s.queue_capacity = 2;
    let (plugin, registry) = start(s, false, &sink);
    // The writer takes the first record and is held inside the write.
    plugin.on_log(&request("t-0"));
    wait_for("the first write", || {
        sink.entered.load(Ordering::SeqCst) == 1
    });
    let began = Instant::now();
    for i in 1..=5 {
        plugin.on_log(&request(&format!("t-{i}")));
    }
    assert!(
        began.elapsed() < Duration::from_secs(1),
        "on_log waited for the writer"
    );
    assert_eq!(metric(&registry, "gw_log_queue_depth", None), 2.0);
    assert_eq!(
        metric(&registry, "gw_log_records_total", Some("dropped_full")),
        3.0
    );
    // Let every write through: the two queued records follow the first.
    sink.gate.as_ref().unwrap().add_permits(100);
    assert!(plugin.flush(WAIT));
    let traces: Vec<String> = sink.records().into_iter().map(|r| r.trace_id).collect();
    assert_eq!(traces, vec!["t-0", "t-1", "t-2"]);
    assert_eq!(
        metric(&registry, "gw_log_records_total", Some("written")),
        3.0
    );
    assert_eq!(metric(&registry, "gw_log_queue_depth", None), 0.0);
}

#[test]
fn a_failed_write_is_retried_with_the_same_records() {
    let sink = Recording::failing(2);
    let (plugin, registry) = start(settings(10, 60_000), false, &sink);
    plugin.on_log(&request("t-a"));
    plugin.on_log(&request("t-b"));
    assert!(plugin.flush(WAIT));
    let attempts = sink.attempts.lock().unwrap().clone();
    assert_eq!(attempts.len(), 3, "two failures, then the write");
    assert!(
        attempts.iter().all(|ids| ids == &attempts[0]),
        "a retry sends the same records (same ids)"
    );
    assert_eq!(sink.batch_sizes(), vec![2]);
    assert_eq!(
        metric(&registry, "gw_log_batches_total", Some("retried")),
        2.0
    );
    assert_eq!(
        metric(&registry, "gw_log_batches_total", Some("written")),
        1.0
    );
    assert_eq!(
        metric(&registry, "gw_log_records_total", Some("written")),
        2.0
    );
    assert_eq!(
        metric(&registry, "gw_log_records_total", Some("dropped_error")),
        0.0
    );
}

#[test]
fn a_write_that_keeps_failing_is_dropped_and_counted_and_the_writer_goes_on() {
    let sink = Recording::failing(usize::MAX);
    let mut s = settings(10, 60_000);
    s.retries = 2;
    let (plugin, registry) = start(s, false, &sink);
    for i in 0..3 {
        plugin.on_log(&request(&format!("t-{i}")));
    }
    assert!(plugin.flush(WAIT));
    assert_eq!(
        sink.attempts.lock().unwrap().len(),
        3,
        "one try and two retries"
    );
    assert!(sink.records().is_empty());
    assert_eq!(
        metric(&registry, "gw_log_records_total", Some("dropped_error")),
        3.0
    );
    assert_eq!(
        metric(&registry, "gw_log_batches_total", Some("dropped_error")),
        1.0
    );
    // The database comes back: later records are written.
    sink.failures.store(0, Ordering::SeqCst);
    plugin.on_log(&request("t-later"));
    assert!(plugin.flush(WAIT));
    assert_eq!(sink.records()[0].trace_id, "t-later");
    assert_eq!(
        metric(&registry, "gw_log_records_total", Some("written")),
        1.0
    );
}

#[test]
fn a_hung_write_times_out_and_counts_as_failed() {
    let sink = Recording::gated();
    let mut s = settings(10, 60_000);
    s.retries = 1;
    s.attempt_timeout = Duration::from_millis(20);
    let (plugin, registry) = start(s, false, &sink);
    plugin.on_log(&request("t-hung"));
    assert!(plugin.flush(WAIT));
    assert_eq!(sink.entered.load(Ordering::SeqCst), 2);
    assert_eq!(
        metric(&registry, "gw_log_records_total", Some("dropped_error")),
        1.0
    );
}

fn chat_answer(body: &Value) -> ResponseParts {
    ResponseParts {
        status: StatusCode::OK,
        headers: HeaderMap::new(),
        body: Bytes::from(body.to_string()),
    }
}

#[tokio::test]
async fn bodies_are_off_by_default() {
    let sink = Arc::new(Recording::default());
    let (plugin, _registry) = build(json!({}), &sink);
    let mut cx = request("t-default");
    let mut answer = chat_answer(&json!({"choices": [], "token": "x"}));
    plugin.on_response(&mut cx, &mut answer).await.unwrap();
    plugin.on_log(&cx);
    drop(plugin); // writes what is queued
    let r = &sink.records()[0];
    assert_eq!(r.request_body, None);
    assert_eq!(r.response_body, None);
}

#[tokio::test]
async fn kept_bodies_are_redacted_and_cut() {
    let sink = Arc::new(Recording::default());
    let (plugin, _registry) = build(json!({"bodies": true, "max_body_bytes": 256}), &sink);

    // A complete answer: small bodies kept whole, secrets redacted.
    let mut cx = request("t-complete");
    cx.body = Bytes::from(
        json!({"model": "m", "api_key": "sk-live-1", "messages": [{"role": "user", "content": "hi"}],
               "metadata": {"Authorization": "Bearer abc"}})
        .to_string(),
    );
    let mut answer = chat_answer(&json!({
        "choices": [{"message": {"content": "hello"}}],
        "usage": {"prompt_tokens": 3},
        "session_token": "sess-9"
    }));
    plugin.on_response(&mut cx, &mut answer).await.unwrap();
    plugin.on_log(&cx);

    // A long request body: cut at the limit.
    let mut long = request("t-long");
    long.body = Bytes::from(format!(
        r#"{{"password": "p4ss", "messages": [{{"role": "user", "content": "{}"}}]}}"#,
        "z".repeat(1_000)
    ));
    plugin.on_log(&long);

    // A stream: events gathered up to the limit.
    let mut stream = request("t-stream");
    stream.response.streamed = true;
    for i in 0..20 {
        let event = format!("data: {{\"i\":{i},\"token\":\"tok-{i}\",\"delta\":\"abcdefgh\"}}\n\n");
        let mut chunk = Chunk {
            data: Bytes::from(event),
        };
        plugin.on_chunk(&mut stream, &mut chunk).unwrap();
    }
    plugin.on_log(&stream);
    drop(plugin);

    let records = sink.records();
    assert_eq!(records.len(), 3);

    let request_body: Value =
        serde_json::from_str(records[0].request_body.as_deref().unwrap()).unwrap();
    assert_eq!(request_body["api_key"], "[REDACTED]");
    assert_eq!(request_body["metadata"]["Authorization"], "[REDACTED]");
    assert_eq!(request_body["messages"][0]["content"], "hi");
    let response_body: Value =
        serde_json::from_str(records[0].response_body.as_deref().unwrap()).unwrap();
    assert_eq!(response_body["session_token"], "[REDACTED]");
    assert_eq!(response_body["usage"]["prompt_tokens"], 3);
    assert_eq!(response_body["choices"][0]["message"]["content"], "hello");

    let cut = records[1].request_body.as_deref().unwrap();
    assert!(cut.len() <= 256, "{} bytes", cut.len());
    assert!(cut.ends_with(redact::TRUNCATED), "{cut}");
    assert!(
        cut.contains("\"[REDACTED]\"") && !cut.contains("p4ss"),
        "{cut}"
    );
    assert!(cut.contains("zzzz"));
    assert_eq!(records[1].response_body, None, "no answer was captured");

    let events = records[2].response_body.as_deref().unwrap();
    assert!(events.len() <= 256, "{} bytes", events.len());
    assert!(
        events.starts_with("data: {\"i\":0,\"token\":\"[REDACTED]\""),
        "{events}"
    );
    assert!(events.ends_with(redact::TRUNCATED), "{events}");
    assert!(!events.contains("tok-"), "{events}");
    assert!(!events.contains("\"i\":19"), "the stream was cut: {events}");
}

#[test]
fn dropping_the_plugin_writes_what_is_queued() {
    let sink = Arc::new(Recording::default());
    let (plugin, _registry) = start(settings(100, 60_000), false, &sink);
    for i in 0..5 {
        plugin.on_log(&request(&format!("t-{i}")));
    }
    assert!(
        sink.records().is_empty(),
        "nothing is due before the interval"
    );
    drop(plugin);
    assert_eq!(sink.records().len(), 5);
}

#[test]
fn flush_all_writes_every_queue_of_the_process() {
    let first = Arc::new(Recording::default());
    let second = Arc::new(Recording::default());
    let (a, _ra) = start(settings(100, 60_000), false, &first);
    let (b, _rb) = start(settings(100, 60_000), false, &second);
    a.on_log(&request("t-a"));
    b.on_log(&request("t-b1"));
    b.on_log(&request("t-b2"));
    assert!(flush_all(WAIT));
    assert_eq!(first.records().len(), 1);
    assert_eq!(second.records().len(), 2);
}

#[test]
fn listed_twice_on_one_registry_is_a_clear_error() {
    let sink = Arc::new(Recording::default());
    let registry = prometheus::Registry::new();
    let _first = LogStore::start(settings(10, 100), false, sink.clone(), &registry).unwrap();
    let second = LogStore::start(settings(10, 100), false, sink, &registry);
    let error = second.err().expect("a second registration fails");
    assert!(error.contains("listed twice"), "{error}");
}

fn issues(config: Value) -> Vec<(String, String)> {
    PluginDescriptor::find("log_store")
        .unwrap()
        .check(&config)
        .err()
        .unwrap_or_default()
        .into_iter()
        .map(|i| (i.path, i.message))
        .collect()
}

#[test]
fn the_defaults_and_the_example_are_valid() {
    assert!(issues(json!({})).is_empty());
    let example: Vec<Value> = flat_yaml(LogStoreFactory::EXAMPLE).expect("the example parses");
    let mut entry = example[0].clone();
    entry.as_object_mut().unwrap().remove("kind");
    assert!(issues(entry).is_empty());
    let defaults = LogStoreConfig::default();
    assert_eq!(
        (
            defaults.queue_capacity,
            defaults.batch_size,
            defaults.flush_interval_ms,
            defaults.bodies,
            defaults.max_body_bytes
        ),
        (10_000, 200, 500, false, 65_536)
    );
}

/// The example is flat `key: value` YAML; read it without a YAML crate (plugins has none).
fn flat_yaml(text: &str) -> Option<Vec<Value>> {
    let mut entry = serde_json::Map::new();
    for line in text.lines() {
        let line = line.split('#').next()?.trim().trim_start_matches("- ");
        let (key, value) = line.split_once(':')?;
        let value = value.trim();
        let value = serde_json::from_str(value).unwrap_or(Value::String(value.into()));
        entry.insert(key.trim().into(), value);
    }
    Some(vec![Value::Object(entry)])
}

#[test]
fn bad_settings_are_refused_naming_the_field() {
    let fields = |config| -> Vec<String> { issues(config).into_iter().map(|i| i.0).collect() };
    assert_eq!(fields(json!({"queue_capacity": 0})), vec!["queue_capacity"]);
    assert_eq!(fields(json!({"batch_size": 0})), vec!["batch_size"]);
    assert_eq!(
        fields(json!({"queue_capacity": 10, "batch_size": 11})),
        vec!["batch_size"]
    );
    assert_eq!(
        fields(json!({"flush_interval_ms": 0})),
        vec!["flush_interval_ms"]
    );
    assert_eq!(
        fields(json!({"max_body_bytes": 10})),
        vec!["max_body_bytes"]
    );
    assert_eq!(fields(json!({"bodies": "yes"})), vec!["bodies"]);
    let unknown = issues(json!({"batchsize": 5}));
    assert_eq!(unknown.len(), 1);
    assert!(unknown[0].1.contains("batchsize"), "{unknown:?}");
}
