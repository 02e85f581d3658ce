//! `POST /v2/chat`: Cohere's Chat API with strict request checks,
//! deterministic replies, tool calls and named-event SSE streaming.
//!
//! The reply is one text content item, `"mock reply to: <last user text>"`
//! (or `w1 ... wn` under the `words` fault), cut before the earliest
//! `stop_sequences` match (`STOP_SEQUENCE`) and then at `max_tokens` words
//! (`MAX_TOKENS`); else `COMPLETE`. When the last message is a tool result,
//! the text answered is that result (the trailing tool messages' content,
//! joined by a space). Otherwise, with `tools` and a `tool_choice` other than
//! `NONE`, the reply is a tool plan (`"I will call NAME."`) and one call of
//! the first tool with arguments `{"mock":true,"n":1}` (`TOOL_CALL`).
//!
//! Token counts are word counts: input over every message's text, output
//! over the reply (a tool call counts its plan plus one word for the
//! arguments); `billed_units` and `tokens` agree.
//!
//! Streaming (`"stream": true`): `event: <type>` / `data: {"type":<type>,...}`
//! pairs: `message-start`, then `content-start`, one `content-delta` per
//! word, `content-end`; or one `tool-plan-delta` per word, `tool-call-start`,
//! three `tool-call-delta`s (the argument pieces), `tool-call-end`; then
//! `message-end` with the finish reason and usage.

use bytes::Bytes;
use http::header::{HeaderValue, CACHE_CONTROL};
use http::StatusCode;
use serde_json::{json, Map, Value};

use super::{check_fields, get, parse_object, require_str, uuid_like, ApiError, HandlerResult};
use crate::body::{self, MockBody};
use crate::server::Ctx;
use crate::sse::{self, SseBody};
use crate::text;

/// Id of the (single) tool call in tool-call answers.
const TOOL_CALL_ID: &str = "call_mock_0";
/// Arguments of every mock tool call.
const TOOL_ARGUMENTS: &str = r#"{"mock":true,"n":1}"#;
/// How the arguments are streamed; joins back to `TOOL_ARGUMENTS`.
const TOOL_ARGUMENT_PIECES: [&str; 3] = [r#"{"mock":"#, "true,", r#""n":1}"#];
/// Cohere's limit on `stop_sequences`.
const MAX_STOP_SEQUENCES: usize = 5;

/// Fields of the v2 chat request.
const REQUEST_FIELDS: [&str; 22] = [
    "stream",
    "model",
    "messages",
    "tools",
    "strict_tools",
    "documents",
    "citation_options",
    "response_format",
    "safety_mode",
    "max_tokens",
    "stop_sequences",
    "temperature",
    "seed",
    "frequency_penalty",
    "presence_penalty",
    "k",
    "p",
    "return_prompt",
    "logprobs",
    "tool_choice",
    "thinking",
    "priority",
];

/// OpenAI chat fields Cohere does not have, with what Cohere uses instead.
const OPENAI_HINTS: [(&str, &str); 11] = [
    ("n", "Cohere returns one generation per request"),
    ("top_p", "Cohere calls it 'p'"),
    ("top_k", "Cohere calls it 'k'"),
    ("stop", "Cohere uses 'stop_sequences'"),
    ("max_completion_tokens", "Cohere uses 'max_tokens'"),
    (
        "stream_options",
        "Cohere always sends usage in the message-end event",
    ),
    ("logit_bias", "Cohere has no logit bias"),
    ("parallel_tool_calls", "Cohere has no such switch"),
    ("user", "Cohere has no end-user field"),
    ("functions", "Cohere uses 'tools'"),
    ("function_call", "Cohere uses 'tool_choice'"),
];

/// The request, checked and reduced to what the reply depends on.
struct Request<'a> {
    messages: &'a [Value],
    stream: bool,
    max_tokens: Option<u64>,
    stop_sequences: Vec<&'a str>,
    /// The tool to call, when the reply may be a call.
    tool: Option<&'a str>,
}

