//! AWS Bedrock runtime wire format: `POST /model/{modelId}/converse`,
//! `/converse-stream`, `/invoke` and `/invoke-with-response-stream`, each
//! checked for a valid AWS Signature Version 4 first.
//!
//! Errors look like AWS's: the status, an `x-amzn-errortype: <Name>` header
//! and a `{"message": "..."}` body. Every answer carries an
//! `x-amzn-requestid`; once the signature is valid, also
//! `x-mock-aws-region` (the region of the credential scope) and, when the
//! request had one, `x-mock-aws-session-token`.

mod converse;
mod eventstream;
mod invoke;
pub mod sigv4;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use http::header::{HeaderName, HeaderValue};
use http::{Method, Response, StatusCode};
use serde::Serialize;

use crate::body::{self, MockBody};
use crate::server::Ctx;

/// The only access key id the mock's Bedrock routes accept.
pub const AWS_ACCESS_KEY_ID: &str = "AKIDMOCKPROVIDER";
/// The secret that goes with [`AWS_ACCESS_KEY_ID`].
pub const AWS_SECRET_ACCESS_KEY: &str = "mock/secret/access/key";
/// The service name of Bedrock's credential scope.
const SERVICE: &str = "bedrock";

/// Path prefix of every Bedrock runtime route (after the optional `/v1`).
const PREFIX: &str = "/model/";

const ERROR_TYPE: HeaderName = HeaderName::from_static("x-amzn-errortype");
const REQUEST_ID: HeaderName = HeaderName::from_static("x-amzn-requestid");
const MOCK_REGION: HeaderName = HeaderName::from_static("x-mock-aws-region");
const MOCK_SESSION_TOKEN: HeaderName = HeaderName::from_static("x-mock-aws-session-token");

/// Content type of Bedrock's streamed answers.
const EVENTSTREAM: &str = "application/vnd.amazon.eventstream";

/// Whether `route` (already normalized) belongs to Bedrock's runtime API,
/// so that every answer on it, injected faults included, uses AWS's shapes.
pub(crate) fn matches(route: &str) -> bool {
    route.starts_with(PREFIX)
}

/// An AWS-shaped error a handler returns instead of a response.
#[derive(Debug)]
pub(crate) struct AwsError {
    status: StatusCode,
    kind: &'static str,
    message: String,
}

impl AwsError {
    /// 400 `ValidationException`.
    fn validation(message: impl Into<String>) -> Self {
        AwsError {
            status: StatusCode::BAD_REQUEST,
            kind: "ValidationException",
            message: message.into(),
        }
    }

    fn into_response(self) -> Response<MockBody> {
        error_response(self.status, self.kind, &self.message)
    }
}

type HandlerResult = Result<Response<MockBody>, AwsError>;

#[derive(Serialize)]
struct ErrorBody<'a> {
    message: &'a str,
}

/// A fresh `x-amzn-requestid` value (UUID-shaped).
fn request_id() -> HeaderValue {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    HeaderValue::from_str(&format!("00000000-0000-4000-8000-{n:012x}"))
        .unwrap_or_else(|_| HeaderValue::from_static("00000000-0000-4000-8000-000000000000"))
}

/// `{"message": message}` with `status` and `x-amzn-errortype: kind`.
pub(crate) fn error_response(status: StatusCode, kind: &str, message: &str) -> Response<MockBody> {
    let mut resp = body::json(status, &ErrorBody { message });
    if let Ok(value) = HeaderValue::from_str(kind) {
        resp.headers_mut().insert(ERROR_TYPE, value);
    }
    resp.headers_mut().insert(REQUEST_ID, request_id());
    resp
}

/// 400 `ValidationException`.
pub(crate) fn invalid_request(message: &str) -> Response<MockBody> {
    error_response(StatusCode::BAD_REQUEST, "ValidationException", message)
}

/// The AWS error name Bedrock answers with `status`.
fn error_name(status: u16) -> &'static str {
    match status {
        401 | 403 => "AccessDeniedException",
        404 => "ResourceNotFoundException",
        408 => "ModelTimeoutException",
        424 => "ModelErrorException",
        429 => "ThrottlingException",
        503 => "ServiceUnavailableException",
        400..=499 => "ValidationException",
        _ => "InternalServerException",
    }
}

/// The answer to an `x-mock-status` / `status=` fault: the status with the
/// AWS error name for it and `{"message"}`, plus `retry-after-ms` for 429
/// and 503 as on every other route.
pub(crate) fn injected_error(status: u16, retry_after_ms: u64) -> Response<MockBody> {
    let message = format!("mock injected status {status}");
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = error_response(code, error_name(code.as_u16()), &message);
    if matches!(code.as_u16(), 429 | 503) {
        resp.headers_mut().insert(
            HeaderName::from_static("retry-after-ms"),
            HeaderValue::from(retry_after_ms),
        );
    }
    resp
}

/// Checks the signature, then routes a Bedrock request.
pub(crate) fn dispatch(ctx: &Ctx<'_>, body: &[u8]) -> Response<MockBody> {
    let expected = sigv4::Expected {
        access_key_id: AWS_ACCESS_KEY_ID,
        secret_access_key: AWS_SECRET_ACCESS_KEY,
        service: SERVICE,
        now: SystemTime::now(),
    };
    let verified = sigv4::verify(ctx.method, ctx.uri, ctx.headers, body, &expected);
    let mut resp = match &verified {
        Ok(_) => route(ctx, body).unwrap_or_else(AwsError::into_response),
        Err(rejection) => rejection_response(rejection),
    };
    let headers = resp.headers_mut();
    if !headers.contains_key(REQUEST_ID) {
        headers.insert(REQUEST_ID, request_id());
    }
    if let Ok(verified) = verified {
        if let Ok(value) = HeaderValue::from_str(&verified.region) {
            headers.insert(MOCK_REGION, value);
        }
        if let Some(token) = verified.session_token {
            if let Ok(value) = HeaderValue::from_str(&token) {
                headers.insert(MOCK_SESSION_TOKEN, value);
            }
        }
    }
    resp
}

