//! `POST /messages`: Anthropic's Messages API with strict request checks,
//! deterministic replies, tool use, thinking blocks and SSE streaming.
//!
//! The request is checked the way Anthropic would reject it (missing
//! `x-api-key` or `anthropic-version`, missing fields, unknown roles or block
//! types, OpenAI-only fields), so a gateway that translates badly gets a 400
//! instead of a reply.
//!
//! The reply is one text block, `"mock reply to: <last user message text>"`
//! (or `w1 ... wn` under the `words` fault), cut at the earliest
//! `stop_sequences` match and then at `max_tokens` words. With tools (and a
//! `tool_choice` other than `none`) it is a `"calling NAME"` text block and a
//! `tool_use` block instead. `thinking: {"type":"enabled"}` puts a thinking
//! block first. Token counts are word counts: input over `system` and every
//! message's text (tool results included), output over every content block
//! (the tool input JSON counts as one word).

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CACHE_CONTROL};
use http::{HeaderMap, StatusCode};
use serde::Serialize;
use serde_json::{Map, Value};

use super::{ApiError, ErrorDetail, HandlerResult};
use crate::body::{self, MockBody};
use crate::server::Ctx;
use crate::sse::{self, SseBody};
use crate::text;

/// Id of the (single) `tool_use` block in tool answers.
const TOOL_USE_ID: &str = "toolu_mock_0";
/// How the tool input is split when streamed; joins back to the JSON of
/// [`ToolInput`], `{"mock":true,"n":1}`.
const TOOL_INPUT_PIECES: [&str; 3] = [r#"{"mock":"#, "true,", r#""n":1}"#];
/// Signature of every thinking block.
const SIGNATURE: &str = "sig_mock";
/// How much of the system prompt `x-mock-system` echoes.
const SYSTEM_HEADER_CHARS: usize = 200;
/// Content block types accepted in a message.
const BLOCK_TYPES: &str = "text, image, tool_use, tool_result, thinking";
/// Content block types accepted inside a `tool_result`.
const NESTED_BLOCK_TYPES: &str = "text, image";

/// Top-level fields of OpenAI's chat API that Anthropic rejects, with a hint
/// at what Anthropic expects instead.
const OPENAI_ONLY_FIELDS: [(&str, &str); 6] = [
    ("n", "Anthropic returns one message per request"),
    ("frequency_penalty", "Anthropic has no frequency penalty"),
    ("presence_penalty", "Anthropic has no presence penalty"),
    ("logit_bias", "Anthropic has no logit bias"),
    ("stop", "Anthropic uses 'stop_sequences'"),
    (
        "response_format",
        "Anthropic has no response_format; use a tool or the prompt",
    ),
];

/// The request, checked and reduced to what the reply depends on.
struct Request<'a> {
    model: &'a str,
    max_tokens: u64,
    stream: bool,
    /// The system prompt's text, blocks joined by a space.
    system: Option<String>,
    messages: &'a [Value],
    stop_sequences: Vec<&'a str>,
    /// The tool to call, if the answer is a tool call.
    tool: Option<&'a str>,
    thinking: bool,
}

/// Answers `POST /messages`.
pub(super) fn handle(ctx: &Ctx<'_>, body: &[u8]) -> HandlerResult {
    check_headers(ctx.headers)?;
    handle_body(ctx, body)
}

/// Answers a Messages request body without Anthropic's header checks, for
/// platforms that put their own authentication in front of the API.
pub(super) fn handle_body(ctx: &Ctx<'_>, body: &[u8]) -> HandlerResult {
    let json = parse_json(body)?;
    let Value::Object(fields) = &json else {
        return Err(ApiError::invalid("request body must be a JSON object"));
    };
    let req = Request::from_fields(fields)?;
    let answer = Answer::new(&req, ctx.faults.words);
    let input_tokens = input_words(req.system.as_deref(), req.messages);
    let id = format!("msg_mock_{}", ctx.shared.next_id());
    let system = req.system.as_deref().and_then(system_header);

    let mut resp = if req.stream {
        let stream = MessageStream {
            id,
            model: req.model.to_owned(),
            input_tokens,
            answer,
            stage: Stage::Start,
            starts: Vec::new(),
            stream_error: ctx.failure.stream_error,
        };
        let faults = ctx.faults.stream_faults(ctx.failure.disconnect_after);
        let sse = SseBody::new(Box::new(stream), faults);
        let mut resp = body::response(StatusCode::OK, "text/event-stream", MockBody::Sse(sse));
        resp.headers_mut()
            .insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        resp
    } else {
        let content: Vec<ContentBlock<'_>> =
            answer.blocks.iter().map(ContentBlock::from_block).collect();
        let message = Message {
            id: &id,
            kind: "message",
            role: "assistant",
            model: req.model,
            content: &content,
            stop_reason: Some(answer.stop_reason),
            stop_sequence: answer.stop_sequence.as_deref(),
            usage: Usage {
                input_tokens,
                output_tokens: answer.output_tokens(),
            },
        };
        body::json(StatusCode::OK, &message)
    };
    if let Some(system) = system {
        resp.headers_mut()
            .insert(HeaderName::from_static("x-mock-system"), system);
    }
    Ok(resp)
}

