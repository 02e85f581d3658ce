//! `POST /v2/embed`: `{model, texts, input_type, embedding_types,
//! output_dimension}` -> `{"id","embeddings":{"<type>":[[...]]},"texts",
//! "meta":{"billed_units":{"input_tokens"}},"response_type"}`. The vectors
//! are the OpenAI route's deterministic ones ([`crate::openai::text_vector`]),
//! `output_dimension` long (default 8); `int8` / `uint8` are those values
//! scaled to the integer range.

use std::collections::BTreeMap;

use http::StatusCode;
use serde::Serialize;
use serde_json::{json, Map, Value};

use super::{check_fields, get, parse_object, require_str, uuid_like, ApiError, HandlerResult};
use crate::body;
use crate::openai::text_vector;
use crate::server::Ctx;
use crate::text;

const DEFAULT_DIMENSIONS: u64 = 8;
const MAX_DIMENSIONS: u64 = 4096;
/// Most texts in one request, as on Cohere's API.
const MAX_TEXTS: usize = 96;
const REQUEST_FIELDS: [&str; 10] = [
    "model",
    "texts",
    "images",
    "inputs",
    "input_type",
    "embedding_types",
    "truncate",
    "output_dimension",
    "max_tokens",
    "priority",
];
const OPENAI_HINTS: [(&str, &str); 4] = [
    ("input", "Cohere uses 'texts'"),
    ("encoding_format", "Cohere uses 'embedding_types'"),
    ("dimensions", "Cohere uses 'output_dimension'"),
    ("user", "Cohere has no end-user field"),
];
const INPUT_TYPES: [&str; 5] = [
    "search_document",
    "search_query",
    "classification",
    "clustering",
    "image",
];
/// Types Cohere offers; the mock produces the first three.
const EMBEDDING_TYPES: [&str; 6] = ["float", "int8", "uint8", "binary", "ubinary", "base64"];
const MOCKED_TYPES: usize = 3;
const TRUNCATE_MODES: [&str; 3] = ["NONE", "START", "END"];

/// Answers `POST /v2/embed`.
pub(super) fn handle(ctx: &Ctx<'_>, body: &[u8]) -> HandlerResult {
    let fields = parse_object(body)?;
    check_fields(&fields, &REQUEST_FIELDS, &OPENAI_HINTS)?;
    let model = require_str(&fields, "model", "model")?;
    if model.is_empty() {
        return Err(ApiError::invalid("model must not be empty"));
    }
    let texts = check_texts(&fields)?;
    let input_type = require_str(&fields, "input_type", "input_type")?;
    if !INPUT_TYPES.contains(&input_type) {
        return Err(ApiError::invalid(format!(
            "input_type must be one of {}, got '{input_type}'",
            INPUT_TYPES.join(", ")
        )));
    }
    if let Some(truncate) = get(&fields, "truncate") {
        if !truncate
            .as_str()
            .is_some_and(|t| TRUNCATE_MODES.contains(&t))
        {
            return Err(ApiError::invalid(format!(
                "truncate must be one of NONE, START, END, got {truncate}"
            )));
        }
    }
    let dimensions = match get(&fields, "output_dimension") {
        None => DEFAULT_DIMENSIONS,
        Some(value) => value
            .as_u64()
            .filter(|n| (1..=MAX_DIMENSIONS).contains(n))
            .ok_or_else(|| {
                ApiError::invalid(format!(
                    "output_dimension must be an integer between 1 and {MAX_DIMENSIONS}, got {value}"
                ))
            })?,
    };
    let types = check_types(get(&fields, "embedding_types"))?;

    let vectors: Vec<Vec<f32>> = texts.iter().map(|t| text_vector(t, dimensions)).collect();
    let embeddings = types
        .into_iter()
        .map(|kind| {
            let values = match kind {
                "int8" => Vectors::Int8(
                    vectors
                        .iter()
                        .map(|v| v.iter().map(|&x| to_int8(x)).collect())
                        .collect(),
                ),
                "uint8" => Vectors::Uint8(
                    vectors
                        .iter()
                        .map(|v| v.iter().map(|&x| to_uint8(x)).collect())
                        .collect(),
                ),
                _ => Vectors::Float(&vectors),
            };
            (kind, values)
        })
        .collect();
    let input_tokens: u64 = texts.iter().map(|t| text::word_count(t) as u64).sum();
    let answer = EmbedResponse {
        id: uuid_like(ctx.shared.next_id()),
        embeddings,
        texts: &texts,
        meta: json!({
            "api_version": {"version": "2"},
            "billed_units": {"input_tokens": input_tokens},
        }),
        response_type: "embeddings_by_type",
    };
    Ok(body::json(StatusCode::OK, &answer))
}

