//! `POST /model/{modelId}/converse` and `/converse-stream`: Bedrock's
//! Converse API with its request checks, deterministic replies, tool use
//! and eventstream streaming.
//!
//! The request is checked the way Bedrock rejects it: `messages` non-empty,
//! starting with `user` and alternating; content blocks that set exactly
//! one member; images and documents with base64 bytes; `system` as a list
//! of blocks; typed `inferenceConfig` and `toolConfig`; no fields of other
//! APIs (`model`, `max_tokens`, `tools`, ...). Anything else is a 400
//! `ValidationException`.
//!
//! The reply is `"mock reply to: <last user text>"` (or `w1 ... wn` under
//! the `words` fault), cut at the earliest stop sequence and then at
//! `maxTokens` words. With tools (and a last user turn that is not a tool
//! result) it is one `toolUse` block calling the named tool, or the first,
//! with input `{"mock":true,"n":1}`; after a tool result, the reply
//! answers the result's text (or JSON). Tokens are words.

use bytes::Bytes;
use http::StatusCode;
use serde::Serialize;
use serde_json::{Map, Value};

use super::{eventstream, AwsError, HandlerResult};
use crate::body;
use crate::server::Ctx;
use crate::text;

/// Id of the (single) `toolUse` block in tool answers.
const TOOL_USE_ID: &str = "tooluse_mock_0";
/// How the tool input is streamed; joins back to `{"mock":true,"n":1}`.
const TOOL_INPUT_PIECES: [&str; 3] = [r#"{"mock":"#, "true,", r#""n":1}"#];

/// Top-level members of a Converse request.
const FIELDS: [&str; 10] = [
    "messages",
    "system",
    "inferenceConfig",
    "toolConfig",
    "guardrailConfig",
    "additionalModelRequestFields",
    "additionalModelResponseFieldPaths",
    "promptVariables",
    "requestMetadata",
    "performanceConfig",
];

/// Fields of other APIs that a translation might leave in, with where
/// Converse wants them.
const FOREIGN_FIELDS: [(&str, &str); 17] = [
    ("model", "the model id is the {modelId} path segment"),
    ("modelId", "the model id is the {modelId} path segment"),
    ("max_tokens", "use inferenceConfig.maxTokens"),
    ("max_completion_tokens", "use inferenceConfig.maxTokens"),
    ("maxTokens", "use inferenceConfig.maxTokens"),
    ("temperature", "use inferenceConfig.temperature"),
    ("top_p", "use inferenceConfig.topP"),
    ("stop", "use inferenceConfig.stopSequences"),
    ("stop_sequences", "use inferenceConfig.stopSequences"),
    ("stopSequences", "use inferenceConfig.stopSequences"),
    ("tools", "use toolConfig.tools"),
    ("tool_choice", "use toolConfig.toolChoice"),
    ("toolChoice", "use toolConfig.toolChoice"),
    ("stream", "streaming is the /converse-stream operation"),
    (
        "anthropic_version",
        "that is a field of InvokeModel's Anthropic body, not of Converse",
    ),
    ("n", "Converse returns one message"),
    (
        "response_format",
        "Converse has no response_format; use a tool or the prompt",
    ),
];

/// Members of a message content block.
const BLOCK_MEMBERS: [&str; 7] = [
    "text",
    "image",
    "document",
    "toolUse",
    "toolResult",
    "reasoningContent",
    "cachePoint",
];
const TOOL_RESULT_MEMBERS: [&str; 5] = ["text", "json", "image", "document", "video"];
const SYSTEM_MEMBERS: [&str; 3] = ["text", "guardContent", "cachePoint"];
const IMAGE_FORMATS: [&str; 4] = ["png", "jpeg", "gif", "webp"];
const DOCUMENT_FORMATS: [&str; 9] = [
    "pdf", "csv", "doc", "docx", "xls", "xlsx", "html", "txt", "md",
];

fn invalid(message: impl Into<String>) -> AwsError {
    AwsError::validation(message)
}

/// `fields[key]`, with `null` treated as absent.
fn get<'a>(fields: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    fields.get(key).filter(|v| !v.is_null())
}

fn required<'a>(
    fields: &'a Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<&'a Value, AwsError> {
    get(fields, key).ok_or_else(|| {
        invalid(format!(
            "1 validation error detected: Value null at '{path}.{key}' failed to satisfy constraint: Member must not be null"
        ))
    })
}

fn required_str<'a>(
    fields: &'a Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<&'a str, AwsError> {
    required(fields, key, path)?
        .as_str()
        .ok_or_else(|| invalid(format!("{path}.{key}: expected a string")))
}

fn object<'a>(value: &'a Value, path: &str) -> Result<&'a Map<String, Value>, AwsError> {
    value
        .as_object()
        .ok_or_else(|| invalid(format!("{path}: expected an object")))
}

/// The one member a union object sets, after checking that every key is
/// one of `members` and exactly one is set.
fn union_member<'a>(
    fields: &'a Map<String, Value>,
    members: &[&str],
    path: &str,
    what: &str,
) -> Result<(&'a str, &'a Value), AwsError> {
    let mut set = None;
    let mut count = 0;
    for (key, value) in fields {
        if !members.contains(&key.as_str()) {
            let hint = match key.as_str() {
                "type" => " (Converse blocks are keyed by their kind, e.g. {\"text\":\"...\"}, not {\"type\":...})",
                "image_url" | "source" => " (images are {\"image\":{\"format\",\"source\":{\"bytes\"}}})",
                "tool_use" | "tool_result" => " (Converse spells them toolUse and toolResult)",
                _ => "",
            };
            return Err(invalid(format!(
                "{path}: unknown member '{key}' of {what} (expected exactly one of: {}){hint}",
                members.join(", ")
            )));
        }
        if !value.is_null() {
            count += 1;
            set = Some((key.as_str(), value));
        }
    }
    match set {
        Some(member) if count == 1 => Ok(member),
        _ => Err(invalid(format!(
            "{path}: {what} must set exactly one of {}, got {count}",
            members.join(", ")
        ))),
    }
}