/// What [`answer_fields`] produces.
pub(crate) enum Answered {
    /// The message object as JSON, with its token counts.
    Message {
        json: Vec<u8>,
        input_tokens: u64,
        output_tokens: u64,
    },
    /// The events of the streamed answer, each one SSE frame
    /// (`event: NAME\ndata: JSON\n\n`).
    Stream(crate::sse::Events),
}

/// The answer to the Messages request `fields` (which must name its
/// `model`), streamed or not as `stream` says, without headers or HTTP, for
/// platforms that frame Anthropic's answers their own way (Bedrock's
/// InvokeModel). An error is a 400's message.
pub(crate) fn answer_fields(
    ctx: &Ctx<'_>,
    fields: &Map<String, Value>,
    stream: bool,
) -> Result<Answered, String> {
    let req = Request::from_fields(fields).map_err(|err| err.message)?;
    let answer = Answer::new(&req, ctx.faults.words);
    let input_tokens = input_words(req.system.as_deref(), req.messages);
    let id = format!("msg_mock_{}", ctx.shared.next_id());
    if stream {
        return Ok(Answered::Stream(Box::new(MessageStream {
            id,
            model: req.model.to_owned(),
            input_tokens,
            answer,
            stage: Stage::Start,
            starts: Vec::new(),
            stream_error: ctx.failure.stream_error,
        })));
    }
    let content: Vec<ContentBlock<'_>> =
        answer.blocks.iter().map(ContentBlock::from_block).collect();
    let output_tokens = answer.output_tokens();
    let message = Message {
        id: &id,
        kind: "message",
        role: "assistant",
        model: req.model,
        content: &content,
        stop_reason: Some(answer.stop_reason),
        stop_sequence: answer.stop_sequence.as_deref(),
        usage: Usage {
            input_tokens,
            output_tokens,
        },
    };
    Ok(Answered::Message {
        json: serde_json::to_vec(&message).unwrap_or_else(|_| b"{}".to_vec()),
        input_tokens,
        output_tokens,
    })
}

/// Anthropic authenticates with `x-api-key` (a bearer `authorization` does
/// not count) and requires `anthropic-version`.
fn check_headers(headers: &HeaderMap) -> Result<(), ApiError> {
    let present = |name: &str| {
        headers
            .get(name)
            .is_some_and(|v| !v.as_bytes().trim_ascii().is_empty())
    };
    if !present("x-api-key") {
        return Err(ApiError {
            status: StatusCode::UNAUTHORIZED,
            kind: "authentication_error",
            message: "x-api-key header is required".to_owned(),
        });
    }
    if !present("anthropic-version") {
        return Err(ApiError::invalid("anthropic-version: header is required"));
    }
    Ok(())
}

fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    if body.is_empty() {
        return Err(ApiError::invalid(
            "request body is empty; expected a JSON object",
        ));
    }
    serde_json::from_slice(body)
        .map_err(|err| ApiError::invalid(format!("invalid JSON body: {err}")))
}

/// `fields[key]`, with `null` treated as absent.
fn get<'a>(fields: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    fields.get(key).filter(|v| !v.is_null())
}

/// The string at `fields[key]`, or a 400 naming `path.key`.
fn require_str<'a>(
    fields: &'a Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<&'a str, ApiError> {
    match get(fields, key) {
        None => Err(ApiError::invalid(format!("{path}.{key}: Field required"))),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(ApiError::invalid(format!(
            "{path}.{key}: Input should be a valid string"
        ))),
    }
}

