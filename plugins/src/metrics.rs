//! `metrics`: Prometheus metrics of every request, recorded in `on_log` and served by the gateway
//! at `GET /metrics`.
//!
//! - `gw_requests_total{route,provider,model,status_class}`
//! - `gw_request_duration_seconds{route,provider,model,status_class}` (histogram)
//! - `gw_upstream_duration_seconds{provider}` (histogram, time to the upstream response header)
//! - `gw_tokens_total{provider,model,direction="in"|"out"}`
//! - `gw_cost_usd_total{provider,model}`: US dollars, from `cx.response.cost` when a plugin set
//!   it, else from the shipped price table when the provider reported usage (a model without a
//!   price adds nothing)
//!
//! Cache outcomes (`gw_cache_requests_total`) and refusals by auth, rate limits and budgets are
//! counted by those plugins themselves; the request log's queue by `log_store`.
//!
//! Labels are bounded: `model` keeps the first `max_models` distinct names and folds the rest
//! into `other`, because model names come from clients. Keys and users are never labels.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock, RwLock};

use async_trait::async_trait;
use prometheus::{
    Counter, CounterVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts,
};
use serde::Deserialize;

use plugin_sdk::{BuildCx, ConfigIssue, Phases, Plugin, PluginFactory, RequestCx};

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
    cost: CounterVec,
    models: ModelLabels,
    /// Handles by label values; as bounded as the labels themselves.
    series: RwLock<HashMap<String, Arc<Series>>>,
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
        let cost = CounterVec::new(
            Opts::new(
                "gw_cost_usd_total",
                "Cost of the answers in US dollars, from the price table",
            ),
            &["provider", "model"],
        )
        .map_err(|e| e.to_string())?;
        for c in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(duration.clone()),
            Box::new(upstream.clone()),
            Box::new(tokens.clone()),
            Box::new(cost.clone()),
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
            cost,
            models: ModelLabels::new(config.max_models),
            series: RwLock::new(HashMap::new()),
        }))
    }
}

plugin_sdk::register_plugin!(MetricsFactory);

#[async_trait]
impl Plugin for Metrics {
    fn kind(&self) -> &'static str {
        MetricsFactory::KIND
    }

    fn phases(&self) -> Phases {
        Phases::LOG
    }

    fn on_log(&self, cx: &RequestCx) {
        let r = &cx.response;
        let provider = r.provider.as_deref().unwrap_or("none");
        let model_name = cx.answered_model();
        let class = status_class(r.status.unwrap_or(0));
        let series = self.series(cx.route.as_str(), provider, model_name, class);
        series.requests.inc();
        series.duration.observe(cx.started.elapsed().as_secs_f64());
        if let Some(d) = r.upstream_latency {
            series
                .upstream
                .get_or_init(|| self.upstream.with_label_values(&[provider]))
                .observe(d.as_secs_f64());
        }
        if let Some(usage) = r.usage {
            let (tokens_in, tokens_out) = series.tokens.get_or_init(|| {
                let model = series.model.as_str();
                (
                    self.tokens.with_label_values(&[provider, model, "in"]),
                    self.tokens.with_label_values(&[provider, model, "out"]),
                )
            });
            tokens_in.inc_by(usage.prompt_tokens);
            tokens_out.inc_by(usage.completion_tokens);
        }
        let cost = r.cost.or_else(|| {
            r.usage.and_then(|usage| {
                crate::log_store::computed_cost(r.provider.as_deref(), model_name, usage)
            })
        });
        // A counter only goes up (and a negative add panics in debug builds): skip nonsense.
        if let Some(cost) = cost.filter(|c| c.is_finite() && *c > 0.0) {
            series
                .cost
                .get_or_init(|| {
                    self.cost
                        .with_label_values(&[provider, series.model.as_str()])
                })
                .inc_by(cost);
        }
    }
}

/// The handles of one (route, provider, model, status class): looked up once per request
/// instead of once per metric. The handles of metrics a request may not have (upstream
/// latency, tokens, cost) are made when first used, so a series never shows up at zero.
struct Series {
    /// The `model` label, after folding.
    model: String,
    requests: IntCounter,
    duration: Histogram,
    upstream: OnceLock<Histogram>,
    tokens: OnceLock<(IntCounter, IntCounter)>,
    cost: OnceLock<Counter>,
}