/// The answer; vectors are serialized from the `f32`s themselves so they
/// read exactly as on the OpenAI route.
#[derive(Serialize)]
struct EmbedResponse<'a> {
    id: String,
    embeddings: BTreeMap<&'static str, Vectors<'a>>,
    texts: &'a [&'a str],
    meta: Value,
    response_type: &'static str,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Vectors<'a> {
    Float(&'a [Vec<f32>]),
    Int8(Vec<Vec<i64>>),
    Uint8(Vec<Vec<u64>>),
}

/// `texts`: 1 to 96 strings. Images and mixed inputs are not mocked.
fn check_texts(fields: &Map<String, Value>) -> Result<Vec<&str>, ApiError> {
    if get(fields, "images").is_some() || get(fields, "inputs").is_some() {
        return Err(ApiError::invalid(
            "the mock embeds 'texts' only, not 'images' or 'inputs'",
        ));
    }
    let texts = match get(fields, "texts") {
        None => return Err(ApiError::invalid("texts is required")),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(ApiError::invalid("texts must be a list of strings")),
    };
    if texts.is_empty() || texts.len() > MAX_TEXTS {
        return Err(ApiError::invalid(format!(
            "texts must hold between 1 and {MAX_TEXTS} strings, got {}",
            texts.len()
        )));
    }
    texts
        .iter()
        .map(|t| {
            t.as_str()
                .ok_or_else(|| ApiError::invalid("texts must be a list of strings"))
        })
        .collect()
}

/// `embedding_types` (default `["float"]`), in request order, deduplicated.
fn check_types(value: Option<&Value>) -> Result<Vec<&'static str>, ApiError> {
    let list = match value {
        None => return Ok(vec!["float"]),
        Some(Value::Array(list)) if !list.is_empty() => list,
        Some(_) => {
            return Err(ApiError::invalid(
                "embedding_types must be a non-empty list",
            ))
        }
    };
    let mut types = Vec::with_capacity(list.len());
    for value in list {
        let kind = value.as_str().unwrap_or("");
        let Some(position) = EMBEDDING_TYPES.iter().position(|t| *t == kind) else {
            return Err(ApiError::invalid(format!(
                "embedding_types must be among {}, got {value}",
                EMBEDDING_TYPES.join(", ")
            )));
        };
        if position >= MOCKED_TYPES {
            return Err(ApiError::invalid(format!(
                "the mock produces float, int8 and uint8 embeddings, not '{kind}'"
            )));
        }
        if !types.contains(&EMBEDDING_TYPES[position]) {
            types.push(EMBEDDING_TYPES[position]);
        }
    }
    Ok(types)
}

/// [-1, 1] to [-127, 127].
fn to_int8(x: f32) -> i64 {
    (x * 127.0).round().clamp(-128.0, 127.0) as i64
}

/// [-1, 1] to [0, 255].
fn to_uint8(x: f32) -> u64 {
    ((x + 1.0) * 127.5).round().clamp(0.0, 255.0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantization_covers_the_ranges() {
        assert_eq!((to_int8(-1.0), to_int8(0.0), to_int8(1.0)), (-127, 0, 127));
        assert_eq!((to_uint8(-1.0), to_uint8(1.0)), (0, 255));
    }

    #[test]
    fn types_default_to_float_and_refuse_unknowns() {
        assert_eq!(check_types(None).ok(), Some(vec!["float"]));
        let both = json!(["int8", "float", "int8"]);
        assert_eq!(check_types(Some(&both)).ok(), Some(vec!["int8", "float"]));
        assert!(check_types(Some(&json!(["binary"]))).is_err());
        assert!(check_types(Some(&json!(["double"]))).is_err());
        assert!(check_types(Some(&json!([]))).is_err());
    }
}