/// The object at `fields[key]`, or a 400 naming `path.key`.
fn require_object<'a>(
    fields: &'a Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<&'a Map<String, Value>, ApiError> {
    match get(fields, key) {
        None => Err(ApiError::invalid(format!("{path}.{key}: Field required"))),
        Some(Value::Object(map)) => Ok(map),
        Some(_) => Err(ApiError::invalid(format!(
            "{path}.{key}: Input should be an object"
        ))),
    }
}

impl<'a> Request<'a> {
    fn from_fields(fields: &'a Map<String, Value>) -> Result<Self, ApiError> {
        for (field, hint) in OPENAI_ONLY_FIELDS {
            if fields.contains_key(field) {
                return Err(ApiError::invalid(format!(
                    "{field}: Extra inputs are not permitted ({hint})"
                )));
            }
        }
        let model = match get(fields, "model") {
            None => return Err(ApiError::invalid("model: Field required")),
            Some(Value::String(s)) if !s.is_empty() => s.as_str(),
            Some(Value::String(_)) => {
                return Err(ApiError::invalid("model: String should not be empty"))
            }
            Some(_) => return Err(ApiError::invalid("model: Input should be a valid string")),
        };
        let max_tokens = match get(fields, "max_tokens") {
            None => return Err(ApiError::invalid("max_tokens: Field required")),
            Some(v) => v.as_u64().filter(|&n| n > 0).ok_or_else(|| {
                ApiError::invalid(format!(
                    "max_tokens: Input should be a positive integer, got {v}"
                ))
            })?,
        };
        let messages = check_messages(get(fields, "messages"))?;
        let system = system_text(get(fields, "system"))?;
        let tool_names = check_tools(get(fields, "tools"))?;
        let tool = tool_to_call(get(fields, "tool_choice"), &tool_names)?;
        // After a tool result the model answers in words, so a test sees the result arrived.
        let tool = tool.filter(|_| !ends_with_tool_result(messages));
        let stop_sequences = check_stop_sequences(get(fields, "stop_sequences"))?;
        let thinking = check_thinking(get(fields, "thinking"))?;
        let stream = match get(fields, "stream") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(ApiError::invalid("stream: Input should be a valid boolean")),
        };
        Ok(Request {
            model,
            max_tokens,
            stream,
            system,
            messages,
            stop_sequences,
            tool,
            thinking,
        })
    }
}

/// Checks `messages`: a non-empty list of `user` / `assistant` messages
/// whose content is a string or a list of known blocks. Whether roles
/// alternate is deliberately not checked.
fn check_messages(messages: Option<&Value>) -> Result<&[Value], ApiError> {
    let messages = match messages {
        None => return Err(ApiError::invalid("messages: Field required")),
        Some(Value::Array(list)) => list.as_slice(),
        Some(_) => return Err(ApiError::invalid("messages: Input should be a valid list")),
    };
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages: List should have at least 1 item",
        ));
    }
    for (i, message) in messages.iter().enumerate() {
        let path = format!("messages.{i}");
        let Value::Object(fields) = message else {
            return Err(ApiError::invalid(format!(
                "{path}: Input should be an object"
            )));
        };
        let role = require_str(fields, "role", &path)?;
        if role != "user" && role != "assistant" {
            let hint = match role {
                "system" | "developer" => " (system prompts go in the top-level 'system' field)",
                "tool" => " (tool results are 'tool_result' blocks in a user message)",
                _ => "",
            };
            return Err(ApiError::invalid(format!(
                "{path}.role: Input should be 'user' or 'assistant', got '{role}'{hint}"
            )));
        }
        match get(fields, "content") {
            None => return Err(ApiError::invalid(format!("{path}.content: Field required"))),
            Some(Value::String(_)) => {}
            Some(Value::Array(blocks)) => {
                for (j, block) in blocks.iter().enumerate() {
                    check_block(block, &format!("{path}.content.{j}"), false)?;
                }
            }
            Some(_) => {
                return Err(ApiError::invalid(format!(
                    "{path}.content: Input should be a string or a list of content blocks"
                )))
            }
        }
    }
    Ok(messages)
}