/// Rejects keys of `fields` not in `known`.
fn no_extra_keys(fields: &Map<String, Value>, known: &[&str], path: &str) -> Result<(), AwsError> {
    match fields.keys().find(|k| !known.contains(&k.as_str())) {
        None => Ok(()),
        Some(key) => Err(invalid(format!(
            "{path}: extraneous key [{key}] is not permitted (expected: {})",
            known.join(", ")
        ))),
    }
}

fn check_base64(value: &Value, path: &str) -> Result<(), AwsError> {
    use base64::Engine as _;
    let text = value
        .as_str()
        .ok_or_else(|| invalid(format!("{path}: expected base64-encoded bytes as a string")))?;
    match base64::engine::general_purpose::STANDARD.decode(text) {
        Ok(bytes) if !bytes.is_empty() => Ok(()),
        Ok(_) => Err(invalid(format!("{path}: the bytes are empty"))),
        Err(err) => Err(invalid(format!("{path}: invalid base64: {err}"))),
    }
}

/// `source` of an image or document: `bytes` (base64) or an `s3Location`,
/// and for documents also `text` or `content`.
fn check_source(value: Option<&Value>, path: &str, document: bool) -> Result<(), AwsError> {
    let path = format!("{path}.source");
    let Some(value) = value else {
        return Err(invalid(format!("{path}: Member must not be null")));
    };
    let members: &[&str] = if document {
        &["bytes", "s3Location", "text", "content"]
    } else {
        &["bytes", "s3Location"]
    };
    match union_member(object(value, &path)?, members, &path, "a source")? {
        ("bytes", bytes) => check_base64(bytes, &format!("{path}.bytes")),
        ("s3Location", location) => {
            let uri = required_str(
                object(location, &path)?,
                "uri",
                &format!("{path}.s3Location"),
            )?;
            if uri.starts_with("s3://") {
                Ok(())
            } else {
                Err(invalid(format!(
                    "{path}.s3Location.uri: expected an s3:// URI"
                )))
            }
        }
        ("text", text) if text.is_string() => Ok(()),
        ("content", content) if content.is_array() => Ok(()),
        (member, _) => Err(invalid(format!("{path}.{member}: wrong type"))),
    }
}

fn check_format(fields: &Map<String, Value>, path: &str, formats: &[&str]) -> Result<(), AwsError> {
    let format = required_str(fields, "format", path)?;
    if formats.contains(&format) {
        Ok(())
    } else {
        Err(invalid(format!(
            "1 validation error detected: Value '{format}' at '{path}.format' failed to satisfy constraint: Member must satisfy enum value set: [{}]",
            formats.join(", ")
        )))
    }
}

fn check_image(value: &Value, path: &str) -> Result<(), AwsError> {
    let fields = object(value, path)?;
    no_extra_keys(fields, &["format", "source"], path)?;
    check_format(fields, path, &IMAGE_FORMATS)?;
    check_source(get(fields, "source"), path, false)
}

fn check_document(value: &Value, path: &str) -> Result<(), AwsError> {
    let fields = object(value, path)?;
    no_extra_keys(
        fields,
        &["format", "name", "source", "context", "citations"],
        path,
    )?;
    check_format(fields, path, &DOCUMENT_FORMATS)?;
    if required_str(fields, "name", path)?.trim().is_empty() {
        return Err(invalid(format!("{path}.name: must not be empty")));
    }
    check_source(get(fields, "source"), path, true)
}

/// What the checks learn about the conversation.
#[derive(Default)]
struct Seen {
    /// Whether any `toolUse` or `toolResult` block appears.
    tool_blocks: bool,
}

/// Checks one content block of a message with `role`.
fn check_block(block: &Value, path: &str, role: &str, seen: &mut Seen) -> Result<(), AwsError> {
    let fields = object(block, path)?;
    let (member, value) = union_member(fields, &BLOCK_MEMBERS, path, "a ContentBlock")?;
    let inner = format!("{path}.{member}");
    match member {
        "text" => {
            value
                .as_str()
                .ok_or_else(|| invalid(format!("{inner}: expected a string")))?;
        }
        "image" => check_image(value, &inner)?,
        "document" => check_document(value, &inner)?,
        "toolUse" => {
            if role != "assistant" {
                return Err(invalid(format!(
                    "{inner}: toolUse blocks belong in assistant messages"
                )));
            }
            seen.tool_blocks = true;
            let fields = object(value, &inner)?;
            no_extra_keys(fields, &["toolUseId", "name", "input"], &inner)?;
            required_str(fields, "toolUseId", &inner)?;
            required_str(fields, "name", &inner)?;
            required(fields, "input", &inner)?;
        }
        "toolResult" => {
            if role != "user" {
                return Err(invalid(format!(
                    "{inner}: toolResult blocks belong in user messages"
                )));
            }
            seen.tool_blocks = true;
            check_tool_result(value, &inner)?;
        }
        "reasoningContent" => {
            if role != "assistant" {
                return Err(invalid(format!(
                    "{inner}: reasoningContent blocks belong in assistant messages"
                )));
            }
            let fields = object(value, &inner)?;
            match union_member(
                fields,
                &["reasoningText", "redactedContent"],
                &inner,
                "a ReasoningContentBlock",
            )? {
                ("reasoningText", text) => {
                    let path = format!("{inner}.reasoningText");
                    let fields = object(text, &path)?;
                    no_extra_keys(fields, &["text", "signature"], &path)?;
                    required_str(fields, "text", &path)?;
                }
                (_, redacted) => check_base64(redacted, &format!("{inner}.redactedContent"))?,
            }
        }
        _ => check_cache_point(value, &inner)?,
    }
    Ok(())
}

