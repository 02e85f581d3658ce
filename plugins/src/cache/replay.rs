//! Server-sent events: watching a relayed stream for its end, and writing a stored complete
//! answer as the stream a streaming client expects.

use bytes::Bytes;
use serde_json::{json, Map, Value};

/// One server-sent event of a buffer of whole events.
#[derive(Debug)]
pub struct Event<'a> {
    /// The `event:` field.
    pub name: Option<&'a str>,
    /// The `data:` lines, joined with `\n` (`None`: the event has no data, a comment...).
    pub data: Option<String>,
    /// The event's bytes, its terminating blank line included.
    pub raw: &'a [u8],
}

/// Splits whole events (as the gateway hands them to `on_chunk`) into their fields.
pub fn events(bytes: &[u8]) -> Vec<Event<'_>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut name = None;
    let mut data: Option<String> = None;
    let mut has_lines = false;
    let mut pos = 0;
    while pos < bytes.len() {
        let end = bytes[pos..]
            .iter()
            .position(|b| *b == b'\n')
            .map_or(bytes.len(), |i| pos + i + 1);
        let line = &bytes[pos..end];
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        pos = end;
        if line.is_empty() {
            if has_lines {
                out.push(Event {
                    name: name.take(),
                    data: data.take(),
                    raw: &bytes[start..pos],
                });
            }
            has_lines = false;
            start = pos;
            continue;
        }
        has_lines = true;
        let Ok(line) = std::str::from_utf8(line) else {
            continue;
        };
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => name = Some(value),
            "data" => match &mut data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => data = Some(value.to_owned()),
            },
            _ => {}
        }
    }
    if has_lines {
        out.push(Event {
            name,
            data,
            raw: &bytes[start..],
        });
    }
    out
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// What a piece of a relayed stream says about the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// More is coming.
    Continue,
    /// The stream ended completely: `data: [DONE]` (chat) or `message_stop` (messages).
    End,
    /// The stream carries an error event: it must not be stored.
    Failed,
}

/// Reads a piece of a relayed stream (whole events). `messages`: the stream is in Anthropic's
/// Messages format, else OpenAI's chat completion chunks.
pub fn watch(chunk: &[u8], messages: bool) -> Signal {
    // Most pieces hold none of these words and are not parsed at all.
    if !contains(chunk, b"[DONE]")
        && !contains(chunk, b"message_stop")
        && !contains(chunk, b"error")
    {
        return Signal::Continue;
    }
    let mut signal = Signal::Continue;
    for e in events(chunk) {
        let Some(data) = e.data.as_deref() else {
            continue;
        };
        let parsed: Option<Value> = if data.starts_with('{') {
            serde_json::from_str(data).ok()
        } else {
            None
        };
        let kind = parsed
            .as_ref()
            .and_then(|v| v.get("type"))
            .and_then(Value::as_str);
        let failed = if messages {
            e.name == Some("error") || kind == Some("error")
        } else {
            parsed.as_ref().is_some_and(|v| v.get("error").is_some())
        };
        if failed {
            return Signal::Failed;
        }
        let ended = if messages {
            e.name == Some("message_stop") || kind == Some("message_stop")
        } else {
            data.trim() == "[DONE]"
        };
        if ended {
            signal = Signal::End;
        }
    }
    signal
}

/// Whether the data of an OpenAI chunk is the usage chunk: no choices, a usage object.
fn is_usage_chunk(data: &str) -> bool {
    if !data.contains("\"usage\"") {
        return false;
    }
    serde_json::from_str::<Value>(data).is_ok_and(|v| {
        v.get("usage").is_some_and(Value::is_object)
            && v.get("choices")
                .and_then(Value::as_array)
                .is_some_and(Vec::is_empty)
    })
}

/// Whether a chat completion stream holds a usage chunk (`stream_options.include_usage`).
pub fn has_usage_chunk(sse: &[u8]) -> bool {
    events(sse)
        .iter()
        .any(|e| e.data.as_deref().is_some_and(is_usage_chunk))
}

/// The stream without its usage chunk, for a client that did not ask for one.
pub fn strip_usage_chunk(sse: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(sse.len());
    for e in events(sse) {
        if !e.data.as_deref().is_some_and(is_usage_chunk) {
            out.extend_from_slice(e.raw);
        }
    }
    Bytes::from(out)
}

fn data_event(out: &mut String, data: &Value) {
    out.push_str("data: ");
    out.push_str(&data.to_string());
    out.push_str("\n\n");
}

