//! Google's Gemini API and Vertex AI: chat requests encoded into `generateContent`, embeddings
//! into `batchEmbedContents` (Gemini API) or `predict` (Vertex AI), and the answers — whole or
//! streamed with `alt=sse` — decoded back into OpenAI's shapes.
//!
//! Paths: the Gemini API (`google`) takes `/models/{model}:generateContent`; Vertex AI
//! (`vertex-ai`) takes the same under `/projects/{vertex_project_id}/locations/{vertex_region}/
//! publishers/google`. Vertex AI also hosts Anthropic's models: a `claude...` model is sent in
//! Anthropic's format to `publishers/anthropic/models/{model}:rawPredict` and its answer is
//! decoded by the Anthropic codec.
//!
//! Request mapping: system and developer messages become `systemInstruction`; user turns keep
//! the role `user`, assistant turns become `model`; images become `inlineData` (data URLs) or
//! `fileData` (other URLs); assistant tool calls become `functionCall` parts and tool messages
//! `functionResponse` parts of a user turn, named after the call they answer; consecutive turns
//! of one role are merged, as Gemini wants the roles to alternate. Sampling fields go into
//! `generationConfig`; a `json_schema` response format is sent as `responseJsonSchema` (Gemini's
//! field that takes JSON Schema as written, unlike `responseSchema`'s OpenAPI subset).
//!
//! Answer mapping: the first candidate's text parts are joined into `content` and its
//! `functionCall` parts become `tool_calls`. Finish reasons: `STOP` -> `stop` (`tool_calls` when
//! the answer calls functions), `MAX_TOKENS` -> `length`, the safety and policy blocks ->
//! `content_filter`, anything else -> `stop`. Thought parts are left out.

use bytes::Bytes;
use serde_json::{json, Map, Value};

use plugin_sdk::llm::chat::{ChatRequest, ContentPart, Message, MessageContent, ToolChoice};
use plugin_sdk::llm::embeddings::EmbeddingsRequest;
use plugin_sdk::llm::LlmRequest;
use plugin_sdk::{GatewayError, Route, Usage};

use super::chunks::{self, ChunkWriter};
use super::request::{self, push_turn, Sampling};
use super::{
    anthropic, is_path_safe, vertex_location, CallInfo, Decoded, Encoded, EventTranslator,
    Outgoing, SseDecoder, StreamDecoder, WireFormat,
};

/// The mime type of an image URL whose extension says nothing known.
const DEFAULT_IMAGE_MIME: &str = "image/jpeg";

/// The sampling fields `generationConfig` takes, under Gemini's names.
const SAMPLING: &[(Sampling, &str)] = &[
    (Sampling::Temperature, "temperature"),
    (Sampling::TopP, "topP"),
    (Sampling::MaxTokens, "maxOutputTokens"),
    (Sampling::Stop, "stopSequences"),
    (Sampling::N, "candidateCount"),
    (Sampling::Seed, "seed"),
    (Sampling::PresencePenalty, "presencePenalty"),
    (Sampling::FrequencyPenalty, "frequencyPenalty"),
];

/// Encodes a chat or embeddings request for the Gemini API or Vertex AI; other routes are a 400.
pub fn encode(out: &Outgoing<'_>) -> Result<Encoded, GatewayError> {
    let provider = out.spec.id;
    let vertex = provider == "vertex-ai";
    // Vertex AI addresses models under the project and region; the Gemini API does not.
    let base = || {
        if vertex {
            vertex_location(out.target)
        } else {
            Ok(String::new())
        }
    };
    match (out.route, out.request) {
        (Route::ChatCompletions, LlmRequest::Chat(chat)) => {
            let base = base()?;
            let model = model_name(out.model(), provider)?;
            let stream = out.stream();
            if vertex && model.starts_with("claude") {
                let body = anthropic::encode_for_cloud(chat, anthropic::VERTEX_VERSION)?;
                return Ok(Encoded::new(
                    body,
                    anthropic::vertex_path(&base, model, stream),
                    WireFormat::Anthropic,
                ));
            }
            let publisher = if vertex { "/publishers/google" } else { "" };
            let method = if stream {
                "streamGenerateContent"
            } else {
                "generateContent"
            };
            let mut encoded = Encoded::new(
                encode_chat(chat)?,
                format!("{base}{publisher}/models/{model}:{method}"),
                WireFormat::Gemini,
            );
            if stream {
                encoded.query = Some("alt=sse".to_owned());
            }
            Ok(encoded)
        }
        (Route::Embeddings, LlmRequest::Embeddings(req)) => {
            let base = base()?;
            let model = model_name(out.model(), provider)?;
            let texts = request::embedding_texts(&req.input, provider)?;
            let (body, path) = if vertex {
                (
                    vertex_embeddings_body(req, &texts),
                    format!("{base}/publishers/google/models/{model}:predict"),
                )
            } else {
                (
                    google_embeddings_body(req, &texts, model),
                    format!("/models/{model}:batchEmbedContents"),
                )
            };
            Ok(Encoded::new(
                request::json_body(&body, "gemini")?,
                path,
                WireFormat::Gemini,
            ))
        }
        (Route::ChatCompletions | Route::Embeddings, _) => Err(GatewayError::internal(format!(
            "the {} request reached the {provider} codec without its decoded body",
            out.route.as_str()
        ))),
        (route, _) => Err(GatewayError::invalid(format!(
            "{provider} does not serve the {} route",
            route.as_str()
        ))),
    }
}

/// The model as it goes into the path: without a leading `models/`, and only of characters that
/// cannot change the path (the model comes from the client).
fn model_name<'a>(model: &'a str, provider: &str) -> Result<&'a str, GatewayError> {
    let model = model.strip_prefix("models/").unwrap_or(model);
    if model.is_empty() {
        return Err(GatewayError::invalid_param(
            "model",
            format!("{provider} needs a model"),
        ));
    }
    // `@` appears in Vertex AI's versioned model ids (`claude-...@20240620`).
    if !model.split('@').all(is_path_safe) {
        return Err(GatewayError::invalid_param(
            "model",
            format!("{provider} model names hold only letters, digits, '-', '_', '.' and '@', got {model:?}"),
        ));
    }
    Ok(model)
}