/// Checks one content block at `path`. `nested` blocks sit inside a
/// `tool_result` and may only be text or images.
fn check_block(block: &Value, path: &str, nested: bool) -> Result<(), ApiError> {
    let Value::Object(fields) = block else {
        return Err(ApiError::invalid(format!(
            "{path}: Input should be an object"
        )));
    };
    let kind = require_str(fields, "type", path)?;
    match kind {
        "text" => {
            require_str(fields, "text", path)?;
        }
        "image" => {
            require_object(fields, "source", path)?;
        }
        "tool_use" if !nested => {
            require_str(fields, "id", path)?;
            require_str(fields, "name", path)?;
            require_object(fields, "input", path)?;
        }
        "tool_result" if !nested => {
            require_str(fields, "tool_use_id", path)?;
            match get(fields, "content") {
                None | Some(Value::String(_)) => {}
                Some(Value::Array(blocks)) => {
                    for (k, inner) in blocks.iter().enumerate() {
                        check_block(inner, &format!("{path}.content.{k}"), true)?;
                    }
                }
                Some(_) => {
                    return Err(ApiError::invalid(format!(
                        "{path}.content: Input should be a string or a list of content blocks"
                    )))
                }
            }
        }
        "thinking" if !nested => {
            require_str(fields, "thinking", path)?;
            require_str(fields, "signature", path)?;
        }
        _ => {
            let expected = if nested {
                NESTED_BLOCK_TYPES
            } else {
                BLOCK_TYPES
            };
            let hint = match kind {
                "image_url" => " (OpenAI's 'image_url' parts are 'image' blocks with a 'source')",
                _ => "",
            };
            return Err(ApiError::invalid(format!(
                "{path}.type: unknown content block type '{kind}' (expected one of: {expected}){hint}"
            )));
        }
    }
    Ok(())
}

/// The system prompt's text: a string, or text blocks joined by a space.
fn system_text(system: Option<&Value>) -> Result<Option<String>, ApiError> {
    let blocks = match system {
        None => return Ok(None),
        Some(Value::String(s)) => return Ok(Some(s.clone())),
        Some(Value::Array(blocks)) => blocks,
        Some(_) => {
            return Err(ApiError::invalid(
                "system: Input should be a string or a list of text blocks",
            ))
        }
    };
    let mut text = String::new();
    for (i, block) in blocks.iter().enumerate() {
        let path = format!("system.{i}");
        let Value::Object(fields) = block else {
            return Err(ApiError::invalid(format!(
                "{path}: Input should be an object"
            )));
        };
        let kind = require_str(fields, "type", &path)?;
        if kind != "text" {
            return Err(ApiError::invalid(format!(
                "{path}.type: system blocks must be 'text', got '{kind}'"
            )));
        }
        if i > 0 {
            text.push(' ');
        }
        text.push_str(require_str(fields, "text", &path)?);
    }
    Ok(Some(text))
}

/// Checks `tools` (each needs `name` and an `input_schema` object) and
/// returns their names in order.
fn check_tools(tools: Option<&Value>) -> Result<Vec<&str>, ApiError> {
    let tools = match tools {
        None => return Ok(Vec::new()),
        Some(Value::Array(tools)) => tools,
        Some(_) => return Err(ApiError::invalid("tools: Input should be a valid list")),
    };
    let mut names = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let path = format!("tools.{i}");
        let Value::Object(fields) = tool else {
            return Err(ApiError::invalid(format!(
                "{path}: Input should be an object"
            )));
        };
        // OpenAI's `{"type":"function","function":{...}}` is the likely mistake.
        let hint = if fields.contains_key("function") {
            " (OpenAI's {\"type\":\"function\",\"function\":{...}} shape is not Anthropic's; use {\"name\",\"description\",\"input_schema\"})"
        } else {
            ""
        };
        let name = require_str(fields, "name", &path)
            .map_err(|err| ApiError::invalid(format!("{}{hint}", err.message)))?;
        require_object(fields, "input_schema", &path)
            .map_err(|err| ApiError::invalid(format!("{}{hint}", err.message)))?;
        names.push(name);
    }
    Ok(names)
}

