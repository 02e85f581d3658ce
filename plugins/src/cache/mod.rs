//! `cache`: answers a request from a stored answer of the same request (simple mode: exact
//! match of the canonical request).
//!
//! **When it is on.** Per upstream attempt, in `on_route`: the config node the router chose
//! has `cache: {mode: simple}` (`max_age` optional), or the node has no `cache` and this
//! plugin's `default` names one. Only chat completions, embeddings and messages are cached;
//! other routes (and passthrough, which never reaches `on_route`) are not. `max_age: 0` turns
//! it off. `mode: semantic` is not served by this build: the request is a `MISS`, nothing is
//! stored, and one warning is logged.
//!
//! **Status** (`cx.response.cache_status`, which the gateway writes as `x-gw-cache-status`):
//!
//! - `HIT`: answered from the cache; the provider is not called.
//! - `MISS`: looked up, not found (or too old for this request's `max_age`, or stored in a form
//!   this request cannot use); the answer will be stored.
//! - `REFRESH`: `x-gw-cache-force-refresh: true`: not looked up; the new answer is stored.
//! - `DISABLED`: caching is not on for this request.
//!
//! **Key**: see [`key`]. Metadata, trace ids and headers are never part of it (with or without
//! `x-gw-cache-namespace`); the caller's workspace is.
//!
//! **Storing.** Only 2xx answers, never errors: a whole answer in `on_response` (awaited, so
//! the next request finds it), a stream in `on_chunk` once its end (`data: [DONE]`, or
//! `message_stop` for messages) has passed, with its events as relayed; a stream that carries
//! an error event, is cut short, or grows past `max_entry_bytes` is not stored. An entry keeps
//! the status, content type, body, whether the body is a stream, and the provider and model
//! that answered. It expires after the request's `max_age` (else the plugin's
//! `default_max_age`, a week by default); a later request with a shorter `max_age` does not
//! take an older entry.
//!
//! **Hits.** A non-stream request is answered with a stored whole answer as it is. A stream
//! request is answered with a stored stream as it is (its usage chunk removed if this client
//! did not ask for one; a client that asks for one and finds a stream without it is a `MISS`),
//! or with a stored whole answer re-streamed ([`replay`]: chat completion chunks ending with
//! `data: [DONE]`, or Anthropic's message events), as `text/event-stream`. A non-stream
//! request that finds a stored stream is a `MISS`, and its whole answer replaces the stream.
//! A hit sets `cx.response.provider` and `model` from the entry and leaves `usage` and `cost`
//! empty: a hit costs nothing and charges no tokens.
//!
//! **Pipeline place.** After auth, provider selection and the limits (a refused request is
//! not answered from the cache), and before output guardrails: response phases run in
//! reverse order, so the cache then stores what the guardrails let through. A hit skips every
//! later phase (output guardrails included) except `on_log`.
//!
//! **Backends** ([`store::CacheStore`]): in-process ([`memory`], bounded by `max_bytes`) or
//! Redis ([`redis`], shared by every instance; chosen when the gateway has `GW_REDIS_URL`, or
//! with `backend: redis`). A backend error is a miss (or a skipped store), counted and logged
//! at most once a minute, and never fails the request; after a failed Redis command, Redis is
//! left alone for a second so that an outage does not add its timeout to every request.
//!
//! **Metrics**: `gw_cache_requests_total{status="hit|miss|refresh|disabled"}` (per request, its
//! final status, counted in `on_log`), `gw_cache_stores_total`,
//! `gw_cache_backend_errors_total{op="get|set"}`, `gw_cache_bytes` (memory backend: bytes kept).

pub mod config;
pub mod key;
pub mod memory;
pub mod redis;
pub mod replay;
pub mod store;

#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use http::{HeaderName, HeaderValue, StatusCode};
use prometheus::{IntCounter, IntCounterVec, Opts};

use plugin_sdk::llm::LlmRequest;
use plugin_sdk::plugin::ResponseParts;
use plugin_sdk::target::{CacheMode, CacheSettings};
use plugin_sdk::{
    BuildCx, Chunk, ConfigIssue, Flow, GatewayError, Phases, Plugin, PluginFactory, PluginResponse,
    RequestCx, Route, RoutePlan, Target,
};

