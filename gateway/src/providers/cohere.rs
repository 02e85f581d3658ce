//! Cohere v2 Chat and Embed APIs: requests encoded from the canonical (OpenAI) chat and
//! embeddings requests, answers and event streams decoded back into OpenAI's shapes.
//!
//! Chat (`POST /chat`): roles keep their names (`developer` becomes `system`, the deprecated
//! `function` role becomes `tool`); user content parts keep OpenAI's `text` / `image_url`
//! shapes; assistant `tool_calls` and tool messages keep OpenAI's shapes, which Cohere v2
//! takes as they are, except that text beside tool calls travels as the `tool_plan`.
//! `tool_choice`: `required` -> `REQUIRED`, `none` -> `NONE`, `auto` -> omitted, a named
//! function -> only that tool in `tools` and `REQUIRED`. `top_p` -> `p`, `stop` ->
//! `stop_sequences`, `max_completion_tokens` -> `max_tokens`, `response_format` `json_object`
//! -> `{"type": "json_object"}` and `json_schema` -> `{"type": "json_object", "json_schema":
//! <schema>}`. OpenAI-only fields (`n`, `logit_bias`, `logprobs`, `user`,
//! `parallel_tool_calls`...) are dropped.
//!
//! Finish reasons: `COMPLETE`/`STOP_SEQUENCE` -> `stop`, `MAX_TOKENS` -> `length`,
//! `TOOL_CALL` -> `tool_calls`, `ERROR_TOXIC` -> `content_filter`, `ERROR` -> `stop` (OpenAI has
//! no error finish reason: what was generated is kept), anything else lower-cased, none ->
//! `stop`. Usage is read from `usage.tokens`, else `usage.billed_units`. Cohere names no model
//! in its answers: they carry the model of the request. The `tool_plan` of an answer is not
//! passed on (OpenAI has no place for it).
//!
//! Embeddings (`POST /embed`): `input` -> `texts` with `input_type: "search_document"` and
//! `embedding_types: ["float"]`, `dimensions` -> `output_dimension`. Token-array inputs are
//! refused with a 400: Cohere embeds text only. (`encoding_format: "base64"` is served by the
//! dispatch in `providers`, which re-encodes the float vectors of every translated format.)

use bytes::Bytes;
use serde_json::{json, Map, Value};

use plugin_sdk::llm::chat::{ChatRequest, ContentPart, Message, MessageContent, ToolChoice};
use plugin_sdk::llm::embeddings::EmbeddingsRequest;
use plugin_sdk::llm::LlmRequest;
use plugin_sdk::{GatewayError, Route, Usage};

use super::chunks::{self, ChunkWriter};
use super::request::{self, Sampling};
use super::{
    CallInfo, Decoded, Encoded, EventTranslator, Outgoing, SseDecoder, StreamDecoder, WireFormat,
};

/// The `input_type` of every embed request: OpenAI's embeddings API has no notion of query
/// versus document, and documents are what most embeddings are made of.
pub const EMBED_INPUT_TYPE: &str = "search_document";

/// The provider's name in messages.
const PROVIDER: &str = "cohere";

/// The sampling fields Cohere's chat takes, under its names.
const SAMPLING: &[(Sampling, &str)] = &[
    (Sampling::MaxTokens, "max_tokens"),
    (Sampling::Temperature, "temperature"),
    (Sampling::TopP, "p"),
    (Sampling::Stop, "stop_sequences"),
    (Sampling::Seed, "seed"),
    (Sampling::FrequencyPenalty, "frequency_penalty"),
    (Sampling::PresencePenalty, "presence_penalty"),
];

/// Encodes a chat or embeddings request; any other route is refused with a 400.
pub fn encode(out: &Outgoing<'_>) -> Result<Encoded, GatewayError> {
    let (body, path) = match (out.route, out.request) {
        (Route::ChatCompletions, LlmRequest::Chat(req)) => {
            (encode_chat(req, out.model(), out.stream())?, "/chat")
        }
        (Route::Embeddings, LlmRequest::Embeddings(req)) => {
            (encode_embed(req, out.model())?, "/embed")
        }
        (route, _) => {
            return Err(GatewayError::invalid(format!(
                "cohere does not serve {}",
                route.as_str()
            )))
        }
    };
    Ok(Encoded::new(
        request::json_body(&body, PROVIDER)?,
        path,
        WireFormat::Cohere,
    ))
}

/// Decodes a whole 2xx chat or embed answer into OpenAI's shape.
pub fn decode(call: &CallInfo, body: &[u8]) -> Result<Decoded, GatewayError> {
    let answer: Value =
        serde_json::from_slice(body).map_err(|e| chunks::bad_answer(PROVIDER, e))?;
    let (body, usage) = match call.route {
        Route::ChatCompletions => decode_chat(&answer, &call.model)?,
        Route::Embeddings => decode_embed(&answer, &call.model)?,
        other => {
            return Err(GatewayError::internal(format!(
                "cohere answers are not decoded for {}",
                other.as_str()
            )))
        }
    };
    Ok(Decoded {
        provisioned: false,
        body,
        model: call.named_model(),
        usage: Some(usage),
    })
}

/// The translator of a 2xx chat answer stream (server-sent events).
pub fn stream(call: &CallInfo) -> Box<dyn StreamDecoder> {
    Box::new(SseDecoder::new(CohereEvents::new(call)))
}

// ---------------------------------------------------------------------------------------------
// Chat requests