/// Checks `tool_choice` (an object `{type: auto|any|tool|none, name?}`,
/// never OpenAI's string form) and picks the tool to call: none without
/// tools or with `none`; the named one for `tool`; else the first.
fn tool_to_call<'a>(
    choice: Option<&'a Value>,
    tools: &[&'a str],
) -> Result<Option<&'a str>, ApiError> {
    let named = match choice {
        None => None,
        Some(Value::String(s)) => {
            return Err(ApiError::invalid(format!(
                "tool_choice: Input should be an object such as {{\"type\":\"auto\"}}, got the string '{s}' (OpenAI's form)"
            )))
        }
        Some(Value::Object(fields)) => match require_str(fields, "type", "tool_choice")? {
            "auto" | "any" => None,
            "none" => return Ok(None),
            "tool" => {
                let name = require_str(fields, "name", "tool_choice")?;
                if !tools.contains(&name) {
                    return Err(ApiError::invalid(format!(
                        "tool_choice.name: tool '{name}' is not in 'tools'"
                    )));
                }
                Some(name)
            }
            other => {
                return Err(ApiError::invalid(format!(
                    "tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none', got '{other}'"
                )))
            }
        },
        Some(_) => {
            return Err(ApiError::invalid(
                "tool_choice: Input should be an object",
            ))
        }
    };
    Ok(named.or_else(|| tools.first().copied()))
}

fn check_stop_sequences(stop: Option<&Value>) -> Result<Vec<&str>, ApiError> {
    let list = match stop {
        None => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(_) => {
            return Err(ApiError::invalid(
                "stop_sequences: Input should be a list of strings",
            ))
        }
    };
    list.iter()
        .enumerate()
        .map(|(i, s)| {
            s.as_str().ok_or_else(|| {
                ApiError::invalid(format!(
                    "stop_sequences.{i}: Input should be a valid string"
                ))
            })
        })
        .collect()
}

/// Whether extended thinking is on: `{type:"enabled", budget_tokens: n>0}`
/// or `{type:"disabled"}`.
fn check_thinking(thinking: Option<&Value>) -> Result<bool, ApiError> {
    let fields = match thinking {
        None => return Ok(false),
        Some(Value::Object(fields)) => fields,
        Some(_) => return Err(ApiError::invalid("thinking: Input should be an object")),
    };
    match require_str(fields, "type", "thinking")? {
        "enabled" => match get(fields, "budget_tokens") {
            None => Err(ApiError::invalid("thinking.budget_tokens: Field required")),
            Some(v) if v.as_u64().is_some_and(|n| n > 0) => Ok(true),
            Some(v) => Err(ApiError::invalid(format!(
                "thinking.budget_tokens: Input should be a positive integer, got {v}"
            ))),
        },
        "disabled" => Ok(false),
        other => Err(ApiError::invalid(format!(
            "thinking.type: Input should be 'enabled' or 'disabled', got '{other}'"
        ))),
    }
}

/// Calls `f` with every text of a message's content that counts as input:
/// the string content, `text` blocks and the text of `tool_result`s.
fn for_each_input_text(content: Option<&Value>, f: &mut impl FnMut(&str)) {
    match content {
        Some(Value::String(s)) => f(s),
        Some(Value::Array(blocks)) => {
            for block in blocks {
                match block.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        if let Some(text) = block.get("text").and_then(Value::as_str) {
                            f(text);
                        }
                    }
                    Some("tool_result") => for_each_input_text(block.get("content"), f),
                    _ => {}
                }
            }
        }
        _ => {}
    }
}

fn input_words(system: Option<&str>, messages: &[Value]) -> u64 {
    let mut words = system.map_or(0, text::word_count) as u64;
    for message in messages {
        for_each_input_text(message.get("content"), &mut |t| {
            words += text::word_count(t) as u64;
        });
    }
    words
}

/// Whether the last message is a user turn that carries a `tool_result`.
fn ends_with_tool_result(messages: &[Value]) -> bool {
    messages
        .last()
        .and_then(|m| m.get("content"))
        .and_then(Value::as_array)
        .is_some_and(|blocks| {
            blocks
                .iter()
                .any(|b| b.get("type").and_then(Value::as_str) == Some("tool_result"))
        })
}

/// Text of the last user message: its string content, or its `text` blocks
/// and the text of its `tool_result`s joined by a space.
fn last_user_text(messages: &[Value]) -> String {
    let mut out = String::new();
    let last = messages
        .iter()
        .rev()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"));
    match last.and_then(|m| m.get("content")) {
        Some(Value::String(s)) => out.push_str(s),
        Some(Value::Array(blocks)) => {
            let texts = blocks
                .iter()
                .filter_map(|b| match b.get("type").and_then(Value::as_str) {
                    Some("text") => b.get("text").and_then(Value::as_str),
                    Some("tool_result") => b.get("content").and_then(Value::as_str),
                    _ => None,
                });
            for (i, text) in texts.enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                out.push_str(text);
            }
        }
        _ => {}
    }
    out
}

