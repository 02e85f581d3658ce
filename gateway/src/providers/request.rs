//! Pieces of request encoding that several wire formats share, the counterpart of [`chunks`]
//! (which builds OpenAI's answers): merging consecutive turns of one role, reading image URLs
//! and data URLs, tool-call arguments as an object, the sampling fields under each format's
//! names, the texts of an embeddings request, and the JSON body itself.
//!
//! [`chunks`]: super::chunks

use bytes::Bytes;
use serde::Serialize;
use serde_json::{json, Map, Value};

use plugin_sdk::llm::chat::{ChatRequest, ContentPart, Message};
use plugin_sdk::llm::embeddings::EmbeddingInput;
use plugin_sdk::GatewayError;

/// Appends `items` to the conversation as a turn of `role`, merging them into the previous turn
/// when it has the same role (Anthropic, Gemini and Bedrock want user and assistant turns to
/// alternate). `key` names the list of a turn's items: `content`, or Gemini's `parts`. No items
/// add nothing.
pub(crate) fn push_turn(turns: &mut Vec<Value>, role: &str, key: &str, items: Vec<Value>) {
    if items.is_empty() {
        return;
    }
    if let Some(last) = turns.last_mut() {
        if last["role"] == role {
            if let Some(existing) = last[key].as_array_mut() {
                existing.extend(items);
                return;
            }
        }
    }
    turns.push(json!({"role": role, key: items}));
}

/// The URL of an `image_url` part: OpenAI's `{url, detail}`, or a bare string taken as the URL;
/// "" when there is none.
pub(crate) fn image_url(part: &ContentPart) -> &str {
    part.image_url
        .as_ref()
        .and_then(|v| v.get("url").or(Some(v)))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// The media type and base64 data of a `data:<type>;base64,<data>` URL, or `None` for any
/// other URL. A data URL that is not base64 is a 400 naming the part (`messages[i].content[j]`).
pub(crate) fn data_url(
    url: &str,
    i: usize,
    j: usize,
) -> Result<Option<(&str, &str)>, GatewayError> {
    let Some(rest) = url.strip_prefix("data:") else {
        return Ok(None);
    };
    rest.split_once(";base64,").map(Some).ok_or_else(|| {
        GatewayError::invalid_param(
            format!("messages[{i}].content[{j}].image_url"),
            "a data URL must be base64 (data:<type>;base64,<data>)",
        )
    })
}

/// A tool call's `arguments` (JSON text) as the object formats want; anything that is not a
/// JSON object becomes `{}`.
pub(crate) fn arguments_object(arguments: &str) -> Value {
    serde_json::from_str(arguments)
        .ok()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}))
}

/// The id of the tool call a `tool` (or legacy `function`) message answers: its `tool_call_id`,
/// else its `name`; a 400 naming `messages[i].tool_call_id` when it has neither.
pub(crate) fn answered_call_id(m: &Message, i: usize) -> Result<&str, GatewayError> {
    m.tool_call_id
        .as_deref()
        .or(m.name.as_deref())
        .ok_or_else(|| {
            GatewayError::invalid_param(
                format!("messages[{i}].tool_call_id"),
                "a tool message needs the tool_call_id of the call it answers",
            )
        })
}

/// An OpenAI sampling field that formats take under names of their own.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Sampling {
    /// `max_tokens`, else `max_completion_tokens`.
    MaxTokens,
    Temperature,
    TopP,
    /// `stop`, always as a list (see [`ChatRequest::stop_sequences`]); not sent when empty.
    Stop,
    N,
    Seed,
    PresencePenalty,
    FrequencyPenalty,
}

