//! Accept loop, connection handling and the per-request pipeline:
//! read body, record, apply faults, route.

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri};
use http_body_util::BodyExt;
use hyper::body::{Body as _, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::body::MockBody;
use crate::faults::{self, FailCounters, Failure, FaultSpec};
use crate::openai::azure;
use crate::record::{RecordedRequest, RequestLog};
use crate::{anthropic, bedrock, cohere, echo, gemini, openai};

/// Largest request body the mock accepts; larger ones get 413.
const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;
/// How much of an oversized body is read and discarded before answering
/// 413. Reading it lets a client that sends everything before reading see
/// the 413 instead of a connection reset.
const MAX_DRAIN_BYTES: usize = 256 * 1024 * 1024;

/// State shared by all connections of one mock instance.
pub(crate) struct Shared {
    pub(crate) log: RequestLog,
    pub(crate) request_count: AtomicUsize,
    ids: AtomicU64,
    pub(crate) fail_counters: FailCounters,
}

impl Shared {
    pub(crate) fn new(record: bool) -> Self {
        Shared {
            log: RequestLog::new(record),
            request_count: AtomicUsize::new(0),
            ids: AtomicU64::new(0),
            fail_counters: FailCounters::default(),
        }
    }

    /// Next value of the per-instance counter used in response ids.
    pub(crate) fn next_id(&self) -> u64 {
        self.ids.fetch_add(1, Ordering::Relaxed)
    }
}

/// Everything a route handler may look at.
pub(crate) struct Ctx<'a> {
    pub(crate) shared: &'a Shared,
    pub(crate) method: &'a Method,
    /// The URI as received, fault prefixes included.
    pub(crate) uri: &'a Uri,
    pub(crate) headers: &'a HeaderMap,
    /// Path with fault prefixes, the optional `/v1` and a trailing `/` removed.
    pub(crate) route: &'a str,
    pub(crate) faults: &'a FaultSpec,
    /// What goes wrong with this request (status was already handled).
    pub(crate) failure: Failure,
}

/// The request body: buffered, or left streaming for the echo route when
/// nothing needs the bytes.
pub(crate) enum ReqBody {
    Buffered(Bytes),
    Streaming(Incoming),
}

/// Which provider's wire format a route speaks; picks the shape of the
/// errors the pipeline answers before the route handler runs.
#[derive(Clone, Copy)]
enum Wire {
    OpenAi,
    Anthropic,
    Bedrock,
    Google,
    Cohere,
    Azure,
}

impl Wire {
    fn of(route: &str) -> Wire {
        if anthropic::matches(route) {
            Wire::Anthropic
        } else if bedrock::matches(route) {
            Wire::Bedrock
        } else if gemini::matches(route) {
            Wire::Google
        } else if cohere::matches(route) {
            Wire::Cohere
        } else if azure::matches(route) {
            Wire::Azure
        } else {
            Wire::OpenAi
        }
    }

    fn invalid_request(self, message: &str) -> Response<MockBody> {
        match self {
            Wire::OpenAi => openai::invalid_request(message),
            Wire::Anthropic => anthropic::invalid_request(message),
            Wire::Bedrock => bedrock::invalid_request(message),
            Wire::Google => gemini::invalid_request(message),
            Wire::Cohere => cohere::invalid_request(message),
            Wire::Azure => azure::invalid_request(message),
        }
    }

    fn too_large(self) -> Response<MockBody> {
        let message = format!("request body exceeds {MAX_BODY_BYTES} bytes");
        match self {
            Wire::OpenAi => openai::error_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                &message,
                "invalid_request_error",
                None,
            ),
            Wire::Anthropic => anthropic::error_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request_too_large",
                &message,
            ),
            Wire::Bedrock => bedrock::error_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                "ValidationException",
                &message,
            ),
            Wire::Google => gemini::error_response(StatusCode::PAYLOAD_TOO_LARGE, &message),
            Wire::Cohere => cohere::error_response(StatusCode::PAYLOAD_TOO_LARGE, &message),
            Wire::Azure => azure::error_response(StatusCode::PAYLOAD_TOO_LARGE, &message),
        }
    }

    fn injected_error(self, status: u16, retry_after_ms: u64) -> Response<MockBody> {
        match self {
            Wire::OpenAi => openai::injected_error(status, retry_after_ms),
            Wire::Anthropic => anthropic::injected_error(status, retry_after_ms),
            Wire::Bedrock => bedrock::injected_error(status, retry_after_ms),
            Wire::Google => gemini::injected_error(status, retry_after_ms),
            Wire::Cohere => cohere::injected_error(status, retry_after_ms),
            Wire::Azure => azure::injected_error(status, retry_after_ms),
        }
    }
}

/// Service error that makes hyper close the connection without answering.
#[derive(Debug)]
pub(crate) struct Abort;

impl fmt::Display for Abort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("connection aborted by the mock")
    }
}

impl std::error::Error for Abort {}

pub(crate) async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    shutdown: watch::Receiver<()>,
) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(_) => {
                // Usually out of file descriptors; back off instead of spinning.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        // SSE events and small responses must not wait for Nagle.
        let _ = stream.set_nodelay(true);
        tokio::spawn(serve_connection(
            stream,
            Arc::clone(&shared),
            shutdown.clone(),
        ));
    }
}

