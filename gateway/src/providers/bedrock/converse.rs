//! Bedrock's Converse and ConverseStream APIs: the chat request encoded from OpenAI's, the
//! answer and the event stream decoded back into OpenAI's shapes.
//!
//! Request: system and developer messages become `system: [{text}]`; user and assistant
//! messages become turns of content blocks (`{text}`, `{image}` from data URLs only: Bedrock
//! cannot fetch URLs); assistant tool calls become `{toolUse}` blocks and tool messages
//! `{toolResult}` blocks in a user turn (`{json}` content when the result is a JSON object,
//! `{text}` otherwise); consecutive turns of one role are merged, as Bedrock wants them to
//! alternate. `max_tokens`, `temperature`, `top_p` and `stop` go to `inferenceConfig`; tools
//! to `toolConfig` (`auto` -> `{auto:{}}`, `required` -> `{any:{}}`, a named function ->
//! `{tool:{name}}`, `none` -> no `toolConfig` at all); `thinking` to
//! `additionalModelRequestFields`. The model is named in the path, not the body.
//!
//! Answer: text blocks concatenated, `toolUse` blocks as tool calls, reasoning as
//! `content_blocks` (unless strict OpenAI compliance was asked for). Stop reasons:
//! `end_turn`/`stop_sequence` -> `stop`, `max_tokens` -> `length`, `tool_use` -> `tool_calls`,
//! `guardrail_intervened`/`content_filtered` -> `content_filter`.

use bytes::Bytes;
use serde_json::{json, Map, Value};

use plugin_sdk::llm::chat::{ChatRequest, ContentPart, MessageContent, ToolChoice};
use plugin_sdk::{GatewayError, Usage};

use super::eventstream::{FrameDecoder, Message};
use crate::providers::chunks::{self, ChunkWriter};
use crate::providers::request::{self, push_turn, Sampling};
use crate::providers::{CallInfo, Decoded, StreamDecoder};

const PROVIDER: &str = "bedrock";

/// The sampling fields `inferenceConfig` takes, under Converse's names.
const SAMPLING: &[(Sampling, &str)] = &[
    (Sampling::MaxTokens, "maxTokens"),
    (Sampling::Temperature, "temperature"),
    (Sampling::TopP, "topP"),
    (Sampling::Stop, "stopSequences"),
];