/// Puts each sampling field of `names` that the client set into `body`, under the format's name
/// for it. Fields a format does not list are not sent.
pub(crate) fn put_sampling(
    body: &mut Map<String, Value>,
    req: &ChatRequest,
    names: &[(Sampling, &str)],
) {
    for &(field, name) in names {
        let value = match field {
            Sampling::MaxTokens => req
                .max_tokens
                .or(req.max_completion_tokens)
                .map(|n| json!(n)),
            Sampling::Temperature => req.temperature.map(|t| json!(t)),
            Sampling::TopP => req.top_p.map(|p| json!(p)),
            Sampling::Stop => Some(req.stop_sequences())
                .filter(|s| !s.is_empty())
                .map(|s| json!(s)),
            Sampling::N => req.n.map(|n| json!(n)),
            Sampling::Seed => req.seed.map(|s| json!(s)),
            Sampling::PresencePenalty => req.presence_penalty.map(|p| json!(p)),
            Sampling::FrequencyPenalty => req.frequency_penalty.map(|p| json!(p)),
        };
        if let Some(value) = value {
            body.insert(name.to_owned(), value);
        }
    }
}

/// The texts of an embeddings request; token arrays are a 400 naming `input`, for formats that
/// embed text only.
pub(crate) fn embedding_texts<'a>(
    input: &'a EmbeddingInput,
    provider: &str,
) -> Result<Vec<&'a str>, GatewayError> {
    match input {
        EmbeddingInput::Text(t) => Ok(vec![t.as_str()]),
        EmbeddingInput::Texts(v) => Ok(v.iter().map(String::as_str).collect()),
        EmbeddingInput::Tokens(_) | EmbeddingInput::TokenBatches(_) => {
            Err(GatewayError::invalid_param(
                "input",
                format!(
                    "{provider} embeds text only: input must be a string or a list of strings, \
                     not token arrays"
                ),
            ))
        }
    }
}

/// A request body as JSON bytes; failing to write it is the gateway's own error (500).
pub(crate) fn json_body(body: &impl Serialize, provider: &str) -> Result<Bytes, GatewayError> {
    serde_json::to_vec(body)
        .map(Bytes::from)
        .map_err(|e| GatewayError::internal(format!("cannot encode the {provider} request: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::testing::chat;

    #[test]
    fn turns_of_one_role_merge_under_the_formats_key() {
        let mut turns = Vec::new();
        push_turn(&mut turns, "user", "parts", vec![json!({"text": "a"})]);
        push_turn(&mut turns, "user", "parts", vec![json!({"text": "b"})]);
        push_turn(&mut turns, "model", "parts", Vec::new());
        push_turn(&mut turns, "model", "parts", vec![json!({"text": "c"})]);
        assert_eq!(
            turns,
            [
                json!({"role": "user", "parts": [{"text": "a"}, {"text": "b"}]}),
                json!({"role": "model", "parts": [{"text": "c"}]}),
            ]
        );
    }

    #[test]
    fn data_urls_split_and_other_urls_pass() {
        assert_eq!(
            data_url("data:image/png;base64,AAAA", 0, 0).unwrap(),
            Some(("image/png", "AAAA"))
        );
        assert_eq!(data_url("https://x.test/a.png", 0, 0).unwrap(), None);
        let err = data_url("data:image/png,raw", 2, 1).unwrap_err();
        assert_eq!(err.status().as_u16(), 400);
        assert_eq!(
            err.param.as_deref(),
            Some("messages[2].content[1].image_url")
        );
    }

    #[test]
    fn sampling_fields_take_the_formats_names_and_only_when_set() {
        let names = [
            (Sampling::MaxTokens, "maxTokens"),
            (Sampling::TopP, "p"),
            (Sampling::Stop, "stopSequences"),
            (Sampling::Seed, "seed"),
        ];
        let mut body = Map::new();
        let req = chat(json!({"messages": [{"role": "user", "content": "x"}],
            "max_completion_tokens": 9, "top_p": 0.5, "stop": "END", "temperature": 1}));
        put_sampling(&mut body, &req, &names);
        assert_eq!(
            Value::Object(body),
            json!({"maxTokens": 9, "p": 0.5, "stopSequences": ["END"]})
        );
        let mut body = Map::new();
        let req = chat(json!({"messages": [{"role": "user", "content": "x"}],
            "max_tokens": 5, "max_completion_tokens": 9, "stop": []}));
        put_sampling(&mut body, &req, &names);
        assert_eq!(Value::Object(body), json!({"maxTokens": 5}));
    }
}
