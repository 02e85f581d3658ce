//! LLM routes (chat completions, embeddings, moderations, fine-tuning job listing): the body is
//! read once and decoded, the pipeline runs, the router picks the target, the request goes
//! upstream, and the answer is relayed — whole, or as a stream event by event without waiting
//! for its end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::future::Either;
use futures_util::FutureExt;
use http::{HeaderMap, HeaderName, HeaderValue};
use pingora::http::RequestHeader;
use pingora::proxy::Session;

use plugin_sdk::headers::GwHeader;
use plugin_sdk::llm::LlmRequest;
use plugin_sdk::plugin::{ResponseParts, UpstreamRequest};
use plugin_sdk::{Chunk, ErrorKind, Flow, GatewayError, RequestCx, Route, RoutePlan, Target};

use crate::providers::{self, openai, CallInfo, Outgoing, StreamDecoder, WireFormat};
use crate::request;
use crate::respond;
use crate::routing::config::{Node, NodeKind, RoutingConfig, Settings, Strategy};
use crate::routing::{self, strategy, ResolvedTarget};
use crate::server::Gateway;
use crate::sse::{self, EventSplitter};
use crate::upstream::{Endpoint, Exchange};

/// The most upstream calls one request makes, over every fallback target and retry of its
/// config: however a config nests groups and retries, one request cannot become a flood.
pub const MAX_UPSTREAM_ATTEMPTS: u32 = 16;

fn attempts_used() -> GatewayError {
    GatewayError::new(
        ErrorKind::UpstreamUnreachable,
        format!(
            "the request made {MAX_UPSTREAM_ATTEMPTS} upstream attempts, the most one request may make"
        ),
    )
}

/// Headers that providers define and clients may send; forwarded as they are.
const PROVIDER_HEADERS: [HeaderName; 4] = [
    HeaderName::from_static("openai-organization"),
    HeaderName::from_static("openai-project"),
    HeaderName::from_static("anthropic-version"),
    HeaderName::from_static("anthropic-beta"),
];

/// Google's header choosing how a Vertex AI request is served against Provisioned
/// Throughput: `dedicated` (only the provisioned throughput; over it, a 429) or `shared` (only
/// pay-as-you-go); absent, Vertex spills over from the first to the second.
const VERTEX_REQUEST_TYPE: HeaderName = HeaderName::from_static("x-vertex-ai-llm-request-type");

/// The client's Vertex request type, checked, for a Vertex AI target (other targets never
/// get it). Another value is a 400 naming the header.
fn vertex_request_type(client: &HeaderMap) -> Result<Option<HeaderValue>, GatewayError> {
    let Some(v) = client.get(&VERTEX_REQUEST_TYPE) else {
        return Ok(None);
    };
    match v.to_str().map(|s| s.trim().to_ascii_lowercase()).as_deref() {
        Ok(kind @ ("dedicated" | "shared")) => {
            Ok(Some(HeaderValue::from_str(kind).map_err(|_| {
                GatewayError::internal("a request type is a valid header value")
            })?))
        }
        _ => Err(GatewayError::invalid_param(
            VERTEX_REQUEST_TYPE.as_str(),
            "x-vertex-ai-llm-request-type must be dedicated (Provisioned Throughput only) or \
             shared (pay-as-you-go only); leave it out to spill over from the first to the second",
        )),
    }
}

/// Handles one LLM request to the end; every failure becomes an error response.
pub async fn handle(gw: &Gateway, session: &mut Session, cx: &mut RequestCx) {
    if let Err(e) = run(gw, session, cx).await {
        if session.response_written().is_none() {
            Box::pin(respond::error(session, Some(cx), &e)).await;
        } else {
            cx.response.error = Some(e.message);
        }
    }
}