use crate::limits::admission::Admission;
use config::{BackendChoice, CacheConfig, MAX_AGE_CAP_SECS};
use key::CacheKey;
use memory::MemoryStore;
use redis::RedisStore;
use replay::Signal;
use store::{CacheStore, Entry, StoreError};

/// Answered from the cache.
pub const HIT: &str = "HIT";
/// Looked up and not found; the answer will be stored.
pub const MISS: &str = "MISS";
/// Force-refresh: not looked up; the answer will be stored.
pub const REFRESH: &str = "REFRESH";
/// Caching is not on for this request.
pub const DISABLED: &str = "DISABLED";

/// The response header that carries the status.
pub const CACHE_STATUS_HEADER: HeaderName = HeaderName::from_static("x-gw-cache-status");

const EVENT_STREAM: &str = "text/event-stream";

pub struct CacheFactory;

impl PluginFactory for CacheFactory {
    const KIND: &'static str = "cache";
    const SUMMARY: &'static str =
        "Answers repeated requests from stored answers (simple mode), in memory or in Redis";
    const EXAMPLE: &'static str = "- kind: cache\n  default: {mode: simple, max_age: 600}   # for targets without cache settings; default none\n  default_max_age: 604800\n  backend: auto        # memory, or redis when GW_REDIS_URL is set\n  max_bytes: 67108864  # memory backend bound";
    type Config = CacheConfig;

    fn validate(config: &Self::Config) -> Vec<ConfigIssue> {
        config.issues()
    }

    fn build(config: Self::Config, cx: &BuildCx) -> Result<Arc<dyn Plugin>, String> {
        let timeout = Duration::from_millis(config.redis_timeout_ms);
        // The store first: a bad choice fails before anything is registered.
        let (store, size_metric): (Arc<dyn CacheStore>, _) =
            match (config.backend, cx.redis_url.as_deref()) {
                (BackendChoice::Redis, None) => {
                    return Err(
                        "backend: redis needs the gateway's Redis URL (GW_REDIS_URL)".into(),
                    )
                }
                (BackendChoice::Redis | BackendChoice::Auto, Some(url)) => (
                    Arc::new(RedisStore::new(url, &config.key_prefix, timeout)?),
                    None,
                ),
                (BackendChoice::Memory, _) | (BackendChoice::Auto, None) => {
                    let memory = MemoryStore::new(config.max_bytes, config.eviction);
                    let size = memory.size_metric()?;
                    (Arc::new(memory), Some(size))
                }
            };
        let metrics = CacheMetrics::register(&cx.metrics)?;
        if let Some(size) = size_metric {
            cx.metrics
                .register(size)
                .map_err(|e| format!("cannot register gw_cache_bytes: {e}"))?;
        }
        Ok(Arc::new(CachePlugin::new(&config, store, metrics)))
    }
}

plugin_sdk::register_plugin!(CacheFactory);

/// The plugin's counters (the memory backend's `gw_cache_bytes` is its own, see
/// [`MemoryStore::size_metric`]).
#[derive(Clone)]
pub struct CacheMetrics {
    requests: IntCounterVec,
    stores: IntCounter,
    errors: IntCounterVec,
}

impl CacheMetrics {
    /// Creates the metrics and registers them (an error when `cache` is listed twice).
    pub fn register(registry: &prometheus::Registry) -> Result<CacheMetrics, String> {
        let requests = IntCounterVec::new(
            Opts::new(
                "gw_cache_requests_total",
                "Requests that reached the cache, by final cache status",
            ),
            &["status"],
        )
        .map_err(|e| e.to_string())?;
        let stores = IntCounter::new("gw_cache_stores_total", "Answers stored in the cache")
            .map_err(|e| e.to_string())?;
        let errors = IntCounterVec::new(
            Opts::new(
                "gw_cache_backend_errors_total",
                "Cache backend failures (each treated as a miss or a skipped store)",
            ),
            &["op"],
        )
        .map_err(|e| e.to_string())?;
        for c in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(stores.clone()),
            Box::new(errors.clone()),
        ] {
            registry
                .register(c)
                .map_err(|e| format!("cannot register metrics (is `cache` listed twice?): {e}"))?;
        }
        Ok(CacheMetrics {
            requests,
            stores,
            errors,
        })
    }
}

