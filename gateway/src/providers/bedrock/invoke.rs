//! Anthropic's models through Bedrock's InvokeModel, for clients that speak Anthropic's format
//! (`POST /v1/messages`): the answer of `invoke` is Anthropic's message as is; the answer of
//! `invoke-with-response-stream` is event stream frames whose `chunk` payloads carry one
//! Anthropic stream event each, base64-encoded. They are turned back into Anthropic's
//! server-sent events, so the client reads the stream it would have read from Anthropic.

use base64::Engine;
use bytes::Bytes;
use serde_json::{json, Value};

use plugin_sdk::Usage;

use super::eventstream::{FrameDecoder, Message};
use crate::providers::anthropic;
use crate::providers::StreamDecoder;

/// Re-frames an `invoke-with-response-stream` answer as Anthropic server-sent events.
#[derive(Default)]
pub struct AnthropicEvents {
    frames: FrameDecoder,
    usage: Option<Usage>,
    model: Option<String>,
    /// Set after an error: nothing more is read.
    stopped: bool,
}

impl AnthropicEvents {
    fn error(&mut self, kind: &str, message: &str, out: &mut String) {
        self.stopped = true;
        let e = json!({"type": "error", "error": {"type": kind, "message": format!("bedrock error: {message}")}});
        out.push_str(&format!("event: error\ndata: {e}\n\n"));
    }

    fn message(&mut self, m: &Message, out: &mut String) {
        match m.header(":message-type") {
            Some("event") if m.header(":event-type") == Some("chunk") => {
                let event = serde_json::from_slice::<Value>(&m.payload)
                    .ok()
                    .and_then(|p| p["bytes"].as_str().map(str::to_owned))
                    .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
                    .and_then(|raw| serde_json::from_slice::<Value>(&raw).ok());
                let Some(event) = event else {
                    self.error(
                        "api_error",
                        "a stream chunk is not a base64 JSON event",
                        out,
                    );
                    return;
                };
                let data = event.to_string();
                let (model, usage) = anthropic::summarize(data.as_bytes());
                if self.model.is_none() {
                    self.model = model;
                }
                if let Some(u) = usage {
                    // message_start reports the input tokens, message_delta the output ones.
                    let old = self.usage.unwrap_or_default();
                    self.usage = Some(Usage {
                        prompt_tokens: old.prompt_tokens.max(u.prompt_tokens),
                        completion_tokens: old.completion_tokens.max(u.completion_tokens),
                    });
                }
                let kind = event["type"].as_str().unwrap_or("message");
                out.push_str(&format!("event: {kind}\ndata: {data}\n\n"));
            }
            Some("exception") => {
                let payload: Value = serde_json::from_slice(&m.payload).unwrap_or(Value::Null);
                let kind = m
                    .header(":exception-type")
                    .unwrap_or("exception")
                    .to_owned();
                let message = payload["message"].as_str().unwrap_or(&kind).to_owned();
                self.error(&kind, &message, out);
            }
            _ => {}
        }
    }
}

impl StreamDecoder for AnthropicEvents {
    fn push(&mut self, read: &[u8]) -> Bytes {
        let mut out = String::new();
        if self.stopped {
            return Bytes::new();
        }
        self.frames.push(read);
        while !self.stopped {
            match self.frames.next_message() {
                Ok(Some(m)) => self.message(&m, &mut out),
                Ok(None) => break,
                Err(e) => self.error("api_error", &e.to_string(), &mut out),
            }
        }
        Bytes::from(out)
    }

    fn finish(&mut self) -> Bytes {
        let mut out = String::new();
        if !self.stopped && self.frames.has_partial() {
            self.error("api_error", "the stream ended inside a frame", &mut out);
        }
        Bytes::from(out)
    }

    fn usage(&self) -> Option<Usage> {
        self.usage
    }

    fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::super::eventstream::testing;
    use super::*;

    fn chunk(event: &Value) -> Vec<u8> {
        let b64 = base64::engine::general_purpose::STANDARD.encode(event.to_string());
        testing::event("chunk", &json!({"bytes": b64}).to_string())
    }

    #[test]
    fn chunks_become_anthropic_events_whatever_the_reads() {
        let events = [
            json!({"type": "message_start", "message": {"id": "m1", "model": "claude", "usage": {"input_tokens": 5, "output_tokens": 1}}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}}),
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}}),
            json!({"type": "message_stop"}),
        ];
        let bytes: Vec<u8> = events.iter().flat_map(chunk).collect();
        let run = |step: usize| {
            let mut d = AnthropicEvents::default();
            let mut out = Vec::new();
            for read in bytes.chunks(step) {
                out.extend_from_slice(&d.push(read));
            }
            out.extend_from_slice(&d.finish());
            (
                String::from_utf8(out).unwrap(),
                d.usage(),
                d.model().map(str::to_owned),
            )
        };
        let (whole, usage, model) = run(bytes.len());
        assert!(
            whole.starts_with("event: message_start\ndata: {"),
            "{whole}"
        );
        assert!(whole.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"));
        assert_eq!(
            usage,
            Some(Usage {
                prompt_tokens: 5,
                completion_tokens: 3
            })
        );
        assert_eq!(model.as_deref(), Some("claude"));
        for step in [1, 2, 5, 17, 64] {
            assert_eq!(run(step).0, whole, "reads of {step} bytes");
        }
    }

    #[test]
    fn exceptions_and_broken_frames_end_with_an_error_event() {
        let mut d = AnthropicEvents::default();
        let out = d.push(&testing::exception("throttlingException", "slow down"));
        let text = String::from_utf8(out.to_vec()).unwrap();
        assert!(text.starts_with("event: error\n"), "{text}");
        assert!(text.contains("bedrock error: slow down"));
        assert!(d.push(&chunk(&json!({"type": "message_stop"}))).is_empty());

        let mut d = AnthropicEvents::default();
        let frame = chunk(&json!({"type": "ping"}));
        assert!(d.push(&frame[..frame.len() - 3]).is_empty());
        let end = String::from_utf8(d.finish().to_vec()).unwrap();
        assert!(end.contains("ended inside a frame"), "{end}");
    }
}
