//! `:generateContent` and `:streamGenerateContent` for the Gemini API and
//! Vertex AI: strict request checks, deterministic replies, function calls,
//! safety blocks and streaming.
//!
//! The reply is one text part, `"mock reply to: <last user text>"` (or
//! `w1 ... wn` under the `words` fault), cut before the earliest
//! `generationConfig.stopSequences` match (finishReason `STOP`) and then at
//! `maxOutputTokens` words (`MAX_TOKENS`). When the last turn carries
//! `functionResponse` parts, the text answered is their `response` objects as
//! JSON instead of the user text. Otherwise, with
//! `tools[].functionDeclarations` and a function-calling mode other than
//! `NONE`, the reply is a `functionCall` part (the first of
//! `allowedFunctionNames`, else the first declared function) with args
//! `{"mock":true,"n":1}`. A last user text containing the word `unsafe` gets
//! a candidate without content and finishReason `SAFETY`. There are
//! `candidateCount` identical candidates.
//!
//! Token counts are word counts: the prompt over the system instruction and
//! every part (function calls and responses count their JSON), the
//! candidates over every candidate's reply (a function call is one word).
//!
//! Streaming: with `?alt=sse`, one `data: <GenerateContentResponse>\r\n\r\n`
//! event per reply word; without it, Google's default framing, the same
//! responses as the elements of one JSON array (`[{...}`, `,\r\n{...}`,
//! ..., `]`). Every response carries `usageMetadata` so far; the last one has
//! the finishReason.

use bytes::Bytes;
use http::header::{HeaderValue, CACHE_CONTROL};
use http::StatusCode;
use serde::Serialize;
use serde_json::{Map, Value};

use super::{
    as_count, as_list, as_object, as_str, camel_case, check_known, field, parse_object, Api,
    ApiError, HandlerResult,
};
use crate::body::{self, MockBody};
use crate::query;
use crate::server::Ctx;
use crate::sse::SseBody;
use crate::text;

/// Fields of `GenerateContentRequest` (lowerCamelCase; snake_case accepted).
/// `model` is deliberately absent: the URL names the model.
const REQUEST_FIELDS: [&str; 7] = [
    "contents",
    "tools",
    "toolConfig",
    "safetySettings",
    "systemInstruction",
    "generationConfig",
    "cachedContent",
];
/// Vertex AI's request also takes `labels`.
const VERTEX_REQUEST_FIELDS: [&str; 1] = ["labels"];
const CONTENT_FIELDS: [&str; 2] = ["role", "parts"];
/// The `data` oneof of a `Part`: exactly one must be set.
const PART_DATA_FIELDS: [&str; 7] = [
    "text",
    "inlineData",
    "fileData",
    "functionCall",
    "functionResponse",
    "executableCode",
    "codeExecutionResult",
];
/// Fields a `Part` may carry next to its data.
const PART_META_FIELDS: [&str; 5] = [
    "thought",
    "thoughtSignature",
    "videoMetadata",
    "partMetadata",
    "mediaResolution",
];
const INLINE_DATA_FIELDS: [&str; 3] = ["mimeType", "data", "displayName"];
const FILE_DATA_FIELDS: [&str; 3] = ["mimeType", "fileUri", "displayName"];
const FUNCTION_CALL_FIELDS: [&str; 3] = ["id", "name", "args"];
const FUNCTION_RESPONSE_FIELDS: [&str; 6] = [
    "id",
    "name",
    "response",
    "parts",
    "willContinue",
    "scheduling",
];
const GENERATION_CONFIG_FIELDS: [&str; 22] = [
    "stopSequences",
    "responseMimeType",
    "responseSchema",
    "responseJsonSchema",
    "responseModalities",
    "candidateCount",
    "maxOutputTokens",
    "temperature",
    "topP",
    "topK",
    "seed",
    "presencePenalty",
    "frequencyPenalty",
    "responseLogprobs",
    "logprobs",
    "enableEnhancedCivicAnswers",
    "speechConfig",
    "thinkingConfig",
    "mediaResolution",
    "imageConfig",
    "audioTimestamp",
    "routingConfig",
];
/// Numeric sampling knobs of `generationConfig`.
const NUMBER_FIELDS: [&str; 6] = [
    "temperature",
    "topP",
    "topK",
    "seed",
    "presencePenalty",
    "frequencyPenalty",
];
const TOOL_FIELDS: [&str; 10] = [
    "functionDeclarations",
    "googleSearch",
    "googleSearchRetrieval",
    "codeExecution",
    "urlContext",
    "retrieval",
    "computerUse",
    "fileSearch",
    "googleMaps",
    "enterpriseWebSearch",
];
const DECLARATION_FIELDS: [&str; 7] = [
    "name",
    "description",
    "parameters",
    "parametersJsonSchema",
    "response",
    "responseJsonSchema",
    "behavior",
];
/// Fields of Google's `Schema` (a subset of OpenAPI 3.0).
const SCHEMA_FIELDS: [&str; 22] = [
    "type",
    "format",
    "title",
    "description",
    "nullable",
    "enum",
    "maxItems",
    "minItems",
    "properties",
    "required",
    "minProperties",
    "maxProperties",
    "minLength",
    "maxLength",
    "pattern",
    "example",
    "anyOf",
    "propertyOrdering",
    "default",
    "items",
    "minimum",
    "maximum",
];
/// `Schema` fields only Vertex AI knows.
const VERTEX_SCHEMA_FIELDS: [&str; 3] = ["additionalProperties", "ref", "defs"];
const SCHEMA_TYPES: [&str; 8] = [
    "TYPE_UNSPECIFIED",
    "STRING",
    "NUMBER",
    "INTEGER",
    "BOOLEAN",
    "ARRAY",
    "OBJECT",
    "NULL",
];
const TOOL_CONFIG_FIELDS: [&str; 3] = [
    "functionCallingConfig",
    "retrievalConfig",
    "includeServerSideToolInvocations",
];
const CALLING_CONFIG_FIELDS: [&str; 2] = ["mode", "allowedFunctionNames"];
const CALLING_MODES: [&str; 5] = ["MODE_UNSPECIFIED", "AUTO", "ANY", "NONE", "VALIDATED"];
const SAFETY_SETTING_FIELDS: [&str; 3] = ["category", "threshold", "method"];
/// Google's limits.
const MAX_STOP_SEQUENCES: usize = 5;
const MAX_CANDIDATES: u64 = 8;
const MAX_FUNCTION_NAME: usize = 64;

