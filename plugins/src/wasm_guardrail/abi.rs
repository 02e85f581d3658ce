//! The guest interface as the host holds it, and its forms in each version of the world the
//! host runs: `gateway:guardrail@0.1.0` and `@0.2.0` (`plugin-sdk/wit/guardrail/`).
//!
//! The plugin builds requests, answers and verdicts in the host's own types (a superset of
//! both versions); a session turns them into the version its component implements. A 0.1.0
//! component gets the text only: no tool calls, no API, and a message rewrite from it keeps
//! the tool calls as sent.

/// The 0.1.0 world.
pub mod v1 {
    wasmtime::component::bindgen!({
        path: "../plugin-sdk/wit/guardrail/v0.1.0",
        world: "guardrail-plugin",
    });
}

/// The 0.2.0 world.
pub mod v2 {
    wasmtime::component::bindgen!({
        path: "../plugin-sdk/wit/guardrail/v0.2.0",
        world: "guardrail-plugin",
    });
}

use v1::exports::gateway::guardrail::guardrail as g1;
use v2::exports::gateway::guardrail::guardrail as g2;

/// The version of the world a component implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V0_1,
    V0_2,
}

impl Version {
    pub fn as_str(self) -> &'static str {
        match self {
            Version::V0_1 => "0.1.0",
            Version::V0_2 => "0.2.0",
        }
    }
}

/// The API a request came in by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    ChatCompletions,
    Messages,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Message {
    pub role: String,
    pub content: String,
    pub tool_calls: Vec<ToolCall>,
    pub tool_call_id: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Request {
    pub api: Api,
    pub model: Option<String>,
    pub messages: Vec<Message>,
    pub tools: Vec<String>,
}

/// One choice of a complete answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answer {
    pub text: String,
    pub tool_calls: Vec<ToolCall>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    Deny(String),
    RewriteMessages(Vec<Message>),
    RewriteText(String),
}

impl Request {
    pub fn v1(&self) -> g1::ChatRequest {
        g1::ChatRequest {
            model: self.model.clone(),
            messages: self
                .messages
                .iter()
                .map(|m| g1::Message {
                    role: m.role.clone(),
                    content: m.content.clone(),
                })
                .collect(),
            tools: self.tools.clone(),
        }
    }

    pub fn v2(&self) -> g2::ChatRequest {
        g2::ChatRequest {
            api: match self.api {
                Api::ChatCompletions => g2::Api::ChatCompletions,
                Api::Messages => g2::Api::Messages,
            },
            model: self.model.clone(),
            messages: self.messages.iter().map(Message::v2).collect(),
            tools: self.tools.clone(),
        }
    }
}

impl Message {
    fn v2(&self) -> g2::Message {
        g2::Message {
            role: self.role.clone(),
            content: self.content.clone(),
            tool_calls: self.tool_calls.iter().map(ToolCall::v2).collect(),
            tool_call_id: self.tool_call_id.clone(),
        }
    }
}

impl ToolCall {
    fn v2(&self) -> g2::ToolCall {
        g2::ToolCall {
            id: self.id.clone(),
            name: self.name.clone(),
            arguments: self.arguments.clone(),
        }
    }
}

impl Answer {
    pub fn v2(&self) -> g2::Answer {
        g2::Answer {
            text: self.text.clone(),
            tool_calls: self.tool_calls.iter().map(ToolCall::v2).collect(),
        }
    }
}

impl From<g1::Verdict> for Verdict {
    fn from(v: g1::Verdict) -> Verdict {
        match v {
            g1::Verdict::Allow => Verdict::Allow,
            g1::Verdict::Deny(reason) => Verdict::Deny(reason),
            g1::Verdict::RewriteMessages(list) => Verdict::RewriteMessages(
                list.into_iter()
                    .map(|m| Message {
                        role: m.role,
                        content: m.content,
                        ..Message::default()
                    })
                    .collect(),
            ),
            g1::Verdict::RewriteText(text) => Verdict::RewriteText(text),
        }
    }
}

impl From<g2::Verdict> for Verdict {
    fn from(v: g2::Verdict) -> Verdict {
        match v {
            g2::Verdict::Allow => Verdict::Allow,
            g2::Verdict::Deny(reason) => Verdict::Deny(reason),
            g2::Verdict::RewriteMessages(list) => Verdict::RewriteMessages(
                list.into_iter()
                    .map(|m| Message {
                        role: m.role,
                        content: m.content,
                        tool_calls: m
                            .tool_calls
                            .into_iter()
                            .map(|c| ToolCall {
                                id: c.id,
                                name: c.name,
                                arguments: c.arguments,
                            })
                            .collect(),
                        tool_call_id: m.tool_call_id,
                    })
                    .collect(),
            ),
            g2::Verdict::RewriteText(text) => Verdict::RewriteText(text),
        }
    }
}
