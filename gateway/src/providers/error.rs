//! Provider errors, whatever their format, in OpenAI's error shape: the provider's status, the
//! message prefixed by the provider id, and a top-level `provider` field.
//!
//! Formats put the message in different places: OpenAI, Anthropic and Gemini under
//! `error.message` (Gemini's `error.status` names the kind); Bedrock and Cohere in a top-level
//! `message` (Bedrock names the kind in the `x-amzn-errortype` header).

use http::HeaderMap;
use serde_json::Value;

use plugin_sdk::{ErrorKind, GatewayError, ProviderFailure};

/// The most of a non-JSON error body that is quoted back to the client.
const QUOTED_CHARS: usize = 500;

/// A provider's non-2xx answer as the gateway's error, keeping the provider's status.
pub fn from_provider(
    provider: &str,
    status: u16,
    headers: &HeaderMap,
    body: &[u8],
) -> GatewayError {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let error = parsed.as_ref().and_then(|v| v.get("error"));
    let text = |v: Option<&Value>| {
        v.and_then(|v| match v {
            Value::String(s) => Some(s.clone()),
            Value::Null => None,
            other => Some(other.to_string()),
        })
    };
    let field = |key: &str| text(error.and_then(|e| e.get(key)));
    let top = |key: &str| text(parsed.as_ref().and_then(|v| v.get(key)));
    let message = field("message")
        .or_else(|| error.and_then(Value::as_str).map(str::to_owned))
        .or_else(|| top("message"))
        .or_else(|| top("Message"))
        .unwrap_or_else(|| {
            let raw = String::from_utf8_lossy(body);
            let raw = raw.trim();
            if raw.is_empty() {
                format!("status {status}")
            } else {
                raw.chars().take(QUOTED_CHARS).collect()
            }
        });
    let aws_kind = headers
        .get("x-amzn-errortype")
        .and_then(|v| v.to_str().ok())
        // `ValidationException:http://internal.amazon.com/...` carries a suffix.
        .map(|v| v.split(':').next().unwrap_or(v).to_owned());
    let error_type = field("type").or_else(|| field("status")).or(aws_kind);
    GatewayError {
        kind: ErrorKind::Provider(Box::new(ProviderFailure {
            status,
            provider: provider.to_owned(),
            error_type,
        })),
        message: format!("{provider} error: {message}"),
        param: field("param"),
        code: field("code"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;

    fn none() -> HeaderMap {
        HeaderMap::new()
    }

    #[test]
    fn openai_shaped_errors_keep_type_param_code_and_status() {
        let body = br#"{"error":{"message":"Rate limit reached","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#;
        let e = from_provider("openai", 429, &none(), body);
        assert_eq!(e.status(), StatusCode::TOO_MANY_REQUESTS);
        let b = e.body();
        assert_eq!(b["error"]["message"], "openai error: Rate limit reached");
        assert_eq!(b["error"]["type"], "requests");
        assert_eq!(b["error"]["code"], "rate_limit_exceeded");
        assert_eq!(b["provider"], "openai");
    }

    #[test]
    fn every_format_yields_its_message() {
        let anthropic =
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        let e = from_provider("anthropic", 529, &none(), anthropic);
        assert_eq!(e.body()["error"]["message"], "anthropic error: Overloaded");
        assert_eq!(e.body()["error"]["type"], "overloaded_error");

        let gemini =
            br#"{"error":{"code":400,"message":"API key not valid","status":"INVALID_ARGUMENT"}}"#;
        let e = from_provider("google", 400, &none(), gemini);
        assert_eq!(
            e.body()["error"]["message"],
            "google error: API key not valid"
        );
        assert_eq!(e.body()["error"]["type"], "INVALID_ARGUMENT");
        assert_eq!(e.status().as_u16(), 400);

        let mut headers = HeaderMap::new();
        headers.insert(
            "x-amzn-errortype",
            "ThrottlingException:http://internal.amazon.com/coral/"
                .parse()
                .unwrap(),
        );
        let e = from_provider(
            "bedrock",
            429,
            &headers,
            br#"{"message":"Too many requests"}"#,
        );
        assert_eq!(
            e.body()["error"]["message"],
            "bedrock error: Too many requests"
        );
        assert_eq!(e.body()["error"]["type"], "ThrottlingException");

        let e = from_provider("cohere", 422, &none(), br#"{"message":"invalid model"}"#);
        assert_eq!(e.body()["error"]["message"], "cohere error: invalid model");
        assert_eq!(e.status().as_u16(), 422);

        let e = from_provider("groq", 503, &none(), b"upstream overloaded");
        assert_eq!(
            e.body()["error"]["message"],
            "groq error: upstream overloaded"
        );
        let e = from_provider("groq", 502, &none(), b"");
        assert_eq!(e.body()["error"]["message"], "groq error: status 502");
    }
}
