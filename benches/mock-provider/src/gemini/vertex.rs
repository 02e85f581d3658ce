//! Vertex AI:
//! `POST /projects/{p}/locations/{r}/publishers/{publisher}/models/{m}:{action}`
//! (after the optional `/v1`; `/v1beta1/projects/...` too).
//!
//! - publisher `google`: `generateContent` and `streamGenerateContent`
//!   behave as on the Gemini API (Vertex's `Schema` also takes
//!   `additionalProperties`, and the request `labels`); `predict` embeds
//!   text instances.
//! - publisher `anthropic`: `rawPredict` and `streamRawPredict` take an
//!   Anthropic Messages body with `"anthropic_version": "vertex-2023-10-16"`
//!   and no `model` (the URL names it), and answer as Anthropic's Messages API
//!   does, errors included, with `model` set to `{m}`. `streamRawPredict`
//!   needs `"stream": true` and `rawPredict` refuses it.
//!
//! Every route needs `Authorization: Bearer <token>` (401 `UNAUTHENTICATED`
//! in Google's shape otherwise). Every answer from here, errors included,
//! echoes the project and region of the URL in `x-mock-vertex-project` and
//! `x-mock-vertex-region`; injected `status` faults are answered before
//! routing and do not.

use http::header::{HeaderName, HeaderValue, AUTHORIZATION};
use http::{Method, Response, StatusCode};
use serde_json::Value;

use super::{embed, generate, Api, ApiError};
use crate::anthropic;
use crate::body::MockBody;
use crate::server::Ctx;

/// The `anthropic_version` Vertex AI requires in Anthropic bodies.
const ANTHROPIC_VERSION: &str = "vertex-2023-10-16";

/// Whether `route` (already normalized) is a Vertex AI route.
pub(super) fn matches(route: &str) -> bool {
    route.starts_with("/projects/") || route.starts_with("/v1beta1/projects/")
}

/// Answers a Vertex AI request and echoes its project and region.
pub(super) fn dispatch(ctx: &Ctx<'_>, body: &[u8]) -> Response<MockBody> {
    let path = ctx.route.strip_prefix("/v1beta1").unwrap_or(ctx.route);
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let mut resp = answer(ctx, body, &segments);
    if let ["projects", project, "locations", region, ..] = segments.as_slice() {
        let headers = resp.headers_mut();
        if let Ok(project) = HeaderValue::from_str(project) {
            headers.insert(HeaderName::from_static("x-mock-vertex-project"), project);
        }
        if let Ok(region) = HeaderValue::from_str(region) {
            headers.insert(HeaderName::from_static("x-mock-vertex-region"), region);
        }
    }
    resp
}

fn answer(ctx: &Ctx<'_>, body: &[u8], segments: &[&str]) -> Response<MockBody> {
    let not_found = || ApiError::not_found(ctx).into_response();
    let ["projects", project, "locations", region, "publishers", publisher, "models", model_action] =
        segments
    else {
        return not_found();
    };
    let Some((model, action)) = model_action
        .rsplit_once(':')
        .filter(|(model, _)| !model.is_empty())
    else {
        return not_found();
    };
    let known = matches!(
        (*publisher, action),
        (
            "google",
            "generateContent" | "streamGenerateContent" | "predict"
        ) | ("anthropic", "rawPredict" | "streamRawPredict")
    );
    if ctx.method != Method::POST || !known || project.is_empty() || region.is_empty() {
        return not_found();
    }
    if let Err(err) = check_bearer(ctx) {
        return err.into_response();
    }
    let result = match (*publisher, action) {
        ("google", "generateContent") => generate::handle(ctx, body, model, Api::Vertex, false),
        ("google", "streamGenerateContent") => {
            generate::handle(ctx, body, model, Api::Vertex, true)
        }
        ("google", _) => embed::predict(body),
        _ => return anthropic_messages(ctx, body, model, action == "streamRawPredict"),
    };
    result.unwrap_or_else(ApiError::into_response)
}

/// Vertex AI authenticates with an OAuth access token as a bearer token.
fn check_bearer(ctx: &Ctx<'_>) -> Result<(), ApiError> {
    let token = ctx
        .headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        .filter(|(scheme, token)| {
            scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty()
        });
    if token.is_some() {
        return Ok(());
    }
    let hint = if ctx.headers.contains_key("x-goog-api-key") {
        " (an x-goog-api-key header is not enough here)"
    } else {
        ""
    };
    Err(ApiError::new(
        StatusCode::UNAUTHORIZED,
        format!(
            "Request is missing a valid authentication credential: Vertex AI expects an OAuth 2 \
             access token in 'Authorization: Bearer <token>'{hint}"
        ),
    ))
}

/// `rawPredict` / `streamRawPredict` on an Anthropic model: checks what
/// Vertex adds to the Messages format, then lets the Anthropic mock answer
/// with `model` taken from the URL.
fn anthropic_messages(
    ctx: &Ctx<'_>,
    body: &[u8],
    model: &str,
    stream_action: bool,
) -> Response<MockBody> {
    let invalid = |message: &str| {
        anthropic::error_response(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    };
    let mut fields = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(fields)) => fields,
        Ok(_) => return invalid("request body must be a JSON object"),
        Err(err) => return invalid(&format!("invalid JSON body: {err}")),
    };
    match fields.get("anthropic_version") {
        None | Some(Value::Null) => {
            return invalid(&format!(
                "anthropic_version: Field required (Vertex AI expects \"{ANTHROPIC_VERSION}\")"
            ))
        }
        Some(Value::String(version)) if version == ANTHROPIC_VERSION => {}
        Some(other) => {
            return invalid(&format!(
                "anthropic_version: must be \"{ANTHROPIC_VERSION}\" on Vertex AI, got {other}"
            ))
        }
    }
    if fields.contains_key("model") {
        return invalid(
            "model: Extra inputs are not permitted (Vertex AI takes the model from the URL)",
        );
    }
    let streams = fields.get("stream").and_then(Value::as_bool) == Some(true);
    if stream_action && !streams {
        return invalid("stream: streamRawPredict needs \"stream\": true");
    }
    if !stream_action && streams {
        return invalid("stream: rawPredict does not stream; use streamRawPredict");
    }
    fields.remove("anthropic_version");
    fields.insert("model".to_owned(), Value::String(model.to_owned()));
    let body = serde_json::to_vec(&Value::Object(fields)).unwrap_or_default();
    anthropic::messages_without_auth(ctx, &body)
}