/// The request, checked and reduced to what the reply depends on.
struct Request<'a> {
    contents: &'a [Value],
    /// Parts of the system instruction.
    system: &'a [Value],
    stop_sequences: Vec<&'a str>,
    max_output_tokens: Option<u64>,
    candidate_count: u64,
    /// The function to call, when the reply may be a call.
    function: Option<&'a str>,
}

/// Answers `:generateContent` (`stream == false`) or
/// `:streamGenerateContent` for `model`.
pub(super) fn handle(
    ctx: &Ctx<'_>,
    body: &[u8],
    model: &str,
    api: Api,
    stream: bool,
) -> HandlerResult {
    let fields = parse_object(body)?;
    let req = Request::from_fields(&fields, api)?;
    let reply = Reply::new(&req, ctx.faults.words);
    let prompt_tokens = prompt_words(req.system, req.contents);
    let id = format!("mock-{}", ctx.shared.next_id());
    let traffic = traffic_type(ctx, api);

    if !stream {
        let reply_words = reply.word_count();
        let text = reply.text();
        let response = GenerateResponse {
            candidates: candidates(&reply, text, req.candidate_count, true),
            usage_metadata: Usage::new(prompt_tokens, reply_words * req.candidate_count)
                .traffic(traffic),
            model_version: model,
            response_id: &id,
        };
        return Ok(body::json(StatusCode::OK, &response));
    }

    let sse = query::param(ctx.uri, "alt").is_some_and(|alt| alt == "sse");
    let starts = match &reply {
        Reply::Text { text, .. } => text::piece_starts(text),
        _ => Vec::new(),
    };
    let steps = starts.len().max(1);
    let events = GenerateStream {
        array: !sse,
        id,
        model: model.to_owned(),
        reply_words: reply.word_count(),
        reply,
        starts,
        candidate_count: req.candidate_count,
        prompt_tokens,
        traffic,
        step: 0,
        steps,
    };
    let faults = ctx.faults.stream_faults(ctx.failure.disconnect_after);
    let content_type = if sse {
        "text/event-stream"
    } else {
        "application/json"
    };
    let body = MockBody::Sse(SseBody::new(Box::new(events), faults));
    let mut resp = body::response(StatusCode::OK, content_type, body);
    resp.headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(resp)
}

impl<'a> Request<'a> {
    fn from_fields(fields: &'a Map<String, Value>, api: Api) -> Result<Self, ApiError> {
        let mut known: Vec<&str> = REQUEST_FIELDS.to_vec();
        if api == Api::Vertex {
            known.extend(VERTEX_REQUEST_FIELDS);
        }
        check_known(fields, &known, "")?;
        let contents = check_contents(field(fields, "contents"))?;
        let system = match field(fields, "systemInstruction") {
            None => &[][..],
            Some(value) => check_content(value, "system_instruction", false)?,
        };
        let config = match field(fields, "generationConfig") {
            None => GenerationConfig::default(),
            Some(value) => GenerationConfig::check(value)?,
        };
        let declared = match field(fields, "tools") {
            None => Vec::new(),
            Some(value) => check_tools(value, api)?,
        };
        let function = match field(fields, "toolConfig") {
            None => declared.first().copied(),
            Some(value) => pick_function(value, &declared)?,
        };
        if let Some(value) = field(fields, "safetySettings") {
            check_safety_settings(value)?;
        }
        if let Some(value) = field(fields, "cachedContent") {
            as_str(value, "cached_content")?;
        }
        if let Some(value) = field(fields, "labels") {
            as_object(value, "labels")?;
        }
        Ok(Request {
            contents,
            system,
            stop_sequences: config.stop_sequences,
            max_output_tokens: config.max_output_tokens,
            candidate_count: config.candidate_count,
            function,
        })
    }
}

