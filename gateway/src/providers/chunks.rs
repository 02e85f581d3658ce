//! OpenAI's answer shapes, built by every codec that translates into them: whole chat
//! completions, stream chunks, embedding lists, and the stream's error event.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde_json::{json, Value};

use plugin_sdk::{ErrorKind, GatewayError, Usage};

/// Seconds since the epoch, for `created`.
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A fresh completion id, `chatcmpl-<uuid>`, for answers that carry none.
pub fn new_id() -> String {
    format!("chatcmpl-{}", uuid::Uuid::new_v4().simple())
}

/// OpenAI's `usage` object.
pub fn usage_json(usage: Usage) -> Value {
    json!({
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total(),
    })
}

/// A whole `chat.completion` with one choice.
pub fn completion(id: &str, model: &str, message: Value, finish: Value, usage: Usage) -> Bytes {
    let out = json!({
        "id": id,
        "object": "chat.completion",
        "created": now_secs(),
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish}],
        "usage": usage_json(usage),
    });
    Bytes::from(out.to_string())
}

/// An assistant message: `content` is null when the answer is only tool calls.
pub fn assistant_message(text: String, tool_calls: Vec<Value>) -> Value {
    let content = if text.is_empty() && !tool_calls.is_empty() {
        Value::Null
    } else {
        Value::String(text)
    };
    let mut message = json!({"role": "assistant", "content": content});
    if !tool_calls.is_empty() {
        message["tool_calls"] = Value::Array(tool_calls);
    }
    message
}

/// One tool call of an assistant message.
pub fn tool_call(id: &str, name: &str, arguments: String) -> Value {
    json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
}

/// An embeddings `list` answer.
pub fn embeddings(model: &str, vectors: Vec<Value>, usage: Usage) -> Bytes {
    let data: Vec<Value> = vectors
        .into_iter()
        .enumerate()
        .map(|(i, v)| json!({"object": "embedding", "index": i, "embedding": v}))
        .collect();
    let out = json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": usage.prompt_tokens, "total_tokens": usage.prompt_tokens},
    });
    Bytes::from(out.to_string())
}

/// An embeddings `list` with every float vector re-encoded as OpenAI's `encoding_format:
/// "base64"` answers carry it: the base64 of the little-endian f32s.
pub fn embeddings_to_base64(list: &[u8]) -> Result<Bytes, GatewayError> {
    use base64::Engine;
    let mut value: Value = serde_json::from_slice(list)
        .map_err(|e| GatewayError::internal(format!("cannot re-read an embeddings list: {e}")))?;
    for item in value["data"].as_array_mut().into_iter().flatten() {
        let Some(floats) = item["embedding"].as_array() else {
            continue;
        };
        let mut bytes = Vec::with_capacity(floats.len() * 4);
        for f in floats {
            // f32 is what OpenAI encodes; the narrowing is the format's.
            #[allow(clippy::cast_possible_truncation)]
            let f = f.as_f64().unwrap_or(0.0) as f32;
            bytes.extend_from_slice(&f.to_le_bytes());
        }
        item["embedding"] = json!(base64::engine::general_purpose::STANDARD.encode(bytes));
    }
    Ok(Bytes::from(value.to_string()))
}

/// A 502 for an answer that does not have the shape its format promises.
pub fn bad_answer(provider: &str, why: impl std::fmt::Display) -> GatewayError {
    GatewayError::new(
        ErrorKind::UpstreamBadResponse,
        format!("{provider} answered something the gateway cannot read: {why}"),
    )
}

/// Writes `chat.completion.chunk` events for one stream: the same id, model and created on
/// every chunk, the role first, and at the end the finish chunk, the usage chunk when the client
/// asked for it, and `data: [DONE]`.
#[derive(Debug, Default)]
pub struct ChunkWriter {
    pub id: String,
    pub model: String,
    pub created: u64,
    pub include_usage: bool,
    role_sent: bool,
    ended: bool,
}

impl ChunkWriter {
    pub fn new(id: impl Into<String>, model: impl Into<String>, include_usage: bool) -> Self {
        ChunkWriter {
            id: id.into(),
            model: model.into(),
            created: now_secs(),
            include_usage,
            ..Default::default()
        }
    }

    /// The model the chunks name, `None` while it is unknown (""): what a stream reports.
    pub fn known_model(&self) -> Option<&str> {
        (!self.model.is_empty()).then_some(self.model.as_str())
    }

    /// Whether the end (or an error) has been written.
    pub fn ended(&self) -> bool {
        self.ended
    }

