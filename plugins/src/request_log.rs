//! `request_log`: one structured `tracing` event per request (target `gateway::request`,
//! message `request`).
//!
//! Fields: trace id, span ids, route, method, path, provider, model, status, latency (us),
//! upstream latency (us), prompt and completion tokens, streamed, cache status, retries, error.
//! Nothing secret is logged: no keys, no bodies.
//!
//! `on_log` only copies these fields into a queue; a background thread (`request-log`) emits the
//! events, at most [`EMIT_EVERY`] later, so that formatting the line is not part of the request
//! on the proxy's worker thread. When [`MAX_PENDING`] lines are waiting (the log output has
//! stalled), further lines are dropped and their number is logged once the queue drains. A
//! gateway that shuts down calls [`flush`] before it exits.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use http::Method;
use serde::Deserialize;

use plugin_sdk::{BuildCx, Phases, Plugin, PluginFactory, RequestCx};

/// The longest a line waits in the queue.
pub const EMIT_EVERY: Duration = Duration::from_millis(50);
/// Lines that wake the emitter early.
const WAKE_AT: usize = 1024;
/// Lines waiting past which new ones are dropped.
pub const MAX_PENDING: usize = 65_536;

/// The log level of the request line.
#[derive(Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Debug,
    #[default]
    Info,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RequestLogConfig {
    /// Level of the request line. Default: `info`.
    #[serde(default)]
    pub level: LogLevel,
}

pub struct RequestLog {
    level: LogLevel,
    queue: Arc<LineQueue>,
}

pub struct RequestLogFactory;

impl PluginFactory for RequestLogFactory {
    const KIND: &'static str = "request_log";
    const SUMMARY: &'static str =
        "Writes one structured log line per request (trace id, provider, model, status, latency, tokens)";
    const EXAMPLE: &'static str = "- kind: request_log\n  level: info   # or debug";
    type Config = RequestLogConfig;

    fn build(config: Self::Config, _cx: &BuildCx) -> Result<Arc<dyn Plugin>, String> {
        Ok(Arc::new(RequestLog {
            level: config.level,
            queue: shared_queue(),
        }))
    }
}

plugin_sdk::register_plugin!(RequestLogFactory);

/// The fields of one request line, copied out of the request's context.
#[derive(Debug)]
struct Line {
    level: LogLevel,
    trace_id: String,
    span_id: Option<String>,
    parent_span_id: Option<String>,
    span_name: Option<String>,
    route: &'static str,
    method: Method,
    path: String,
    provider: Option<String>,
    model: Option<String>,
    status: u16,
    latency_us: u64,
    upstream_us: Option<u64>,
    prompt_tokens: u64,
    completion_tokens: u64,
    streamed: bool,
    cache: Option<&'static str>,
    retries: u32,
    error: Option<String>,
}

impl Line {
    fn of(level: LogLevel, cx: &RequestCx) -> Line {
        let r = &cx.response;
        let usage = r.usage.unwrap_or_default();
        Line {
            level,
            trace_id: cx.trace_id.clone(),
            span_id: cx.gw.span_id.clone(),
            parent_span_id: cx.gw.parent_span_id.clone(),
            span_name: cx.gw.span_name.clone(),
            route: cx.route.as_str(),
            method: cx.method.clone(),
            path: cx.path.clone(),
            provider: r.provider.clone(),
            model: cx.answered_model().map(str::to_owned),
            status: r.status.unwrap_or(0),
            latency_us: cx.started.elapsed().as_micros() as u64,
            upstream_us: r.upstream_latency.map(|d| d.as_micros() as u64),
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            streamed: r.streamed,
            cache: r.cache_status,
            retries: r.retries,
            error: r.error.clone(),
        }
    }

    fn emit(&self) {
        macro_rules! request_event {
            ($level:expr) => {
                tracing::event!(
                    target: "gateway::request",
                    $level,
                    trace_id = self.trace_id.as_str(),
                    span_id = self.span_id.as_deref(),
                    parent_span_id = self.parent_span_id.as_deref(),
                    span_name = self.span_name.as_deref(),
                    route = self.route,
                    method = self.method.as_str(),
                    path = self.path.as_str(),
                    provider = self.provider.as_deref().unwrap_or("-"),
                    model = self.model.as_deref().unwrap_or("-"),
                    status = self.status,
                    latency_us = self.latency_us,
                    upstream_us = self.upstream_us,
                    prompt_tokens = self.prompt_tokens,
                    completion_tokens = self.completion_tokens,
                    streamed = self.streamed,
                    cache = self.cache,
                    retries = self.retries,
                    error = self.error.as_deref(),
                    "request"
                )
            };
        }
        match self.level {
            LogLevel::Info => request_event!(tracing::Level::INFO),
            LogLevel::Debug => request_event!(tracing::Level::DEBUG),
        }
    }
}

/// Lines waiting to be emitted.
#[derive(Default)]
struct LineQueue {
    lines: Mutex<Vec<Line>>,
    wake: Condvar,
    dropped: AtomicU64,
}

impl LineQueue {
    fn push(&self, line: Line) {
        let Ok(mut lines) = self.lines.lock() else {
            return;
        };
        if lines.len() >= MAX_PENDING {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        lines.push(line);
        if lines.len() == WAKE_AT {
            self.wake.notify_one();
        }
    }

    /// Emits every waiting line on the calling thread.
    fn emit_all(&self) {
        let lines = match self.lines.lock() {
            // The next batch's room is allocated here, not by a request's push.
            Ok(mut lines) => {
                let capacity = lines.capacity().clamp(64, WAKE_AT);
                std::mem::replace(&mut *lines, Vec::with_capacity(capacity))
            }
            Err(_) => return,
        };
        for line in &lines {
            line.emit();
        }
        let dropped = self.dropped.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            tracing::warn!(
                target: "gateway::request",
                dropped,
                "request log lines dropped: the log output could not keep up"
            );
        }
    }

