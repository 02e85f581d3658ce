//! The start of every request: which route it takes, its context, and (for LLM routes) its body.

use bytes::{Bytes, BytesMut};
use http::Method;
use pingora::proxy::Session;

use plugin_sdk::headers::{GwHeader, GwHeaders};
use plugin_sdk::{ErrorKind, GatewayError, RequestCx, Route};

/// What the gateway does with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dispatch {
    Health,
    Metrics,
    /// A control-plane path ([`admin::CONTROL_PLANE_PREFIXES`]), any method.
    Admin,
    /// An LLM or passthrough route under `/v1`.
    Gateway(Route),
    NotFound,
}

/// Classifies a request by method and path.
pub fn dispatch(method: &Method, path: &str) -> Dispatch {
    match (method, path) {
        (&Method::GET, "/health") => return Dispatch::Health,
        (&Method::GET, "/metrics") => return Dispatch::Metrics,
        _ => {}
    }
    if admin::is_control_plane_path(path) {
        return Dispatch::Admin;
    }
    let Some(rest) = path.strip_prefix("/v1/") else {
        return Dispatch::NotFound;
    };
    let route = match (method, rest.trim_end_matches('/')) {
        (&Method::POST, "chat/completions") => Route::ChatCompletions,
        (&Method::POST, "embeddings") => Route::Embeddings,
        (&Method::POST, "moderations") => Route::Moderations,
        (&Method::GET, "fine_tuning/jobs") => Route::FineTuningJobs,
        (&Method::POST, "messages") => Route::Messages,
        (&Method::GET | &Method::POST | &Method::PUT | &Method::DELETE, r) if !r.is_empty() => {
            Route::Passthrough
        }
        _ => return Dispatch::NotFound,
    };
    Dispatch::Gateway(route)
}

/// Builds the context of a gateway request from its header. Header errors are returned beside
/// the context, so that the error response still carries the trace id.
pub fn context(session: &Session, route: Route) -> (RequestCx, Result<(), GatewayError>) {
    let req = session.req_header();
    let parsed = GwHeaders::parse(&req.headers);
    let sent_trace_id = match &parsed {
        Ok(gw) => gw.trace_id.clone(),
        // A malformed other header: the error answer still carries the client's trace id.
        Err(_) => GwHeader::TRACE_ID.get(&req.headers).map(str::to_owned),
    };
    // Time-ordered, like the log ids: the logs' index on trace ids is appended to.
    let trace_id = sent_trace_id.unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
    let mut cx = RequestCx::new(
        trace_id,
        route,
        req.method.clone(),
        req.uri.path().to_owned(),
    );
    cx.query = req.uri.query().map(str::to_owned);
    cx.client_ip = session
        .client_addr()
        .and_then(|a| a.as_inet())
        .map(|a| a.ip());
    cx.headers = req.headers.clone();
    let parsed = parsed.map(|gw| cx.gw = gw);
    (cx, parsed)
}

/// Reads the whole request body, refusing more than `limit` bytes with a 413 (checked against
/// `content-length` first, so an oversized upload is refused before it is read).
pub async fn read_body(session: &mut Session, limit: usize) -> Result<Bytes, GatewayError> {
    let too_large = || {
        GatewayError::new(
            ErrorKind::PayloadTooLarge,
            format!("the request body is larger than the limit of {limit} bytes"),
        )
    };
    let declared = session
        .req_header()
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let read_error =
        |e: pingora::BError| GatewayError::invalid(format!("could not read the request body: {e}"));
    // A body that arrives in one piece (most do) is kept as it came, without a copy.
    let first = match session.read_request_body().await.map_err(read_error)? {
        Some(chunk) if chunk.len() > limit => return Err(too_large()),
        Some(chunk) => chunk,
        None => return Ok(Bytes::new()),
    };
    let Some(second) = session.read_request_body().await.map_err(read_error)? else {
        return Ok(first);
    };
    let mut body = BytesMut::with_capacity(declared.unwrap_or(0).max(first.len() + second.len()));
    body.extend_from_slice(&first);
    let mut next = Some(second);
    while let Some(chunk) = next {
        if body.len() + chunk.len() > limit {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
        next = session.read_request_body().await.map_err(read_error)?;
    }
    Ok(body.freeze())
}

/// Checks the query of `GET /v1/fine_tuning/jobs`: `limit` is a non-negative integer.
pub fn check_fine_tuning_query(query: Option<&str>) -> Result<(), GatewayError> {
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key == "limit" && value.parse::<u32>().is_err() {
            return Err(GatewayError::invalid_param(
                "limit",
                format!("limit must be a non-negative integer, got {value:?}"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        use Dispatch::*;
        assert_eq!(dispatch(&Method::GET, "/health"), Health);
        assert_eq!(dispatch(&Method::GET, "/metrics"), Metrics);
        assert_eq!(
            dispatch(&Method::POST, "/v1/chat/completions"),
            Gateway(Route::ChatCompletions)
        );
        assert_eq!(
            dispatch(&Method::POST, "/v1/embeddings"),
            Gateway(Route::Embeddings)
        );
        assert_eq!(
            dispatch(&Method::POST, "/v1/moderations"),
            Gateway(Route::Moderations)
        );
        assert_eq!(
            dispatch(&Method::GET, "/v1/fine_tuning/jobs"),
            Gateway(Route::FineTuningJobs)
        );
        assert_eq!(
            dispatch(&Method::POST, "/v1/fine_tuning/jobs"),
            Gateway(Route::Passthrough)
        );
        assert_eq!(
            dispatch(&Method::DELETE, "/v1/files/f1"),
            Gateway(Route::Passthrough)
        );
        assert_eq!(
            dispatch(&Method::POST, "/v1/messages"),
            Gateway(Route::Messages)
        );
        assert_eq!(
            dispatch(&Method::POST, "/v1/messages/count_tokens"),
            Gateway(Route::Passthrough)
        );
        for (method, path) in [
            (Method::POST, "/v1/admin/workspaces"),
            (Method::GET, "/v1/api-keys"),
            (Method::PATCH, "/v1/api-keys/x"),
            (Method::GET, "/v1/audit-logs"),
            (Method::PUT, "/v1/policies/rate-limits/x"),
            (Method::GET, "/v1/openapi.json"),
        ] {
            assert_eq!(dispatch(&method, path), Admin, "{method} {path}");
        }
        assert_eq!(
            dispatch(&Method::GET, "/v1/api-keysx"),
            Gateway(Route::Passthrough)
        );
        assert_eq!(dispatch(&Method::PATCH, "/v1/files/f1"), NotFound);
        assert_eq!(dispatch(&Method::GET, "/v1/"), NotFound);
        assert_eq!(dispatch(&Method::GET, "/v2/models"), NotFound);
        assert_eq!(dispatch(&Method::GET, "/"), NotFound);
    }

    #[test]
    fn fine_tuning_limit_must_be_a_number() {
        check_fine_tuning_query(None).unwrap();
        check_fine_tuning_query(Some("after=ft-1&limit=5")).unwrap();
        let err = check_fine_tuning_query(Some("limit=-1")).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("limit"));
        assert!(check_fine_tuning_query(Some("limit=ten")).is_err());
    }
}