/// The Converse request body for a chat request.
pub fn encode(req: &ChatRequest) -> Result<Bytes, GatewayError> {
    let mut system = Vec::new();
    let mut messages: Vec<Value> = Vec::new();
    for (i, m) in req.messages.iter().enumerate() {
        match m.role.as_str() {
            "system" | "developer" => {
                let text = m
                    .content
                    .as_ref()
                    .map(MessageContent::text)
                    .unwrap_or_default();
                if !text.is_empty() {
                    system.push(json!({ "text": text }));
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
                for (k, call) in m.tool_calls.iter().flatten().enumerate() {
                    blocks.push(json!({"toolUse": {
                        "toolUseId": call.id.clone().unwrap_or_else(|| format!("tooluse_{i}_{k}")),
                        "name": call.function.name,
                        "input": tool_input(&call.function.arguments, i, k)?,
                    }}));
                }
                push_turn(&mut messages, "assistant", "content", blocks);
            }
            "tool" | "function" => {
                let id = request::answered_call_id(m, i)?;
                let text = m
                    .content
                    .as_ref()
                    .map(MessageContent::text)
                    .unwrap_or_default();
                let content = match serde_json::from_str::<Value>(&text) {
                    Ok(v @ Value::Object(_)) => json!([{ "json": v }]),
                    _ => json!([{ "text": text }]),
                };
                push_turn(
                    &mut messages,
                    "user",
                    "content",
                    vec![json!({"toolResult": {"toolUseId": id, "content": content}})],
                );
            }
            other => {
                return Err(GatewayError::invalid_param(
                    format!("messages[{i}].role"),
                    format!("bedrock does not take messages with the role {other:?}"),
                ))
            }
        }
    }

    let mut body = Map::new();
    body.insert("messages".into(), Value::Array(messages));
    if !system.is_empty() {
        body.insert("system".into(), Value::Array(system));
    }
    let mut inference = Map::new();
    request::put_sampling(&mut inference, req, SAMPLING);
    if !inference.is_empty() {
        body.insert("inferenceConfig".into(), Value::Object(inference));
    }
    if let Some(config) = tool_config(req) {
        body.insert("toolConfig".into(), config);
    }
    if let Some(thinking) = &req.thinking {
        body.insert(
            "additionalModelRequestFields".into(),
            json!({ "thinking": thinking }),
        );
    }
    request::json_body(&body, PROVIDER)
}

/// `toolConfig`, or `None` when there are no tools or the client chose `none` (Bedrock has no
/// "none" choice: without a tool configuration the model cannot call tools).
fn tool_config(req: &ChatRequest) -> Option<Value> {
    let tools = req.tools.as_ref().filter(|t| !t.is_empty())?;
    let choice = match &req.tool_choice {
        Some(ToolChoice::Mode(m)) if m == "none" => return None,
        Some(ToolChoice::Mode(m)) if m == "required" => Some(json!({"any": {}})),
        Some(ToolChoice::Mode(m)) if m == "auto" => Some(json!({"auto": {}})),
        Some(ToolChoice::Named(n)) => Some(json!({"tool": {"name": n.function.name}})),
        _ => None,
    };
    let specs: Vec<Value> = tools
        .iter()
        .map(|t| {
            let schema = t
                .function
                .parameters
                .clone()
                .unwrap_or_else(|| json!({"type": "object", "properties": {}}));
            let mut spec = json!({"name": t.function.name, "inputSchema": {"json": schema}});
            if let Some(d) = t.function.description.as_deref().filter(|d| !d.is_empty()) {
                spec["description"] = json!(d);
            }
            json!({ "toolSpec": spec })
        })
        .collect();
    let mut config = json!({ "tools": specs });
    if let Some(choice) = choice {
        config["toolChoice"] = choice;
    }
    Some(config)
}

/// A tool call's arguments as the JSON value Bedrock wants; empty arguments are `{}`.
fn tool_input(arguments: &str, i: usize, k: usize) -> Result<Value, GatewayError> {
    if arguments.trim().is_empty() {
        return Ok(json!({}));
    }
    serde_json::from_str(arguments).map_err(|e| {
        GatewayError::invalid_param(
            format!("messages[{i}].tool_calls[{k}].function.arguments"),
            format!("the arguments of a tool call must be JSON: {e}"),
        )
    })
}

fn content_blocks(content: Option<&MessageContent>, i: usize) -> Result<Vec<Value>, GatewayError> {
    match content {
        None => Ok(Vec::new()),
        // Bedrock refuses blank text blocks.
        Some(MessageContent::Text(t)) if t.is_empty() => Ok(Vec::new()),
        Some(MessageContent::Text(t)) => Ok(vec![json!({ "text": t })]),
        Some(MessageContent::Parts(parts)) => {
            let mut blocks = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                match part.kind.as_str() {
                    "text" => match part.text.as_deref() {
                        Some(t) if !t.is_empty() => blocks.push(json!({ "text": t })),
                        _ => {}
                    },
                    "image_url" => blocks.push(image_block(part, i, j)?),
                    other => {
                        return Err(GatewayError::invalid_param(
                            format!("messages[{i}].content[{j}].type"),
                            format!("bedrock does not take content parts of type {other:?}"),
                        ))
                    }
                }
            }
            Ok(blocks)
        }
    }
}

/// An image block from a `data:` URL; Bedrock takes the image bytes inline only.
fn image_block(part: &ContentPart, i: usize, j: usize) -> Result<Value, GatewayError> {
    let param = || format!("messages[{i}].content[{j}].image_url");
    let Some((media_type, data)) = request::data_url(request::image_url(part), i, j)? else {
        return Err(GatewayError::invalid_param(
            param(),
            "bedrock cannot fetch image URLs: send the image inline as a data URL \
             (data:image/png;base64,...)",
        ));
    };
    let format = match media_type.to_ascii_lowercase().as_str() {
        "image/png" => "png",
        "image/jpeg" | "image/jpg" => "jpeg",
        "image/gif" => "gif",
        "image/webp" => "webp",
        other => {
            return Err(GatewayError::invalid_param(
                param(),
                format!("bedrock takes png, jpeg, gif and webp images, not {other:?}"),
            ))
        }
    };
    Ok(json!({"image": {"format": format, "source": {"bytes": data}}}))
}

/// OpenAI's finish reason for a Converse stop reason; an unknown or missing one is `stop`.
fn finish_reason(stop_reason: Option<&str>) -> &'static str {
    match stop_reason {
        Some("max_tokens" | "model_context_window_exceeded") => "length",
        Some("tool_use") => "tool_calls",
        Some("guardrail_intervened" | "content_filtered") => "content_filter",
        _ => "stop",
    }
}

/// Converse `usage`; cached prompt tokens are reported apart from `inputTokens` and count as
/// prompt tokens.
fn usage_of(v: &Value) -> Usage {
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    Usage {
        prompt_tokens: n("inputTokens") + n("cacheReadInputTokens") + n("cacheWriteInputTokens"),
        completion_tokens: n("outputTokens"),
    }
}

