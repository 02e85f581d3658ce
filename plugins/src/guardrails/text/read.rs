//! The texts of a body read straight from its bytes, in one pass, without building its JSON
//! tree: what [`Subject::input`] and [`Subject::output`] find in the parsed body, found while
//! parsing. Keys may come in any order and a repeated key counts once, its last value, as in a
//! parsed body; a member of an unexpected type holds no text, as there.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

use super::Subject;

/// What a body's top level holds.
#[derive(Clone, Copy)]
pub(super) enum Shape {
    /// A chat or Anthropic request: `system`, then `messages`.
    Conversation,
    /// An embeddings or moderations request: `input`.
    Inputs,
    /// An answer: every choice's message, else Anthropic's `content`.
    Answer,
}

/// The subject of a body; `None` when the bytes are not JSON.
pub(super) fn subject(shape: Shape, bytes: &[u8]) -> Option<Subject> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let subject = de.deserialize_any(Top(shape)).ok()?;
    de.end().ok()?;
    Some(subject)
}

/// The visitor methods shared by every reader here: what it expects, and the scalars, which
/// hold no text (consumed, giving `default`).
macro_rules! ignore_others {
    ($value:ty, $default:expr) => {
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a JSON value")
        }
        fn visit_bool<E>(self, _: bool) -> Result<$value, E> {
            Ok($default)
        }
        fn visit_i64<E>(self, _: i64) -> Result<$value, E> {
            Ok($default)
        }
        fn visit_u64<E>(self, _: u64) -> Result<$value, E> {
            Ok($default)
        }
        fn visit_f64<E>(self, _: f64) -> Result<$value, E> {
            Ok($default)
        }
        fn visit_unit<E>(self) -> Result<$value, E> {
            Ok($default)
        }
        fn visit_none<E>(self) -> Result<$value, E> {
            Ok($default)
        }
    };
}

/// A seed that reads any value with itself as the visitor.
macro_rules! read_any {
    ($seed:ty => $value:ty) => {
        impl<'de> DeserializeSeed<'de> for $seed {
            type Value = $value;
            fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<$value, D::Error> {
                d.deserialize_any(self)
            }
        }
    };
}

fn drain_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

fn drain_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

/// Segments: (JSON pointer, text).
type Segments = Vec<(String, String)>;

fn into_subject(segments: impl IntoIterator<Item = Segments>) -> Subject {
    let mut subject = Subject::default();
    for (pointer, text) in segments.into_iter().flatten() {
        subject.pointers.push(pointer);
        subject.texts.push(text);
    }
    subject
}

struct Top(Shape);

impl<'de> Visitor<'de> for Top {
    type Value = Subject;

    ignore_others!(Subject, Subject::default());

    fn visit_str<E>(self, _: &str) -> Result<Subject, E> {
        Ok(Subject::default())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Subject, A::Error> {
        drain_seq(seq)?;
        Ok(Subject::default())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Subject, A::Error> {
        // Each member's segments, the last of a repeated key winning.
        let (mut first, mut second): (Option<Segments>, Option<Segments>) = (None, None);
        while let Some(key) = map.next_key::<Key>()? {
            match (self.0, key) {
                (Shape::Conversation, Key::System) => {
                    first = Some(map.next_value_seed(ContentSeed("/system".into()))?);
                }
                (Shape::Conversation, Key::Messages) => {
                    second = Some(map.next_value_seed(ListSeed(List::Messages))?);
                }
                (Shape::Inputs, Key::Input) => {
                    first = Some(map.next_value_seed(InputSeed)?);
                }
                // `choices` that are not a list leave the answer to `content`.
                (Shape::Answer, Key::Choices) => {
                    first = map.next_value_seed(ChoicesSeed)?;
                }
                (Shape::Answer, Key::Content) => {
                    second = Some(map.next_value_seed(ContentSeed("/content".into()))?);
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(match self.0 {
            Shape::Conversation | Shape::Inputs => into_subject(first.into_iter().chain(second)),
            Shape::Answer => into_subject(first.or(second)),
        })
    }
}

/// The keys that hold text, told apart while the key is read (no copy of it is made).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Key {
    System,
    Messages,
    Input,
    Choices,
    Content,
    ToolCalls,
    FunctionCall,
    Message,
    Function,
    Arguments,
    Text,
    Type,
    Other,
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(KeyVisitor)
    }
}

struct KeyVisitor;

impl Visitor<'_> for KeyVisitor {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E>(self, v: &str) -> Result<Key, E> {
        Ok(match v {
            "system" => Key::System,
            "messages" => Key::Messages,
            "input" => Key::Input,
            "choices" => Key::Choices,
            "content" => Key::Content,
            "tool_calls" => Key::ToolCalls,
            "function_call" => Key::FunctionCall,
            "message" => Key::Message,
            "function" => Key::Function,
            "arguments" => Key::Arguments,
            "text" => Key::Text,
            "type" => Key::Type,
            _ => Key::Other,
        })
    }
}

/// A string, or nothing for any other value.
struct TextSeed;

read_any!(TextSeed => Option<String>);

impl<'de> Visitor<'de> for TextSeed {
    type Value = Option<String>;