async fn run(gw: &Gateway, session: &mut Session, cx: &mut RequestCx) -> Result<(), GatewayError> {
    // The caller is known (or refused) before a byte of the body is read; a refused
    // connection is closed rather than kept, so its body is never read to reuse it.
    match gw.pipeline.on_request_headers(cx).await {
        Ok(Flow::Continue) => {}
        Ok(Flow::Respond(r)) => {
            session.set_keepalive(None);
            Box::pin(respond::plugin(session, cx, r)).await;
            return Ok(());
        }
        Err(e) => {
            session.set_keepalive(None);
            return Err(e);
        }
    }
    if cx.route == Route::FineTuningJobs {
        request::check_fine_tuning_query(cx.query.as_deref())?;
    } else {
        cx.body = Box::pin(request::read_body(session, gw.config.max_body_bytes)).await?;
    }
    cx.request = LlmRequest::decode(cx.route, &cx.body)?;

    if let Flow::Respond(r) = gw.pipeline.on_request_body(cx).await? {
        Box::pin(respond::plugin(session, cx, r)).await;
        return Ok(());
    }
    // Counted once the caller is known and within its limits (a target's `override_params`
    // naming another model is checked when it is encoded).
    crate::tokens::check(&cx.request)?;
    // The plan stays in `cx` for later phases; only what the call needs is copied out of it.
    let plan = match &cx.plan {
        Some(RoutePlan::Single(target)) => RoutePlan::Single(target.clone()),
        Some(RoutePlan::Config(value)) => RoutePlan::Config(Arc::clone(value)),
        None => {
            return Err(GatewayError::internal(
                "no provider was selected: the pipeline needs provider_select",
            ))
        }
    };
    let outcome = match plan {
        RoutePlan::Single(target) => {
            let timeout = cx.gw.request_timeout_ms;
            Box::pin(call(gw, session, cx, target, timeout)).await?
        }
        RoutePlan::Config(value) => {
            let config = RoutingConfig::parse_for_request(&value)?;
            let key = config_fingerprint(&value);
            let outcome = Box::pin(execute(
                gw,
                session,
                cx,
                &config.root,
                &Settings::default(),
                &key,
            ))
            .await?;
            let failed = matches!(&outcome, Outcome::Answer(a) if !a.is_success());
            if failed && cx.response.retries > 0 {
                cx.response.retries_exhausted = true;
            }
            outcome
        }
    };
    match outcome {
        Outcome::Answer(answer) => deliver(gw, session, cx, *answer).await,
        Outcome::Done => Ok(()),
    }
}

/// What the upstream answered, ready to be relayed.
struct Answer {
    exchange: Exchange,
    /// The whole body; `None` for a stream, read as it is relayed.
    body: Option<Bytes>,
    /// What decoding the answer needs to know.
    call: CallInfo,
}

impl Answer {
    fn exchange(&self) -> &Exchange {
        &self.exchange
    }

    fn status(&self) -> u16 {
        self.exchange.status()
    }

    fn is_success(&self) -> bool {
        (200..300).contains(&self.status())
    }
}

/// The result of trying a target.
enum Outcome {
    /// The provider answered (any status); not yet written. Boxed: it holds the connection.
    Answer(Box<Answer>),
    /// The request is finished: a plugin answered, or the client left.
    Done,
}

/// Identifies a config across requests (for its circuit breakers): a hash of its JSON.
fn config_fingerprint(value: &serde_json::Value) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    value.to_string().hash(&mut h);
    format!("{:016x}", h.finish())
}

/// The fingerprint of a plan's config (empty for a plan without one).
pub fn config_fingerprint_of(plan: &RoutePlan) -> String {
    match plan {
        RoutePlan::Config(value) => config_fingerprint(value),
        RoutePlan::Single(_) => String::new(),
    }
}

/// The breaker key of a node of a config.
pub fn breaker_key(config_key: &str, node: &Node) -> String {
    format!("{config_key}|{}", node.path)
}

/// The request's values that conditions and sticky routing read.
fn request_params(cx: &RequestCx) -> serde_json::Value {
    serde_json::from_slice(&cx.body).unwrap_or(serde_json::Value::Null)
}

