//! OpenAI wire format: routes, request parsing and response shapes.

pub(crate) mod azure;
mod chat;
mod embeddings;
mod fine_tuning;
mod moderations;

pub(crate) use embeddings::text_vector;

use std::borrow::Cow;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{Method, Response, StatusCode};
use serde::{Deserialize, Serialize};

use crate::body::{self, MockBody};
use crate::server::Ctx;

/// A string from the request JSON that borrows from the body when it has no
/// escapes, avoiding a copy for the common case.
#[derive(Deserialize, Debug)]
#[serde(transparent)]
struct Str<'a>(#[serde(borrow)] Cow<'a, str>);

impl Str<'_> {
    fn as_str(&self) -> &str {
        &self.0
    }
}

/// An OpenAI-shaped error a handler returns instead of a response.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    message: String,
    param: Option<&'static str>,
}

impl ApiError {
    fn invalid(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: None,
        }
    }

    fn invalid_param(param: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            param: Some(param),
            ..Self::invalid(message)
        }
    }

    fn into_response(self) -> Response<MockBody> {
        error_response(
            self.status,
            &self.message,
            "invalid_request_error",
            self.param,
        )
    }
}

type HandlerResult = Result<Response<MockBody>, ApiError>;

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorDetail<'a>,
}

#[derive(Serialize)]
struct ErrorDetail<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

/// `{"error":{"message","type","param","code":null}}` with `status`.
pub(crate) fn error_response(
    status: StatusCode,
    message: &str,
    kind: &str,
    param: Option<&str>,
) -> Response<MockBody> {
    let error = ErrorDetail {
        message,
        kind,
        param,
        code: None,
    };
    body::json(status, &ErrorBody { error })
}

/// 400 `invalid_request_error`.
pub(crate) fn invalid_request(message: &str) -> Response<MockBody> {
    error_response(
        StatusCode::BAD_REQUEST,
        message,
        "invalid_request_error",
        None,
    )
}

/// The answer to an `x-mock-status` / `status=` fault: the status with a
/// `mock_error` body whose `code` is the status as a string, plus
/// `retry-after-ms` for 429 and 503.
pub(crate) fn injected_error(status: u16, retry_after_ms: u64) -> Response<MockBody> {
    let code = status.to_string();
    let message = format!("mock injected status {status}");
    let error = ErrorDetail {
        message: &message,
        kind: "mock_error",
        param: None,
        code: Some(&code),
    };
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = body::json(status, &ErrorBody { error });
    if status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE {
        resp.headers_mut().insert(
            HeaderName::from_static("retry-after-ms"),
            HeaderValue::from(retry_after_ms),
        );
    }
    resp
}

/// Routes an OpenAI request; unknown method/path pairs get 404.
pub(crate) fn dispatch(ctx: &Ctx<'_>, body: &Bytes) -> Response<MockBody> {
    let result = match (ctx.method, ctx.route) {
        (&Method::POST, "/chat/completions") => chat::handle(ctx, body),
        (&Method::POST, "/embeddings") => embeddings::handle(ctx, body),
        (&Method::POST, "/moderations") => moderations::handle(ctx, body),
        (&Method::GET, "/fine_tuning/jobs") => fine_tuning::list_jobs(ctx),
        (&Method::GET, "/models") => Ok(models()),
        _ => Err(ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("Invalid URL ({} {})", ctx.method, ctx.uri.path()),
            param: None,
        }),
    };
    result.unwrap_or_else(ApiError::into_response)
}

fn models() -> Response<MockBody> {
    const MODELS: &[u8] =
        br#"{"object":"list","data":[{"id":"mock-model","object":"model","created":0,"owned_by":"mock"}]}"#;
    body::json_bytes(StatusCode::OK, Bytes::from_static(MODELS))
}

/// Parses the request body as JSON into `T`, mapping failures to 400.
fn parse_json<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    if body.is_empty() {
        return Err(ApiError::invalid(
            "request body is empty; expected a JSON object",
        ));
    }
    serde_json::from_slice(body)
        .map_err(|err| ApiError::invalid(format!("invalid JSON body: {err}")))
}

/// Seconds since the Unix epoch, for `created` fields.
fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