fn rejection_response(rejection: &sigv4::Rejection) -> Response<MockBody> {
    let (kind, message) = match rejection {
        sigv4::Rejection::Missing => (
            "MissingAuthenticationTokenException",
            "Missing Authentication Token",
        ),
        sigv4::Rejection::Incomplete(message) => ("IncompleteSignatureException", message.as_str()),
        sigv4::Rejection::UnknownKey => (
            "UnrecognizedClientException",
            "The security token included in the request is invalid.",
        ),
        sigv4::Rejection::Invalid(message) => ("InvalidSignatureException", message.as_str()),
    };
    error_response(StatusCode::FORBIDDEN, kind, message)
}

/// Which operation a path names.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Operation {
    Converse,
    ConverseStream,
    Invoke,
    InvokeStream,
}

fn route(ctx: &Ctx<'_>, body: &[u8]) -> HandlerResult {
    let unknown = || {
        AwsError {
        status: StatusCode::NOT_FOUND,
        kind: "UnknownOperationException",
        message: format!(
            "Unknown operation: {} {} (the model id must be one percent-encoded path segment: /model/{{modelId}}/converse, converse-stream, invoke or invoke-with-response-stream)",
            ctx.method,
            ctx.uri.path()
        ),
    }
    };
    let rest = ctx.route.strip_prefix(PREFIX).unwrap_or("");
    let Some((raw_model, op)) = rest.split_once('/') else {
        return Err(unknown());
    };
    let op = match op {
        "converse" => Operation::Converse,
        "converse-stream" => Operation::ConverseStream,
        "invoke" => Operation::Invoke,
        "invoke-with-response-stream" => Operation::InvokeStream,
        _ => return Err(unknown()),
    };
    if ctx.method != Method::POST {
        return Err(unknown());
    }
    let model = String::from_utf8(sigv4::percent_decode(raw_model))
        .map_err(|_| AwsError::validation("The provided model identifier is invalid."))?;
    if model.trim().is_empty() {
        return Err(AwsError::validation(
            "The provided model identifier is invalid.",
        ));
    }
    match op {
        Operation::Converse => converse::handle(ctx, &model, body, false),
        Operation::ConverseStream => converse::handle(ctx, &model, body, true),
        Operation::Invoke => invoke::handle(ctx, &model, body, false),
        Operation::InvokeStream => invoke::handle(ctx, &model, body, true),
    }
}

/// The foundation model id inside `model`: the last `/` part of an ARN,
/// without a cross-region inference profile prefix (`us.`, `eu.`, ...).
fn base_model(model: &str) -> &str {
    let id = model.rsplit('/').next().unwrap_or(model);
    for prefix in [
        "us.", "eu.", "apac.", "us-gov.", "global.", "jp.", "au.", "ca.",
    ] {
        if let Some(rest) = id.strip_prefix(prefix) {
            return rest;
        }
    }
    id
}

/// The request body as a JSON object.
fn parse_object(body: &[u8]) -> Result<serde_json::Map<String, serde_json::Value>, AwsError> {
    if body.is_empty() {
        return Err(AwsError::validation(
            "Malformed input request: the request body is empty; expected a JSON object",
        ));
    }
    match serde_json::from_slice(body) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        Ok(_) => Err(AwsError::validation(
            "Malformed input request: expected a JSON object",
        )),
        Err(err) => Err(AwsError::validation(format!(
            "Malformed input request: invalid JSON: {err}"
        ))),
    }
}

/// The events of a streamed answer as an eventstream response.
fn eventstream_response(ctx: &Ctx<'_>, events: crate::sse::Events) -> Response<MockBody> {
    let faults = ctx.faults.stream_faults(ctx.failure.disconnect_after);
    let sse = crate::sse::SseBody::new(events, faults);
    body::response(StatusCode::OK, EVENTSTREAM, MockBody::Sse(sse))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_ids_reduce_to_the_foundation_model() {
        assert_eq!(base_model("anthropic.claude-v2:1"), "anthropic.claude-v2:1");
        assert_eq!(
            base_model("us.anthropic.claude-3-5-sonnet-20240620-v1:0"),
            "anthropic.claude-3-5-sonnet-20240620-v1:0"
        );
        assert_eq!(
            base_model("arn:aws:bedrock:us-east-1::foundation-model/cohere.embed-english-v3"),
            "cohere.embed-english-v3"
        );
    }

    #[test]
    fn injected_errors_are_named() {
        for (status, name) in [
            (400, "ValidationException"),
            (403, "AccessDeniedException"),
            (404, "ResourceNotFoundException"),
            (429, "ThrottlingException"),
            (500, "InternalServerException"),
            (503, "ServiceUnavailableException"),
        ] {
            let resp = injected_error(status, 10);
            assert_eq!(resp.status().as_u16(), status);
            assert_eq!(resp.headers()["x-amzn-errortype"], name);
        }
        assert!(injected_error(429, 10)
            .headers()
            .contains_key("retry-after-ms"));
    }
}
