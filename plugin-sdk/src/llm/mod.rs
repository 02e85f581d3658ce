//! Canonical LLM request types: the OpenAI shapes that clients send, decoded into typed views.
//!
//! The gateway decodes the body of each LLM route once into one of these types, to validate it
//! against the spec's limits and to let plugins read it. The raw body is kept beside it: when
//! the provider speaks the client's format, the raw bytes are forwarded without a re-encode.
//! Unknown fields are ignored here (and still forwarded in the raw body).

pub mod chat;
pub mod embeddings;
pub mod messages;
pub mod moderations;

use serde::de::DeserializeOwned;

use crate::context::Route;
use crate::error::GatewayError;

pub use chat::ChatRequest;
pub use embeddings::EmbeddingsRequest;
pub use messages::MessagesRequest;
pub use moderations::ModerationRequest;

/// The decoded body of a request.
#[derive(Debug, Clone, Default)]
pub enum LlmRequest {
    /// No body was decoded (passthrough, fine-tuning job listing).
    #[default]
    None,
    Chat(Box<ChatRequest>),
    Embeddings(Box<EmbeddingsRequest>),
    Moderation(Box<ModerationRequest>),
    /// Anthropic's Messages API (`POST /v1/messages`).
    Messages(Box<MessagesRequest>),
}

impl LlmRequest {
    /// Decodes and validates the body of a route. Routes without a body decode to `None`.
    pub fn decode(route: Route, body: &[u8]) -> Result<LlmRequest, GatewayError> {
        match route {
            Route::ChatCompletions => {
                let chat: ChatRequest = decode_json(body)?;
                chat.validate()?;
                Ok(LlmRequest::Chat(Box::new(chat)))
            }
            Route::Embeddings => {
                let req: EmbeddingsRequest = decode_json(body)?;
                req.validate()?;
                Ok(LlmRequest::Embeddings(Box::new(req)))
            }
            Route::Moderations => {
                let req: ModerationRequest = decode_json(body)?;
                req.validate()?;
                Ok(LlmRequest::Moderation(Box::new(req)))
            }
            Route::Messages => {
                let req: MessagesRequest = decode_json(body)?;
                req.validate()?;
                Ok(LlmRequest::Messages(Box::new(req)))
            }
            Route::FineTuningJobs | Route::Passthrough => Ok(LlmRequest::None),
        }
    }

    /// The `model` field of the body, if any.
    pub fn model(&self) -> Option<&str> {
        match self {
            LlmRequest::None => None,
            LlmRequest::Chat(r) => r.model.as_deref(),
            LlmRequest::Embeddings(r) => r.model.as_deref(),
            LlmRequest::Moderation(r) => Some(
                r.model
                    .as_deref()
                    .unwrap_or(moderations::DEFAULT_MODERATION_MODEL),
            ),
            LlmRequest::Messages(r) => Some(&r.model),
        }
    }

    /// Whether the client asked for a server-sent event stream.
    pub fn is_stream(&self) -> bool {
        match self {
            LlmRequest::Chat(r) => r.stream == Some(true),
            LlmRequest::Messages(r) => r.stream == Some(true),
            _ => false,
        }
    }
}

/// Deserializes a JSON body; a type error names the field (`messages[0].role`), a syntax error
/// says where the JSON is broken.
pub fn decode_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, GatewayError> {
    // The common case, valid bodies, skips path tracking; a failure is decoded again with it
    // to name the field.
    if let Ok(value) = serde_json::from_slice(body) {
        return Ok(value);
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            return GatewayError::invalid(format!("request body is not valid JSON: {inner}"));
        }
        let message = inner.to_string();
        // A missing field is reported at its parent: name the field itself.
        let param = match (path.as_str(), missing_field(&message)) {
            (".", field) => field.map(str::to_owned),
            (parent, Some(field)) => Some(format!("{parent}.{field}")),
            (_, None) => Some(path),
        };
        match param {
            Some(param) => {
                GatewayError::invalid_param(param.clone(), format!("{param}: {message}"))
            }
            None => GatewayError::invalid(format!("invalid request body: {message}")),
        }
    })?;
    de.end()
        .map_err(|e| GatewayError::invalid(format!("request body is not valid JSON: {e}")))?;
    Ok(value)
}

fn missing_field(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("missing field `")?;
    rest.split('`').next()
}

/// Checks `low <= value <= high` for an optional number field.
pub(crate) fn check_range<T: PartialOrd + std::fmt::Display + Copy>(
    param: &str,
    value: Option<T>,
    low: T,
    high: T,
) -> Result<(), GatewayError> {
    match value {
        Some(v) if !(low..=high).contains(&v) => Err(GatewayError::invalid_param(
            param,
            format!("{param} must be between {low} and {high}, got {v}"),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syntax_errors_and_missing_fields_are_400s() {
        let err = LlmRequest::decode(Route::ChatCompletions, b"{\"messages\": [").unwrap_err();
        assert_eq!(err.status().as_u16(), 400);
        assert!(err.message.contains("not valid JSON"), "{}", err.message);

        let err = LlmRequest::decode(Route::ChatCompletions, b"{\"model\":\"m\"}").unwrap_err();
        assert_eq!(err.param.as_deref(), Some("messages"));

        let err = LlmRequest::decode(Route::ChatCompletions, b"{} trailing").unwrap_err();
        assert_eq!(err.status().as_u16(), 400);

        let err = LlmRequest::decode(Route::Embeddings, b"[1,2]").unwrap_err();
        assert_eq!(err.status().as_u16(), 400);
    }

    #[test]
    fn type_errors_name_the_nested_field() {
        let body = br#"{"messages":[{"role":"user","content":"hi"},{"role":7}]}"#;
        let err = LlmRequest::decode(Route::ChatCompletions, body).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("messages[1].role"));
    }
}
