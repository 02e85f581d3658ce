//! The per-request context every plugin phase receives.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Method};

use crate::headers::GwHeaders;
use crate::llm::LlmRequest;
use crate::target::RoutePlan;

/// Which of the gateway's routes a request took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// `POST /v1/chat/completions`
    ChatCompletions,
    /// `POST /v1/embeddings`
    Embeddings,
    /// `POST /v1/moderations`
    Moderations,
    /// `GET /v1/fine_tuning/jobs`
    FineTuningJobs,
    /// `POST /v1/messages`: Anthropic's Messages API, for clients that speak it.
    Messages,
    /// Any other `/v1/...` path, proxied untouched to the selected provider.
    Passthrough,
}

impl Route {
    /// A short stable name for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Route::ChatCompletions => "chat.completions",
            Route::Embeddings => "embeddings",
            Route::Moderations => "moderations",
            Route::FineTuningJobs => "fine_tuning.jobs",
            Route::Messages => "messages",
            Route::Passthrough => "passthrough",
        }
    }
}

/// Token usage as reported by the provider.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

impl Usage {
    pub fn total(&self) -> u64 {
        self.prompt_tokens + self.completion_tokens
    }
}

/// What happened to the request, filled in as it goes; read by `on_log`.
#[derive(Debug, Clone, Default)]
pub struct ResponseInfo {
    /// The status answered to the client.
    pub status: Option<u16>,
    /// The provider id of the target that answered (or was last tried).
    pub provider: Option<String>,
    /// The model the provider reported, else the one requested.
    pub model: Option<String>,
    pub usage: Option<Usage>,
    /// The answer's cost in US dollars from the price table, once usage is known.
    pub cost: Option<f64>,
    /// The answer was served from capacity paid for in advance (Vertex AI's Provisioned
    /// Throughput) through a saved provider whose integration says `skipPtuCostAttribution`:
    /// its cost is 0, whatever the price table says. Set by the gateway.
    pub cost_waived: bool,
    /// Time from sending the upstream request to its response header.
    pub upstream_latency: Option<Duration>,
    /// Whether the answer was relayed as a server-sent event stream.
    pub streamed: bool,
    /// Characters of generated text (content, text, tool arguments, thinking) the gateway
    /// relayed in a stream: a stream cut short (a client that left, a provider that dropped it
    /// or never reports usage) is charged at least this (characters / 4 tokens).
    pub relayed_text_chars: u64,
    /// The error message, when the request failed.
    pub error: Option<String>,
    /// `x-gw-cache-status` value, when a cache plugin ran.
    pub cache_status: Option<&'static str>,
    /// Retries of the target that answered (attempts beyond its first).
    pub retries: u32,
    /// Upstream calls made for the request, across targets and retries.
    pub upstream_attempts: u32,
    /// Set when every retry was used and the last answer still failed.
    pub retries_exhausted: bool,
    /// The config node that answered (`config.targets[1]`), when a config routed the request.
    pub option_index: Option<String>,
    /// Whether the answer carries the gateway's response headers under the reference product's
    /// names too (`x-portkey-trace-id`...), for clients built for it
    /// (`compat.reference_response_headers`, default true). Set by the gateway.
    pub reference_headers: bool,
}

/// Everything the gateway knows about one request. Created when the request arrives; passed to
/// every plugin phase; dropped after `on_log`.
#[derive(Debug)]
pub struct RequestCx {
    /// `x-gw-trace-id` from the client, else a generated one; echoed on the response.
    pub trace_id: String,
    pub route: Route,
    pub method: Method,
    /// The request path as received, without the query.
    pub path: String,
    pub query: Option<String>,
    /// The address of the client's connection (audit records), when known.
    pub client_ip: Option<std::net::IpAddr>,
    /// The client's request headers.
    pub headers: HeaderMap,
    pub gw: GwHeaders,
    /// The raw request body (empty for passthrough requests, whose body is streamed).
    pub body: Bytes,
    /// The decoded body of an LLM route.
    pub request: LlmRequest,
    /// Set by provider selection; consumed by the router.
    pub plan: Option<RoutePlan>,
    pub started: Instant,
    pub response: ResponseInfo,
    /// Values plugins hand to later plugins (the authenticated key, a cache key...).
    pub extensions: http::Extensions,
    /// A check an earlier plugin left for a later one to finish in the same round trip (see
    /// [`crate::deferred`]). `None` outside the request phase.
    pub deferred: Option<Box<dyn crate::deferred::Deferred>>,
}

impl RequestCx {
    pub fn new(trace_id: String, route: Route, method: Method, path: String) -> Self {
        RequestCx {
            trace_id,
            route,
            method,
            path,
            query: None,
            client_ip: None,
            headers: HeaderMap::new(),
            gw: GwHeaders::default(),
            body: Bytes::new(),
            request: LlmRequest::None,
            plan: None,
            started: Instant::now(),
            response: ResponseInfo::default(),
            extensions: http::Extensions::new(),
            deferred: None,
        }
    }

    /// The model the client asked for, if its body names one.
    pub fn requested_model(&self) -> Option<&str> {
        self.request.model()
    }

    /// The model of the answer for logs and metrics: the one the provider reported, else the
    /// one the client asked for.
    pub fn answered_model(&self) -> Option<&str> {
        self.response.model.as_deref().or(self.requested_model())
    }
}