/// `x-mock-system`: the first 200 characters of the system text with control
/// characters (which headers cannot carry) turned into spaces.
fn system_header(system: &str) -> Option<HeaderValue> {
    let value: String = system
        .chars()
        .take(SYSTEM_HEADER_CHARS)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    HeaderValue::from_bytes(value.as_bytes()).ok()
}

/// One content block of the answer.
enum Block {
    Thinking(String),
    Text(String),
    /// A call of the named tool with the fixed [`ToolInput`].
    ToolUse(String),
}

impl Block {
    fn word_count(&self) -> u64 {
        match self {
            Block::Thinking(text) | Block::Text(text) => text::word_count(text) as u64,
            // `{"mock":true,"n":1}` has no whitespace: one word.
            Block::ToolUse(_) => 1,
        }
    }
}

/// What the assistant says.
struct Answer {
    blocks: Vec<Block>,
    stop_reason: &'static str,
    stop_sequence: Option<String>,
}

impl Answer {
    fn new(req: &Request<'_>, words: Option<u64>) -> Answer {
        let last_user = last_user_text(req.messages);
        let mut blocks = Vec::with_capacity(3);
        if req.thinking {
            blocks.push(Block::Thinking(format!("mock thinking about: {last_user}")));
        }
        if let Some(name) = req.tool {
            blocks.push(Block::Text(format!("calling {name}")));
            blocks.push(Block::ToolUse(name.to_owned()));
            return Answer {
                blocks,
                stop_reason: "tool_use",
                stop_sequence: None,
            };
        }
        let mut reply = match words {
            Some(n) => text::numbered_words(usize::try_from(n).unwrap_or(usize::MAX)),
            None => format!("mock reply to: {last_user}"),
        };
        let mut stop_reason = "end_turn";
        let mut stop_sequence = None;
        // The earliest match wins; on a tie, the first listed.
        let hit = req
            .stop_sequences
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| reply.find(s).map(|at| (at, *s)))
            .min_by_key(|&(at, _)| at);
        if let Some((at, seq)) = hit {
            reply.truncate(at);
            stop_reason = "stop_sequence";
            stop_sequence = Some(seq.to_owned());
        }
        // A model that runs out of tokens before the stop sequence never
        // sees it, so the word limit is applied to what is left.
        let limit = usize::try_from(req.max_tokens).unwrap_or(usize::MAX);
        if let Some(kept) = text::truncate_words(&reply, limit) {
            // `kept` is a prefix of `reply`.
            let len = kept.len();
            reply.truncate(len);
            stop_reason = "max_tokens";
            stop_sequence = None;
        }
        blocks.push(Block::Text(reply));
        Answer {
            blocks,
            stop_reason,
            stop_sequence,
        }
    }

    fn output_tokens(&self) -> u64 {
        self.blocks.iter().map(Block::word_count).sum()
    }
}

#[derive(Serialize, Clone, Copy)]
struct Usage {
    input_tokens: u64,
    output_tokens: u64,
}

/// The message object: the whole answer, or the empty shell in
/// `message_start`.
#[derive(Serialize)]
struct Message<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    role: &'static str,
    model: &'a str,
    content: &'a [ContentBlock<'a>],
    stop_reason: Option<&'static str>,
    stop_sequence: Option<&'a str>,
    usage: Usage,
}

/// The fixed input of every mock tool call.
#[derive(Serialize)]
struct ToolInput {
    mock: bool,
    n: u32,
}

static TOOL_INPUT: ToolInput = ToolInput { mock: true, n: 1 };

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ContentBlock<'a> {
    Thinking {
        thinking: &'a str,
        signature: &'static str,
    },
    Text {
        text: &'a str,
    },
    ToolUse {
        id: &'static str,
        name: &'a str,
        input: &'static ToolInput,
    },
}

impl<'a> ContentBlock<'a> {
    fn from_block(block: &'a Block) -> Self {
        match block {
            Block::Thinking(thinking) => ContentBlock::Thinking {
                thinking,
                signature: SIGNATURE,
            },
            Block::Text(text) => ContentBlock::Text { text },
            Block::ToolUse(name) => ContentBlock::ToolUse {
                id: TOOL_USE_ID,
                name,
                input: &TOOL_INPUT,
            },
        }
    }
}

