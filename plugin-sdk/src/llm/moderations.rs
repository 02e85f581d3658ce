//! `POST /v1/moderations` request body.

use serde::{Deserialize, Serialize};

use crate::error::GatewayError;

/// The moderation models the spec allows; `text-moderation-latest` is the default.
pub const MODERATION_MODELS: &[&str] = &["text-moderation-stable", "text-moderation-latest"];

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct ModerationRequest {
    pub input: ModerationInput,
    #[serde(default)]
    pub model: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum ModerationInput {
    Text(String),
    Texts(Vec<String>),
}

impl ModerationRequest {
    /// Checks that `model`, when given, is one of [`MODERATION_MODELS`] and that there is input.
    pub fn validate(&self) -> Result<(), GatewayError> {
        if let Some(model) = &self.model {
            if !MODERATION_MODELS.contains(&model.as_str()) {
                return Err(GatewayError::invalid_param(
                    "model",
                    format!(
                        "model must be one of {}, got {model:?}",
                        MODERATION_MODELS.join(", ")
                    ),
                ));
            }
        }
        if let ModerationInput::Texts(v) = &self.input {
            if v.is_empty() {
                return Err(GatewayError::invalid_param(
                    "input",
                    "input must not be empty",
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::context::Route;
    use crate::llm::LlmRequest;
    use serde_json::json;

    #[test]
    fn model_must_be_one_of_the_enum() {
        let ok = json!({"input": "x", "model": "text-moderation-stable"});
        LlmRequest::decode(Route::Moderations, ok.to_string().as_bytes()).unwrap();
        LlmRequest::decode(Route::Moderations, br#"{"input": "x"}"#).unwrap();
        let bad = json!({"input": "x", "model": "gpt-4o"});
        let err = LlmRequest::decode(Route::Moderations, bad.to_string().as_bytes()).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("model"));
        let err = LlmRequest::decode(Route::Moderations, br#"{"input": []}"#).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("input"));
    }
}