/// Answers `POST /v2/chat`.
pub(super) fn handle(ctx: &Ctx<'_>, body: &[u8]) -> HandlerResult {
    let fields = parse_object(body)?;
    let req = Request::from_fields(&fields)?;
    let answer = Answer::new(&req, ctx.faults.words);
    let usage = Usage {
        input: input_words(req.messages),
        output: answer.word_count(),
    };
    let id = uuid_like(ctx.shared.next_id());

    if req.stream {
        let starts = match &answer {
            Answer::Text { text, .. } => text::piece_starts(text),
            Answer::ToolCall { plan, .. } => text::piece_starts(plan),
        };
        let events = ChatStream {
            id,
            answer,
            usage,
            starts,
            stage: Stage::Start,
        };
        let faults = ctx.faults.stream_faults(ctx.failure.disconnect_after);
        let sse = SseBody::new(Box::new(events), faults);
        let mut resp = body::response(StatusCode::OK, "text/event-stream", MockBody::Sse(sse));
        resp.headers_mut()
            .insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        return Ok(resp);
    }

    let message = match &answer {
        Answer::Text { text, .. } => json!({
            "role": "assistant",
            "content": [{"type": "text", "text": text}],
        }),
        Answer::ToolCall { name, plan } => json!({
            "role": "assistant",
            "tool_plan": plan,
            "tool_calls": [{
                "id": TOOL_CALL_ID,
                "type": "function",
                "function": {"name": name, "arguments": TOOL_ARGUMENTS},
            }],
        }),
    };
    let reply = json!({
        "id": id,
        "finish_reason": answer.finish_reason(),
        "message": message,
        "usage": usage.json(),
    });
    Ok(body::json(StatusCode::OK, &reply))
}

impl<'a> Request<'a> {
    fn from_fields(fields: &'a Map<String, Value>) -> Result<Self, ApiError> {
        check_fields(fields, &REQUEST_FIELDS, &OPENAI_HINTS)?;
        let model = require_str(fields, "model", "model")?;
        if model.is_empty() {
            return Err(ApiError::invalid("model must not be empty"));
        }
        let messages = check_messages(get(fields, "messages"))?;
        let tools = check_tools(get(fields, "tools"))?;
        let tool = match get(fields, "tool_choice") {
            None => tools.first().copied(),
            Some(Value::String(choice)) if choice == "NONE" => None,
            Some(Value::String(choice)) if choice == "REQUIRED" => {
                if tools.is_empty() {
                    return Err(ApiError::invalid(
                        "tool_choice REQUIRED needs at least one tool in 'tools'",
                    ));
                }
                tools.first().copied()
            }
            Some(other) => {
                return Err(ApiError::invalid(format!(
                    "tool_choice must be \"REQUIRED\" or \"NONE\" (omit it for auto), got {other}"
                )))
            }
        };
        let stream = match get(fields, "stream") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                return Err(ApiError::invalid(format!(
                    "stream must be a boolean, got {other}"
                )))
            }
        };
        let max_tokens = match get(fields, "max_tokens") {
            None => None,
            Some(value) => Some(value.as_u64().filter(|&n| n > 0).ok_or_else(|| {
                ApiError::invalid(format!(
                    "max_tokens must be a positive integer, got {value}"
                ))
            })?),
        };
        let stop_sequences = match get(fields, "stop_sequences") {
            None => Vec::new(),
            Some(Value::Array(list)) if list.len() <= MAX_STOP_SEQUENCES => list
                .iter()
                .map(|s| {
                    s.as_str()
                        .ok_or_else(|| ApiError::invalid("stop_sequences must be strings"))
                })
                .collect::<Result<_, _>>()?,
            Some(_) => {
                return Err(ApiError::invalid(format!(
                    "stop_sequences must be a list of at most {MAX_STOP_SEQUENCES} strings"
                )))
            }
        };
        Ok(Request {
            messages,
            stream,
            max_tokens,
            stop_sequences,
            tool,
        })
    }
}

