//! Azure OpenAI: `POST /openai/deployments/{deployment}/chat/completions`
//! and `/openai/deployments/{deployment}/embeddings`, with an
//! `?api-version=YYYY-MM-DD[-preview]` query parameter and an `api-key`
//! header.
//!
//! Past Azure's own checks the request is answered exactly as the OpenAI
//! routes answer it (same request checks, replies, streams and OpenAI-shaped
//! validation errors), with `model` defaulting to the deployment name when
//! the body has none. Azure's own errors are
//! `{"error":{"code":"<status>","message":"..."}}`: 401 without `api-key`,
//! 404 `Resource not found` without a well-formed `api-version` or on any
//! other path. Every answer from here, errors included, echoes the
//! deployment and the API version in `x-mock-azure-deployment` and
//! `x-mock-azure-api-version` (injected `status` faults are answered before
//! routing and do not).

use std::borrow::Cow;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{Method, Response, StatusCode};
use serde::Serialize;
use serde_json::Value;

use super::{chat, embeddings, ApiError};
use crate::body::{self, MockBody};
use crate::query;
use crate::server::Ctx;

/// Whether `route` (already normalized) belongs to Azure OpenAI, so every
/// answer on it, injected faults included, uses Azure's error shape.
pub(crate) fn matches(route: &str) -> bool {
    route == "/openai" || route.starts_with("/openai/")
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorDetail<'a>,
}

#[derive(Serialize)]
struct ErrorDetail<'a> {
    code: &'a str,
    message: &'a str,
}

/// `{"error":{"code":"<status>","message":message}}` with `status`.
pub(crate) fn error_response(status: StatusCode, message: &str) -> Response<MockBody> {
    let code = status.as_u16().to_string();
    body::json(
        status,
        &ErrorBody {
            error: ErrorDetail {
                code: &code,
                message,
            },
        },
    )
}

/// 400 in Azure's shape.
pub(crate) fn invalid_request(message: &str) -> Response<MockBody> {
    error_response(StatusCode::BAD_REQUEST, message)
}

/// The answer to an `x-mock-status` / `status=` fault: the status in Azure's
/// shape, plus `retry-after-ms` for 429 and 503 as on every route.
pub(crate) fn injected_error(status: u16, retry_after_ms: u64) -> Response<MockBody> {
    let message = format!("mock injected status {status}");
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = error_response(status, &message);
    if status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE {
        resp.headers_mut().insert(
            HeaderName::from_static("retry-after-ms"),
            HeaderValue::from(retry_after_ms),
        );
    }
    resp
}

/// Answers an Azure OpenAI request and echoes its deployment and version.
pub(crate) fn dispatch(ctx: &Ctx<'_>, body: &Bytes) -> Response<MockBody> {
    let target = ctx
        .route
        .strip_prefix("/openai/deployments/")
        .and_then(|rest| rest.split_once('/'))
        .filter(|(deployment, _)| !deployment.is_empty());
    let version = query::param(ctx.uri, "api-version");
    let mut resp = answer(ctx, body, target, version.as_deref());
    let headers = resp.headers_mut();
    if let Some(deployment) = target.and_then(|(d, _)| HeaderValue::from_str(d).ok()) {
        headers.insert(
            HeaderName::from_static("x-mock-azure-deployment"),
            deployment,
        );
    }
    if let Some(version) = version.and_then(|v| HeaderValue::from_str(&v).ok()) {
        headers.insert(HeaderName::from_static("x-mock-azure-api-version"), version);
    }
    resp
}

fn answer(
    ctx: &Ctx<'_>,
    body: &Bytes,
    target: Option<(&str, &str)>,
    version: Option<&str>,
) -> Response<MockBody> {
    let has_key = ctx
        .headers
        .get("api-key")
        .is_some_and(|v| !v.as_bytes().trim_ascii().is_empty());
    if !has_key {
        return error_response(
            StatusCode::UNAUTHORIZED,
            "Access denied due to invalid subscription key or wrong API endpoint: send the key \
             in the api-key header",
        );
    }
    let not_found = || error_response(StatusCode::NOT_FOUND, "Resource not found");
    if !version.is_some_and(well_formed_version) {
        return not_found();
    }
    let result = match (ctx.method, target) {
        (&Method::POST, Some((deployment, "chat/completions"))) => {
            chat::handle(ctx, &with_model(body, deployment))
        }
        (&Method::POST, Some((deployment, "embeddings"))) => {
            embeddings::handle(ctx, &with_model(body, deployment))
        }
        _ => return not_found(),
    };
    result.unwrap_or_else(ApiError::into_response)
}

/// `YYYY-MM-DD`, optionally followed by `-preview` or another lowercase tag.
fn well_formed_version(version: &str) -> bool {
    let (date, tag) = match version.split_at_checked(10) {
        Some((date, rest)) => (date, rest),
        None => return false,
    };
    let date_ok = date.bytes().enumerate().all(|(i, b)| match i {
        4 | 7 => b == b'-',
        _ => b.is_ascii_digit(),
    });
    let tag_ok = tag.is_empty()
        || tag
            .strip_prefix('-')
            .is_some_and(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_lowercase()));
    date_ok && tag_ok
}

/// The body with `"model": deployment` added when it is a JSON object
/// without a model; otherwise unchanged (the OpenAI handler judges it).
fn with_model<'b>(body: &'b Bytes, deployment: &str) -> Cow<'b, [u8]> {
    let Ok(Value::Object(mut fields)) = serde_json::from_slice::<Value>(body) else {
        return Cow::Borrowed(body);
    };
    if fields.get("model").is_some_and(|m| !m.is_null()) {
        return Cow::Borrowed(body);
    }
    fields.insert("model".to_owned(), Value::String(deployment.to_owned()));
    match serde_json::to_vec(&Value::Object(fields)) {
        Ok(bytes) => Cow::Owned(bytes),
        Err(_) => Cow::Borrowed(body),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_dates_with_an_optional_tag() {
        assert!(well_formed_version("2024-10-21"));
        assert!(well_formed_version("2025-01-01-preview"));
        assert!(!well_formed_version("2024-10-2"));
        assert!(!well_formed_version("latest"));
        assert!(!well_formed_version("2024-10-21-"));
        assert!(!well_formed_version("2024/10/21"));
    }

    #[test]
    fn model_defaults_to_the_deployment() {
        let body = Bytes::from_static(br#"{"messages":[]}"#);
        let with: Value = serde_json::from_slice(&with_model(&body, "dep")).unwrap_or_default();
        assert_eq!(with["model"], "dep");
        let named = Bytes::from_static(br#"{"model":"gpt","messages":[]}"#);
        assert_eq!(&*with_model(&named, "dep"), &named[..]);
        let broken = Bytes::from_static(b"{");
        assert_eq!(&*with_model(&broken, "dep"), b"{");
    }
}
