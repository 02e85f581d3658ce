//! Anthropic Messages API: requests encoded from the canonical (OpenAI) chat request, answers
//! and event streams decoded back into OpenAI's shapes.
//!
//! Mapping: system and developer messages become the top-level `system`; tool calls become
//! `tool_use` blocks and tool messages `tool_result` blocks in a user turn; images become image
//! blocks; `max_tokens` defaults to [`DEFAULT_MAX_TOKENS`]; `stop` becomes `stop_sequences`.
//! Finish reasons: `end_turn`/`stop_sequence` -> `stop`, `max_tokens` -> `length`,
//! `tool_use` -> `tool_calls`.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde_json::{json, Map, Value};

use plugin_sdk::llm::chat::{ChatRequest, ContentPart, MessageContent, Stop, ToolChoice};
use plugin_sdk::{ErrorKind, GatewayError, Usage};

/// `max_tokens` when the client set none (Anthropic requires it).
pub const DEFAULT_MAX_TOKENS: u64 = 4096;
/// `anthropic-version` when the client sent none.
pub const DEFAULT_VERSION: &str = "2023-06-01";

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
                content_blocks(m.content.as_ref(), i)?,
            ),
            "assistant" => {
                let mut blocks = content_blocks(m.content.as_ref(), i)?;
                for call in m.tool_calls.iter().flatten() {
                    let input: Value = serde_json::from_str(&call.function.arguments)
                        .ok()
                        .filter(Value::is_object)
                        .unwrap_or_else(|| json!({}));
                    blocks.push(json!({
                        "type": "tool_use",
                        "id": call.id.clone().unwrap_or_else(|| format!("toolu_{i}")),
                        "name": call.function.name,
                        "input": input,
                    }));
                }
                push_turn(&mut messages, "assistant", blocks);
            }
            "tool" | "function" => {
                let result = json!({
                    "type": "tool_result",
                    "tool_use_id": m.tool_call_id.clone().or_else(|| m.name.clone()).unwrap_or_default(),
                    "content": m.content.as_ref().map(MessageContent::text).unwrap_or_default(),
                });
                push_turn(&mut messages, "user", vec![result]);
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
    if let Some(t) = req.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(p) = req.top_p {
        body.insert("top_p".into(), json!(p));
    }
    match &req.stop {
        Some(Stop::One(s)) => {
            body.insert("stop_sequences".into(), json!([s]));
        }
        Some(Stop::Many(v)) if !v.is_empty() => {
            body.insert("stop_sequences".into(), json!(v));
        }
        _ => {}
    }
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
    serde_json::to_vec(&body)
        .map(Bytes::from)
        .map_err(|e| GatewayError::internal(format!("cannot encode the anthropic request: {e}")))
}

/// Appends blocks to the conversation, merging into the previous turn when it has the same role
/// (Anthropic wants user and assistant turns to alternate).
fn push_turn(messages: &mut Vec<Value>, role: &str, blocks: Vec<Value>) {
    if blocks.is_empty() {
        return;
    }
    if let Some(last) = messages.last_mut() {
        if last["role"] == role {
            if let Some(content) = last["content"].as_array_mut() {
                content.extend(blocks);
                return;
            }
        }
    }
    messages.push(json!({"role": role, "content": blocks}));
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
            let url = part
                .image_url
                .as_ref()
                .and_then(|v| v.get("url").or(Some(v)))
                .and_then(Value::as_str)
                .unwrap_or_default();
            if let Some(rest) = url.strip_prefix("data:") {
                let (media_type, data) = rest.split_once(";base64,").ok_or_else(|| {
                    GatewayError::invalid_param(
                        format!("messages[{i}].content[{j}].image_url"),
                        "a data URL must be base64 (data:<type>;base64,<data>)",
                    )
                })?;
                Ok(
                    json!({"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}),
                )
            } else {
                Ok(json!({"type": "image", "source": {"type": "url", "url": url}}))
            }
        }
        other => Err(GatewayError::invalid_param(
            format!("messages[{i}].content[{j}].type"),
            format!("anthropic does not take content parts of type {other:?}"),
        )),
    }
}

