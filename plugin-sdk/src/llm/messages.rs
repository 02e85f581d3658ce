//! `POST /v1/messages` request body: Anthropic's Messages API, for clients that speak it.
//!
//! The body is forwarded as the client wrote it (to Anthropic) or with the few changes a cloud
//! needs (Vertex AI, Bedrock); only what the gateway itself reads is decoded here.

use serde::Deserialize;
use serde_json::Value;

use crate::error::GatewayError;

#[derive(Debug, Clone, Deserialize)]
pub struct MessagesRequest {
    pub model: String,
    pub max_tokens: u64,
    pub messages: Vec<Value>,
    #[serde(default)]
    pub stream: Option<bool>,
}

impl MessagesRequest {
    /// Checks what Anthropic requires: a model, at least one message, `max_tokens` of at least 1.
    pub fn validate(&self) -> Result<(), GatewayError> {
        if self.model.trim().is_empty() {
            return Err(GatewayError::invalid_param(
                "model",
                "model must not be empty",
            ));
        }
        if self.messages.is_empty() {
            return Err(GatewayError::invalid_param(
                "messages",
                "messages must hold at least one message",
            ));
        }
        if self.max_tokens == 0 {
            return Err(GatewayError::invalid_param(
                "max_tokens",
                "max_tokens must be at least 1",
            ));
        }
        Ok(())
    }
}
