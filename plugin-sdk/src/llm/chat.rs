//! `POST /v1/chat/completions` request body.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::check_range;
use crate::error::GatewayError;

/// Roles a chat message may have.
pub const ROLES: &[&str] = &[
    "system",
    "developer",
    "user",
    "assistant",
    "tool",
    "function",
];

/// The chat completion request, as the spec lists its fields.
#[derive(Debug, Clone, Deserialize, Serialize, Default)]
pub struct ChatRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub messages: Vec<Message>,
    #[serde(default)]
    pub frequency_penalty: Option<f64>,
    #[serde(default)]
    pub presence_penalty: Option<f64>,
    #[serde(default)]
    pub logit_bias: Option<BTreeMap<String, f64>>,
    #[serde(default)]
    pub logprobs: Option<bool>,
    #[serde(default)]
    pub top_logprobs: Option<i64>,
    #[serde(default)]
    pub max_tokens: Option<u64>,
    #[serde(default)]
    pub max_completion_tokens: Option<u64>,
    #[serde(default)]
    pub n: Option<i64>,
    #[serde(default)]
    pub response_format: Option<Value>,
    /// Any 64-bit signed integer.
    #[serde(default)]
    pub seed: Option<i64>,
    #[serde(default)]
    pub stop: Option<Stop>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub thinking: Option<Value>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub tools: Option<Vec<Tool>>,
    #[serde(default)]
    pub tool_choice: Option<ToolChoice>,
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    #[serde(default)]
    pub user: Option<String>,
    /// Deprecated in favour of `tool_choice`.
    #[serde(default)]
    pub function_call: Option<Value>,
    /// Deprecated in favour of `tools`.
    #[serde(default)]
    pub functions: Option<Vec<Value>>,
}

/// One chat message.
#[derive(Debug, Clone, Deserialize, Serialize, Default)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Option<MessageContent>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub tool_calls: Option<Vec<ToolCall>>,
    #[serde(default)]
    pub tool_call_id: Option<String>,
    #[serde(default)]
    pub function_call: Option<Value>,
}

/// Message content: plain text, or a list of typed parts (text, images...).
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

// By hand rather than `#[serde(untagged)]`: untagged enums buffer every value before trying
// the variants, and every message of every request has content.
impl<'de> Deserialize<'de> for MessageContent {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ContentVisitor;

        impl<'de> serde::de::Visitor<'de> for ContentVisitor {
            type Value = MessageContent;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string or a list of content parts")
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<MessageContent, E> {
                Ok(MessageContent::Text(v.to_owned()))
            }

            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<MessageContent, E> {
                Ok(MessageContent::Text(v))
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                seq: A,
            ) -> Result<MessageContent, A::Error> {
                Vec::<ContentPart>::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))
                    .map(MessageContent::Parts)
            }
        }

        deserializer.deserialize_any(ContentVisitor)
    }
}

impl MessageContent {
    /// The text of the content, parts joined with nothing between them.
    pub fn text(&self) -> String {
        match self {
            MessageContent::Text(t) => t.clone(),
            MessageContent::Parts(parts) => {
                parts.iter().filter_map(|p| p.text.as_deref()).collect()
            }
        }
    }
}

/// One part of a multi-part message.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_url: Option<Value>,
}

/// A tool call made by the assistant in an earlier turn.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct ToolCall {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    pub function: FunctionCall,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct FunctionCall {
    pub name: String,
    #[serde(default)]
    pub arguments: String,
}

/// A tool the model may call. Only functions exist.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Tool {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionDefinition,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct FunctionDefinition {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub parameters: Option<Value>,
    #[serde(default)]
    pub strict: Option<bool>,
}

