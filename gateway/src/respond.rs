//! Writing answers to the client. Every response the gateway itself produces (errors, plugin
//! answers, health, metrics) goes through here, so the headers every answer carries
//! (`x-gw-trace-id`, `x-gw-provider`, `x-gw-cache-status`...) are set in one place.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use pingora::http::ResponseHeader;
use pingora::proxy::Session;

use plugin_sdk::{GatewayError, PluginResponse, RequestCx};

pub const TRACE_ID: HeaderName = HeaderName::from_static("x-gw-trace-id");
pub const PROVIDER: HeaderName = HeaderName::from_static("x-gw-provider");
pub const LAST_USED_OPTION_INDEX: HeaderName =
    HeaderName::from_static("x-gw-last-used-option-index");
pub const RETRY_ATTEMPT_COUNT: HeaderName = HeaderName::from_static("x-gw-retry-attempt-count");
pub const CACHE_STATUS: HeaderName = HeaderName::from_static("x-gw-cache-status");

/// The same headers under the reference product's names, which clients built for it read.
const REFERENCE_NAMES: [(HeaderName, HeaderName); 5] = [
    (TRACE_ID, HeaderName::from_static("x-portkey-trace-id")),
    (PROVIDER, HeaderName::from_static("x-portkey-provider")),
    (
        CACHE_STATUS,
        HeaderName::from_static("x-portkey-cache-status"),
    ),
    (
        LAST_USED_OPTION_INDEX,
        HeaderName::from_static("x-portkey-last-used-option-index"),
    ),
    (
        RETRY_ATTEMPT_COUNT,
        HeaderName::from_static("x-portkey-retry-attempt-count"),
    ),
];

/// Sets the gateway's own response headers of a request (replacing any of the same name), and
/// their reference names when the request asks for them: every answer, errors, plugin answers,
/// streams and passthrough alike, goes through here.
pub fn set_gateway_headers(headers: &mut HeaderMap, cx: &RequestCx) {
    insert_text(headers, TRACE_ID, &cx.trace_id);
    if let Some(p) = &cx.response.provider {
        insert_text(headers, PROVIDER, p);
    }
    if let Some(status) = cx.response.cache_status {
        headers.insert(CACHE_STATUS, HeaderValue::from_static(status));
    }
    // Requests routed by a config say which target answered and after how many retries
    // (-1: every retry was used and the answer still failed).
    if let Some(index) = &cx.response.option_index {
        insert_text(headers, LAST_USED_OPTION_INDEX, index);
        let count = if cx.response.retries_exhausted {
            -1
        } else {
            i64::from(cx.response.retries)
        };
        headers.insert(RETRY_ATTEMPT_COUNT, HeaderValue::from(count));
    }
    if cx.response.reference_headers {
        for (ours, theirs) in &REFERENCE_NAMES {
            if let Some(v) = headers.get(ours).cloned() {
                headers.insert(theirs.clone(), v);
            }
        }
    }
}

/// A response header with the gateway's own headers set.
pub fn header(status: StatusCode, cx: Option<&RequestCx>) -> pingora::Result<ResponseHeader> {
    // Room for the gateway's five headers and their reference names.
    Ok(header_with(status, cx, HeaderMap::with_capacity(12)))
}

/// A response header of `headers` with the gateway's own headers set (replacing any of the same
/// name). Filled as an `http` map and converted once: Pingora's own insert methods parse every
/// header name again, which is most of their cost. Names go out in lower case (no case map),
/// which HTTP/1.1 allows.
pub fn header_with(
    status: StatusCode,
    cx: Option<&RequestCx>,
    mut headers: HeaderMap,
) -> ResponseHeader {
    if let Some(cx) = cx {
        set_gateway_headers(&mut headers, cx);
    }
    let (mut parts, ()) = http::Response::new(()).into_parts();
    parts.status = status;
    parts.headers = headers;
    ResponseHeader::from(parts)
}

/// Inserts a text value; one that a header cannot carry (a client's trace id is checked when it
/// arrives, so none should) is left out rather than failing the answer.
fn insert_text(headers: &mut HeaderMap, name: HeaderName, value: &str) {
    if let Ok(value) = HeaderValue::from_str(value) {
        headers.insert(name, value);
    }
}

/// Writes a complete response, with its `content-length` set to the body's.
pub async fn complete(
    session: &mut Session,
    mut h: ResponseHeader,
    body: Bytes,
) -> pingora::Result<()> {
    let mut digits = itoa::Buffer::new();
    let length = digits.format(body.len());
    let declared = h.headers.get(http::header::CONTENT_LENGTH);
    if declared.is_none_or(|v| v.as_bytes() != length.as_bytes()) {
        h.insert_header(http::header::CONTENT_LENGTH, length)?;
    }
    session
        .write_response_header(Box::new(h), body.is_empty())
        .await?;
    if !body.is_empty() {
        session.write_response_body(Some(body), true).await?;
    }
    Ok(())
}

/// Answers an error with its status and JSON body (the one place an error becomes bytes).
pub async fn error(session: &mut Session, cx: Option<&mut RequestCx>, err: &GatewayError) {
    let status = err.status();
    let body = Bytes::from(err.body().to_string());
    if let Some(cx) = cx.as_deref() {
        tracing::debug!(trace_id = %cx.trace_id, error = %err, "request failed");
    }
    let result = async {
        let mut h = header(status, cx.as_deref())?;
        h.insert_header(http::header::CONTENT_TYPE, "application/json")?;
        if let plugin_sdk::ErrorKind::RateLimited { retry_after_secs } = err.kind {
            h.insert_header(http::header::RETRY_AFTER, retry_after_secs)?;
        }
        complete(session, h, body).await
    }
    .await;
    if let Some(cx) = cx {
        cx.response.status = Some(status.as_u16());
        cx.response.error = Some(err.message.clone());
    }
    if let Err(e) = result {
        tracing::debug!(error = %e, "could not write the error response; the client is gone");
    }
}

/// Answers with a response a plugin produced.
pub async fn plugin(session: &mut Session, cx: &mut RequestCx, response: PluginResponse) {
    cx.response.status = Some(response.status.as_u16());
    let result = async {
        let mut h = header(response.status, Some(cx))?;
        for (name, value) in &response.headers {
            // The gateway's own headers appear once: the plugin's value replaces the default.
            if name.as_str().starts_with("x-gw-") {
                h.insert_header(name.clone(), value.clone())?;
            } else {
                h.append_header(name.clone(), value.clone())?;
            }
        }
        complete(session, h, response.body).await
    }
    .await;
    if let Err(e) = result {
        tracing::debug!(error = %e, "could not write the plugin's response; the client is gone");
    }
}

/// Answers a small JSON or text body outside any request context (`/health`, `/metrics`, 404).
pub async fn simple(session: &mut Session, status: StatusCode, content_type: &str, body: Bytes) {
    let result = async {
        let mut h = header(status, None)?;
        h.insert_header(http::header::CONTENT_TYPE, content_type)?;
        complete(session, h, body).await
    }
    .await;
    if let Err(e) = result {
        tracing::debug!(error = %e, "could not write a response; the client is gone");
    }
}

/// Hop-by-hop headers, which describe one connection and are never relayed.
pub fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}