/// The `generateContent` body for a chat request.
fn encode_chat(req: &ChatRequest) -> Result<Bytes, GatewayError> {
    let mut system: Vec<Value> = Vec::new();
    let mut contents: Vec<Value> = Vec::new();
    for (i, m) in req.messages.iter().enumerate() {
        match m.role.as_str() {
            "system" | "developer" => {
                let text = m.content.as_ref().map(MessageContent::text);
                if let Some(text) = text.filter(|t| !t.is_empty()) {
                    system.push(json!({"text": text}));
                }
            }
            "user" => push_turn(
                &mut contents,
                "user",
                "parts",
                content_parts(m.content.as_ref(), i)?,
            ),
            "assistant" => {
                let mut parts = content_parts(m.content.as_ref(), i)?;
                for call in m.tool_calls.iter().flatten() {
                    let args = request::arguments_object(&call.function.arguments);
                    parts.push(json!({"functionCall": {"name": call.function.name, "args": args}}));
                }
                push_turn(&mut contents, "model", "parts", parts);
            }
            "tool" | "function" => {
                let name = function_name(&req.messages[..i], m, i)?;
                let text = m
                    .content
                    .as_ref()
                    .map(MessageContent::text)
                    .unwrap_or_default();
                // Gemini's `response` must be an object: a JSON object result goes as is.
                let response = match serde_json::from_str::<Value>(&text) {
                    Ok(v @ Value::Object(_)) => v,
                    _ => json!({"content": text}),
                };
                push_turn(
                    &mut contents,
                    "user",
                    "parts",
                    vec![json!({"functionResponse": {"name": name, "response": response}})],
                );
            }
            other => {
                return Err(GatewayError::invalid_param(
                    format!("messages[{i}].role"),
                    format!("gemini does not take messages with the role {other:?}"),
                ))
            }
        }
    }
    let mut body = Map::new();
    body.insert("contents".into(), Value::Array(contents));
    if !system.is_empty() {
        body.insert("systemInstruction".into(), json!({"parts": system}));
    }
    let config = generation_config(req);
    if !config.is_empty() {
        body.insert("generationConfig".into(), Value::Object(config));
    }
    if let Some(tools) = req.tools.as_ref().filter(|t| !t.is_empty()) {
        let declarations: Vec<Value> = tools
            .iter()
            .map(|t| {
                let mut d = json!({"name": t.function.name});
                if let Some(description) = &t.function.description {
                    d["description"] = json!(description);
                }
                if let Some(parameters) = &t.function.parameters {
                    d["parameters"] = parameters.clone();
                }
                d
            })
            .collect();
        body.insert(
            "tools".into(),
            json!([{"functionDeclarations": declarations}]),
        );
    }
    if let Some(choice) = &req.tool_choice {
        let config = match choice {
            ToolChoice::Mode(m) if m == "none" => json!({"mode": "NONE"}),
            ToolChoice::Mode(m) if m == "required" => json!({"mode": "ANY"}),
            ToolChoice::Mode(_) => json!({"mode": "AUTO"}),
            ToolChoice::Named(n) => {
                json!({"mode": "ANY", "allowedFunctionNames": [n.function.name]})
            }
        };
        body.insert(
            "toolConfig".into(),
            json!({"functionCallingConfig": config}),
        );
    }
    request::json_body(&body, "gemini")
}

/// The name of the function a tool message answers: the name of the earlier assistant tool call
/// with its `tool_call_id`, else the message's own `name` (legacy `function` messages).
fn function_name<'a>(
    earlier: &'a [Message],
    m: &'a Message,
    i: usize,
) -> Result<&'a str, GatewayError> {
    let by_call = m.tool_call_id.as_deref().and_then(|id| {
        earlier
            .iter()
            .rev()
            .filter(|e| e.role == "assistant")
            .flat_map(|e| e.tool_calls.iter().flatten())
            .find(|c| c.id.as_deref() == Some(id))
            .map(|c| c.function.name.as_str())
    });
    by_call.or(m.name.as_deref()).ok_or_else(|| {
        GatewayError::invalid_param(
            format!("messages[{i}].tool_call_id"),
            "gemini needs the name of the function a tool message answers: no earlier assistant \
             tool call has this tool_call_id and the message has no name",
        )
    })
}

fn content_parts(content: Option<&MessageContent>, i: usize) -> Result<Vec<Value>, GatewayError> {
    match content {
        None => Ok(Vec::new()),
        Some(MessageContent::Text(t)) if t.is_empty() => Ok(Vec::new()),
        Some(MessageContent::Text(t)) => Ok(vec![json!({"text": t})]),
        Some(MessageContent::Parts(parts)) => {
            let mut out = Vec::with_capacity(parts.len());
            for (j, p) in parts.iter().enumerate() {
                if let Some(part) = content_part(p, i, j)? {
                    out.push(part);
                }
            }
            Ok(out)
        }
    }
}

/// One content part; `None` for an empty text (Gemini rejects empty text parts).
fn content_part(part: &ContentPart, i: usize, j: usize) -> Result<Option<Value>, GatewayError> {
    match part.kind.as_str() {
        "text" => Ok(part
            .text
            .as_deref()
            .filter(|t| !t.is_empty())
            .map(|t| json!({"text": t}))),
        "image_url" => {
            let url = request::image_url(part);
            if url.is_empty() {
                return Err(GatewayError::invalid_param(
                    format!("messages[{i}].content[{j}].image_url"),
                    "an image_url part needs a url",
                ));
            }
            Ok(Some(match request::data_url(url, i, j)? {
                Some((mime, data)) => json!({"inlineData": {"mimeType": mime, "data": data}}),
                None => json!({"fileData": {"fileUri": url, "mimeType": mime_of_url(url)}}),
            }))
        }
        other => Err(GatewayError::invalid_param(
            format!("messages[{i}].content[{j}].type"),
            format!("gemini does not take content parts of type {other:?}"),
        )),
    }
}

/// A mime type guessed from a URL's extension; [`DEFAULT_IMAGE_MIME`] when it says nothing known.
fn mime_of_url(url: &str) -> &'static str {
    let path = url.split(['?', '#']).next().unwrap_or_default();
    let file = path.rsplit('/').next().unwrap_or_default();
    let Some((_, ext)) = file.rsplit_once('.') else {
        return DEFAULT_IMAGE_MIME;
    };
    match ext.to_ascii_lowercase().as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "heic" => "image/heic",
        "heif" => "image/heif",
        "pdf" => "application/pdf",
        "mp4" => "video/mp4",
        "mp3" => "audio/mpeg",
        "wav" => "audio/wav",
        _ => DEFAULT_IMAGE_MIME,
    }
}

fn generation_config(req: &ChatRequest) -> Map<String, Value> {
    let mut c = Map::new();
    request::put_sampling(&mut c, req, SAMPLING);
    if let Some(format) = &req.response_format {
        match format["type"].as_str() {
            Some("json_object") => {
                c.insert("responseMimeType".into(), json!("application/json"));
            }
            Some("json_schema") => {
                c.insert("responseMimeType".into(), json!("application/json"));
                if let Some(schema) = format["json_schema"].get("schema") {
                    c.insert("responseJsonSchema".into(), schema.clone());
                }
            }
            _ => {}
        }
    }
    c
}