/// Checks `contents`: a non-empty list of turns.
fn check_contents(value: Option<&Value>) -> Result<&[Value], ApiError> {
    let contents = match value {
        None => &[][..],
        Some(value) => as_list(value, "contents")?,
    };
    if contents.is_empty() {
        return Err(ApiError::invalid(
            "* GenerateContentRequest.contents: contents is not specified",
        ));
    }
    for (i, content) in contents.iter().enumerate() {
        check_content(content, &format!("contents[{i}]"), true)?;
    }
    Ok(contents)
}

/// Checks one `Content` and returns its parts. The role of a conversation
/// turn (`turn`) must be `user` or `model` when given; the system
/// instruction's role is ignored.
fn check_content<'a>(value: &'a Value, at: &str, turn: bool) -> Result<&'a [Value], ApiError> {
    let fields = as_object(value, at)?;
    check_known(fields, &CONTENT_FIELDS, at)?;
    if let Some(role) = field(fields, "role") {
        let role = as_str(role, &format!("{at}.role"))?;
        if turn && role != "user" && role != "model" {
            return Err(ApiError::invalid(format!(
                "Please use a valid role: user, model. ({at}.role is '{role}')"
            )));
        }
    }
    let parts = match field(fields, "parts") {
        None => &[][..],
        Some(value) => as_list(value, &format!("{at}.parts"))?,
    };
    if parts.is_empty() {
        return Err(ApiError::invalid(format!(
            "* GenerateContentRequest.{at}.parts: must not be empty"
        )));
    }
    for (j, part) in parts.iter().enumerate() {
        check_part(part, &format!("{at}.parts[{j}]"))?;
    }
    Ok(parts)
}

/// Checks one `Part`: known fields and exactly one kind of data.
fn check_part(value: &Value, at: &str) -> Result<(), ApiError> {
    let fields = as_object(value, at)?;
    for key in fields.keys() {
        let name = camel_case(key);
        if !PART_DATA_FIELDS.contains(&name.as_ref()) && !PART_META_FIELDS.contains(&name.as_ref())
        {
            return Err(ApiError::unknown_field(key, at));
        }
    }
    let mut data = PART_DATA_FIELDS
        .iter()
        .filter_map(|&kind| field(fields, kind).map(|value| (kind, value)));
    let Some((kind, value)) = data.next() else {
        return Err(ApiError::invalid(format!(
            "* GenerateContentRequest.{at}.data: required oneof field 'data' must have one \
             initialized field (one of text, inlineData, fileData, functionCall, functionResponse)"
        )));
    };
    if let Some((other, _)) = data.next() {
        return Err(ApiError::invalid(format!(
            "Invalid JSON payload received. Oneof field 'data' is already set at '{at}': \
             a part holds one of '{kind}' and '{other}', not both"
        )));
    }
    let at = format!("{at}.{}", super::snake_case(kind));
    match kind {
        "text" => {
            as_str(value, &at)?;
        }
        "inlineData" => {
            let fields = as_object(value, &at)?;
            check_known(fields, &INLINE_DATA_FIELDS, &at)?;
            require_str(fields, "mimeType", &at)?;
            require_str(fields, "data", &at)?;
        }
        "fileData" => {
            let fields = as_object(value, &at)?;
            check_known(fields, &FILE_DATA_FIELDS, &at)?;
            require_str(fields, "fileUri", &at)?;
        }
        "functionCall" => {
            let fields = as_object(value, &at)?;
            check_known(fields, &FUNCTION_CALL_FIELDS, &at)?;
            require_str(fields, "name", &at)?;
            if let Some(args) = field(fields, "args") {
                as_object(args, &format!("{at}.args"))?;
            }
        }
        "functionResponse" => {
            let fields = as_object(value, &at)?;
            check_known(fields, &FUNCTION_RESPONSE_FIELDS, &at)?;
            require_str(fields, "name", &at)?;
            match field(fields, "response") {
                None => {
                    return Err(ApiError::invalid(format!(
                        "* GenerateContentRequest.{at}.response: required field is not set"
                    )))
                }
                Some(response) => {
                    as_object(response, &format!("{at}.response"))?;
                }
            }
        }
        _ => {
            as_object(value, &at)?;
        }
    }
    Ok(())
}

/// The string at `fields[name]`, which must be present.
fn require_str<'a>(
    fields: &'a Map<String, Value>,
    name: &str,
    at: &str,
) -> Result<&'a str, ApiError> {
    let at = format!("{at}.{}", super::snake_case(name));
    match field(fields, name) {
        None => Err(ApiError::invalid(format!(
            "* GenerateContentRequest.{at}: required field is not set"
        ))),
        Some(value) => as_str(value, &at),
    }
}

/// What the reply depends on in `generationConfig`.
struct GenerationConfig<'a> {
    stop_sequences: Vec<&'a str>,
    max_output_tokens: Option<u64>,
    candidate_count: u64,
}

impl Default for GenerationConfig<'_> {
    fn default() -> Self {
        GenerationConfig {
            stop_sequences: Vec::new(),
            max_output_tokens: None,
            candidate_count: 1,
        }
    }
}