fn check_cache_point(value: &Value, path: &str) -> Result<(), AwsError> {
    let fields = object(value, path)?;
    if required_str(fields, "type", path)? == "default" {
        Ok(())
    } else {
        Err(invalid(format!("{path}.type: must be 'default'")))
    }
}

fn check_tool_result(value: &Value, path: &str) -> Result<(), AwsError> {
    let fields = object(value, path)?;
    no_extra_keys(fields, &["toolUseId", "content", "status"], path)?;
    required_str(fields, "toolUseId", path)?;
    let content = required(fields, "content", path)?
        .as_array()
        .ok_or_else(|| invalid(format!("{path}.content: expected a list of blocks")))?;
    for (i, block) in content.iter().enumerate() {
        let path = format!("{path}.content.{i}");
        let fields = object(block, &path)?;
        match union_member(
            fields,
            &TOOL_RESULT_MEMBERS,
            &path,
            "a ToolResultContentBlock",
        )? {
            ("text", text) if !text.is_string() => {
                return Err(invalid(format!("{path}.text: expected a string")))
            }
            ("image", image) => check_image(image, &format!("{path}.image"))?,
            ("document", doc) => check_document(doc, &format!("{path}.document"))?,
            _ => {}
        }
    }
    match get(fields, "status") {
        None => Ok(()),
        Some(Value::String(s)) if s == "success" || s == "error" => Ok(()),
        Some(other) => Err(invalid(format!(
            "{path}.status: must be 'success' or 'error', got {other}"
        ))),
    }
}

/// Checks `messages` and returns them.
fn check_messages<'a>(
    fields: &'a Map<String, Value>,
    seen: &mut Seen,
) -> Result<&'a [Value], AwsError> {
    let messages = match get(fields, "messages") {
        None => {
            return Err(invalid(
                "1 validation error detected: Value null at 'messages' failed to satisfy constraint: Member must not be null",
            ))
        }
        Some(Value::Array(list)) => list.as_slice(),
        Some(_) => return Err(invalid("messages: expected a list of messages")),
    };
    if messages.is_empty() {
        return Err(invalid(
            "A conversation must start with a user message. Try again with a conversation that starts with a user message.",
        ));
    }
    let mut previous: Option<&str> = None;
    for (i, message) in messages.iter().enumerate() {
        let path = format!("messages.{i}");
        let fields = object(message, &path)?;
        no_extra_keys(fields, &["role", "content"], &path)?;
        let role = required_str(fields, "role", &path)?;
        if role != "user" && role != "assistant" {
            let hint = match role {
                "system" | "developer" => " (system prompts go in the top-level 'system' list)",
                "tool" => " (tool results are toolResult blocks in a user message)",
                _ => "",
            };
            return Err(invalid(format!(
                "1 validation error detected: Value '{role}' at '{path}.role' failed to satisfy constraint: Member must satisfy enum value set: [user, assistant]{hint}"
            )));
        }
        match previous {
            None if role != "user" => {
                return Err(invalid(
                    "A conversation must start with a user message. Try again with a conversation that starts with a user message.",
                ))
            }
            Some(prev) if prev == role => {
                return Err(invalid(
                    "A conversation must alternate between user and assistant roles. Make sure the conversation alternates between user and assistant roles and try again.",
                ))
            }
            _ => {}
        }
        previous = Some(role);
        let content = match required(fields, "content", &path)? {
            Value::Array(blocks) => blocks,
            Value::String(_) => {
                return Err(invalid(format!(
                    "{path}.content: expected a list of content blocks such as [{{\"text\":\"...\"}}], got a string"
                )))
            }
            _ => return Err(invalid(format!("{path}.content: expected a list of content blocks"))),
        };
        if content.is_empty() {
            return Err(invalid(format!(
                "The content field in the Message object at {path} is empty. Add a ContentBlock object to the content field and try again."
            )));
        }
        for (j, block) in content.iter().enumerate() {
            check_block(block, &format!("{path}.content.{j}"), role, seen)?;
        }
    }
    Ok(messages)
}

/// The text of `system` (its `text` blocks joined by a space).
fn check_system(fields: &Map<String, Value>) -> Result<Option<String>, AwsError> {
    let blocks = match get(fields, "system") {
        None => return Ok(None),
        Some(Value::Array(blocks)) => blocks,
        Some(Value::String(_)) => {
            return Err(invalid(
                "system: expected a list of blocks such as [{\"text\":\"...\"}], got a string",
            ))
        }
        Some(_) => return Err(invalid("system: expected a list of blocks")),
    };
    let mut text = String::new();
    for (i, block) in blocks.iter().enumerate() {
        let path = format!("system.{i}");
        match union_member(
            object(block, &path)?,
            &SYSTEM_MEMBERS,
            &path,
            "a SystemContentBlock",
        )? {
            ("text", Value::String(s)) => {
                if !text.is_empty() {
                    text.push(' ');
                }
                text.push_str(s);
            }
            ("text", _) => return Err(invalid(format!("{path}.text: expected a string"))),
            ("cachePoint", value) => check_cache_point(value, &format!("{path}.cachePoint"))?,
            _ => {}
        }
    }
    Ok(Some(text))
}

