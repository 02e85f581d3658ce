//! What text a check sees, and where a rewrite of it goes back.
//!
//! A request or answer body holds its text in several places (each message, each part of a
//! multi-part message, each choice, each tool call). [`Subject`] lists them as segments, each
//! with the JSON pointer it came from; the *checked text* most checks read is all of them,
//! joined with newlines. A stateless API lets a client write anything into "earlier" turns, so
//! every turn is read, not only the last one.
//!
//! - **Chat completions and Anthropic messages (input)**: the system prompt (Anthropic's
//!   top-level `system`), and for every message its content (a string, or each `text` of a
//!   list of parts), the arguments of its tool calls (`tool_calls[].function.arguments`,
//!   `function_call.arguments`), Anthropic's `tool_use` inputs and `tool_result` contents.
//! - **Embeddings and moderations (input)**: one segment per `input` string. Token-array
//!   inputs carry no text.
//! - **Chat completions (output)**: every choice's `message.content` and the arguments of its
//!   tool calls; **Anthropic messages (output)**: every `text` block and `tool_use` input.
//!
//! Checks that rewrite (PII redaction) rewrite every segment. A segment that was JSON rather
//! than a string (a `tool_use` input) goes back as JSON when the rewrite still is, else as the
//! rewritten text: the original never goes through unredacted.

mod read;

use serde_json::Value;

use plugin_sdk::Route;

/// The texts of a body, where each lives; the checked text is all of them.
#[derive(Debug, Clone, Default)]
pub struct Subject {
    /// Where each text lives, as a JSON pointer (`/messages/2/content/0/text`).
    pointers: Vec<String>,
    texts: Vec<String>,
    /// The checked text, joined once for every hook of a side (until a rewrite).
    joined: std::sync::OnceLock<String>,
}

impl Subject {
    /// The texts of a request body on an LLM route. Routes without text give an empty subject.
    pub fn input(route: Route, body: &Value) -> Subject {
        match route {
            Route::ChatCompletions | Route::Messages => Subject::conversation(body),
            Route::Embeddings | Route::Moderations => Subject::inputs(body),
            Route::FineTuningJobs | Route::Passthrough => Subject::default(),
        }
    }

    /// [`Subject::input`] read from the body's bytes in one pass, without parsing it into a
    /// [`Value`] first; `None` when the bytes are not JSON.
    pub fn read_input(route: Route, body: &[u8]) -> Option<Subject> {
        let shape = match route {
            Route::ChatCompletions | Route::Messages => read::Shape::Conversation,
            Route::Embeddings | Route::Moderations => read::Shape::Inputs,
            Route::FineTuningJobs | Route::Passthrough => {
                return serde_json::from_slice::<serde::de::IgnoredAny>(body)
                    .ok()
                    .map(|_| Subject::default())
            }
        };
        read::subject(shape, body)
    }

    /// [`Subject::output`] read from the answer's bytes; `None` when they are not JSON.
    pub fn read_output(body: &[u8]) -> Option<Subject> {
        read::subject(read::Shape::Answer, body)
    }

    /// The texts of an answer body: a `chat.completion`, or an Anthropic `message`.
    pub fn output(body: &Value) -> Subject {
        let mut subject = Subject::default();
        if let Some(choices) = body.get("choices").and_then(Value::as_array) {
            for (i, choice) in choices.iter().enumerate() {
                if let Some(message) = choice.get("message") {
                    subject.push_message(&format!("/choices/{i}/message"), message);
                }
            }
        } else if let Some(content) = body.get("content") {
            subject.push_content("/content", content);
        }
        subject
    }

    /// A subject of one text (a streamed answer), which is also the checked text. It has no
    /// place in a body.
    pub fn single(text: String) -> Subject {
        Subject {
            pointers: vec![String::new()],
            texts: vec![text],
            joined: std::sync::OnceLock::new(),
        }
    }

    fn conversation(body: &Value) -> Subject {
        let mut subject = Subject::default();
        if let Some(system) = body.get("system") {
            subject.push_content("/system", system);
        }
        if let Some(messages) = body.get("messages").and_then(Value::as_array) {
            for (i, message) in messages.iter().enumerate() {
                subject.push_message(&format!("/messages/{i}"), message);
            }
        }
        subject
    }

