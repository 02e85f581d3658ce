//! The built-in checks, one module per family, under the ids and camelCase parameters of the
//! reference gateway (`default.regexMatch` with `rule`...).
//!
//! A check is parsed once from its `parameters` (regexes and schemas compiled then) and run
//! many times. It returns a [`Outcome`]: a verdict (`true` = passed), data saying what it found,
//! an error when it could not run (an error counts as a failed verdict), and for redacting
//! checks the rewritten texts.
//!
//! Checks that call the network (`default.webhook`, `default.validUrls`) only run where the
//! gateway can wait: in `on_request` and `on_response`. On streamed answers they are skipped and
//! their result says so.

pub mod code;
pub mod counts;
pub mod json;
pub mod model;
pub mod pattern;
pub mod pii;
pub mod schema;
pub mod urls;
pub mod webhook;

use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use plugin_sdk::ConfigIssue;

use super::net::Net;
use super::results::Side;

/// Every check id the plugin knows.
pub const KNOWN: &[&str] = &[
    "default.regexMatch",
    "default.contains",
    "default.endsWith",
    "default.wordCount",
    "default.sentenceCount",
    "default.characterCount",
    "default.jsonSchema",
    "default.jsonKeys",
    "default.validUrls",
    "default.containsCode",
    "default.modelWhitelist",
    "default.pii",
    "default.webhook",
];

/// What a check is run on.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    pub side: Side,
    /// The checked text (see [`super::text`]).
    pub text: &'a str,
    /// Every text a redaction rewrites (the messages, the choices), in order.
    pub segments: &'a [String],
    /// The model the request names.
    pub model: Option<&'a str>,
    /// False on streamed answers, whose text is already on its way: redacting checks then only
    /// detect.
    pub can_rewrite: bool,
    /// The request body as JSON (`null` when not needed), for the webhook.
    pub request: &'a Value,
    /// The answer body as JSON, on the output side, for the webhook.
    pub response: Option<&'a Value>,
}

/// A check's outcome.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub verdict: bool,
    pub data: Value,
    /// Set when the check could not run; the verdict is then `false`.
    pub error: Option<String>,
    /// The segments rewritten (same number and order as [`Input::segments`]).
    pub rewritten: Option<Vec<String>>,
}

impl Outcome {
    pub fn of(verdict: bool, data: Value) -> Outcome {
        Outcome {
            verdict,
            data,
            error: None,
            rewritten: None,
        }
    }

    pub fn error(message: impl Into<String>, data: Value) -> Outcome {
        Outcome {
            verdict: false,
            data,
            error: Some(message.into()),
            rewritten: None,
        }
    }

    /// A check that did not run on a streamed answer; it does not fail its hook.
    pub fn skipped(reason: &str) -> Outcome {
        Outcome::of(true, json!({"skipped": true, "explanation": reason}))
    }
}

/// One parsed check.
#[derive(Debug)]
pub enum Check {
    Regex(pattern::RegexMatch),
    Contains(pattern::Contains),
    EndsWith(pattern::EndsWith),
    Count(counts::Count),
    JsonSchema(json::JsonSchema),
    JsonKeys(json::JsonKeys),
    ValidUrls(urls::ValidUrls),
    ContainsCode(code::ContainsCode),
    ModelWhitelist(model::ModelWhitelist),
    Pii(pii::Pii),
    Webhook(webhook::Webhook),
}

impl Check {
    /// Parses a check from its id and parameters. A problem's path is relative to
    /// `parameters` (`rule`, `schema.properties.a.type`), or empty for the id itself.
    pub fn parse(id: &str, parameters: &Value) -> Result<Check, ConfigIssue> {
        let p = parameters;
        Ok(match id {
            "default.regexMatch" => Check::Regex(pattern::RegexMatch::parse(p)?),
            "default.contains" => Check::Contains(pattern::Contains::parse(p)?),
            "default.endsWith" => Check::EndsWith(pattern::EndsWith::parse(p)?),
            "default.wordCount" => Check::Count(counts::Count::parse(counts::Unit::Words, p)?),
            "default.sentenceCount" => {
                Check::Count(counts::Count::parse(counts::Unit::Sentences, p)?)
            }
            "default.characterCount" => {
                Check::Count(counts::Count::parse(counts::Unit::Characters, p)?)
            }
            "default.jsonSchema" => Check::JsonSchema(json::JsonSchema::parse(p)?),
            "default.jsonKeys" => Check::JsonKeys(json::JsonKeys::parse(p)?),
            "default.validUrls" => Check::ValidUrls(urls::ValidUrls::parse(p)?),
            "default.containsCode" => Check::ContainsCode(code::ContainsCode::parse(p)?),
            "default.modelWhitelist" => Check::ModelWhitelist(model::ModelWhitelist::parse(p)?),
            "default.pii" => Check::Pii(pii::Pii::parse(p)?),
            "default.webhook" => Check::Webhook(webhook::Webhook::parse(p)?),
            other => {
                return Err(ConfigIssue::new(
                    "",
                    format!(
                        "unknown check {other:?}; known checks: {}",
                        KNOWN.join(", ")
                    ),
                ))
            }
        })
    }

