//! The per-request cost of each plugin of the default pipeline, and of the whole pipeline,
//! without network I/O. Run with `cargo bench -p micro-benches --bench plugins`; the last
//! numbers are in `benches/results/micro.md`.
//!
//! **Setup** (once, untimed): a real [`Gateway`] with the default pipeline and its control
//! plane on an in-memory SQLite database, bootstrapped with an admin key. Through the control
//! plane's API (`gw.control_plane.handle`, as a client would call it): a rate limits policy on
//! the workspace `default` (one counter per API key), and a workspace service key with its own
//! rate limit and a monthly cost budget. Every limit is far above what a run can spend, so no
//! request is ever refused. Every plugin below reads that control plane's snapshot and writes
//! to its sink, as in the gateway; each `plugin/*` bench builds its plugin on its own (through
//! its registered descriptor, in-process backends) with a fresh metrics registry.
//!
//! **What a `plugin/<kind>` bench times**: that plugin's `on_request`, `on_route` and `on_log`,
//! as the pipeline calls them, on a chat request (about 1 KB, a priced model) that the real
//! `auth` and `provider_select` have already handled in the untimed setup; so each bench is
//! that plugin's share of `pipeline/default`. Building and decoding the request is untimed in
//! this file (`pipeline.rs` times it). Phases are polled inline, as the gateway's async hooks
//! await them: the in-process backends never wait, and a runtime's `block_on` per call would
//! add its own cost; a phase that does wait is finished on the runtime, and the count of such
//! waits is printed at the end.
//!
//! **Background work** (not on the request's path, but on the same two cores): the log writer
//! drains the queue into the database, and the budget writer sends settled usage to it. The
//! times are wall times: `pipeline/default` includes the time its thread loses to those
//! threads, which the `plugin/*` benches mostly do not (only `log_store` keeps the database
//! busy, and only `usage_limit` and `log_store` wake a writer). The summary printed at the end
//! says how many records were written and how many the full queue dropped; `log_store/writer`
//! times one batch write.

use std::cell::Cell;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use prometheus::{Encoder, TextEncoder};
use serde_json::{json, Value};
use tokio::runtime::Runtime;

use gateway::config::{GatewayConfig, Overrides, Secret, DEFAULT_PIPELINE};
use gateway::Gateway;
use plugin_sdk::headers::GwHeaders;
use plugin_sdk::llm::LlmRequest;
use plugin_sdk::plugin::ResponseParts;
use plugin_sdk::sinks::LogRecord;
use plugin_sdk::target::{CacheMode, CacheSettings};
use plugin_sdk::{
    BuildCx, Flow, Plugin, PluginDescriptor, Principal, RequestCx, Route, RoutePlan, Target, Usage,
};

// The gateway's allocator (see `gateway/src/main.rs`): the plugins allocate many small,
// short-lived objects, some freed on the writers' threads, and glibc's malloc serves that
// markedly slower, so measuring under it would not be the gateway's cost. (`pipeline.rs` keeps
// the system allocator, so its numbers stay comparable with its history.)
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The bootstrap admin key of the benchmark's control plane.
const ADMIN_KEY: &str = "bench-admin-key-0123456789";
/// A limit no run can reach: requests per minute, and US dollars a month.
const UNLIMITED: i64 = 1_000_000_000_000;
/// Requests built per batch by the untimed setup (bounded, so that fast routines do not make
/// criterion hold hundreds of thousands of requests at once).
const BATCH: BatchSize = BatchSize::NumIterations(512);
/// Records per write of the log writer (the `log_store` default `batch_size`).
const LOG_BATCH: usize = 200;
/// The model of every request: one the shipped price table knows, so budgets are charged.
const MODEL: &str = "gpt-4o-mini";

/// Phases that returned `Pending` and were finished on the runtime.
static WAITED: AtomicU64 = AtomicU64::new(0);

/// Runs a plugin phase to completion: polled once inline, then on the runtime if it waits.
fn run<F: Future>(rt: &Runtime, fut: F) -> F::Output {
    let mut fut = pin!(fut);
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => {
            WAITED.fetch_add(1, Ordering::Relaxed);
            rt.block_on(fut)
        }
    }
}

