//! What a guardrail sees of the requests and answers of each API it checks, and how its
//! rewrites go back into them.
//!
//! - Chat completions: every message with its text (parts joined), its tool calls (and a
//!   legacy `function_call`) and the call a tool's message answers; every choice of an answer
//!   with its text and tool calls.
//! - `/v1/messages`: `system` as a first message of role `system`; each message's text blocks
//!   joined, its `tool_use` blocks as tool calls (their `input` as JSON text), the text of its
//!   `tool_result` blocks added to its content; the answer's text blocks and `tool_use` blocks
//!   as one choice. A rewrite goes into a message (or answer) whose content is a string or one
//!   text block; one of several blocks cannot take it (an error, so `on_error` applies).

use bytes::Bytes;
use serde_json::{json, Value};

use plugin_sdk::llm::chat::{ChatRequest, Message as ChatMessage};
use plugin_sdk::llm::LlmRequest;
use plugin_sdk::{RequestCx, Route};

use super::abi::{Answer, Api, Message, Request, ToolCall};

/// The request of a checked route, as the guest sees it; `None` for other routes.
pub fn request(cx: &RequestCx) -> Option<Request> {
    match (cx.route, &cx.request) {
        (Route::ChatCompletions, LlmRequest::Chat(chat)) => Some(from_chat(chat)),
        (Route::Messages, LlmRequest::Messages(_)) => {
            let body: Value = serde_json::from_slice(&cx.body).ok()?;
            Some(from_messages(&body))
        }
        _ => None,
    }
}

fn from_chat(chat: &ChatRequest) -> Request {
    Request {
        api: Api::ChatCompletions,
        model: chat.model.clone(),
        messages: chat.messages.iter().map(chat_message).collect(),
        tools: chat
            .tools
            .iter()
            .flatten()
            .map(|t| t.function.name.clone())
            .collect(),
    }
}

fn chat_message(m: &ChatMessage) -> Message {
    let mut tool_calls: Vec<ToolCall> = m
        .tool_calls
        .iter()
        .flatten()
        .map(|c| ToolCall {
            id: c.id.clone().unwrap_or_default(),
            name: c.function.name.clone(),
            arguments: c.function.arguments.clone(),
        })
        .collect();
    if let Some(call) = &m.function_call {
        tool_calls.push(legacy_call(call));
    }
    Message {
        role: m.role.clone(),
        content: m.content.as_ref().map(|c| c.text()).unwrap_or_default(),
        tool_calls,
        tool_call_id: m.tool_call_id.clone(),
    }
}

/// A legacy `function_call` (`{name, arguments}`) as a tool call without an id.
fn legacy_call(call: &Value) -> ToolCall {
    ToolCall {
        id: String::new(),
        name: call["name"].as_str().unwrap_or_default().to_owned(),
        arguments: call["arguments"].as_str().unwrap_or_default().to_owned(),
    }
}

fn from_messages(body: &Value) -> Request {
    let mut messages = Vec::new();
    if let Some(system) = body.get("system").filter(|s| !s.is_null()) {
        messages.push(Message {
            role: "system".into(),
            content: blocks_text(system),
            ..Message::default()
        });
    }
    for m in body["messages"].as_array().into_iter().flatten() {
        messages.push(anthropic_message(m));
    }
    Request {
        api: Api::Messages,
        model: body["model"].as_str().map(str::to_owned),
        messages,
        tools: body["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["name"].as_str().map(str::to_owned))
            .collect(),
    }
}

/// The text of a string or of a list of blocks (`text` blocks, and the text of `tool_result`
/// blocks), joined by newlines.
fn blocks_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => {
            let mut parts = Vec::new();
            for b in blocks {
                match b["type"].as_str() {
                    Some("text") => parts.extend(b["text"].as_str().map(str::to_owned)),
                    Some("tool_result") => {
                        let text = blocks_text(&b["content"]);
                        if !text.is_empty() {
                            parts.push(text);
                        }
                    }
                    _ => {}
                }
            }
            parts.join("\n")
        }
        _ => String::new(),
    }
}

