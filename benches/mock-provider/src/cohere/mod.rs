//! Cohere's v2 API: `POST /v2/chat` and `POST /v2/embed`, authenticated by
//! `Authorization: Bearer <key>`, with Cohere's error shape
//! `{"message":"..."}`.
//!
//! Requests are checked field by field as Cohere does: a field Cohere does
//! not have (OpenAI's `n`, `top_p`, `stop`, `max_completion_tokens`...) is a
//! 400 naming it, with a hint at Cohere's spelling where there is one.

mod chat;
mod embed;

use http::header::{HeaderName, HeaderValue, AUTHORIZATION};
use http::{Method, Response, StatusCode};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::body::{self, MockBody};
use crate::server::Ctx;

/// Whether `route` (already normalized) belongs to Cohere's v2 API, so
/// every answer on it, injected faults included, uses Cohere's shapes.
pub(crate) fn matches(route: &str) -> bool {
    route == "/v2" || route.starts_with("/v2/")
}

/// A Cohere-shaped error a handler returns instead of a response.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    /// 400 `invalid request: ...`.
    fn invalid(message: impl std::fmt::Display) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: format!("invalid request: {message}"),
        }
    }

    fn into_response(self) -> Response<MockBody> {
        error_response(self.status, &self.message)
    }
}

type HandlerResult = Result<Response<MockBody>, ApiError>;

#[derive(Serialize)]
struct ErrorBody<'a> {
    message: &'a str,
}

/// `{"message": message}` with `status`.
pub(crate) fn error_response(status: StatusCode, message: &str) -> Response<MockBody> {
    body::json(status, &ErrorBody { message })
}

/// 400 with `message`.
pub(crate) fn invalid_request(message: &str) -> Response<MockBody> {
    error_response(StatusCode::BAD_REQUEST, message)
}

/// The answer to an `x-mock-status` / `status=` fault: the status with
/// Cohere's `{"message"}` body, plus `retry-after-ms` for 429 and 503 as on
/// every route.
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

/// Routes a Cohere request; unknown method/path pairs get 404.
pub(crate) fn dispatch(ctx: &Ctx<'_>, body: &[u8]) -> Response<MockBody> {
    let result = match (ctx.method, ctx.route) {
        (&Method::POST, "/v2/chat") => check_auth(ctx).and_then(|()| chat::handle(ctx, body)),
        (&Method::POST, "/v2/embed") => check_auth(ctx).and_then(|()| embed::handle(ctx, body)),
        _ => Err(ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("Not Found: {} {}", ctx.method, ctx.uri.path()),
        }),
    };
    result.unwrap_or_else(ApiError::into_response)
}

/// Cohere takes the key as `Authorization: Bearer <key>`.
fn check_auth(ctx: &Ctx<'_>) -> Result<(), ApiError> {
    let unauthorized = |message: &str| ApiError {
        status: StatusCode::UNAUTHORIZED,
        message: message.to_owned(),
    };
    let Some(value) = ctx.headers.get(AUTHORIZATION) else {
        return Err(unauthorized("no api key supplied"));
    };
    let bearer = value
        .to_str()
        .ok()
        .and_then(|v| v.trim().split_once(' '))
        .is_some_and(|(scheme, key)| {
            scheme.eq_ignore_ascii_case("bearer") && !key.trim().is_empty()
        });
    if bearer {
        Ok(())
    } else {
        Err(unauthorized(
            "invalid api token: expected 'Authorization: Bearer <key>'",
        ))
    }
}

/// Parses the body as a JSON object.
fn parse_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    if body.is_empty() {
        return Err(ApiError::invalid(
            "the request body is empty; expected a JSON object",
        ));
    }
    match serde_json::from_slice(body) {
        Ok(Value::Object(fields)) => Ok(fields),
        Ok(_) => Err(ApiError::invalid("the request body must be a JSON object")),
        Err(err) => Err(ApiError::invalid(format!("invalid JSON body: {err}"))),
    }
}

/// Refuses top-level fields not in `known`; `hints` says what Cohere calls
/// some of them.
fn check_fields(
    fields: &Map<String, Value>,
    known: &[&str],
    hints: &[(&str, &str)],
) -> Result<(), ApiError> {
    let Some(name) = fields.keys().find(|k| !known.contains(&k.as_str())) else {
        return Ok(());
    };
    let hint = hints
        .iter()
        .find(|(field, _)| field == name)
        .map_or(String::new(), |(_, hint)| format!(" ({hint})"));
    Err(ApiError::invalid(format!(
        "unknown field: parameter '{name}' is not a valid field{hint}"
    )))
}

/// `fields[key]`, with `null` treated as absent.
fn get<'a>(fields: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    fields.get(key).filter(|v| !v.is_null())
}

/// The required string `fields[key]`; `path` names it in messages.
fn require_str<'a>(
    fields: &'a Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<&'a str, ApiError> {
    match get(fields, key) {
        None => Err(ApiError::invalid(format!("{path} is required"))),
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(ApiError::invalid(format!(
            "{path} must be a string, got {other}"
        ))),
    }
}

/// A UUID-shaped id from the per-instance counter, like Cohere's ids.
fn uuid_like(n: u64) -> String {
    format!("00000000-0000-4000-8000-{:012x}", n & 0xffff_ffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_name_the_field_and_hint() {
        let fields: Map<String, Value> =
            serde_json::from_str(r#"{"model":"m","top_p":1}"#).unwrap_or_default();
        let err = check_fields(&fields, &["model"], &[("top_p", "Cohere calls it 'p'")]).err();
        assert_eq!(
            err.map(|e| e.message).as_deref(),
            Some("invalid request: unknown field: parameter 'top_p' is not a valid field (Cohere calls it 'p')")
        );
        assert!(check_fields(&fields, &["model", "top_p"], &[]).is_ok());
    }

    #[test]
    fn ids_look_like_uuids() {
        assert_eq!(uuid_like(255), "00000000-0000-4000-8000-0000000000ff");
    }
}