/// A plugin that keeps every phase's default: the cost of calling three phases at all.
struct Noop;

impl Plugin for Noop {
    fn kind(&self) -> &'static str {
        "noop"
    }
}

/// The gateway, its control plane with the benchmark's key, and the plugins built apart.
struct Fixture {
    gw: Gateway,
    rt: Runtime,
    /// The raw workspace key.
    key: String,
    /// Where the separately built plugins registered their metrics.
    registry: prometheus::Registry,
    plugins: Vec<(&'static str, Arc<dyn Plugin>)>,
    /// The next prompt number: a new prompt is a new cache key.
    next: Cell<u64>,
}

impl Fixture {
    fn start() -> Fixture {
        // The request line is formatted for real, into a sink, as a server would.
        let _ = tracing_subscriber::fmt()
            .with_writer(std::io::sink)
            .with_env_filter("info")
            .try_init();
        let yaml = "providers:\n  - {slug: mock, provider: openai, api_key: sk-bench, custom_host: \"http://127.0.0.1:9/v1\"}\n";
        let overrides = Overrides {
            database_url: Some("sqlite::memory:".into()),
            bootstrap_admin_key: Some(Secret(ADMIN_KEY.into())),
            ..Overrides::default()
        };
        let config = GatewayConfig::from_yaml(yaml, &overrides).expect("valid config");
        let gw = Gateway::new(config).expect("the gateway starts");
        assert_eq!(
            gw.pipeline.kinds(),
            DEFAULT_PIPELINE,
            "a config without `pipeline` runs the default pipeline"
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let mut fx = Fixture {
            gw,
            rt,
            key: String::new(),
            registry: prometheus::Registry::new(),
            plugins: Vec::new(),
            next: Cell::new(1),
        };

        let workspaces = fx.admin(Method::GET, "/v1/admin/workspaces", None);
        let ws = workspaces["data"]
            .as_array()
            .and_then(|all| all.iter().find(|w| w["slug"] == "default"))
            .and_then(|w| w["id"].as_str())
            .unwrap_or_else(|| panic!("no workspace `default` in {workspaces}"))
            .to_owned();
        fx.admin(
            Method::POST,
            "/v1/policies/rate-limits",
            Some(json!({
                "name": "per key", "workspace_id": ws,
                "type": "requests", "unit": "rpm", "value": UNLIMITED,
                "conditions": [{"key": "workspace_id", "value": ws}],
                "group_by": [{"key": "api_key"}]
            })),
        );
        let created = fx.admin(
            Method::POST,
            "/v1/api-keys/workspace/service",
            Some(json!({
                "name": "bench", "workspace_id": ws, "scopes": ["completions.write"],
                "rate_limits": [{"type": "requests", "unit": "rpm", "value": UNLIMITED}],
                "usage_limits": {"credit_limit": UNLIMITED, "type": "cost", "periodic_reset": "monthly"}
            })),
        );
        fx.key = created["key"]
            .as_str()
            .unwrap_or_else(|| panic!("no key in {created}"))
            .to_owned();

        let published = fx.gw.control_plane.store().published();
        let build = BuildCx {
            providers: fx.gw.providers.clone(),
            configs: Arc::new(published.clone()),
            metrics: fx.registry.clone(),
            access: Arc::new(published),
            sink: fx.gw.control_plane.sink(),
            redis_url: None,
            egress: Default::default(),
            tokens: Default::default(),
        };
        assert_eq!(
            build.access.rate_limit_policies().len(),
            1,
            "the snapshot holds the policy"
        );
        fx.plugins = DEFAULT_PIPELINE
            .iter()
            .map(|&kind| {
                let config = match kind {
                    "rate_limit" | "usage_limit" | "cache" => json!({"backend": "memory"}),
                    _ => json!({}),
                };
                let plugin = PluginDescriptor::find(kind)
                    .unwrap_or_else(|| panic!("plugin {kind} is not registered"))
                    .build(&config, &build)
                    .unwrap_or_else(|issues| panic!("plugin {kind} does not build: {issues:?}"));
                (kind, plugin)
            })
            .collect();
        fx
    }

    /// A control-plane call with the admin key; panics unless it succeeds.
    fn admin(&self, method: Method, path: &str, body: Option<Value>) -> Value {
        let mut req = http::Request::new(body.map_or_else(Bytes::new, |b| b.to_string().into()));
        *req.method_mut() = method.clone();
        *req.uri_mut() = path.parse().expect("a valid path");
        req.headers_mut()
            .insert("x-gw-api-key", HeaderValue::from_static(ADMIN_KEY));
        req.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        let resp = self.rt.block_on(self.gw.control_plane.handle(req));
        let body: Value = serde_json::from_slice(resp.body()).unwrap_or(Value::Null);
        assert!(
            resp.status().is_success(),
            "{method} {path}: {} {body}",
            resp.status()
        );
        body
    }

    fn plugin(&self, kind: &str) -> &dyn Plugin {
        self.plugins
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, p)| p.as_ref())
            .unwrap_or_else(|| panic!("no plugin {kind}"))
    }

