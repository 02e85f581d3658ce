//! Google's wire formats: the Gemini API and Vertex AI, with Google's error
//! shape `{"error":{"code":<status>,"message":"...","status":"<CODE_NAME>"}}`.
//!
//! - Gemini API: `POST /v1beta/models/{model}:{action}` (also `/v1/models/...`,
//!   which reaches the router as `/models/...`), authenticated by an API key in
//!   `x-goog-api-key` (or `?key=`); actions `generateContent`,
//!   `streamGenerateContent`, `embedContent`, `batchEmbedContents`.
//! - Vertex AI: `POST /projects/{p}/locations/{r}/publishers/{publisher}/models/{m}:{action}`
//!   (see [`vertex`]), authenticated by an OAuth bearer token.
//!
//! Request bodies are checked the way Google's JSON parser checks them: every
//! field name must be known (either in lowerCamelCase or in its snake_case
//! proto spelling), so an OpenAI-shaped body gets
//! `Invalid JSON payload received. Unknown name "messages": Cannot find field.`

mod embed;
mod generate;
mod vertex;

use std::borrow::Cow;

use http::header::{HeaderName, HeaderValue, AUTHORIZATION};
use http::{Method, Response, StatusCode};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::body::{self, MockBody};
use crate::query;
use crate::server::Ctx;

/// Gemini API methods on `models/{model}`, as they end a route.
const GEMINI_ACTIONS: [&str; 4] = [
    ":generateContent",
    ":streamGenerateContent",
    ":embedContent",
    ":batchEmbedContents",
];

/// Whether `route` (already normalized) belongs to Google's APIs, so every
/// answer on it, injected faults included, uses Google's error shape.
pub(crate) fn matches(route: &str) -> bool {
    route == "/v1beta"
        || route.starts_with("/v1beta/")
        || vertex::matches(route)
        || (route.starts_with("/models/") && GEMINI_ACTIONS.iter().any(|a| route.ends_with(a)))
}

/// A Google-shaped error a handler returns instead of a response.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }

    /// 400 `INVALID_ARGUMENT`.
    fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// 400 for a field name the message type does not have; `at` is the
    /// snake_case path of the object holding it (empty at the top level).
    fn unknown_field(name: &str, at: &str) -> Self {
        let message = if at.is_empty() {
            format!("Invalid JSON payload received. Unknown name \"{name}\": Cannot find field.")
        } else {
            format!(
                "Invalid JSON payload received. Unknown name \"{name}\" at '{at}': Cannot find field."
            )
        };
        Self::invalid(message)
    }

    /// 400 for a value of the wrong JSON type or out of range at `at`.
    fn invalid_value(at: &str, why: impl std::fmt::Display) -> Self {
        Self::invalid(format!(
            "Invalid JSON payload received. Invalid value at '{at}': {why}"
        ))
    }

    fn not_found(ctx: &Ctx<'_>) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            format!(
                "Method not found: {} {} is not a route of this API",
                ctx.method,
                ctx.uri.path()
            ),
        )
    }

    fn into_response(self) -> Response<MockBody> {
        error_response(self.status, &self.message)
    }
}

type HandlerResult = Result<Response<MockBody>, ApiError>;

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorDetail<'a>,
}

#[derive(Serialize)]
struct ErrorDetail<'a> {
    code: u16,
    message: &'a str,
    status: &'static str,
}

/// The `google.rpc.Code` name Google pairs with an HTTP status.
fn status_name(status: u16) -> &'static str {
    match status {
        200..=299 => "OK",
        400 | 413 | 422 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        409 => "ABORTED",
        412 => "FAILED_PRECONDITION",
        429 => "RESOURCE_EXHAUSTED",
        499 => "CANCELLED",
        500 => "INTERNAL",
        501 => "UNIMPLEMENTED",
        503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        _ => "UNKNOWN",
    }
}

