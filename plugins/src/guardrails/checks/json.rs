//! JSON in the text: `default.jsonSchema` `{schema, not = false}` and `default.jsonKeys`
//! `{keys, operator = any}`.
//!
//! The JSON is looked for as a model writes it: the whole text, else each fenced code block
//! (```` ```json ... ``` ````), else each balanced `{...}` or `[...]` in the text (the first 16
//! candidates). `default.jsonSchema` passes when some candidate is valid against the schema (see
//! [`super::schema`] for the keywords enforced); `default.jsonKeys` reads the first candidate
//! that is an object and passes when it has `any`, `all` or `none` of the keys at its top level.
//! Without any JSON, both fail.

use serde::Deserialize;
use serde_json::{json, Value};

use plugin_sdk::ConfigIssue;

use super::pattern::Operator;
use super::schema::Schema;
use super::{excerpt, params, Outcome};

/// The most JSON candidates read from one text.
const MAX_CANDIDATES: usize = 16;
/// The most bytes the bracket scan reads in one text.
const SCAN_BUDGET: usize = 4 << 20;

/// The JSON values found in a text, in the order described in the module doc.
pub fn candidates(text: &str) -> Vec<Value> {
    let trimmed = text.trim();
    if let Ok(v) = serde_json::from_str::<Value>(trimmed) {
        return vec![v];
    }
    let mut out = Vec::new();
    for block in fenced_blocks(trimmed) {
        if out.len() >= MAX_CANDIDATES {
            return out;
        }
        if let Ok(v) = serde_json::from_str::<Value>(block.trim()) {
            out.push(v);
        }
    }
    let bytes = trimmed.as_bytes();
    // Many unclosed brackets would make the scan quadratic: bound the bytes it reads.
    let mut budget = SCAN_BUDGET;
    let mut i = 0;
    while i < bytes.len() && out.len() < MAX_CANDIDATES && budget > 0 {
        if matches!(bytes[i], b'{' | b'[') {
            if let Some(end) = balanced_end(bytes, i, &mut budget) {
                if let Ok(v) = serde_json::from_str::<Value>(&trimmed[i..=end]) {
                    // A fenced block's JSON is found again inline.
                    if !out.contains(&v) {
                        out.push(v);
                    }
                    i = end + 1;
                    continue;
                }
            }
        }
        i += 1;
    }
    out
}

/// The bodies of ```` ``` ```` fenced blocks; the language tag line is skipped.
fn fenced_blocks(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("```") {
        let after = &rest[start + 3..];
        let body_start = after.find('\n').map_or(after.len(), |n| n + 1);
        let body = &after[body_start..];
        let Some(end) = body.find("```") else {
            break;
        };
        out.push(&body[..end]);
        rest = &body[end + 3..];
    }
    out
}