/// Checks `messages`: a non-empty list of system / user / assistant / tool
/// messages in Cohere's shapes.
fn check_messages(value: Option<&Value>) -> Result<&[Value], ApiError> {
    let messages = match value {
        None => return Err(ApiError::invalid("messages is required")),
        Some(Value::Array(list)) => list.as_slice(),
        Some(_) => return Err(ApiError::invalid("messages must be a list")),
    };
    if messages.is_empty() {
        return Err(ApiError::invalid("messages must not be empty"));
    }
    for (i, message) in messages.iter().enumerate() {
        let path = format!("messages[{i}]");
        let Value::Object(fields) = message else {
            return Err(ApiError::invalid(format!("{path} must be an object")));
        };
        let role = require_str(fields, "role", &format!("{path}.role"))?;
        let content = get(fields, "content");
        match role {
            "system" | "user" => {
                let kinds: &[&str] = if role == "user" {
                    &["text", "image_url", "document"]
                } else {
                    &["text"]
                };
                check_content(content, &path, kinds, true)?;
            }
            "assistant" => {
                check_content(content, &path, &["text", "thinking"], false)?;
                let calls = check_tool_calls(get(fields, "tool_calls"), &path)?;
                if content.is_none() && !calls && get(fields, "tool_plan").is_none() {
                    return Err(ApiError::invalid(format!(
                        "{path}: an assistant message needs content or tool_calls"
                    )));
                }
            }
            "tool" => {
                let id = require_str(fields, "tool_call_id", &format!("{path}.tool_call_id"))?;
                if id.is_empty() {
                    return Err(ApiError::invalid(format!(
                        "{path}.tool_call_id must not be empty"
                    )));
                }
                check_content(content, &path, &["text", "document"], true)?;
            }
            other => {
                let hint = match other {
                    "developer" => " (use 'system')",
                    "function" => " (tool results use role 'tool')",
                    _ => "",
                };
                return Err(ApiError::invalid(format!(
                    "{path}.role must be one of system, user, assistant, tool, got '{other}'{hint}"
                )));
            }
        }
    }
    Ok(messages)
}

/// Checks a message's `content`: a string or a list of items whose `type`
/// is in `kinds`.
fn check_content(
    content: Option<&Value>,
    path: &str,
    kinds: &[&str],
    required: bool,
) -> Result<(), ApiError> {
    let items = match content {
        None if required => return Err(ApiError::invalid(format!("{path}.content is required"))),
        None | Some(Value::String(_)) => return Ok(()),
        Some(Value::Array(items)) => items,
        Some(_) => {
            return Err(ApiError::invalid(format!(
                "{path}.content must be a string or a list of content items"
            )))
        }
    };
    for (j, item) in items.iter().enumerate() {
        let item_path = format!("{path}.content[{j}]");
        let Value::Object(fields) = item else {
            return Err(ApiError::invalid(format!("{item_path} must be an object")));
        };
        let kind = require_str(fields, "type", &format!("{item_path}.type"))?;
        if !kinds.contains(&kind) {
            return Err(ApiError::invalid(format!(
                "{item_path}.type must be one of {}, got '{kind}'",
                kinds.join(", ")
            )));
        }
        if kind == "text" {
            require_str(fields, "text", &format!("{item_path}.text"))?;
        }
    }
    Ok(())
}

/// Checks an assistant message's `tool_calls`; true when there are some.
fn check_tool_calls(value: Option<&Value>, path: &str) -> Result<bool, ApiError> {
    let calls = match value {
        None => return Ok(false),
        Some(Value::Array(calls)) => calls,
        Some(_) => {
            return Err(ApiError::invalid(format!(
                "{path}.tool_calls must be a list"
            )))
        }
    };
    for (j, call) in calls.iter().enumerate() {
        let call_path = format!("{path}.tool_calls[{j}]");
        let Value::Object(fields) = call else {
            return Err(ApiError::invalid(format!("{call_path} must be an object")));
        };
        require_str(fields, "id", &format!("{call_path}.id"))?;
        let Some(Value::Object(function)) = get(fields, "function") else {
            return Err(ApiError::invalid(format!(
                "{call_path}.function must be an object with name and arguments"
            )));
        };
        require_str(function, "name", &format!("{call_path}.function.name"))?;
        if let Some(arguments) = get(function, "arguments") {
            if !arguments.is_string() {
                return Err(ApiError::invalid(format!(
                    "{call_path}.function.arguments must be a JSON string, got {arguments}"
                )));
            }
        }
    }
    Ok(!calls.is_empty())
}

/// Checks `tools` (`[{"type":"function","function":{name, description,
/// parameters}}]`) and returns the function names in order.
fn check_tools(value: Option<&Value>) -> Result<Vec<&str>, ApiError> {
    let tools = match value {
        None => return Ok(Vec::new()),
        Some(Value::Array(tools)) => tools,
        Some(_) => return Err(ApiError::invalid("tools must be a list")),
    };
    let mut names = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let path = format!("tools[{i}]");
        let Value::Object(fields) = tool else {
            return Err(ApiError::invalid(format!("{path} must be an object")));
        };
        if fields.contains_key("parameter_definitions") {
            return Err(ApiError::invalid(format!(
                "{path}: parameter_definitions is the v1 tool shape; v2 takes \
                 {{\"type\":\"function\",\"function\":{{\"name\",\"description\",\"parameters\"}}}}"
            )));
        }
        let kind = require_str(fields, "type", &format!("{path}.type"))?;
        if kind != "function" {
            return Err(ApiError::invalid(format!(
                "{path}.type must be 'function', got '{kind}'"
            )));
        }
        let Some(Value::Object(function)) = get(fields, "function") else {
            return Err(ApiError::invalid(format!("{path}.function is required")));
        };
        let name = require_str(function, "name", &format!("{path}.function.name"))?;
        if let Some(parameters) = get(function, "parameters") {
            if !parameters.is_object() {
                return Err(ApiError::invalid(format!(
                    "{path}.function.parameters must be a JSON schema object"
                )));
            }
        }
        names.push(name);
    }
    Ok(names)
}