/// What stores share with the tasks that finish them.
struct Shared {
    metrics: CacheMetrics,
    backend: &'static str,
    /// When a backend error was last logged (ms since the epoch): at most one a minute.
    last_warning_ms: AtomicU64,
}

impl Shared {
    fn stored(&self, result: Result<(), StoreError>) {
        match result {
            Ok(()) => self.metrics.stores.inc(),
            Err(e) => self.failed("set", &e),
        }
    }

    fn failed(&self, op: &'static str, e: &StoreError) {
        self.metrics.errors.with_label_values(&[op]).inc();
        let now = now_ms();
        let last = self.last_warning_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= 60_000
            && self
                .last_warning_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(backend = self.backend, op, error = %e,
                "cache backend failed; requests go on uncached (logged at most once a minute)");
        } else {
            tracing::debug!(backend = self.backend, op, error = %e, "cache backend failed");
        }
    }
}

/// The lookup sent with shared mode's admission, for `on_route`.
#[derive(Clone)]
struct Prefetched {
    key: CacheKey,
    entry: Result<Option<Entry>, StoreError>,
}

/// The request's cache entry to be, between `on_route` and the answer. Replaced on each
/// upstream attempt, so the key is that of the target that answers.
#[derive(Clone)]
struct Pending {
    key: CacheKey,
    ttl: Duration,
    /// A stream's events so far (`None` for a whole answer).
    capture: Option<Vec<u8>>,
}

pub struct CachePlugin {
    /// Settings for targets without their own.
    default: Option<CacheSettings>,
    default_max_age: u64,
    max_entry_bytes: usize,
    store: Arc<dyn CacheStore>,
    shared: Arc<Shared>,
    warned_semantic: AtomicBool,
}

impl CachePlugin {
    /// A plugin over a given store (the factory picks the store from the config).
    pub fn new(config: &CacheConfig, store: Arc<dyn CacheStore>, metrics: CacheMetrics) -> Self {
        let mut max_entry_bytes = config.max_entry_bytes;
        if store.name() == "memory" {
            // An entry larger than the whole memory cache could never be kept.
            max_entry_bytes = max_entry_bytes.min(config.max_bytes);
        }
        CachePlugin {
            default: config
                .default
                .as_ref()
                .map(config::DefaultCacheConfig::settings),
            default_max_age: config.default_max_age,
            max_entry_bytes: usize::try_from(max_entry_bytes).unwrap_or(usize::MAX),
            shared: Arc::new(Shared {
                metrics,
                backend: store.name(),
                last_warning_ms: AtomicU64::new(0),
            }),
            store,
            warned_semantic: AtomicBool::new(false),
        }
    }

    /// The settings that apply to this request and target, if caching may be on.
    fn settings_for(&self, cx: &RequestCx, target: &Target) -> Option<CacheSettings> {
        if !matches!(
            cx.route,
            Route::ChatCompletions | Route::Embeddings | Route::Messages
        ) {
            return None;
        }
        target.cache.clone().or_else(|| self.default.clone())
    }

    /// The answer to this request from a stored entry, if the entry fits it.
    fn answer(&self, cx: &mut RequestCx, entry: Entry, max_age: u64) -> Option<PluginResponse> {
        let age_ms = now_ms().saturating_sub(entry.stored_at_ms);
        if age_ms > max_age.saturating_mul(1000) {
            return None;
        }
        let stream = cx.request.is_stream();
        let wants_usage = matches!(&cx.request, LlmRequest::Chat(c) if c.wants_stream_usage());
        let (body, content_type) = match (stream, entry.sse) {
            (false, false) => (entry.body, entry.content_type),
            // A stream cannot answer a client that wants the whole answer.
            (false, true) => return None,
            (true, true) if cx.route == Route::ChatCompletions => {
                match (wants_usage, entry.usage_chunk) {
                    (true, false) => return None,
                    (false, true) => (replay::strip_usage_chunk(&entry.body), entry.content_type),
                    _ => (entry.body, entry.content_type),
                }
            }
            (true, true) => (entry.body, entry.content_type),
            (true, false) => {
                let body = match cx.route {
                    Route::ChatCompletions => replay::restream_chat(&entry.body, wants_usage)?,
                    Route::Messages => replay::restream_messages(&entry.body)?,
                    _ => return None,
                };
                (body, EVENT_STREAM.to_owned())
            }
        };
        let status = StatusCode::from_u16(entry.status).ok()?;
        let content_type = HeaderValue::from_str(&content_type)
            .unwrap_or_else(|_| HeaderValue::from_static("application/json"));
        cx.response.provider = entry.provider;
        cx.response.model = entry.model;
        cx.response.streamed = stream;
        Some(PluginResponse {
            status,
            headers: vec![
                (http::header::CONTENT_TYPE, content_type),
                (CACHE_STATUS_HEADER, HeaderValue::from_static(HIT)),
            ],
            body,
        })
    }

