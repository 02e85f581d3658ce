//! Anthropic Messages API: requests encoded from the canonical (OpenAI) chat request, answers
//! and event streams decoded back into OpenAI's shapes.
//!
//! Mapping: system and developer messages become the top-level `system`; tool calls become
//! `tool_use` blocks and tool messages `tool_result` blocks in a user turn; images become image
//! blocks; `max_tokens` defaults to [`DEFAULT_MAX_TOKENS`]; `stop` becomes `stop_sequences`.
//! Finish reasons: `end_turn`/`stop_sequence` -> `stop`, `max_tokens` -> `length`,
//! `tool_use` -> `tool_calls`.

use bytes::Bytes;
use serde_json::{json, Map, Value};

use plugin_sdk::llm::chat::{ChatRequest, ContentPart, MessageContent, ToolChoice};
use plugin_sdk::llm::LlmRequest;
use plugin_sdk::{GatewayError, Usage};

use super::chunks::{self, ChunkWriter};
use super::request::{self, push_turn, Sampling};
use super::{
    CallInfo, Decoded, Encoded, EventTranslator, Outgoing, SseDecoder, StreamDecoder, WireFormat,
};

/// `max_tokens` when the client set none (Anthropic requires it).
pub const DEFAULT_MAX_TOKENS: u64 = 4096;
/// `anthropic-version` when the client sent none.
pub const DEFAULT_VERSION: &str = "2023-06-01";

/// The sampling fields Anthropic takes, under its names (`max_tokens` has a default, apart).
const SAMPLING: &[(Sampling, &str)] = &[
    (Sampling::Temperature, "temperature"),
    (Sampling::TopP, "top_p"),
    (Sampling::Stop, "stop_sequences"),
];

