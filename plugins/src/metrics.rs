//! `metrics`: Prometheus metrics of every request, recorded in `on_log` and served by the gateway
//! at `GET /metrics`.
//!
//! - `gw_requests_total{route,provider,model,status_class}`
//! - `gw_request_duration_seconds{route,provider,model,status_class}` (histogram)
//! - `gw_upstream_duration_seconds{provider}` (histogram, time to the upstream response header)
//! - `gw_tokens_total{provider,model,direction="in"|"out"}`
//!
//! Labels are bounded: `model` keeps the first `max_models` distinct names and folds the rest
//! into `other`, because model names come from clients. Keys and users are never labels.

use std::collections::HashSet;
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts};
use serde::Deserialize;

use plugin_sdk::{BuildCx, ConfigIssue, Plugin, PluginFactory, RequestCx};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Distinct `model` label values kept before the rest become `other`. Default: 200.
    #[serde(default = "default_max_models")]
    pub max_models: usize,
}

fn default_max_models() -> usize {
    200
}

pub struct Metrics {
    requests: IntCounterVec,
    duration: HistogramVec,
    upstream: HistogramVec,
    tokens: IntCounterVec,
    models: ModelLabels,
}

pub struct MetricsFactory;

impl PluginFactory for MetricsFactory {
    const KIND: &'static str = "metrics";
    const SUMMARY: &'static str =
        "Counts requests, latency and tokens by provider, model and status class for GET /metrics";
    const EXAMPLE: &'static str = "- kind: metrics\n  max_models: 200";
    type Config = MetricsConfig;

    fn validate(config: &Self::Config) -> Vec<ConfigIssue> {
        if config.max_models == 0 {
            vec![ConfigIssue::new("max_models", "must be at least 1")]
        } else {
            Vec::new()
        }
    }

    fn build(config: Self::Config, cx: &BuildCx) -> Result<Arc<dyn Plugin>, String> {
        let latency_buckets = vec![
            0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            60.0, 120.0,
        ];
        let requests = IntCounterVec::new(
            Opts::new("gw_requests_total", "Requests answered by the gateway"),
            &["route", "provider", "model", "status_class"],
        )
        .map_err(|e| e.to_string())?;
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "gw_request_duration_seconds",
                "Time from request arrival to the end of the response",
            )
            .buckets(latency_buckets.clone()),
            &["route", "provider", "model", "status_class"],
        )
        .map_err(|e| e.to_string())?;
        let upstream = HistogramVec::new(
            HistogramOpts::new(
                "gw_upstream_duration_seconds",
                "Time from sending the upstream request to its response header",
            )
            .buckets(latency_buckets),
            &["provider"],
        )
        .map_err(|e| e.to_string())?;
        let tokens = IntCounterVec::new(
            Opts::new("gw_tokens_total", "Tokens reported by providers"),
            &["provider", "model", "direction"],
        )
        .map_err(|e| e.to_string())?;
        for c in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(duration.clone()),
            Box::new(upstream.clone()),
            Box::new(tokens.clone()),
        ] {
            cx.metrics.register(c).map_err(|e| {
                format!("cannot register metrics (is `metrics` listed twice?): {e}")
            })?;
        }
        Ok(Arc::new(Metrics {
            requests,
            duration,
            upstream,
            tokens,
            models: ModelLabels::new(config.max_models),
        }))
    }
}

plugin_sdk::register_plugin!(MetricsFactory);

#[async_trait]
impl Plugin for Metrics {
    fn kind(&self) -> &'static str {
        MetricsFactory::KIND
    }

    fn on_log(&self, cx: &RequestCx) {
        let r = &cx.response;
        let provider = r.provider.as_deref().unwrap_or("none");
        let model = self.models.label(
            r.model
                .as_deref()
                .or(cx.requested_model())
                .unwrap_or("none"),
        );
        let class = status_class(r.status.unwrap_or(0));
        let labels = [cx.route.as_str(), provider, model.as_str(), class];
        self.requests.with_label_values(&labels).inc();
        self.duration
            .with_label_values(&labels)
            .observe(cx.started.elapsed().as_secs_f64());
        if let Some(d) = r.upstream_latency {
            self.upstream
                .with_label_values(&[provider])
                .observe(d.as_secs_f64());
        }
        if let Some(usage) = r.usage {
            self.tokens
                .with_label_values(&[provider, model.as_str(), "in"])
                .inc_by(usage.prompt_tokens);
            self.tokens
                .with_label_values(&[provider, model.as_str(), "out"])
                .inc_by(usage.completion_tokens);
        }
    }
}

fn status_class(status: u16) -> &'static str {
    match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        500..=599 => "5xx",
        _ => "none",
    }
}

/// Keeps the `model` label's cardinality bounded.
struct ModelLabels {
    max: usize,
    seen: RwLock<HashSet<String>>,
}

impl ModelLabels {
    fn new(max: usize) -> Self {
        ModelLabels {
            max,
            seen: RwLock::new(HashSet::new()),
        }
    }

    fn label(&self, model: &str) -> String {
        if let Ok(seen) = self.seen.read() {
            if seen.contains(model) {
                return model.to_owned();
            }
        }
        match self.seen.write() {
            Ok(mut seen) if seen.len() < self.max || seen.contains(model) => {
                seen.insert(model.to_owned());
                model.to_owned()
            }
            _ => "other".to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_labels_are_bounded() {
        let labels = ModelLabels::new(2);
        assert_eq!(labels.label("a"), "a");
        assert_eq!(labels.label("b"), "b");
        assert_eq!(labels.label("c"), "other");
        assert_eq!(labels.label("a"), "a");
    }

    #[test]
    fn status_classes() {
        assert_eq!(status_class(200), "2xx");
        assert_eq!(status_class(446), "4xx");
        assert_eq!(status_class(503), "5xx");
        assert_eq!(status_class(0), "none");
    }
}