/// The index of the bracket closing the one at `start`, skipping strings; each byte read
/// costs one unit of `budget`.
fn balanced_end(bytes: &[u8], start: usize, budget: &mut usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (i, &b) in bytes.iter().enumerate().skip(start) {
        *budget = budget.checked_sub(1)?;
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

#[derive(Debug)]
pub struct JsonSchema {
    schema: Schema,
    not: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SchemaParams {
    schema: Value,
    #[serde(default)]
    not: bool,
}

impl JsonSchema {
    pub fn parse(p: &Value) -> Result<Self, ConfigIssue> {
        let p: SchemaParams = params(p)?;
        let schema = Schema::compile(&p.schema).map_err(|e| {
            let path = if e.path.is_empty() {
                "schema".to_owned()
            } else {
                format!("schema.{}", e.path)
            };
            ConfigIssue::new(path, e.message)
        })?;
        Ok(JsonSchema { schema, not: p.not })
    }

    pub fn run(&self, text: &str) -> Outcome {
        let found = candidates(text);
        if found.is_empty() {
            return Outcome::of(
                self.not,
                json!({"explanation": "no JSON was found in the text", "not": self.not}),
            );
        }
        let mut last_violations = Vec::new();
        for candidate in &found {
            let violations = self.schema.violations(candidate);
            if violations.is_empty() {
                return Outcome::of(
                    !self.not,
                    json!({
                        "explanation": "the JSON is valid against the schema",
                        "not": self.not,
                        "matchedJson": excerpt(&candidate.to_string(), 500),
                    }),
                );
            }
            last_violations = violations;
        }
        Outcome::of(
            self.not,
            json!({
                "explanation": "no JSON in the text is valid against the schema",
                "not": self.not,
                "validationErrors": last_violations,
            }),
        )
    }
}

#[derive(Debug)]
pub struct JsonKeys {
    keys: Vec<String>,
    operator: Operator,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysParams {
    keys: Vec<String>,
    #[serde(default)]
    operator: Operator,
}

impl JsonKeys {
    pub fn parse(p: &Value) -> Result<Self, ConfigIssue> {
        let p: KeysParams = params(p)?;
        if p.keys.is_empty() {
            return Err(ConfigIssue::new("keys", "must hold at least one key"));
        }
        Ok(JsonKeys {
            keys: p.keys,
            operator: p.operator,
        })
    }

    pub fn run(&self, text: &str) -> Outcome {
        let Some(object) = candidates(text)
            .into_iter()
            .find_map(|v| v.as_object().cloned())
        else {
            return Outcome::of(
                false,
                json!({"explanation": "no JSON object was found in the text"}),
            );
        };
        let (present, missing): (Vec<&String>, Vec<&String>) = self
            .keys
            .iter()
            .partition(|k| object.contains_key(k.as_str()));
        Outcome::of(
            self.operator.verdict(present.len(), self.keys.len()),
            json!({
                "operator": self.operator.as_str(),
                "presentKeys": present,
                "missingKeys": missing,
            }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn json_is_found_whole_fenced_or_inline() {
        assert_eq!(candidates(" {\"a\": 1} "), vec![json!({"a": 1})]);
        assert_eq!(
            candidates("Here:\n```json\n{\"a\": [1, 2]}\n```\nbye"),
            vec![json!({"a": [1, 2]})]
        );
        assert_eq!(
            candidates("x {\"s\": \"}{\"} y [1] z {bad}"),
            vec![json!({"s": "}{"}), json!([1])]
        );
        assert!(candidates("no json here").is_empty());
        assert!(candidates("{{{{").is_empty());
        // Unclosed brackets cost a bounded scan, not a quadratic one.
        let hostile = "{".repeat(200_000);
        assert!(candidates(&hostile).is_empty());
    }

    #[test]
    fn json_schema() {
        let c = parse(
            "default.jsonSchema",
            json!({"schema": {"type": "object", "required": ["answer"]}}),
        );
        assert!(run(&c, "Sure: {\"answer\": 42}").verdict);
        let out = run(&c, "{\"other\": 1}");
        assert!(!out.verdict);
        assert!(out.data["validationErrors"][0]
            .as_str()
            .unwrap()
            .contains("answer"));
        let out = run(&c, "plain words");
        assert!(!out.verdict);
        assert_eq!(out.data["explanation"], "no JSON was found in the text");
        // Two candidates, the second valid.
        assert!(run(&c, "{\"x\": 1} then {\"answer\": 2}").verdict);

        let not = parse(
            "default.jsonSchema",
            json!({"schema": {"type": "object"}, "not": true}),
        );
        assert!(!run(&not, "{}").verdict);
        assert!(run(&not, "[]").verdict);
    }

    #[test]
    fn json_schema_parameters_name_the_schema_field() {
        assert_eq!(issue("default.jsonSchema", json!({})).0, "schema");
        assert_eq!(
            issue(
                "default.jsonSchema",
                json!({"schema": {"properties": {"a": {"type": 1}}}})
            )
            .0,
            "schema.properties.a.type"
        );
        assert_eq!(
            issue("default.jsonSchema", json!({"schema": 3})).0,
            "schema"
        );
    }

    #[test]
    fn json_keys() {
        let all = parse(
            "default.jsonKeys",
            json!({"keys": ["a", "b"], "operator": "all"}),
        );
        assert!(run(&all, "{\"a\": 1, \"b\": 2}").verdict);
        let out = run(&all, "{\"a\": 1}");
        assert!(!out.verdict);
        assert_eq!(out.data["missingKeys"], json!(["b"]));
        let none = parse(
            "default.jsonKeys",
            json!({"keys": ["password"], "operator": "none"}),
        );
        assert!(run(&none, "[1] {\"user\": \"x\"}").verdict);
        assert!(!run(&none, "{\"password\": \"x\"}").verdict);
        assert!(!run(&none, "no json").verdict);
        assert_eq!(issue("default.jsonKeys", json!({"keys": []})).0, "keys");
        assert_eq!(issue("default.jsonKeys", json!({"keys": "a"})).0, "keys");
    }
}