/// A whole Converse answer as an OpenAI `chat.completion`.
pub fn decode(call: &CallInfo, body: &[u8]) -> Result<Decoded, GatewayError> {
    let answer: Value = serde_json::from_slice(body)
        .map_err(|e| chunks::bad_answer(PROVIDER, format!("the answer is not JSON ({e})")))?;
    let blocks = answer["output"]["message"]["content"]
        .as_array()
        .ok_or_else(|| chunks::bad_answer(PROVIDER, "the answer has no output.message.content"))?;
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    let mut content_blocks = Vec::new();
    let mut reasoned = false;
    for block in blocks {
        if let Some(t) = block.get("text").and_then(Value::as_str) {
            text.push_str(t);
            content_blocks.push(json!({"type": "text", "text": t}));
        } else if let Some(tool) = block.get("toolUse") {
            let (Some(id), Some(name)) = (tool["toolUseId"].as_str(), tool["name"].as_str()) else {
                return Err(chunks::bad_answer(
                    PROVIDER,
                    "a toolUse block has no toolUseId or name",
                ));
            };
            let arguments = match tool.get("input") {
                None | Some(Value::Null) => "{}".to_owned(),
                Some(input) => input.to_string(),
            };
            tool_calls.push(chunks::tool_call(id, name, arguments));
        } else if let Some(r) = block.get("reasoningContent") {
            reasoned = true;
            if let Some(redacted) = r.get("redactedContent") {
                content_blocks.push(json!({"type": "redacted_thinking", "data": redacted}));
            } else {
                let rt = &r["reasoningText"];
                content_blocks.push(json!({
                    "type": "thinking", "thinking": rt["text"], "signature": rt["signature"],
                }));
            }
        }
    }
    let usage = usage_of(&answer["usage"]);
    let mut message = chunks::assistant_message(text, tool_calls);
    if reasoned && !call.strict {
        message["content_blocks"] = Value::Array(content_blocks);
    }
    let finish = finish_reason(answer["stopReason"].as_str());
    // Converse answers carry no id: the completion gets a fresh one.
    let id = chunks::new_id();
    Ok(Decoded {
        provisioned: false,
        body: chunks::completion(&id, &call.model, message, json!(finish), usage),
        model: call.named_model(),
        usage: Some(usage),
    })
}

/// Translates a ConverseStream event stream into OpenAI chunks, frame by frame. The end (finish
/// chunk, usage chunk, `[DONE]`) is written once both `messageStop` and `metadata` arrived, or
/// when the stream ends. A corrupt frame or an exception ends the stream with an error event.
pub struct ConverseStream {
    frames: FrameDecoder,
    writer: ChunkWriter,
    strict: bool,
    /// Converse content block index -> OpenAI tool call index, for toolUse blocks.
    tools: Vec<(u64, usize)>,
    finish: Option<&'static str>,
    usage: Option<Usage>,
}

impl ConverseStream {
    pub fn new(call: &CallInfo, id: String) -> Self {
        ConverseStream {
            frames: FrameDecoder::default(),
            writer: ChunkWriter::new(id, call.model.clone(), call.include_usage),
            strict: call.strict,
            tools: Vec::new(),
            finish: None,
            usage: None,
        }
    }

    fn message(&mut self, m: &Message, out: &mut String) {
        match m.header(":message-type") {
            Some("event") => {
                let Ok(payload) = serde_json::from_slice::<Value>(&m.payload) else {
                    self.writer.error(
                        PROVIDER,
                        "the stream sent an event that is not JSON",
                        Some("upstream_error"),
                        out,
                    );
                    return;
                };
                self.event(m.header(":event-type").unwrap_or_default(), &payload, out);
            }
            Some("exception") => {
                let payload: Value = serde_json::from_slice(&m.payload).unwrap_or(Value::Null);
                let kind = m.header(":exception-type").unwrap_or("exception");
                let message = payload["message"]
                    .as_str()
                    .or_else(|| payload["Message"].as_str())
                    .unwrap_or(kind);
                self.writer.error(PROVIDER, message, Some(kind), out);
            }
            Some("error") => {
                let code = m.header(":error-code").unwrap_or("error");
                let message = m.header(":error-message").unwrap_or(code);
                self.writer.error(PROVIDER, message, Some(code), out);
            }
            _ => {}
        }
    }

