//! `request_log`: one structured `tracing` event per request, emitted in `on_log`.
//!
//! Fields: trace id, span ids, route, method, path, provider, model, status, latency (us),
//! upstream latency (us), prompt and completion tokens, streamed, cache status, retries, error.
//! Nothing secret is logged: no keys, no bodies.

use std::sync::Arc;

use async_trait::async_trait;
use serde::Deserialize;

use plugin_sdk::{BuildCx, Phases, Plugin, PluginFactory, RequestCx};

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
        }))
    }
}

plugin_sdk::register_plugin!(RequestLogFactory);

macro_rules! request_event {
    ($level:expr, $cx:expr) => {{
        let cx = $cx;
        let r = &cx.response;
        let usage = r.usage.unwrap_or_default();
        tracing::event!(
            target: "gateway::request",
            $level,
            trace_id = cx.trace_id.as_str(),
            span_id = cx.gw.span_id.as_deref(),
            parent_span_id = cx.gw.parent_span_id.as_deref(),
            span_name = cx.gw.span_name.as_deref(),
            route = cx.route.as_str(),
            method = cx.method.as_str(),
            path = cx.path.as_str(),
            provider = r.provider.as_deref().unwrap_or("-"),
            model = r.model.as_deref().or(cx.requested_model()).unwrap_or("-"),
            status = r.status.unwrap_or(0),
            latency_us = cx.started.elapsed().as_micros() as u64,
            upstream_us = r.upstream_latency.map(|d| d.as_micros() as u64),
            prompt_tokens = usage.prompt_tokens,
            completion_tokens = usage.completion_tokens,
            streamed = r.streamed,
            cache = r.cache_status,
            retries = r.retries,
            error = r.error.as_deref(),
            "request"
        );
    }};
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
        match self.level {
            LogLevel::Info => request_event!(tracing::Level::INFO, cx),
            LogLevel::Debug => request_event!(tracing::Level::DEBUG, cx),
        }
    }
}