/// Runs a config node: a target (with its retries) or a group by its strategy. Recursive, so
/// boxed. Errors of the gateway's own making about the request end it at once.
fn execute<'a>(
    gw: &'a Gateway,
    session: &'a mut Session,
    cx: &'a mut RequestCx,
    node: &'a Node,
    inherited: &'a Settings,
    config_key: &'a str,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Outcome, GatewayError>> + Send + 'a>>
{
    Box::pin(async move {
        let settings = node.settings.inherit(inherited);
        match &node.kind {
            NodeKind::Target(target) => {
                let target = routing::config_target(
                    target,
                    &settings,
                    gw.providers.as_ref(),
                    cx.extensions.get::<plugin_sdk::Principal>(),
                )?;
                try_with_retries(gw, session, cx, node, &settings, target, config_key).await
            }
            NodeKind::Group { strategy, targets } => {
                let is_open = |t: &Node| {
                    gw.breakers
                        .is_open(&breaker_key(config_key, t), Instant::now())
                };
                if let Strategy::Fallback { on_status_codes } = strategy {
                    let allowed = strategy::available(targets, &is_open);
                    let candidates: Vec<&Node> = targets
                        .iter()
                        .zip(&allowed)
                        .filter_map(|(t, ok)| ok.then_some(t))
                        .collect();
                    let last = candidates.len().saturating_sub(1);
                    for (i, child) in candidates.into_iter().enumerate() {
                        let result = execute(gw, session, cx, child, &settings, config_key).await;
                        let status = match &result {
                            Ok(Outcome::Answer(answer)) => answer.status(),
                            Ok(Outcome::Done) => return result,
                            Err(e) if e.is_client_error() => return result,
                            Err(e) => e.status().as_u16(),
                        };
                        // With every attempt used, the last real answer is the one to give.
                        if i < last
                            && strategy::falls_back(status, on_status_codes.as_deref())
                            && cx.response.upstream_attempts < MAX_UPSTREAM_ATTEMPTS
                        {
                            gw.routing_metrics
                                .fallbacks
                                .with_label_values(&[cx
                                    .response
                                    .provider
                                    .as_deref()
                                    .unwrap_or("none")])
                                .inc();
                            continue;
                        }
                        return result;
                    }
                    return Err(GatewayError::internal("a fallback group has no targets"));
                }
                let params = if strategy::reads_request(strategy) {
                    request_params(cx)
                } else {
                    serde_json::Value::Null
                };
                let facts = strategy::RequestFacts {
                    metadata: &cx.gw.metadata,
                    params: &params,
                    pathname: &cx.path,
                };
                let i = strategy::choose(strategy, targets, &facts, &is_open).ok_or_else(|| {
                    if let Strategy::Conditional { .. } = strategy {
                        GatewayError::invalid_param(
                            GwHeader::CONFIG.primary,
                            format!(
                                "{}: no condition matched the request and there is no default",
                                node.path
                            ),
                        )
                    } else {
                        GatewayError::new(
                            ErrorKind::UpstreamUnreachable,
                            format!("{}: no target can be tried", node.path),
                        )
                    }
                })?;
                execute(gw, session, cx, &targets[i], &settings, config_key).await
            }
        }
    })
}

/// Calls one target, retrying on its retry statuses (a connection failure counts as 503) with
/// exponential backoff.
async fn try_with_retries(
    gw: &Gateway,
    session: &mut Session,
    cx: &mut RequestCx,
    node: &Node,
    settings: &Settings,
    target: Target,
    config_key: &str,
) -> Result<Outcome, GatewayError> {
    let breaker = settings
        .circuit_breaker
        .as_ref()
        .map(|cb| (cb, breaker_key(config_key, node)));
    let retries = settings.retry.as_ref().map_or(0, |r| r.attempts);
    let timeout = settings.request_timeout_ms.or(cx.gw.request_timeout_ms);
    let mut waited = Duration::ZERO;
    let mut attempt = 0;
    // The count reported is that of the target that answers, not of targets given up before.
    cx.response.retries = 0;
    cx.response.retries_exhausted = false;
    loop {
        if cx.response.upstream_attempts >= MAX_UPSTREAM_ATTEMPTS {
            return Err(attempts_used());
        }
        cx.response.option_index = Some(node.path.clone());
        if let Some((_, key)) = &breaker {
            let (_, change) = gw.breakers.allow(key, Instant::now());
            if let Some(state) = change {
                gw.routing_metrics
                    .breaker
                    .with_label_values(&[target.provider.as_str(), state.as_str()])
                    .inc();
            }
        }
        let result = Box::pin(call(gw, session, cx, target.clone(), timeout)).await;
        let (status, retry_headers) = match &result {
            Ok(Outcome::Answer(answer)) => (
                answer.status(),
                Some(answer.exchange().header().headers.clone()),
            ),
            Ok(Outcome::Done) => return result,
            Err(e) if e.kind == ErrorKind::UpstreamUnreachable => (503, None),
            Err(e) if e.kind == ErrorKind::Timeout || e.kind == ErrorKind::UpstreamTimeout => {
                (e.status().as_u16(), None)
            }
            Err(_) => return result,
        };
        if let Some((cb, key)) = &breaker {
            let failed = cb.failure_status_codes.contains(&status);
            if let Some(state) = gw.breakers.record(key, cb, failed, Instant::now()) {
                gw.routing_metrics
                    .breaker
                    .with_label_values(&[target.provider.as_str(), state.as_str()])
                    .inc();
            }
        }
        let Some(retry) = settings.retry.as_ref() else {
            return result;
        };
        if attempt >= retries
            || !retry.on_status_codes.contains(&status)
            || cx.response.upstream_attempts >= MAX_UPSTREAM_ATTEMPTS
        {
            return result;
        }
        let wait = strategy::backoff(
            attempt + 1,
            retry_headers.as_ref(),
            retry.use_retry_after_header,
            strategy::random_unit(),
        );
        if waited + wait > strategy::MAX_TOTAL_BACKOFF {
            return result;
        }
        drop(result);
        tokio::time::sleep(wait).await;
        waited += wait;
        attempt += 1;
        cx.response.retries = attempt;
        gw.routing_metrics
            .retries
            .with_label_values(&[target.provider.as_str()])
            .inc();
    }
}

