//! The control plane's one error type, and the one place it becomes a status, a code and a body:
//! `{"success":false,"data":{"message":"...","errorCode":"AB0x"}}`.

use std::fmt;

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{header, HeaderValue, StatusCode};

/// What went wrong, in the reference's terms (each kind has one status and one code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// AB01, 400: a field is missing, malformed, out of range or unknown.
    Validation,
    /// AB02, 404: the request names another resource (a workspace, a user) that does not exist.
    Reference,
    /// AB03, 403: a known key without the right to do this.
    Forbidden,
    /// AB04, 500: a fault of the gateway or its database.
    Internal,
    /// AB05, 401: no key, or an unknown, revoked or expired one.
    Unauthorized,
    /// AB06, 429.
    RateLimited,
    /// AB07, 409: the resource already exists, or others still depend on it.
    Conflict,
    /// AB08, 404: the resource of the path does not exist.
    NotFound,
    /// AB09, 402.
    SubscriptionExhausted,
    /// AB01, 413: the request body is larger than the control plane accepts.
    PayloadTooLarge,
    /// AB01, 405: the path exists but not with this method.
    MethodNotAllowed,
}

impl ErrorKind {
    /// The status and the reference error code of each kind: the only mapping there is.
    pub fn status_and_code(self) -> (StatusCode, &'static str) {
        match self {
            ErrorKind::Validation => (StatusCode::BAD_REQUEST, "AB01"),
            ErrorKind::Reference => (StatusCode::NOT_FOUND, "AB02"),
            ErrorKind::Forbidden => (StatusCode::FORBIDDEN, "AB03"),
            ErrorKind::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "AB04"),
            ErrorKind::Unauthorized => (StatusCode::UNAUTHORIZED, "AB05"),
            ErrorKind::RateLimited => (StatusCode::TOO_MANY_REQUESTS, "AB06"),
            ErrorKind::Conflict => (StatusCode::CONFLICT, "AB07"),
            ErrorKind::NotFound => (StatusCode::NOT_FOUND, "AB08"),
            ErrorKind::SubscriptionExhausted => (StatusCode::PAYMENT_REQUIRED, "AB09"),
            ErrorKind::PayloadTooLarge => (StatusCode::PAYLOAD_TOO_LARGE, "AB01"),
            ErrorKind::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "AB01"),
        }
    }
}

/// A control-plane error: its kind and a message for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminError {
    pub kind: ErrorKind,
    pub message: String,
}

pub type Result<T, E = AdminError> = std::result::Result<T, E>;

impl AdminError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> AdminError {
        AdminError {
            kind,
            message: message.into(),
        }
    }

    pub fn validation(message: impl Into<String>) -> AdminError {
        AdminError::new(ErrorKind::Validation, message)
    }

    /// A bad field: the message starts with its path.
    pub fn field(path: &str, problem: impl fmt::Display) -> AdminError {
        AdminError::validation(format!("{path}: {problem}"))
    }

    /// The same error about an item of a list (`keys[3]`): a message that names a field
    /// (`scopes: ...`) names it inside the item (`keys[3].scopes: ...`); another one is said of
    /// the item (`keys[3]: ...`). Internal errors are left as they are.
    pub fn within(self, item: &str) -> AdminError {
        if self.kind == ErrorKind::Internal {
            return self;
        }
        let names_a_field = self.message.split_once(": ").is_some_and(|(path, _)| {
            !path.is_empty()
                && path
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_.[]".contains(c))
        });
        let message = if names_a_field {
            format!("{item}.{}", self.message)
        } else {
            format!("{item}: {}", self.message)
        };
        AdminError { message, ..self }
    }

    pub fn reference(message: impl Into<String>) -> AdminError {
        AdminError::new(ErrorKind::Reference, message)
    }

    pub fn forbidden(message: impl Into<String>) -> AdminError {
        AdminError::new(ErrorKind::Forbidden, message)
    }

    pub fn unauthorized(message: impl Into<String>) -> AdminError {
        AdminError::new(ErrorKind::Unauthorized, message)
    }

    pub fn conflict(message: impl Into<String>) -> AdminError {
        AdminError::new(ErrorKind::Conflict, message)
    }

    pub fn not_found(message: impl Into<String>) -> AdminError {
        AdminError::new(ErrorKind::NotFound, message)
    }

    pub fn internal(message: impl Into<String>) -> AdminError {
        AdminError::new(ErrorKind::Internal, message)
    }

    pub fn status(&self) -> StatusCode {
        self.kind.status_and_code().0
    }

    pub fn code(&self) -> &'static str {
        self.kind.status_and_code().1
    }

    /// The reference's admin error body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "success": false,
            "data": {"message": self.message, "errorCode": self.code()},
        })
    }

    /// The whole HTTP answer, for callers outside the router (the gateway's body limit).
    pub fn to_http(&self) -> http::Response<Bytes> {
        let mut resp = http::Response::new(Bytes::from(self.body().to_string()));
        *resp.status_mut() = self.status();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        resp
    }
}

impl fmt::Display for AdminError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.code(), self.message)
    }
}

impl std::error::Error for AdminError {}

/// Database faults are internal: the detail is logged, the client sees a generic message.
/// Callers that expect a constraint to fire (a duplicate slug) map it before this applies.
impl From<sqlx::Error> for AdminError {
    fn from(e: sqlx::Error) -> AdminError {
        tracing::error!(error = %e, "control-plane database error");
        AdminError::internal("internal error: the database failed; see the gateway's log")
    }
}

impl IntoResponse for AdminError {
    /// The error's answer; the error itself rides along in the response's extensions, where
    /// the audit of refused calls reads why a call was refused (`crate::api`).
    fn into_response(self) -> Response {
        let (status, _) = self.kind.status_and_code();
        let mut resp = (status, self.body().to_string()).into_response();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        resp.extensions_mut().insert(self);
        resp
    }
}

/// True when a database error is a unique-constraint violation.
pub fn is_unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.kind() == sqlx::error::ErrorKind::UniqueViolation)
}

/// True when a database error is a foreign-key violation.
pub fn is_foreign_key_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.kind() == sqlx::error::ErrorKind::ForeignKeyViolation)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_the_reference_status_and_code() {
        let cases = [
            (ErrorKind::Validation, 400, "AB01"),
            (ErrorKind::Reference, 404, "AB02"),
            (ErrorKind::Forbidden, 403, "AB03"),
            (ErrorKind::Internal, 500, "AB04"),
            (ErrorKind::Unauthorized, 401, "AB05"),
            (ErrorKind::RateLimited, 429, "AB06"),
            (ErrorKind::Conflict, 409, "AB07"),
            (ErrorKind::NotFound, 404, "AB08"),
            (ErrorKind::SubscriptionExhausted, 402, "AB09"),
        ];
        for (kind, status, code) in cases {
            let (s, c) = kind.status_and_code();
            assert_eq!((s.as_u16(), c), (status, code), "{kind:?}");
        }
        let body = AdminError::field("name", "must not be empty").body();
        assert_eq!(
            body,
            serde_json::json!({"success": false, "data": {"message": "name: must not be empty", "errorCode": "AB01"}})
        );
    }
}