/// `inferenceConfig`: `maxTokens` and `stopSequences` (the rest is only
/// checked).
fn check_inference_config(
    fields: &Map<String, Value>,
) -> Result<(Option<u64>, Vec<&str>), AwsError> {
    let Some(config) = get(fields, "inferenceConfig") else {
        return Ok((None, Vec::new()));
    };
    let config = object(config, "inferenceConfig")?;
    for key in config.keys() {
        let hint = match key.as_str() {
            "maxTokens" | "temperature" | "topP" | "stopSequences" => continue,
            "topK" | "top_k" => " (topK is not an inferenceConfig member; models that take it read it from additionalModelRequestFields)",
            "max_tokens" => " (use maxTokens)",
            "top_p" => " (use topP)",
            "stop_sequences" | "stop" => " (use stopSequences)",
            _ => "",
        };
        return Err(invalid(format!(
            "inferenceConfig: extraneous key [{key}] is not permitted (expected: maxTokens, temperature, topP, stopSequences){hint}"
        )));
    }
    let max_tokens = match get(config, "maxTokens") {
        None => None,
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => Some(n),
            _ => {
                return Err(invalid(format!(
                    "1 validation error detected: Value '{v}' at 'inferenceConfig.maxTokens' failed to satisfy constraint: Member must have value greater than or equal to 1"
                )))
            }
        },
    };
    for key in ["temperature", "topP"] {
        if let Some(v) = get(config, key) {
            if !v.as_f64().is_some_and(|x| (0.0..=1.0).contains(&x)) {
                return Err(invalid(format!(
                    "1 validation error detected: Value '{v}' at 'inferenceConfig.{key}' failed to satisfy constraint: Member must be a number between 0 and 1"
                )));
            }
        }
    }
    let stop = match get(config, "stopSequences") {
        None => Vec::new(),
        Some(Value::Array(list)) => list
            .iter()
            .enumerate()
            .map(|(i, s)| match s.as_str() {
                Some(s) if !s.is_empty() => Ok(s),
                _ => Err(invalid(format!(
                    "inferenceConfig.stopSequences.{i}: expected a non-empty string"
                ))),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(invalid(
                "inferenceConfig.stopSequences: expected a list of strings",
            ))
        }
    };
    Ok((max_tokens, stop))
}

fn valid_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `toolConfig`: the tool to call (named by `toolChoice.tool`, else the
/// first), or `None` without a `toolConfig`.
fn check_tool_config(fields: &Map<String, Value>) -> Result<Option<&str>, AwsError> {
    let Some(config) = get(fields, "toolConfig") else {
        return Ok(None);
    };
    let config = object(config, "toolConfig")?;
    no_extra_keys(config, &["tools", "toolChoice"], "toolConfig")?;
    let tools = match required(config, "tools", "toolConfig")? {
        Value::Array(tools) if !tools.is_empty() => tools,
        Value::Array(_) => {
            return Err(invalid(
                "1 validation error detected: Value '[]' at 'toolConfig.tools' failed to satisfy constraint: Member must have length greater than or equal to 1",
            ))
        }
        _ => return Err(invalid("toolConfig.tools: expected a list of tools")),
    };
    let mut names = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let path = format!("toolConfig.tools.{i}");
        let fields = object(tool, &path)?;
        if fields.contains_key("function") || fields.contains_key("input_schema") {
            return Err(invalid(format!(
                "{path}: expected {{\"toolSpec\":{{\"name\",\"description\",\"inputSchema\":{{\"json\":{{...}}}}}}}} (this looks like another API's tool shape)"
            )));
        }
        match union_member(fields, &["toolSpec", "cachePoint"], &path, "a Tool")? {
            ("toolSpec", spec) => {
                let path = format!("{path}.toolSpec");
                let spec = object(spec, &path)?;
                no_extra_keys(spec, &["name", "description", "inputSchema"], &path)?;
                let name = required_str(spec, "name", &path)?;
                if !valid_tool_name(name) {
                    return Err(invalid(format!(
                        "1 validation error detected: Value '{name}' at '{path}.name' failed to satisfy constraint: Member must satisfy regular expression pattern: [a-zA-Z0-9_-]+ (1 to 64 characters)"
                    )));
                }
                if let Some(d) = get(spec, "description") {
                    if !d.is_string() {
                        return Err(invalid(format!("{path}.description: expected a string")));
                    }
                }
                let schema_path = format!("{path}.inputSchema");
                let schema = object(required(spec, "inputSchema", &path)?, &schema_path)?;
                match union_member(schema, &["json"], &schema_path, "a ToolInputSchema")? {
                    (_, Value::Object(_)) => {}
                    _ => {
                        return Err(invalid(format!(
                            "{schema_path}.json: expected a JSON schema object"
                        )))
                    }
                }
                names.push(name);
            }
            (_, value) => check_cache_point(value, &format!("{path}.cachePoint"))?,
        }
    }
    let Some(&first) = names.first() else {
        return Err(invalid("toolConfig.tools: no toolSpec given"));
    };
    let Some(choice) = get(config, "toolChoice") else {
        return Ok(Some(first));
    };
    let Value::Object(choice) = choice else {
        return Err(invalid(format!(
            "toolConfig.toolChoice: expected {{\"auto\":{{}}}}, {{\"any\":{{}}}} or {{\"tool\":{{\"name\":...}}}}, got {choice}"
        )));
    };
    match union_member(
        choice,
        &["auto", "any", "tool"],
        "toolConfig.toolChoice",
        "a ToolChoice",
    )? {
        ("tool", tool) => {
            let path = "toolConfig.toolChoice.tool";
            let name = required_str(object(tool, path)?, "name", path)?;
            match names.iter().find(|n| **n == name) {
                Some(&n) => Ok(Some(n)),
                None => Err(invalid(format!(
                    "{path}.name: tool '{name}' is not in toolConfig.tools"
                ))),
            }
        }
        (_, value) if value.is_object() => Ok(Some(first)),
        (member, _) => Err(invalid(format!(
            "toolConfig.toolChoice.{member}: expected an object ({{}})"
        ))),
    }
}

/// The request, checked and reduced to what the reply depends on.
struct Request<'a> {
    messages: &'a [Value],
    system: Option<String>,
    max_tokens: Option<u64>,
    stop_sequences: Vec<&'a str>,
    tool: Option<&'a str>,
}