    /// Emits what arrives, every [`EMIT_EVERY`] or when [`WAKE_AT`] lines wait, for ever.
    fn run(&self) {
        loop {
            if let Ok(lines) = self.lines.lock() {
                if lines.len() < WAKE_AT {
                    let _ = self.wake.wait_timeout(lines, EMIT_EVERY);
                }
            }
            self.emit_all();
        }
    }
}

/// The process's queue and its emitter thread, started by the first plugin built.
fn shared_queue() -> Arc<LineQueue> {
    static QUEUE: OnceLock<Arc<LineQueue>> = OnceLock::new();
    QUEUE
        .get_or_init(|| {
            let queue = Arc::new(LineQueue::default());
            let emitter = queue.clone();
            let spawned = std::thread::Builder::new()
                .name("request-log".into())
                .spawn(move || emitter.run());
            if let Err(e) = spawned {
                // Lines then wait for `flush`, which emits them at shutdown.
                tracing::error!(error = %e, "cannot start the request log thread");
            }
            queue
        })
        .clone()
}

/// Emits every request line still waiting, on the calling thread: before the process exits.
pub fn flush() {
    shared_queue().emit_all();
}

#[async_trait]
impl Plugin for RequestLog {
    fn kind(&self) -> &'static str {
        RequestLogFactory::KIND
    }

    fn phases(&self) -> Phases {
        Phases::LOG
    }

    fn on_log(&self, cx: &RequestCx) {
        let enabled = match self.level {
            LogLevel::Info => tracing::enabled!(target: "gateway::request", tracing::Level::INFO),
            LogLevel::Debug => {
                tracing::enabled!(target: "gateway::request", tracing::Level::DEBUG)
            }
        };
        if enabled {
            self.queue.push(Line::of(self.level, cx));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use plugin_sdk::Route;

    use super::*;

    /// Log output collected in memory.
    #[derive(Clone, Default)]
    struct Output(Arc<Mutex<Vec<u8>>>);

    impl Write for Output {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn request(trace_id: &str) -> RequestCx {
        let mut cx = RequestCx::new(
            trace_id.into(),
            Route::ChatCompletions,
            Method::POST,
            "/v1/chat/completions".into(),
        );
        cx.response.provider = Some("openai".into());
        cx.response.model = Some("gpt-4o".into());
        cx.response.status = Some(200);
        cx.response.usage = Some(plugin_sdk::Usage {
            prompt_tokens: 12,
            completion_tokens: 5,
        });
        cx
    }

    /// Runs `work` with a JSON subscriber at `max` level; returns the lines it wrote.
    fn logged(max: tracing::Level, work: impl FnOnce()) -> Vec<serde_json::Value> {
        let output = Output::default();
        let writer = output.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .flatten_event(true)
            .with_max_level(max)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, work);
        let text = String::from_utf8(output.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn a_request_line_is_queued_then_emitted_with_its_fields() {
        let queue = Arc::new(LineQueue::default());
        let plugin = RequestLog {
            level: LogLevel::Info,
            queue: queue.clone(),
        };
        let lines = logged(tracing::Level::INFO, || {
            plugin.on_log(&request("trace-1"));
            assert_eq!(
                queue.lines.lock().unwrap().len(),
                1,
                "queued, not yet written"
            );
            queue.emit_all();
        });
        assert_eq!(lines.len(), 1, "{lines:?}");
        let line = &lines[0];
        assert_eq!(line["target"], "gateway::request");
        assert_eq!(line["message"], "request");
        assert_eq!(line["trace_id"], "trace-1");
        assert_eq!(line["route"], "chat.completions");
        assert_eq!(line["method"], "POST");
        assert_eq!(line["provider"], "openai");
        assert_eq!(line["model"], "gpt-4o");
        assert_eq!(line["status"], 200);
        assert_eq!(line["prompt_tokens"], 12);
        assert_eq!(line["completion_tokens"], 5);
        assert!(line.get("error").is_none(), "{line}");
        assert!(queue.lines.lock().unwrap().is_empty());
    }

    #[test]
    fn a_level_the_subscriber_does_not_want_queues_nothing() {
        let queue = Arc::new(LineQueue::default());
        let plugin = RequestLog {
            level: LogLevel::Debug,
            queue: queue.clone(),
        };
        let lines = logged(tracing::Level::INFO, || {
            plugin.on_log(&request("trace-2"));
            queue.emit_all();
        });
        assert!(lines.is_empty(), "{lines:?}");
        assert!(queue.lines.lock().unwrap().is_empty());
    }

    #[test]
    fn past_the_bound_lines_are_dropped_and_counted() {
        let queue = LineQueue::default();
        let cx = request("trace-3");
        for _ in 0..MAX_PENDING + 3 {
            queue.push(Line::of(LogLevel::Info, &cx));
        }
        assert_eq!(queue.lines.lock().unwrap().len(), MAX_PENDING);
        assert_eq!(queue.dropped.load(Ordering::Relaxed), 3);
        let lines = logged(tracing::Level::INFO, || queue.emit_all());
        assert_eq!(lines.len(), MAX_PENDING + 1);
        let warning = lines.last().unwrap();
        assert_eq!(warning["level"], "WARN");
        assert_eq!(warning["dropped"], 3);
        assert_eq!(queue.dropped.load(Ordering::Relaxed), 0);
    }
}