    fn event(&mut self, kind: &str, payload: &Value, out: &mut String) {
        let block = payload["contentBlockIndex"].as_u64().unwrap_or(0);
        match kind {
            "messageStart" => self.writer.role(out),
            "contentBlockStart" => {
                let tool = &payload["start"]["toolUse"];
                if tool.is_object() {
                    let index = self.tools.len();
                    self.tools.push((block, index));
                    self.writer.tool_start(
                        index,
                        tool["toolUseId"].as_str().unwrap_or_default(),
                        tool["name"].as_str().unwrap_or_default(),
                        out,
                    );
                }
            }
            "contentBlockDelta" => {
                let delta = &payload["delta"];
                if let Some(t) = delta["text"].as_str() {
                    self.writer.text(t, out);
                } else if let Some(piece) = delta["toolUse"]["input"].as_str() {
                    if let Some(&(_, index)) = self.tools.iter().find(|(b, _)| *b == block) {
                        self.writer.tool_arguments(index, piece, out);
                    }
                } else if !self.strict {
                    let r = &delta["reasoningContent"];
                    let piece = if let Some(t) = r["text"].as_str() {
                        json!({ "thinking": t })
                    } else if let Some(s) = r["signature"].as_str() {
                        json!({ "signature": s })
                    } else {
                        return;
                    };
                    self.writer.delta(
                        json!({"content_blocks": [{"index": block, "delta": piece}]}),
                        out,
                    );
                }
            }
            "messageStop" => {
                self.finish = Some(finish_reason(payload["stopReason"].as_str()));
                self.end_when_complete(out);
            }
            "metadata" => {
                self.usage = Some(usage_of(&payload["usage"]));
                self.end_when_complete(out);
            }
            _ => {}
        }
    }

    fn end_when_complete(&mut self, out: &mut String) {
        if let (Some(finish), Some(usage)) = (self.finish, self.usage) {
            self.writer.end(finish, usage, out);
        }
    }
}

impl StreamDecoder for ConverseStream {
    fn push(&mut self, read: &[u8]) -> Bytes {
        // After the end or an error nothing more is translated (or buffered).
        if self.writer.ended() {
            return Bytes::new();
        }
        self.frames.push(read);
        let mut out = String::new();
        while !self.writer.ended() {
            match self.frames.next_message() {
                Ok(Some(m)) => self.message(&m, &mut out),
                Ok(None) => break,
                Err(why) => self.writer.error(
                    PROVIDER,
                    &format!("the event stream cannot be read: {why}"),
                    Some("upstream_error"),
                    &mut out,
                ),
            }
        }
        Bytes::from(out)
    }

    fn finish(&mut self) -> Bytes {
        let mut out = String::new();
        if self.writer.ended() {
            return Bytes::new();
        }
        if self.frames.has_partial() {
            self.writer.error(
                PROVIDER,
                "the event stream ended inside a frame",
                Some("upstream_error"),
                &mut out,
            );
        } else {
            let finish = self.finish.unwrap_or("stop");
            self.writer
                .end(finish, self.usage.unwrap_or_default(), &mut out);
        }
        Bytes::from(out)
    }

    fn usage(&self) -> Option<Usage> {
        self.usage
    }

    fn model(&self) -> Option<&str> {
        // Converse streams do not name the model; the request's is already known.
        None
    }
}

#[cfg(test)]
mod tests {
    use super::super::eventstream::testing::{event, exception, frame};
    use super::*;
    use crate::providers::testing::chat;
    use crate::providers::WireFormat;
    use plugin_sdk::Route;

    fn encoded(body: Value) -> Value {
        serde_json::from_slice(&encode(&chat(body)).unwrap()).unwrap()
    }

    fn call(include_usage: bool, strict: bool) -> CallInfo {
        CallInfo {
            provider: "bedrock",
            format: WireFormat::Bedrock,
            route: Route::ChatCompletions,
            model: "anthropic.claude-3-5-sonnet-20240620-v1:0".into(),
            include_usage,
            hidden_usage: false,
            base64_embeddings: false,
            strict,
            waive_provisioned_cost: false,
        }
    }