impl<'a> Request<'a> {
    fn from_fields(fields: &'a Map<String, Value>) -> Result<Self, AwsError> {
        for key in fields.keys() {
            if FIELDS.contains(&key.as_str()) {
                continue;
            }
            let hint = FOREIGN_FIELDS
                .iter()
                .find(|(name, _)| name == key)
                .map_or(String::new(), |(_, hint)| format!(" ({hint})"));
            return Err(invalid(format!(
                "Malformed input request: extraneous key [{key}] is not permitted{hint}"
            )));
        }
        let mut seen = Seen::default();
        let messages = check_messages(fields, &mut seen)?;
        let system = check_system(fields)?;
        let (max_tokens, stop_sequences) = check_inference_config(fields)?;
        let tool = check_tool_config(fields)?;
        if seen.tool_blocks && tool.is_none() {
            return Err(invalid(
                "The toolConfig field must be defined when using toolUse and toolResult content blocks.",
            ));
        }
        if let Some(v) = get(fields, "additionalModelRequestFields") {
            object(v, "additionalModelRequestFields")?;
        }
        Ok(Request {
            messages,
            system,
            max_tokens,
            stop_sequences,
            tool,
        })
    }
}

/// Calls `f` with every input text of `message`: text blocks, and the text
/// (or JSON) of tool results.
fn for_each_text(message: &Value, f: &mut impl FnMut(&str)) {
    let Some(blocks) = message.get("content").and_then(Value::as_array) else {
        return;
    };
    for block in blocks {
        if let Some(text) = block.get("text").and_then(Value::as_str) {
            f(text);
        } else if let Some(result) = block.get("toolResult") {
            for_each_result_text(result, f);
        }
    }
}

/// The texts of a tool result: its text blocks and its JSON blocks
/// serialized.
fn for_each_result_text(result: &Value, f: &mut impl FnMut(&str)) {
    let Some(content) = result.get("content").and_then(Value::as_array) else {
        return;
    };
    for block in content {
        if let Some(text) = block.get("text").and_then(Value::as_str) {
            f(text);
        } else if let Some(json) = block.get("json") {
            f(&json.to_string());
        }
    }
}

fn join_texts(parts: &mut String, text: &str) {
    if !parts.is_empty() {
        parts.push(' ');
    }
    parts.push_str(text);
}

/// What the reply answers: the last user message's tool results (if it
/// has any) or its text.
fn subject(messages: &[Value]) -> (String, bool) {
    let last_user = messages
        .iter()
        .rev()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"));
    let blocks = last_user
        .and_then(|m| m.get("content"))
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    let results: Vec<&Value> = blocks.iter().filter_map(|b| b.get("toolResult")).collect();
    let mut out = String::new();
    if results.is_empty() {
        for text in blocks
            .iter()
            .filter_map(|b| b.get("text").and_then(Value::as_str))
        {
            join_texts(&mut out, text);
        }
        (out, false)
    } else {
        for result in results {
            for_each_result_text(result, &mut |t| join_texts(&mut out, t));
        }
        (out, true)
    }
}

/// What the assistant says.
enum Output {
    Text(String),
    /// A call of the named tool with input `{"mock":true,"n":1}`.
    Tool(String),
}

struct Answer {
    output: Output,
    stop_reason: &'static str,
    input_tokens: u64,
}

impl Answer {
    fn new(req: &Request<'_>, words: Option<u64>) -> Answer {
        let mut input_tokens = req.system.as_deref().map_or(0, text::word_count) as u64;
        for message in req.messages {
            for_each_text(message, &mut |t| input_tokens += text::word_count(t) as u64);
        }
        let (subject, after_tool) = subject(req.messages);
        if let (Some(name), false) = (req.tool, after_tool) {
            return Answer {
                output: Output::Tool(name.to_owned()),
                stop_reason: "tool_use",
                input_tokens,
            };
        }
        let mut reply = match words {
            Some(n) => text::numbered_words(usize::try_from(n).unwrap_or(usize::MAX)),
            None => format!("mock reply to: {subject}"),
        };
        let mut stop_reason = "end_turn";
        let hit = req
            .stop_sequences
            .iter()
            .filter_map(|s| reply.find(s))
            .min();
        if let Some(at) = hit {
            reply.truncate(at);
            stop_reason = "stop_sequence";
        }
        if let Some(limit) = req.max_tokens {
            let limit = usize::try_from(limit).unwrap_or(usize::MAX);
            if let Some(kept) = text::truncate_words(&reply, limit) {
                let len = kept.len();
                reply.truncate(len);
                stop_reason = "max_tokens";
            }
        }
        Answer {
            output: Output::Text(reply),
            stop_reason,
            input_tokens,
        }
    }

    fn output_tokens(&self) -> u64 {
        match &self.output {
            Output::Text(text) => text::word_count(text) as u64,
            // `{"mock":true,"n":1}` has no whitespace: one word.
            Output::Tool(_) => 1,
        }
    }

    fn usage(&self) -> Usage {
        let output_tokens = self.output_tokens();
        Usage {
            input_tokens: self.input_tokens,
            output_tokens,
            total_tokens: self.input_tokens + output_tokens,
        }
    }
}

#[derive(Serialize, Clone, Copy)]
#[serde(rename_all = "camelCase")]
struct Usage {
    input_tokens: u64,
    output_tokens: u64,
    total_tokens: u64,
}

#[derive(Serialize, Clone, Copy)]
#[serde(rename_all = "camelCase")]
struct Metrics {
    latency_ms: u64,
}

const METRICS: Metrics = Metrics { latency_ms: 1 };