fn google_embeddings_body(req: &EmbeddingsRequest, texts: &[&str], model: &str) -> Value {
    let requests: Vec<Value> = texts
        .iter()
        .map(|text| {
            let mut r =
                json!({"model": format!("models/{model}"), "content": {"parts": [{"text": text}]}});
            if let Some(d) = req.dimensions {
                r["outputDimensionality"] = json!(d);
            }
            r
        })
        .collect();
    json!({"requests": requests})
}

fn vertex_embeddings_body(req: &EmbeddingsRequest, texts: &[&str]) -> Value {
    let instances: Vec<Value> = texts.iter().map(|t| json!({"content": t})).collect();
    let mut body = json!({"instances": instances});
    if let Some(d) = req.dimensions {
        body["parameters"] = json!({"outputDimensionality": d});
    }
    body
}

/// Decodes a whole 2xx answer: a `GenerateContentResponse` for chat, the embeddings answer of
/// either API for embeddings.
pub fn decode(call: &CallInfo, body: &[u8]) -> Result<Decoded, GatewayError> {
    let answer: Value =
        serde_json::from_slice(body).map_err(|e| chunks::bad_answer(call.provider, e))?;
    if !answer.is_object() {
        return Err(chunks::bad_answer(
            call.provider,
            "the answer is not a JSON object",
        ));
    }
    match call.route {
        Route::Embeddings => decode_embeddings(call, &answer),
        _ => decode_chat(call, &answer),
    }
}

fn decode_chat(call: &CallInfo, answer: &Value) -> Result<Decoded, GatewayError> {
    let usage = usage_of(&answer["usageMetadata"]);
    let candidate = answer["candidates"].as_array().and_then(|c| c.first());
    let (message, finish) = match candidate {
        Some(candidate) => {
            let mut text = String::new();
            let mut tool_calls = Vec::new();
            for part in parts_of(candidate) {
                if let Some(t) = part["text"].as_str() {
                    text.push_str(t);
                }
                if let Some(call_value) = part.get("functionCall") {
                    let (name, arguments) = function_call(call_value).ok_or_else(|| {
                        chunks::bad_answer(call.provider, "a functionCall has no name")
                    })?;
                    let id = call_id(part, tool_calls.len());
                    tool_calls.push(chunks::tool_call(&id, name, arguments));
                }
            }
            let finish = finish_reason(candidate["finishReason"].as_str(), !tool_calls.is_empty());
            (chunks::assistant_message(text, tool_calls), finish)
        }
        None if answer["promptFeedback"]["blockReason"].is_string() => (
            chunks::assistant_message(String::new(), Vec::new()),
            "content_filter",
        ),
        None => {
            return Err(chunks::bad_answer(
                call.provider,
                "the answer has no candidates and no promptFeedback.blockReason",
            ))
        }
    };
    let id = answer["responseId"]
        .as_str()
        .map_or_else(chunks::new_id, str::to_owned);
    let model = answer["modelVersion"]
        .as_str()
        .unwrap_or(&call.model)
        .to_owned();
    let body = chunks::completion(&id, &model, message, json!(finish), usage);
    Ok(Decoded {
        provisioned: provisioned(&answer["usageMetadata"]),
        body,
        model: Some(model),
        usage: Some(usage),
    })
}

fn decode_embeddings(call: &CallInfo, answer: &Value) -> Result<Decoded, GatewayError> {
    let bad = |why: &str| chunks::bad_answer(call.provider, why);
    let mut usage = Usage::default();
    let vectors: Vec<Value> = if let Some(predictions) = answer["predictions"].as_array() {
        // Vertex AI: `predict` answers with per-instance token counts.
        predictions
            .iter()
            .map(|p| {
                let e = &p["embeddings"];
                let count = &e["statistics"]["token_count"];
                usage.prompt_tokens += count
                    .as_u64()
                    .or_else(|| count.as_f64().map(|f| f.max(0.0) as u64))
                    .unwrap_or(0);
                e.get("values")
                    .filter(|v| v.is_array())
                    .cloned()
                    .ok_or_else(|| bad("a prediction has no embeddings.values list"))
            })
            .collect::<Result<_, _>>()?
    } else if let Some(embeddings) = answer["embeddings"].as_array() {
        // The Gemini API reports no token counts for embeddings.
        embeddings
            .iter()
            .map(|e| {
                e.get("values")
                    .filter(|v| v.is_array())
                    .cloned()
                    .ok_or_else(|| bad("an embedding has no values list"))
            })
            .collect::<Result<_, _>>()?
    } else {
        return Err(bad("the answer has neither embeddings nor predictions"));
    };
    Ok(Decoded {
        provisioned: false,
        body: chunks::embeddings(&call.model, vectors, usage),
        model: Some(call.model.clone()),
        usage: Some(usage),
    })
}

/// The parts of a candidate's content, without thought parts.
fn parts_of(candidate: &Value) -> impl Iterator<Item = &Value> {
    candidate["content"]["parts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["thought"] != true)
}

/// A `functionCall`'s name and its `args` as an OpenAI arguments string; `None` without a name.
fn function_call(call: &Value) -> Option<(&str, String)> {
    let name = call["name"].as_str().filter(|n| !n.is_empty())?;
    let arguments = match call.get("args") {
        Some(args @ Value::Object(_)) => args.to_string(),
        _ => "{}".to_owned(),
    };
    Some((name, arguments))
}

/// The id of a tool call: the one Gemini gave it, else `call_<index>`.
fn call_id(part: &Value, index: usize) -> String {
    part["functionCall"]["id"]
        .as_str()
        .or_else(|| part["id"].as_str())
        .filter(|id| !id.is_empty())
        .map_or_else(|| format!("call_{index}"), str::to_owned)
}

fn finish_reason(reason: Option<&str>, calls_functions: bool) -> &'static str {
    match reason {
        Some("MAX_TOKENS") => "length",
        Some(
            "SAFETY"
            | "RECITATION"
            | "BLOCKLIST"
            | "PROHIBITED_CONTENT"
            | "SPII"
            | "IMAGE_SAFETY"
            | "IMAGE_PROHIBITED_CONTENT"
            | "IMAGE_RECITATION",
        ) => "content_filter",
        Some("STOP") | None if calls_functions => "tool_calls",
        _ => "stop",
    }
}

/// Whether Vertex AI served the answer from Provisioned Throughput (`trafficType`).
fn provisioned(meta: &Value) -> bool {
    meta["trafficType"].as_str() == Some("PROVISIONED_THROUGHPUT")
}