impl<'a> GenerationConfig<'a> {
    fn check(value: &'a Value) -> Result<Self, ApiError> {
        const AT: &str = "generation_config";
        let fields = as_object(value, AT)?;
        check_known(fields, &GENERATION_CONFIG_FIELDS, AT)?;
        for name in NUMBER_FIELDS {
            if let Some(value) = field(fields, name) {
                if !value.is_number() {
                    return Err(ApiError::invalid_value(
                        &format!("{AT}.{}", super::snake_case(name)),
                        format!("expected a number, got {value}"),
                    ));
                }
            }
        }
        let mut config = GenerationConfig::default();
        if let Some(value) = field(fields, "stopSequences") {
            let at = format!("{AT}.stop_sequences");
            let list = as_list(value, &at)?;
            if list.len() > MAX_STOP_SEQUENCES {
                return Err(ApiError::invalid(format!(
                    "* GenerateContentRequest.{at}: at most {MAX_STOP_SEQUENCES} stop sequences \
                     are allowed, got {}",
                    list.len()
                )));
            }
            config.stop_sequences = list
                .iter()
                .enumerate()
                .map(|(i, s)| as_str(s, &format!("{at}[{i}]")))
                .collect::<Result<_, _>>()?;
        }
        if let Some(value) = field(fields, "maxOutputTokens") {
            let at = format!("{AT}.max_output_tokens");
            let n = as_count(value, &at)?;
            if n == 0 {
                return Err(ApiError::invalid_value(&at, "must be positive"));
            }
            config.max_output_tokens = Some(n);
        }
        if let Some(value) = field(fields, "candidateCount") {
            let at = format!("{AT}.candidate_count");
            let n = as_count(value, &at)?;
            if n == 0 || n > MAX_CANDIDATES {
                return Err(ApiError::invalid(format!(
                    "* GenerateContentRequest.{at}: must be between 1 and {MAX_CANDIDATES}, got {n}"
                )));
            }
            config.candidate_count = n;
        }
        Ok(config)
    }
}

/// Checks `tools` and returns the declared function names in order.
fn check_tools(value: &Value, api: Api) -> Result<Vec<&str>, ApiError> {
    let mut names = Vec::new();
    for (i, tool) in as_list(value, "tools")?.iter().enumerate() {
        let at = format!("tools[{i}]");
        let fields = as_object(tool, &at)?;
        check_known(fields, &TOOL_FIELDS, &at)?;
        let Some(declarations) = field(fields, "functionDeclarations") else {
            continue;
        };
        let at = format!("{at}.function_declarations");
        for (j, declaration) in as_list(declarations, &at)?.iter().enumerate() {
            let at = format!("{at}[{j}]");
            let fields = as_object(declaration, &at)?;
            check_known(fields, &DECLARATION_FIELDS, &at)?;
            let name = require_str(fields, "name", &at)?;
            check_function_name(name, &at)?;
            let parameters = field(fields, "parameters");
            if let Some(schema) = parameters {
                check_schema(schema, &format!("{at}.parameters"), api)?;
            }
            if parameters.is_some() && field(fields, "parametersJsonSchema").is_some() {
                return Err(ApiError::invalid(format!(
                    "* GenerateContentRequest.{at}: set parameters or parameters_json_schema, not both"
                )));
            }
            names.push(name);
        }
    }
    Ok(names)
}

/// Google's rule for function names: a letter or `_` first, then letters,
/// digits, `_ . : -`, at most 64 characters.
fn check_function_name(name: &str, at: &str) -> Result<(), ApiError> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-'));
    if first_ok && rest_ok && name.len() <= MAX_FUNCTION_NAME {
        return Ok(());
    }
    Err(ApiError::invalid(format!(
        "* GenerateContentRequest.{at}.name: invalid function name '{name}': it must start with a \
         letter or an underscore, hold only letters, digits, underscores, dots, colons and dashes, \
         and be at most {MAX_FUNCTION_NAME} characters long"
    )))
}

/// Checks a `Schema`: known fields only (JSON Schema extras such as
/// `$schema`, `additionalProperties` on the Gemini API, or `oneOf` are
/// refused), a single type name, string enums; recursively.
fn check_schema(value: &Value, at: &str, api: Api) -> Result<(), ApiError> {
    let fields = as_object(value, at)?;
    for key in fields.keys() {
        let name = camel_case(key);
        let known = SCHEMA_FIELDS.contains(&name.as_ref())
            || (api == Api::Vertex && VERTEX_SCHEMA_FIELDS.contains(&name.as_ref()));
        if !known {
            return Err(ApiError::unknown_field(key, at));
        }
    }
    if let Some(kind) = field(fields, "type") {
        let known = kind
            .as_str()
            .is_some_and(|k| SCHEMA_TYPES.iter().any(|t| t.eq_ignore_ascii_case(k)));
        if !known {
            return Err(ApiError::invalid_value(
                &format!("{at}.type"),
                format!(
                    "{kind} is not one of STRING, NUMBER, INTEGER, BOOLEAN, ARRAY, OBJECT, NULL"
                ),
            ));
        }
    }
    if let Some(values) = field(fields, "enum") {
        let at = format!("{at}.enum");
        for (i, value) in as_list(values, &at)?.iter().enumerate() {
            as_str(value, &format!("{at}[{i}]"))?;
        }
    }
    if let Some(properties) = field(fields, "properties") {
        let at = format!("{at}.properties");
        for (name, schema) in as_object(properties, &at)? {
            check_schema(schema, &format!("{at}[{name}]"), api)?;
        }
    }
    if let Some(items) = field(fields, "items") {
        check_schema(items, &format!("{at}.items"), api)?;
    }
    if let Some(any_of) = field(fields, "anyOf") {
        let at = format!("{at}.any_of");
        for (i, schema) in as_list(any_of, &at)?.iter().enumerate() {
            check_schema(schema, &format!("{at}[{i}]"), api)?;
        }
    }
    Ok(())
}