/// `tool_choice`: `none`, `auto`, `required`, or a named function.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum ToolChoice {
    Mode(String),
    Named(NamedToolChoice),
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct NamedToolChoice {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: NamedFunction,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct NamedFunction {
    pub name: String,
}

/// `stop`: one sequence or a list of up to four.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Clone, Deserialize, Serialize, Default)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

impl ChatRequest {
    /// Checks the spec's limits; the error names the first offending field.
    pub fn validate(&self) -> Result<(), GatewayError> {
        if self.messages.is_empty() {
            return Err(GatewayError::invalid_param(
                "messages",
                "messages must contain at least 1 message",
            ));
        }
        for (i, m) in self.messages.iter().enumerate() {
            if !ROLES.contains(&m.role.as_str()) {
                return Err(GatewayError::invalid_param(
                    format!("messages[{i}].role"),
                    format!(
                        "messages[{i}].role must be one of {}, got {:?}",
                        ROLES.join(", "),
                        m.role
                    ),
                ));
            }
        }
        check_range("n", self.n, 1, 128)?;
        check_range("temperature", self.temperature, 0.0, 2.0)?;
        check_range("top_p", self.top_p, 0.0, 1.0)?;
        check_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)?;
        check_range("presence_penalty", self.presence_penalty, -2.0, 2.0)?;
        for (token, bias) in self.logit_bias.iter().flatten() {
            check_range(&format!("logit_bias.{token}"), Some(*bias), -100.0, 100.0)?;
        }
        check_range("top_logprobs", self.top_logprobs, 0, 20)?;
        if self.top_logprobs.is_some() && self.logprobs != Some(true) {
            return Err(GatewayError::invalid_param(
                "top_logprobs",
                "top_logprobs requires logprobs to be true",
            ));
        }
        if let Some(Stop::Many(stops)) = &self.stop {
            if stops.len() > 4 {
                return Err(GatewayError::invalid_param(
                    "stop",
                    format!("stop takes up to 4 sequences, got {}", stops.len()),
                ));
            }
        }
        if let Some(tools) = &self.tools {
            if tools.len() > 128 {
                return Err(GatewayError::invalid_param(
                    "tools",
                    format!("tools takes at most 128 functions, got {}", tools.len()),
                ));
            }
            if let Some(i) = tools.iter().position(|t| t.kind != "function") {
                return Err(GatewayError::invalid_param(
                    format!("tools[{i}].type"),
                    "only tools of type function are supported",
                ));
            }
        }
        if let Some(functions) = &self.functions {
            if functions.is_empty() || functions.len() > 128 {
                return Err(GatewayError::invalid_param(
                    "functions",
                    format!("functions takes 1 to 128 items, got {}", functions.len()),
                ));
            }
        }
        match &self.tool_choice {
            Some(ToolChoice::Mode(mode))
                if !["none", "auto", "required"].contains(&mode.as_str()) =>
            {
                return Err(GatewayError::invalid_param(
                    "tool_choice",
                    format!("tool_choice must be none, auto, required or a function, got {mode:?}"),
                ));
            }
            Some(ToolChoice::Named(named)) if named.kind != "function" => {
                return Err(GatewayError::invalid_param(
                    "tool_choice.type",
                    "tool_choice.type must be function",
                ));
            }
            _ => {}
        }
        if self.stream_options.is_some() && self.stream != Some(true) {
            return Err(GatewayError::invalid_param(
                "stream_options",
                "stream_options is only allowed when stream is true",
            ));
        }
        Ok(())
    }

    /// The stop sequences as one list, empty when `stop` is absent: a `stop` of one string is a
    /// list of one. Codecs whose formats take only lists read `stop` through this.
    pub fn stop_sequences(&self) -> Vec<&str> {
        match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.as_str()],
            Some(Stop::Many(v)) => v.iter().map(String::as_str).collect(),
        }
    }

    /// Whether the client asked for a usage chunk at the end of a stream.
    pub fn wants_stream_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::Route;
    use crate::llm::LlmRequest;
    use serde_json::json;

    fn check(body: Value) -> Result<(), GatewayError> {
        LlmRequest::decode(Route::ChatCompletions, body.to_string().as_bytes()).map(|_| ())
    }

    fn param_of(body: Value) -> String {
        check(body).unwrap_err().param.unwrap_or_default()
    }

    fn with(field: &str, value: Value) -> Value {
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        body[field] = value;
        body
    }

    #[test]
    fn a_plain_request_is_valid() {
        check(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})).unwrap();
        check(with("n", json!(128))).unwrap();
        check(with("temperature", json!(2))).unwrap();
        check(with("seed", json!(i64::MIN))).unwrap();
        check(with("stop", json!(["a", "b", "c", "d"]))).unwrap();
        check(json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]}))
            .unwrap();
        check(json!({"messages": [{"role": "assistant", "content": null}]})).unwrap();
    }

    #[test]
    fn content_is_text_or_parts_and_nothing_else() {
        let body = json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "http://x"}}, {"type": "text", "text": "b"}
        ]}]});
        let LlmRequest::Chat(chat) =
            LlmRequest::decode(Route::ChatCompletions, body.to_string().as_bytes()).unwrap()
        else {
            panic!()
        };
        assert_eq!(chat.messages[0].content.as_ref().unwrap().text(), "ab");
        assert_eq!(
            param_of(json!({"messages": [{"role": "user", "content": 7}]})),
            "messages[0].content"
        );
        assert_eq!(
            param_of(json!({"messages": [{"role": "user", "content": [{"text": "no type"}]}]})),
            "messages[0].content[0].type"
        );
    }

    #[test]
    fn each_limit_is_enforced_and_named() {
        assert_eq!(param_of(json!({"model": "m", "messages": []})), "messages");
        assert_eq!(param_of(with("n", json!(0))), "n");
        assert_eq!(param_of(with("n", json!(129))), "n");
        assert_eq!(param_of(with("temperature", json!(2.01))), "temperature");
        assert_eq!(param_of(with("temperature", json!(-0.1))), "temperature");
        assert_eq!(param_of(with("top_p", json!(1.5))), "top_p");
        assert_eq!(
            param_of(with("frequency_penalty", json!(-2.5))),
            "frequency_penalty"
        );
        assert_eq!(
            param_of(with("presence_penalty", json!(2.5))),
            "presence_penalty"
        );
        assert_eq!(
            param_of(with("logit_bias", json!({"50256": 101}))),
            "logit_bias.50256"
        );
        assert_eq!(param_of(with("top_logprobs", json!(5))), "top_logprobs");
        let mut body = with("top_logprobs", json!(21));
        body["logprobs"] = json!(true);
        assert_eq!(param_of(body), "top_logprobs");
        assert_eq!(
            param_of(with("stop", json!(["a", "b", "c", "d", "e"]))),
            "stop"
        );
        let tools: Vec<Value> = (0..129)
            .map(|i| json!({"type": "function", "function": {"name": format!("f{i}")}}))
            .collect();
        assert_eq!(param_of(with("tools", json!(tools))), "tools");
        assert_eq!(param_of(with("functions", json!([]))), "functions");
        let functions: Vec<Value> = (0..129).map(|i| json!({"name": format!("f{i}")})).collect();
        assert_eq!(param_of(with("functions", json!(functions))), "functions");
        assert_eq!(param_of(with("seed", json!(1e20))), "seed");
        assert_eq!(param_of(with("seed", json!(1.5))), "seed");
        assert_eq!(
            param_of(with("tool_choice", json!("sometimes"))),
            "tool_choice"
        );
        assert_eq!(
            param_of(with("stream_options", json!({"include_usage": true}))),
            "stream_options"
        );
        assert_eq!(
            param_of(json!({"messages": [{"role": "robot", "content": "x"}]})),
            "messages[0].role"
        );
        assert_eq!(param_of(with("temperature", json!("hot"))), "temperature");
    }

    #[test]
    fn stop_is_read_as_a_list() {
        let stops = |stop: Value| {
            let LlmRequest::Chat(chat) = LlmRequest::decode(
                Route::ChatCompletions,
                with("stop", stop).to_string().as_bytes(),
            )
            .unwrap() else {
                panic!()
            };
            chat.stop_sequences().join("|")
        };
        assert_eq!(stops(json!("END")), "END");
        assert_eq!(stops(json!(["a", "b"])), "a|b");
        assert_eq!(stops(json!([])), "");
        assert_eq!(stops(json!(null)), "");
    }

    #[test]
    fn top_logprobs_with_logprobs_is_valid() {
        let mut body = with("top_logprobs", json!(20));
        body["logprobs"] = json!(true);
        check(body).unwrap();
    }
}