    fn event(&self, choices: Value, usage: Option<Usage>, out: &mut String) {
        let mut c = json!({
            "id": self.id, "object": "chat.completion.chunk", "created": self.created,
            "model": self.model, "choices": choices,
        });
        if let Some(u) = usage {
            c["usage"] = usage_json(u);
        }
        out.push_str("data: ");
        out.push_str(&c.to_string());
        out.push_str("\n\n");
    }

    /// The first chunk, `{"role": "assistant", "content": ""}`, once.
    pub fn role(&mut self, out: &mut String) {
        if !self.role_sent {
            self.role_sent = true;
            self.delta(serde_json::json!({"role": "assistant", "content": ""}), out);
        }
    }

    /// A chunk with this delta (the role chunk goes first if not yet sent).
    pub fn delta(&mut self, delta: Value, out: &mut String) {
        if !self.role_sent {
            self.role(out);
        }
        self.event(
            json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": null}]),
            None,
            out,
        );
    }

    /// A text delta.
    pub fn text(&mut self, text: &str, out: &mut String) {
        if !text.is_empty() {
            self.delta(json!({"content": text}), out);
        }
    }

    /// The start of a tool call: its index, id and name, with empty arguments.
    pub fn tool_start(&mut self, index: usize, id: &str, name: &str, out: &mut String) {
        self.delta(
            json!({"tool_calls": [{"index": index, "id": id, "type": "function",
                "function": {"name": name, "arguments": ""}}]}),
            out,
        );
    }

    /// A piece of a tool call's arguments.
    pub fn tool_arguments(&mut self, index: usize, arguments: &str, out: &mut String) {
        if !arguments.is_empty() {
            self.delta(
                json!({"tool_calls": [{"index": index, "function": {"arguments": arguments}}]}),
                out,
            );
        }
    }

    /// The finish chunk, the usage chunk when asked for, and `data: [DONE]`; once.
    pub fn end(&mut self, finish: &str, usage: Usage, out: &mut String) {
        if self.ended {
            return;
        }
        self.role(out);
        self.ended = true;
        self.event(
            json!([{"index": 0, "delta": {}, "logprobs": null, "finish_reason": finish}]),
            None,
            out,
        );
        if self.include_usage {
            self.event(json!([]), Some(usage), out);
        }
        out.push_str("data: [DONE]\n\n");
    }

    /// An error event in OpenAI's error shape; the stream ends with it.
    pub fn error(&mut self, provider: &str, message: &str, kind: Option<&str>, out: &mut String) {
        if self.ended {
            return;
        }
        self.ended = true;
        let e = json!({"error": {"message": format!("{provider} error: {message}"),
            "type": kind, "param": null, "code": null}, "provider": provider});
        out.push_str("data: ");
        out.push_str(&e.to_string());
        out.push_str("\n\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(s: &str) -> Vec<Value> {
        s.split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap())
            .collect()
    }

    #[test]
    fn a_stream_starts_with_the_role_and_ends_once() {
        let mut w = ChunkWriter::new("id1", "m", true);
        let mut out = String::new();
        w.text("Hel", &mut out);
        w.text("", &mut out);
        w.tool_start(0, "c1", "get", &mut out);
        w.tool_arguments(0, "{}", &mut out);
        let usage = Usage {
            prompt_tokens: 2,
            completion_tokens: 3,
        };
        w.end("tool_calls", usage, &mut out);
        w.end("stop", usage, &mut out);
        w.error("x", "late", None, &mut out);
        assert!(out.ends_with("data: [DONE]\n\n"));
        let e = events(&out);
        assert_eq!(e.len(), 6, "{out}");
        assert_eq!(e[0]["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(e[1]["choices"][0]["delta"]["content"], "Hel");
        assert_eq!(e[4]["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(e[5]["usage"]["total_tokens"], 5);
        assert!(e.iter().all(|c| c["id"] == "id1" && c["model"] == "m"));
    }

    #[test]
    fn embeddings_are_re_encoded_as_base64_f32() {
        use base64::Engine;
        let list = embeddings("m", vec![json!([1.0, -0.5])], Usage::default());
        let out: Value = serde_json::from_slice(&embeddings_to_base64(&list).unwrap()).unwrap();
        let b64 = out["data"][0]["embedding"].as_str().unwrap();
        let raw = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap();
        let floats: Vec<f32> = raw
            .chunks(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(floats, [1.0, -0.5]);
        assert_eq!(out["object"], "list");
    }

    #[test]
    fn an_error_ends_the_stream_in_openai_error_shape() {
        let mut w = ChunkWriter::new("id1", "m", false);
        let mut out = String::new();
        w.error("cohere", "overloaded", Some("server_error"), &mut out);
        assert!(w.ended());
        let e = events(&out);
        assert_eq!(e[0]["error"]["message"], "cohere error: overloaded");
        assert_eq!(e[0]["provider"], "cohere");
    }
}