/// Checks `toolConfig` and picks the function to call: none with mode
/// `NONE` or without declarations; else the first allowed name, else the
/// first declared function.
fn pick_function<'a>(value: &'a Value, declared: &[&'a str]) -> Result<Option<&'a str>, ApiError> {
    const AT: &str = "tool_config";
    let fields = as_object(value, AT)?;
    check_known(fields, &TOOL_CONFIG_FIELDS, AT)?;
    let Some(calling) = field(fields, "functionCallingConfig") else {
        return Ok(declared.first().copied());
    };
    let at = format!("{AT}.function_calling_config");
    let calling = as_object(calling, &at)?;
    check_known(calling, &CALLING_CONFIG_FIELDS, &at)?;
    let mode = match field(calling, "mode") {
        None => "MODE_UNSPECIFIED",
        Some(mode) => {
            let text = as_str(mode, &format!("{at}.mode"))?;
            CALLING_MODES
                .iter()
                .copied()
                .find(|m| m.eq_ignore_ascii_case(text))
                .ok_or_else(|| {
                    ApiError::invalid_value(
                        &format!("{at}.mode"),
                        format!("'{text}' is not one of AUTO, ANY, NONE, VALIDATED"),
                    )
                })?
        }
    };
    let mut allowed = Vec::new();
    if let Some(names) = field(calling, "allowedFunctionNames") {
        let list_at = format!("{at}.allowed_function_names");
        for (i, name) in as_list(names, &list_at)?.iter().enumerate() {
            let name = as_str(name, &format!("{list_at}[{i}]"))?;
            if !declared.contains(&name) {
                return Err(ApiError::invalid(format!(
                    "* GenerateContentRequest.{list_at}[{i}]: function '{name}' is not declared \
                     in tools[].function_declarations"
                )));
            }
            allowed.push(name);
        }
        if !allowed.is_empty() && mode != "ANY" && mode != "VALIDATED" {
            return Err(ApiError::invalid(format!(
                "* GenerateContentRequest.{list_at}: allowed_function_names may only be set when \
                 the mode is ANY or VALIDATED, not {mode}"
            )));
        }
    }
    if mode == "ANY" && declared.is_empty() {
        return Err(ApiError::invalid(format!(
            "* GenerateContentRequest.{at}.mode: mode ANY needs tools[].function_declarations"
        )));
    }
    if mode == "NONE" {
        return Ok(None);
    }
    Ok(allowed.first().or(declared.first()).copied())
}

/// Checks `safetySettings`: a list of `{category, threshold}`.
fn check_safety_settings(value: &Value) -> Result<(), ApiError> {
    for (i, setting) in as_list(value, "safety_settings")?.iter().enumerate() {
        let at = format!("safety_settings[{i}]");
        let fields = as_object(setting, &at)?;
        check_known(fields, &SAFETY_SETTING_FIELDS, &at)?;
        require_str(fields, "category", &at)?;
        require_str(fields, "threshold", &at)?;
    }
    Ok(())
}

/// Words of one part: its text, or the JSON of a function call or response.
fn part_words(part: &Value) -> u64 {
    let Some(fields) = part.as_object() else {
        return 0;
    };
    if let Some(Value::String(text)) = field(fields, "text") {
        return text::word_count(text) as u64;
    }
    let call = field(fields, "functionCall").or_else(|| field(fields, "functionResponse"));
    call.map_or(0, |value| text::word_count(&value.to_string()) as u64)
}

fn prompt_words(system: &[Value], contents: &[Value]) -> u64 {
    let turns = contents
        .iter()
        .filter_map(|c| c.get("parts").and_then(Value::as_array))
        .flatten();
    system.iter().chain(turns).map(part_words).sum()
}

/// The role of a turn; a turn without one is the user's.
fn role(content: &Value) -> &str {
    content
        .get("role")
        .and_then(Value::as_str)
        .unwrap_or("user")
}

fn parts(content: &Value) -> &[Value] {
    content
        .get("parts")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice)
}

/// The `response` objects of the last turn's `functionResponse` parts as
/// JSON, joined by a space; `None` when the last turn has none.
fn last_function_responses(contents: &[Value]) -> Option<String> {
    let last = contents.last().filter(|c| role(c) == "user")?;
    let responses: Vec<String> = parts(last)
        .iter()
        .filter_map(|p| {
            p.get("functionResponse")
                .or_else(|| p.get("function_response"))
        })
        .filter_map(|r| r.get("response"))
        .map(Value::to_string)
        .collect();
    (!responses.is_empty()).then(|| responses.join(" "))
}