/// Calls `f` with every text of a message's content: the string, the text
/// items, and a document item's `data` (as JSON unless it is a string).
fn for_each_text(content: Option<&Value>, f: &mut impl FnMut(&str)) {
    match content {
        Some(Value::String(text)) => f(text),
        Some(Value::Array(items)) => {
            for item in items {
                match item.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        if let Some(text) = item.get("text").and_then(Value::as_str) {
                            f(text);
                        }
                    }
                    Some("document") => match item.get("document").and_then(|d| d.get("data")) {
                        Some(Value::String(data)) => f(data),
                        Some(data) => f(&data.to_string()),
                        None => {}
                    },
                    _ => {}
                }
            }
        }
        _ => {}
    }
}

fn input_words(messages: &[Value]) -> u64 {
    let mut words = 0u64;
    for message in messages {
        for_each_text(message.get("content"), &mut |t| {
            words += text::word_count(t) as u64;
        });
    }
    words
}

/// Texts of `messages` joined by a space.
fn joined_text<'v>(messages: impl Iterator<Item = &'v Value>) -> String {
    let mut out = String::new();
    for message in messages {
        for_each_text(message.get("content"), &mut |t| {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(t);
        });
    }
    out
}

/// What the assistant says.
#[derive(Debug, PartialEq)]
enum Answer {
    Text {
        text: String,
        finish_reason: &'static str,
    },
    ToolCall {
        name: String,
        plan: String,
    },
}

impl Answer {
    fn new(req: &Request<'_>, words: Option<u64>) -> Answer {
        let role = |m: &Value| m.get("role").and_then(Value::as_str) == Some("tool");
        let trailing_tools = req.messages.iter().rev().take_while(|m| role(m)).count();
        if trailing_tools == 0 {
            if let Some(name) = req.tool {
                return Answer::ToolCall {
                    name: name.to_owned(),
                    plan: format!("I will call {name}."),
                };
            }
        }
        let answered = if trailing_tools > 0 {
            joined_text(req.messages[req.messages.len() - trailing_tools..].iter())
        } else {
            let last_user = req
                .messages
                .iter()
                .rev()
                .find(|m| m.get("role").and_then(Value::as_str) == Some("user"));
            joined_text(last_user.into_iter())
        };
        let mut text = match words {
            Some(n) => text::numbered_words(usize::try_from(n).unwrap_or(usize::MAX)),
            None => format!("mock reply to: {answered}"),
        };
        let mut finish_reason = "COMPLETE";
        let hit = req
            .stop_sequences
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| text.find(s))
            .min();
        if let Some(at) = hit {
            text.truncate(at);
            finish_reason = "STOP_SEQUENCE";
        }
        if let Some(limit) = req.max_tokens {
            let limit = usize::try_from(limit).unwrap_or(usize::MAX);
            if let Some(kept) = text::truncate_words(&text, limit) {
                // `kept` is a prefix of `text`.
                let len = kept.len();
                text.truncate(len);
                finish_reason = "MAX_TOKENS";
            }
        }
        Answer::Text {
            text,
            finish_reason,
        }
    }

    fn word_count(&self) -> u64 {
        match self {
            Answer::Text { text, .. } => text::word_count(text) as u64,
            // The arguments JSON has no whitespace: one word.
            Answer::ToolCall { plan, .. } => text::word_count(plan) as u64 + 1,
        }
    }

    fn finish_reason(&self) -> &'static str {
        match self {
            Answer::Text { finish_reason, .. } => finish_reason,
            Answer::ToolCall { .. } => "TOOL_CALL",
        }
    }
}

#[derive(Clone, Copy)]
struct Usage {
    input: u64,
    output: u64,
}

impl Usage {
    fn json(self) -> Value {
        let counts = json!({"input_tokens": self.input, "output_tokens": self.output});
        json!({"billed_units": counts, "tokens": counts})
    }
}