fn usage_of(meta: &Value) -> Usage {
    Usage {
        prompt_tokens: meta["promptTokenCount"].as_u64().unwrap_or(0),
        completion_tokens: meta["candidatesTokenCount"].as_u64().unwrap_or(0)
            + meta["thoughtsTokenCount"].as_u64().unwrap_or(0),
    }
}

/// The decoder of a `streamGenerateContent?alt=sse` answer.
pub fn stream(call: &CallInfo) -> Box<dyn StreamDecoder> {
    Box::new(SseDecoder::new(StreamTranslator::new(call)))
}

/// Translates Gemini's stream, where each event is a whole `GenerateContentResponse` holding the
/// next piece of the answer, into OpenAI chunks.
#[derive(Debug)]
pub struct StreamTranslator {
    provider: &'static str,
    writer: ChunkWriter,
    /// Whether an event has arrived (the first one names the id and model of every chunk).
    started: bool,
    /// Tool calls streamed so far; the next one gets this index.
    tools: usize,
    usage: Option<Usage>,
    /// Vertex AI said it served the stream from Provisioned Throughput.
    provisioned: bool,
    /// The latest `finishReason`.
    finish: Option<String>,
    /// The prompt was blocked (`promptFeedback.blockReason` with no candidates).
    blocked: bool,
}

impl StreamTranslator {
    pub fn new(call: &CallInfo) -> Self {
        StreamTranslator {
            provider: call.provider,
            writer: ChunkWriter::new(chunks::new_id(), call.model.clone(), call.include_usage),
            started: false,
            tools: 0,
            usage: None,
            provisioned: false,
            finish: None,
            blocked: false,
        }
    }

    fn fail(&mut self, message: &str, out: &mut String) {
        self.writer
            .error(self.provider, message, Some("upstream_error"), out);
    }
}

impl EventTranslator for StreamTranslator {
    fn event(&mut self, data: &[u8], out: &mut String) {
        if self.writer.ended() || data.trim_ascii().is_empty() {
            return;
        }
        let Ok(event) = serde_json::from_slice::<Value>(data) else {
            self.fail("the stream carried an event that is not JSON", out);
            return;
        };
        if let Some(error) = event.get("error") {
            let message = error["message"].as_str().unwrap_or("stream error");
            self.writer
                .error(self.provider, message, error["status"].as_str(), out);
            return;
        }
        if !self.started {
            // Nothing has been written yet, so every chunk carries the same id and model.
            self.started = true;
            if let Some(id) = event["responseId"].as_str() {
                self.writer.id = id.to_owned();
            }
            if let Some(model) = event["modelVersion"].as_str() {
                self.writer.model = model.to_owned();
            }
        }
        if let Some(meta) = event.get("usageMetadata") {
            self.usage = Some(usage_of(meta));
            self.provisioned |= provisioned(meta);
        }
        let candidate = event["candidates"].as_array().and_then(|c| c.first());
        let Some(candidate) = candidate else {
            if event["promptFeedback"]["blockReason"].is_string() {
                self.blocked = true;
            }
            return;
        };
        for part in parts_of(candidate) {
            if let Some(text) = part["text"].as_str() {
                self.writer.text(text, out);
            }
            if let Some(call) = part.get("functionCall") {
                let Some((name, arguments)) = function_call(call) else {
                    self.fail("a functionCall has no name", out);
                    return;
                };
                let index = self.tools;
                self.tools += 1;
                let id = call_id(part, index);
                self.writer.tool_start(index, &id, name, out);
                self.writer.tool_arguments(index, &arguments, out);
            }
        }
        if let Some(reason) = candidate["finishReason"].as_str() {
            self.finish = Some(reason.to_owned());
        }
    }

    fn end(&mut self, out: &mut String) {
        if self.writer.ended() {
            return;
        }
        if !self.started {
            self.fail("the stream ended before any answer", out);
            return;
        }
        let finish = if self.blocked && self.finish.is_none() {
            "content_filter"
        } else {
            finish_reason(self.finish.as_deref(), self.tools > 0)
        };
        self.writer.end(finish, self.usage.unwrap_or_default(), out);
    }

    fn usage(&self) -> Option<Usage> {
        self.usage
    }

    fn model(&self) -> Option<&str> {
        self.writer.known_model()
    }

