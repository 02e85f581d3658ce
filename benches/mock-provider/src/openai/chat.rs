//! `POST /chat/completions`: deterministic replies, tool calls and SSE
//! streaming in OpenAI's Chat Completions format.
//!
//! The reply is `"mock reply to: <last user or tool message text>"` (no tool
//! call follows a tool result), or `w1 ... wn`
//! under the `words` fault. Token counts are word counts.

use bytes::Bytes;
use http::header::{HeaderValue, CACHE_CONTROL};
use http::StatusCode;
use serde::{Deserialize, Serialize};

use super::{parse_json, unix_now, ApiError, HandlerResult, Str};
use crate::body::{self, MockBody};
use crate::server::Ctx;
use crate::sse::{self, SseBody};
use crate::text;

/// Id of the (single) tool call in tool-call answers.
const TOOL_CALL_ID: &str = "call_mock_0";
/// Arguments of every mock tool call.
const TOOL_ARGUMENTS: &str = r#"{"mock":true,"n":1}"#;
/// How the arguments are split when streamed; joins back to `TOOL_ARGUMENTS`.
const TOOL_ARGUMENT_PIECES: [&str; 3] = [r#"{"mock":"#, "true,", r#""n":1}"#];
/// Largest `n` accepted, as in OpenAI's API.
const MAX_CHOICES: u64 = 128;
/// Largest non-streamed reply (content size times `n`), so a `words`
/// typo cannot build a gigabyte response in memory.
const MAX_REPLY_BYTES: usize = 256 * 1024 * 1024;
const DEFAULT_MODEL: &str = "mock-model";
const SYSTEM_FINGERPRINT: &str = "fp_mock";

#[derive(Deserialize)]
struct ChatRequest<'a> {
    #[serde(borrow, default)]
    model: Option<Str<'a>>,
    #[serde(borrow)]
    messages: Vec<Message<'a>>,
    #[serde(default)]
    n: Option<u64>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(borrow, default)]
    tools: Option<Vec<Tool<'a>>>,
    #[serde(borrow, default)]
    tool_choice: Option<ToolChoice<'a>>,
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow)]
    role: Str<'a>,
    #[serde(borrow, default)]
    content: Option<Content<'a>>,
}

/// Message content: a plain string or an array of typed parts.
#[derive(Deserialize)]
#[serde(untagged)]
enum Content<'a> {
    Text(#[serde(borrow)] Str<'a>),
    Parts(#[serde(borrow)] Vec<Part<'a>>),
}

#[derive(Deserialize)]
struct Part<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<Str<'a>>,
    #[serde(borrow, default)]
    text: Option<Str<'a>>,
}

impl Content<'_> {
    /// Calls `f` with each text of the content (non-text parts skipped).
    fn for_each_text(&self, mut f: impl FnMut(&str)) {
        match self {
            Content::Text(text) => f(text.as_str()),
            Content::Parts(parts) => {
                for part in parts {
                    let is_text = part.kind.as_ref().is_none_or(|k| k.as_str() == "text");
                    if let (true, Some(text)) = (is_text, &part.text) {
                        f(text.as_str());
                    }
                }
            }
        }
    }
}

#[derive(Deserialize)]
struct Tool<'a> {
    #[serde(borrow, default)]
    function: Option<FunctionName<'a>>,
    /// Flat `{"type":"function","name":...}` tools, as some clients send.
    #[serde(borrow, default)]
    name: Option<Str<'a>>,
}

#[derive(Deserialize)]
struct FunctionName<'a> {
    #[serde(borrow, default)]
    name: Option<Str<'a>>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ToolChoice<'a> {
    /// `"none"`, `"auto"` or `"required"`.
    Mode(#[serde(borrow)] Str<'a>),
    Named {
        #[serde(borrow, default)]
        function: Option<FunctionName<'a>>,
    },
}

/// What every choice of the answer says.
enum Answer {
    Text {
        content: String,
        finish_reason: &'static str,
    },
    ToolCall {
        name: String,
    },
}

impl Answer {
    fn from_request(req: &ChatRequest<'_>, words: Option<u64>) -> Result<Answer, ApiError> {
        // After a tool result the model answers in words, so a test sees the result arrived.
        let after_tool = req
            .messages
            .last()
            .is_some_and(|m| m.role.as_str() == "tool");
        if !after_tool {
            if let Some(name) = tool_to_call(req)? {
                return Ok(Answer::ToolCall { name });
            }
        }
        let mut content = match words {
            Some(n) => text::numbered_words(usize::try_from(n).unwrap_or(usize::MAX)),
            None => {
                let mut reply = String::from("mock reply to: ");
                let last_user = req
                    .messages
                    .iter()
                    .rev()
                    .find(|m| matches!(m.role.as_str(), "user" | "tool"));
                if let Some(content) = last_user.and_then(|m| m.content.as_ref()) {
                    let mut first = true;
                    content.for_each_text(|t| {
                        if !first {
                            reply.push(' ');
                        }
                        first = false;
                        reply.push_str(t);
                    });
                }
                reply
            }
        };
        let mut finish_reason = "stop";
        let limit = [req.max_tokens, req.max_completion_tokens]
            .into_iter()
            .flatten()
            .min();
        if let Some(limit) = limit {
            let limit = usize::try_from(limit).unwrap_or(usize::MAX);
            if let Some(kept) = text::truncate_words(&content, limit) {
                // `kept` is a prefix of `content`.
                let len = kept.len();
                content.truncate(len);
                finish_reason = "length";
            }
        }
        Ok(Answer::Text {
            content,
            finish_reason,
        })
    }

    fn word_count(&self) -> u64 {
        let text = match self {
            Answer::Text { content, .. } => content.as_str(),
            Answer::ToolCall { .. } => TOOL_ARGUMENTS,
        };
        text::word_count(text) as u64
    }

    fn finish_reason(&self) -> &'static str {
        match self {
            Answer::Text { finish_reason, .. } => finish_reason,
            Answer::ToolCall { .. } => "tool_calls",
        }
    }
}