#[derive(Serialize)]
struct ToolInput {
    mock: bool,
    n: u32,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
enum Block<'a> {
    Text(&'a str),
    ToolUse {
        #[serde(rename = "toolUseId")]
        tool_use_id: &'static str,
        name: &'a str,
        input: ToolInput,
    },
}

#[derive(Serialize)]
struct Message<'a> {
    role: &'static str,
    content: [Block<'a>; 1],
}

#[derive(Serialize)]
struct ConverseOutput<'a> {
    message: Message<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ConverseResponse<'a> {
    output: ConverseOutput<'a>,
    stop_reason: &'static str,
    usage: Usage,
    metrics: Metrics,
}

/// Answers Converse (`stream` false) or ConverseStream.
pub(super) fn handle(ctx: &Ctx<'_>, model: &str, body: &[u8], stream: bool) -> HandlerResult {
    if super::base_model(model).contains("embed") {
        return Err(invalid(
            "This action doesn't support the model that you provided. Try again with a supported text or chat model.",
        ));
    }
    let fields = super::parse_object(body)?;
    let req = Request::from_fields(&fields)?;
    let answer = Answer::new(&req, ctx.faults.words);
    if stream {
        let events = ConverseEvents {
            starts: match &answer.output {
                Output::Text(text) => text::piece_starts(text),
                Output::Tool(_) => Vec::new(),
            },
            answer,
            stage: Stage::Start,
            seq: 0,
            stream_error: ctx.failure.stream_error,
        };
        return Ok(super::eventstream_response(ctx, Box::new(events)));
    }
    let block = match &answer.output {
        Output::Text(text) => Block::Text(text),
        Output::Tool(name) => Block::ToolUse {
            tool_use_id: TOOL_USE_ID,
            name,
            input: ToolInput { mock: true, n: 1 },
        },
    };
    let resp = ConverseResponse {
        output: ConverseOutput {
            message: Message {
                role: "assistant",
                content: [block],
            },
        },
        stop_reason: answer.stop_reason,
        usage: answer.usage(),
        metrics: METRICS,
    };
    Ok(body::json(StatusCode::OK, &resp))
}

/// Where a [`ConverseEvents`] is.
#[derive(Clone, Copy)]
enum Stage {
    Start,
    /// `contentBlockStart`, only for tool use.
    BlockStart,
    /// The delta with this index.
    Delta(usize),
    BlockStop,
    MessageStop,
    Metadata,
    Error,
    Done,
}