    fn provisioned(&self) -> bool {
        self.provisioned
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::testing;

    const VERTEX: &[(&str, &str)] = &[
        ("vertex_project_id", "proj-1"),
        ("vertex_region", "us-central1"),
    ];

    fn encode_with(
        provider: &str,
        route: Route,
        body: Value,
        settings: &[(&str, &str)],
    ) -> Result<Encoded, GatewayError> {
        testing::encode(provider, route, &body, settings)
    }

    fn chat_body(encoded: &Encoded) -> Value {
        serde_json::from_slice(&encoded.body).expect("the body is JSON")
    }

    fn call(provider: &'static str, route: Route, include_usage: bool) -> CallInfo {
        CallInfo {
            provider,
            format: WireFormat::Gemini,
            route,
            model: "gemini-2.0-flash".to_owned(),
            include_usage,
            hidden_usage: false,
            base64_embeddings: false,
            strict: false,
            waive_provisioned_cost: false,
        }
    }

    #[test]
    fn requests_lift_system_merge_turns_and_map_images() {
        let e = encode_with(
            "google",
            Route::ChatCompletions,
            json!({"model": "gemini-2.0-flash", "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "developer", "content": [{"type": "text", "text": "and kind"}]},
                {"role": "user", "content": "first"},
                {"role": "user", "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    {"type": "image_url", "image_url": {"url": "https://x.test/a/cat.WEBP?sig=1"}},
                    {"type": "image_url", "image_url": {"url": "gs://bucket/doc.pdf"}},
                    {"type": "image_url", "image_url": {"url": "https://x.test/img"}}]},
                {"role": "assistant", "content": "ok"},
                {"role": "assistant", "content": "more"},
                {"role": "user", "content": ""},
                {"role": "user", "content": "end"}
            ]}),
            &[],
        )
        .unwrap();
        assert_eq!(e.path, "/models/gemini-2.0-flash:generateContent");
        assert_eq!(e.query, None);
        assert_eq!(e.answer_format, WireFormat::Gemini);
        let body = chat_body(&e);
        assert_eq!(
            body["systemInstruction"],
            json!({"parts": [{"text": "be brief"}, {"text": "and kind"}]})
        );
        let contents = body["contents"].as_array().unwrap();
        assert_eq!(contents.len(), 3, "{contents:?}");
        assert_eq!(contents[0]["role"], "user");
        let parts = contents[0]["parts"].as_array().unwrap();
        assert_eq!(parts[0], json!({"text": "first"}));
        assert_eq!(parts[1], json!({"text": "look"}));
        assert_eq!(
            parts[2],
            json!({"inlineData": {"mimeType": "image/png", "data": "AAAA"}})
        );
        assert_eq!(
            parts[3],
            json!({"fileData": {"fileUri": "https://x.test/a/cat.WEBP?sig=1", "mimeType": "image/webp"}})
        );
        assert_eq!(parts[4]["fileData"]["mimeType"], "application/pdf");
        assert_eq!(parts[5]["fileData"]["mimeType"], "image/jpeg");
        assert_eq!(
            contents[1],
            json!({"role": "model", "parts": [{"text": "ok"}, {"text": "more"}]})
        );
        // The empty user message adds no part.
        assert_eq!(
            contents[2],
            json!({"role": "user", "parts": [{"text": "end"}]})
        );
        assert!(body.get("generationConfig").is_none());
        assert!(body.get("tools").is_none() && body.get("model").is_none());
    }

    #[test]
    fn bad_content_is_a_400_naming_the_field() {
        let err = encode_with(
            "google",
            Route::ChatCompletions,
            json!({"model": "g", "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png,raw"}}]}]}),
            &[],
        )
        .unwrap_err();
        assert_eq!(err.status().as_u16(), 400);
        assert_eq!(
            err.param.as_deref(),
            Some("messages[0].content[0].image_url")
        );
        let err = encode_with(
            "google",
            Route::ChatCompletions,
            json!({"model": "g", "messages": [{"role": "user", "content": [
                {"type": "input_audio", "text": "x"}]}]}),
            &[],
        )
        .unwrap_err();
        assert_eq!(err.param.as_deref(), Some("messages[0].content[0].type"));
        let err = encode_with(
            "google",
            Route::ChatCompletions,
            json!({"messages": [{"role": "user", "content": "x"}]}),
            &[],
        )
        .unwrap_err();
        assert_eq!(err.param.as_deref(), Some("model"));
        let err = encode_with(
            "google",
            Route::ChatCompletions,
            json!({"model": "../files/x", "messages": [{"role": "user", "content": "x"}]}),
            &[],
        )
        .unwrap_err();
        assert_eq!(err.param.as_deref(), Some("model"));
    }

    #[test]
    fn tools_calls_and_results_map_by_name() {
        let e = encode_with(
            "google",
            Route::ChatCompletions,
            json!({"model": "models/gemini-2.5-pro", "stream": true, "messages": [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_a", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Oslo\"}"}},
                    {"id": "call_b", "type": "function", "function": {"name": "time", "arguments": "not json"}}]},
                {"role": "tool", "tool_call_id": "call_b", "content": "noon"},
                {"role": "tool", "tool_call_id": "call_a", "content": "{\"temp\": 3}"},
                {"role": "tool", "tool_call_id": "call_a", "content": "[1, 2]"},
                {"role": "user", "content": "thanks"}
            ],
            "tools": [
                {"type": "function", "function": {"name": "weather", "description": "Weather now",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
                {"type": "function", "function": {"name": "time"}}],
            "tool_choice": {"type": "function", "function": {"name": "weather"}}}),
            &[],
        )
        .unwrap();
        // A model written `models/...` loses the prefix; a stream asks for SSE.
        assert_eq!(e.path, "/models/gemini-2.5-pro:streamGenerateContent");
        assert_eq!(e.query.as_deref(), Some("alt=sse"));
        let body = chat_body(&e);
        let contents = body["contents"].as_array().unwrap();
        assert_eq!(contents.len(), 3, "{contents:?}");
        assert_eq!(
            contents[1],
            json!({"role": "model", "parts": [
                {"functionCall": {"name": "weather", "args": {"city": "Oslo"}}},
                {"functionCall": {"name": "time", "args": {}}}]})
        );
        assert_eq!(contents[2]["role"], "user");
        assert_eq!(
            contents[2]["parts"],
            json!([
                {"functionResponse": {"name": "time", "response": {"content": "noon"}}},
                {"functionResponse": {"name": "weather", "response": {"temp": 3}}},
                {"functionResponse": {"name": "weather", "response": {"content": "[1, 2]"}}},
                {"text": "thanks"}
            ])
        );
        assert_eq!(
            body["tools"],
            json!([{"functionDeclarations": [
                {"name": "weather", "description": "Weather now",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
                {"name": "time"}]}])
        );
        assert_eq!(
            body["toolConfig"],
            json!({"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["weather"]}})
        );
        for (choice, mode) in [("auto", "AUTO"), ("none", "NONE"), ("required", "ANY")] {
            let e = encode_with(
                "google",
                Route::ChatCompletions,
                json!({"model": "g", "messages": [{"role": "user", "content": "x"}],
                    "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": choice}),
                &[],
            )
            .unwrap();
            assert_eq!(
                chat_body(&e)["toolConfig"]["functionCallingConfig"],
                json!({"mode": mode})
            );
        }
        // A tool result whose call cannot be found has no function name to give.
        let err = encode_with(
            "google",
            Route::ChatCompletions,
            json!({"model": "g", "messages": [{"role": "user", "content": "x"},
                {"role": "tool", "tool_call_id": "nope", "content": "1"}]}),
            &[],
        )
        .unwrap_err();
        assert_eq!(err.param.as_deref(), Some("messages[1].tool_call_id"));
    }

    #[test]
    fn sampling_fields_go_into_generation_config() {
        let e = encode_with(
            "google",
            Route::ChatCompletions,
            json!({"model": "g", "messages": [{"role": "user", "content": "x"}],
                "temperature": 0.5, "top_p": 0.9, "max_completion_tokens": 100, "stop": "END",
                "n": 2, "seed": 7, "presence_penalty": 0.1, "frequency_penalty": -0.2,
                "response_format": {"type": "json_schema", "json_schema": {"name": "r",
                    "schema": {"type": "object", "additionalProperties": false}}}}),
            &[],
        )
        .unwrap();
        assert_eq!(
            chat_body(&e)["generationConfig"],
            json!({"temperature": 0.5, "topP": 0.9, "maxOutputTokens": 100,
                "stopSequences": ["END"], "candidateCount": 2, "seed": 7,
                "presencePenalty": 0.1, "frequencyPenalty": -0.2,
                "responseMimeType": "application/json",
                "responseJsonSchema": {"type": "object", "additionalProperties": false}})
        );
        let e = encode_with(
            "google",
            Route::ChatCompletions,
            json!({"model": "g", "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 5, "max_completion_tokens": 9, "stop": ["a", "b"],
                "response_format": {"type": "json_object"}}),
            &[],
        )
        .unwrap();
        assert_eq!(
            chat_body(&e)["generationConfig"],
            json!({"maxOutputTokens": 5, "stopSequences": ["a", "b"],
                "responseMimeType": "application/json"})
        );
    }

    #[test]
    fn vertex_paths_need_project_and_region() {
        let chat =
            json!({"model": "gemini-2.0-flash", "messages": [{"role": "user", "content": "x"}]});
        let e = encode_with("vertex-ai", Route::ChatCompletions, chat.clone(), VERTEX).unwrap();
        assert_eq!(
            e.path,
            "/projects/proj-1/locations/us-central1/publishers/google/models/gemini-2.0-flash:generateContent"
        );
        assert_eq!(e.query, None);
        let mut streamed = chat.clone();
        streamed["stream"] = json!(true);
        let e = encode_with("vertex-ai", Route::ChatCompletions, streamed, VERTEX).unwrap();
        assert!(e
            .path
            .ends_with("/models/gemini-2.0-flash:streamGenerateContent"));
        assert_eq!(e.query.as_deref(), Some("alt=sse"));

        let err = encode_with(
            "vertex-ai",
            Route::ChatCompletions,
            chat.clone(),
            &[("vertex_region", "us-central1")],
        )
        .unwrap_err();
        assert_eq!(err.status().as_u16(), 400);
        assert_eq!(err.param.as_deref(), Some("x-gw-vertex-project-id"));
        let err = encode_with(
            "vertex-ai",
            Route::ChatCompletions,
            chat.clone(),
            &[("vertex_project_id", "p")],
        )
        .unwrap_err();
        assert_eq!(err.param.as_deref(), Some("x-gw-vertex-region"));
        let err = encode_with(
            "vertex-ai",
            Route::ChatCompletions,
            chat,
            &[("vertex_project_id", "p/../q"), ("vertex_region", "r")],
        )
        .unwrap_err();
        assert_eq!(err.param.as_deref(), Some("x-gw-vertex-project-id"));
    }

    #[test]
    fn claude_on_vertex_goes_in_anthropic_format() {
        let body = json!({"model": "claude-3-5-sonnet-v2@20241022", "max_tokens": 10,
            "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "x"}]});
        let e = encode_with("vertex-ai", Route::ChatCompletions, body.clone(), VERTEX).unwrap();
        assert_eq!(
            e.path,
            "/projects/proj-1/locations/us-central1/publishers/anthropic/models/claude-3-5-sonnet-v2@20241022:rawPredict"
        );
        assert_eq!(e.answer_format, WireFormat::Anthropic);
        assert_eq!(e.query, None);
        let sent = chat_body(&e);
        assert_eq!(sent["anthropic_version"], anthropic::VERTEX_VERSION);
        assert_eq!(sent["system"], "sys");
        assert!(sent.get("model").is_none());
        let mut streamed = body;
        streamed["stream"] = json!(true);
        let e = encode_with("vertex-ai", Route::ChatCompletions, streamed, VERTEX).unwrap();
        assert!(e.path.ends_with(":streamRawPredict"), "{}", e.path);
        assert_eq!(e.query, None);
        assert_eq!(chat_body(&e)["stream"], true);
    }

    #[test]
    fn embeddings_bodies_for_both_apis() {
        let req = json!({"model": "text-embedding-004", "input": ["a", "b"], "dimensions": 64});
        let e = encode_with("google", Route::Embeddings, req.clone(), &[]).unwrap();
        assert_eq!(e.path, "/models/text-embedding-004:batchEmbedContents");
        assert_eq!(
            chat_body(&e),
            json!({"requests": [
                {"model": "models/text-embedding-004", "content": {"parts": [{"text": "a"}]}, "outputDimensionality": 64},
                {"model": "models/text-embedding-004", "content": {"parts": [{"text": "b"}]}, "outputDimensionality": 64}]})
        );
        let e = encode_with("vertex-ai", Route::Embeddings, req, VERTEX).unwrap();
        assert_eq!(
            e.path,
            "/projects/proj-1/locations/us-central1/publishers/google/models/text-embedding-004:predict"
        );
        assert_eq!(
            chat_body(&e),
            json!({"instances": [{"content": "a"}, {"content": "b"}],
                "parameters": {"outputDimensionality": 64}})
        );
        let e = encode_with(
            "vertex-ai",
            Route::Embeddings,
            json!({"model": "m", "input": "one"}),
            VERTEX,
        )
        .unwrap();
        assert_eq!(chat_body(&e), json!({"instances": [{"content": "one"}]}));

        let err = encode_with(
            "google",
            Route::Embeddings,
            json!({"model": "m", "input": [1, 2, 3]}),
            &[],
        )
        .unwrap_err();
        assert_eq!(
            (err.status().as_u16(), err.param.as_deref()),
            (400, Some("input"))
        );
        let err =
            encode_with("google", Route::Moderations, json!({"input": "x"}), &[]).unwrap_err();
        assert_eq!(err.status().as_u16(), 400);
        assert!(err.message.contains("does not serve"), "{}", err.message);
    }

    fn decode_json(call: &CallInfo, answer: Value) -> (Value, Decoded) {
        let d = decode(call, answer.to_string().as_bytes()).unwrap();
        (serde_json::from_slice(&d.body).unwrap(), d)
    }

    #[test]
    fn answers_map_text_tools_usage_and_ids() {
        let c = call("google", Route::ChatCompletions, false);
        let (out, d) = decode_json(
            &c,
            json!({"candidates": [{"content": {"role": "model", "parts": [
                    {"text": "thinking...", "thought": true},
                    {"text": "Hello "}, {"text": "there"}]},
                "finishReason": "STOP"}],
                "usageMetadata": {"promptTokenCount": 5, "candidatesTokenCount": 2,
                    "thoughtsTokenCount": 3, "totalTokenCount": 10},
                "modelVersion": "gemini-2.0-flash-001", "responseId": "resp-1"}),
        );
        assert_eq!(out["object"], "chat.completion");
        assert_eq!(out["id"], "resp-1");
        assert_eq!(out["model"], "gemini-2.0-flash-001");
        let choice = &out["choices"][0];
        assert_eq!(
            choice["message"],
            json!({"role": "assistant", "content": "Hello there"})
        );
        assert_eq!(choice["finish_reason"], "stop");
        assert_eq!(
            out["usage"],
            json!({"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10})
        );
        assert_eq!(d.model.as_deref(), Some("gemini-2.0-flash-001"));
        assert_eq!(
            d.usage,
            Some(Usage {
                prompt_tokens: 5,
                completion_tokens: 5
            })
        );

        let (out, d) = decode_json(
            &c,
            json!({"candidates": [{"content": {"role": "model", "parts": [
                    {"functionCall": {"name": "weather", "args": {"city": "Oslo"}}},
                    {"functionCall": {"id": "fc-9", "name": "time"}}]},
                "finishReason": "STOP"}]}),
        );
        let message = &out["choices"][0]["message"];
        assert_eq!(message["content"], Value::Null);
        assert_eq!(
            message["tool_calls"],
            json!([
                {"id": "call_0", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Oslo\"}"}},
                {"id": "fc-9", "type": "function", "function": {"name": "time", "arguments": "{}"}}])
        );
        assert_eq!(out["choices"][0]["finish_reason"], "tool_calls");
        // Without responseId or modelVersion: a generated id and the requested model.
        assert!(out["id"].as_str().unwrap().starts_with("chatcmpl-"));
        assert_eq!(out["model"], "gemini-2.0-flash");
        assert_eq!(d.model.as_deref(), Some("gemini-2.0-flash"));
        assert_eq!(d.usage, Some(Usage::default()));
    }

    #[test]
    fn each_finish_reason_maps() {
        let c = call("google", Route::ChatCompletions, false);
        for (reason, want) in [
            ("STOP", "stop"),
            ("MAX_TOKENS", "length"),
            ("SAFETY", "content_filter"),
            ("RECITATION", "content_filter"),
            ("BLOCKLIST", "content_filter"),
            ("PROHIBITED_CONTENT", "content_filter"),
            ("SPII", "content_filter"),
            ("IMAGE_SAFETY", "content_filter"),
            ("OTHER", "stop"),
            ("LANGUAGE", "stop"),
            ("MALFORMED_FUNCTION_CALL", "stop"),
            ("FINISH_REASON_UNSPECIFIED", "stop"),
        ] {
            let (out, _) = decode_json(
                &c,
                json!({"candidates": [{"content": {"parts": [{"text": "t"}]}, "finishReason": reason}]}),
            );
            assert_eq!(out["choices"][0]["finish_reason"], want, "{reason}");
        }
        // A candidate stopped for safety may have no content at all.
        let (out, _) = decode_json(&c, json!({"candidates": [{"finishReason": "SAFETY"}]}));
        assert_eq!(out["choices"][0]["message"]["content"], "");
        assert_eq!(out["choices"][0]["finish_reason"], "content_filter");
    }

    #[test]
    fn a_blocked_prompt_is_an_empty_filtered_answer() {
        let c = call("google", Route::ChatCompletions, false);
        let (out, d) = decode_json(
            &c,
            json!({"promptFeedback": {"blockReason": "SAFETY"},
                "usageMetadata": {"promptTokenCount": 8, "totalTokenCount": 8}}),
        );
        assert_eq!(out["choices"][0]["finish_reason"], "content_filter");
        assert_eq!(out["choices"][0]["message"]["content"], "");
        assert_eq!(d.usage.unwrap().prompt_tokens, 8);
    }

    #[test]
    fn malformed_answers_are_502s() {
        let c = call("google", Route::ChatCompletions, false);
        for body in [
            &b"<html>oops</html>"[..],
            b"[1, 2]",
            b"{\"usageMetadata\": {}}",
            b"{\"candidates\": []}",
            b"{\"candidates\": [{\"content\": {\"parts\": [{\"functionCall\": {\"args\": {}}}]}}]}",
        ] {
            let err = decode(&c, body).unwrap_err();
            assert_eq!(
                err.status().as_u16(),
                502,
                "{}",
                String::from_utf8_lossy(body)
            );
            assert!(err.message.contains("google"), "{}", err.message);
        }
        let e = call("vertex-ai", Route::Embeddings, false);
        for body in [
            &b"{\"predictions\": [{\"embeddings\": {}}]}"[..],
            b"{\"embeddings\": [{\"value\": [1]}]}",
            b"{}",
        ] {
            assert_eq!(decode(&e, body).unwrap_err().status().as_u16(), 502);
        }
    }

    #[test]
    fn embeddings_answers_of_both_apis() {
        let c = call("google", Route::Embeddings, false);
        let (out, d) = decode_json(
            &c,
            json!({"embeddings": [{"values": [0.1, 0.2]}, {"values": [0.3, 0.4]}]}),
        );
        assert_eq!(out["object"], "list");
        assert_eq!(out["data"][1]["index"], 1);
        assert_eq!(out["data"][1]["embedding"], json!([0.3, 0.4]));
        assert_eq!(out["model"], "gemini-2.0-flash");
        assert_eq!(out["usage"]["prompt_tokens"], 0);
        assert_eq!(d.usage, Some(Usage::default()));

        let c = call("vertex-ai", Route::Embeddings, false);
        let (out, d) = decode_json(
            &c,
            json!({"predictions": [
                {"embeddings": {"values": [1.0], "statistics": {"token_count": 4, "truncated": false}}},
                {"embeddings": {"values": [2.0], "statistics": {"token_count": 6.0, "truncated": false}}}]}),
        );
        assert_eq!(out["data"][0]["embedding"], json!([1.0]));
        assert_eq!(out["data"][1]["embedding"], json!([2.0]));
        assert_eq!(
            out["usage"],
            json!({"prompt_tokens": 10, "total_tokens": 10})
        );
        assert_eq!(d.usage.unwrap().prompt_tokens, 10);
        assert_eq!(d.model.as_deref(), Some("gemini-2.0-flash"));
    }

    /// Events as Gemini sends them (CRLF-framed), with one LF-framed event between.
    const STREAM: &str = concat!(
        "data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"Hel\"}],\"role\": \"model\"}}],\"usageMetadata\": {\"promptTokenCount\": 9,\"candidatesTokenCount\": 1},\"modelVersion\": \"gemini-2.0-flash-001\",\"responseId\": \"r-1\"}\r\n\r\n",
        "data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"lo \\u00e9t\\u00e9\"}],\"role\": \"model\"}}],\"usageMetadata\": {\"promptTokenCount\": 9,\"candidatesTokenCount\": 3},\"modelVersion\": \"gemini-2.0-flash-001\",\"responseId\": \"r-1\"}\n\n",
        "data: {\"candidates\": [{\"content\": {\"parts\": [{\"functionCall\": {\"name\": \"weather\",\"args\": {\"city\": \"Oslo\"}}}],\"role\": \"model\"}}],\"modelVersion\": \"gemini-2.0-flash-001\",\"responseId\": \"r-1\"}\r\n\r\n",
        "data: {\"candidates\": [{\"content\": {\"parts\": [{\"functionCall\": {\"name\": \"time\",\"args\": {}}}],\"role\": \"model\"},\"finishReason\": \"STOP\"}],\"usageMetadata\": {\"promptTokenCount\": 9,\"candidatesTokenCount\": 7,\"thoughtsTokenCount\": 2},\"modelVersion\": \"gemini-2.0-flash-001\",\"responseId\": \"r-1\"}\r\n\r\n",
    );

    fn run(call: &CallInfo, reads: &[&[u8]]) -> (String, Option<Usage>, Option<String>) {
        let mut decoder = stream(call);
        let mut out = Vec::new();
        for read in reads {
            out.extend_from_slice(&decoder.push(read));
        }
        out.extend_from_slice(&decoder.finish());
        let text = String::from_utf8(out).expect("the output is UTF-8");
        (text, decoder.usage(), decoder.model().map(str::to_owned))
    }

    fn chunks_of(out: &str) -> Vec<Value> {
        out.split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).expect("each event is JSON"))
            .collect()
    }

    /// The output with `created` (the second it was written) taken out of every chunk.
    fn normalised(out: &str) -> Vec<Value> {
        chunks_of(out)
            .into_iter()
            .map(|mut c| {
                if let Some(o) = c.as_object_mut() {
                    o.remove("created");
                }
                c
            })
            .collect()
    }

    #[test]
    fn the_stream_becomes_openai_chunks() {
        let c = call("google", Route::ChatCompletions, true);
        let (out, usage, model) = run(&c, &[STREAM.as_bytes()]);
        assert!(out.ends_with("data: [DONE]\n\n"), "{out}");
        let chunks = chunks_of(&out);
        assert!(chunks
            .iter()
            .all(|c| c["id"] == "r-1" && c["model"] == "gemini-2.0-flash-001"));
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        let text: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, "Hello été");
        let starts: Vec<&Value> = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].get(0))
            .filter(|t| t.get("id").is_some())
            .collect();
        assert_eq!(
            starts,
            [
                &json!({"index": 0, "id": "call_0", "type": "function", "function": {"name": "weather", "arguments": ""}}),
                &json!({"index": 1, "id": "call_1", "type": "function", "function": {"name": "time", "arguments": ""}}),
            ]
        );
        let args: Vec<(u64, &str)> = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].get(0))
            .filter(|t| t.get("id").is_none())
            .map(|t| {
                (
                    t["index"].as_u64().unwrap(),
                    t["function"]["arguments"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(args, [(0, "{\"city\":\"Oslo\"}"), (1, "{}")]);
        let finish: Vec<&str> = chunks
            .iter()
            .filter_map(|c| c["choices"].get(0)?["finish_reason"].as_str())
            .collect();
        assert_eq!(finish, ["tool_calls"]);
        let last = chunks.last().unwrap();
        assert_eq!(last["choices"], json!([]));
        assert_eq!(
            last["usage"],
            json!({"prompt_tokens": 9, "completion_tokens": 9, "total_tokens": 18})
        );
        assert_eq!(
            usage,
            Some(Usage {
                prompt_tokens: 9,
                completion_tokens: 9
            })
        );
        assert_eq!(model.as_deref(), Some("gemini-2.0-flash-001"));
    }

    #[test]
    fn any_split_of_the_stream_gives_the_same_chunks() {
        let c = call("google", Route::ChatCompletions, true);
        let bytes = STREAM.as_bytes();
        let (whole, _, _) = run(&c, &[bytes]);
        let want = normalised(&whole);
        for size in 1..=64 {
            let reads: Vec<&[u8]> = bytes.chunks(size).collect();
            assert_eq!(
                normalised(&run(&c, &reads).0),
                want,
                "reads of {size} bytes"
            );
        }
        // Every cut into two reads, and an uneven rhythm of read sizes.
        for cut in 0..=bytes.len() {
            let (a, b) = bytes.split_at(cut);
            assert_eq!(normalised(&run(&c, &[a, b]).0), want, "cut at {cut}");
        }
        let mut reads = Vec::new();
        let mut rest = bytes;
        for size in [1, 7, 2, 31, 3, 90, 5, 250, 1, 1, 13].iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let (a, b) = rest.split_at((*size).min(rest.len()));
            reads.push(a);
            rest = b;
        }
        assert_eq!(normalised(&run(&c, &reads).0), want, "uneven reads");
    }

    #[test]
    fn stream_ends_errors_and_blocks() {
        // Text only, STOP, no usage chunk asked for; a last event without its blank line counts.
        let c = call("vertex-ai", Route::ChatCompletions, false);
        let (out, usage, _) = run(
            &c,
            &[b"data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"hi\"}]}, \"finishReason\": \"MAX_TOKENS\"}], \"usageMetadata\": {\"promptTokenCount\": 1, \"candidatesTokenCount\": 1}}"],
        );
        let chunks = chunks_of(&out);
        assert_eq!(chunks.len(), 3, "{out}");
        assert_eq!(chunks[2]["choices"][0]["finish_reason"], "length");
        assert!(chunks.iter().all(|c| c.get("usage").is_none()));
        assert!(chunks[0]["id"].as_str().unwrap().starts_with("chatcmpl-"));
        assert_eq!(chunks[0]["model"], "gemini-2.0-flash");
        assert_eq!(usage.unwrap().total(), 2);

        // An error event ends the stream in OpenAI's error shape; nothing follows it.
        let (out, _, _) = run(
            &c,
            &[
                b"data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"a\"}]}}]}\n\n",
                b"data: {\"error\": {\"code\": 429, \"message\": \"Resource exhausted\", \"status\": \"RESOURCE_EXHAUSTED\"}}\n\n",
                b"data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"late\"}]}}]}\n\n",
            ],
        );
        assert!(!out.contains("[DONE]") && !out.contains("late"), "{out}");
        let chunks = chunks_of(&out);
        let error = &chunks.last().unwrap()["error"];
        assert_eq!(error["message"], "vertex-ai error: Resource exhausted");
        assert_eq!(error["type"], "RESOURCE_EXHAUSTED");

        // A blocked prompt: no candidates, a filtered finish.
        let (out, _, _) = run(
            &c,
            &[b"data: {\"promptFeedback\": {\"blockReason\": \"PROHIBITED_CONTENT\"}}\n\n"],
        );
        let chunks = chunks_of(&out);
        assert_eq!(
            chunks.last().unwrap()["choices"][0]["finish_reason"],
            "content_filter"
        );
        assert!(out.ends_with("data: [DONE]\n\n"));

        // Garbage or silence is an error, not an empty success.
        let (out, _, _) = run(&c, &[b"data: <html>\n\n"]);
        assert!(chunks_of(&out)[0]["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("vertex-ai error:"));
        let (out, _, _) = run(&c, &[]);
        assert!(
            out.contains("\"error\"") && !out.contains("[DONE]"),
            "{out}"
        );
    }
}
