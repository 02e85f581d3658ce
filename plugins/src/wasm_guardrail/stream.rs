//! Streamed answers: each choice's deltas go to a `stream-checker` of one instance that lives
//! as long as the stream (kept in the request's extensions).
//!
//! Per event of a chat completion's chunk (OpenAI's `chat.completion.chunk` shape):
//! - each choice's `delta.content` is pushed to that choice's checker (made on its first
//!   delta). `rewrite-text` replaces the delta's content (empty holds it back);
//! - each piece of a choice's `delta.tool_calls[].function.arguments` goes to
//!   `push-tool-arguments` (0.2.0 guests), with the call's `index` and, on its first piece,
//!   its name;
//! - a choice's `finish_reason` calls its checker's `finish`, whose `rewrite-text` is added to
//!   that event's content;
//! - `data: [DONE]` finishes the choices still open (their text goes in an event of its own
//!   before `[DONE]`), and the stream's result is recorded.
//!
//! On `/v1/messages` (Anthropic's events) the answer is one choice: `text_delta`s are pushed
//! (a rewrite replaces the delta's text), `input_json_delta`s go to `push-tool-arguments` (the
//! tool call's index counts the `tool_use` blocks), and `message_stop` calls `finish`, which
//! may deny but not add text (the blocks have ended: that is an error).
//!
//! A `deny` (or an error under `fail_closed`) ends the stream: the refusal is its last event.
//! Without `deny` (or under `fail_open`) the result is recorded and the rest of the stream
//! passes unchecked.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{json, Value};
use wasmtime::component::ResourceAny;

use plugin_sdk::{Chunk, PluginResponse, RequestCx, Route};

use super::abi::{Request, Verdict};
use super::runtime::{CallError, Session};
use super::{subject, PhaseOutcome, WasmGuardrail};
use crate::guardrails::results::Side;

/// The stream state of every wasm guardrail of a request, by plugin.
#[derive(Clone, Default)]
pub struct StreamChecks(Arc<Mutex<HashMap<u64, StreamCheck>>>);

/// One guardrail's view of one stream.
#[derive(Default)]
pub struct StreamCheck {
    session: Option<Session>,
    request: Option<Request>,
    /// Open checkers by choice index.
    checkers: BTreeMap<u64, ResourceAny>,
    /// `/v1/messages`: the `tool_use` blocks by block index: the call's index, and its name
    /// until its first piece of arguments has been pushed.
    tool_blocks: HashMap<u64, (u32, Option<String>)>,
    /// The stream's result is recorded; the rest passes unchecked.
    done: bool,
    transformed: bool,
    elapsed: Duration,
    /// `id`, `created` and `model` of the stream's chunks, for an event the host adds.
    template: Option<Value>,
}

/// What an event came to.
enum Event {
    Same,
    Changed(String),
    /// The stream's checks are over (a deny or an error).
    Stop(PhaseOutcome),
}

/// Checks the events of a chunk; the refusal that ends the stream, if any.
pub fn check_chunk(
    plugin: &WasmGuardrail,
    cx: &mut RequestCx,
    chunk: &mut Chunk,
) -> Option<PluginResponse> {
    let anthropic = cx.route == Route::Messages;
    let text = std::str::from_utf8(&chunk.data).ok()?;
    let streams = match cx.extensions.get::<StreamChecks>() {
        Some(s) => s.clone(),
        None => {
            let s = StreamChecks::default();
            cx.extensions.insert(s.clone());
            s
        }
    };
    let mut map = streams.0.lock().ok()?;
    let state = map.entry(plugin.uid).or_default();
    if state.done {
        return None;
    }
    if state.request.is_none() {
        state.request = Some(subject::request(cx)?);
    }
    let started = Instant::now();
    let mut out = String::with_capacity(text.len() + 64);
    let mut changed = false;
    let mut stop = None;
    let mut rest = text;
    while !rest.is_empty() {
        let end = rest.find("\n\n").map_or(rest.len(), |i| i + 2);
        let (event, tail) = rest.split_at(end);
        rest = tail;
        if stop.is_some() {
            out.push_str(event);
            continue;
        }
        let checked = if anthropic {
            check_anthropic_event(plugin, state, event)
        } else {
            check_event(plugin, state, event)
        };
        match checked {
            Event::Same => out.push_str(event),
            Event::Changed(new) => {
                out.push_str(&new);
                changed = true;
            }
            Event::Stop(outcome) => {
                out.push_str(event);
                stop = Some(outcome);
            }
        }
    }
    state.elapsed += started.elapsed();
    if changed {
        chunk.data = Bytes::from(out);
    }
    let mut outcome = match stop {
        Some(outcome) => outcome,
        None if state.done => PhaseOutcome::default(),
        None => return None,
    };
    state.done = true;
    outcome.elapsed = state.elapsed;
    outcome.transformed |= state.transformed;
    // The instance is no longer needed.
    state.session = None;
    state.checkers.clear();
    drop(map);
    plugin.conclude(cx, Side::Output, &outcome)
}