async fn serve_connection(
    stream: TcpStream,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<()>,
) {
    let service = service_fn(move |req| handle(Arc::clone(&shared), req));
    let conn = http1::Builder::new()
        .keep_alive(true)
        .serve_connection(TokioIo::new(stream), service);
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        // Errors here are client disconnects or injected aborts: nothing to do.
        _ = conn.as_mut() => {}
        // Only fires when the owning `MockProvider` is dropped.
        _ = shutdown.changed() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Response<MockBody>, Abort> {
    shared.request_count.fetch_add(1, Ordering::Relaxed);
    let (parts, incoming) = req.into_parts();
    let (prefixes, unprefixed) = faults::split_prefixes(parts.uri.path());
    let route = normalize_route(unprefixed);
    let wire = Wire::of(route);
    let spec = faults::parse(&prefixes, &parts.headers);

    // Echo of a sized body with recording off streams straight back, so
    // huge passthrough bodies cost no buffering.
    let stream_echo =
        !shared.log.enabled() && echo::matches(route) && incoming.size_hint().exact().is_some();
    let body = if stream_echo {
        ReqBody::Streaming(incoming)
    } else {
        match read_body(incoming).await {
            Ok(bytes) => ReqBody::Buffered(bytes),
            Err(ReadError::TooLarge) => return Ok(wire.too_large()),
            // The client went away or sent a broken body.
            Err(ReadError::Broken) => return Err(Abort),
        }
    };
    if let ReqBody::Buffered(bytes) = &body {
        if shared.log.enabled() {
            shared.log.push(RecordedRequest::new(
                &parts.method,
                &parts.uri,
                &parts.headers,
                bytes.clone(),
            ));
        }
    }

    let spec = match spec {
        Ok(spec) => spec,
        Err(message) => return Ok(wire.invalid_request(&message)),
    };
    let failure = if spec.is_empty() {
        Failure::default()
    } else {
        if let Some(delay) = spec.delay() {
            tokio::time::sleep(delay).await;
        }
        shared.fail_counters.failure(&spec, route)
    };
    if let Some(status) = failure.status {
        return Ok(wire.injected_error(status, failure.retry_after_ms));
    }

    let ctx = Ctx {
        shared: &shared,
        method: &parts.method,
        uri: &parts.uri,
        headers: &parts.headers,
        route,
        faults: &spec,
        failure,
    };
    let response = if echo::matches(route) {
        echo::respond(&ctx, body)
    } else {
        let bytes = match body {
            ReqBody::Buffered(bytes) => bytes,
            ReqBody::Streaming(_) => Bytes::new(),
        };
        match wire {
            Wire::OpenAi => openai::dispatch(&ctx, &bytes),
            Wire::Anthropic => anthropic::dispatch(&ctx, &bytes),
            Wire::Bedrock => bedrock::dispatch(&ctx, &bytes),
            Wire::Google => gemini::dispatch(&ctx, &bytes),
            Wire::Cohere => cohere::dispatch(&ctx, &bytes),
            Wire::Azure => azure::dispatch(&ctx, &bytes),
        }
    };
    // Streams abort themselves after N events; anything else is dropped
    // before a single byte of the response goes out.
    if failure.disconnect_after.is_some() && !response.body().is_stream() {
        return Err(Abort);
    }
    Ok(response)
}

enum ReadError {
    TooLarge,
    Broken,
}

/// Reads the whole body. A body that arrives as one frame (the usual case
/// for small requests) is returned without copying.
async fn read_body(mut incoming: Incoming) -> Result<Bytes, ReadError> {
    let mut single: Option<Bytes> = None;
    let mut joined: Vec<u8> = Vec::new();
    let mut total = 0usize;
    while let Some(frame) = incoming.frame().await {
        let frame = frame.map_err(|_| ReadError::Broken)?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        total = total.saturating_add(data.len());
        if total > MAX_BODY_BYTES {
            while total <= MAX_DRAIN_BYTES {
                match incoming.frame().await {
                    Some(Ok(frame)) => {
                        let len = frame.data_ref().map_or(0, Bytes::len);
                        total = total.saturating_add(len);
                    }
                    _ => break,
                }
            }
            return Err(ReadError::TooLarge);
        }
        match single.take() {
            None if joined.is_empty() => single = Some(data),
            None => joined.extend_from_slice(&data),
            Some(first) => {
                let hint = incoming.size_hint().lower() as usize;
                joined.reserve((total + hint).min(MAX_BODY_BYTES));
                joined.extend_from_slice(&first);
                joined.extend_from_slice(&data);
            }
        }
    }
    Ok(single.unwrap_or_else(|| Bytes::from(joined)))
}

/// Strips the optional `/v1` and one trailing `/` so routes match either way.
fn normalize_route(path: &str) -> &str {
    let path = if path == "/v1" {
        "/"
    } else if path.starts_with("/v1/") {
        &path[3..]
    } else {
        path
    };
    if path.len() > 1 {
        path.strip_suffix('/').unwrap_or(path)
    } else {
        path
    }
}

#[cfg(test)]
mod tests {
    use super::normalize_route;

    #[test]
    fn routes_normalize() {
        assert_eq!(normalize_route("/v1/chat/completions"), "/chat/completions");
        assert_eq!(normalize_route("/chat/completions/"), "/chat/completions");
        assert_eq!(normalize_route("/v1"), "/");
        assert_eq!(normalize_route("/v1x/models"), "/v1x/models");
        assert_eq!(normalize_route("/"), "/");
    }
}