/// The `tool_use` blocks of a content list, as tool calls.
fn tool_uses(content: &Value) -> Vec<ToolCall> {
    content
        .as_array()
        .into_iter()
        .flatten()
        .filter(|b| b["type"] == "tool_use")
        .map(|b| ToolCall {
            id: b["id"].as_str().unwrap_or_default().to_owned(),
            name: b["name"].as_str().unwrap_or_default().to_owned(),
            arguments: b.get("input").map(Value::to_string).unwrap_or_default(),
        })
        .collect()
}

fn anthropic_message(m: &Value) -> Message {
    let content = &m["content"];
    let tool_call_id = content
        .as_array()
        .into_iter()
        .flatten()
        .find(|b| b["type"] == "tool_result")
        .and_then(|b| b["tool_use_id"].as_str())
        .map(str::to_owned);
    Message {
        role: m["role"].as_str().unwrap_or_default().to_owned(),
        content: blocks_text(content),
        tool_calls: tool_uses(content),
        tool_call_id,
    }
}

/// Every choice of a whole answer, by position.
pub fn answers(route: Route, body: &Value) -> Vec<(usize, Answer)> {
    match route {
        Route::ChatCompletions => body["choices"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
            .map(|(i, c)| {
                let m = &c["message"];
                let mut tool_calls: Vec<ToolCall> = m["tool_calls"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|t| ToolCall {
                        id: t["id"].as_str().unwrap_or_default().to_owned(),
                        name: t["function"]["name"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                        arguments: t["function"]["arguments"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                    })
                    .collect();
                if let Some(call) = m.get("function_call").filter(|c| c.is_object()) {
                    tool_calls.push(legacy_call(call));
                }
                let text = m["content"].as_str().unwrap_or_default().to_owned();
                (i, Answer { text, tool_calls })
            })
            .collect(),
        Route::Messages if body["type"] == "message" => {
            let content = &body["content"];
            vec![(
                0,
                Answer {
                    text: blocks_text(content),
                    tool_calls: tool_uses(content),
                },
            )]
        }
        _ => Vec::new(),
    }
}

/// Puts a choice's new text into a whole answer.
pub fn rewrite_answer(
    route: Route,
    body: &mut Value,
    position: usize,
    text: String,
) -> Result<(), String> {
    match route {
        Route::Messages => {
            let Some(blocks) = body["content"].as_array_mut() else {
                return Err("the answer has no content blocks".into());
            };
            set_single_text(blocks, text, "the answer")
        }
        _ => {
            body["choices"][position]["message"]["content"] = Value::String(text);
            Ok(())
        }
    }
}

/// Sets the text of a list of blocks that has at most one text block (and no tool results);
/// none gets one, first.
fn set_single_text(blocks: &mut Vec<Value>, text: String, what: &str) -> Result<(), String> {
    let texts: Vec<usize> = (0..blocks.len())
        .filter(|i| blocks[*i]["type"] == "text")
        .collect();
    if texts.len() > 1 || blocks.iter().any(|b| b["type"] == "tool_result") {
        return Err(format!(
            "{what} holds several text or tool-result blocks: a rewrite cannot say which to change"
        ));
    }
    match texts.first() {
        Some(&i) => blocks[i]["text"] = Value::String(text),
        None => blocks.insert(0, json!({"type": "text", "text": text})),
    }
    Ok(())
}

/// Puts rewritten message text into the request body (keeping every other field as the client
/// sent it) and decodes it again. Whether anything changed.
pub fn rewrite_request(
    cx: &mut RequestCx,
    before: &Request,
    messages: &[Message],
) -> Result<bool, String> {
    let mut body: Value = serde_json::from_slice(&cx.body)
        .map_err(|e| format!("the request body is not JSON: {e}"))?;
    let mut changed = false;
    let system = before.api == Api::Messages && body.get("system").is_some_and(|s| !s.is_null());
    for (i, (new, old)) in messages.iter().zip(&before.messages).enumerate() {
        if new.content == old.content {
            continue;
        }
        changed = true;
        match before.api {
            Api::ChatCompletions => {
                let slot = body["messages"]
                    .get_mut(i)
                    .ok_or("the request body lost a message")?;
                set_chat_text(&mut slot["content"], &new.content);
            }
            Api::Messages => {
                let (slot, what) = if system && i == 0 {
                    (&mut body["system"], "system".to_owned())
                } else {
                    let at = if system { i - 1 } else { i };
                    let slot = body["messages"]
                        .get_mut(at)
                        .ok_or("the request body lost a message")?;
                    (&mut slot["content"], format!("messages[{at}]"))
                };
                match slot {
                    Value::Array(blocks) => set_single_text(blocks, new.content.clone(), &what)?,
                    other => *other = Value::String(new.content.clone()),
                }
            }
        }
    }
    if changed {
        let bytes = serde_json::to_vec(&body).map_err(|e| e.to_string())?;
        let decoded = LlmRequest::decode(cx.route, &bytes).map_err(|e| e.message)?;
        cx.body = Bytes::from(bytes);
        cx.request = decoded;
    }
    Ok(changed)
}

/// Sets a chat message's content to `text`: a plain string stays a string; in a list of parts
/// the first text part takes the text and the other text parts go (images and the like stay).
fn set_chat_text(content: &mut Value, text: &str) {
    if let Value::Array(parts) = content {
        let mut placed = false;
        parts.retain_mut(|part| {
            if part.get("type").and_then(Value::as_str) != Some("text") {
                return true;
            }
            if placed {
                return false;
            }
            placed = true;
            part["text"] = Value::String(text.to_owned());
            true
        });
        if !placed {
            parts.insert(0, json!({"type": "text", "text": text}));
        }
    } else {
        *content = Value::String(text.to_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_requests_show_system_text_tool_calls_and_results() {
        let body = json!({"model": "claude", "max_tokens": 10,
        "system": [{"type": "text", "text": "be brief"}],
        "tools": [{"name": "lookup", "input_schema": {}}],
        "messages": [
            {"role": "user", "content": "find x"},
            {"role": "assistant", "content": [{"type": "text", "text": "looking"},
                {"type": "tool_use", "id": "tu_1", "name": "lookup", "input": {"q": "x"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1",
                "content": [{"type": "text", "text": "x is 4"}]}]}
        ]});
        let r = from_messages(&body);
        assert_eq!(r.api, Api::Messages);
        assert_eq!(r.tools, ["lookup"]);
        let roles: Vec<&str> = r.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user"]);
        assert_eq!(r.messages[0].content, "be brief");
        assert_eq!(r.messages[2].tool_calls[0].name, "lookup");
        assert_eq!(r.messages[2].tool_calls[0].arguments, r#"{"q":"x"}"#);
        assert_eq!(r.messages[3].content, "x is 4");
        assert_eq!(r.messages[3].tool_call_id.as_deref(), Some("tu_1"));
    }

    #[test]
    fn answers_carry_every_choice_and_its_tool_calls() {
        let chat = json!({"choices": [
            {"message": {"content": "hi"}},
            {"message": {"content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "f", "arguments": "{\"a\":1}"}}]}}]});
        let got = answers(Route::ChatCompletions, &chat);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].1.text, "hi");
        assert_eq!(got[1].1.tool_calls[0].arguments, "{\"a\":1}");
        let messages = json!({"type": "message", "content": [{"type": "text", "text": "a"},
            {"type": "tool_use", "id": "t", "name": "f", "input": {}}]});
        let got = answers(Route::Messages, &messages);
        assert_eq!(got[0].1.text, "a");
        assert_eq!(got[0].1.tool_calls[0].name, "f");
        let mut body = messages.clone();
        rewrite_answer(Route::Messages, &mut body, 0, "b".into()).unwrap();
        assert_eq!(body["content"][0]["text"], "b");
        let mut two =
            json!({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "c"}]});
        assert!(rewrite_answer(Route::Messages, &mut two, 0, "b".into()).is_err());
    }
}