/// Checks one event; the event to send instead when it changed.
fn check_event(plugin: &WasmGuardrail, state: &mut StreamCheck, event: &str) -> Event {
    let data = event_data(event);
    if data.trim() == "[DONE]" {
        return match finish_all(state) {
            Ok(extra) => {
                state.done = true;
                if extra.is_empty() {
                    Event::Same
                } else {
                    Event::Changed(format!("{extra}{event}"))
                }
            }
            Err(outcome) => Event::Stop(outcome),
        };
    }
    let Ok(mut value) = serde_json::from_str::<Value>(&data) else {
        return Event::Same;
    };
    if state.template.is_none() {
        state.template = Some(json!({
            "id": value.get("id").cloned().unwrap_or(Value::Null),
            "object": "chat.completion.chunk",
            "created": value.get("created").cloned().unwrap_or(Value::Null),
            "model": value.get("model").cloned().unwrap_or(Value::Null),
        }));
    }
    let Some(choices) = value.get_mut("choices").and_then(Value::as_array_mut) else {
        return Event::Same;
    };
    let mut modified = false;
    for (position, choice) in choices.iter_mut().enumerate() {
        let index = choice
            .get("index")
            .and_then(Value::as_u64)
            .unwrap_or(position as u64);
        let delta = choice
            .get("delta")
            .and_then(|d| d.get("content"))
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .map(str::to_owned);
        if let Some(delta) = delta {
            match push(plugin, state, index, &delta) {
                Ok(None) => {}
                Ok(Some(new)) => {
                    choice["delta"]["content"] = Value::String(new);
                    modified = true;
                }
                Err(outcome) => return Event::Stop(outcome),
            }
        }
        let calls = choice["delta"]["tool_calls"].as_array().cloned();
        for (position, call) in calls.into_iter().flatten().enumerate() {
            let call_index = call["index"].as_u64().unwrap_or(position as u64) as u32;
            let name = call["function"]["name"].as_str();
            let arguments = call["function"]["arguments"].as_str().unwrap_or_default();
            if name.is_none() && arguments.is_empty() {
                continue;
            }
            if let Err(outcome) = push_tool(plugin, state, index, call_index, name, arguments) {
                return Event::Stop(outcome);
            }
        }
        let finished = choice.get("finish_reason").is_some_and(|r| !r.is_null());
        if finished {
            match finish(state, index) {
                Ok(None) => {}
                Ok(Some(extra)) => {
                    let content = choice
                        .get("delta")
                        .and_then(|d| d.get("content"))
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    let joined = format!("{content}{extra}");
                    if !choice.get("delta").is_some_and(Value::is_object) {
                        choice["delta"] = json!({});
                    }
                    choice["delta"]["content"] = Value::String(joined);
                    modified = true;
                }
                Err(outcome) => return Event::Stop(outcome),
            }
        }
    }
    if modified {
        Event::Changed(format!("data: {value}\n\n"))
    } else {
        Event::Same
    }
}

/// Checks one event of an Anthropic Messages stream; the event to send instead when it changed.
fn check_anthropic_event(plugin: &WasmGuardrail, state: &mut StreamCheck, event: &str) -> Event {
    let data = event_data(event);
    let Ok(mut value) = serde_json::from_str::<Value>(&data) else {
        return Event::Same;
    };
    let block = value["index"].as_u64().unwrap_or(0);
    match value["type"].as_str().unwrap_or_default() {
        "content_block_start" if value["content_block"]["type"] == "tool_use" => {
            let call_index = state.tool_blocks.len() as u32;
            let name = value["content_block"]["name"].as_str().map(str::to_owned);
            state.tool_blocks.insert(block, (call_index, name));
            Event::Same
        }
        "content_block_delta" => match value["delta"]["type"].as_str().unwrap_or_default() {
            "text_delta" => {
                let delta = value["delta"]["text"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                if delta.is_empty() {
                    return Event::Same;
                }
                match push(plugin, state, 0, &delta) {
                    Ok(None) => Event::Same,
                    Ok(Some(new)) => {
                        value["delta"]["text"] = Value::String(new);
                        Event::Changed(format!("event: content_block_delta\ndata: {value}\n\n"))
                    }
                    Err(outcome) => Event::Stop(outcome),
                }
            }
            "input_json_delta" => {
                let piece = value["delta"]["partial_json"].as_str().unwrap_or_default();
                let (call_index, name) = match state.tool_blocks.get_mut(&block) {
                    Some((i, name)) => (*i, name.take()),
                    None => (0, None),
                };
                if piece.is_empty() && name.is_none() {
                    return Event::Same;
                }
                match push_tool(plugin, state, 0, call_index, name.as_deref(), piece) {
                    Ok(()) => Event::Same,
                    Err(outcome) => Event::Stop(outcome),
                }
            }
            _ => Event::Same,
        },
        "message_stop" => match finish(state, 0) {
            Ok(None) => {
                state.done = true;
                Event::Same
            }
            Ok(Some(_)) => Event::Stop(failed(CallError::BadVerdict(
                "finish may not add text to a /v1/messages stream: its blocks have ended".into(),
            ))),
            Err(outcome) => Event::Stop(outcome),
        },
        _ => Event::Same,
    }
}

/// The data of an event: its `data:` lines joined.
pub(super) fn event_data(event: &str) -> String {
    let mut data = String::new();
    for line in event.lines() {
        if let Some(d) = line.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(d.strip_prefix(' ').unwrap_or(d));
        }
    }
    data
}