/// One call to one target: the answer, not yet written (a plugin may answer instead).
async fn call(
    gw: &Gateway,
    session: &mut Session,
    cx: &mut RequestCx,
    mut target: Target,
    timeout_ms: Option<u64>,
) -> Result<Outcome, GatewayError> {
    if cx.response.upstream_attempts >= MAX_UPSTREAM_ATTEMPTS {
        return Err(attempts_used());
    }
    cx.response.upstream_attempts += 1;
    if let Flow::Respond(r) = gw.pipeline.on_route(cx, &mut target).await? {
        Box::pin(respond::plugin(session, cx, r)).await;
        return Ok(Outcome::Done);
    }
    // The model logs, metrics and prices name: an Azure target's `azure_model_name` when its
    // saved provider or config sets one (a deployment's name says nothing of its model), else
    // the one the answer reports. Not the request's own header: a client must not rename a
    // priced model into an unpriced one.
    let azure_model = (target.provider == "azure-openai")
        .then(|| target.setting("azure_model_name"))
        .flatten()
        .map(str::to_owned);
    target.fill_settings(&cx.gw.provider_settings.0);
    let resolved = routing::resolve(target, &gw.endpoints)?;
    cx.response.provider = Some(resolved.spec.id.to_owned());
    cx.response.model = azure_model;

    let (mut upstream_request, path, call_info) = encode(cx, &resolved)?;
    let url_as_built = upstream_request.url.clone();
    if let Flow::Respond(r) = gw
        .pipeline
        .on_upstream_request(cx, &mut upstream_request)
        .await?
    {
        Box::pin(respond::plugin(session, cx, r)).await;
        return Ok(Outcome::Done);
    }
    providers::finalize(resolved.spec, &resolved.target, &mut upstream_request)?;
    let (endpoint, path) = if upstream_request.url == url_as_built {
        (resolved.endpoint.clone(), path)
    } else {
        // A plugin sent the request elsewhere.
        let endpoint =
            Arc::new(Endpoint::parse(&upstream_request.url).map_err(GatewayError::internal)?);
        let uri: http::Uri = upstream_request.url.parse().map_err(|e| {
            GatewayError::internal(format!("bad upstream URL {:?}: {e}", upstream_request.url))
        })?;
        let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
        (endpoint, path)
    };
    let body = upstream_request.body.clone();
    let wants_stream = cx.request.is_stream();

    let call = async {
        let peer = gw.upstream.peer(&endpoint).await?;
        let header = || pingora_request(&upstream_request, &endpoint, &path);
        let mut exchange = gw.upstream.send(peer, header, body).await?;
        if wants_stream && is_stream(&exchange, call_info.format) {
            return Ok(Answer {
                exchange,
                body: None,
                call: call_info,
            });
        }
        let body = exchange.read_to_end(gw.config.max_answer_bytes).await?;
        Ok(Answer {
            exchange,
            body: Some(body),
            call: call_info,
        })
    };
    // Boxed so that this function's own state stays small (it is moved and boxed per request).
    // `Either` rather than an async block with a `match`: such a block would hold `call` twice
    // (as its capture and in the awaiting arm), doubling what the box copies.
    let bounded = Box::pin(match timeout_ms {
        Some(ms) => Either::Left(
            tokio::time::timeout(Duration::from_millis(ms), call)
                .map(move |done| done.unwrap_or_else(|_| Err(request_timeout(ms)))),
        ),
        None => Either::Right(call),
    });
    let Some(answer) = unless_client_leaves(session, bounded).await else {
        cx.response.error = Some("the client closed the connection".into());
        return Ok(Outcome::Done);
    };
    Ok(Outcome::Answer(Box::new(answer?)))
}

