//! The gateway's error type and its one mapping to HTTP.
//!
//! Every layer (header parsing, body validation, plugins, routing, upstream I/O) reports failures
//! as a [`GatewayError`]. Its [`ErrorKind`] decides the HTTP status; [`GatewayError::body`] renders
//! the OpenAI-style error body that OpenAI SDKs read (`error.message`, `error.type`,
//! `error.param`, `error.code`). Nothing else in the code base picks a status for an error.

use std::fmt;

use http::StatusCode;
use serde_json::{json, Value};

/// Where a failure came from, which decides its status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorKind {
    /// The client sent something invalid: 400.
    InvalidRequest,
    /// The request body is larger than the configured maximum: 413.
    PayloadTooLarge,
    /// Missing, unknown, revoked or expired credentials: 401.
    Unauthorized,
    /// Known credentials without the right: 403.
    Forbidden,
    /// No such route or resource: 404.
    NotFound,
    /// `x-gw-request-timeout` or a target's `request_timeout` expired: 408.
    Timeout,
    /// A budget (usage limit) is exhausted: 412.
    BudgetExhausted,
    /// A rate limit is exhausted: 429; the value is the `retry-after` in seconds.
    RateLimited { retry_after_secs: u64 },
    /// The upstream could not be resolved or reached: 502.
    UpstreamUnreachable,
    /// The upstream answered something the gateway cannot use: 502.
    UpstreamBadResponse,
    /// The upstream did not answer within the gateway's own I/O timeouts: 504.
    UpstreamTimeout,
    /// The provider answered with an error, passed on with its own status.
    Provider(Box<ProviderFailure>),
    /// A bug or an unavailable dependency of the gateway: 500.
    Internal,
}

/// What a provider's error answer said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderFailure {
    pub status: u16,
    /// The provider id.
    pub provider: String,
    /// The provider's own `error.type`, when it gave one.
    pub error_type: Option<String>,
}

/// A failure that ends a request, with what the client should be told.
#[derive(Debug, Clone)]
pub struct GatewayError {
    pub kind: ErrorKind,
    pub message: String,
    /// The request field at fault, when there is one (`messages`, `temperature`...).
    pub param: Option<String>,
    /// A machine-readable code (`AB01` for config validation...).
    pub code: Option<String>,
}

impl GatewayError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        GatewayError {
            kind,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// A 400 naming the offending field.
    pub fn invalid_param(param: impl Into<String>, message: impl Into<String>) -> Self {
        GatewayError {
            kind: ErrorKind::InvalidRequest,
            message: message.into(),
            param: Some(param.into()),
            code: None,
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidRequest, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }

    pub fn with_code(mut self, code: impl Into<String>) -> Self {
        self.code = Some(code.into());
        self
    }

    /// The HTTP status this error is answered with.
    pub fn status(&self) -> StatusCode {
        match &self.kind {
            ErrorKind::InvalidRequest => StatusCode::BAD_REQUEST,
            ErrorKind::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorKind::Forbidden => StatusCode::FORBIDDEN,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::Timeout => StatusCode::REQUEST_TIMEOUT,
            ErrorKind::BudgetExhausted => StatusCode::PRECONDITION_FAILED,
            ErrorKind::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::UpstreamUnreachable | ErrorKind::UpstreamBadResponse => {
                StatusCode::BAD_GATEWAY
            }
            ErrorKind::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
            ErrorKind::Provider(p) => {
                StatusCode::from_u16(p.status).unwrap_or(StatusCode::BAD_GATEWAY)
            }
            ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The `error.type` string of the body.
    pub fn error_type(&self) -> &str {
        match &self.kind {
            ErrorKind::Provider(p) if p.error_type.is_some() => {
                p.error_type.as_deref().unwrap_or_default()
            }
            ErrorKind::InvalidRequest | ErrorKind::PayloadTooLarge | ErrorKind::NotFound => {
                "invalid_request_error"
            }
            ErrorKind::Unauthorized => "authentication_error",
            ErrorKind::Forbidden => "permission_error",
            ErrorKind::Timeout => "timeout_error",
            ErrorKind::BudgetExhausted => "budget_exceeded",
            ErrorKind::RateLimited { .. } => "rate_limit_error",
            ErrorKind::UpstreamUnreachable
            | ErrorKind::UpstreamBadResponse
            | ErrorKind::UpstreamTimeout => "upstream_error",
            ErrorKind::Provider(_) => "provider_error",
            ErrorKind::Internal => "internal_error",
        }
    }

    /// True for errors of the gateway's own making about the client's request; routing never
    /// falls back or retries on these.
    pub fn is_client_error(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::InvalidRequest
                | ErrorKind::PayloadTooLarge
                | ErrorKind::Unauthorized
                | ErrorKind::Forbidden
                | ErrorKind::NotFound
        )
    }

    /// The JSON body: `{"error":{"message","type","param","code"}}`, plus a top-level `provider`
    /// for provider errors.
    pub fn body(&self) -> Value {
        let mut body = json!({
            "error": {
                "message": self.message,
                "type": self.error_type(),
                "param": self.param,
                "code": self.code,
            }
        });
        if let ErrorKind::Provider(p) = &self.kind {
            body["provider"] = Value::String(p.provider.clone());
        }
        body
    }
}

impl fmt::Display for GatewayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.param {
            Some(param) => write!(f, "{} ({}): {}", self.status(), param, self.message),
            None => write!(f, "{}: {}", self.status(), self.message),
        }
    }
}

impl std::error::Error for GatewayError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_param_is_400_naming_the_field() {
        let e = GatewayError::invalid_param("temperature", "must be between 0 and 2");
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        let body = e.body();
        assert_eq!(body["error"]["param"], "temperature");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["message"], "must be between 0 and 2");
    }

    #[test]
    fn provider_errors_keep_their_status_and_name_the_provider() {
        let e = GatewayError::new(
            ErrorKind::Provider(Box::new(ProviderFailure {
                status: 429,
                provider: "openai".into(),
                error_type: None,
            })),
            "openai error: slow down",
        );
        assert_eq!(e.status().as_u16(), 429);
        assert_eq!(e.body()["provider"], "openai");
        assert!(!e.is_client_error());
    }

    #[test]
    fn timeout_is_408_with_timeout_error_type() {
        let e = GatewayError::new(ErrorKind::Timeout, "x");
        assert_eq!(e.status().as_u16(), 408);
        assert_eq!(e.body()["error"]["type"], "timeout_error");
        assert_eq!(e.body()["error"]["code"], Value::Null);
    }
}