/// Serializes as `{}`: a streamed `tool_use` starts with an empty input.
#[derive(Serialize)]
struct EmptyObject {}

/// The `content_block` of `content_block_start`: the block, empty.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum StartBlock<'a> {
    Thinking {
        thinking: &'static str,
    },
    Text {
        text: &'static str,
    },
    ToolUse {
        id: &'static str,
        name: &'a str,
        input: EmptyObject,
    },
}

/// The `delta` of `content_block_delta`; its type is the variant name plus
/// `_delta`.
#[derive(Serialize)]
#[serde(tag = "type")]
enum Delta<'a> {
    #[serde(rename = "text_delta")]
    Text { text: &'a str },
    #[serde(rename = "input_json_delta")]
    InputJson { partial_json: &'a str },
    #[serde(rename = "thinking_delta")]
    Thinking { thinking: &'a str },
    #[serde(rename = "signature_delta")]
    Signature { signature: &'a str },
}

#[derive(Serialize)]
struct StopInfo<'a> {
    stop_reason: &'static str,
    stop_sequence: Option<&'a str>,
}

#[derive(Serialize)]
struct OutputUsage {
    output_tokens: u64,
}

/// One streamed event; its `type` doubles as the SSE `event:` name.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Event<'a> {
    MessageStart {
        message: Message<'a>,
    },
    Ping,
    ContentBlockStart {
        index: usize,
        content_block: StartBlock<'a>,
    },
    ContentBlockDelta {
        index: usize,
        delta: Delta<'a>,
    },
    ContentBlockStop {
        index: usize,
    },
    MessageDelta {
        delta: StopInfo<'a>,
        usage: OutputUsage,
    },
    MessageStop,
    Error {
        error: ErrorDetail<'a>,
    },
}

impl Event<'_> {
    fn name(&self) -> &'static str {
        match self {
            Event::MessageStart { .. } => "message_start",
            Event::Ping => "ping",
            Event::ContentBlockStart { .. } => "content_block_start",
            Event::ContentBlockDelta { .. } => "content_block_delta",
            Event::ContentBlockStop { .. } => "content_block_stop",
            Event::MessageDelta { .. } => "message_delta",
            Event::MessageStop => "message_stop",
            Event::Error { .. } => "error",
        }
    }

    fn frame(&self) -> Bytes {
        sse::named_event(self.name(), self)
    }
}

/// Where a [`MessageStream`] is.
#[derive(Clone, Copy)]
enum Stage {
    Start,
    Ping,
    /// Step 0 is `content_block_start`, then one step per delta, then
    /// `content_block_stop`.
    Block {
        index: usize,
        step: usize,
    },
    Delta,
    Stop,
    Error,
    Done,
}

/// Lazily produces the events of a streamed answer: `message_start`,
/// `ping`, per block a start, its deltas and a stop, then `message_delta`
/// and `message_stop`; or, under the stream-error fault, an `error` event
/// right after the first delta.
struct MessageStream {
    id: String,
    model: String,
    input_tokens: u64,
    answer: Answer,
    stage: Stage,
    /// Byte offsets of the streamed pieces of the current text or thinking
    /// block.
    starts: Vec<usize>,
    stream_error: bool,
}

impl MessageStream {
    fn message_start(&self) -> Bytes {
        Event::MessageStart {
            message: Message {
                id: &self.id,
                kind: "message",
                role: "assistant",
                model: &self.model,
                content: &[],
                stop_reason: None,
                stop_sequence: None,
                usage: Usage {
                    input_tokens: self.input_tokens,
                    output_tokens: 1,
                },
            },
        }
        .frame()
    }

    /// The stage after the last event of block `index`.
    fn after_block(&self, index: usize) -> Stage {
        if index + 1 < self.answer.blocks.len() {
            Stage::Block {
                index: index + 1,
                step: 0,
            }
        } else {
            Stage::Delta
        }
    }

