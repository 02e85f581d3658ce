//! What a request may spend, guessed before it is sent: the reservation's size.
//!
//! Prompt tokens: the characters of the prompt's text divided by 4 (rounded up); images and
//! other binary parts count nothing. Completion tokens: `max_completion_tokens`, else
//! `max_tokens`, else the configured default, times `n`. Embeddings and moderations have no
//! completion. Passthrough requests (no decoded body) estimate to zero tokens.

use serde_json::Value;

use plugin_sdk::llm::chat::MessageContent;
use plugin_sdk::llm::embeddings::EmbeddingInput;
use plugin_sdk::llm::moderations::ModerationInput;
use plugin_sdk::llm::LlmRequest;
use plugin_sdk::Usage;

/// The usage a request is reserved for.
pub fn estimate(request: &LlmRequest, default_completion_tokens: u64) -> Usage {
    match request {
        LlmRequest::None => Usage::default(),
        LlmRequest::Chat(chat) => {
            let mut chars = 0usize;
            for m in &chat.messages {
                chars += match &m.content {
                    Some(MessageContent::Text(t)) => t.chars().count(),
                    Some(MessageContent::Parts(parts)) => parts
                        .iter()
                        .filter_map(|p| p.text.as_deref())
                        .map(|t| t.chars().count())
                        .sum(),
                    None => 0,
                };
                for call in m.tool_calls.iter().flatten() {
                    chars += call.function.name.chars().count()
                        + call.function.arguments.chars().count();
                }
            }
            let per_choice = chat
                .max_completion_tokens
                .or(chat.max_tokens)
                .unwrap_or(default_completion_tokens);
            let n = chat.n.unwrap_or(1).max(1) as u64;
            Usage {
                prompt_tokens: tokens_of(chars),
                completion_tokens: per_choice.saturating_mul(n),
            }
        }
        LlmRequest::Messages(m) => Usage {
            prompt_tokens: tokens_of(m.messages.iter().map(text_chars).sum()),
            completion_tokens: m.max_tokens,
        },
        LlmRequest::Embeddings(e) => Usage {
            prompt_tokens: match &e.input {
                EmbeddingInput::Text(t) => tokens_of(t.chars().count()),
                EmbeddingInput::Texts(v) => tokens_of(v.iter().map(|t| t.chars().count()).sum()),
                EmbeddingInput::Tokens(t) => t.len() as u64,
                EmbeddingInput::TokenBatches(b) => b.iter().map(|t| t.len() as u64).sum(),
            },
            completion_tokens: 0,
        },
        LlmRequest::Moderation(m) => Usage {
            prompt_tokens: match &m.input {
                ModerationInput::Text(t) => tokens_of(t.chars().count()),
                ModerationInput::Texts(v) => tokens_of(v.iter().map(|t| t.chars().count()).sum()),
            },
            completion_tokens: 0,
        },
    }
}

fn tokens_of(chars: usize) -> u64 {
    (chars as u64).div_ceil(4)
}

/// Characters of the text in an Anthropic message, skipping base64 payloads (`data`).
fn text_chars(v: &Value) -> usize {
    match v {
        Value::String(s) => s.chars().count(),
        Value::Array(items) => items.iter().map(text_chars).sum(),
        Value::Object(map) => map
            .iter()
            .filter(|(k, _)| !matches!(k.as_str(), "data" | "type" | "role" | "media_type"))
            .map(|(_, v)| text_chars(v))
            .sum(),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use plugin_sdk::Route;
    use serde_json::json;

    use super::*;

    fn decode(route: Route, body: Value) -> LlmRequest {
        LlmRequest::decode(route, body.to_string().as_bytes()).expect("valid body")
    }

    #[test]
    fn chat_counts_prompt_text_and_the_completion_cap() {
        let req = decode(
            Route::ChatCompletions,
            json!({"model": "m", "max_tokens": 100, "messages": [
                {"role": "system", "content": "12345678"},
                {"role": "user", "content": [
                    {"type": "text", "text": "abcd"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
                ]}
            ]}),
        );
        assert_eq!(
            estimate(&req, 1024),
            Usage {
                prompt_tokens: 3,
                completion_tokens: 100
            }
        );
        let req = decode(
            Route::ChatCompletions,
            json!({"model": "m", "max_tokens": 100, "max_completion_tokens": 7, "n": 3,
                   "messages": [{"role": "user", "content": "a"}]}),
        );
        assert_eq!(estimate(&req, 1024).completion_tokens, 21);
        assert_eq!(estimate(&req, 1024).prompt_tokens, 1);
        let req = decode(
            Route::ChatCompletions,
            json!({"model": "m", "messages": [{"role": "user", "content": ""}]}),
        );
        assert_eq!(
            estimate(&req, 55),
            Usage {
                prompt_tokens: 0,
                completion_tokens: 55
            }
        );
    }

    #[test]
    fn other_routes() {
        let req = decode(
            Route::Messages,
            json!({"model": "claude", "max_tokens": 9, "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "abcdefgh"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "QUFBQUFBQUFBQUFB"}}
                ]}
            ]}),
        );
        assert_eq!(
            estimate(&req, 1024),
            Usage {
                prompt_tokens: 2,
                completion_tokens: 9
            }
        );
        let req = decode(
            Route::Embeddings,
            json!({"model": "e", "input": ["abcd", "efgh"]}),
        );
        assert_eq!(
            estimate(&req, 1024),
            Usage {
                prompt_tokens: 2,
                completion_tokens: 0
            }
        );
        let req = decode(Route::Embeddings, json!({"model": "e", "input": [1, 2, 3]}));
        assert_eq!(estimate(&req, 1024).prompt_tokens, 3);
        assert_eq!(estimate(&LlmRequest::None, 1024), Usage::default());
    }
}