fn finish_reason(stop_reason: Option<&str>) -> Value {
    match stop_reason {
        Some("end_turn" | "stop_sequence") => json!("stop"),
        Some("max_tokens") => json!("length"),
        Some("tool_use") => json!("tool_calls"),
        Some(other) => json!(other),
        None => Value::Null,
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn usage_of(v: &Value) -> Usage {
    Usage {
        prompt_tokens: v["input_tokens"].as_u64().unwrap_or(0)
            + v["cache_creation_input_tokens"].as_u64().unwrap_or(0)
            + v["cache_read_input_tokens"].as_u64().unwrap_or(0),
        completion_tokens: v["output_tokens"].as_u64().unwrap_or(0),
    }
}

/// An answer in OpenAI's chat.completion shape, with its usage. `content_blocks` (thinking and
/// text) is added unless `strict` OpenAI compliance was asked for.
pub fn decode_chat(body: &[u8], strict: bool) -> Result<(Bytes, Usage), GatewayError> {
    let bad = |why: String| {
        GatewayError::new(
            ErrorKind::UpstreamBadResponse,
            format!("anthropic answered something that is not a message: {why}"),
        )
    };
    let msg: Value = serde_json::from_slice(body).map_err(|e| bad(e.to_string()))?;
    let blocks = msg["content"]
        .as_array()
        .ok_or_else(|| bad("no content list".into()))?;
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
            Some("tool_use") => tool_calls.push(json!({
                "id": block["id"],
                "type": "function",
                "function": {"name": block["name"], "arguments": block["input"].to_string()},
            })),
            Some("thinking") => content_blocks.push(json!({
                "type": "thinking", "thinking": block["thinking"], "signature": block["signature"],
            })),
            _ => {}
        }
    }
    let usage = usage_of(&msg["usage"]);
    let mut message = json!({
        "role": "assistant",
        "content": if text.is_empty() && !tool_calls.is_empty() { Value::Null } else { json!(text) },
    });
    if !tool_calls.is_empty() {
        message["tool_calls"] = Value::Array(tool_calls);
    }
    let has_thinking = content_blocks.iter().any(|b| b["type"] == "thinking");
    if !strict && has_thinking {
        message["content_blocks"] = Value::Array(content_blocks);
    }
    let out = json!({
        "id": msg["id"],
        "object": "chat.completion",
        "created": now_secs(),
        "model": msg["model"],
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": finish_reason(msg["stop_reason"].as_str()),
        }],
        "usage": {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total(),
        },
    });
    Ok((Bytes::from(out.to_string()), usage))
}

/// Translates Anthropic's event stream into OpenAI chunks, one event at a time.
#[derive(Debug, Default)]
pub struct StreamTranslator {
    id: String,
    model: String,
    created: u64,
    /// Anthropic block index -> OpenAI tool call index, for tool_use blocks.
    tool_index: Vec<(u64, usize)>,
    tools: usize,
    usage: Usage,
    finish: Option<Value>,
    include_usage: bool,
    strict: bool,
    done: bool,
}

impl StreamTranslator {
    pub fn new(include_usage: bool, strict: bool) -> Self {
        StreamTranslator {
            include_usage,
            strict,
            created: now_secs(),
            ..Default::default()
        }
    }

    /// The usage reported so far.
    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// The model the stream reported.
    pub fn model(&self) -> Option<&str> {
        (!self.model.is_empty()).then_some(self.model.as_str())
    }

    /// Whether the stream has ended (`message_stop` or an error).
    pub fn is_done(&self) -> bool {
        self.done
    }

