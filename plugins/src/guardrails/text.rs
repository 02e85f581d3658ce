//! What text a check sees, and where a rewrite of it goes back.
//!
//! A request or answer body holds its text in several places (each message, each part of a
//! multi-part message, each choice). [`Subject`] lists them as segments, each with the
//! JSON pointer it came from, and marks which of them form the *checked text*: the one string
//! most checks read.
//!
//! - **Chat completions and Anthropic messages (input)**: one segment per message content (a
//!   plain string, or each `text` of a list of parts), plus Anthropic's top-level `system`.
//!   The checked text is the **last user message** (its parts joined with a newline); without a
//!   user message, the last message. Earlier turns were checked when they were sent.
//! - **Embeddings and moderations (input)**: one segment per `input` string; the checked text
//!   is all of them joined with newlines. Token-array inputs carry no text.
//! - **Chat completions (output)**: one segment per choice's `message.content`; the checked text
//!   is the first choice's.
//!
//! Checks that rewrite (PII redaction) read and rewrite every segment, so that no earlier turn
//! or other choice keeps what the checked text had redacted.

use serde_json::Value;

use plugin_sdk::Route;

/// The texts of a body, where each lives, and which of them make up the checked text.
#[derive(Debug, Clone, Default)]
pub struct Subject {
    /// Where each text lives, as a JSON pointer (`/messages/2/content/0/text`).
    pointers: Vec<String>,
    texts: Vec<String>,
    /// Indexes of the checked text's segments, in order.
    primary: Vec<usize>,
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

    /// The texts of a `chat.completion` answer body.
    pub fn output(body: &Value) -> Subject {
        let mut subject = Subject::default();
        let Some(choices) = body.get("choices").and_then(Value::as_array) else {
            return subject;
        };
        for (i, choice) in choices.iter().enumerate() {
            let before = subject.texts.len();
            if let Some(content) = choice.get("message").and_then(|m| m.get("content")) {
                subject.push_content(&format!("/choices/{i}/message/content"), content);
            }
            if i == 0 {
                subject.primary = (before..subject.texts.len()).collect();
            }
        }
        subject
    }

    /// A subject of one text (a streamed answer), which is also the checked text. It has no
    /// place in a body.
    pub fn single(text: String) -> Subject {
        Subject {
            pointers: vec![String::new()],
            texts: vec![text],
            primary: vec![0],
        }
    }

    fn conversation(body: &Value) -> Subject {
        let mut subject = Subject::default();
        if let Some(system) = body.get("system") {
            subject.push_content("/system", system);
        }
        let Some(messages) = body.get("messages").and_then(Value::as_array) else {
            return subject;
        };
        let mut last_user = None;
        let mut last = None;
        for (i, message) in messages.iter().enumerate() {
            let before = subject.texts.len();
            if let Some(content) = message.get("content") {
                subject.push_content(&format!("/messages/{i}/content"), content);
            }
            let range = before..subject.texts.len();
            if message.get("role").and_then(Value::as_str) == Some("user") {
                last_user = Some(range.clone());
            }
            last = Some(range);
        }
        subject.primary = last_user
            .or(last)
            .map(Iterator::collect)
            .unwrap_or_default();
        subject
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
        subject.primary = (0..subject.texts.len()).collect();
        subject
    }

    fn push(&mut self, pointer: String, text: &str) {
        self.pointers.push(pointer);
        self.texts.push(text.to_owned());
    }

    /// Adds the texts of a message content: a string, or a list of parts with `text` strings.
    fn push_content(&mut self, pointer: &str, content: &Value) {
        match content {
            Value::String(s) => self.push(pointer.to_owned(), s),
            Value::Array(parts) => {
                for (j, part) in parts.iter().enumerate() {
                    if let Some(text) = part.get("text").and_then(Value::as_str) {
                        self.push(format!("{pointer}/{j}/text"), text);
                    }
                }
            }
            _ => {}
        }
    }

    /// The checked text: the primary segments joined with newlines.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for (n, &i) in self.primary.iter().enumerate() {
            if n > 0 {
                out.push('\n');
            }
            if let Some(s) = self.texts.get(i) {
                out.push_str(s);
            }
        }
        out
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
        }
    }

    /// Writes the segments' texts back into the body they came from.
    pub fn write_into(&self, body: &mut Value) {
        for (pointer, text) in self.pointers.iter().zip(&self.texts) {
            if pointer.is_empty() {
                continue;
            }
            if let Some(slot) = body.pointer_mut(pointer) {
                *slot = Value::String(text.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_last_user_message_is_the_checked_text_and_every_text_is_a_segment() {
        let body = json!({"messages": [
            {"role": "system", "content": "be nice"},
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "reply"},
            {"role": "user", "content": [
                {"type": "text", "text": "second"},
                {"type": "image_url", "image_url": {"url": "x"}},
                {"type": "text", "text": "third"}
            ]},
            {"role": "tool", "content": "tool output", "tool_call_id": "t"}
        ]});
        let mut subject = Subject::input(Route::ChatCompletions, &body);
        assert_eq!(subject.text(), "second\nthird");
        assert_eq!(subject.texts().len(), 6);
        assert_eq!(subject.pointers()[4], "/messages/3/content/2/text");

        let mut texts = subject.texts().to_vec();
        texts[1] = "FIRST".into();
        texts[4] = "THIRD".into();
        subject.set_texts(texts);
        let mut rewritten = body.clone();
        subject.write_into(&mut rewritten);
        assert_eq!(rewritten["messages"][1]["content"], "FIRST");
        assert_eq!(rewritten["messages"][3]["content"][2]["text"], "THIRD");
        assert_eq!(
            rewritten["messages"][3]["content"][1]["image_url"]["url"],
            "x"
        );
    }

    #[test]
    fn without_a_user_message_the_last_message_is_checked() {
        let body = json!({"system": "sys", "messages": [{"role": "assistant", "content": "only"}]});
        let subject = Subject::input(Route::Messages, &body);
        let blocks = json!({"system": [{"type": "text", "text": "s1"}], "messages": []});
        assert_eq!(
            Subject::input(Route::Messages, &blocks).pointers(),
            ["/system/0/text"]
        );
        assert_eq!(subject.text(), "only");
        assert_eq!(subject.pointers()[0], "/system");
    }

    #[test]
    fn embeddings_inputs_and_answers() {
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
            {"index": 2, "message": {"role": "assistant", "content": null}}
        ]});
        let subject = Subject::output(&answer);
        assert_eq!(subject.text(), "one");
        assert_eq!(subject.texts(), vec!["one", "two"]);
        assert_eq!(Subject::output(&json!({"x": 1})).text(), "");
    }
}