    #[test]
    fn requests_map_system_turns_tools_and_inference_config() {
        let body = encoded(json!({
            "model": "m", "stop": "END", "temperature": 0.3, "top_p": 0.9, "max_tokens": 100,
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "developer", "content": [{"type": "text", "text": "and kind"}]},
                {"role": "user", "content": [{"type": "text", "text": "look"},
                    {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,AAAA"}}]},
                {"role": "user", "content": "again"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get", "arguments": "{\"q\":1}"}},
                    {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": ""}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 20}"},
                {"role": "tool", "tool_call_id": "call_2", "content": "noon"},
                {"role": "user", "content": "thanks"}
            ],
            "tools": [
                {"type": "function", "function": {"name": "get", "description": "fetch", "parameters": {"type": "object", "properties": {"q": {"type": "integer"}}}}},
                {"type": "function", "function": {"name": "now"}}
            ],
            "tool_choice": "auto"
        }));
        assert!(body.get("model").is_none(), "the model goes in the path");
        assert_eq!(
            body["system"],
            json!([{"text": "be brief"}, {"text": "and kind"}])
        );
        assert_eq!(
            body["inferenceConfig"],
            json!({"maxTokens": 100, "temperature": 0.3, "topP": 0.9, "stopSequences": ["END"]})
        );
        let msgs = body["messages"].as_array().unwrap();
        assert_eq!(msgs.len(), 3, "{msgs:?}");
        assert_eq!(msgs[0]["role"], "user");
        assert_eq!(
            msgs[0]["content"],
            json!([
                {"text": "look"},
                {"image": {"format": "jpeg", "source": {"bytes": "AAAA"}}},
                {"text": "again"}
            ])
        );
        assert_eq!(
            msgs[1],
            json!({"role": "assistant", "content": [
                {"toolUse": {"toolUseId": "call_1", "name": "get", "input": {"q": 1}}},
                {"toolUse": {"toolUseId": "call_2", "name": "now", "input": {}}}
            ]})
        );
        // Both tool results and the next user text share one user turn.
        assert_eq!(
            msgs[2],
            json!({"role": "user", "content": [
                {"toolResult": {"toolUseId": "call_1", "content": [{"json": {"temp": 20}}]}},
                {"toolResult": {"toolUseId": "call_2", "content": [{"text": "noon"}]}},
                {"text": "thanks"}
            ]})
        );
        assert_eq!(
            body["toolConfig"],
            json!({"tools": [
                {"toolSpec": {"name": "get", "description": "fetch",
                    "inputSchema": {"json": {"type": "object", "properties": {"q": {"type": "integer"}}}}}},
                {"toolSpec": {"name": "now",
                    "inputSchema": {"json": {"type": "object", "properties": {}}}}}
            ], "toolChoice": {"auto": {}}})
        );
    }

    #[test]
    fn tool_choices_map_and_none_drops_the_tools() {
        let with_choice = |choice: Value| {
            encoded(json!({
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "function", "function": {"name": "get"}}],
                "tool_choice": choice,
            }))
        };
        assert_eq!(
            with_choice(json!("required"))["toolConfig"]["toolChoice"],
            json!({"any": {}})
        );
        assert_eq!(
            with_choice(json!({"type": "function", "function": {"name": "get"}}))["toolConfig"]
                ["toolChoice"],
            json!({"tool": {"name": "get"}})
        );
        assert!(with_choice(json!("none")).get("toolConfig").is_none());
        let plain = encoded(json!({"messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "get"}}]}));
        assert!(plain["toolConfig"].get("toolChoice").is_none());
        assert!(plain["toolConfig"]["tools"].is_array());
        // Nothing optional is sent when nothing was asked.
        let bare = encoded(json!({"messages": [{"role": "user", "content": "x"}]}));
        assert_eq!(
            bare,
            json!({"messages": [{"role": "user", "content": [{"text": "x"}]}]})
        );
        let thinking = encoded(json!({"messages": [{"role": "user", "content": "x"}],
            "max_completion_tokens": 9, "stop": ["a", "b"],
            "thinking": {"type": "enabled", "budget_tokens": 1024}}));
        assert_eq!(
            thinking["additionalModelRequestFields"],
            json!({"thinking": {"type": "enabled", "budget_tokens": 1024}})
        );
        assert_eq!(
            thinking["inferenceConfig"],
            json!({"maxTokens": 9, "stopSequences": ["a", "b"]})
        );
    }

    #[test]
    fn bad_requests_name_the_field() {
        let param = |body: Value| encode(&chat(body)).unwrap_err().param.unwrap_or_default();
        assert_eq!(
            param(json!({"messages": [{"role": "user", "content": [
                {"type": "text", "text": "x"},
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}]})),
            "messages[0].content[1].image_url"
        );
        let err = encode(&chat(json!({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://example.com/cat.png"}}]}]})))
        .unwrap_err();
        assert_eq!(err.status().as_u16(), 400);
        assert!(err.message.contains("cannot fetch"), "{}", err.message);
        assert_eq!(
            param(json!({"messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/bmp;base64,AA"}}]}]})),
            "messages[0].content[0].image_url"
        );
        assert_eq!(
            param(json!({"messages": [{"role": "user", "content": [
                {"type": "input_audio"}]}]})),
            "messages[0].content[0].type"
        );
        assert_eq!(
            param(json!({"messages": [{"role": "assistant", "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]})),
            "messages[0].tool_calls[0].function.arguments"
        );
        assert_eq!(
            param(json!({"messages": [{"role": "tool", "content": "x"}]})),
            "messages[0].tool_call_id"
        );
        // An image URL given as a bare string also works.
        let body = encoded(json!({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": "data:image/webp;base64,UklG"}]}]}));
        assert_eq!(body["messages"][0]["content"][0]["image"]["format"], "webp");
    }

    fn decoded(answer: Value, strict: bool) -> (Value, Decoded) {
        let d = decode(&call(false, strict), answer.to_string().as_bytes()).unwrap();
        (serde_json::from_slice(&d.body).unwrap(), d)
    }

    #[test]
    fn answers_map_content_tools_and_usage() {
        let answer = json!({
            "output": {"message": {"role": "assistant", "content": [
                {"reasoningContent": {"reasoningText": {"text": "hmm", "signature": "sig"}}},
                {"text": "calling "},
                {"text": "now"},
                {"toolUse": {"toolUseId": "tooluse_1", "name": "get", "input": {"q": 1}}}
            ]}},
            "stopReason": "tool_use",
            "usage": {"inputTokens": 10, "outputTokens": 4, "totalTokens": 14},
            "metrics": {"latencyMs": 120}
        });
        let (out, d) = decoded(answer.clone(), false);
        assert_eq!(
            d.usage,
            Some(Usage {
                prompt_tokens: 10,
                completion_tokens: 4
            })
        );
        assert_eq!(
            d.model.as_deref(),
            Some("anthropic.claude-3-5-sonnet-20240620-v1:0")
        );
        assert_eq!(out["object"], "chat.completion");
        assert!(out["id"].as_str().unwrap().starts_with("chatcmpl-"));
        assert_eq!(out["model"], "anthropic.claude-3-5-sonnet-20240620-v1:0");
        let c = &out["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls");
        assert_eq!(c["message"]["content"], "calling now");
        assert_eq!(
            c["message"]["tool_calls"],
            json!([{"id": "tooluse_1", "type": "function",
                "function": {"name": "get", "arguments": "{\"q\":1}"}}])
        );
        assert_eq!(
            c["message"]["content_blocks"][0],
            json!({"type": "thinking", "thinking": "hmm", "signature": "sig"})
        );
        assert_eq!(out["usage"]["total_tokens"], 14);
        let (strict, _) = decoded(answer, true);
        assert!(strict["choices"][0]["message"]
            .get("content_blocks")
            .is_none());

        // Only tool calls: content is null.
        let (out, _) = decoded(
            json!({"output": {"message": {"content": [
                {"toolUse": {"toolUseId": "t", "name": "f", "input": {}}}]}},
                "stopReason": "tool_use", "usage": {}}),
            false,
        );
        assert_eq!(out["choices"][0]["message"]["content"], Value::Null);
        assert_eq!(out["usage"]["total_tokens"], 0);
    }

    #[test]
    fn each_stop_reason_has_its_finish_reason() {
        for (reason, want) in [
            ("end_turn", "stop"),
            ("stop_sequence", "stop"),
            ("max_tokens", "length"),
            ("tool_use", "tool_calls"),
            ("guardrail_intervened", "content_filter"),
            ("content_filtered", "content_filter"),
            ("something_new", "stop"),
        ] {
            let (out, _) = decoded(
                json!({"output": {"message": {"content": [{"text": "t"}]}},
                    "stopReason": reason, "usage": {"inputTokens": 1, "outputTokens": 1}}),
                false,
            );
            assert_eq!(out["choices"][0]["finish_reason"], want, "{reason}");
        }
    }

    #[test]
    fn malformed_answers_are_502s() {
        for body in [
            &b"<html>"[..],
            br#"{"output": {}}"#,
            br#"{"output": {"message": {"content": "text"}}}"#,
            br#"{"output": {"message": {"content": [{"toolUse": {"input": {}}}]}}}"#,
        ] {
            let err = decode(&call(false, false), body).unwrap_err();
            assert_eq!(
                err.status().as_u16(),
                502,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    fn stream_bytes() -> Vec<u8> {
        let mut s = Vec::new();
        for (kind, payload) in [
            ("messageStart", r#"{"role":"assistant","p":"abc"}"#),
            (
                "contentBlockDelta",
                r#"{"contentBlockIndex":0,"delta":{"text":"Hello "}}"#,
            ),
            (
                "contentBlockDelta",
                r#"{"contentBlockIndex":0,"delta":{"text":"there"}}"#,
            ),
            ("contentBlockStop", r#"{"contentBlockIndex":0}"#),
            (
                "contentBlockStart",
                r#"{"contentBlockIndex":1,"start":{"toolUse":{"toolUseId":"tooluse_1","name":"get"}}}"#,
            ),
            (
                "contentBlockDelta",
                r#"{"contentBlockIndex":1,"delta":{"toolUse":{"input":"{\"q\":"}}}"#,
            ),
            (
                "contentBlockDelta",
                r#"{"contentBlockIndex":1,"delta":{"toolUse":{"input":"1}"}}}"#,
            ),
            ("contentBlockStop", r#"{"contentBlockIndex":1}"#),
            (
                "contentBlockStart",
                r#"{"contentBlockIndex":2,"start":{"toolUse":{"toolUseId":"tooluse_2","name":"now"}}}"#,
            ),
            (
                "contentBlockDelta",
                r#"{"contentBlockIndex":2,"delta":{"toolUse":{"input":"{}"}}}"#,
            ),
            ("contentBlockStop", r#"{"contentBlockIndex":2}"#),
            ("messageStop", r#"{"stopReason":"tool_use"}"#),
            (
                "metadata",
                r#"{"usage":{"inputTokens":9,"outputTokens":6,"totalTokens":15},"metrics":{"latencyMs":300}}"#,
            ),
        ] {
            s.extend(event(kind, payload));
        }
        s
    }

    fn run(reads: &[&[u8]], include_usage: bool) -> (String, Option<Usage>) {
        let mut d = ConverseStream::new(&call(include_usage, false), "chatcmpl-test".into());
        let mut out = Vec::new();
        for read in reads {
            out.extend_from_slice(&d.push(read));
        }
        out.extend_from_slice(&d.finish());
        (String::from_utf8(out).unwrap(), d.usage())
    }

    fn chunks_of(s: &str) -> Vec<Value> {
        s.split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap())
            .collect()
    }

    /// The stream with every `created` set to 0 (it is the clock at the stream's start).
    fn normalised(s: &str) -> Vec<Value> {
        chunks_of(s)
            .into_iter()
            .map(|mut c| {
                if c.get("created").is_some() {
                    c["created"] = json!(0);
                }
                c
            })
            .collect()
    }

    #[test]
    fn the_stream_becomes_openai_chunks() {
        let bytes = stream_bytes();
        let (out, usage) = run(&[&bytes], true);
        assert_eq!(
            usage,
            Some(Usage {
                prompt_tokens: 9,
                completion_tokens: 6
            })
        );
        assert!(out.ends_with("data: [DONE]\n\n"));
        assert_eq!(out.matches("[DONE]").count(), 1);
        let chunks = chunks_of(&out);
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        let text: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, "Hello there");
        let starts: Vec<_> = chunks
            .iter()
            .filter_map(|c| {
                c["choices"][0]["delta"]["tool_calls"][0]["id"]
                    .as_str()
                    .map(|id| {
                        (
                            id.to_owned(),
                            c["choices"][0]["delta"]["tool_calls"][0]["index"].clone(),
                        )
                    })
            })
            .collect();
        assert_eq!(
            starts,
            [
                ("tooluse_1".to_owned(), json!(0)),
                ("tooluse_2".to_owned(), json!(1))
            ]
        );
        let args = |index: u64| -> String {
            chunks
                .iter()
                .map(|c| &c["choices"][0]["delta"]["tool_calls"][0])
                .filter(|t| t["index"] == index)
                .filter_map(|t| t["function"]["arguments"].as_str())
                .collect()
        };
        assert_eq!(args(0), "{\"q\":1}");
        assert_eq!(args(1), "{}");
        let finishes: Vec<_> = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["finish_reason"].as_str())
            .collect();
        assert_eq!(finishes, ["tool_calls"]);
        let last = chunks.last().unwrap();
        assert_eq!(last["choices"], json!([]));
        assert_eq!(last["usage"]["total_tokens"], 15);
        assert!(chunks.iter().all(|c| c["id"] == "chatcmpl-test"
            && c["model"] == "anthropic.claude-3-5-sonnet-20240620-v1:0"
            && c["object"] == "chat.completion.chunk"));

        // Without include_usage there is no usage chunk.
        let (out, _) = run(&[&bytes], false);
        assert!(chunks_of(&out).iter().all(|c| c.get("usage").is_none()));
    }

    #[test]
    fn any_split_of_the_stream_gives_the_same_chunks() {
        let bytes = stream_bytes();
        let whole = normalised(&run(&[&bytes], true).0);
        for cut in 0..=bytes.len() {
            let split = normalised(&run(&[&bytes[..cut], &bytes[cut..]], true).0);
            assert_eq!(split, whole, "one cut at byte {cut}");
        }
        for step in [1, 2, 3, 5, 7, 13, 64, 200, 1000] {
            let reads: Vec<&[u8]> = bytes.chunks(step).collect();
            assert_eq!(
                normalised(&run(&reads, true).0),
                whole,
                "reads of {step} bytes"
            );
        }
        // Uneven reads, from a small deterministic generator.
        let mut seed = 0x2545_f491_u64;
        for _ in 0..50 {
            let mut reads = Vec::new();
            let mut at = 0;
            while at < bytes.len() {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let n = usize::try_from(seed % 97).unwrap_or(1) + 1;
                let end = (at + n).min(bytes.len());
                reads.push(&bytes[at..end]);
                at = end;
            }
            assert_eq!(normalised(&run(&reads, true).0), whole);
        }
    }

    #[test]
    fn the_end_waits_for_metadata_or_the_end_of_the_stream() {
        let mut d = ConverseStream::new(&call(true, false), "id".into());
        let mut out = String::from_utf8(
            d.push(&event("messageStop", r#"{"stopReason":"max_tokens"}"#))
                .to_vec(),
        )
        .unwrap();
        assert!(!out.contains("[DONE]"), "the end waits for metadata");
        out.push_str(
            std::str::from_utf8(&d.push(&event(
                "metadata",
                r#"{"usage":{"inputTokens":1,"outputTokens":2}}"#,
            )))
            .unwrap(),
        );
        assert!(out.ends_with("data: [DONE]\n\n"));
        assert!(chunks_of(&out)
            .iter()
            .any(|c| c["choices"][0]["finish_reason"] == "length"));
        assert!(d.finish().is_empty(), "the end is written once");
        assert!(d.push(&event("metadata", "{}")).is_empty());

        // A stream that ends without metadata still ends, with zero usage.
        let mut d = ConverseStream::new(&call(true, false), "id".into());
        let mut out = d
            .push(&event(
                "contentBlockDelta",
                r#"{"contentBlockIndex":0,"delta":{"text":"hi"}}"#,
            ))
            .to_vec();
        out.extend_from_slice(&d.finish());
        let out = String::from_utf8(out).unwrap();
        let chunks = chunks_of(&out);
        assert_eq!(chunks.last().unwrap()["usage"]["total_tokens"], 0);
        assert!(chunks
            .iter()
            .any(|c| c["choices"][0]["finish_reason"] == "stop"));
        assert_eq!(d.usage(), None);
    }

    #[test]
    fn exceptions_and_corrupt_frames_end_the_stream_with_an_error() {
        let first = event(
            "contentBlockDelta",
            r#"{"contentBlockIndex":0,"delta":{"text":"hi"}}"#,
        );

        let mut bytes = first.clone();
        bytes.extend(exception("throttlingException", "Too many requests"));
        bytes.extend(first.clone());
        let (out, _) = run(&[&bytes], true);
        let chunks = chunks_of(&out);
        let last = chunks.last().unwrap();
        assert_eq!(last["error"]["message"], "bedrock error: Too many requests");
        assert_eq!(last["error"]["type"], "throttlingException");
        assert_eq!(out.matches("\"hi\"").count(), 1, "nothing after the error");
        assert!(!out.contains("[DONE]"));

        let mut bad = first.clone();
        let n = bad.len();
        bad[n - 1] ^= 0xff; // the message CRC
        let mut bytes = first.clone();
        bytes.extend(bad);
        bytes.extend(first.clone());
        for step in [1, 7, bytes.len()] {
            let reads: Vec<&[u8]> = bytes.chunks(step).collect();
            let (out, _) = run(&reads, false);
            let chunks = chunks_of(&out);
            assert_eq!(chunks.len(), 3, "role, text, error: {out}");
            assert_eq!(chunks[2]["error"]["type"], "upstream_error");
            assert!(chunks[2]["error"]["message"]
                .as_str()
                .unwrap()
                .contains("CRC"));
        }

        // A stream cut inside a frame.
        let (out, _) = run(&[&first[..first.len() - 3]], false);
        assert!(out.contains("ended inside a frame"), "{out}");

        // An error frame (headers only).
        let err = frame(
            &[
                (":message-type", "error"),
                (":error-code", "InternalFailure"),
                (":error-message", "boom"),
            ],
            b"",
        );
        let (out, _) = run(&[&err], false);
        let chunks = chunks_of(&out);
        assert_eq!(chunks[0]["error"]["type"], "InternalFailure");
        assert_eq!(chunks[0]["error"]["message"], "bedrock error: boom");
    }

    #[test]
    fn reasoning_deltas_become_content_blocks_unless_strict() {
        let bytes = event(
            "contentBlockDelta",
            r#"{"contentBlockIndex":0,"delta":{"reasoningContent":{"text":"hmm"}}}"#,
        );
        let (out, _) = run(&[&bytes], false);
        assert!(chunks_of(&out)
            .iter()
            .any(|c| c["choices"][0]["delta"]["content_blocks"][0]["delta"]["thinking"] == "hmm"));
        let mut d = ConverseStream::new(&call(false, true), "id".into());
        let out = d.push(&bytes);
        assert!(!String::from_utf8_lossy(&out).contains("hmm"));
    }
}