#[derive(Serialize)]
struct MessageStart {
    role: &'static str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ToolStart<'a> {
    tool_use_id: &'static str,
    name: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
enum Start<'a> {
    ToolUse(ToolStart<'a>),
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct BlockStartEvent<'a> {
    content_block_index: usize,
    start: Start<'a>,
}

#[derive(Serialize)]
struct ToolDelta<'a> {
    input: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
enum Delta<'a> {
    Text(&'a str),
    ToolUse(ToolDelta<'a>),
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct DeltaEvent<'a> {
    content_block_index: usize,
    delta: Delta<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct BlockStopEvent {
    content_block_index: usize,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MessageStopEvent {
    stop_reason: &'static str,
}

#[derive(Serialize)]
struct MetadataEvent {
    usage: Usage,
    metrics: Metrics,
}

/// Lazily produces the frames of a ConverseStream answer: `messageStart`,
/// (`contentBlockStart` for a tool call), the deltas, `contentBlockStop`,
/// `messageStop` and `metadata`; or, under the stream-error fault, a
/// `throttlingException` right after the first delta.
struct ConverseEvents {
    answer: Answer,
    /// Byte offsets of the streamed pieces of a text answer.
    starts: Vec<usize>,
    stage: Stage,
    /// Events sent so far, to vary the padding.
    seq: usize,
    stream_error: bool,
}

impl ConverseEvents {
    fn event<T: Serialize>(&mut self, event_type: &str, value: &T) -> Bytes {
        let payload = eventstream::padded_json(value, self.seq);
        self.seq += 1;
        eventstream::event(event_type, &payload)
    }

    fn deltas(&self) -> usize {
        match self.answer.output {
            Output::Text(_) => self.starts.len(),
            Output::Tool(_) => TOOL_INPUT_PIECES.len(),
        }
    }

    fn delta(&mut self, k: usize) -> Bytes {
        let delta = match &self.answer.output {
            Output::Text(text) => {
                let start = self.starts.get(k).copied().unwrap_or(text.len());
                let end = self.starts.get(k + 1).copied().unwrap_or(text.len());
                Delta::Text(text.get(start..end).unwrap_or(""))
            }
            Output::Tool(_) => Delta::ToolUse(ToolDelta {
                input: TOOL_INPUT_PIECES.get(k).copied().unwrap_or(""),
            }),
        };
        let payload = eventstream::padded_json(
            &DeltaEvent {
                content_block_index: 0,
                delta,
            },
            self.seq,
        );
        self.seq += 1;
        eventstream::event("contentBlockDelta", &payload)
    }

    fn throttled() -> Bytes {
        eventstream::exception(
            "throttlingException",
            "Too many requests, please wait before trying again.",
        )
    }
}

impl Iterator for ConverseEvents {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        let (frame, next) = match self.stage {
            Stage::Start => {
                let frame = self.event("messageStart", &MessageStart { role: "assistant" });
                let next = match self.answer.output {
                    Output::Tool(_) => Stage::BlockStart,
                    Output::Text(_) if self.deltas() > 0 => Stage::Delta(0),
                    Output::Text(_) => Stage::BlockStop,
                };
                (frame, next)
            }
            Stage::BlockStart => {
                let Output::Tool(name) = &self.answer.output else {
                    // Only tool answers reach this stage.
                    return None;
                };
                let name = name.clone();
                let event = BlockStartEvent {
                    content_block_index: 0,
                    start: Start::ToolUse(ToolStart {
                        tool_use_id: TOOL_USE_ID,
                        name: &name,
                    }),
                };
                (self.event("contentBlockStart", &event), Stage::Delta(0))
            }
            Stage::Delta(k) => {
                let frame = self.delta(k);
                let next = if self.stream_error {
                    Stage::Error
                } else if k + 1 < self.deltas() {
                    Stage::Delta(k + 1)
                } else {
                    Stage::BlockStop
                };
                (frame, next)
            }
            // A stream-error stream without any delta fails here instead.
            Stage::BlockStop if self.stream_error => (Self::throttled(), Stage::Done),
            Stage::BlockStop => {
                let event = BlockStopEvent {
                    content_block_index: 0,
                };
                (self.event("contentBlockStop", &event), Stage::MessageStop)
            }
            Stage::MessageStop => {
                let event = MessageStopEvent {
                    stop_reason: self.answer.stop_reason,
                };
                (self.event("messageStop", &event), Stage::Metadata)
            }
            Stage::Metadata => {
                let event = MetadataEvent {
                    usage: self.answer.usage(),
                    metrics: METRICS,
                };
                (self.event("metadata", &event), Stage::Done)
            }
            Stage::Error => (Self::throttled(), Stage::Done),
            Stage::Done => return None,
        };
        self.stage = next;
        Some(frame)
    }
}

#[cfg(test)]
mod tests {
    use super::super::eventstream::tests::decode;
    use super::*;
    use serde_json::json;

    fn request(body: &Value) -> Result<(Answer, bool), AwsError> {
        let Value::Object(fields) = body else {
            panic!("not an object")
        };
        let req = Request::from_fields(fields)?;
        Ok((Answer::new(&req, None), req.tool.is_some()))
    }

    fn reply(body: &Value) -> (String, &'static str) {
        let (answer, _) = request(body).unwrap_or_else(|e| panic!("{}", e.message));
        match answer.output {
            Output::Text(text) => (text, answer.stop_reason),
            Output::Tool(name) => (format!("tool {name}"), answer.stop_reason),
        }
    }

    fn rejected(body: &Value) -> String {
        match request(body) {
            Ok(_) => panic!("accepted: {body}"),
            Err(err) => {
                assert_eq!(err.status, StatusCode::BAD_REQUEST);
                assert_eq!(err.kind, "ValidationException");
                err.message
            }
        }
    }

    fn user(text: &str) -> Value {
        json!({"role": "user", "content": [{"text": text}]})
    }

    fn tools() -> Value {
        json!({"tools": [
            {"toolSpec": {"name": "get_weather", "inputSchema": {"json": {"type": "object"}}}},
            {"toolSpec": {"name": "search", "description": "s", "inputSchema": {"json": {}}}},
        ]})
    }

    #[test]
    fn replies_to_the_last_user_text() {
        let body = json!({
            "messages": [user("first"), {"role": "assistant", "content": [{"text": "ok"}]}, user("hello there")],
            "system": [{"text": "be brief"}],
        });
        assert_eq!(
            reply(&body),
            ("mock reply to: hello there".to_owned(), "end_turn")
        );
        let (answer, _) = request(&body).unwrap_or_else(|e| panic!("{}", e.message));
        // be brief + first + ok + hello there
        assert_eq!(answer.input_tokens, 6);
        assert_eq!(answer.output_tokens(), 5);
    }

    #[test]
    fn stops_and_limits() {
        let body = json!({
            "messages": [user("one two three")],
            "inferenceConfig": {"maxTokens": 3, "temperature": 0.5, "topP": 1},
        });
        assert_eq!(reply(&body), ("mock reply to:".to_owned(), "max_tokens"));
        let body = json!({
            "messages": [user("one two three")],
            "inferenceConfig": {"stopSequences": ["two", "to:"]},
        });
        assert_eq!(reply(&body), ("mock reply ".to_owned(), "stop_sequence"));
    }

    #[test]
    fn tools_are_called_until_a_result_comes_back() {
        let mut body = json!({"messages": [user("weather?")], "toolConfig": tools()});
        assert_eq!(reply(&body), ("tool get_weather".to_owned(), "tool_use"));
        body["toolConfig"]["toolChoice"] = json!({"tool": {"name": "search"}});
        assert_eq!(reply(&body), ("tool search".to_owned(), "tool_use"));
        body["toolConfig"]["toolChoice"] = json!({"any": {}});
        assert_eq!(reply(&body), ("tool get_weather".to_owned(), "tool_use"));

        body["messages"] = json!([
            user("weather?"),
            {"role": "assistant", "content": [{"toolUse": {"toolUseId": "t1", "name": "get_weather", "input": {}}}]},
            {"role": "user", "content": [{"toolResult": {"toolUseId": "t1", "content": [{"text": "sunny"}, {"json": {"c": 20}}]}}]},
        ]);
        assert_eq!(
            reply(&body),
            ("mock reply to: sunny {\"c\":20}".to_owned(), "end_turn")
        );
    }

    #[test]
    fn wrong_shapes_are_rejected() {
        let cases = [
            (json!({"messages": []}), "start with a user"),
            (
                json!({"messages": [{"role": "assistant", "content": [{"text": "x"}]}]}),
                "start with a user",
            ),
            (json!({"messages": [user("a"), user("b")]}), "alternate"),
            (
                json!({"messages": [{"role": "system", "content": [{"text": "x"}]}]}),
                "enum value set",
            ),
            (
                json!({"messages": [{"role": "user", "content": "hi"}]}),
                "got a string",
            ),
            (
                json!({"messages": [{"role": "user", "content": []}]}),
                "is empty",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]}),
                "unknown member 'type'",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"text": "x", "image": {}}]}]}),
                "exactly one",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"image": {"format": "png", "source": {"bytes": "not base64!"}}}]}]}),
                "base64",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"image": {"format": "bmp", "source": {"bytes": "AAAA"}}}]}]}),
                "enum value set",
            ),
            (
                json!({"messages": [user("x")], "model": "m"}),
                "extraneous key [model]",
            ),
            (
                json!({"messages": [user("x")], "max_tokens": 5}),
                "inferenceConfig.maxTokens",
            ),
            (
                json!({"messages": [user("x")], "tools": []}),
                "toolConfig.tools",
            ),
            (
                json!({"messages": [user("x")], "system": "be brief"}),
                "got a string",
            ),
            (
                json!({"messages": [user("x")], "inferenceConfig": {"maxTokens": 0}}),
                "greater than or equal to 1",
            ),
            (
                json!({"messages": [user("x")], "inferenceConfig": {"topK": 5}}),
                "additionalModelRequestFields",
            ),
            (
                json!({"messages": [user("x")], "inferenceConfig": {"temperature": 1.5}}),
                "between 0 and 1",
            ),
            (
                json!({"messages": [user("x")], "toolConfig": {"tools": [{"type": "function", "function": {"name": "f"}}]}}),
                "toolSpec",
            ),
            (
                json!({"messages": [user("x")], "toolConfig": {"tools": [{"toolSpec": {"name": "f", "inputSchema": {"type": "object"}}}]}}),
                "ToolInputSchema",
            ),
            (
                json!({"messages": [user("x")], "toolConfig": {"tools": [{"toolSpec": {"name": "f", "inputSchema": {"json": {}}}}], "toolChoice": {"tool": {"name": "g"}}}}),
                "not in toolConfig.tools",
            ),
            (
                json!({"messages": [user("x")], "toolConfig": {"tools": [{"toolSpec": {"name": "f", "inputSchema": {"json": {}}}}], "toolChoice": "auto"}}),
                "toolChoice",
            ),
            (
                json!({"messages": [user("x"), {"role": "assistant", "content": [{"toolUse": {"toolUseId": "t", "name": "f", "input": {}}}]}, user("y")]}),
                "toolConfig field must be defined",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"toolUse": {"toolUseId": "t", "name": "f", "input": {}}}]}]}),
                "assistant messages",
            ),
        ];
        for (body, expected) in cases {
            let message = rejected(&body);
            assert!(message.contains(expected), "{body}: {message}");
        }
    }

    #[test]
    fn accepts_rich_content() {
        let body = json!({
            "messages": [
                {"role": "user", "content": [
                    {"text": "look"},
                    {"image": {"format": "png", "source": {"bytes": "iVBORw0KGgo="}}},
                    {"document": {"format": "txt", "name": "notes", "source": {"bytes": "aGVsbG8="}}},
                    {"cachePoint": {"type": "default"}},
                ]},
                {"role": "assistant", "content": [
                    {"reasoningContent": {"reasoningText": {"text": "hmm", "signature": "sig"}}},
                    {"text": "seen"},
                ]},
                user("and now?"),
            ],
            "system": [{"text": "s"}, {"cachePoint": {"type": "default"}}],
            "additionalModelRequestFields": {"top_k": 5},
        });
        assert_eq!(reply(&body).0, "mock reply to: and now?");
    }

    fn stream_of(answer: Answer, stream_error: bool) -> Vec<(String, Value)> {
        let events = ConverseEvents {
            starts: match &answer.output {
                Output::Text(text) => text::piece_starts(text),
                Output::Tool(_) => Vec::new(),
            },
            answer,
            stage: Stage::Start,
            seq: 0,
            stream_error,
        };
        let bytes: Vec<u8> = events.flat_map(|b| b.to_vec()).collect();
        decode(&bytes)
            .into_iter()
            .map(|m| {
                let name = m
                    .header(":event-type")
                    .or(m.header(":exception-type"))
                    .unwrap_or("")
                    .to_owned();
                (name, serde_json::from_slice(&m.payload).unwrap())
            })
            .collect()
    }

    #[test]
    fn text_streams_in_pieces() {
        let body = json!({"messages": [user("hi you")]});
        let (answer, _) = request(&body).unwrap_or_else(|e| panic!("{}", e.message));
        let events = stream_of(answer, false);
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "messageStart",
                "contentBlockDelta",
                "contentBlockDelta",
                "contentBlockDelta",
                "contentBlockDelta",
                "contentBlockDelta",
                "contentBlockStop",
                "messageStop",
                "metadata"
            ]
        );
        let text: String = events
            .iter()
            .filter_map(|(_, v)| v["delta"]["text"].as_str())
            .collect();
        assert_eq!(text, "mock reply to: hi you");
        assert!(events.iter().all(|(_, v)| v["p"].is_string()));
        assert_eq!(events[7].1["stopReason"], "end_turn");
        assert_eq!(events[8].1["usage"]["totalTokens"], 7);
    }

    #[test]
    fn tool_calls_stream_their_input() {
        let body = json!({"messages": [user("weather?")], "toolConfig": tools()});
        let (answer, _) = request(&body).unwrap_or_else(|e| panic!("{}", e.message));
        let events = stream_of(answer, false);
        assert_eq!(events[1].0, "contentBlockStart");
        assert_eq!(
            events[1].1["start"]["toolUse"],
            json!({"toolUseId": TOOL_USE_ID, "name": "get_weather"})
        );
        let input: String = events
            .iter()
            .filter_map(|(_, v)| v["delta"]["toolUse"]["input"].as_str())
            .collect();
        assert_eq!(
            serde_json::from_str::<Value>(&input).unwrap(),
            json!({"mock": true, "n": 1})
        );
        assert_eq!(events[events.len() - 2].1["stopReason"], "tool_use");
    }

    #[test]
    fn stream_error_follows_the_first_delta() {
        let body = json!({"messages": [user("hi")]});
        let (answer, _) = request(&body).unwrap_or_else(|e| panic!("{}", e.message));
        let events = stream_of(answer, true);
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["messageStart", "contentBlockDelta", "throttlingException"]
        );
        assert!(events[2].1["message"].is_string());
    }
}