/// `{"error":{"code":status,"message":message,"status":"<CODE_NAME>"}}`.
pub(crate) fn error_response(status: StatusCode, message: &str) -> Response<MockBody> {
    let error = ErrorDetail {
        code: status.as_u16(),
        message,
        status: status_name(status.as_u16()),
    };
    body::json(status, &ErrorBody { error })
}

/// 400 `INVALID_ARGUMENT`.
pub(crate) fn invalid_request(message: &str) -> Response<MockBody> {
    error_response(StatusCode::BAD_REQUEST, message)
}

/// The answer to an `x-mock-status` / `status=` fault: the status in
/// Google's shape (`RESOURCE_EXHAUSTED` for 429, `UNAVAILABLE` for 503...),
/// plus `retry-after-ms` for 429 and 503 as on every route.
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

/// Routes a Gemini API or Vertex AI request.
pub(crate) fn dispatch(ctx: &Ctx<'_>, body: &[u8]) -> Response<MockBody> {
    if vertex::matches(ctx.route) {
        return vertex::dispatch(ctx, body);
    }
    gemini_api(ctx, body).unwrap_or_else(ApiError::into_response)
}

/// Which API a request came in through; they differ in small ways.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Api {
    Gemini,
    Vertex,
}

fn gemini_api(ctx: &Ctx<'_>, body: &[u8]) -> HandlerResult {
    let path = ctx.route.strip_prefix("/v1beta").unwrap_or(ctx.route);
    let Some((model, action)) = path
        .strip_prefix("/models/")
        .and_then(|rest| rest.rsplit_once(':'))
        .filter(|(model, _)| !model.is_empty() && !model.contains('/'))
    else {
        return Err(ApiError::not_found(ctx));
    };
    if ctx.method != Method::POST {
        return Err(ApiError::not_found(ctx));
    }
    if !GEMINI_ACTIONS
        .iter()
        .any(|a| a.strip_prefix(':') == Some(action))
    {
        return Err(ApiError::not_found(ctx));
    }
    check_api_key(ctx)?;
    match action {
        "generateContent" => generate::handle(ctx, body, model, Api::Gemini, false),
        "streamGenerateContent" => generate::handle(ctx, body, model, Api::Gemini, true),
        "embedContent" => embed::embed_content(body, model),
        _ => embed::batch_embed_contents(body, model),
    }
}

/// The Gemini API takes an API key in `x-goog-api-key` or `?key=`. An
/// `Authorization` header instead is read as an OAuth token and refused
/// (401); no credential at all is 403, as Google answers.
fn check_api_key(ctx: &Ctx<'_>) -> Result<(), ApiError> {
    let header = ctx
        .headers
        .get("x-goog-api-key")
        .is_some_and(|v| !v.as_bytes().trim_ascii().is_empty());
    let query = query::param(ctx.uri, "key").is_some_and(|k| !k.trim().is_empty());
    if header || query {
        return Ok(());
    }
    if ctx.headers.contains_key(AUTHORIZATION) {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "Request had invalid authentication credentials: the Gemini API expects an API key \
             in the x-goog-api-key header, not an Authorization header",
        ));
    }
    Err(ApiError::new(
        StatusCode::FORBIDDEN,
        "Method doesn't allow unregistered callers: send an API key in the x-goog-api-key header",
    ))
}

/// Parses the body as a JSON object.
fn parse_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    if body.is_empty() {
        return Err(ApiError::invalid(
            "Invalid JSON payload received. The request body is empty; expected a JSON object.",
        ));
    }
    match serde_json::from_slice(body) {
        Ok(Value::Object(fields)) => Ok(fields),
        Ok(_) => Err(ApiError::invalid(
            "Invalid JSON payload received. Expected a JSON object at the top level.",
        )),
        Err(err) => Err(ApiError::invalid(format!(
            "Invalid JSON payload received. {err}"
        ))),
    }
}