impl Metrics {
    fn series(
        &self,
        route: &'static str,
        provider: &str,
        model_name: Option<&str>,
        class: &'static str,
    ) -> Arc<Series> {
        // The key joins the labels (the model's folded) with NUL bytes. Only the model, sent by
        // clients, can hold one, and it stands between labels that cannot, so two label sets
        // never share a key. It is built in a buffer kept per thread: a lookup allocates nothing.
        thread_local! {
            static KEY: RefCell<String> = const { RefCell::new(String::new()) };
        }
        let model = self.models.label(model_name.unwrap_or("none"));
        KEY.with_borrow_mut(|key| {
            key.clear();
            for part in [route, provider, model, class] {
                key.push_str(part);
                key.push('\0');
            }
            if let Some(series) = self
                .series
                .read()
                .ok()
                .and_then(|m| m.get(key.as_str()).cloned())
            {
                return series;
            }
            let labels = [route, provider, model, class];
            let series = Arc::new(Series {
                requests: self.requests.with_label_values(&labels),
                duration: self.duration.with_label_values(&labels),
                model: model.to_owned(),
                upstream: OnceLock::new(),
                tokens: OnceLock::new(),
                cost: OnceLock::new(),
            });
            if let Ok(mut map) = self.series.write() {
                map.entry(key.clone()).or_insert(series).clone()
            } else {
                series
            }
        })
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

    fn label<'a>(&self, model: &'a str) -> &'a str {
        if let Ok(seen) = self.seen.read() {
            if seen.contains(model) {
                return model;
            }
        }
        match self.seen.write() {
            Ok(mut seen) if seen.len() < self.max || seen.contains(model) => {
                seen.insert(model.to_owned());
                model
            }
            _ => "other",
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

    fn built() -> (Arc<dyn Plugin>, prometheus::Registry) {
        let cx = BuildCx::standalone();
        let plugin = plugin_sdk::PluginDescriptor::find("metrics")
            .expect("registered")
            .build(&serde_json::json!({}), &cx)
            .unwrap_or_else(|e| panic!("{e:?}"));
        (plugin, cx.metrics)
    }

    fn answered(cost: Option<f64>) -> RequestCx {
        let mut cx = RequestCx::new(
            "t".into(),
            plugin_sdk::Route::ChatCompletions,
            http::Method::POST,
            "/v1/chat/completions".into(),
        );
        cx.response.status = Some(200);
        cx.response.provider = Some("openai".into());
        cx.response.model = Some("gpt-4o".into());
        cx.response.usage = Some(plugin_sdk::Usage {
            prompt_tokens: 10,
            completion_tokens: 5,
        });
        cx.response.cost = cost;
        cx
    }

    fn exposition(registry: &prometheus::Registry) -> String {
        prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .expect("encodes")
    }

    #[test]
    fn tokens_and_cost_are_counted_by_provider_and_model() {
        let (plugin, registry) = built();
        plugin.on_log(&answered(Some(0.5)));
        plugin.on_log(&answered(Some(0.25)));
        let text = exposition(&registry);
        assert!(
            text.contains(r#"gw_cost_usd_total{model="gpt-4o",provider="openai"} 0.75"#),
            "{text}"
        );
        assert!(
            text.contains(r#"gw_tokens_total{direction="in",model="gpt-4o",provider="openai"} 20"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"gw_tokens_total{direction="out",model="gpt-4o",provider="openai"} 10"#
            ),
            "{text}"
        );
    }

    #[test]
    fn without_a_cost_the_price_table_prices_the_usage() {
        let (plugin, registry) = built();
        plugin.on_log(&answered(None));
        let usage = plugin_sdk::Usage {
            prompt_tokens: 10,
            completion_tokens: 5,
        };
        let expected = crate::pricing::PriceTable::shipped()
            .cost("openai", "gpt-4o", usage)
            .expect("the shipped table prices gpt-4o");
        let text = exposition(&registry);
        assert!(
            text.contains(&format!(
                r#"gw_cost_usd_total{{model="gpt-4o",provider="openai"}} {expected}"#
            )),
            "{text}"
        );
    }

    #[test]
    fn a_cost_that_is_not_a_positive_number_adds_nothing() {
        let (plugin, registry) = built();
        for cost in [-1.0, f64::NAN, f64::INFINITY, 0.0] {
            plugin.on_log(&answered(Some(cost)));
        }
        assert!(!exposition(&registry).contains("gw_cost_usd_total{"));
    }

    #[test]
    fn each_label_set_counts_its_own_requests() {
        let (plugin, registry) = built();
        for _ in 0..3 {
            plugin.on_log(&answered(None));
        }
        let mut failed = answered(None);
        failed.response.status = Some(502);
        failed.response.usage = None;
        plugin.on_log(&failed);
        let mut other = answered(None);
        other.response.provider = Some("groq".into());
        plugin.on_log(&other);
        let text = exposition(&registry);
        for (labels, count) in [
            (
                r#"model="gpt-4o",provider="openai",route="chat.completions",status_class="2xx""#,
                3,
            ),
            (
                r#"model="gpt-4o",provider="openai",route="chat.completions",status_class="5xx""#,
                1,
            ),
            (
                r#"model="gpt-4o",provider="groq",route="chat.completions",status_class="2xx""#,
                1,
            ),
        ] {
            let line = format!("gw_requests_total{{{labels}}} {count}");
            assert!(text.contains(&line), "{line} in {text}");
        }
        // The failed request reported no tokens and added none.
        assert!(
            text.contains(r#"gw_tokens_total{direction="in",model="gpt-4o",provider="openai"} 30"#),
            "{text}"
        );
    }

    #[test]
    fn status_classes() {
        assert_eq!(status_class(200), "2xx");
        assert_eq!(status_class(446), "4xx");
        assert_eq!(status_class(503), "5xx");
        assert_eq!(status_class(0), "none");
    }
}