/// Text parts of the last user turn, joined by a space.
fn last_user_text(contents: &[Value]) -> String {
    let Some(last) = contents.iter().rev().find(|c| role(c) == "user") else {
        return String::new();
    };
    let texts: Vec<&str> = parts(last)
        .iter()
        .filter_map(|p| p.get("text").and_then(Value::as_str))
        .collect();
    texts.join(" ")
}

/// Whether `text` has the word `unsafe` (any case) in it.
fn mentions_unsafe(text: &str) -> bool {
    text.split(|c: char| !c.is_alphanumeric())
        .any(|word| word.eq_ignore_ascii_case("unsafe"))
}

/// What every candidate says.
#[derive(Debug, PartialEq)]
enum Reply {
    Text {
        text: String,
        finish_reason: &'static str,
    },
    Call(String),
    Blocked,
}

impl Reply {
    fn new(req: &Request<'_>, words: Option<u64>) -> Reply {
        let user_text = last_user_text(req.contents);
        if mentions_unsafe(&user_text) {
            return Reply::Blocked;
        }
        let responses = last_function_responses(req.contents);
        if responses.is_none() {
            if let Some(name) = req.function {
                return Reply::Call(name.to_owned());
            }
        }
        let mut text = match words {
            Some(n) => text::numbered_words(usize::try_from(n).unwrap_or(usize::MAX)),
            None => format!(
                "mock reply to: {}",
                responses.as_deref().unwrap_or(&user_text)
            ),
        };
        let mut finish_reason = "STOP";
        // The earliest match wins, as it would while generating.
        let hit = req
            .stop_sequences
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| text.find(s))
            .min();
        if let Some(at) = hit {
            text.truncate(at);
        }
        if let Some(limit) = req.max_output_tokens {
            let limit = usize::try_from(limit).unwrap_or(usize::MAX);
            if let Some(kept) = text::truncate_words(&text, limit) {
                // `kept` is a prefix of `text`.
                let len = kept.len();
                text.truncate(len);
                finish_reason = "MAX_TOKENS";
            }
        }
        Reply::Text {
            text,
            finish_reason,
        }
    }

    fn word_count(&self) -> u64 {
        match self {
            Reply::Text { text, .. } => text::word_count(text) as u64,
            // `{"mock":true,"n":1}` has no whitespace: one word.
            Reply::Call(_) => 1,
            Reply::Blocked => 0,
        }
    }

    /// The whole reply text (empty for calls and blocks).
    fn text(&self) -> &str {
        match self {
            Reply::Text { text, .. } => text,
            _ => "",
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GenerateResponse<'a> {
    candidates: Vec<Candidate<'a>>,
    usage_metadata: Usage,
    model_version: &'a str,
    response_id: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Candidate<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<CandidateContent<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    finish_reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    safety_ratings: Option<&'static [SafetyRating]>,
    index: u64,
}

#[derive(Serialize)]
struct CandidateContent<'a> {
    parts: [OutPart<'a>; 1],
    role: &'static str,
}

/// A part of the reply: `{"text":...}` or `{"functionCall":{...}}`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
enum OutPart<'a> {
    Text(&'a str),
    FunctionCall(FunctionCall<'a>),
}

#[derive(Serialize)]
struct FunctionCall<'a> {
    name: &'a str,
    args: &'static Args,
}

/// The fixed arguments of every mock function call.
#[derive(Serialize)]
struct Args {
    mock: bool,
    n: u32,
}

static ARGS: Args = Args { mock: true, n: 1 };

#[derive(Serialize)]
struct SafetyRating {
    category: &'static str,
    probability: &'static str,
    blocked: bool,
}

static BLOCKED_RATINGS: [SafetyRating; 1] = [SafetyRating {
    category: "HARM_CATEGORY_DANGEROUS_CONTENT",
    probability: "HIGH",
    blocked: true,
}];

/// `usageMetadata`; a zero candidates count is left out, as proto JSON
/// leaves out default values.
#[derive(Serialize, Clone, Copy)]
#[serde(rename_all = "camelCase")]
struct Usage {
    prompt_token_count: u64,
    #[serde(skip_serializing_if = "is_zero")]
    candidates_token_count: u64,
    total_token_count: u64,
    /// Vertex AI only: `PROVISIONED_THROUGHPUT` or `ON_DEMAND`.
    #[serde(skip_serializing_if = "Option::is_none")]
    traffic_type: Option<&'static str>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Usage {
    fn new(prompt: u64, candidates: u64) -> Self {
        Usage {
            prompt_token_count: prompt,
            candidates_token_count: candidates,
            total_token_count: prompt + candidates,
            traffic_type: None,
        }
    }

    fn traffic(self, traffic_type: Option<&'static str>) -> Self {
        Usage {
            traffic_type,
            ..self
        }
    }
}

/// The `trafficType` Vertex AI reports: `PROVISIONED_THROUGHPUT` when the request asked for
/// it only (`X-Vertex-AI-LLM-Request-Type: dedicated`; the mock has reserved capacity to
/// spare), `ON_DEMAND` otherwise. The Gemini API reports none.
fn traffic_type(ctx: &Ctx<'_>, api: Api) -> Option<&'static str> {
    if !matches!(api, Api::Vertex) {
        return None;
    }
    let dedicated = ctx
        .headers
        .get("x-vertex-ai-llm-request-type")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"dedicated"));
    Some(if dedicated {
        "PROVISIONED_THROUGHPUT"
    } else {
        "ON_DEMAND"
    })
}