/// Relays the chosen answer to the client: a provider error in the OpenAI error shape, a
/// whole answer (decoded into OpenAI's shape) after `on_response`, or a stream event by event.
async fn deliver(
    gw: &Gateway,
    session: &mut Session,
    cx: &mut RequestCx,
    answer: Answer,
) -> Result<(), GatewayError> {
    let Answer {
        exchange,
        body,
        call,
    } = answer;
    let Some(body) = body else {
        // Boxed: only streams pay for the relay's state.
        let translator = providers::stream(&call);
        let options = RelayOptions {
            waive_provisioned_cost: call.waive_provisioned_cost,
            hidden_usage: call.hidden_usage,
        };
        return Box::pin(relay_stream(gw, session, cx, exchange, translator, options)).await;
    };
    cx.response.upstream_latency = Some(exchange.latency);
    let status = exchange.header().status;
    let mut headers = relayable_headers(&exchange.header().headers);
    let provider_error = (!status.is_success()).then(|| {
        providers::error::from_provider(
            call.provider,
            status.as_u16(),
            &exchange.header().headers,
            &body,
        )
    });
    gw.upstream.release(exchange).await;
    if let Some(e) = provider_error {
        return Err(e);
    }
    let decoded = providers::decode(&call, body)?;
    if cx.response.model.is_none() {
        cx.response.model = decoded.model;
    }
    cx.response.usage = decoded.usage;
    if decoded.provisioned && call.waive_provisioned_cost {
        waive_cost(cx);
    }
    if call.format != WireFormat::OpenAi {
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
    }
    let mut parts = ResponseParts {
        status,
        headers,
        body: decoded.body,
    };
    if let Flow::Respond(r) = gw.pipeline.on_response(cx, &mut parts).await? {
        Box::pin(respond::plugin(session, cx, r)).await;
        return Ok(());
    }
    Box::pin(write_whole(session, cx, parts)).await;
    Ok(())
}

/// An answer served from Provisioned Throughput through an integration with
/// `skipPtuCostAttribution`: it costs nothing more than the capacity paid for.
fn waive_cost(cx: &mut RequestCx) {
    cx.response.cost_waived = true;
    cx.response.cost = Some(0.0);
}

/// Whether the client asked for strictly OpenAI-shaped answers (no `content_blocks`).
/// Whether answers keep to OpenAI's shapes only. Default: yes, as the spec implies (`thinking`
/// "requires strict_openai_compliance = false"); `x-gw-strict-open-ai-compliance: false` adds
/// the `content_blocks` that carry a model's thinking.
fn strict(cx: &RequestCx) -> bool {
    cx.gw.strict_openai_compliance.unwrap_or(true)
}

/// The 408 of the reference gateway.
pub(crate) fn request_timeout(ms: u64) -> GatewayError {
    GatewayError::new(
        ErrorKind::Timeout,
        format!("Request exceeded the timeout sent in the request: {ms}ms"),
    )
}