fn encode_chat(req: &ChatRequest, model: &str, stream: bool) -> Result<Value, GatewayError> {
    let messages = req
        .messages
        .iter()
        .enumerate()
        .map(|(i, m)| encode_message(m, i))
        .collect::<Result<Vec<_>, _>>()?;
    let mut body = Map::new();
    body.insert("model".into(), json!(model));
    body.insert("messages".into(), Value::Array(messages));
    if let Some(tools) = &req.tools {
        let mut tools: Vec<_> = tools.iter().collect();
        if let Some(ToolChoice::Named(named)) = &req.tool_choice {
            // Cohere cannot be told which tool to call: offering only that one and requiring a
            // call comes to the same.
            tools.retain(|t| t.function.name == named.function.name);
            if tools.is_empty() {
                return Err(GatewayError::invalid_param(
                    "tool_choice.function.name",
                    format!(
                        "tool_choice names {:?}, which is not in tools",
                        named.function.name
                    ),
                ));
            }
        }
        if !tools.is_empty() && tools.iter().all(|t| t.function.strict == Some(true)) {
            body.insert("strict_tools".into(), json!(true));
        }
        let tools: Vec<Value> = tools
            .iter()
            .map(|t| {
                let mut function = json!({
                    "name": t.function.name,
                    "parameters": t.function.parameters.clone()
                        .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
                });
                if let Some(d) = &t.function.description {
                    function["description"] = json!(d);
                }
                json!({"type": "function", "function": function})
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    match &req.tool_choice {
        Some(ToolChoice::Mode(m)) if m == "required" => {
            body.insert("tool_choice".into(), json!("REQUIRED"));
        }
        Some(ToolChoice::Mode(m)) if m == "none" => {
            body.insert("tool_choice".into(), json!("NONE"));
        }
        Some(ToolChoice::Named(_)) => {
            if req.tools.is_none() {
                return Err(GatewayError::invalid_param(
                    "tool_choice",
                    "tool_choice names a function but the request has no tools",
                ));
            }
            body.insert("tool_choice".into(), json!("REQUIRED"));
        }
        // `auto` is Cohere's behaviour when tool_choice is absent.
        _ => {}
    }
    request::put_sampling(&mut body, req, SAMPLING);
    if let Some(format) = &req.response_format {
        if let Some(mapped) = response_format(format)? {
            body.insert("response_format".into(), mapped);
        }
    }
    if stream {
        body.insert("stream".into(), json!(true));
    }
    Ok(Value::Object(body))
}

/// Cohere's `response_format` for OpenAI's; `None` for plain text (Cohere's default).
fn response_format(format: &Value) -> Result<Option<Value>, GatewayError> {
    match format["type"].as_str() {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let schema = format["json_schema"]
                .get("schema")
                .filter(|s| s.is_object())
                .ok_or_else(|| {
                    GatewayError::invalid_param(
                        "response_format.json_schema.schema",
                        "a json_schema response format needs a schema object",
                    )
                })?;
            Ok(Some(json!({"type": "json_object", "json_schema": schema})))
        }
        other => Err(GatewayError::invalid_param(
            "response_format.type",
            format!("response_format.type must be text, json_object or json_schema, got {other:?}"),
        )),
    }
}

fn encode_message(m: &Message, i: usize) -> Result<Value, GatewayError> {
    match m.role.as_str() {
        "system" | "developer" => Ok(json!({
            "role": "system",
            "content": plain_text(m.content.as_ref(), i)?,
        })),
        "user" => {
            let content = match &m.content {
                None => json!(""),
                Some(MessageContent::Text(t)) => json!(t),
                Some(MessageContent::Parts(parts)) => Value::Array(
                    parts
                        .iter()
                        .enumerate()
                        .map(|(j, p)| user_part(p, i, j))
                        .collect::<Result<_, _>>()?,
                ),
            };
            Ok(json!({"role": "user", "content": content}))
        }
        "assistant" => {
            let text = plain_text(m.content.as_ref(), i)?;
            let calls: Vec<Value> = m
                .tool_calls
                .iter()
                .flatten()
                .enumerate()
                .map(|(k, call)| {
                    // Cohere requires an id to pair the call with its result.
                    let id = call.id.clone().unwrap_or_else(|| format!("call_{i}_{k}"));
                    chunks::tool_call(&id, &call.function.name, call.function.arguments.clone())
                })
                .collect();
            let mut message = json!({"role": "assistant"});
            if calls.is_empty() {
                message["content"] = json!(text);
            } else {
                // Text before tool calls is what Cohere calls the tool plan.
                if !text.is_empty() {
                    message["tool_plan"] = json!(text);
                }
                message["tool_calls"] = Value::Array(calls);
            }
            Ok(message)
        }
        "tool" | "function" => {
            let id = request::answered_call_id(m, i)?;
            Ok(json!({
                "role": "tool",
                "tool_call_id": id,
                "content": plain_text(m.content.as_ref(), i)?,
            }))
        }
        other => Err(GatewayError::invalid_param(
            format!("messages[{i}].role"),
            format!("cohere does not take messages with the role {other:?}"),
        )),
    }
}

/// The text of a message that Cohere takes as text only; an image there is refused.
fn plain_text(content: Option<&MessageContent>, i: usize) -> Result<String, GatewayError> {
    if let Some(MessageContent::Parts(parts)) = content {
        if let Some(j) = parts.iter().position(|p| p.kind != "text") {
            return Err(GatewayError::invalid_param(
                format!("messages[{i}].content[{j}].type"),
                format!(
                    "cohere takes only text parts outside user messages, got {:?}",
                    parts[j].kind
                ),
            ));
        }
    }
    Ok(content.map(MessageContent::text).unwrap_or_default())
}

fn user_part(part: &ContentPart, i: usize, j: usize) -> Result<Value, GatewayError> {
    match part.kind.as_str() {
        "text" => Ok(json!({"type": "text", "text": part.text.clone().unwrap_or_default()})),
        "image_url" => {
            let url = request::image_url(part);
            if url.is_empty() {
                return Err(GatewayError::invalid_param(
                    format!("messages[{i}].content[{j}].image_url.url"),
                    "an image_url part needs a url (https or data URL)",
                ));
            }
            let mut image_url = json!({"url": url});
            let detail = part.image_url.as_ref().and_then(|v| v.get("detail"));
            if let Some(detail) = detail.and_then(Value::as_str) {
                image_url["detail"] = json!(detail);
            }
            Ok(json!({"type": "image_url", "image_url": image_url}))
        }
        other => Err(GatewayError::invalid_param(
            format!("messages[{i}].content[{j}].type"),
            format!("cohere does not take content parts of type {other:?}"),
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// Chat answers

/// OpenAI's finish reason for Cohere's.
fn finish_reason(reason: Option<&str>) -> String {
    match reason {
        None | Some("COMPLETE" | "STOP_SEQUENCE" | "ERROR") => "stop".into(),
        Some("MAX_TOKENS") => "length".into(),
        Some("TOOL_CALL") => "tool_calls".into(),
        Some("ERROR_TOXIC") => "content_filter".into(),
        Some(other) => other.to_ascii_lowercase(),
    }
}

/// A token count; Cohere's billed units may be written as floats (`12.0`).
fn count(v: &Value) -> u64 {
    v.as_u64()
        .or_else(|| v.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64))
        .unwrap_or(0)
}

/// The usage of a chat answer's (or `message-end`'s) `usage`: `tokens`, else `billed_units`.
fn chat_usage(usage: &Value) -> Usage {
    let counts = if usage["tokens"].is_object() {
        &usage["tokens"]
    } else {
        &usage["billed_units"]
    };
    Usage {
        prompt_tokens: count(&counts["input_tokens"]),
        completion_tokens: count(&counts["output_tokens"]),
    }
}

fn decode_chat(answer: &Value, model: &str) -> Result<(Bytes, Usage), GatewayError> {
    let message = answer
        .get("message")
        .filter(|m| m.is_object())
        .ok_or_else(|| chunks::bad_answer(PROVIDER, "a chat answer without a message"))?;
    let mut text = String::new();
    match &message["content"] {
        Value::Null => {}
        // Some answers carry the text itself rather than a list of items.
        Value::String(s) => text.push_str(s),
        Value::Array(items) => {
            for item in items.iter().filter(|c| c["type"] == "text") {
                text.push_str(item["text"].as_str().unwrap_or_default());
            }
        }
        _ => {
            return Err(chunks::bad_answer(
                PROVIDER,
                "message.content is not a list",
            ))
        }
    }
    let mut calls = Vec::new();
    match &message["tool_calls"] {
        Value::Null => {}
        Value::Array(items) => {
            for (k, call) in items.iter().enumerate() {
                let name = call["function"]["name"].as_str().ok_or_else(|| {
                    chunks::bad_answer(PROVIDER, format!("tool call {k} has no function name"))
                })?;
                let id = call["id"].as_str().unwrap_or_default();
                calls.push(chunks::tool_call(id, name, arguments(&call["function"])));
            }
        }
        _ => {
            return Err(chunks::bad_answer(
                PROVIDER,
                "message.tool_calls is not a list",
            ))
        }
    }
    let usage = chat_usage(&answer["usage"]);
    let finish = finish_reason(answer["finish_reason"].as_str());
    let body = chunks::completion(
        answer["id"].as_str().unwrap_or_default(),
        model,
        chunks::assistant_message(text, calls),
        json!(finish),
        usage,
    );
    Ok((body, usage))
}

/// A function's `arguments` as the JSON text OpenAI carries; an object is written out.
fn arguments(function: &Value) -> String {
    match &function["arguments"] {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// Chat streams

/// Translates Cohere's chat event stream into OpenAI chunks, one event at a time.
struct CohereEvents {
    writer: ChunkWriter,
    /// Cohere's tool-call `index` -> OpenAI's tool index, in the order the calls started.
    tools: Vec<(Option<u64>, usize)>,
    usage: Option<Usage>,
}

impl CohereEvents {
    fn new(call: &CallInfo) -> Self {
        CohereEvents {
            writer: ChunkWriter::new("", call.model.clone(), call.include_usage),
            tools: Vec::new(),
            usage: None,
        }
    }

    /// The OpenAI index of the tool call an event is about: the one with its `index`, else the
    /// last started.
    fn tool_index(&self, event: &Value) -> Option<usize> {
        let index = event["index"].as_u64();
        self.tools
            .iter()
            .rev()
            .find(|(i, _)| index.is_none() || *i == index)
            .or(self.tools.last())
            .map(|(_, k)| *k)
    }
}

/// The tool call of a `tool-call-*` event: an object, or a list holding one.
fn event_tool_call(event: &Value) -> &Value {
    let calls = &event["delta"]["message"]["tool_calls"];
    match calls {
        Value::Array(items) => items.first().unwrap_or(&Value::Null),
        _ => calls,
    }
}

impl EventTranslator for CohereEvents {
    fn event(&mut self, data: &[u8], out: &mut String) {
        if self.writer.ended() {
            return;
        }
        // Anything that is not a JSON event (a keep-alive, a `[DONE]`) is skipped.
        let Ok(event) = serde_json::from_slice::<Value>(data) else {
            return;
        };
        match event["type"].as_str() {
            Some("message-start") => {
                if let Some(id) = event["id"].as_str() {
                    self.writer.id = id.to_owned();
                }
                self.writer.role(out);
            }
            Some("content-delta") => {
                let text = event["delta"]["message"]["content"]["text"]
                    .as_str()
                    .unwrap_or_default();
                self.writer.text(text, out);
            }
            Some("tool-call-start") => {
                let call = event_tool_call(&event);
                let index = self.tools.len();
                self.tools.push((event["index"].as_u64(), index));
                let id = call["id"]
                    .as_str()
                    .map_or_else(|| format!("call_{index}"), str::to_owned);
                let name = call["function"]["name"].as_str().unwrap_or_default();
                self.writer.tool_start(index, &id, name, out);
                self.writer
                    .tool_arguments(index, &arguments(&call["function"]), out);
            }
            Some("tool-call-delta") => {
                // Arguments before any tool-call-start have no call to belong to.
                if let Some(index) = self.tool_index(&event) {
                    let call = event_tool_call(&event);
                    self.writer
                        .tool_arguments(index, &arguments(&call["function"]), out);
                }
            }
            Some("message-end") => {
                let delta = &event["delta"];
                let usage = chat_usage(&delta["usage"]);
                self.usage = Some(usage);
                let finish = finish_reason(delta["finish_reason"].as_str());
                self.writer.end(&finish, usage, out);
            }
            // content-start/-end, tool-plan-delta, tool-call-end, citations, debug...
            _ => {}
        }
    }

    fn end(&mut self, out: &mut String) {
        // A stream cut off before message-end still ends in OpenAI's way.
        let usage = self.usage.unwrap_or_default();
        self.writer.end("stop", usage, out);
    }

    fn usage(&self) -> Option<Usage> {
        self.usage
    }

    fn model(&self) -> Option<&str> {
        self.writer.known_model()
    }
}

// ---------------------------------------------------------------------------------------------
// Embeddings

fn encode_embed(req: &EmbeddingsRequest, model: &str) -> Result<Value, GatewayError> {
    let texts = request::embedding_texts(&req.input, PROVIDER)?;
    let mut body = json!({
        "model": model,
        "texts": texts,
        "input_type": EMBED_INPUT_TYPE,
        "embedding_types": ["float"],
    });
    if let Some(d) = req.dimensions {
        body["output_dimension"] = json!(d);
    }
    Ok(body)
}

fn decode_embed(answer: &Value, model: &str) -> Result<(Bytes, Usage), GatewayError> {
    let vectors = answer["embeddings"]["float"]
        .as_array()
        .ok_or_else(|| chunks::bad_answer(PROVIDER, "an embed answer without embeddings.float"))?;
    if let Some(k) = vectors.iter().position(|v| !v.is_array()) {
        return Err(chunks::bad_answer(
            PROVIDER,
            format!("embedding {k} is not a list of numbers"),
        ));
    }
    let usage = Usage {
        prompt_tokens: count(&answer["meta"]["billed_units"]["input_tokens"]),
        completion_tokens: 0,
    };
    Ok((chunks::embeddings(model, vectors.clone(), usage), usage))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::testing;

    fn try_encode(route: Route, body: Value) -> Result<Encoded, GatewayError> {
        testing::encode("cohere", route, &body, &[])
    }

    fn encode_chat_body(body: Value) -> Value {
        let encoded = try_encode(Route::ChatCompletions, body).unwrap();
        assert_eq!(encoded.path, "/chat");
        assert_eq!(encoded.answer_format, WireFormat::Cohere);
        serde_json::from_slice(&encoded.body).unwrap()
    }

    fn param_of(route: Route, body: Value) -> String {
        let e = try_encode(route, body).unwrap_err();
        assert_eq!(e.status().as_u16(), 400);
        e.param.unwrap_or_default()
    }

    fn call(route: Route, include_usage: bool) -> CallInfo {
        CallInfo {
            provider: "cohere",
            format: WireFormat::Cohere,
            route,
            model: "command-a".into(),
            include_usage,
            hidden_usage: false,
            base64_embeddings: false,
            strict: false,
            waive_provisioned_cost: false,
        }
    }

    fn decode_json(route: Route, answer: &Value) -> (Value, Decoded) {
        let decoded = decode(&call(route, false), answer.to_string().as_bytes()).unwrap();
        (serde_json::from_slice(&decoded.body).unwrap(), decoded)
    }

    #[test]
    fn chat_requests_map_roles_images_tools_and_results() {
        let body = encode_chat_body(json!({
            "model": "command-a",
            "messages": [
                {"role": "developer", "content": "be brief"},
                {"role": "system", "content": [{"type": "text", "text": "and kind"}]},
                {"role": "user", "content": [{"type": "text", "text": "look"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}}]},
                {"role": "assistant", "content": "let me check", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get", "arguments": "{\"q\":1}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "42"},
                {"role": "assistant", "content": "It is 42."},
                {"role": "user", "content": "thanks"}
            ],
            "tools": [{"type": "function", "function": {"name": "get", "description": "gets",
                "parameters": {"type": "object", "properties": {"q": {"type": "integer"}}}}}]
        }));
        assert_eq!(body["model"], "command-a");
        let msgs = body["messages"].as_array().unwrap();
        assert_eq!(msgs.len(), 7);
        assert_eq!(msgs[0], json!({"role": "system", "content": "be brief"}));
        assert_eq!(msgs[1], json!({"role": "system", "content": "and kind"}));
        assert_eq!(
            msgs[2]["content"],
            json!([{"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}}])
        );
        assert_eq!(
            msgs[3],
            json!({"role": "assistant", "tool_plan": "let me check", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get", "arguments": "{\"q\":1}"}}]})
        );
        assert_eq!(
            msgs[4],
            json!({"role": "tool", "tool_call_id": "call_1", "content": "42"})
        );
        assert_eq!(
            msgs[5],
            json!({"role": "assistant", "content": "It is 42."})
        );
        assert_eq!(msgs[6], json!({"role": "user", "content": "thanks"}));
        assert_eq!(
            body["tools"],
            json!([{"type": "function", "function": {"name": "get", "description": "gets",
                "parameters": {"type": "object", "properties": {"q": {"type": "integer"}}}}}])
        );
        assert!(body.get("tool_choice").is_none());
        assert!(body.get("stream").is_none());
        assert!(body.get("strict_tools").is_none());
    }

    #[test]
    fn tool_calls_without_ids_get_one_and_bad_parts_are_named() {
        let body = encode_chat_body(json!({"messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
            {"role": "function", "name": "f", "content": "ok"}
        ]}));
        assert_eq!(body["messages"][1]["tool_calls"][0]["id"], "call_1_0");
        assert!(body["messages"][1].get("content").is_none());
        assert_eq!(body["messages"][2]["tool_call_id"], "f");
        assert_eq!(body["messages"][2]["role"], "tool");
        assert_eq!(
            param_of(
                Route::ChatCompletions,
                json!({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]})
            ),
            "messages[0].content[0].type"
        );
        assert_eq!(
            param_of(
                Route::ChatCompletions,
                json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})
            ),
            "messages[0].content[0].image_url.url"
        );
        assert_eq!(
            param_of(
                Route::ChatCompletions,
                json!({"messages": [{"role": "system", "content": [
                    {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}]})
            ),
            "messages[0].content[0].type"
        );
        assert_eq!(
            param_of(
                Route::ChatCompletions,
                json!({"messages": [{"role": "tool", "content": "orphan"}]})
            ),
            "messages[0].tool_call_id"
        );
    }

    #[test]
    fn tool_choice_maps_each_case() {
        let tools = json!([
            {"type": "function", "function": {"name": "a", "strict": true}},
            {"type": "function", "function": {"name": "b", "strict": true}}
        ]);
        let with_choice = |choice: Value| {
            let mut req =
                json!({"messages": [{"role": "user", "content": "x"}], "tools": tools.clone()});
            if !choice.is_null() {
                req["tool_choice"] = choice;
            }
            req
        };
        let body = encode_chat_body(with_choice(json!("required")));
        assert_eq!(body["tool_choice"], "REQUIRED");
        assert_eq!(body["tools"].as_array().unwrap().len(), 2);
        assert_eq!(body["strict_tools"], true);
        assert_eq!(
            body["tools"][0]["function"]["parameters"],
            json!({"type": "object", "properties": {}})
        );
        assert_eq!(
            encode_chat_body(with_choice(json!("none")))["tool_choice"],
            "NONE"
        );
        assert!(encode_chat_body(with_choice(json!("auto")))
            .get("tool_choice")
            .is_none());
        assert!(encode_chat_body(with_choice(Value::Null))
            .get("tool_choice")
            .is_none());
        let named = encode_chat_body(with_choice(
            json!({"type": "function", "function": {"name": "b"}}),
        ));
        assert_eq!(named["tool_choice"], "REQUIRED");
        let names: Vec<_> = named["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["function"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["b"]);
        assert_eq!(
            param_of(
                Route::ChatCompletions,
                with_choice(json!({"type": "function", "function": {"name": "zzz"}}))
            ),
            "tool_choice.function.name"
        );
        assert_eq!(
            param_of(
                Route::ChatCompletions,
                json!({"messages": [{"role": "user", "content": "x"}],
                    "tool_choice": {"type": "function", "function": {"name": "a"}}})
            ),
            "tool_choice"
        );
    }

    #[test]
    fn parameters_are_renamed_and_openai_only_fields_dropped() {
        let body = encode_chat_body(json!({
            "model": "command-r", "messages": [{"role": "user", "content": "x"}],
            "max_completion_tokens": 100, "temperature": 0.5, "top_p": 0.9, "stop": "END",
            "seed": 7, "frequency_penalty": 0.1, "presence_penalty": 0.2,
            "response_format": {"type": "json_object"},
            "stream": true, "stream_options": {"include_usage": true},
            "n": 1, "logit_bias": {"1": 2}, "user": "u1", "logprobs": true,
            "parallel_tool_calls": false
        }));
        let want = json!({
            "model": "command-r", "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 100, "temperature": 0.5, "p": 0.9, "stop_sequences": ["END"],
            "seed": 7, "frequency_penalty": 0.1, "presence_penalty": 0.2,
            "response_format": {"type": "json_object"}, "stream": true
        });
        assert_eq!(body, want);
        let body = encode_chat_body(json!({
            "messages": [{"role": "user", "content": "x"}], "max_tokens": 5,
            "max_completion_tokens": 100, "stop": ["a", "b"],
            "response_format": {"type": "json_schema", "json_schema": {"name": "r",
                "schema": {"type": "object", "properties": {"a": {"type": "string"}}}}}
        }));
        assert_eq!(body["max_tokens"], 5);
        assert_eq!(body["stop_sequences"], json!(["a", "b"]));
        assert_eq!(
            body["response_format"],
            json!({"type": "json_object", "json_schema":
                {"type": "object", "properties": {"a": {"type": "string"}}}})
        );
        let text = encode_chat_body(json!({"messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "text"}}));
        assert!(text.get("response_format").is_none());
        assert_eq!(
            param_of(
                Route::ChatCompletions,
                json!({"messages": [{"role": "user", "content": "x"}],
                    "response_format": {"type": "json_schema", "json_schema": {"name": "r"}}})
            ),
            "response_format.json_schema.schema"
        );
        assert_eq!(
            param_of(
                Route::ChatCompletions,
                json!({"messages": [{"role": "user", "content": "x"}],
                    "response_format": {"type": "yaml"}})
            ),
            "response_format.type"
        );
    }

    #[test]
    fn other_routes_are_refused() {
        let e = try_encode(Route::Moderations, json!({"input": "x"})).unwrap_err();
        assert_eq!(e.status().as_u16(), 400);
        assert!(e.message.contains("cohere does not serve"), "{}", e.message);
    }

    #[test]
    fn chat_answers_become_completions() {
        let answer = json!({
            "id": "c-1", "finish_reason": "COMPLETE",
            "message": {"role": "assistant", "content": [
                {"type": "text", "text": "Hello "}, {"type": "thinking", "thinking": "hmm"},
                {"type": "text", "text": "there"}]},
            "usage": {"billed_units": {"input_tokens": 3.0, "output_tokens": 2.0},
                      "tokens": {"input_tokens": 10, "output_tokens": 4}}
        });
        let (out, decoded) = decode_json(Route::ChatCompletions, &answer);
        assert_eq!(out["id"], "c-1");
        assert_eq!(out["object"], "chat.completion");
        assert_eq!(out["model"], "command-a");
        assert_eq!(
            out["choices"][0]["message"],
            json!({"role": "assistant", "content": "Hello there"})
        );
        assert_eq!(out["choices"][0]["finish_reason"], "stop");
        assert_eq!(
            out["usage"],
            json!({"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14})
        );
        assert_eq!(decoded.model.as_deref(), Some("command-a"));
        assert_eq!(
            decoded.usage,
            Some(Usage {
                prompt_tokens: 10,
                completion_tokens: 4
            })
        );
        // Without `tokens`, the billed units count.
        let billed = json!({"id": "c-2", "finish_reason": "COMPLETE",
            "message": {"role": "assistant", "content": [{"type": "text", "text": "x"}]},
            "usage": {"billed_units": {"input_tokens": 3.0, "output_tokens": 2}}});
        let (out, _) = decode_json(Route::ChatCompletions, &billed);
        assert_eq!(out["usage"]["total_tokens"], 5);
    }

    #[test]
    fn tool_call_answers_and_each_finish_reason() {
        let answer = json!({
            "id": "c-3", "finish_reason": "TOOL_CALL",
            "message": {"role": "assistant", "tool_plan": "I will look it up",
                "tool_calls": [
                    {"id": "t1", "type": "function", "function": {"name": "get", "arguments": "{\"q\":1}"}},
                    {"id": "t2", "type": "function", "function": {"name": "put", "arguments": {"a": 2}}}]},
            "usage": {"tokens": {"input_tokens": 5, "output_tokens": 6}}
        });
        let (out, _) = decode_json(Route::ChatCompletions, &answer);
        let choice = &out["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls");
        assert_eq!(choice["message"]["content"], Value::Null);
        assert_eq!(
            choice["message"]["tool_calls"],
            json!([
                {"id": "t1", "type": "function", "function": {"name": "get", "arguments": "{\"q\":1}"}},
                {"id": "t2", "type": "function", "function": {"name": "put", "arguments": "{\"a\":2}"}}])
        );
        for (reason, want) in [
            (json!("COMPLETE"), "stop"),
            (json!("STOP_SEQUENCE"), "stop"),
            (json!("MAX_TOKENS"), "length"),
            (json!("TOOL_CALL"), "tool_calls"),
            (json!("ERROR"), "stop"),
            (json!("ERROR_TOXIC"), "content_filter"),
            (json!("TIMEOUT"), "timeout"),
            (Value::Null, "stop"),
        ] {
            let a = json!({"id": "c", "finish_reason": reason,
                "message": {"role": "assistant", "content": [{"type": "text", "text": "t"}]}});
            let (out, decoded) = decode_json(Route::ChatCompletions, &a);
            assert_eq!(out["choices"][0]["finish_reason"], want, "{reason}");
            assert_eq!(decoded.usage, Some(Usage::default()));
        }
    }

    #[test]
    fn malformed_answers_are_502() {
        let bad = [
            json!("<html>"),
            json!({"id": "x"}),
            json!({"message": {"content": 5}}),
            json!({"message": {"tool_calls": {"id": 1}}}),
            json!({"message": {"tool_calls": [{"id": "t", "function": {}}]}}),
        ];
        for answer in bad {
            let e = decode(
                &call(Route::ChatCompletions, false),
                answer.to_string().as_bytes(),
            )
            .unwrap_err();
            assert_eq!(e.status().as_u16(), 502, "{answer}");
        }
        let e = decode(&call(Route::ChatCompletions, false), b"not json").unwrap_err();
        assert_eq!(e.status().as_u16(), 502);
        for answer in [
            json!({"embeddings": {}}),
            json!({"embeddings": {"float": [[0.1], "x"]}}),
        ] {
            let e = decode(
                &call(Route::Embeddings, false),
                answer.to_string().as_bytes(),
            )
            .unwrap_err();
            assert_eq!(e.status().as_u16(), 502, "{answer}");
        }
    }

    #[test]
    fn embeddings_both_ways() {
        let encoded = try_encode(
            Route::Embeddings,
            json!({"model": "embed-v4.0", "input": ["a", "b"], "dimensions": 256, "user": "u"}),
        )
        .unwrap();
        assert_eq!(encoded.path, "/embed");
        let body: Value = serde_json::from_slice(&encoded.body).unwrap();
        assert_eq!(
            body,
            json!({"model": "embed-v4.0", "texts": ["a", "b"], "input_type": "search_document",
                "embedding_types": ["float"], "output_dimension": 256})
        );
        let one = try_encode(
            Route::Embeddings,
            json!({"model": "m", "input": "solo", "encoding_format": "float"}),
        )
        .unwrap();
        let one: Value = serde_json::from_slice(&one.body).unwrap();
        assert_eq!(one["texts"], json!(["solo"]));
        assert!(one.get("output_dimension").is_none());
        assert_eq!(
            param_of(Route::Embeddings, json!({"input": [1, 2, 3]})),
            "input"
        );
        assert_eq!(
            param_of(Route::Embeddings, json!({"input": [[1], [2]]})),
            "input"
        );

        let answer = json!({"id": "e-1", "response_type": "embeddings_by_type",
            "embeddings": {"float": [[0.5, -1.0], [0.25, 2.0]]}, "texts": ["a", "b"],
            "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": 4}}});
        let mut info = call(Route::Embeddings, false);
        info.model = "embed-v4.0".into();
        let decoded = decode(&info, answer.to_string().as_bytes()).unwrap();
        let out: Value = serde_json::from_slice(&decoded.body).unwrap();
        assert_eq!(
            out,
            json!({"object": "list", "model": "embed-v4.0",
                "data": [{"object": "embedding", "index": 0, "embedding": [0.5, -1.0]},
                         {"object": "embedding", "index": 1, "embedding": [0.25, 2.0]}],
                "usage": {"prompt_tokens": 4, "total_tokens": 4}})
        );
        assert_eq!(
            decoded.usage,
            Some(Usage {
                prompt_tokens: 4,
                completion_tokens: 0
            })
        );
    }

    // A stream as Cohere writes it: text, a tool plan, then a tool call whose arguments come in
    // several deltas, then a second tool call, then the end with usage.
    const STREAM: &str = concat!(
        "event: message-start\ndata: {\"id\":\"s-1\",\"type\":\"message-start\",\"delta\":{\"message\":{\"role\":\"assistant\",\"content\":[],\"tool_plan\":\"\",\"tool_calls\":[],\"citations\":[]}}}\n\n",
        "event: content-start\ndata: {\"type\":\"content-start\",\"index\":0,\"delta\":{\"message\":{\"content\":{\"type\":\"text\",\"text\":\"\"}}}}\n\n",
        "event: content-delta\ndata: {\"type\":\"content-delta\",\"index\":0,\"delta\":{\"message\":{\"content\":{\"text\":\"Hello \"}}}}\n\n",
        "event: content-delta\ndata: {\"type\":\"content-delta\",\"index\":0,\"delta\":{\"message\":{\"content\":{\"text\":\"th\u{e9}re\"}}}}\n\n",
        "event: content-end\ndata: {\"type\":\"content-end\",\"index\":0}\n\n",
        "event: tool-plan-delta\ndata: {\"type\":\"tool-plan-delta\",\"delta\":{\"message\":{\"tool_plan\":\"I will call get\"}}}\n\n",
        "event: tool-call-start\ndata: {\"type\":\"tool-call-start\",\"index\":0,\"delta\":{\"message\":{\"tool_calls\":{\"id\":\"get_1\",\"type\":\"function\",\"function\":{\"name\":\"get\",\"arguments\":\"\"}}}}}\n\n",
        "event: tool-call-delta\ndata: {\"type\":\"tool-call-delta\",\"index\":0,\"delta\":{\"message\":{\"tool_calls\":{\"function\":{\"arguments\":\"{\\\"q\\\"\"}}}}}\n\n",
        "event: tool-call-delta\ndata: {\"type\":\"tool-call-delta\",\"index\":0,\"delta\":{\"message\":{\"tool_calls\":{\"function\":{\"arguments\":\": 1\"}}}}}\n\n",
        "event: tool-call-delta\ndata: {\"type\":\"tool-call-delta\",\"index\":0,\"delta\":{\"message\":{\"tool_calls\":{\"function\":{\"arguments\":\"}\"}}}}}\n\n",
        "event: tool-call-end\ndata: {\"type\":\"tool-call-end\",\"index\":0}\n\n",
        "event: tool-call-start\ndata: {\"type\":\"tool-call-start\",\"index\":1,\"delta\":{\"message\":{\"tool_calls\":{\"id\":\"put_2\",\"type\":\"function\",\"function\":{\"name\":\"put\",\"arguments\":\"{\\\"a\\\"\"}}}}}\n\n",
        "event: tool-call-delta\ndata: {\"type\":\"tool-call-delta\",\"index\":1,\"delta\":{\"message\":{\"tool_calls\":{\"function\":{\"arguments\":\": 2}\"}}}}}\n\n",
        "event: tool-call-end\ndata: {\"type\":\"tool-call-end\",\"index\":1}\n\n",
        "event: message-end\ndata: {\"type\":\"message-end\",\"delta\":{\"finish_reason\":\"TOOL_CALL\",\"usage\":{\"billed_units\":{\"input_tokens\":9,\"output_tokens\":7},\"tokens\":{\"input_tokens\":12,\"output_tokens\":8}}}}\n\n",
    );

    fn run(reads: &[&[u8]], include_usage: bool) -> (String, Option<Usage>) {
        let mut decoder = stream(&call(Route::ChatCompletions, include_usage));
        let mut out = Vec::new();
        for read in reads {
            out.extend_from_slice(&decoder.push(read));
        }
        out.extend_from_slice(&decoder.finish());
        assert_eq!(decoder.model(), Some("command-a"));
        (String::from_utf8(out).unwrap(), decoder.usage())
    }

    fn chunks_of(out: &str) -> Vec<Value> {
        out.split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap())
            .collect()
    }

    fn tool_args(chunks: &[Value], index: u64) -> String {
        chunks
            .iter()
            .flat_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array().cloned())
            .flatten()
            .filter(|t| t["index"] == index)
            .filter_map(|t| t["function"]["arguments"].as_str().map(str::to_owned))
            .collect()
    }

    #[test]
    fn a_stream_becomes_openai_chunks() {
        let (out, usage) = run(&[STREAM.as_bytes()], true);
        assert_eq!(
            usage,
            Some(Usage {
                prompt_tokens: 12,
                completion_tokens: 8
            })
        );
        assert!(out.ends_with("data: [DONE]\n\n"));
        assert_eq!(out.matches("[DONE]").count(), 1);
        let chunks = chunks_of(&out);
        assert!(chunks.iter().all(|c| c["id"] == "s-1"
            && c["model"] == "command-a"
            && c["object"] == "chat.completion.chunk"));
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        let text: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, "Hello th\u{e9}re");
        let starts: Vec<_> = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["tool_calls"][0].get("id"))
            .map(|t| t.as_str().unwrap())
            .collect();
        assert_eq!(starts, ["get_1", "put_2"]);
        assert_eq!(tool_args(&chunks, 0), "{\"q\": 1}");
        assert_eq!(tool_args(&chunks, 1), "{\"a\": 2}");
        let finish: Vec<_> = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["finish_reason"].as_str())
            .collect();
        assert_eq!(finish, ["tool_calls"]);
        let last = chunks.last().unwrap();
        assert_eq!(last["choices"], json!([]));
        assert_eq!(
            last["usage"],
            json!({"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20})
        );
        // Without include_usage there is no usage chunk.
        let (plain, _) = run(&[STREAM.as_bytes()], false);
        assert!(chunks_of(&plain).iter().all(|c| c.get("usage").is_none()));
        assert!(plain.ends_with("data: [DONE]\n\n"));
    }

    #[test]
    fn a_text_stream_cut_short_still_ends_with_stop() {
        let cut = concat!(
            "event: message-start\ndata: {\"id\":\"s-2\",\"type\":\"message-start\",\"delta\":{\"message\":{\"role\":\"assistant\"}}}\n\n",
            "event: content-delta\ndata: {\"type\":\"content-delta\",\"index\":0,\"delta\":{\"message\":{\"content\":{\"text\":\"Hi\"}}}}\n\n",
            "event: content-delta\ndata: {\"type\":\"content-delta\",\"index\":0,\"delta\":{\"message\":{\"content\":{\"text\":\"!\"}}}}",
        );
        let (out, usage) = run(&[cut.as_bytes()], true);
        assert_eq!(usage, None);
        let chunks = chunks_of(&out);
        let text: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        // The last event had no blank line after it and still counts.
        assert_eq!(text, "Hi!");
        let finish: Vec<_> = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["finish_reason"].as_str())
            .collect();
        assert_eq!(finish, ["stop"]);
        assert_eq!(chunks.last().unwrap()["usage"]["total_tokens"], 0);
        assert!(out.ends_with("data: [DONE]\n\n"));
        // message-end with MAX_TOKENS and billed units only; events after the end are ignored.
        let ended = concat!(
            "data: {\"type\":\"content-delta\",\"delta\":{\"message\":{\"content\":{\"text\":\"a\"}}}}\n\n",
            "data: {\"type\":\"message-end\",\"delta\":{\"finish_reason\":\"MAX_TOKENS\",\"usage\":{\"billed_units\":{\"input_tokens\":2,\"output_tokens\":1}}}}\n\n",
            "data: {\"type\":\"content-delta\",\"delta\":{\"message\":{\"content\":{\"text\":\"late\"}}}}\n\n",
        );
        let (out, usage) = run(&[ended.as_bytes()], false);
        assert_eq!(
            usage,
            Some(Usage {
                prompt_tokens: 2,
                completion_tokens: 1
            })
        );
        let chunks = chunks_of(&out);
        assert!(!out.contains("late"));
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(
            chunks.last().unwrap()["choices"][0]["finish_reason"],
            "length"
        );
        assert_eq!(out.matches("[DONE]").count(), 1);
    }

    #[test]
    fn any_split_of_the_stream_gives_the_same_output() {
        let created = regex::Regex::new(r#""created":\d+"#).unwrap();
        let normalise = |s: &str| created.replace_all(s, "\"created\":0").into_owned();
        let bytes = STREAM.as_bytes();
        let (whole, whole_usage) = run(&[bytes], true);
        let whole = normalise(&whole);
        for step in 1..=bytes.len() {
            let reads: Vec<&[u8]> = bytes.chunks(step).collect();
            let (split, usage) = run(&reads, true);
            assert_eq!(normalise(&split), whole, "reads of {step} bytes");
            assert_eq!(usage, whole_usage);
        }
        // Uneven reads, sizes drawn from a fixed pseudo-random sequence.
        for seed in 1..=50u64 {
            let mut state = seed;
            let mut reads = Vec::new();
            let mut rest = bytes;
            while !rest.is_empty() {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                let size = ((state >> 33) % 97 + 1) as usize;
                let (read, tail) = rest.split_at(size.min(rest.len()));
                reads.push(read);
                rest = tail;
            }
            let (split, _) = run(&reads, true);
            assert_eq!(normalise(&split), whole, "uneven reads, seed {seed}");
        }
    }
}
