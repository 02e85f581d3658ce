//! Embeddings in Google's formats: the Gemini API's `:embedContent` and
//! `:batchEmbedContents`, and Vertex AI's `:predict` for text embedding
//! models. The vectors are the OpenAI route's deterministic ones
//! ([`crate::openai::text_vector`]), `outputDimensionality` long (default 8).

use http::StatusCode;
use serde::Serialize;
use serde_json::{Map, Value};

use super::{
    as_count, as_list, as_object, as_str, check_known, field, parse_object, ApiError, HandlerResult,
};
use crate::body;
use crate::openai::text_vector;
use crate::text;

/// Vector length when the request does not say.
const DEFAULT_DIMENSIONS: u64 = 8;
const MAX_DIMENSIONS: u64 = 4096;
/// Most requests in one `:batchEmbedContents`, as on the Gemini API.
const MAX_BATCH: usize = 100;
/// Most instances in one Vertex `:predict`.
const MAX_INSTANCES: usize = 250;
const EMBED_REQUEST_FIELDS: [&str; 5] = [
    "model",
    "content",
    "taskType",
    "title",
    "outputDimensionality",
];
const TASK_TYPES: [&str; 9] = [
    "TASK_TYPE_UNSPECIFIED",
    "RETRIEVAL_QUERY",
    "RETRIEVAL_DOCUMENT",
    "SEMANTIC_SIMILARITY",
    "CLASSIFICATION",
    "CLUSTERING",
    "QUESTION_ANSWERING",
    "FACT_VERIFICATION",
    "CODE_RETRIEVAL_QUERY",
];
const INSTANCE_FIELDS: [&str; 3] = ["content", "taskType", "title"];
const PARAMETER_FIELDS: [&str; 2] = ["outputDimensionality", "autoTruncate"];

#[derive(Serialize)]
struct Values {
    values: Vec<f32>,
}

#[derive(Serialize)]
struct Single {
    embedding: Values,
}

#[derive(Serialize)]
struct Batch {
    embeddings: Vec<Values>,
}

/// `POST models/{model}:embedContent` -> `{"embedding":{"values":[...]}}`.
pub(super) fn embed_content(body: &[u8], model: &str) -> HandlerResult {
    let fields = parse_object(body)?;
    let values = embed_request(&fields, model, "", false)?;
    Ok(body::json(
        StatusCode::OK,
        &Single {
            embedding: Values { values },
        },
    ))
}

/// `POST models/{model}:batchEmbedContents` with `{"requests":[...]}`, each
/// naming `models/{model}` -> `{"embeddings":[{"values":[...]}, ...]}`.
pub(super) fn batch_embed_contents(body: &[u8], model: &str) -> HandlerResult {
    let fields = parse_object(body)?;
    check_known(&fields, &["requests"], "")?;
    let requests = match field(&fields, "requests") {
        None => &[][..],
        Some(value) => as_list(value, "requests")?,
    };
    if requests.is_empty() {
        return Err(ApiError::invalid(
            "* BatchEmbedContentsRequest.requests: must not be empty",
        ));
    }
    if requests.len() > MAX_BATCH {
        return Err(ApiError::invalid(format!(
            "* BatchEmbedContentsRequest.requests: at most {MAX_BATCH} requests are allowed, got {}",
            requests.len()
        )));
    }
    let embeddings = requests
        .iter()
        .enumerate()
        .map(|(i, request)| {
            let at = format!("requests[{i}]");
            let fields = as_object(request, &at)?;
            let values = embed_request(fields, model, &at, true)?;
            Ok(Values { values })
        })
        .collect::<Result<_, ApiError>>()?;
    Ok(body::json(StatusCode::OK, &Batch { embeddings }))
}

/// Checks one `EmbedContentRequest` and embeds its text. `model` (the URL's)
/// must be repeated as `models/{model}` when `model_required`, and may be
/// when not.
fn embed_request(
    fields: &Map<String, Value>,
    model: &str,
    at: &str,
    model_required: bool,
) -> Result<Vec<f32>, ApiError> {
    let path = |name: &str| {
        if at.is_empty() {
            name.to_owned()
        } else {
            format!("{at}.{name}")
        }
    };
    check_known(fields, &EMBED_REQUEST_FIELDS, at)?;
    match field(fields, "model") {
        None if model_required => {
            return Err(ApiError::invalid(format!(
                "* BatchEmbedContentsRequest.{}: required field is not set (expected \"models/{model}\")",
                path("model")
            )))
        }
        None => {}
        Some(value) => {
            let named = as_str(value, &path("model"))?;
            if named.strip_prefix("models/") != Some(model) {
                return Err(ApiError::invalid(format!(
                    "* {}: model '{named}' does not match the model of the URL; expected \"models/{model}\"",
                    path("model")
                )));
            }
        }
    }
    if let Some(task) = field(fields, "taskType") {
        let task = as_str(task, &path("task_type"))?;
        if !TASK_TYPES.iter().any(|t| t.eq_ignore_ascii_case(task)) {
            return Err(ApiError::invalid_value(
                &path("task_type"),
                format!("'{task}' is not a TaskType"),
            ));
        }
    }
    if let Some(title) = field(fields, "title") {
        as_str(title, &path("title"))?;
    }
    let dimensions = dimensions(
        field(fields, "outputDimensionality"),
        &path("output_dimensionality"),
    )?;
    let content_at = path("content");
    let Some(content) = field(fields, "content") else {
        return Err(ApiError::invalid(format!(
            "* {content_at}: required field is not set"
        )));
    };
    let content = as_object(content, &content_at)?;
    check_known(content, &["role", "parts"], &content_at)?;
    let parts_at = format!("{content_at}.parts");
    let parts = match field(content, "parts") {
        None => &[][..],
        Some(value) => as_list(value, &parts_at)?,
    };
    if parts.is_empty() {
        return Err(ApiError::invalid(format!(
            "* {parts_at}: must not be empty"
        )));
    }
    let mut texts = Vec::with_capacity(parts.len());
    for (i, part) in parts.iter().enumerate() {
        let part_at = format!("{parts_at}[{i}]");
        let part = as_object(part, &part_at)?;
        check_known(part, &["text"], &part_at)?;
        match field(part, "text") {
            Some(text) => texts.push(as_str(text, &format!("{part_at}.text"))?),
            None => {
                return Err(ApiError::invalid(format!(
                    "* {part_at}: the mock embeds text parts only"
                )))
            }
        }
    }
    Ok(text_vector(&texts.join(" "), dimensions))
}

