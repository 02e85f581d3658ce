//! Anthropic wire format: the Messages API and Anthropic-shaped errors,
//! `{"type":"error","error":{"type":"...","message":"..."}}`.

mod messages;

pub(crate) use messages::{answer_fields, Answered};

use http::header::{HeaderName, HeaderValue};
use http::{Method, Response, StatusCode};
use serde::Serialize;

use crate::body::{self, MockBody};
use crate::server::Ctx;

/// Whether `route` (already normalized) belongs to Anthropic's API, so that
/// every answer on it, injected faults included, uses Anthropic's shapes.
pub(crate) fn matches(route: &str) -> bool {
    route == "/messages" || route.starts_with("/messages/")
}

/// An Anthropic-shaped error a handler returns instead of a response.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
}

impl ApiError {
    /// 400 `invalid_request_error`.
    fn invalid(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            message: message.into(),
        }
    }

    fn into_response(self) -> Response<MockBody> {
        error_response(self.status, self.kind, &self.message)
    }
}

type HandlerResult = Result<Response<MockBody>, ApiError>;

#[derive(Serialize)]
struct ErrorBody<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    error: ErrorDetail<'a>,
}

/// The inner `{"type","message"}` object, shared with the stream's `error`
/// event.
#[derive(Serialize, Clone, Copy)]
struct ErrorDetail<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    message: &'a str,
}

/// `{"type":"error","error":{"type":kind,"message":message}}` with `status`.
pub(crate) fn error_response(status: StatusCode, kind: &str, message: &str) -> Response<MockBody> {
    let error = ErrorDetail { kind, message };
    body::json(
        status,
        &ErrorBody {
            kind: "error",
            error,
        },
    )
}

/// 400 `invalid_request_error`.
pub(crate) fn invalid_request(message: &str) -> Response<MockBody> {
    error_response(StatusCode::BAD_REQUEST, "invalid_request_error", message)
}

/// The answer to an `x-mock-status` / `status=` fault: the status with
/// Anthropic's error shape (`rate_limit_error` for 429, `overloaded_error`
/// for 529, `api_error` otherwise), plus `retry-after-ms` for 429, 503 and
/// 529 (Anthropic's "overloaded", which clients retry like a 503).
pub(crate) fn injected_error(status: u16, retry_after_ms: u64) -> Response<MockBody> {
    let kind = match status {
        429 => "rate_limit_error",
        529 => "overloaded_error",
        _ => "api_error",
    };
    let message = format!("mock injected status {status}");
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = error_response(status, kind, &message);
    if status.as_u16() == 529 {
        // 529 is not a registered status, so hyper would write `<none>` as
        // its reason phrase; Anthropic's says what it means.
        resp.extensions_mut()
            .insert(hyper::ext::ReasonPhrase::from_static(b"Overloaded"));
    }
    if matches!(status.as_u16(), 429 | 503 | 529) {
        resp.headers_mut().insert(
            HeaderName::from_static("retry-after-ms"),
            HeaderValue::from(retry_after_ms),
        );
    }
    resp
}

/// Answers a Messages API body as `POST /messages` does but without
/// Anthropic's `x-api-key` / `anthropic-version` header checks, for
/// platforms that front the API with their own authentication (Vertex AI's
/// `rawPredict`). The body must name its `model`.
pub(crate) fn messages_without_auth(ctx: &Ctx<'_>, body: &[u8]) -> Response<MockBody> {
    messages::handle_body(ctx, body).unwrap_or_else(ApiError::into_response)
}

/// Routes an Anthropic request; anything but `POST /messages` gets 404
/// `not_found_error`.
pub(crate) fn dispatch(ctx: &Ctx<'_>, body: &[u8]) -> Response<MockBody> {
    let result = match (ctx.method, ctx.route) {
        (&Method::POST, "/messages") => messages::handle(ctx, body),
        _ => Err(ApiError {
            status: StatusCode::NOT_FOUND,
            kind: "not_found_error",
            message: format!("Not found: {} {}", ctx.method, ctx.uri.path()),
        }),
    };
    result.unwrap_or_else(ApiError::into_response)
}
