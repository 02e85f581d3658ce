//! `POST /moderations`: keyword-based, deterministic classification.
//!
//! `violence` fires on "kill" or "attack", `hate` on "hate"
//! (case-insensitive); every other score is a small constant.

use http::StatusCode;
use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

use super::{parse_json, ApiError, HandlerResult, Str};
use crate::body;
use crate::server::Ctx;

const DEFAULT_MODEL: &str = "text-moderation-latest";

/// OpenAI's category keys, in the order they are reported.
const CATEGORIES: [&str; 11] = [
    "hate",
    "hate/threatening",
    "harassment",
    "harassment/threatening",
    "self-harm",
    "self-harm/intent",
    "self-harm/instructions",
    "sexual",
    "sexual/minors",
    "violence",
    "violence/graphic",
];
const HATE: usize = 0;
const VIOLENCE: usize = 9;

const FLAGGED_SCORE: f64 = 0.9;
const BACKGROUND_SCORE: f64 = 0.01;

#[derive(Deserialize)]
struct ModerationRequest<'a> {
    input: Value,
    #[serde(borrow, default)]
    model: Option<Str<'a>>,
}

#[derive(Serialize)]
struct Moderation<'a> {
    id: String,
    model: &'a str,
    results: Vec<ModerationResult>,
}

#[derive(Serialize)]
struct ModerationResult {
    flagged: bool,
    categories: PerCategory<bool>,
    category_scores: PerCategory<f64>,
}

/// One value per category, serialized as an object in `CATEGORIES` order.
struct PerCategory<T>([T; 11]);

impl<T: Serialize> Serialize for PerCategory<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(CATEGORIES.len()))?;
        for (key, value) in CATEGORIES.iter().zip(&self.0) {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

pub(super) fn handle(ctx: &Ctx<'_>, body: &[u8]) -> HandlerResult {
    let req: ModerationRequest<'_> = parse_json(body)?;
    let texts = parse_input(&req.input)?;
    let results = texts.iter().map(|t| classify(t)).collect();
    let moderation = Moderation {
        id: format!("modr-mock-{}", ctx.shared.next_id()),
        model: req.model.as_ref().map_or(DEFAULT_MODEL, Str::as_str),
        results,
    };
    Ok(body::json(StatusCode::OK, &moderation))
}

/// One text per result: a string, each string of an array, or the joined
/// text parts of a multimodal array (`[{"type":"text","text":...}]`).
fn parse_input(input: &Value) -> Result<Vec<String>, ApiError> {
    let invalid = || {
        ApiError::invalid_param(
            "input",
            "'input' must be a string, an array of strings, or an array of content parts",
        )
    };
    match input {
        Value::String(text) => Ok(vec![text.clone()]),
        Value::Array(values) if values.is_empty() => Err(ApiError::invalid_param(
            "input",
            "'input' must not be empty",
        )),
        Value::Array(values) if values.iter().all(Value::is_string) => Ok(values
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()),
        Value::Array(values) if values.iter().all(Value::is_object) => {
            let texts: Vec<&str> = values
                .iter()
                .filter_map(|part| part.get("text").and_then(Value::as_str))
                .collect();
            Ok(vec![texts.join(" ")])
        }
        _ => Err(invalid()),
    }
}

fn classify(text: &str) -> ModerationResult {
    let lower = text.to_lowercase();
    let mut categories = [false; 11];
    categories[VIOLENCE] = lower.contains("kill") || lower.contains("attack");
    categories[HATE] = lower.contains("hate");
    let scores = categories.map(|hit| if hit { FLAGGED_SCORE } else { BACKGROUND_SCORE });
    ModerationResult {
        flagged: categories.iter().any(|&hit| hit),
        categories: PerCategory(categories),
        category_scores: PerCategory(scores),
    }
}
