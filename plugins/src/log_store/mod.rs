//! `log_store`: every request's record, written to the control plane's database (through
//! [`BuildCx::sink`](plugin_sdk::BuildCx)) by a batched background writer, never on the
//! request's path.
//!
//! **When it runs.** `on_log` (every request, after the response is done or the request
//! failed) builds a [`LogRecord`]: trace and span ids, metadata, the caller (organisation,
//! workspace, API key and user of the [`Principal`] that `auth` attached), route, method,
//! path, provider, model, status (0 when none was sent), latency, upstream latency, tokens,
//! cost, cache status, retries, the config node that answered, whether it streamed, the
//! error. It hands the record to a bounded queue without waiting: when the queue is full the
//! record is dropped and counted. See [`writer`] for the batching, retries and flushing.
//!
//! **Cost.** `cx.response.cost` when a plugin set it; otherwise, when the provider reported
//! usage, the shipped price table's cost of the provider and model, computed by the writer.
//!
//! **Bodies** (`bodies: true`; off by default). The request body, and the response body of a
//! complete answer (taken in `on_response`) or the concatenated events of a stream (taken in
//! `on_chunk`), each kept up to `max_body_bytes`, with the value of every JSON field that names
//! a secret (`api_key`, `authorization`, `password`, `token`... see [`redact`]) replaced by
//! `"[REDACTED]"`; text that is not JSON is kept as text. Only a prefix of each body is copied
//! on the request's path; redaction happens in the writer. Response phases run in reverse
//! pipeline order, so list `log_store` first to keep the answer as the client received it
//! (after output guardrails). An answer a plugin gave itself (a cache hit, a refusal) has no
//! response body in the log: `on_response` does not run for it.
//!
//! **Metrics.** `gw_log_queue_depth`, `gw_log_records_total{outcome="written"|"dropped_full"|
//! "dropped_error"}`, `gw_log_batches_total{outcome="written"|"retried"|"dropped_error"}`.
//!
//! **Shutdown.** Dropping the plugin writes what is queued (waiting up to
//! [`writer::SHUTDOWN_WAIT`]); a process that exits without dropping its pipeline calls
//! [`flush_all`] first.

pub mod config;
pub mod redact;
pub mod writer;

#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;

use plugin_sdk::plugin::ResponseParts;
use plugin_sdk::sinks::{LogRecord, SharedSink};
use plugin_sdk::{
    BuildCx, Chunk, ConfigIssue, Flow, GatewayError, Phases, Plugin, PluginFactory, Principal,
    RequestCx, Usage,
};

use crate::pricing::PriceTable;
pub use config::LogStoreConfig;
pub use writer::flush_all;
use writer::{Entry, LogMetrics, Queue, RawBody, WriterSettings};

/// The plugin: the queue's sending side and what to capture.
pub struct LogStore {
    queue: Queue,
    /// `Some(max_body_bytes)` when bodies are kept.
    bodies: Option<usize>,
}

pub struct LogStoreFactory;

impl PluginFactory for LogStoreFactory {
    const KIND: &'static str = "log_store";
    const SUMMARY: &'static str =
        "Writes every request's record (caller, provider, model, status, tokens, cost) to the database through a batched background writer";
    const EXAMPLE: &'static str = "- kind: log_store\n  queue_capacity: 10000\n  batch_size: 200\n  flush_interval_ms: 500\n  bodies: false          # true: keep request and response bodies, secrets redacted\n  max_body_bytes: 65536";
    type Config = LogStoreConfig;

    fn validate(config: &Self::Config) -> Vec<ConfigIssue> {
        config::validate(config)
    }

    fn build(config: Self::Config, cx: &BuildCx) -> Result<Arc<dyn Plugin>, String> {
        let settings = WriterSettings::new(
            config.queue_capacity,
            config.batch_size,
            Duration::from_millis(config.flush_interval_ms),
            config.max_body_bytes,
        );
        let plugin = LogStore::start(settings, config.bodies, cx.sink.clone(), &cx.metrics)?;
        Ok(Arc::new(plugin))
    }
}

plugin_sdk::register_plugin!(LogStoreFactory);

impl LogStore {
    /// Registers the metrics and starts the writer (see [`writer`]).
    pub fn start(
        mut settings: WriterSettings,
        bodies: bool,
        sink: SharedSink,
        registry: &prometheus::Registry,
    ) -> Result<LogStore, String> {
        // The same floor as the config's check, for callers that skip it.
        let max_body_bytes = settings.max_body_bytes.max(config::MIN_MAX_BODY_BYTES);
        settings.max_body_bytes = max_body_bytes;
        let queue = Queue::start(settings, sink, LogMetrics::new()?, registry)?;
        Ok(LogStore {
            queue,
            bodies: bodies.then_some(max_body_bytes),
        })
    }

    /// Writes what is queued and waits for it, up to `timeout`; true when done in time.
    pub fn flush(&self, timeout: Duration) -> bool {
        self.queue.flush(timeout)
    }
}

/// The answer's body as captured for the log (in the request's extensions).
#[derive(Clone)]
struct CapturedResponse(RawBody);