    /// A message's content and the arguments of its tool calls.
    fn push_message(&mut self, pointer: &str, message: &Value) {
        if let Some(content) = message.get("content") {
            self.push_content(&format!("{pointer}/content"), content);
        }
        if let Some(calls) = message.get("tool_calls").and_then(Value::as_array) {
            for (j, call) in calls.iter().enumerate() {
                if let Some(args) = call.pointer("/function/arguments").and_then(Value::as_str) {
                    self.push(format!("{pointer}/tool_calls/{j}/function/arguments"), args);
                }
            }
        }
        if let Some(args) = message
            .pointer("/function_call/arguments")
            .and_then(Value::as_str)
        {
            self.push(format!("{pointer}/function_call/arguments"), args);
        }
    }

    fn inputs(body: &Value) -> Subject {
        let mut subject = Subject::default();
        match body.get("input") {
            Some(Value::String(s)) => subject.push("/input".into(), s),
            Some(Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    if let Some(s) = item.as_str() {
                        subject.push(format!("/input/{i}"), s);
                    }
                }
            }
            _ => {}
        }
        subject
    }

    fn push(&mut self, pointer: String, text: &str) {
        self.pointers.push(pointer);
        self.texts.push(text.to_owned());
    }

    /// Adds the texts of a message content: a string, or a list of parts: `text`s, Anthropic's
    /// `tool_result` contents and `tool_use` inputs (as JSON text).
    fn push_content(&mut self, pointer: &str, content: &Value) {
        match content {
            Value::String(s) => self.push(pointer.to_owned(), s),
            Value::Array(parts) => {
                for (j, part) in parts.iter().enumerate() {
                    let at = format!("{pointer}/{j}");
                    if let Some(text) = part.get("text").and_then(Value::as_str) {
                        self.push(format!("{at}/text"), text);
                    }
                    match part.get("type").and_then(Value::as_str) {
                        Some("tool_result") => {
                            if let Some(inner) = part.get("content") {
                                self.push_content(&format!("{at}/content"), inner);
                            }
                        }
                        Some("tool_use") => {
                            if let Some(input) = part.get("input") {
                                self.push(format!("{at}/input"), &input.to_string());
                            }
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }

    /// The checked text: every segment, joined with newlines.
    pub fn text(&self) -> &str {
        self.joined.get_or_init(|| self.texts.join("\n"))
    }

    /// Every segment's text, in order.
    pub fn texts(&self) -> &[String] {
        &self.texts
    }

    /// The JSON pointer of each segment, in order.
    pub fn pointers(&self) -> &[String] {
        &self.pointers
    }

    /// Replaces the segments' texts (a list of another length is ignored).
    pub fn set_texts(&mut self, texts: Vec<String>) {
        if texts.len() == self.texts.len() {
            self.texts = texts;
            self.joined = std::sync::OnceLock::new();
        }
    }

    /// Writes the segments' texts back into the body they came from.
    pub fn write_into(&self, body: &mut Value) {
        for (pointer, text) in self.pointers.iter().zip(&self.texts) {
            if pointer.is_empty() {
                continue;
            }
            if let Some(slot) = body.pointer_mut(pointer) {
                // A JSON slot (a tool input) takes the rewritten JSON; a rewrite that is no
                // longer JSON goes in as text rather than letting the original through.
                *slot = match slot {
                    Value::String(_) => Value::String(text.clone()),
                    _ => serde_json::from_str::<Value>(text)
                        .unwrap_or_else(|_| Value::String(text.clone())),
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_turn_is_checked_and_every_text_is_a_segment() {
        let body = json!({"messages": [
            {"role": "system", "content": "be nice"},
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "reply", "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "f", "arguments": "{\"to\":\"a@b.example\"}"}}]},
            {"role": "user", "content": [
                {"type": "text", "text": "second"},
                {"type": "image_url", "image_url": {"url": "x"}},
                {"type": "text", "text": "third"}
            ]},
            {"role": "tool", "content": "tool output", "tool_call_id": "c1"}
        ]});
        let mut subject = Subject::input(Route::ChatCompletions, &body);
        // A client may write anything into an "earlier" turn: all of them are read.
        assert_eq!(
            subject.text(),
            "be nice\nfirst\nreply\n{\"to\":\"a@b.example\"}\nsecond\nthird\ntool output"
        );
        assert_eq!(subject.texts().len(), 7);
        assert_eq!(
            subject.pointers()[3],
            "/messages/2/tool_calls/0/function/arguments"
        );
        assert_eq!(subject.pointers()[5], "/messages/3/content/2/text");

        let mut texts = subject.texts().to_vec();
        texts[1] = "FIRST".into();
        texts[3] = "{\"to\":\"[EMAIL]\"}".into();
        texts[5] = "THIRD".into();
        subject.set_texts(texts);
        let mut rewritten = body.clone();
        subject.write_into(&mut rewritten);
        assert_eq!(rewritten["messages"][1]["content"], "FIRST");
        assert_eq!(
            rewritten["messages"][2]["tool_calls"][0]["function"]["arguments"],
            "{\"to\":\"[EMAIL]\"}"
        );
        assert_eq!(rewritten["messages"][3]["content"][2]["text"], "THIRD");
        assert_eq!(
            rewritten["messages"][3]["content"][1]["image_url"]["url"],
            "x"
        );
    }

    #[test]
    fn anthropic_messages_with_their_tool_blocks() {
        let body = json!({"system": [{"type": "text", "text": "s1"}], "messages": [
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "t1", "name": "lookup", "input": {"q": "secret plan"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "found it"},
                {"type": "text", "text": "and?"}]}
        ]});
        let mut subject = Subject::input(Route::Messages, &body);
        assert_eq!(
            subject.pointers(),
            [
                "/system/0/text",
                "/messages/0/content/0/input",
                "/messages/1/content/0/content",
                "/messages/1/content/1/text"
            ]
        );
        assert!(subject.text().contains("secret plan"), "{}", subject.text());
        // A rewritten tool input goes back as JSON.
        let mut texts = subject.texts().to_vec();
        texts[1] = r#"{"q":"[REDACTED]"}"#.into();
        subject.set_texts(texts);
        let mut rewritten = body.clone();
        subject.write_into(&mut rewritten);
        assert_eq!(
            rewritten["messages"][0]["content"][0]["input"],
            json!({"q": "[REDACTED]"})
        );
        // One that is no longer JSON goes in as text: never the original.
        let mut texts = subject.texts().to_vec();
        texts[1] = r#"{"phone": [PHONE]}"#.into();
        subject.set_texts(texts);
        subject.write_into(&mut rewritten);
        assert_eq!(
            rewritten["messages"][0]["content"][0]["input"],
            r#"{"phone": [PHONE]}"#
        );
        let answer = json!({"type": "message", "content": [
            {"type": "text", "text": "hello"},
            {"type": "tool_use", "id": "t2", "name": "f", "input": {"a": 1}}]});
        assert_eq!(Subject::output(&answer).text(), "hello\n{\"a\":1}");
    }

    #[test]
    fn embeddings_inputs_and_every_choice_of_answers() {
        let subject = Subject::input(Route::Embeddings, &json!({"input": ["a", "b"]}));
        assert_eq!(subject.text(), "a\nb");
        let subject = Subject::input(Route::Embeddings, &json!({"input": [1, 2]}));
        assert_eq!(subject.text(), "");
        assert!(Subject::input(Route::Passthrough, &json!({}))
            .texts()
            .is_empty());

        let answer = json!({"choices": [
            {"index": 0, "message": {"role": "assistant", "content": "one"}},
            {"index": 1, "message": {"role": "assistant", "content": "two"}},
            {"index": 2, "message": {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}}
        ]});
        let subject = Subject::output(&answer);
        assert_eq!(subject.text(), "one\ntwo\n{}");
        assert_eq!(Subject::output(&json!({"x": 1})).text(), "");
    }
}