/// Where a [`ChatStream`] is.
#[derive(Clone, Copy)]
enum Stage {
    Start,
    ContentStart,
    ContentDelta(usize),
    ContentEnd,
    PlanDelta(usize),
    CallStart,
    CallDelta(usize),
    CallEnd,
    End,
    Done,
}

/// Lazily produces the events of a streamed answer.
struct ChatStream {
    id: String,
    answer: Answer,
    usage: Usage,
    /// Byte offsets of the pieces of the text or the tool plan.
    starts: Vec<usize>,
    stage: Stage,
}

impl ChatStream {
    /// Piece `k` of `text`, per `self.starts`.
    fn piece<'t>(&self, text: &'t str, k: usize) -> &'t str {
        let start = self.starts.get(k).copied().unwrap_or(text.len());
        let end = self.starts.get(k + 1).copied().unwrap_or(text.len());
        text.get(start..end).unwrap_or("")
    }

    /// The stage after the last piece `k` of the text or plan.
    fn after_piece(&self, k: usize, more: Stage, done: Stage) -> Stage {
        if k + 1 < self.starts.len() {
            more
        } else {
            done
        }
    }

    /// The event at the current stage and the stage after it.
    fn step(&self) -> Option<(&'static str, Value, Stage)> {
        let event = match (self.stage, &self.answer) {
            (Stage::Start, answer) => {
                let next = match answer {
                    Answer::Text { .. } => Stage::ContentStart,
                    Answer::ToolCall { .. } if self.starts.is_empty() => Stage::CallStart,
                    Answer::ToolCall { .. } => Stage::PlanDelta(0),
                };
                let message = json!({"role": "assistant", "content": [], "tool_plan": "",
                                     "tool_calls": [], "citations": []});
                (
                    "message-start",
                    json!({"id": self.id, "delta": {"message": message}}),
                    next,
                )
            }
            (Stage::ContentStart, _) => {
                let next = if self.starts.is_empty() {
                    Stage::ContentEnd
                } else {
                    Stage::ContentDelta(0)
                };
                (
                    "content-start",
                    json!({"index": 0, "delta": {"message": {"content": {"type": "text", "text": ""}}}}),
                    next,
                )
            }
            (Stage::ContentDelta(k), Answer::Text { text, .. }) => (
                "content-delta",
                json!({"index": 0, "delta": {"message": {"content": {"text": self.piece(text, k)}}}}),
                self.after_piece(k, Stage::ContentDelta(k + 1), Stage::ContentEnd),
            ),
            (Stage::ContentEnd, _) => ("content-end", json!({"index": 0}), Stage::End),
            (Stage::PlanDelta(k), Answer::ToolCall { plan, .. }) => (
                "tool-plan-delta",
                json!({"delta": {"message": {"tool_plan": self.piece(plan, k)}}}),
                self.after_piece(k, Stage::PlanDelta(k + 1), Stage::CallStart),
            ),
            (Stage::CallStart, Answer::ToolCall { name, .. }) => {
                let call = json!({"id": TOOL_CALL_ID, "type": "function",
                                  "function": {"name": name, "arguments": ""}});
                (
                    "tool-call-start",
                    json!({"index": 0, "delta": {"message": {"tool_calls": call}}}),
                    Stage::CallDelta(0),
                )
            }
            (Stage::CallDelta(k), _) => {
                let piece = TOOL_ARGUMENT_PIECES.get(k).copied().unwrap_or("");
                let next = if k + 1 < TOOL_ARGUMENT_PIECES.len() {
                    Stage::CallDelta(k + 1)
                } else {
                    Stage::CallEnd
                };
                (
                    "tool-call-delta",
                    json!({"index": 0, "delta": {"message": {"tool_calls": {"function": {"arguments": piece}}}}}),
                    next,
                )
            }
            (Stage::CallEnd, _) => ("tool-call-end", json!({"index": 0}), Stage::End),
            (Stage::End, answer) => (
                "message-end",
                json!({"delta": {"finish_reason": answer.finish_reason(), "usage": self.usage.json()}}),
                Stage::Done,
            ),
            // Stages that do not fit the answer are not reachable.
            _ => return None,
        };
        Some(event)
    }
}