fn failed(error: CallError) -> PhaseOutcome {
    PhaseOutcome {
        error: Some(error),
        ..PhaseOutcome::default()
    }
}

fn denied(reason: String) -> PhaseOutcome {
    PhaseOutcome {
        denied: Some(reason),
        ..PhaseOutcome::default()
    }
}

/// The stream's instance, made on first use.
fn session<'a>(
    plugin: &WasmGuardrail,
    state: &'a mut StreamCheck,
) -> Result<&'a mut Session, PhaseOutcome> {
    if state.session.is_none() {
        let loaded = plugin.loaded.load();
        state.session = Some(loaded.session().map_err(failed)?);
    }
    state
        .session
        .as_mut()
        .ok_or_else(|| failed(CallError::Unavailable("no instance".into())))
}

/// The checker of choice `index`, opened on its first delta.
fn checker(
    plugin: &WasmGuardrail,
    state: &mut StreamCheck,
    index: u64,
) -> Result<ResourceAny, PhaseOutcome> {
    if let Some(c) = state.checkers.get(&index).copied() {
        return Ok(c);
    }
    let request = state.request.clone().ok_or_else(|| {
        failed(CallError::Unavailable(
            "the stream's request is unknown".into(),
        ))
    })?;
    let session = session(plugin, state)?;
    session.arm();
    let c = session.open_stream(&request).map_err(failed)?;
    state.checkers.insert(index, c);
    Ok(c)
}

/// Pushes a piece of a tool call's arguments: `allow` goes on, `deny` stops the stream.
fn push_tool(
    plugin: &WasmGuardrail,
    state: &mut StreamCheck,
    index: u64,
    call_index: u32,
    name: Option<&str>,
    arguments: &str,
) -> Result<(), PhaseOutcome> {
    let checker = checker(plugin, state, index)?;
    let session = session(plugin, state)?;
    session.arm();
    match session
        .push_tool_arguments(checker, call_index, name, arguments)
        .map_err(failed)?
    {
        Verdict::Allow => Ok(()),
        Verdict::Deny(reason) => Err(denied(reason)),
        _ => Err(failed(CallError::BadVerdict(
            "push-tool-arguments may only allow or deny".into(),
        ))),
    }
}

/// Pushes a delta; the text to send instead, if the guest rewrote it.
fn push(
    plugin: &WasmGuardrail,
    state: &mut StreamCheck,
    index: u64,
    delta: &str,
) -> Result<Option<String>, PhaseOutcome> {
    let checker = checker(plugin, state, index)?;
    let session = session(plugin, state)?;
    session.arm();
    match session.push(checker, delta).map_err(failed)? {
        Verdict::Allow => Ok(None),
        Verdict::Deny(reason) => Err(denied(reason)),
        Verdict::RewriteText(text) => {
            state.transformed = true;
            Ok(Some(text))
        }
        Verdict::RewriteMessages(_) => Err(failed(CallError::BadVerdict(
            "rewrite-messages rewrites requests; push may only rewrite text".into(),
        ))),
    }
}

fn session_mut(state: &mut StreamCheck) -> Result<&mut Session, PhaseOutcome> {
    state
        .session
        .as_mut()
        .ok_or_else(|| failed(CallError::Unavailable("no instance".into())))
}

/// Finishes a choice's checker, if it has one; the text to add, if any.
fn finish(state: &mut StreamCheck, index: u64) -> Result<Option<String>, PhaseOutcome> {
    let Some(checker) = state.checkers.remove(&index) else {
        return Ok(None);
    };
    let session = session_mut(state)?;
    session.arm();
    let verdict = session.finish(checker).map_err(failed)?;
    session.drop_checker(checker);
    match verdict {
        Verdict::Allow => Ok(None),
        Verdict::Deny(reason) => Err(denied(reason)),
        Verdict::RewriteText(text) if text.is_empty() => Ok(None),
        Verdict::RewriteText(text) => {
            state.transformed = true;
            Ok(Some(text))
        }
        Verdict::RewriteMessages(_) => Err(failed(CallError::BadVerdict(
            "rewrite-messages rewrites requests; finish may only rewrite text".into(),
        ))),
    }
}

/// Finishes every open checker at the end of the stream; events carrying text they add.
fn finish_all(state: &mut StreamCheck) -> Result<String, PhaseOutcome> {
    let mut events = String::new();
    let open: Vec<u64> = state.checkers.keys().copied().collect();
    for index in open {
        if let Some(text) = finish(state, index)? {
            let mut event = state.template.clone().unwrap_or_else(|| json!({}));
            event["choices"] =
                json!([{"index": index, "delta": {"content": text}, "finish_reason": null}]);
            events.push_str(&format!("data: {event}\n\n"));
        }
    }
    Ok(events)
}