/// The Messages API request for a chat request.
pub fn encode_chat(req: &ChatRequest, model: Option<&str>) -> Result<Bytes, GatewayError> {
    let mut system = Vec::new();
    let mut messages: Vec<Value> = Vec::new();
    for (i, m) in req.messages.iter().enumerate() {
        match m.role.as_str() {
            "system" | "developer" => {
                if let Some(c) = &m.content {
                    system.push(c.text());
                }
            }
            "user" => push_turn(
                &mut messages,
                "user",
                "content",
                content_blocks(m.content.as_ref(), i)?,
            ),
            "assistant" => {
                let mut blocks = content_blocks(m.content.as_ref(), i)?;
                for call in m.tool_calls.iter().flatten() {
                    blocks.push(json!({
                        "type": "tool_use",
                        "id": call.id.clone().unwrap_or_else(|| format!("toolu_{i}")),
                        "name": call.function.name,
                        "input": request::arguments_object(&call.function.arguments),
                    }));
                }
                push_turn(&mut messages, "assistant", "content", blocks);
            }
            "tool" | "function" => {
                let result = json!({
                    "type": "tool_result",
                    "tool_use_id": m.tool_call_id.clone().or_else(|| m.name.clone()).unwrap_or_default(),
                    "content": m.content.as_ref().map(MessageContent::text).unwrap_or_default(),
                });
                push_turn(&mut messages, "user", "content", vec![result]);
            }
            other => {
                return Err(GatewayError::invalid_param(
                    format!("messages[{i}].role"),
                    format!("anthropic does not take messages with the role {other:?}"),
                ))
            }
        }
    }
    let mut body = Map::new();
    body.insert(
        "model".into(),
        json!(model.or(req.model.as_deref()).unwrap_or_default()),
    );
    body.insert(
        "max_tokens".into(),
        json!(req
            .max_tokens
            .or(req.max_completion_tokens)
            .unwrap_or(DEFAULT_MAX_TOKENS)),
    );
    if !system.is_empty() {
        body.insert("system".into(), json!(system.join("\n")));
    }
    body.insert("messages".into(), Value::Array(messages));
    request::put_sampling(&mut body, req, SAMPLING);
    if req.stream == Some(true) {
        body.insert("stream".into(), json!(true));
    }
    if let Some(tools) = &req.tools {
        let tools: Vec<Value> = tools
            .iter()
            .map(|t| {
                json!({
                    "name": t.function.name,
                    "description": t.function.description,
                    "input_schema": t.function.parameters.clone().unwrap_or_else(|| json!({"type": "object"})),
                })
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    if let Some(choice) = &req.tool_choice {
        let mapped = match choice {
            ToolChoice::Mode(m) if m == "required" => json!({"type": "any"}),
            ToolChoice::Mode(m) if m == "none" => json!({"type": "none"}),
            ToolChoice::Mode(_) => json!({"type": "auto"}),
            ToolChoice::Named(n) => json!({"type": "tool", "name": n.function.name}),
        };
        body.insert("tool_choice".into(), mapped);
    }
    if let Some(thinking) = &req.thinking {
        body.insert("thinking".into(), thinking.clone());
    }
    if let Some(user) = &req.user {
        body.insert("metadata".into(), json!({"user_id": user}));
    }
    request::json_body(&body, "anthropic")
}

/// The Messages API body for a cloud that hosts Anthropic's models (Vertex AI's `rawPredict`,
/// Bedrock's `invoke`): the model is named in the URL, not the body, and `anthropic_version`
/// (`vertex-2023-10-16`, `bedrock-2023-05-31`) moves into the body.
pub fn encode_for_cloud(req: &ChatRequest, anthropic_version: &str) -> Result<Bytes, GatewayError> {
    let body = encode_chat(req, None)?;
    let mut value: Map<String, Value> = serde_json::from_slice(&body)
        .map_err(|e| GatewayError::internal(format!("cannot re-read the anthropic body: {e}")))?;
    value.remove("model");
    value.insert("anthropic_version".into(), json!(anthropic_version));
    request::json_body(&value, "anthropic")
}

fn content_blocks(content: Option<&MessageContent>, i: usize) -> Result<Vec<Value>, GatewayError> {
    match content {
        None => Ok(Vec::new()),
        Some(MessageContent::Text(t)) if t.is_empty() => Ok(Vec::new()),
        Some(MessageContent::Text(t)) => Ok(vec![json!({"type": "text", "text": t})]),
        Some(MessageContent::Parts(parts)) => parts
            .iter()
            .enumerate()
            .map(|(j, p)| part_block(p, i, j))
            .collect(),
    }
}

fn part_block(part: &ContentPart, i: usize, j: usize) -> Result<Value, GatewayError> {
    match part.kind.as_str() {
        "text" => Ok(json!({"type": "text", "text": part.text.clone().unwrap_or_default()})),
        "image_url" => {
            let url = request::image_url(part);
            let source = match request::data_url(url, i, j)? {
                Some((media_type, data)) => {
                    json!({"type": "base64", "media_type": media_type, "data": data})
                }
                None => json!({"type": "url", "url": url}),
            };
            Ok(json!({"type": "image", "source": source}))
        }
        other => Err(GatewayError::invalid_param(
            format!("messages[{i}].content[{j}].type"),
            format!("anthropic does not take content parts of type {other:?}"),
        )),
    }
}

fn finish_reason(stop_reason: Option<&str>) -> &str {
    match stop_reason {
        Some("end_turn" | "stop_sequence") | None => "stop",
        Some("max_tokens") => "length",
        Some("tool_use") => "tool_calls",
        Some("refusal") => "content_filter",
        Some(other) => other,
    }
}

fn usage_of(v: &Value) -> Usage {
    Usage {
        prompt_tokens: v["input_tokens"].as_u64().unwrap_or(0)
            + v["cache_creation_input_tokens"].as_u64().unwrap_or(0)
            + v["cache_read_input_tokens"].as_u64().unwrap_or(0),
        completion_tokens: v["output_tokens"].as_u64().unwrap_or(0),
    }
}

/// Encodes a chat request for Anthropic's Messages API (`POST /messages`).
pub fn encode(out: &Outgoing<'_>) -> Result<Encoded, GatewayError> {
    let LlmRequest::Chat(chat) = out.request else {
        return Err(GatewayError::invalid(format!(
            "{} serves chat completions only, not {}",
            out.spec.id,
            out.route.as_str()
        )));
    };
    let mut encoded = Encoded::new(encode_chat(chat, None)?, "/messages", WireFormat::Anthropic);
    encoded
        .headers
        .push(("anthropic-version", DEFAULT_VERSION.to_owned()));
    Ok(encoded)
}

/// `anthropic_version` in the body of Anthropic's models on Vertex AI.
pub const VERTEX_VERSION: &str = "vertex-2023-10-16";
/// `anthropic_version` in the body of Anthropic's models on Bedrock.
pub const BEDROCK_VERSION: &str = "bedrock-2023-05-31";

/// Encodes a `POST /v1/messages` request (the client speaks Anthropic's format) for the clouds
/// that host Anthropic's models: Anthropic itself gets the client's bytes; Vertex AI
/// (`rawPredict`) and Bedrock (`invoke`) get the body with the model moved into the URL and
/// their `anthropic_version` in the body. The answer goes back in Anthropic's format.
pub fn encode_ingress(out: &Outgoing<'_>) -> Result<Encoded, GatewayError> {
    let stream = out.stream();
    match out.spec.id {
        "anthropic" => {
            let mut encoded = Encoded::new(out.raw.clone(), "/messages", WireFormat::Anthropic);
            encoded
                .headers
                .push(("anthropic-version", DEFAULT_VERSION.to_owned()));
            Ok(encoded)
        }
        "vertex-ai" => {
            let location = super::vertex_location(out.target)?;
            let body = for_cloud(out.raw, VERTEX_VERSION, &["model"])?;
            let model = super::openai::path_segment(out.model());
            let path = vertex_path(&location, &model, stream);
            Ok(Encoded::new(body, path, WireFormat::Anthropic))
        }
        "bedrock" => {
            // Bedrock streams by operation (`invoke-with-response-stream`) and refuses the field.
            let body = for_cloud(out.raw, BEDROCK_VERSION, &["model", "stream"])?;
            let action = if stream {
                "invoke-with-response-stream"
            } else {
                "invoke"
            };
            let path = format!(
                "/model/{}/{action}",
                super::openai::path_segment(out.model())
            );
            Ok(Encoded::new(body, path, WireFormat::Bedrock))
        }
        other => Err(GatewayError::invalid_param(
            "x-gw-provider",
            format!(
                "/v1/messages speaks Anthropic's format, which anthropic, vertex-ai and bedrock \
                 serve; {other} does not (use /v1/chat/completions)"
            ),
        )),
    }
}

/// The Vertex AI path of one of Anthropic's models: `rawPredict`, or `streamRawPredict` for a
/// stream, under a location path from [`super::vertex_location`]. `model` must already be safe
/// as one path segment.
pub fn vertex_path(location: &str, model: &str, stream: bool) -> String {
    let action = if stream {
        "streamRawPredict"
    } else {
        "rawPredict"
    };
    format!("{location}/publishers/anthropic/models/{model}:{action}")
}

/// A client's Messages body for a cloud: without the fields the cloud takes elsewhere, with the
/// cloud's `anthropic_version`.
fn for_cloud(
    raw: &Bytes,
    anthropic_version: &str,
    removed: &[&str],
) -> Result<Bytes, GatewayError> {
    let mut value: Map<String, Value> = serde_json::from_slice(raw)
        .map_err(|e| GatewayError::invalid(format!("request body is not a JSON object: {e}")))?;
    for field in removed {
        value.remove(*field);
    }
    value
        .entry("anthropic_version")
        .or_insert_with(|| json!(anthropic_version));
    request::json_body(&value, "anthropic")
}

/// The model and usage of a Messages API answer or stream event, for logs and metrics.
pub fn summarize(body: &[u8]) -> (Option<String>, Option<Usage>) {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return (None, None);
    };
    let (message, usage) = match v["type"].as_str() {
        Some("message_start") => (&v["message"], &v["message"]["usage"]),
        _ => (&v, &v["usage"]),
    };
    let model = message["model"].as_str().map(str::to_owned);
    let usage = usage.is_object().then(|| usage_of(usage));
    (model, usage)
}

/// Decodes a whole Messages API answer.
pub fn decode(call: &CallInfo, body: &[u8]) -> Result<Decoded, GatewayError> {
    let (body, usage, model) = decode_chat(call.provider, body, call.strict)?;
    Ok(Decoded {
        provisioned: false,
        body,
        model: Some(model).filter(|m| !m.is_empty()),
        usage: Some(usage),
    })
}

/// The translator of a Messages API event stream.
pub fn stream(call: &CallInfo) -> Box<dyn StreamDecoder> {
    Box::new(SseDecoder::new(StreamTranslator::new(
        call.provider,
        call.include_usage,
        call.strict,
    )))
}

/// An answer in OpenAI's chat.completion shape, with its usage and model. `content_blocks`
/// (thinking and text) is added unless `strict` OpenAI compliance was asked for.
pub fn decode_chat(
    provider: &str,
    body: &[u8],
    strict: bool,
) -> Result<(Bytes, Usage, String), GatewayError> {
    let msg: Value = serde_json::from_slice(body).map_err(|e| chunks::bad_answer(provider, e))?;
    let blocks = msg["content"]
        .as_array()
        .ok_or_else(|| chunks::bad_answer(provider, "a message without a content list"))?;
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    let mut content_blocks = Vec::new();
    for block in blocks {
        match block["type"].as_str() {
            Some("text") => {
                let t = block["text"].as_str().unwrap_or_default();
                text.push_str(t);
                content_blocks.push(json!({"type": "text", "text": t}));
            }
            Some("tool_use") => tool_calls.push(chunks::tool_call(
                block["id"].as_str().unwrap_or_default(),
                block["name"].as_str().unwrap_or_default(),
                block["input"].to_string(),
            )),
            Some("thinking") => content_blocks.push(json!({
                "type": "thinking", "thinking": block["thinking"], "signature": block["signature"],
            })),
            _ => {}
        }
    }
    let usage = usage_of(&msg["usage"]);
    let mut message = chunks::assistant_message(text, tool_calls);
    if !strict && content_blocks.iter().any(|b| b["type"] == "thinking") {
        message["content_blocks"] = Value::Array(content_blocks);
    }
    let model = msg["model"].as_str().unwrap_or_default().to_owned();
    let body = chunks::completion(
        msg["id"].as_str().unwrap_or_default(),
        &model,
        message,
        json!(finish_reason(msg["stop_reason"].as_str())),
        usage,
    );
    Ok((body, usage, model))
}

/// Translates Anthropic's event stream into OpenAI chunks, one event at a time.
#[derive(Debug)]
pub struct StreamTranslator {
    provider: &'static str,
    out: ChunkWriter,
    /// Anthropic block index -> OpenAI tool call index, for tool_use blocks.
    tool_index: Vec<(u64, usize)>,
    usage: Usage,
    finish: Option<String>,
    strict: bool,
}

impl StreamTranslator {
    pub fn new(provider: &'static str, include_usage: bool, strict: bool) -> Self {
        StreamTranslator {
            provider,
            out: ChunkWriter::new("", "", include_usage),
            tool_index: Vec::new(),
            usage: Usage::default(),
            finish: None,
            strict,
        }
    }

    /// Whether the stream has ended (`message_stop` or an error).
    pub fn is_done(&self) -> bool {
        self.out.ended()
    }
}

impl EventTranslator for StreamTranslator {
    fn event(&mut self, data: &[u8], out: &mut String) {
        let Ok(event) = serde_json::from_slice::<Value>(data) else {
            return;
        };
        match event["type"].as_str() {
            Some("message_start") => {
                let m = &event["message"];
                self.out.id = m["id"].as_str().unwrap_or_default().to_owned();
                self.out.model = m["model"].as_str().unwrap_or_default().to_owned();
                self.usage = usage_of(&m["usage"]);
                self.out.role(out);
            }
            Some("content_block_start") if event["content_block"]["type"] == "tool_use" => {
                let block = &event["content_block"];
                let index = self.tool_index.len();
                self.tool_index
                    .push((event["index"].as_u64().unwrap_or(0), index));
                self.out.tool_start(
                    index,
                    block["id"].as_str().unwrap_or_default(),
                    block["name"].as_str().unwrap_or_default(),
                    out,
                );
            }
            Some("content_block_delta") => {
                let delta = &event["delta"];
                match delta["type"].as_str() {
                    Some("text_delta") => self.out.text(delta["text"].as_str().unwrap_or_default(), out),
                    Some("input_json_delta") => {
                        let block = event["index"].as_u64().unwrap_or(0);
                        let index = self
                            .tool_index
                            .iter()
                            .find(|(b, _)| *b == block)
                            .map_or(0, |(_, i)| *i);
                        self.out.tool_arguments(
                            index,
                            delta["partial_json"].as_str().unwrap_or_default(),
                            out,
                        );
                    }
                    Some("thinking_delta") if !self.strict => self.out.delta(
                        json!({"content_blocks": [{"index": event["index"], "delta": {"thinking": delta["thinking"]}}]}),
                        out,
                    ),
                    _ => {}
                }
            }
            Some("message_delta") => {
                if let Some(n) = event["usage"]["output_tokens"].as_u64() {
                    self.usage.completion_tokens = n;
                }
                self.finish =
                    Some(finish_reason(event["delta"]["stop_reason"].as_str()).to_owned());
            }
            Some("message_stop") => {
                let finish = self.finish.take().unwrap_or_else(|| "stop".to_owned());
                self.out.end(&finish, self.usage, out);
            }
            Some("error") => {
                let message = event["error"]["message"].as_str().unwrap_or("stream error");
                let kind = event["error"]["type"].as_str();
                self.out.error(self.provider, message, kind, out);
            }
            _ => {}
        }
    }

    fn end(&mut self, out: &mut String) {
        // A stream that stops without message_stop was cut short: say so rather than finish.
        self.out.error(
            self.provider,
            "the stream ended before the message was complete",
            Some("api_error"),
            out,
        );
    }

    fn usage(&self) -> Option<Usage> {
        Some(self.usage)
    }

    fn model(&self) -> Option<&str> {
        self.out.known_model()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::testing::chat;

    #[test]
    fn requests_lift_system_map_tools_and_merge_turns() {
        let req = chat(json!({
            "model": "claude-x", "stop": "END", "temperature": 0.3, "user": "u1",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "look"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get", "arguments": "{\"q\":1}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "42"},
                {"role": "user", "content": "thanks"}
            ],
            "tools": [{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}],
            "tool_choice": "required"
        }));
        let body: Value = serde_json::from_slice(&encode_chat(&req, None).unwrap()).unwrap();
        assert_eq!(body["system"], "be brief");
        assert_eq!(body["max_tokens"], DEFAULT_MAX_TOKENS);
        assert_eq!(body["stop_sequences"], json!(["END"]));
        assert_eq!(body["metadata"]["user_id"], "u1");
        assert_eq!(body["tool_choice"], json!({"type": "any"}));
        assert_eq!(body["tools"][0]["input_schema"], json!({"type": "object"}));
        let msgs = body["messages"].as_array().unwrap();
        assert_eq!(msgs.len(), 3, "{msgs:?}");
        assert_eq!(
            msgs[0]["content"][1]["source"],
            json!({"type": "base64", "media_type": "image/png", "data": "AAAA"})
        );
        assert_eq!(
            msgs[1]["content"][0],
            json!({"type": "tool_use", "id": "call_1", "name": "get", "input": {"q": 1}})
        );
        // The tool result and the next user text share one user turn.
        assert_eq!(msgs[2]["content"][0]["type"], "tool_result");
        assert_eq!(msgs[2]["content"][0]["tool_use_id"], "call_1");
        assert_eq!(
            msgs[2]["content"][1],
            json!({"type": "text", "text": "thanks"})
        );
        assert!(body.get("n").is_none() && body.get("stop").is_none());
        let req = chat(json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 7}));
        let body: Value = serde_json::from_slice(&encode_chat(&req, Some("m2")).unwrap()).unwrap();
        assert_eq!(
            (body["model"].as_str(), body["max_tokens"].as_u64()),
            (Some("m2"), Some(7))
        );
    }

    #[test]
    fn answers_map_content_tools_finish_reasons_and_usage() {
        let answer = json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
            "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"},
                        {"type": "text", "text": "calling"},
                        {"type": "tool_use", "id": "toolu_1", "name": "get", "input": {"q": 1}}],
            "stop_reason": "tool_use", "usage": {"input_tokens": 10, "output_tokens": 4}});
        let (body, usage, model) =
            decode_chat("anthropic", answer.to_string().as_bytes(), false).unwrap();
        assert_eq!(model, "claude-x");
        let out: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            usage,
            Usage {
                prompt_tokens: 10,
                completion_tokens: 4
            }
        );
        let c = &out["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls");
        assert_eq!(c["message"]["content"], "calling");
        assert_eq!(
            c["message"]["tool_calls"][0]["function"]["arguments"],
            "{\"q\":1}"
        );
        assert_eq!(c["message"]["content_blocks"][0]["type"], "thinking");
        assert_eq!(out["usage"]["total_tokens"], 14);
        let (strict, _, _) = decode_chat("anthropic", answer.to_string().as_bytes(), true).unwrap();
        let strict: Value = serde_json::from_slice(&strict).unwrap();
        assert!(strict["choices"][0]["message"]
            .get("content_blocks")
            .is_none());
        for (reason, want) in [
            ("end_turn", "stop"),
            ("stop_sequence", "stop"),
            ("max_tokens", "length"),
        ] {
            let a = json!({"id": "m", "model": "x", "content": [{"type": "text", "text": "t"}], "stop_reason": reason, "usage": {}});
            let (b, _, _) = decode_chat("anthropic", a.to_string().as_bytes(), false).unwrap();
            assert_eq!(
                serde_json::from_slice::<Value>(&b).unwrap()["choices"][0]["finish_reason"],
                want
            );
        }
        let err = decode_chat("anthropic", b"<html>", false).unwrap_err();
        assert_eq!(err.status().as_u16(), 502);
    }

    const STREAM: &str = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"model\":\"claude-x\",\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\n",
        "event: ping\ndata: {\"type\":\"ping\"}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello \"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"there\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"get\",\"input\":{}}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"q\\\":\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"1}\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":6}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    );

    fn translate_in_reads(reads: &[&[u8]]) -> (String, Usage) {
        let mut d = SseDecoder::new(StreamTranslator::new("anthropic", true, false));
        let mut out = Vec::new();
        for read in reads {
            out.extend_from_slice(&d.push(read));
        }
        out.extend_from_slice(&d.finish());
        (String::from_utf8(out).unwrap(), d.usage().unwrap())
    }

    #[test]
    fn the_stream_becomes_openai_chunks_whatever_the_reads() {
        let (whole, usage) = translate_in_reads(&[STREAM.as_bytes()]);
        assert_eq!(
            usage,
            Usage {
                prompt_tokens: 9,
                completion_tokens: 6
            }
        );
        let chunks: Vec<Value> = whole
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        assert!(whole.ends_with("data: [DONE]\n\n"));
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        let text: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, "Hello there");
        let args: String = chunks
            .iter()
            .filter_map(|c| {
                c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str()
            })
            .collect();
        assert_eq!(args, "{\"q\":1}");
        let finish: Vec<_> = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["finish_reason"].as_str())
            .collect();
        assert_eq!(finish, ["tool_calls"]);
        assert_eq!(chunks.last().unwrap()["usage"]["total_tokens"], 15);
        assert!(chunks
            .iter()
            .all(|c| c["id"] == "msg_1" && c["model"] == "claude-x"));

        // Any split of the byte stream into reads gives the same chunks (created is per stream).
        let strip = |s: &str| {
            let now = chunks::now_secs();
            s.replace(&format!("\"created\":{now}"), "")
                .replace(&format!("\"created\":{}", now - 1), "")
        };
        let bytes = STREAM.as_bytes();
        for step in [1, 2, 3, 7, 13, 64, 200] {
            let reads: Vec<&[u8]> = bytes.chunks(step).collect();
            let (split, _) = translate_in_reads(&reads);
            assert_eq!(strip(&split), strip(&whole), "reads of {step} bytes");
        }
    }

    #[test]
    fn a_stream_error_becomes_an_error_event() {
        let mut t = StreamTranslator::new("anthropic", false, false);
        let mut out = String::new();
        t.event(
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
            &mut out,
        );
        assert!(t.is_done());
        let e: Value = serde_json::from_str(out.trim().strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(e["error"]["message"], "anthropic error: Overloaded");
        assert_eq!(e["error"]["type"], "overloaded_error");
        // Nothing follows the error, not even at the end of the stream.
        let mut rest = String::new();
        t.end(&mut rest);
        assert!(rest.is_empty());
    }

    #[test]
    fn a_stream_cut_short_ends_with_an_error_event() {
        let (out, _) = translate_in_reads(&[STREAM
            .split("event: message_stop")
            .next()
            .unwrap()
            .as_bytes()]);
        assert!(!out.contains("[DONE]"));
        assert!(
            out.contains("the stream ended before the message was complete"),
            "{out}"
        );
    }
}