    fn next_prompt(&self) -> u64 {
        let n = self.next.get();
        self.next.set(n + 1);
        n
    }

    /// A chat request as the gateway hands it to the pipeline: headers parsed, body decoded.
    fn request(&self, prompt: u64) -> RequestCx {
        let mut cx = RequestCx::new(
            format!("trace-{prompt}"),
            Route::ChatCompletions,
            Method::POST,
            "/v1/chat/completions".into(),
        );
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert("x-gw-provider", HeaderValue::from_static("@mock"));
        h.insert(
            "x-gw-api-key",
            HeaderValue::from_str(&self.key).expect("a key is a header value"),
        );
        h.insert(
            "x-gw-metadata",
            HeaderValue::from_static(r#"{"_user":"ann","team":"a"}"#),
        );
        h.insert(header::USER_AGENT, HeaderValue::from_static("bench/1.0"));
        cx.gw = GwHeaders::parse(&h).expect("valid gateway headers");
        cx.headers = h;
        let content = format!(
            "Request {prompt}. {}",
            "The quick brown fox jumps over the lazy dog. ".repeat(20)
        );
        cx.body = Bytes::from(
            json!({
                "model": MODEL,
                "temperature": 0.7,
                "messages": [
                    {"role": "system", "content": "You are a benchmark."},
                    {"role": "user", "content": content}
                ]
            })
            .to_string(),
        );
        cx.request = LlmRequest::decode(Route::ChatCompletions, &cx.body).expect("a valid body");
        cx
    }

    /// A request that the real `auth` and `provider_select` have handled, with the target the
    /// router would choose (caching on) and the answer's facts filled in for `on_log`.
    fn prepared(&self, prompt: u64) -> (RequestCx, Target) {
        let mut cx = self.request(prompt);
        for kind in ["auth", "provider_select"] {
            let flow = run(&self.rt, self.plugin(kind).on_request(&mut cx))
                .unwrap_or_else(|e| panic!("{kind} refused the benchmark's request: {e:?}"));
            assert!(matches!(flow, Flow::Continue), "{kind} answered: {flow:?}");
        }
        let target = target_of(&cx);
        answered(&mut cx);
        (cx, target)
    }
}

/// The single target `provider_select` planned, from a config node with `cache: {mode:
/// simple, max_age: 600}`.
fn target_of(cx: &RequestCx) -> Target {
    let Some(RoutePlan::Single(target)) = &cx.plan else {
        panic!("provider_select planned no single target: {:?}", cx.plan);
    };
    let mut target = target.clone();
    target.cache = Some(CacheSettings {
        mode: CacheMode::Simple,
        max_age_secs: Some(600),
    });
    target
}

/// What the router records of a successful answer (read only by `on_log`).
fn answered(cx: &mut RequestCx) {
    cx.response.status = Some(200);
    cx.response.provider = Some("openai".into());
    cx.response.model = Some(MODEL.into());
    cx.response.usage = Some(Usage {
        prompt_tokens: 190,
        completion_tokens: 12,
    });
    cx.response.upstream_latency = Some(Duration::from_micros(300));
}

/// One plugin's request phases as the pipeline calls them. The request goes back to criterion,
/// which drops it outside the timing.
fn phases(
    rt: &Runtime,
    plugin: &dyn Plugin,
    (mut cx, mut target): (RequestCx, Target),
) -> (RequestCx, Target) {
    let flow = run(rt, plugin.on_request(&mut cx))
        .unwrap_or_else(|e| panic!("{} refused: {e:?}", plugin.kind()));
    if matches!(flow, Flow::Continue) {
        run(rt, plugin.on_route(&mut cx, &mut target))
            .unwrap_or_else(|e| panic!("{} refused on route: {e:?}", plugin.kind()));
    }
    plugin.on_log(&cx);
    (cx, target)
}

fn chat_answer() -> Bytes {
    Bytes::from(
        json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "word ".repeat(60)}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 190, "completion_tokens": 60, "total_tokens": 250}
        })
        .to_string(),
    )
}