impl Iterator for ChatStream {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        let (name, mut data, next) = self.step()?;
        self.stage = next;
        if let Value::Object(fields) = &mut data {
            fields.insert("type".to_owned(), Value::String(name.to_owned()));
        }
        Some(sse::named_event(name, &data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(body: Value) -> Result<Answer, String> {
        let fields = body.as_object().cloned().unwrap_or_default();
        let req = Request::from_fields(&fields).map_err(|e| e.message)?;
        Ok(Answer::new(&req, None))
    }

    fn tools() -> Value {
        json!([{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}])
    }

    #[test]
    fn tool_arguments_pieces_join() {
        assert_eq!(TOOL_ARGUMENT_PIECES.concat(), TOOL_ARGUMENTS);
    }

    #[test]
    fn answers_follow_the_request() {
        let user = json!([{"role": "system", "content": "be brief"},
                          {"role": "user", "content": [{"type": "text", "text": "hi there"}]}]);
        assert_eq!(
            answer(json!({"model": "m", "messages": user, "max_tokens": 3})),
            Ok(Answer::Text {
                text: "mock reply to:".into(),
                finish_reason: "MAX_TOKENS"
            })
        );
        assert_eq!(
            answer(json!({"model": "m", "messages": user, "stop_sequences": ["there"]})),
            Ok(Answer::Text {
                text: "mock reply to: hi ".into(),
                finish_reason: "STOP_SEQUENCE"
            })
        );
        assert_eq!(
            answer(json!({"model": "m", "messages": user, "tools": tools()})),
            Ok(Answer::ToolCall {
                name: "lookup".into(),
                plan: "I will call lookup.".into()
            })
        );
        let none = answer(
            json!({"model": "m", "messages": user, "tools": tools(), "tool_choice": "NONE"}),
        );
        assert!(matches!(none, Ok(Answer::Text { .. })));

        let answered = json!([
            {"role": "user", "content": "hi"},
            {"role": "assistant", "tool_plan": "p", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": [
                {"type": "document", "document": {"data": {"temp": 20}}}]},
        ]);
        assert_eq!(
            answer(json!({"model": "m", "messages": answered, "tools": tools()})),
            Ok(Answer::Text {
                text: r#"mock reply to: {"temp":20}"#.into(),
                finish_reason: "COMPLETE"
            })
        );
    }

    #[test]
    fn wrong_shapes_are_refused() {
        let user = json!([{"role": "user", "content": "hi"}]);
        let refused = |body: Value, needle: &str| {
            let message = answer(body).err().unwrap_or_default();
            assert!(message.contains(needle), "{message:?} lacks {needle:?}");
        };
        refused(json!({"model": "m", "messages": user, "top_p": 0.5}), "'p'");
        refused(json!({"model": "m", "messages": user, "n": 2}), "'n'");
        refused(
            json!({"model": "m", "messages": user, "stop": ["x"]}),
            "stop_sequences",
        );
        refused(
            json!({"model": "m", "messages": user, "max_completion_tokens": 5}),
            "max_tokens",
        );
        refused(json!({"messages": user}), "model is required");
        refused(json!({"model": "m", "messages": []}), "must not be empty");
        refused(
            json!({"model": "m", "messages": [{"role": "tool", "content": "x"}]}),
            "tool_call_id",
        );
        refused(
            json!({"model": "m", "messages": [{"role": "developer", "content": "x"}]}),
            "use 'system'",
        );
        refused(
            json!({"model": "m", "messages": user, "tool_choice": "auto"}),
            "REQUIRED",
        );
        let v1 = json!([{"name": "f", "parameter_definitions": {}}]);
        refused(
            json!({"model": "m", "messages": user, "tools": v1}),
            "v1 tool shape",
        );
    }

    #[test]
    fn stream_events_are_named_and_complete() {
        let stream = ChatStream {
            id: "id".into(),
            answer: Answer::ToolCall {
                name: "f".into(),
                plan: "I will call f.".into(),
            },
            usage: Usage {
                input: 1,
                output: 5,
            },
            starts: text::piece_starts("I will call f."),
            stage: Stage::Start,
        };
        let names: Vec<String> = stream
            .map(|e| {
                let text = String::from_utf8_lossy(&e).into_owned();
                text.lines()
                    .next()
                    .and_then(|l| l.strip_prefix("event: "))
                    .unwrap_or("")
                    .to_owned()
            })
            .collect();
        assert_eq!(
            names,
            [
                "message-start",
                "tool-plan-delta",
                "tool-plan-delta",
                "tool-plan-delta",
                "tool-plan-delta",
                "tool-call-start",
                "tool-call-delta",
                "tool-call-delta",
                "tool-call-delta",
                "tool-call-end",
                "message-end"
            ]
        );
    }
}