/// The request in the target's wire format (OpenAI: the client's bytes, unless overridden),
/// the path and query it goes to, and what decoding its answer needs.
fn encode(
    cx: &RequestCx,
    resolved: &ResolvedTarget,
) -> Result<(UpstreamRequest, String, CallInfo), GatewayError> {
    let overrides = &resolved.target.override_params;
    let (raw, overridden);
    let request = if overrides.is_empty() {
        raw = cx.body.clone();
        &cx.request
    } else {
        raw = openai::encode_body(&cx.body, overrides)?;
        overridden = LlmRequest::decode(cx.route, &raw)?;
        if overridden.model() != cx.request.model() {
            crate::tokens::check(&overridden)?;
        }
        &overridden
    };
    let outgoing = Outgoing {
        spec: resolved.spec,
        route: cx.route,
        suffix: cx.path.strip_prefix("/v1").unwrap_or(&cx.path),
        raw: &raw,
        request,
        target: &resolved.target,
        strict: strict(cx),
    };
    let encoded = providers::encode(&outgoing)?;
    let call_info = outgoing.call_info(encoded.answer_format);
    let body = encoded.body;
    // The client's query means something only to a provider of the client's own format.
    let client_query = cx
        .query
        .as_deref()
        .filter(|_| resolved.spec.format == WireFormat::OpenAi);
    let query = match (encoded.query.as_deref(), client_query) {
        (Some(own), Some(client)) => Some(format!("{own}&{client}")),
        (Some(own), None) => Some(own.to_owned()),
        (None, client) => client.map(str::to_owned),
    };
    let ep = &resolved.endpoint;
    let path = ep.path_and_query(&encoded.path, query.as_deref());
    let scheme = if ep.tls { "https://" } else { "http://" };
    let url = [scheme, ep.authority(), &path].concat();
    let mut headers = HeaderMap::with_capacity(8);
    if !body.is_empty() {
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
    }
    headers.insert(
        http::header::ACCEPT,
        HeaderValue::from_static(if cx.request.is_stream() {
            "text/event-stream"
        } else {
            "application/json"
        }),
    );
    if let Some((name, value)) = resolved.auth_header() {
        // From the String itself (no copy); marked sensitive so that no debug output shows it.
        let mut value = HeaderValue::try_from(value).map_err(|_| {
            GatewayError::invalid("the provider key contains characters a header cannot carry")
        })?;
        value.set_sensitive(true);
        headers.insert(HeaderName::from_static(name), value);
    }
    for (name, value) in encoded.headers {
        let value = HeaderValue::from_str(&value)
            .map_err(|_| GatewayError::internal(format!("bad value for header {name}")))?;
        headers.insert(HeaderName::from_static(name), value);
    }
    for name in PROVIDER_HEADERS {
        if let Some(v) = cx.headers.get(&name) {
            headers.insert(name, v.clone());
        }
    }
    if resolved.spec.id == "vertex-ai" {
        if let Some(v) = vertex_request_type(&cx.headers)? {
            headers.insert(VERTEX_REQUEST_TYPE, v);
        }
    }
    for name in cx
        .gw
        .forward_headers
        .iter()
        .chain(&resolved.target.forward_headers)
    {
        if let (Ok(name), Some(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            cx.headers.get(name),
        ) {
            headers.insert(name, v.clone());
        }
    }
    Ok((
        UpstreamRequest {
            method: cx.method.clone(),
            url,
            headers,
            body,
        },
        path,
        call_info,
    ))
}

/// The Pingora request header for an upstream request: `Host` first, then the request's
/// headers, then `content-length`. Built from `http` parts, without Pingora's header-case map
/// (HTTP/1.1 names are case-insensitive), as this runs for every request.
///
/// Hop-by-hop headers (a client may name them in `x-gw-forward-headers`) stay behind: they
/// describe the client's connection, and the body is framed by `content-length` alone.
fn pingora_request(
    req: &UpstreamRequest,
    endpoint: &Endpoint,
    path: &str,
) -> Result<RequestHeader, GatewayError> {
    let (mut parts, ()) = http::Request::new(()).into_parts();
    parts.method = req.method.clone();
    parts.uri = http::Uri::try_from(path).map_err(|e| {
        GatewayError::internal(format!("bad upstream request target {path:?}: {e}"))
    })?;
    let mut headers = HeaderMap::with_capacity(req.headers.len() + 2);
    let host = HeaderValue::from_str(endpoint.authority())
        .map_err(|_| GatewayError::internal("the upstream host is not a valid header value"))?;
    headers.insert(http::header::HOST, host);
    for (name, value) in &req.headers {
        if name != http::header::HOST
            && name != http::header::CONTENT_LENGTH
            && !respond::is_hop_by_hop(name)
        {
            headers.append(name.clone(), value.clone());
        }
    }
    headers.insert(
        http::header::CONTENT_LENGTH,
        HeaderValue::from(req.body.len()),
    );
    parts.headers = headers;
    Ok(RequestHeader::from(parts))
}

/// Whether a 2xx answer is a stream in its format's framing.
fn is_stream(exchange: &Exchange, format: WireFormat) -> bool {
    exchange.header().status.is_success()
        && exchange
            .header()
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| providers::is_stream_content_type(format, v))
}