/// `snake_case` spelling of a lowerCamelCase name.
fn snake_case(camel: &str) -> Cow<'_, str> {
    if !camel.bytes().any(|b| b.is_ascii_uppercase()) {
        return Cow::Borrowed(camel);
    }
    let mut out = String::with_capacity(camel.len() + 4);
    for c in camel.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// lowerCamelCase spelling of a snake_case name.
fn camel_case(name: &str) -> Cow<'_, str> {
    if !name.contains('_') {
        return Cow::Borrowed(name);
    }
    let mut out = String::with_capacity(name.len());
    let mut upper = false;
    for c in name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.push(c.to_ascii_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `fields[camel]` under its lowerCamelCase or snake_case name; `null`
/// counts as absent, as in Google's parser.
fn field<'a>(fields: &'a Map<String, Value>, camel: &str) -> Option<&'a Value> {
    fields
        .get(camel)
        .or_else(|| match snake_case(camel) {
            Cow::Owned(snake) => fields.get(&snake),
            Cow::Borrowed(_) => None,
        })
        .filter(|v| !v.is_null())
}

/// Refuses any field of `fields` whose name (in either spelling) is not in
/// `known`; `at` is the snake_case path of the object, for the message.
fn check_known(fields: &Map<String, Value>, known: &[&str], at: &str) -> Result<(), ApiError> {
    match fields
        .keys()
        .find(|key| !known.contains(&camel_case(key).as_ref()))
    {
        Some(key) => Err(ApiError::unknown_field(key, at)),
        None => Ok(()),
    }
}

/// `value` as an object, or a 400 naming `at`.
fn as_object<'a>(value: &'a Value, at: &str) -> Result<&'a Map<String, Value>, ApiError> {
    value
        .as_object()
        .ok_or_else(|| ApiError::invalid_value(at, "expected an object"))
}

/// `value` as a list, or a 400 naming `at`.
fn as_list<'a>(value: &'a Value, at: &str) -> Result<&'a [Value], ApiError> {
    value
        .as_array()
        .map(Vec::as_slice)
        .ok_or_else(|| ApiError::invalid_value(at, "expected a list"))
}

/// `value` as a string, or a 400 naming `at`.
fn as_str<'a>(value: &'a Value, at: &str) -> Result<&'a str, ApiError> {
    value
        .as_str()
        .ok_or_else(|| ApiError::invalid_value(at, "expected a string"))
}

/// `value` as a non-negative integer (a JSON number or, as proto JSON
/// allows, a decimal string), or a 400 naming `at`.
fn as_count(value: &Value, at: &str) -> Result<u64, ApiError> {
    let n = match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    };
    n.ok_or_else(|| {
        ApiError::invalid_value(at, format!("expected a non-negative integer, got {value}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_convert_both_ways() {
        assert_eq!(snake_case("generationConfig"), "generation_config");
        assert_eq!(snake_case("contents"), "contents");
        assert_eq!(camel_case("max_output_tokens"), "maxOutputTokens");
        assert_eq!(camel_case("text"), "text");
    }

    #[test]
    fn fields_are_found_in_either_spelling() {
        let fields: Map<String, Value> = serde_json::from_str(
            r#"{"system_instruction":{"parts":[]},"generationConfig":{},"tools":null}"#,
        )
        .unwrap_or_default();
        assert!(field(&fields, "systemInstruction").is_some());
        assert!(field(&fields, "generationConfig").is_some());
        assert!(field(&fields, "tools").is_none());
        assert!(check_known(
            &fields,
            &["systemInstruction", "generationConfig", "tools"],
            ""
        )
        .is_ok());
        let err = check_known(&fields, &["tools"], "")
            .err()
            .map(|e| e.message);
        assert!(err.is_some_and(|m| m.contains("Unknown name \"")));
    }

    #[test]
    fn status_names_follow_google() {
        assert_eq!(status_name(429), "RESOURCE_EXHAUSTED");
        assert_eq!(status_name(503), "UNAVAILABLE");
        assert_eq!(status_name(401), "UNAUTHENTICATED");
        assert_eq!(status_name(418), "UNKNOWN");
    }
}
