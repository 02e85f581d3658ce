//! Token limits the spec sets in tokens: an input of the older embedding model
//! (`text-embedding-ada-002`) holds at most 8192 tokens of its tokenizer (cl100k_base).
//!
//! Runs after the pipeline's request phase (authentication and limits first: counting is the
//! one costly check), on the model the provider will get. Token arrays are counted in
//! `plugin_sdk::llm::embeddings` as they are decoded; here is text. A cl100k token is 1 to 128
//! bytes, so an input of at most 8192 bytes is within the limit and one over 1 MiB is over it,
//! both without counting; only the inputs between are tokenized.

use plugin_sdk::llm::embeddings::{
    EmbeddingInput, EmbeddingsRequest, OLDER_MODEL, OLDER_MODEL_MAX_TOKENS,
};
use plugin_sdk::llm::LlmRequest;
use plugin_sdk::GatewayError;

/// The longest cl100k_base token, in bytes.
const LONGEST_TOKEN_BYTES: usize = 128;

/// The 400 naming `input` when an input of the older embedding model holds more tokens than
/// the spec allows; anything else passes.
pub fn check(request: &LlmRequest) -> Result<(), GatewayError> {
    let LlmRequest::Embeddings(embeddings) = request else {
        return Ok(());
    };
    let EmbeddingsRequest { input, model, .. } = &**embeddings;
    if model.as_deref() != Some(OLDER_MODEL) {
        return Ok(());
    }
    let texts: &[String] = match input {
        EmbeddingInput::Text(t) => std::slice::from_ref(t),
        EmbeddingInput::Texts(list) => list,
        EmbeddingInput::Tokens(_) | EmbeddingInput::TokenBatches(_) => return Ok(()),
    };
    for (i, text) in texts.iter().enumerate() {
        let tokens = if text.len() <= OLDER_MODEL_MAX_TOKENS {
            continue;
        } else if text.len() > OLDER_MODEL_MAX_TOKENS * LONGEST_TOKEN_BYTES {
            None
        } else {
            Some(count(text))
        };
        if tokens.is_none_or(|n| n > OLDER_MODEL_MAX_TOKENS) {
            let which = match input {
                EmbeddingInput::Texts(_) => format!("input[{i}]"),
                _ => "input".to_owned(),
            };
            let got = tokens.map_or_else(
                || {
                    format!(
                        "{} bytes, more than any {OLDER_MODEL_MAX_TOKENS} tokens hold",
                        text.len()
                    )
                },
                |n| format!("{n} tokens"),
            );
            return Err(GatewayError::invalid_param(
                "input",
                format!(
                    "{which} of {OLDER_MODEL} holds at most {OLDER_MODEL_MAX_TOKENS} tokens, \
                     got {got}"
                ),
            ));
        }
    }
    Ok(())
}

/// How many cl100k_base tokens `text` is, as the provider counts it (special tokens as text).
fn count(text: &str) -> usize {
    tiktoken_rs::cl100k_base_singleton()
        .encode_ordinary(text)
        .len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use plugin_sdk::Route;
    use serde_json::json;

    fn check_body(body: serde_json::Value) -> Result<(), GatewayError> {
        check(&LlmRequest::decode(Route::Embeddings, body.to_string().as_bytes()).unwrap())
    }

    #[test]
    fn the_tokenizer_is_cl100k() {
        // Values tiktoken gives for cl100k_base.
        assert_eq!(count("hello world"), 2);
        assert_eq!(count("tiktoken is great!"), 6);
        assert_eq!(count(&" a".repeat(100)), 100);
        assert_eq!(
            count(&"a ".repeat(100)),
            101,
            "the trailing space is a token"
        );
    }

    #[test]
    fn ada_002_inputs_hold_at_most_8192_tokens() {
        // " a" is one token: 8192 of them are allowed, 8193 are not (16 KiB of text).
        let at_most = " a".repeat(OLDER_MODEL_MAX_TOKENS);
        let over = " a".repeat(OLDER_MODEL_MAX_TOKENS + 1);
        assert_eq!(count(&at_most), OLDER_MODEL_MAX_TOKENS);
        let ada = |input: serde_json::Value| json!({"model": OLDER_MODEL, "input": input});
        assert!(check_body(ada(json!(at_most))).is_ok());
        assert!(check_body(ada(json!(["short", at_most]))).is_ok());
        let e = check_body(ada(json!(over))).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("input"));
        assert!(e.message.contains("got 8193 tokens"), "{}", e.message);
        let e = check_body(ada(json!(["short", over]))).unwrap_err();
        assert!(e.message.starts_with("input[1] of"), "{}", e.message);
        // Longer than any 8192 tokens: refused without counting.
        let huge = "x".repeat(OLDER_MODEL_MAX_TOKENS * LONGEST_TOKEN_BYTES + 1);
        let e = check_body(ada(json!(huge))).unwrap_err();
        assert!(e.message.contains("bytes"), "{}", e.message);
        // Other models, and many bytes in few tokens, pass.
        let other = json!({"model": "text-embedding-3-small", "input": over});
        assert!(check_body(other).is_ok());
        assert!(check_body(ada(json!("a".repeat(20_000)))).is_ok());
    }
}
