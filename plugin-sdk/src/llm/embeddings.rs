//! `POST /v1/embeddings` request body.

use serde::{Deserialize, Serialize};

use crate::error::GatewayError;

/// The most inputs one embeddings request may carry.
pub const MAX_INPUTS: usize = 2048;

/// The older embedding model the spec names, and the most tokens one of its inputs may hold.
pub const OLDER_MODEL: &str = "text-embedding-ada-002";
pub const OLDER_MODEL_MAX_TOKENS: usize = 8192;

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct EmbeddingsRequest {
    pub input: EmbeddingInput,
    #[serde(default)]
    pub model: Option<String>,
    /// `float` (default) or `base64`.
    #[serde(default)]
    pub encoding_format: Option<String>,
    #[serde(default)]
    pub dimensions: Option<i64>,
    #[serde(default)]
    pub user: Option<String>,
}

/// A string, a list of strings, a token array, or a list of token arrays.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum EmbeddingInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<i64>),
    TokenBatches(Vec<Vec<i64>>),
}

impl EmbeddingInput {
    /// How many embeddings the input asks for.
    pub fn len(&self) -> usize {
        match self {
            EmbeddingInput::Text(_) | EmbeddingInput::Tokens(_) => 1,
            EmbeddingInput::Texts(v) => v.len(),
            EmbeddingInput::TokenBatches(v) => v.len(),
        }
    }

    /// True when there is nothing to embed (an empty string, list or token array).
    pub fn is_empty(&self) -> bool {
        match self {
            EmbeddingInput::Text(t) => t.is_empty(),
            EmbeddingInput::Texts(v) => v.is_empty() || v.iter().any(String::is_empty),
            EmbeddingInput::Tokens(v) => v.is_empty(),
            EmbeddingInput::TokenBatches(v) => v.is_empty() || v.iter().any(Vec::is_empty),
        }
    }
}

impl EmbeddingsRequest {
    /// Checks the spec's limits: input not empty and at most 2048 items; dimensions >= 1.
    pub fn validate(&self) -> Result<(), GatewayError> {
        if self.input.is_empty() {
            return Err(GatewayError::invalid_param(
                "input",
                "input must not be empty",
            ));
        }
        if self.input.len() > MAX_INPUTS {
            return Err(GatewayError::invalid_param(
                "input",
                format!(
                    "input holds at most {MAX_INPUTS} items, got {}",
                    self.input.len()
                ),
            ));
        }
        // Token arrays are counted here, as decoded; text is counted with the model's
        // tokenizer by the gateway once the caller is authenticated (`gateway::tokens`).
        if self.model.as_deref() == Some(OLDER_MODEL) {
            let longest = match &self.input {
                EmbeddingInput::Tokens(t) => t.len(),
                EmbeddingInput::TokenBatches(b) => b.iter().map(Vec::len).max().unwrap_or(0),
                EmbeddingInput::Text(_) | EmbeddingInput::Texts(_) => 0,
            };
            if longest > OLDER_MODEL_MAX_TOKENS {
                return Err(GatewayError::invalid_param(
                    "input",
                    format!(
                        "an input of {OLDER_MODEL} holds at most {OLDER_MODEL_MAX_TOKENS} tokens, got {longest}"
                    ),
                ));
            }
        }
        if let Some(d) = self.dimensions {
            if d < 1 {
                return Err(GatewayError::invalid_param(
                    "dimensions",
                    format!("dimensions must be at least 1, got {d}"),
                ));
            }
        }
        // `float` and `base64` are OpenAI's; other providers add their own (`int8`, `binary`...),
        // so the name is the provider's to accept.
        if self
            .encoding_format
            .as_deref()
            .is_some_and(|f| f.trim().is_empty())
        {
            return Err(GatewayError::invalid_param(
                "encoding_format",
                "encoding_format must name a format (float, base64...), or be left out",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::context::Route;
    use crate::llm::LlmRequest;
    use serde_json::{json, Value};

    fn param_of(body: Value) -> Option<String> {
        LlmRequest::decode(Route::Embeddings, body.to_string().as_bytes())
            .err()
            .map(|e| e.param.unwrap_or_default())
    }

    #[test]
    fn embedding_limits() {
        assert_eq!(param_of(json!({"input": "hello", "model": "m"})), None);
        assert_eq!(param_of(json!({"input": ["a", "b"]})), None);
        assert_eq!(param_of(json!({"input": [1, 2, 3]})), None);
        assert_eq!(param_of(json!({"input": [[1, 2], [3]]})), None);
        assert_eq!(param_of(json!({"input": ""})).as_deref(), Some("input"));
        assert_eq!(param_of(json!({"input": []})).as_deref(), Some("input"));
        assert_eq!(
            param_of(json!({"input": ["a", ""]})).as_deref(),
            Some("input")
        );
        let many: Vec<String> = (0..2049).map(|i| i.to_string()).collect();
        assert_eq!(param_of(json!({"input": many})).as_deref(), Some("input"));
        let max: Vec<String> = (0..2048).map(|i| i.to_string()).collect();
        assert_eq!(param_of(json!({"input": max})), None);
        assert_eq!(
            param_of(json!({"input": "x", "dimensions": 0})).as_deref(),
            Some("dimensions")
        );
        assert_eq!(
            param_of(json!({"input": "x", "encoding_format": "int8"})),
            None
        );
        let at_most: Vec<i64> = vec![1; 8192];
        let over: Vec<i64> = vec![1; 8193];
        let ada = |input: Value| json!({"model": "text-embedding-ada-002", "input": input});
        assert_eq!(param_of(ada(json!(at_most))), None);
        assert_eq!(param_of(ada(json!(over))).as_deref(), Some("input"));
        assert_eq!(
            param_of(ada(json!([at_most, over]))).as_deref(),
            Some("input")
        );
        // Newer models are the provider's to bound.
        assert_eq!(
            param_of(json!({"model": "text-embedding-3-small", "input": over})),
            None
        );
        assert_eq!(
            param_of(json!({"input": "x", "encoding_format": ""})).as_deref(),
            Some("encoding_format")
        );
        assert_eq!(param_of(json!({"model": "m"})).as_deref(), Some("input"));
    }
}