    fn warn_semantic(&self) {
        if !self.warned_semantic.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "a config asks for `cache.mode: semantic`, which this gateway does not serve: \
                 such requests are answered by the provider (MISS) and not stored"
            );
        }
    }
}

#[async_trait]
impl Plugin for CachePlugin {
    fn kind(&self) -> &'static str {
        CacheFactory::KIND
    }

    fn phases(&self) -> Phases {
        let phases = Phases::ROUTE | Phases::RESPONSE | Phases::CHUNK | Phases::LOG;
        match self.store.redis() {
            Some(_) => phases | Phases::REQUEST,
            None => phases,
        }
    }

    /// A Redis store looks up in the same round trip as the limits' admission.
    fn joins_deferred(&self) -> bool {
        self.store.redis().is_some()
    }

    /// With a Redis store and shared mode's admission pending on the same server: sends the
    /// lookup for the target provider selection chose in the admission's round trip
    /// ([`crate::limits::admission`]); `on_route` uses the entry found when its key is the
    /// one it computes (a guardrail that rewrote the body, or another target, looks up anew).
    async fn on_request(&self, cx: &mut RequestCx) -> Result<Flow, GatewayError> {
        let Some(redis) = self.store.redis() else {
            return Ok(Flow::Continue);
        };
        // A cluster's pipeline stays within one slot: the lookup's key is not the request's.
        if cx.gw.cache_force_refresh
            || redis.conn().is_cluster()
            || !Admission::pending_on(cx, redis.conn())
        {
            return Ok(Flow::Continue);
        }
        let Some(RoutePlan::Single(target)) = &cx.plan else {
            return Ok(Flow::Continue);
        };
        let wanted = self.settings_for(cx, target).is_some_and(|s| {
            s.mode != CacheMode::Semantic && s.max_age_secs.unwrap_or(self.default_max_age) > 0
        });
        if !wanted {
            return Ok(Flow::Continue);
        }
        let Ok(key) = key::key_for(cx, target) else {
            return Ok(Flow::Continue);
        };
        let command = redis.get_command(&key);
        let store = self.store.clone();
        let mut admission = Admission::join(cx, redis.conn()).await?;
        admission.set_extra(
            command,
            Box::new(move |cx, reply| {
                if let Some(redis) = store.redis() {
                    let entry = redis.read_reply(reply);
                    cx.extensions.insert(Prefetched { key, entry });
                }
            }),
        );
        cx.deferred = Some(Box::new(admission));
        Ok(Flow::Continue)
    }

    async fn on_route(
        &self,
        cx: &mut RequestCx,
        target: &mut Target,
    ) -> Result<Flow, GatewayError> {
        // A retry or fallback attempt starts over: the key depends on the target.
        cx.extensions.remove::<Pending>();
        let Some(settings) = self.settings_for(cx, target) else {
            cx.response.cache_status = Some(DISABLED);
            return Ok(Flow::Continue);
        };
        if settings.mode == CacheMode::Semantic {
            self.warn_semantic();
            cx.response.cache_status = Some(MISS);
            return Ok(Flow::Continue);
        }
        let max_age = settings
            .max_age_secs
            .unwrap_or(self.default_max_age)
            .min(MAX_AGE_CAP_SECS);
        if max_age == 0 {
            cx.response.cache_status = Some(DISABLED);
            return Ok(Flow::Continue);
        }
        let key = match key::key_for(cx, target) {
            Ok(key) => key,
            Err(e) => {
                tracing::debug!(trace_id = %cx.trace_id, error = %e, "request not cacheable");
                cx.response.cache_status = Some(DISABLED);
                return Ok(Flow::Continue);
            }
        };
        if cx.gw.cache_force_refresh {
            cx.response.cache_status = Some(REFRESH);
        } else {
            let prefetched = cx
                .extensions
                .remove::<Prefetched>()
                .filter(|p| p.key == key);
            let found = match prefetched {
                Some(p) => p.entry,
                None => self.store.get(&key).await,
            };
            match found {
                Ok(Some(entry)) => {
                    if let Some(response) = self.answer(cx, entry, max_age) {
                        cx.response.cache_status = Some(HIT);
                        return Ok(Flow::Respond(response));
                    }
                }
                Ok(None) => {}
                Err(e) => self.shared.failed("get", &e),
            }
            cx.response.cache_status = Some(MISS);
        }
        cx.extensions.insert(Pending {
            key,
            ttl: Duration::from_secs(max_age),
            capture: cx.request.is_stream().then(Vec::new),
        });
        Ok(Flow::Continue)
    }

    async fn on_response(
        &self,
        cx: &mut RequestCx,
        response: &mut ResponseParts,
    ) -> Result<Flow, GatewayError> {
        let Some(pending) = cx.extensions.remove::<Pending>() else {
            return Ok(Flow::Continue);
        };
        if !response.status.is_success() || response.body.len() > self.max_entry_bytes {
            return Ok(Flow::Continue);
        }
        let content_type = response
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/json")
            .to_owned();
        let entry = Entry {
            status: response.status.as_u16(),
            sse: content_type.starts_with(EVENT_STREAM),
            content_type,
            usage_chunk: false,
            stored_at_ms: now_ms(),
            provider: cx.response.provider.clone(),
            model: cx.response.model.clone(),
            body: response.body.clone(),
        };
        if self.store.redis().is_some() {
            // Off the answer's path: written within a round trip, so a client's identical
            // request sent sooner than that still misses.
            let shared = self.shared.clone();
            self.store.clone().put_detached(
                pending.key,
                entry,
                pending.ttl,
                Box::new(move |result| shared.stored(result)),
            );
            return Ok(Flow::Continue);
        }
        // Awaited (in process, it takes no time): the client's next request finds the answer.
        let result = self.store.put(&pending.key, entry, pending.ttl).await;
        self.shared.stored(result);
        Ok(Flow::Continue)
    }

    fn on_chunk(&self, cx: &mut RequestCx, chunk: &mut Chunk) -> Result<Flow, GatewayError> {
        let success = cx.response.status.is_some_and(|s| (200..300).contains(&s));
        let messages = cx.route == Route::Messages;
        let Some(pending) = cx.extensions.get_mut::<Pending>() else {
            return Ok(Flow::Continue);
        };
        let Some(buf) = pending.capture.as_mut() else {
            return Ok(Flow::Continue);
        };
        if !success || buf.len() + chunk.data.len() > self.max_entry_bytes {
            cx.extensions.remove::<Pending>();
            return Ok(Flow::Continue);
        }
        buf.extend_from_slice(&chunk.data);
        match replay::watch(&chunk.data, messages) {
            Signal::Continue => {}
            Signal::Failed => {
                cx.extensions.remove::<Pending>();
            }
            Signal::End => {
                let Some(Pending {
                    key,
                    ttl,
                    capture: Some(body),
                }) = cx.extensions.remove::<Pending>()
                else {
                    return Ok(Flow::Continue);
                };
                let entry = Entry {
                    status: cx.response.status.unwrap_or(200),
                    content_type: EVENT_STREAM.to_owned(),
                    sse: true,
                    usage_chunk: !messages && replay::has_usage_chunk(&body),
                    stored_at_ms: now_ms(),
                    provider: cx.response.provider.clone(),
                    model: cx.response.model.clone(),
                    body: body.into(),
                };
                let shared = self.shared.clone();
                Arc::clone(&self.store).put_detached(
                    key,
                    entry,
                    ttl,
                    Box::new(move |result| shared.stored(result)),
                );
            }
        }
        Ok(Flow::Continue)
    }

    fn on_log(&self, cx: &RequestCx) {
        let label = match cx.response.cache_status {
            Some(HIT) => "hit",
            Some(MISS) => "miss",
            Some(REFRESH) => "refresh",
            Some(DISABLED) => "disabled",
            _ => return,
        };
        self.shared
            .metrics
            .requests
            .with_label_values(&[label])
            .inc();
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