/// `count` candidates showing `text` (the reply or a piece of it), with
/// the finish reason when `finish`.
fn candidates<'a>(reply: &'a Reply, text: &'a str, count: u64, finish: bool) -> Vec<Candidate<'a>> {
    (0..count)
        .map(|index| match reply {
            Reply::Text { finish_reason, .. } => Candidate {
                content: Some(CandidateContent {
                    parts: [OutPart::Text(text)],
                    role: "model",
                }),
                finish_reason: finish.then_some(*finish_reason),
                safety_ratings: None,
                index,
            },
            Reply::Call(name) => Candidate {
                content: Some(CandidateContent {
                    parts: [OutPart::FunctionCall(FunctionCall { name, args: &ARGS })],
                    role: "model",
                }),
                finish_reason: finish.then_some("STOP"),
                safety_ratings: None,
                index,
            },
            Reply::Blocked => Candidate {
                content: None,
                finish_reason: finish.then_some("SAFETY"),
                safety_ratings: Some(&BLOCKED_RATINGS),
                index,
            },
        })
        .collect()
}

/// Lazily produces the streamed responses: one per piece of a text reply,
/// a single one for a function call or a block.
struct GenerateStream {
    /// JSON-array framing (no `alt=sse`) instead of SSE.
    array: bool,
    id: String,
    model: String,
    reply: Reply,
    reply_words: u64,
    /// Byte offsets of the pieces of a text reply.
    starts: Vec<usize>,
    candidate_count: u64,
    prompt_tokens: u64,
    traffic: Option<&'static str>,
    step: usize,
    steps: usize,
}

impl GenerateStream {
    fn frame(&self, response: &GenerateResponse<'_>, first: bool, last: bool) -> Bytes {
        let mut buf = Vec::with_capacity(256);
        if self.array {
            buf.extend_from_slice(if first { b"[" } else { b",\r\n" });
        } else {
            buf.extend_from_slice(b"data: ");
        }
        // Serializing our own plain structs into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut buf, response);
        if !self.array {
            buf.extend_from_slice(b"\r\n\r\n");
        } else if last {
            buf.push(b']');
        }
        Bytes::from(buf)
    }
}

impl Iterator for GenerateStream {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        if self.step >= self.steps {
            return None;
        }
        let step = self.step;
        self.step += 1;
        let last = self.step == self.steps;
        let (piece, words) = match &self.reply {
            Reply::Text { text, .. } => {
                let start = self.starts.get(step).copied().unwrap_or(0);
                let end = self.starts.get(step + 1).copied().unwrap_or(text.len());
                // Each piece holds one word, so the count so far is the
                // number of pieces sent (capped for whitespace-only text).
                let words = (step as u64 + 1).min(self.reply_words);
                (text.get(start..end).unwrap_or(""), words)
            }
            _ => ("", self.reply_words),
        };
        let response = GenerateResponse {
            candidates: candidates(&self.reply, piece, self.candidate_count, last),
            usage_metadata: Usage::new(self.prompt_tokens, words * self.candidate_count)
                .traffic(self.traffic),
            model_version: &self.model,
            response_id: &self.id,
        };
        Some(self.frame(&response, step == 0, last))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(body: &Value) -> Result<Reply, ApiError> {
        let fields = body.as_object().cloned().unwrap_or_default();
        let req = Request::from_fields(&fields, Api::Gemini)?;
        Ok(Reply::new(&req, None))
    }

    fn text_reply(text: &str, finish_reason: &'static str) -> Reply {
        Reply::Text {
            text: text.to_owned(),
            finish_reason,
        }
    }

    #[test]
    fn replies_follow_the_request() {
        let user = json!([{"role": "user", "parts": [{"text": "hello there"}]}]);
        let reply = request(&json!({"contents": user})).ok();
        assert_eq!(
            reply,
            Some(text_reply("mock reply to: hello there", "STOP"))
        );

        let body = json!({"contents": user, "generation_config": {"max_output_tokens": 3}});
        assert_eq!(
            request(&body).ok(),
            Some(text_reply("mock reply to:", "MAX_TOKENS"))
        );

        let body = json!({"contents": user, "generationConfig": {"stopSequences": ["to:", "re"]}});
        assert_eq!(request(&body).ok(), Some(text_reply("mock ", "STOP")));

        let unsafe_user = json!([{"parts": [{"text": "an UNSAFE idea"}]}]);
        assert_eq!(
            request(&json!({"contents": unsafe_user})).ok(),
            Some(Reply::Blocked)
        );
    }