/// The function to call: none unless tools are given and `tool_choice` is
/// not `"none"`; then the named one, else the first tool.
fn tool_to_call(req: &ChatRequest<'_>) -> Result<Option<String>, ApiError> {
    let Some(first) = req.tools.as_ref().and_then(|tools| tools.first()) else {
        return Ok(None);
    };
    match &req.tool_choice {
        Some(ToolChoice::Mode(mode)) if mode.as_str() == "none" => Ok(None),
        Some(ToolChoice::Named {
            function: Some(FunctionName { name: Some(name) }),
        }) => Ok(Some(name.as_str().to_owned())),
        _ => first
            .function
            .as_ref()
            .and_then(|f| f.name.as_ref())
            .or(first.name.as_ref())
            .map(|name| Some(name.as_str().to_owned()))
            .ok_or_else(|| ApiError::invalid_param("tools", "tools[0].function.name is required")),
    }
}

#[derive(Serialize, Clone, Copy, Debug)]
struct Usage {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
}

#[derive(Serialize)]
struct Completion<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    system_fingerprint: &'static str,
    choices: Vec<Choice<'a>>,
    usage: Usage,
}

#[derive(Serialize)]
struct Choice<'a> {
    index: u64,
    message: AssistantMessage<'a>,
    logprobs: Option<()>,
    finish_reason: &'static str,
}

#[derive(Serialize, Clone, Copy)]
struct AssistantMessage<'a> {
    role: &'static str,
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<[ToolCall<'a>; 1]>,
}

#[derive(Serialize, Clone, Copy)]
struct ToolCall<'a> {
    id: &'static str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: FunctionCall<'a>,
}

#[derive(Serialize, Clone, Copy)]
struct FunctionCall<'a> {
    name: &'a str,
    arguments: &'static str,
}

pub(super) fn handle(ctx: &Ctx<'_>, body: &[u8]) -> HandlerResult {
    let req: ChatRequest<'_> = parse_json(body)?;
    let n = req.n.unwrap_or(1);
    if n == 0 || n > MAX_CHOICES {
        return Err(ApiError::invalid_param(
            "n",
            format!("'n' must be between 1 and {MAX_CHOICES}, got {n}"),
        ));
    }
    let answer = Answer::from_request(&req, ctx.faults.words)?;
    let mut prompt_tokens = 0u64;
    for message in &req.messages {
        if let Some(content) = &message.content {
            content.for_each_text(|t| prompt_tokens += text::word_count(t) as u64);
        }
    }
    let completion_tokens = answer.word_count() * n;
    let usage = Usage {
        prompt_tokens,
        completion_tokens,
        total_tokens: prompt_tokens + completion_tokens,
    };
    let id = format!("chatcmpl-mock-{}", ctx.shared.next_id());
    let model = req.model.as_ref().map_or(DEFAULT_MODEL, Str::as_str);
    let created = unix_now();

    if req.stream == Some(true) {
        let include_usage = req
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        let starts = match &answer {
            Answer::Text { content, .. } => text::piece_starts(content),
            Answer::ToolCall { .. } => Vec::new(),
        };
        let stream = ChatStream {
            id,
            model: model.to_owned(),
            created,
            n,
            answer,
            starts,
            usage: include_usage.then_some(usage),
            choice: 0,
            step: 0,
            tail: Tail::Usage,
        };
        let faults = ctx.faults.stream_faults(ctx.failure.disconnect_after);
        let sse = SseBody::new(Box::new(stream), faults);
        let mut resp = body::response(StatusCode::OK, "text/event-stream", MockBody::Sse(sse));
        resp.headers_mut()
            .insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        return Ok(resp);
    }

    if let Answer::Text { content, .. } = &answer {
        let size = content
            .len()
            .saturating_mul(usize::try_from(n).unwrap_or(usize::MAX));
        if size > MAX_REPLY_BYTES {
            return Err(ApiError::invalid(format!(
                "reply would be {size} bytes (over {MAX_REPLY_BYTES}); use stream: true or fewer words"
            )));
        }
    }
    let message = match &answer {
        Answer::Text { content, .. } => AssistantMessage {
            role: "assistant",
            content: Some(content),
            tool_calls: None,
        },
        Answer::ToolCall { name } => AssistantMessage {
            role: "assistant",
            content: None,
            tool_calls: Some([ToolCall {
                id: TOOL_CALL_ID,
                kind: "function",
                function: FunctionCall {
                    name,
                    arguments: TOOL_ARGUMENTS,
                },
            }]),
        },
    };
    let finish_reason = answer.finish_reason();
    let completion = Completion {
        id: &id,
        object: "chat.completion",
        created,
        model,
        system_fingerprint: SYSTEM_FINGERPRINT,
        choices: (0..n)
            .map(|index| Choice {
                index,
                message,
                logprobs: None,
                finish_reason,
            })
            .collect(),
        usage,
    };
    Ok(body::json(StatusCode::OK, &completion))
}

