//! `POST /v1/moderations` request body.

use serde::{Deserialize, Serialize};

use crate::error::GatewayError;

/// The model a moderation request without `model` is answered by (the spec's default); any
/// other model name is the provider's to accept, as providers add models
/// (`omni-moderation-latest`...).
pub const DEFAULT_MODERATION_MODEL: &str = "text-moderation-latest";

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
    /// Checks that `model`, when given, is a name (not empty) and that there is input.
    pub fn validate(&self) -> Result<(), GatewayError> {
        if self.model.as_deref().is_some_and(|m| m.trim().is_empty()) {
            return Err(GatewayError::invalid_param(
                "model",
                "model must name a moderation model, or be left out for the default",
            ));
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
    fn any_model_name_is_accepted_and_input_is_required() {
        for model in [
            "text-moderation-stable",
            "text-moderation-latest",
            "omni-moderation-latest",
            "omni-moderation-2024-09-26",
        ] {
            let ok = json!({"input": "x", "model": model});
            let r = LlmRequest::decode(Route::Moderations, ok.to_string().as_bytes()).unwrap();
            assert_eq!(r.model(), Some(model));
        }
        let r = LlmRequest::decode(Route::Moderations, br#"{"input": "x"}"#).unwrap();
        assert_eq!(r.model(), Some(super::DEFAULT_MODERATION_MODEL));
        let err =
            LlmRequest::decode(Route::Moderations, br#"{"input": "x", "model": ""}"#).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("model"));
        let err = LlmRequest::decode(Route::Moderations, br#"{"input": []}"#).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("input"));
    }
}