    #[test]
    fn function_calls_follow_the_tool_config() {
        let tools = json!([{"functionDeclarations": [{"name": "a"}, {"name": "b"}]}]);
        let user = json!([{"role": "user", "parts": [{"text": "hi"}]}]);
        let call = |config: Value| {
            request(&json!({"contents": user, "tools": tools, "toolConfig": config})).ok()
        };
        assert_eq!(call(json!({})), Some(Reply::Call("a".into())));
        let any_b =
            json!({"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["b"]}});
        assert_eq!(call(any_b), Some(Reply::Call("b".into())));
        let none = json!({"functionCallingConfig": {"mode": "NONE"}});
        assert_eq!(call(none), Some(text_reply("mock reply to: hi", "STOP")));
        let auto_b =
            json!({"functionCallingConfig": {"mode": "AUTO", "allowedFunctionNames": ["b"]}});
        assert!(call(auto_b).is_none());
        let unknown =
            json!({"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["c"]}});
        assert!(call(unknown).is_none());

        let answered = json!([
            {"role": "user", "parts": [{"text": "hi"}]},
            {"role": "model", "parts": [{"functionCall": {"name": "a", "args": {}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "a", "response": {"t": 1}}}]},
        ]);
        let reply = request(&json!({"contents": answered, "tools": tools})).ok();
        assert_eq!(reply, Some(text_reply(r#"mock reply to: {"t":1}"#, "STOP")));
    }

    #[test]
    fn wrong_shapes_are_refused() {
        let message = |body: Value| request(&body).err().map(|e| e.message).unwrap_or_default();
        let openai = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        assert!(message(openai).contains("Unknown name \"messages\": Cannot find field."));
        let user = json!([{"role": "user", "parts": [{"text": "hi"}]}]);
        assert!(message(json!({"model": "m", "contents": user})).contains("Unknown name \"model\""));
        assert!(message(json!({"contents": []})).contains("contents is not specified"));
        let assistant = json!([{"role": "assistant", "parts": [{"text": "hi"}]}]);
        assert!(message(json!({"contents": assistant})).contains("valid role"));
        let two = json!([{"parts": [{"text": "hi", "inlineData": {"mimeType": "a", "data": ""}}]}]);
        assert!(message(json!({"contents": two})).contains("Oneof"));
        let none = json!([{"parts": [{"thought": true}]}]);
        assert!(message(json!({"contents": none})).contains("oneof"));
        let max_tokens = json!({"contents": user, "generationConfig": {"max_tokens": 5}});
        assert!(message(max_tokens).contains("at 'generation_config'"));
        let schema = json!({"type": "object", "additionalProperties": false});
        let tools = json!([{"functionDeclarations": [{"name": "f", "parameters": schema}]}]);
        assert!(message(json!({"contents": user, "tools": tools})).contains("additionalProperties"));
        let openai_tool = json!([{"type": "function", "function": {"name": "f"}}]);
        assert!(message(json!({"contents": user, "tools": openai_tool}))
            .contains("Unknown name \"function\" at 'tools[0]'"));
        let union = json!({"type": ["string", "null"]});
        let tools = json!([{"functionDeclarations": [{"name": "f", "parameters": union}]}]);
        assert!(message(json!({"contents": user, "tools": tools})).contains(".type"));
        let bad_name = json!([{"functionDeclarations": [{"name": "9 lives"}]}]);
        assert!(message(json!({"contents": user, "tools": bad_name})).contains("function name"));
    }

    #[test]
    fn vertex_schemas_may_say_additional_properties() {
        let schema = json!({"type": "OBJECT", "additionalProperties": false, "properties": {}});
        assert!(check_schema(&schema, "p", Api::Vertex).is_ok());
        assert!(check_schema(&schema, "p", Api::Gemini).is_err());
    }

    #[test]
    fn stream_frames_join_to_the_reply() {
        let reply = text_reply("mock reply to: a b", "STOP");
        let starts = text::piece_starts(reply.text());
        let steps = starts.len();
        let stream = |array| GenerateStream {
            array,
            id: "id".into(),
            model: "m".into(),
            reply_words: reply.word_count(),
            reply: text_reply("mock reply to: a b", "STOP"),
            starts: starts.clone(),
            candidate_count: 1,
            prompt_tokens: 2,
            traffic: None,
            step: 0,
            steps,
        };
        let sse: Vec<Bytes> = stream(false).collect();
        assert_eq!(sse.len(), 5);
        assert!(sse
            .iter()
            .all(|e| e.starts_with(b"data: {") && e.ends_with(b"}\r\n\r\n")));
        let array: Vec<u8> = stream(true).flatten().collect();
        let parsed: Value = serde_json::from_slice(&array).unwrap_or_default();
        let texts: String = parsed
            .as_array()
            .map(|events| {
                events
                    .iter()
                    .filter_map(|e| e["candidates"][0]["content"]["parts"][0]["text"].as_str())
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(texts, "mock reply to: a b");
        assert_eq!(parsed[4]["candidates"][0]["finishReason"], "STOP");
        assert_eq!(parsed[4]["usageMetadata"]["totalTokenCount"], 7);
        assert!(parsed[3]["candidates"][0].get("finishReason").is_none());
    }
}