#[derive(Serialize)]
struct Chunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    system_fingerprint: &'static str,
    choices: &'a [ChunkChoice<'a>],
    /// Absent unless `include_usage`; then `null` on every chunk but the
    /// last, as OpenAI does.
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Option<Usage>>,
}

#[derive(Serialize)]
struct ChunkChoice<'a> {
    index: u64,
    delta: Delta<'a>,
    logprobs: Option<()>,
    finish_reason: Option<&'static str>,
}

#[derive(Serialize, Default)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    /// `Some(None)` serializes as `"content": null`.
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<Option<&'a str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<[ToolCallDelta<'a>; 1]>,
}

#[derive(Serialize)]
struct ToolCallDelta<'a> {
    index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'static str>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    function: FunctionDelta<'a>,
}

#[derive(Serialize)]
struct FunctionDelta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    arguments: &'a str,
}

/// What follows the choices' chunks.
#[derive(Clone, Copy)]
enum Tail {
    Usage,
    Done,
    End,
}

/// Lazily produces the SSE events of a streamed answer: for each choice in
/// turn a role chunk, one chunk per word (or argument piece), a finish
/// chunk; then the optional usage chunk and `[DONE]`.
struct ChatStream {
    id: String,
    model: String,
    created: u64,
    n: u64,
    answer: Answer,
    /// Byte offsets of the streamed pieces of a text answer.
    starts: Vec<usize>,
    /// `Some` when the client asked for `stream_options.include_usage`.
    usage: Option<Usage>,
    choice: u64,
    step: usize,
    tail: Tail,
}

impl ChatStream {
    fn steps_per_choice(&self) -> usize {
        let middle = match &self.answer {
            Answer::Text { .. } => self.starts.len(),
            Answer::ToolCall { .. } => TOOL_ARGUMENT_PIECES.len(),
        };
        middle + 2
    }

    fn event(&self, choices: &[ChunkChoice<'_>], usage: Option<Usage>) -> Bytes {
        sse::data_event(&Chunk {
            id: &self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: &self.model,
            system_fingerprint: SYSTEM_FINGERPRINT,
            choices,
            usage: self.usage.map(|_| usage),
        })
    }

    fn choice_event(&self, index: u64, step: usize) -> Bytes {
        let last = self.steps_per_choice() - 1;
        let mut delta = Delta::default();
        let mut finish_reason = None;
        if step == last {
            finish_reason = Some(self.answer.finish_reason());
        } else {
            match &self.answer {
                Answer::Text { content, .. } => {
                    if step == 0 {
                        delta.role = Some("assistant");
                        delta.content = Some(Some(""));
                    } else {
                        let start = self.starts[step - 1];
                        let end = self.starts.get(step).copied().unwrap_or(content.len());
                        delta.content = Some(Some(&content[start..end]));
                    }
                }
                Answer::ToolCall { name } => {
                    let call = if step == 0 {
                        delta.role = Some("assistant");
                        delta.content = Some(None);
                        ToolCallDelta {
                            index: 0,
                            id: Some(TOOL_CALL_ID),
                            kind: Some("function"),
                            function: FunctionDelta {
                                name: Some(name),
                                arguments: "",
                            },
                        }
                    } else {
                        ToolCallDelta {
                            index: 0,
                            id: None,
                            kind: None,
                            function: FunctionDelta {
                                name: None,
                                arguments: TOOL_ARGUMENT_PIECES[step - 1],
                            },
                        }
                    };
                    delta.tool_calls = Some([call]);
                }
            }
        }
        let choice = ChunkChoice {
            index,
            delta,
            logprobs: None,
            finish_reason,
        };
        self.event(std::slice::from_ref(&choice), None)
    }
}

impl Iterator for ChatStream {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        if self.choice < self.n {
            let event = self.choice_event(self.choice, self.step);
            self.step += 1;
            if self.step == self.steps_per_choice() {
                self.step = 0;
                self.choice += 1;
            }
            return Some(event);
        }
        loop {
            match self.tail {
                Tail::Usage => {
                    self.tail = Tail::Done;
                    if let Some(usage) = self.usage {
                        return Some(self.event(&[], Some(usage)));
                    }
                }
                Tail::Done => {
                    self.tail = Tail::End;
                    return Some(Bytes::from_static(b"data: [DONE]\n\n"));
                }
                Tail::End => return None,
            }
        }
    }
}
