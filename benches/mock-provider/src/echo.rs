//! `/echo[/...]`: answers with the request body, for passthrough tests.
//! Not tied to any provider's wire format.

use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};
use hyper::body::Body as _;

use crate::body::MockBody;
use crate::server::{Ctx, ReqBody};

/// Whether `route` (already normalized) is the echo route.
pub(crate) fn matches(route: &str) -> bool {
    route == "/echo" || route.starts_with("/echo/")
}

/// 200 with the body exactly as received, its `content-type`, and
/// `x-mock-method`, `x-mock-path` (path and query as received),
/// `x-mock-body-len` and `x-mock-custom: yes`.
pub(crate) fn respond(ctx: &Ctx<'_>, body: ReqBody) -> Response<MockBody> {
    let (body, len) = match body {
        ReqBody::Buffered(bytes) => {
            let len = bytes.len() as u64;
            (MockBody::full(bytes), len)
        }
        ReqBody::Streaming(incoming) => {
            let len = incoming.size_hint().exact().unwrap_or(0);
            (MockBody::Incoming(incoming), len)
        }
    };
    let mut resp = Response::new(body);
    *resp.status_mut() = StatusCode::OK;
    let headers = resp.headers_mut();
    let content_type = ctx
        .headers
        .get(CONTENT_TYPE)
        .cloned()
        .unwrap_or_else(|| HeaderValue::from_static("application/octet-stream"));
    headers.insert(CONTENT_TYPE, content_type);
    if let Ok(method) = HeaderValue::from_str(ctx.method.as_str()) {
        headers.insert(HeaderName::from_static("x-mock-method"), method);
    }
    let path = ctx
        .uri
        .path_and_query()
        .map_or_else(|| ctx.uri.path(), |pq| pq.as_str());
    if let Ok(path) = HeaderValue::from_str(path) {
        headers.insert(HeaderName::from_static("x-mock-path"), path);
    }
    headers.insert(
        HeaderName::from_static("x-mock-body-len"),
        HeaderValue::from(len),
    );
    headers.insert(
        HeaderName::from_static("x-mock-custom"),
        HeaderValue::from_static("yes"),
    );
    resp
}