/// A complete chat completion as the stream OpenAI would have sent: for each choice a role
/// chunk, its content (and refusal, tool calls or function call) as one chunk each, and a
/// finish chunk; then the usage chunk when `include_usage` (and the answer has usage); then
/// `data: [DONE]`. `None` when the body is not a chat completion.
pub fn restream_chat(body: &[u8], include_usage: bool) -> Option<Bytes> {
    let answer: Value = serde_json::from_slice(body).ok()?;
    let answer = answer.as_object()?;
    let choices = answer.get("choices")?.as_array()?;
    let mut base = Map::new();
    base.insert("id".into(), answer.get("id").cloned().unwrap_or(json!("")));
    base.insert("object".into(), json!("chat.completion.chunk"));
    base.insert(
        "created".into(),
        answer.get("created").cloned().unwrap_or(json!(0)),
    );
    base.insert(
        "model".into(),
        answer.get("model").cloned().unwrap_or(json!("")),
    );
    if let Some(fp) = answer.get("system_fingerprint") {
        base.insert("system_fingerprint".into(), fp.clone());
    }
    let chunk = |choices: Value| {
        let mut c = base.clone();
        c.insert("choices".into(), choices);
        Value::Object(c)
    };
    let mut out = String::with_capacity(body.len() * 2);
    for (position, choice) in choices.iter().enumerate() {
        let index = choice.get("index").cloned().unwrap_or(json!(position));
        let message = choice.get("message")?.as_object()?;
        let delta = |delta: Value, logprobs: Value| {
            chunk(
                json!([{"index": index, "delta": delta, "logprobs": logprobs,
                "finish_reason": null}]),
            )
        };
        let role = message.get("role").cloned().unwrap_or(json!("assistant"));
        data_event(
            &mut out,
            &delta(json!({"role": role, "content": ""}), Value::Null),
        );
        let logprobs = choice.get("logprobs").cloned().unwrap_or(Value::Null);
        let mut logprobs_sent = false;
        if let Some(content) = message.get("content").and_then(Value::as_str) {
            if !content.is_empty() {
                data_event(
                    &mut out,
                    &delta(json!({"content": content}), logprobs.clone()),
                );
                logprobs_sent = true;
            }
        }
        if let Some(refusal) = message.get("refusal").and_then(Value::as_str) {
            data_event(&mut out, &delta(json!({"refusal": refusal}), Value::Null));
        }
        if let Some(calls) = message.get("tool_calls").and_then(Value::as_array) {
            for (i, call) in calls.iter().enumerate() {
                let mut call = call.as_object().cloned().unwrap_or_default();
                call.insert("index".into(), json!(i));
                data_event(
                    &mut out,
                    &delta(json!({"tool_calls": [Value::Object(call)]}), Value::Null),
                );
            }
        }
        if let Some(call) = message.get("function_call").filter(|v| v.is_object()) {
            data_event(
                &mut out,
                &delta(json!({"function_call": call}), Value::Null),
            );
        }
        let finish = choice
            .get("finish_reason")
            .cloned()
            .unwrap_or(json!("stop"));
        let last_logprobs = if logprobs_sent { Value::Null } else { logprobs };
        data_event(
            &mut out,
            &chunk(
                json!([{"index": index, "delta": {}, "logprobs": last_logprobs,
                "finish_reason": finish}]),
            ),
        );
    }
    if include_usage {
        if let Some(usage) = answer.get("usage").filter(|u| u.is_object()) {
            let mut c = base.clone();
            c.insert("choices".into(), json!([]));
            c.insert("usage".into(), usage.clone());
            data_event(&mut out, &Value::Object(c));
        }
    }
    out.push_str("data: [DONE]\n\n");
    Some(Bytes::from(out))
}

fn named_event(out: &mut String, name: &str, data: &Value) {
    out.push_str("event: ");
    out.push_str(name);
    out.push('\n');
    data_event(out, data);
}

/// A complete Anthropic message as the event stream Anthropic would have sent:
/// `message_start`, for each content block `content_block_start`, its delta (text, tool input
/// JSON, thinking and signature) and `content_block_stop`, then `message_delta` (stop reason
/// and usage) and `message_stop`. Blocks of other types are sent whole in their start event.
/// `None` when the body is not a message.
pub fn restream_messages(body: &[u8]) -> Option<Bytes> {
    let message: Value = serde_json::from_slice(body).ok()?;
    let message = message.as_object()?;
    let blocks = message.get("content")?.as_array()?;
    let usage = message.get("usage").cloned().unwrap_or_else(|| json!({}));
    let mut start = message.clone();
    start.insert("content".into(), json!([]));
    start.insert("stop_reason".into(), Value::Null);
    start.insert("stop_sequence".into(), Value::Null);
    let mut start_usage = usage.clone();
    if let Some(u) = start_usage.as_object_mut() {
        u.insert("output_tokens".into(), json!(0));
    }
    start.insert("usage".into(), start_usage);
    let mut out = String::with_capacity(body.len() * 2);
    named_event(
        &mut out,
        "message_start",
        &json!({"type": "message_start", "message": start}),
    );
    for (index, block) in blocks.iter().enumerate() {
        let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
        let text_of = |field: &str| block.get(field).and_then(Value::as_str).unwrap_or("");
        let (start_block, deltas) = match kind {
            "text" => (
                json!({"type": "text", "text": ""}),
                vec![json!({"type": "text_delta", "text": text_of("text")})],
            ),
            "tool_use" => {
                let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
                (
                    json!({"type": "tool_use", "id": block.get("id"), "name": block.get("name"),
                        "input": {}}),
                    vec![json!({"type": "input_json_delta", "partial_json": input.to_string()})],
                )
            }
            "thinking" => {
                let mut deltas = vec![json!({"type": "thinking_delta",
                    "thinking": text_of("thinking")})];
                if let Some(sig) = block.get("signature").and_then(Value::as_str) {
                    deltas.push(json!({"type": "signature_delta", "signature": sig}));
                }
                (json!({"type": "thinking", "thinking": ""}), deltas)
            }
            _ => (block.clone(), Vec::new()),
        };
        named_event(
            &mut out,
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": start_block}),
        );
        for delta in deltas {
            named_event(
                &mut out,
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": index, "delta": delta}),
            );
        }
        named_event(
            &mut out,
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": index}),
        );
    }
    named_event(
        &mut out,
        "message_delta",
        &json!({"type": "message_delta",
            "delta": {"stop_reason": message.get("stop_reason"),
                      "stop_sequence": message.get("stop_sequence")},
            "usage": usage}),
    );
    named_event(&mut out, "message_stop", &json!({"type": "message_stop"}));
    Some(Bytes::from(out))
}