/// A stream's events so far, up to the cap (in the request's extensions).
#[derive(Clone, Default)]
struct CapturedStream {
    data: Vec<u8>,
    cut: bool,
}

/// At most `max` bytes of `body`, copied: a queued record never keeps a request's (possibly
/// much larger) buffer alive, so the queue holds at most `2 * max` body bytes per record.
fn capture(body: &[u8], max: usize) -> RawBody {
    let keep = body.len().min(max);
    RawBody {
        bytes: Bytes::copy_from_slice(&body[..keep]),
        cut: keep < body.len(),
    }
}

#[async_trait]
impl Plugin for LogStore {
    fn kind(&self) -> &'static str {
        LogStoreFactory::KIND
    }

    fn phases(&self) -> Phases {
        Phases::RESPONSE | Phases::CHUNK | Phases::LOG
    }

    /// Keeps the answer's body when bodies are logged.
    async fn on_response(
        &self,
        cx: &mut RequestCx,
        response: &mut ResponseParts,
    ) -> Result<Flow, GatewayError> {
        if let Some(max) = self.bodies {
            cx.extensions
                .insert(CapturedResponse(capture(&response.body, max)));
        }
        Ok(Flow::Continue)
    }

    /// Gathers a stream's events, up to `max_body_bytes`, when bodies are logged.
    fn on_chunk(&self, cx: &mut RequestCx, chunk: &mut Chunk) -> Result<Flow, GatewayError> {
        let Some(max) = self.bodies else {
            return Ok(Flow::Continue);
        };
        if cx.extensions.get::<CapturedStream>().is_none() {
            cx.extensions.insert(CapturedStream::default());
        }
        if let Some(stream) = cx.extensions.get_mut::<CapturedStream>() {
            let room = max.saturating_sub(stream.data.len());
            let take = room.min(chunk.data.len());
            stream.data.extend_from_slice(&chunk.data[..take]);
            stream.cut |= take < chunk.data.len();
        }
        Ok(Flow::Continue)
    }

    fn on_log(&self, cx: &RequestCx) {
        self.queue.push(self.entry(cx));
    }
}

impl LogStore {
    /// The record of a finished request, with the bodies still to be redacted.
    fn entry(&self, cx: &RequestCx) -> Entry {
        let record = record_of(cx);
        let price_later = record.cost.is_none() && cx.response.usage.is_some();
        let (request_body, response_body) = match self.bodies {
            None => (None, None),
            Some(max) => {
                let response = if let Some(CapturedResponse(body)) = cx.extensions.get() {
                    Some(body.clone())
                } else {
                    cx.extensions.get::<CapturedStream>().map(|s| RawBody {
                        bytes: Bytes::copy_from_slice(&s.data),
                        cut: s.cut,
                    })
                };
                (Some(capture(&cx.body, max)), response)
            }
        };
        Entry {
            record,
            request_body,
            response_body,
            price_later,
        }
    }
}

/// The fields of a request's log record that `on_log` knows (no id, bodies or computed cost:
/// the writer adds those).
pub fn record_of(cx: &RequestCx) -> LogRecord {
    let r = &cx.response;
    let elapsed = cx.started.elapsed();
    let usage = r.usage.unwrap_or_default();
    let principal = cx.extensions.get::<Principal>();
    let of_principal = |f: fn(&Principal) -> &Option<String>| principal.and_then(|p| f(p).clone());
    LogRecord {
        id: String::new(),
        trace_id: cx.trace_id.clone(),
        span_id: cx.gw.span_id.clone(),
        parent_span_id: cx.gw.parent_span_id.clone(),
        span_name: cx.gw.span_name.clone(),
        // When the request arrived.
        created_at: SystemTime::now().checked_sub(elapsed),
        organisation_id: of_principal(|p| &p.organisation_id),
        workspace_id: of_principal(|p| &p.workspace_id),
        api_key_id: of_principal(|p| &p.api_key_id),
        user_id: of_principal(|p| &p.user_id),
        metadata: cx.gw.metadata.clone(),
        route: cx.route.as_str().to_owned(),
        method: cx.method.as_str().to_owned(),
        path: cx.path.clone(),
        provider: r.provider.clone(),
        model: cx.answered_model().map(str::to_owned),
        status: r.status.unwrap_or(0),
        latency_ms: elapsed.as_millis() as u64,
        upstream_latency_ms: r.upstream_latency.map(|d| d.as_millis() as u64),
        prompt_tokens: usage.prompt_tokens,
        completion_tokens: usage.completion_tokens,
        cost: r.cost,
        cache_status: r.cache_status.map(str::to_owned),
        retries: r.retries,
        final_target: r.option_index.clone(),
        streamed: r.streamed,
        error: r.error.clone(),
        request_body: None,
        response_body: None,
    }
}

/// The cost of `usage` from the shipped price table, for a request that did not set
/// `cx.response.cost` (no `usage_limit` plugin priced it). `None` without a provider or model,
/// or for a model without a price. Per-integration price overrides are `usage_limit`'s: they
/// reach the log through `cx.response.cost`.
pub fn computed_cost(provider: Option<&str>, model: Option<&str>, usage: Usage) -> Option<f64> {
    PriceTable::shipped_ref().cost(provider?, model?, usage)
}