    ignore_others!(Option<String>, None);

    fn visit_str<E>(self, v: &str) -> Result<Option<String>, E> {
        Ok(Some(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Option<String>, E> {
        Ok(Some(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Option<String>, A::Error> {
        drain_seq(seq).map(|()| None)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Option<String>, A::Error> {
        drain_map(map).map(|()| None)
    }
}

/// A message content at a pointer: a string, or a list of parts.
struct ContentSeed(String);

read_any!(ContentSeed => Segments);

impl<'de> Visitor<'de> for ContentSeed {
    type Value = Segments;

    ignore_others!(Segments, Vec::new());

    fn visit_str<E>(self, v: &str) -> Result<Segments, E> {
        Ok(vec![(self.0, v.to_owned())])
    }

    fn visit_string<E>(self, v: String) -> Result<Segments, E> {
        Ok(vec![(self.0, v)])
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Segments, A::Error> {
        drain_map(map).map(|()| Vec::new())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Segments, A::Error> {
        ListSeed(List::Parts(self.0)).visit_seq(seq)
    }
}

/// The lists read element by element, each element's pointer made from its index.
enum List {
    /// `messages`: `/messages/{i}`.
    Messages,
    /// The parts of a content: `{pointer}/{j}`.
    Parts(String),
    /// `choices`: `/choices/{i}/message`.
    Choices,
    /// A message's tool calls: `{pointer}/tool_calls/{j}`.
    ToolCalls(String),
}

struct ListSeed(List);

read_any!(ListSeed => Segments);

impl<'de> Visitor<'de> for ListSeed {
    type Value = Segments;

    ignore_others!(Segments, Vec::new());

    fn visit_str<E>(self, _: &str) -> Result<Segments, E> {
        Ok(Vec::new())
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Segments, A::Error> {
        drain_map(map).map(|()| Vec::new())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Segments, A::Error> {
        let mut segments = Vec::new();
        let mut i = 0usize;
        loop {
            let element = match &self.0 {
                List::Messages => seq.next_element_seed(ObjectSeed {
                    kind: Object::Message,
                    pointer: format!("/messages/{i}"),
                })?,
                List::Choices => seq.next_element_seed(ObjectSeed {
                    kind: Object::Choice,
                    pointer: format!("/choices/{i}/message"),
                })?,
                List::Parts(at) => seq.next_element_seed(ObjectSeed {
                    kind: Object::Part,
                    pointer: format!("{at}/{i}"),
                })?,
                List::ToolCalls(at) => seq.next_element_seed(ObjectSeed {
                    kind: Object::ToolCall,
                    pointer: format!("{at}/tool_calls/{i}/function/arguments"),
                })?,
            };
            let Some(found) = element else { break };
            segments.extend(found);
            i += 1;
        }
        Ok(segments)
    }
}

/// `choices`: a list, or `None` when it is anything else.
struct ChoicesSeed;

read_any!(ChoicesSeed => Option<Segments>);

impl<'de> Visitor<'de> for ChoicesSeed {
    type Value = Option<Segments>;

    ignore_others!(Option<Segments>, None);

    fn visit_str<E>(self, _: &str) -> Result<Option<Segments>, E> {
        Ok(None)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Option<Segments>, A::Error> {
        drain_map(map).map(|()| None)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Option<Segments>, A::Error> {
        ListSeed(List::Choices).visit_seq(seq).map(Some)
    }
}

/// `input`: a string, or a list whose strings are read (token arrays hold no text).
struct InputSeed;

read_any!(InputSeed => Segments);

impl<'de> Visitor<'de> for InputSeed {
    type Value = Segments;

    ignore_others!(Segments, Vec::new());

    fn visit_str<E>(self, v: &str) -> Result<Segments, E> {
        Ok(vec![("/input".into(), v.to_owned())])
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Segments, A::Error> {
        drain_map(map).map(|()| Vec::new())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Segments, A::Error> {
        let mut segments = Vec::new();
        let mut i = 0usize;
        while let Some(item) = seq.next_element_seed(TextSeed)? {
            if let Some(text) = item {
                segments.push((format!("/input/{i}"), text));
            }
            i += 1;
        }
        Ok(segments)
    }
}

/// The objects whose members hold text.
#[derive(Clone, Copy)]
enum Object {
    /// `content`, then each tool call's arguments, then `function_call.arguments`.
    Message,
    /// `message`.
    Choice,
    /// `text`; the `content` of a `tool_result`, the `input` of a `tool_use`.
    Part,
    /// `function.arguments` (the pointer is the arguments').
    ToolCall,
    /// `arguments` (the pointer is the arguments').
    Function,
}

struct ObjectSeed {
    kind: Object,
    pointer: String,
}

read_any!(ObjectSeed => Segments);

impl<'de> Visitor<'de> for ObjectSeed {
    type Value = Segments;

    ignore_others!(Segments, Vec::new());

    fn visit_str<E>(self, _: &str) -> Result<Segments, E> {
        Ok(Vec::new())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Segments, A::Error> {
        drain_seq(seq).map(|()| Vec::new())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Segments, A::Error> {
        let at = &self.pointer;
        // The members that hold text, each the last of its key.
        let (mut content, mut calls, mut function): (Segments, Segments, Segments) =
            (Vec::new(), Vec::new(), Vec::new());
        let mut text: Option<String> = None;
        let mut kind: Option<String> = None;
        let mut input: Option<Value> = None;
        while let Some(key) = map.next_key::<Key>()? {
            match (self.kind, key) {
                (Object::Message | Object::Part, Key::Content) => {
                    content = map.next_value_seed(ContentSeed(format!("{at}/content")))?;
                }
                (Object::Message, Key::ToolCalls) => {
                    calls = map.next_value_seed(ListSeed(List::ToolCalls(at.clone())))?;
                }
                (Object::Message, Key::FunctionCall) => {
                    function = map.next_value_seed(ObjectSeed {
                        kind: Object::Function,
                        pointer: format!("{at}/function_call/arguments"),
                    })?;
                }
                (Object::Choice, Key::Message) => {
                    content = map.next_value_seed(ObjectSeed {
                        kind: Object::Message,
                        pointer: at.clone(),
                    })?;
                }
                (Object::ToolCall, Key::Function) => {
                    function = map.next_value_seed(ObjectSeed {
                        kind: Object::Function,
                        pointer: at.clone(),
                    })?;
                }
                (Object::Function, Key::Arguments) => {
                    text = map.next_value_seed(TextSeed)?;
                }
                (Object::Part, Key::Text) => text = map.next_value_seed(TextSeed)?,
                (Object::Part, Key::Type) => kind = map.next_value_seed(TextSeed)?,
                (Object::Part, Key::Input) => input = Some(map.next_value()?),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(match self.kind {
            Object::Message => {
                content.extend(calls);
                content.extend(function);
                content
            }
            Object::Choice => content,
            Object::ToolCall => function,
            Object::Function => text.map(|t| vec![(self.pointer, t)]).unwrap_or_default(),
            Object::Part => {
                let mut segments: Segments = text
                    .map(|t| vec![(format!("{at}/text"), t)])
                    .unwrap_or_default();
                match kind.as_deref() {
                    Some("tool_result") => segments.extend(content),
                    Some("tool_use") => {
                        if let Some(input) = input {
                            segments.push((format!("{at}/input"), input.to_string()));
                        }
                    }
                    _ => {}
                }
                segments
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::Subject;
    use plugin_sdk::Route;
    use serde_json::{json, Value};

    fn same_as_parsed(route: Route, body: &str) {
        let read = match route {
            Route::Passthrough => Subject::read_output(body.as_bytes()),
            route => Subject::read_input(route, body.as_bytes()),
        };
        let parsed = serde_json::from_str::<Value>(body)
            .ok()
            .map(|v| match route {
                Route::Passthrough => Subject::output(&v),
                route => Subject::input(route, &v),
            });
        let pairs = |s: Option<Subject>| s.map(|s| (s.pointers, s.texts));
        assert_eq!(pairs(read), pairs(parsed), "{body}");
    }

    #[test]
    fn bodies_read_from_bytes_give_what_parsed_bodies_give() {
        let bodies = [
            json!({"model": "m", "messages": [
                {"role": "system", "content": "be nice"},
                {"role": "user", "content": "first"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "f", "arguments": "{\"to\":\"a@b.example\"}"}},
                    {"id": "c2", "function": {"arguments": 3}},
                    "odd"]},
                {"role": "user", "content": [
                    {"type": "text", "text": "second"},
                    {"type": "image_url", "image_url": {"url": "x"}},
                    {"text": 5}, 7, "loose",
                    {"type": "text", "text": "third"}]},
                {"role": "tool", "content": "tool output", "tool_call_id": "c1"},
                {"role": "assistant", "function_call": {"name": "g", "arguments": "{}"}},
                "not a message", [1, 2], null, {"content": {"text": "no"}}
            ]}),
            json!({"system": [{"type": "text", "text": "s1"}], "messages": [
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "t1", "name": "lookup", "input": {"q": "secret plan", "n": [1, 2]}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "found it"}]},
                    {"content": "not a tool result", "type": "text", "text": "and?"},
                    {"type": "tool_result", "content": "plain"}]}
            ]}),
            json!({"system": "top", "messages": "not a list"}),
            json!({"messages": []}),
            json!([{"content": "an array is no body"}]),
            json!("text"),
            json!(null),
        ];
        for body in &bodies {
            same_as_parsed(Route::ChatCompletions, &body.to_string());
            same_as_parsed(Route::Messages, &body.to_string());
        }
        for body in [
            json!({"input": "one"}),
            json!({"input": ["a", 1, "b", [1, 2], {"x": "y"}]}),
            json!({"input": [[1, 2], [3]]}),
            json!({"input": {"text": "no"}}),
            json!({"model": "e"}),
        ] {
            same_as_parsed(Route::Embeddings, &body.to_string());
            same_as_parsed(Route::Moderations, &body.to_string());
        }
        for answer in [
            json!({"choices": [
                {"index": 0, "message": {"role": "assistant", "content": "one"}},
                {"index": 1, "message": {"content": null, "tool_calls": [
                    {"function": {"name": "f", "arguments": "{}"}}]}},
                {"index": 2}, {"message": "odd"}, 4]}),
            json!({"type": "message", "content": [
                {"type": "text", "text": "hello"},
                {"type": "tool_use", "id": "t2", "name": "f", "input": {"a": 1}}]}),
            json!({"choices": null, "content": "anthropic after all"}),
            json!({"choices": {"not": "a list"}, "content": [{"type": "text", "text": "c"}]}),
            json!({"x": 1}),
        ] {
            same_as_parsed(Route::Passthrough, &answer.to_string());
        }
    }

    #[test]
    fn key_order_repeated_keys_escapes_and_bad_json() {
        for body in [
            // Members in another order than the one texts are listed in.
            r#"{"messages": [{"tool_calls": [{"function": {"arguments": "args"}}], "content": "c", "function_call": {"arguments": "fc"}}], "system": "s"}"#,
            r#"{"messages": [{"content": [{"input": {"b": 2, "a": 1}, "text": "t", "type": "tool_use"}]}]}"#,
            r#"{"messages": [{"content": [{"content": "inner", "type": "tool_result"}]}]}"#,
            // A repeated key: its last value counts, as in a parsed body.
            r#"{"messages": [{"content": "first"}], "messages": [{"content": "second"}]}"#,
            r#"{"messages": [{"content": "a", "content": "b"}]}"#,
            r#"{"messages": [{"content": [{"type": "tool_result", "content": "x", "type": "text"}]}]}"#,
            // Escapes and characters beyond ASCII.
            r#"{"messages": [{"content": "line\nbreak \"quoted\" \u00e9 \ud83d\ude00 caf\u00e9"}]}"#,
            r#"{"mess\u0061ges": [{"content": "escaped key"}]}"#,
            // Not JSON, or JSON followed by more.
            r#"{"messages": [{"content": "cut"#,
            r#"{"messages": []} trailing"#,
            "",
        ] {
            same_as_parsed(Route::ChatCompletions, body);
        }
        same_as_parsed(
            Route::Passthrough,
            r#"{"content": "late", "choices": [{"message": {"content": "first"}}], "choices": 1}"#,
        );
        same_as_parsed(Route::Embeddings, r#"{"input": "a", "input": ["b", "c"]}"#);
    }
}