/// `outputDimensionality`, default [`DEFAULT_DIMENSIONS`].
fn dimensions(value: Option<&Value>, at: &str) -> Result<u64, ApiError> {
    let Some(value) = value else {
        return Ok(DEFAULT_DIMENSIONS);
    };
    let n = as_count(value, at)?;
    if n == 0 || n > MAX_DIMENSIONS {
        return Err(ApiError::invalid_value(
            at,
            format!("must be between 1 and {MAX_DIMENSIONS}, got {n}"),
        ));
    }
    Ok(n)
}

#[derive(Serialize)]
struct Predictions {
    predictions: Vec<Prediction>,
    metadata: PredictMetadata,
}

#[derive(Serialize)]
struct Prediction {
    embeddings: PredictedEmbedding,
}

#[derive(Serialize)]
struct PredictedEmbedding {
    values: Vec<f32>,
    statistics: Statistics,
}

#[derive(Serialize)]
struct Statistics {
    token_count: u64,
    truncated: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PredictMetadata {
    billable_character_count: u64,
}

/// Vertex AI `:predict` on a text embedding model:
/// `{"instances":[{"content":text}],"parameters":{"outputDimensionality":n}}`
/// -> `{"predictions":[{"embeddings":{"values","statistics"}}],"metadata"}`.
pub(super) fn predict(body: &[u8]) -> HandlerResult {
    let fields = parse_object(body)?;
    check_known(&fields, &["instances", "parameters"], "")?;
    let instances = match field(&fields, "instances") {
        None => &[][..],
        Some(value) => as_list(value, "instances")?,
    };
    if instances.is_empty() {
        return Err(ApiError::invalid("instances: must not be empty"));
    }
    if instances.len() > MAX_INSTANCES {
        return Err(ApiError::invalid(format!(
            "instances: at most {MAX_INSTANCES} instances are allowed, got {}",
            instances.len()
        )));
    }
    let dimensions = match field(&fields, "parameters") {
        None => DEFAULT_DIMENSIONS,
        Some(value) => {
            let parameters = as_object(value, "parameters")?;
            check_known(parameters, &PARAMETER_FIELDS, "parameters")?;
            if let Some(flag) = field(parameters, "autoTruncate") {
                if !flag.is_boolean() {
                    return Err(ApiError::invalid_value(
                        "parameters.auto_truncate",
                        "expected a boolean",
                    ));
                }
            }
            dimensions(
                field(parameters, "outputDimensionality"),
                "parameters.output_dimensionality",
            )?
        }
    };
    let mut characters = 0u64;
    let predictions = instances
        .iter()
        .enumerate()
        .map(|(i, instance)| {
            let at = format!("instances[{i}]");
            let instance = as_object(instance, &at)?;
            check_known(instance, &INSTANCE_FIELDS, &at)?;
            let content = match field(instance, "content") {
                None => {
                    return Err(ApiError::invalid(format!(
                        "{at}.content: required field is not set"
                    )))
                }
                Some(value) => as_str(value, &format!("{at}.content"))?,
            };
            characters += content.chars().filter(|c| !c.is_whitespace()).count() as u64;
            Ok(Prediction {
                embeddings: PredictedEmbedding {
                    values: text_vector(content, dimensions),
                    statistics: Statistics {
                        token_count: text::word_count(content) as u64,
                        truncated: false,
                    },
                },
            })
        })
        .collect::<Result<_, ApiError>>()?;
    let answer = Predictions {
        predictions,
        metadata: PredictMetadata {
            billable_character_count: characters,
        },
    };
    Ok(body::json(StatusCode::OK, &answer))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn embed(body: &Value, model: &str) -> Result<Vec<f32>, String> {
        let fields = body.as_object().cloned().unwrap_or_default();
        embed_request(&fields, model, "requests[0]", true).map_err(|e| e.message)
    }

    #[test]
    fn batch_requests_name_the_url_model() {
        let ok = json!({"model": "models/e", "content": {"parts": [{"text": "a"}, {"text": "b"}]}});
        assert_eq!(embed(&ok, "e"), Ok(text_vector("a b", DEFAULT_DIMENSIONS)));
        let other = json!({"model": "models/x", "content": {"parts": [{"text": "a"}]}});
        assert!(embed(&other, "e").is_err_and(|m| m.contains("does not match")));
        let bare = json!({"model": "e", "content": {"parts": [{"text": "a"}]}});
        assert!(embed(&bare, "e").is_err());
        let missing = json!({"content": {"parts": [{"text": "a"}]}});
        assert!(embed(&missing, "e").is_err_and(|m| m.contains("required")));
        let openai = json!({"model": "models/e", "input": "a"});
        assert!(embed(&openai, "e").is_err_and(|m| m.contains("Unknown name \"input\"")));
        let sized = json!({"model": "models/e", "content": {"parts": [{"text": "a"}]},
                           "output_dimensionality": 3});
        assert_eq!(embed(&sized, "e").map(|v| v.len()), Ok(3));
    }
}