    /// The check's id, one of [`KNOWN`].
    pub fn id(&self) -> &'static str {
        match self {
            Check::Regex(_) => "default.regexMatch",
            Check::Contains(_) => "default.contains",
            Check::EndsWith(_) => "default.endsWith",
            Check::Count(c) => c.id(),
            Check::JsonSchema(_) => "default.jsonSchema",
            Check::JsonKeys(_) => "default.jsonKeys",
            Check::ValidUrls(_) => "default.validUrls",
            Check::ContainsCode(_) => "default.containsCode",
            Check::ModelWhitelist(_) => "default.modelWhitelist",
            Check::Pii(_) => "default.pii",
            Check::Webhook(_) => "default.webhook",
        }
    }

    /// Whether the check calls the network (and so cannot run on a stream).
    pub fn needs_network(&self) -> bool {
        matches!(self, Check::ValidUrls(_) | Check::Webhook(_))
    }

    /// Whether the check may rewrite the text.
    pub fn may_rewrite(&self) -> bool {
        matches!(self, Check::Pii(p) if p.redacts())
    }

    /// Runs a check that needs no network. Network checks answer [`Outcome::skipped`].
    pub fn run_local(&self, input: &Input<'_>) -> Outcome {
        match self {
            Check::Regex(c) => c.run(input.text),
            Check::Contains(c) => c.run(input.text),
            Check::EndsWith(c) => c.run(input.text),
            Check::Count(c) => c.run(input.text),
            Check::JsonSchema(c) => c.run(input.text),
            Check::JsonKeys(c) => c.run(input.text),
            Check::ContainsCode(c) => c.run(input.text),
            Check::ModelWhitelist(c) => c.run(input.model),
            Check::Pii(c) => c.run(input.segments, input.can_rewrite),
            Check::ValidUrls(_) | Check::Webhook(_) => Outcome::skipped(
                "this check calls the network, which a streamed answer cannot wait for",
            ),
        }
    }

    /// Runs the check, calling the network if it must.
    pub async fn run(&self, input: &Input<'_>, net: &Net) -> Outcome {
        match self {
            Check::ValidUrls(c) => c.run(input.text, net).await,
            Check::Webhook(c) => c.run(input, net).await,
            other => other.run_local(input),
        }
    }

    /// On the beginning of a streamed answer: a failure that no later text can undo (a maximum
    /// exceeded, a forbidden word or pattern or PII found), else `None`. Checks that need the
    /// whole text (minimums, ends with, JSON) always answer `None`.
    pub fn run_partial(&self, text: &str) -> Option<Outcome> {
        match self {
            Check::Regex(c) => c.run_partial(text),
            Check::Contains(c) => c.run_partial(text),
            Check::Count(c) => c.run_partial(text),
            Check::ContainsCode(c) => c.run_partial(text),
            Check::Pii(c) => c.run_partial(text),
            _ => None,
        }
    }
}

/// Deserializes a check's parameters (`null` or absent means `{}`), naming the field at fault.
pub(crate) fn params<T: DeserializeOwned>(parameters: &Value) -> Result<T, ConfigIssue> {
    let empty = Value::Object(serde_json::Map::new());
    let value = if parameters.is_null() {
        &empty
    } else {
        parameters
    };
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let message = e.into_inner().to_string();
        // A missing field is reported at its parent: name the field itself.
        let missing = message
            .strip_prefix("missing field `")
            .and_then(|rest| rest.split('`').next());
        let path = match (path.as_str(), missing) {
            (".", Some(field)) => field.to_owned(),
            (".", None) => String::new(),
            (parent, Some(field)) => format!("{parent}.{field}"),
            (_, None) => path,
        };
        ConfigIssue::new(path, message)
    })
}

/// The first `max` characters of a text, for the data of a result.
pub(crate) fn excerpt(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// An input on the input side with this checked text, which is also the only segment.
    pub fn run(check: &Check, text: &str) -> Outcome {
        let segments = [text.to_owned()];
        check.run_local(&Input {
            side: Side::Input,
            text,
            segments: &segments,
            model: Some("gpt-test"),
            can_rewrite: true,
            request: &Value::Null,
            response: None,
        })
    }

    pub fn parse(id: &str, parameters: Value) -> Check {
        Check::parse(id, &parameters).unwrap_or_else(|e| panic!("{id}: {e:?}"))
    }

    /// The path and message of a parameter problem.
    pub fn issue(id: &str, parameters: Value) -> (String, String) {
        let e = Check::parse(id, &parameters).expect_err("parameters are refused");
        (e.path, e.message)
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    #[test]
    fn unknown_ids_list_the_known_ones() {
        let (path, message) = issue("default.nope", json!({}));
        assert_eq!(path, "");
        assert!(message.contains("default.regexMatch"), "{message}");
        assert!(message.contains("default.webhook"), "{message}");
    }

    #[test]
    fn every_known_id_parses_with_plausible_parameters() {
        let samples = [
            json!({"rule": "x"}),
            json!({"words": ["x"]}),
            json!({"suffix": "."}),
            json!({"maxWords": 3}),
            json!({"maxSentences": 3}),
            json!({"maxCharacters": 3}),
            json!({"schema": {"type": "object"}}),
            json!({"keys": ["a"]}),
            json!({}),
            json!({"format": "SQL"}),
            json!({"models": ["m"]}),
            json!({}),
            json!({"webhookURL": "http://127.0.0.1:9/x"}),
        ];
        for (id, p) in KNOWN.iter().zip(samples) {
            assert_eq!(parse(id, p).id(), *id);
        }
    }

    #[test]
    fn network_checks_are_skipped_where_nothing_may_wait() {
        let c = parse(
            "default.webhook",
            json!({"webhookURL": "http://127.0.0.1:9/"}),
        );
        assert!(c.needs_network());
        let out = run(&c, "x");
        assert!(out.verdict);
        assert_eq!(out.data["skipped"], true);
    }

    #[test]
    fn excerpts_cut_on_characters() {
        assert_eq!(excerpt("héllo", 2), "hé...");
        assert_eq!(excerpt("hi", 5), "hi");
    }
}