/// Whether a header of the provider's answer is relayed to the client.
fn is_relayed(name: &HeaderName) -> bool {
    !respond::is_hop_by_hop(name)
        && *name != http::header::CONTENT_LENGTH
        && !plugin_sdk::headers::is_gateway_header(name)
}

/// Headers of the provider's answer that are relayed to the client.
fn relayable_headers(headers: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers.iter().filter(|(n, _)| is_relayed(n)) {
        out.append(name.clone(), value.clone());
    }
    out
}

async fn write_whole(session: &mut Session, cx: &mut RequestCx, parts: ResponseParts) {
    let ResponseParts {
        status,
        mut headers,
        body,
    } = parts;
    cx.response.status = Some(status.as_u16());
    headers.insert(http::header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    let h = respond::header_with(status, Some(cx), headers);
    if let Err(e) = respond::complete(session, h, body).await {
        cx.response.error = Some(format!("could not write the answer: {e}"));
    }
}

/// How a stream is relayed, from the call that produced it.
struct RelayOptions {
    /// Provisioned Throughput answers cost nothing more (see `CallInfo`).
    waive_provisioned_cost: bool,
    /// Take out the usage chunk the gateway asked for on the client's behalf.
    hidden_usage: bool,
}

/// Relays a server-sent event stream as it arrives: whole events only (held back until
/// complete), each seen by `on_chunk`, usage read from them on the way.
async fn relay_stream(
    gw: &Gateway,
    session: &mut Session,
    cx: &mut RequestCx,
    mut exchange: Exchange,
    mut translator: Option<Box<dyn StreamDecoder>>,
    options: RelayOptions,
) -> Result<(), GatewayError> {
    let RelayOptions {
        waive_provisioned_cost,
        hidden_usage,
    } = options;
    cx.response.upstream_latency = Some(exchange.latency);
    cx.response.streamed = true;
    let status = exchange.header().status;
    cx.response.status = Some(status.as_u16());
    let write_error =
        |e: pingora::BError| GatewayError::internal(format!("client write failed: {e}"));

    // A translated stream is server-sent events whatever the provider's framing was.
    let translated = translator.is_some();
    let mut headers = relayable_headers(&exchange.header().headers);
    if translated {
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
    }
    headers.insert(
        http::header::TRANSFER_ENCODING,
        HeaderValue::from_static("chunked"),
    );
    let h = respond::header_with(status, Some(cx), headers);
    session
        .write_response_header(Box::new(h), false)
        .await
        .map_err(write_error)?;

    let mut splitter = EventSplitter::default();
    let mut clean_end = false;
    loop {
        let read = tokio::select! {
            read = exchange.next_chunk() => read,
            () = client_gone(session) => {
                cx.response.error = Some("the client closed the stream".into());
                return Ok(());
            }
        };
        let data = match (read, translator.as_mut()) {
            (Ok(Some(data)), None) => splitter.push(&data),
            (Ok(Some(data)), Some(t)) => t.push(&data),
            (Ok(None), None) => {
                clean_end = true;
                splitter.finish()
            }
            (Ok(None), Some(t)) => {
                clean_end = true;
                t.finish()
            }
            (Err(e), _) => {
                cx.response.error = Some(e.message.clone());
                final_event(session, &e.body().to_string()).await;
                break;
            }
        };
        if let Some(t) = translator.as_ref() {
            cx.response.usage = t.usage();
            if t.provisioned() && waive_provisioned_cost && !cx.response.cost_waived {
                waive_cost(cx);
            }
            if cx.response.model.is_none() {
                cx.response.model = t.model().map(str::to_owned);
            }
        }
        let data = if !data.is_empty() && translator.is_none() {
            note_stream_usage(cx, &data);
            if hidden_usage {
                openai::without_usage_chunks(data)
            } else {
                data
            }
        } else {
            data
        };
        if !data.is_empty() {
            // Counted even once usage came: a stream cut short is charged at least this.
            cx.response.relayed_text_chars += sse::text_chars(&data);
            let mut chunk = Chunk { data };
            match gw.pipeline.on_chunk(cx, &mut chunk) {
                Ok(Flow::Continue) => {
                    session
                        .write_response_body(Some(chunk.data), false)
                        .await
                        .map_err(write_error)?;
                }
                Ok(Flow::Respond(r)) => {
                    final_event(session, &String::from_utf8_lossy(&r.body)).await;
                    break;
                }
                Err(e) => {
                    cx.response.error = Some(e.message.clone());
                    final_event(session, &e.body().to_string()).await;
                    break;
                }
            }
        }
        let overflowed = match translator.as_ref() {
            Some(t) => t.overflowed(),
            None => splitter.overflowed(),
        };
        if overflowed {
            let e = GatewayError::new(
                ErrorKind::UpstreamBadResponse,
                format!(
                    "the provider sent a stream event of more than {} bytes without ending it",
                    sse::MAX_EVENT_BYTES
                ),
            );
            cx.response.error = Some(e.message.clone());
            final_event(session, &e.body().to_string()).await;
            break;
        }
        if clean_end {
            break;
        }
    }
    session
        .write_response_body(None, true)
        .await
        .map_err(write_error)?;
    if clean_end {
        gw.upstream.release(exchange).await;
    }
    Ok(())
}

/// Ends a stream whose headers are already sent with one last event: the only way left to
/// tell the client why it ends. A client that is gone cannot be told, so write errors are moot.
async fn final_event(session: &mut Session, data: &str) {
    let event = Bytes::from(format!("data: {data}\n\n"));
    let _ = session.write_response_body(Some(event), false).await;
}

/// Reads the model and usage out of stream events that carry them.
fn note_stream_usage(cx: &mut RequestCx, events: &[u8]) {
    let wants_model = cx.response.model.is_none();
    if !wants_model && memchr::memmem::find(events, b"\"usage\"").is_none() {
        return;
    }
    for data in sse::event_data(events) {
        let (model, usage) = if cx.route == Route::Messages {
            providers::anthropic::summarize(&data)
        } else {
            openai::summarize_chunk(&data)
        };
        if cx.response.model.is_none() {
            cx.response.model = model;
        }
        if let Some(u) = usage {
            // Anthropic's events report input and output tokens in different events.
            cx.response.usage = Some(match cx.response.usage {
                Some(old) if cx.route == Route::Messages => plugin_sdk::Usage {
                    prompt_tokens: old.prompt_tokens.max(u.prompt_tokens),
                    completion_tokens: old.completion_tokens.max(u.completion_tokens),
                },
                _ => u,
            });
        }
    }
}

/// How long an upstream call runs before the client-disconnect watch is armed. Arming it costs
/// more than a fast answer takes, and a client that leaves within this window wastes little.
const WATCH_CLIENT_AFTER: Duration = Duration::from_millis(20);

/// Runs `work` to completion, or returns `None` as soon as the client has gone.
async fn unless_client_leaves<T>(
    session: &mut Session,
    mut work: std::pin::Pin<Box<impl std::future::Future<Output = T>>>,
) -> Option<T> {
    // Pingora's timer rather than Tokio's: registering a Tokio timer wakes the runtime's
    // driver (a write to its eventfd and one more epoll wake-up) on every request.
    if let Ok(done) = pingora::time::fast_timeout::fast_timeout(WATCH_CLIENT_AFTER, &mut work).await
    {
        return Some(done);
    }
    tokio::select! {
        done = &mut work => Some(done),
        () = client_gone(session) => None,
    }
}

/// Resolves when the client closes its connection. A client that sends more bytes (a pipelined
/// request) is not gone; the future then never resolves.
async fn client_gone(session: &mut Session) {
    if session.read_body_or_idle(true).await.is_err() {
        return;
    }
    std::future::pending::<()>().await
}