    /// Event `step` of block `index` and the stage after it.
    fn block_event(&mut self, index: usize, step: usize) -> (Bytes, Stage) {
        if step == 0 {
            self.starts = match self.answer.blocks.get(index) {
                Some(Block::Thinking(text) | Block::Text(text)) => text::piece_starts(text),
                _ => Vec::new(),
            };
        }
        let Some(block) = self.answer.blocks.get(index) else {
            // Not reachable: stages only name existing blocks.
            return (self.message_delta(), Stage::Stop);
        };
        let deltas = match block {
            Block::Text(_) => self.starts.len(),
            // The signature comes after the thinking text.
            Block::Thinking(_) => self.starts.len() + 1,
            Block::ToolUse(_) => TOOL_INPUT_PIECES.len(),
        };
        if step == 0 {
            let content_block = match block {
                Block::Thinking(_) => StartBlock::Thinking { thinking: "" },
                Block::Text(_) => StartBlock::Text { text: "" },
                Block::ToolUse(name) => StartBlock::ToolUse {
                    id: TOOL_USE_ID,
                    name,
                    input: EmptyObject {},
                },
            };
            let event = Event::ContentBlockStart {
                index,
                content_block,
            };
            return (event.frame(), Stage::Block { index, step: 1 });
        }
        if step > deltas {
            let next = self.after_block(index);
            return (Event::ContentBlockStop { index }.frame(), next);
        }
        let piece = step - 1;
        let delta = match block {
            Block::Text(text) => Delta::Text {
                text: self.piece(text, piece),
            },
            Block::Thinking(text) if piece < self.starts.len() => Delta::Thinking {
                thinking: self.piece(text, piece),
            },
            Block::Thinking(_) => Delta::Signature {
                signature: SIGNATURE,
            },
            Block::ToolUse(_) => Delta::InputJson {
                partial_json: TOOL_INPUT_PIECES.get(piece).copied().unwrap_or(""),
            },
        };
        let next = if self.stream_error {
            Stage::Error
        } else {
            Stage::Block {
                index,
                step: step + 1,
            }
        };
        (Event::ContentBlockDelta { index, delta }.frame(), next)
    }

    /// Piece `k` of `text`, per `self.starts`.
    fn piece<'t>(&self, text: &'t str, k: usize) -> &'t str {
        let start = self.starts.get(k).copied().unwrap_or(text.len());
        let end = self.starts.get(k + 1).copied().unwrap_or(text.len());
        text.get(start..end).unwrap_or("")
    }

    fn message_delta(&self) -> Bytes {
        Event::MessageDelta {
            delta: StopInfo {
                stop_reason: self.answer.stop_reason,
                stop_sequence: self.answer.stop_sequence.as_deref(),
            },
            usage: OutputUsage {
                output_tokens: self.answer.output_tokens(),
            },
        }
        .frame()
    }

    fn error_event() -> Bytes {
        Event::Error {
            error: ErrorDetail {
                kind: "overloaded_error",
                message: "Overloaded",
            },
        }
        .frame()
    }
}

impl Iterator for MessageStream {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        let (event, next) = match self.stage {
            Stage::Start => (self.message_start(), Stage::Ping),
            Stage::Ping => {
                let next = if self.answer.blocks.is_empty() {
                    Stage::Delta
                } else {
                    Stage::Block { index: 0, step: 0 }
                };
                (Event::Ping.frame(), next)
            }
            Stage::Block { index, step } => self.block_event(index, step),
            // A stream-error stream without any delta fails here instead.
            Stage::Delta if self.stream_error => (Self::error_event(), Stage::Done),
            Stage::Delta => (self.message_delta(), Stage::Stop),
            Stage::Stop => (Event::MessageStop.frame(), Stage::Done),
            Stage::Error => (Self::error_event(), Stage::Done),
            Stage::Done => return None,
        };
        self.stage = next;
        Some(event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_input_pieces_join_to_the_input() {
        let json = serde_json::to_string(&TOOL_INPUT).ok();
        assert_eq!(json.as_deref(), Some(r#"{"mock":true,"n":1}"#));
        assert_eq!(TOOL_INPUT_PIECES.concat(), r#"{"mock":true,"n":1}"#);
    }

    #[test]
    fn system_header_is_cut_and_cleaned() {
        let header = system_header("be\nbrief\té");
        assert_eq!(
            header.as_ref().map(HeaderValue::as_bytes),
            Some("be brief é".as_bytes())
        );
        let long = "x".repeat(300);
        assert_eq!(system_header(&long).map(|h| h.len()), Some(200));
    }

    #[test]
    fn events_are_named_by_type() {
        let frame = Event::ContentBlockStop { index: 2 }.frame();
        assert_eq!(
            &frame[..],
            b"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":2}\n\n"
        );
        let frame = Event::Ping.frame();
        assert_eq!(&frame[..], b"event: ping\ndata: {\"type\":\"ping\"}\n\n");
    }
}