    fn chunk(&self, delta: Value, finish: Value) -> String {
        let c = json!({
            "id": self.id, "object": "chat.completion.chunk", "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        });
        format!("data: {c}\n\n")
    }

    /// The OpenAI SSE bytes for one Anthropic event's `data` payload (possibly none).
    pub fn translate(&mut self, data: &[u8]) -> String {
        let Ok(event) = serde_json::from_slice::<Value>(data) else {
            return String::new();
        };
        match event["type"].as_str() {
            Some("message_start") => {
                let m = &event["message"];
                self.id = m["id"].as_str().unwrap_or_default().to_owned();
                self.model = m["model"].as_str().unwrap_or_default().to_owned();
                self.usage = usage_of(&m["usage"]);
                self.chunk(json!({"role": "assistant", "content": ""}), Value::Null)
            }
            Some("content_block_start") => {
                let block = &event["content_block"];
                if block["type"] == "tool_use" {
                    let index = self.tools;
                    self.tools += 1;
                    self.tool_index
                        .push((event["index"].as_u64().unwrap_or(0), index));
                    self.chunk(
                        json!({"tool_calls": [{"index": index, "id": block["id"], "type": "function",
                                "function": {"name": block["name"], "arguments": ""}}]}),
                        Value::Null,
                    )
                } else {
                    String::new()
                }
            }
            Some("content_block_delta") => {
                let delta = &event["delta"];
                match delta["type"].as_str() {
                    Some("text_delta") => self.chunk(json!({"content": delta["text"]}), Value::Null),
                    Some("input_json_delta") => {
                        let block = event["index"].as_u64().unwrap_or(0);
                        let index = self
                            .tool_index
                            .iter()
                            .find(|(b, _)| *b == block)
                            .map_or(0, |(_, i)| *i);
                        self.chunk(
                            json!({"tool_calls": [{"index": index, "function": {"arguments": delta["partial_json"]}}]}),
                            Value::Null,
                        )
                    }
                    Some("thinking_delta") if !self.strict => self.chunk(
                        json!({"content_blocks": [{"index": event["index"], "delta": {"thinking": delta["thinking"]}}]}),
                        Value::Null,
                    ),
                    _ => String::new(),
                }
            }
            Some("message_delta") => {
                if let Some(out) = event["usage"]["output_tokens"].as_u64() {
                    self.usage.completion_tokens = out;
                }
                self.finish = Some(finish_reason(event["delta"]["stop_reason"].as_str()));
                String::new()
            }
            Some("message_stop") => {
                self.done = true;
                let mut out = self.chunk(json!({}), self.finish.clone().unwrap_or(json!("stop")));
                if self.include_usage {
                    let u = json!({
                        "id": self.id, "object": "chat.completion.chunk", "created": self.created,
                        "model": self.model, "choices": [],
                        "usage": {"prompt_tokens": self.usage.prompt_tokens,
                                  "completion_tokens": self.usage.completion_tokens,
                                  "total_tokens": self.usage.total()},
                    });
                    out.push_str(&format!("data: {u}\n\n"));
                }
                out.push_str("data: [DONE]\n\n");
                out
            }
            Some("error") => {
                self.done = true;
                let message = event["error"]["message"].as_str().unwrap_or("stream error");
                let e = json!({"error": {"message": format!("anthropic error: {message}"),
                    "type": event["error"]["type"], "param": null, "code": null}});
                format!("data: {e}\n\n")
            }
            _ => String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sse::{event_data, EventSplitter};
    use plugin_sdk::llm::LlmRequest;
    use plugin_sdk::Route;

    fn chat(body: Value) -> ChatRequest {
        match LlmRequest::decode(Route::ChatCompletions, body.to_string().as_bytes()).unwrap() {
            LlmRequest::Chat(c) => *c,
            _ => unreachable!("a chat route decodes to a chat request"),
        }
    }

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
        let (body, usage) = decode_chat(answer.to_string().as_bytes(), false).unwrap();
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
        let (strict, _) = decode_chat(answer.to_string().as_bytes(), true).unwrap();
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
            let (b, _) = decode_chat(a.to_string().as_bytes(), false).unwrap();
            assert_eq!(
                serde_json::from_slice::<Value>(&b).unwrap()["choices"][0]["finish_reason"],
                want
            );
        }
        let err = decode_chat(b"<html>", false).unwrap_err();
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
        let mut splitter = EventSplitter::default();
        let mut t = StreamTranslator::new(true, false);
        let mut out = String::new();
        for read in reads {
            for data in event_data(&splitter.push(read)) {
                out.push_str(&t.translate(&data));
            }
        }
        (out, t.usage())
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
            s.replace(&format!("\"created\":{}", now_secs()), "")
                .replace(&format!("\"created\":{}", now_secs() - 1), "")
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
        let mut t = StreamTranslator::new(false, false);
        let out = t.translate(
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        );
        assert!(t.is_done());
        let e: Value = serde_json::from_str(out.trim().strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(e["error"]["message"], "anthropic error: Overloaded");
        assert_eq!(e["error"]["type"], "overloaded_error");
    }
}