fn plugins(c: &mut Criterion) {
    let fx = Fixture::start();
    let rt = &fx.rt;
    // Tokio resources polled inline need the runtime's context.
    let _in_runtime = rt.enter();

    // What every check below relies on: the key authenticates with its limits attached.
    let (cx, _) = fx.prepared(0);
    let principal = cx
        .extensions
        .get::<Principal>()
        .expect("auth attached the caller");
    assert!(
        principal.api_key_id.is_some()
            && principal
                .rate_limits
                .iter()
                .any(|l| l.id.starts_with("api_key:"))
            && principal
                .budgets
                .iter()
                .any(|b| b.id.starts_with("api_key:")),
        "the key's rate limit and budget are attached: {principal:?}"
    );
    drop(cx);

    let mut group = c.benchmark_group("plugin");
    group
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1))
        .sample_size(30);

    group.bench_function("noop (three default phases: the floor)", |b| {
        b.iter_batched(
            || fx.prepared(fx.next_prompt()),
            |input| phases(rt, &Noop, input),
            BATCH,
        )
    });

    // auth runs on a request that only has its headers and body; provider_select after it,
    // before anything planned the request. Neither reads the target of `on_route`.
    let auth = fx.plugin("auth");
    group.bench_function("auth (workspace API key, control-plane snapshot)", |b| {
        b.iter_batched(
            || {
                let mut cx = fx.request(fx.next_prompt());
                answered(&mut cx);
                (cx, Target::default())
            },
            |input| phases(rt, auth, input),
            BATCH,
        )
    });
    let select = fx.plugin("provider_select");
    group.bench_function("provider_select (x-gw-provider: @mock)", |b| {
        b.iter_batched(
            || {
                let mut cx = fx.request(fx.next_prompt());
                run(rt, auth.on_request(&mut cx)).expect("auth lets the key through");
                answered(&mut cx);
                (cx, Target::default())
            },
            |input| phases(rt, select, input),
            BATCH,
        )
    });

    for (kind, name) in [
        (
            "rate_limit",
            "rate_limit (key limit + one matching policy, memory)",
        ),
        (
            "usage_limit",
            "usage_limit (reserve + settle a cost budget, memory)",
        ),
        ("cache", "cache miss (new prompt each request, memory)"),
        (
            "request_log",
            "request_log (the line queued for its emitter thread)",
        ),
        ("metrics", "metrics"),
        (
            "log_store",
            "log_store (record queued; the writer drains it to the database)",
        ),
    ] {
        let plugin = fx.plugin(kind);
        // The outcome the bench is meant to measure, checked once.
        let (cx, _) = phases(rt, plugin, fx.prepared(fx.next_prompt()));
        if kind == "cache" {
            assert_eq!(
                cx.response.cache_status,
                Some("MISS"),
                "a new prompt misses"
            );
        }
        group.bench_function(name, |b| {
            b.iter_batched(
                || fx.prepared(fx.next_prompt()),
                |input| phases(rt, plugin, input),
                BATCH,
            )
        });
    }

    // The hit path: one answer stored, then the same request again and again.
    let cache = fx.plugin("cache");
    const HIT_PROMPT: u64 = 0;
    let (mut cx, mut target) = fx.prepared(HIT_PROMPT);
    run(rt, cache.on_route(&mut cx, &mut target)).expect("cache lookup");
    let mut answer = ResponseParts {
        status: StatusCode::OK,
        headers: [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )]
        .into_iter()
        .collect(),
        body: chat_answer(),
    };
    run(rt, cache.on_response(&mut cx, &mut answer)).expect("the answer is stored");
    let (cx, _) = phases(rt, cache, fx.prepared(HIT_PROMPT));
    assert_eq!(
        cx.response.cache_status,
        Some("HIT"),
        "the stored answer is found"
    );
    group.bench_function("cache hit (memory)", |b| {
        b.iter_batched(
            || fx.prepared(HIT_PROMPT),
            |input| phases(rt, cache, input),
            BATCH,
        )
    });
    group.finish();

    // The whole default pipeline, as the gateway built it (its own plugins and registry).
    let mut group = c.benchmark_group("pipeline");
    group
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1))
        .sample_size(30);
    let pipeline = &fx.gw.pipeline;
    let whole = |mut cx: RequestCx| {
        let flow = run(rt, pipeline.on_request(&mut cx))
            .unwrap_or_else(|e| panic!("the default pipeline refused: {e:?}"));
        if matches!(flow, Flow::Continue) {
            let mut target = target_of(&cx);
            run(rt, pipeline.on_route(&mut cx, &mut target))
                .unwrap_or_else(|e| panic!("the default pipeline refused on route: {e:?}"));
        }
        pipeline.on_log(&cx);
        cx
    };
    let request = || {
        let mut cx = fx.request(fx.next_prompt());
        answered(&mut cx);
        cx
    };
    let cx = whole(request());
    assert!(cx.extensions.get::<Principal>().is_some(), "auth ran");
    assert_eq!(
        cx.response.cache_status,
        Some("MISS"),
        "the cache was looked up"
    );
    drop(cx);
    group.bench_function(
        "default: on_request + on_route + on_log (8 plugins, API key, cache miss)",
        |b| b.iter_batched(request, whole, BATCH),
    );
    group.finish();

    // The log writer's side: one batch into the database, as the writer sends it.
    assert!(
        plugins::log_store::flush_all(Duration::from_secs(30)),
        "the log queues drain"
    );
    let mut group = c.benchmark_group("log_store");
    group
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1))
        .sample_size(30)
        .throughput(Throughput::Elements(LOG_BATCH as u64));
    let sink = fx.gw.control_plane.sink();
    let (cx, _) = fx.prepared(fx.next_prompt());
    let template = plugins::log_store::record_of(&cx);
    let seq = Cell::new(0u64);
    let batch = || -> Vec<LogRecord> {
        (0..LOG_BATCH)
            .map(|_| {
                let n = seq.get();
                seq.set(n + 1);
                LogRecord {
                    id: format!("00000000-0000-4000-8000-{n:012x}"),
                    ..template.clone()
                }
            })
            .collect()
    };
    group.bench_function(
        format!("writer (a batch of {LOG_BATCH} records into the in-memory database)"),
        |b| {
            b.iter_batched(
                batch,
                |records| {
                    rt.block_on(sink.write_logs(records))
                        .expect("the batch is written")
                },
                BatchSize::PerIteration,
            )
        },
    );
    group.finish();

    summary(&fx);
}

/// What the background writers did during the run, from the plugins' own counters.
fn summary(fx: &Fixture) {
    plugins::log_store::flush_all(Duration::from_secs(30));
    let mut separate = Vec::new();
    TextEncoder::new()
        .encode(&fx.registry.gather(), &mut separate)
        .expect("metrics encode");
    let pipeline = fx.gw.render_metrics();
    eprintln!("\nBackground and outcome counters of the run:");
    for (whose, text) in [
        ("plugins built apart (plugin/*)", separate),
        ("the gateway's own pipeline (pipeline/*)", pipeline),
    ] {
        eprintln!("  {whose}:");
        for line in String::from_utf8_lossy(&text).lines().filter(|l| {
            [
                "gw_auth_requests_total",
                "gw_rate_limit_checks_total",
                "gw_cache_requests_total",
                "gw_usage_limit_dropped_total",
                "gw_usage_limit_backend_errors_total",
                "gw_log_records_total",
            ]
            .iter()
            .any(|m| l.starts_with(m))
        }) {
            eprintln!("    {line}");
        }
    }
    eprintln!(
        "  phases that waited and were finished on the runtime: {}",
        WAITED.load(Ordering::Relaxed)
    );
}

criterion_group!(benches, plugins);
criterion_main!(benches);
