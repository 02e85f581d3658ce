//! A JSON Schema subset for `default.jsonSchema`, compiled once.
//!
//! Supported keywords: `type` (one name or a list: `null`, `boolean`, `object`, `array`,
//! `number`, `integer`, `string`), `properties`, `required`, `additionalProperties` (a boolean
//! or a schema), `items` (one schema for every item), `minItems`, `maxItems`, `enum`, `const`,
//! `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum` (numbers), `minLength`,
//! `maxLength` (in characters), `pattern` (Rust regex syntax, unanchored as in JSON Schema).
//! Annotations (`title`, `description`, `$schema`, `$id`, `$comment`, `default`, `examples`,
//! `format`) are accepted and ignored. Any other keyword (`$ref`, `anyOf`, `oneOf`, `allOf`,
//! `not`, `if`, `patternProperties`...) is refused when the check is configured, rather than
//! silently not enforced. `true` and `false` are schemas too (accept all, accept none).

use std::collections::BTreeMap;

use regex::Regex;
use serde_json::{Map, Value};

use super::pattern::compile;

/// How deep schemas may nest.
const MAX_DEPTH: usize = 32;
/// The most violations reported.
const MAX_ERRORS: usize = 10;

const IGNORED: &[&str] = &[
    "title",
    "description",
    "$schema",
    "$id",
    "$comment",
    "default",
    "examples",
    "format",
];

pub const SUPPORTED: &[&str] = &[
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "maxItems",
    "enum",
    "const",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
];

const TYPES: &[&str] = &[
    "null", "boolean", "object", "array", "number", "integer", "string",
];

/// A compiled schema.
#[derive(Debug, Default)]
pub struct Schema {
    /// `false`: nothing is valid.
    never: bool,
    types: Option<Vec<String>>,
    properties: BTreeMap<String, Schema>,
    required: Vec<String>,
    /// `None`: any extra property; `Some(never-schema)`: none.
    additional: Option<Box<Schema>>,
    items: Option<Box<Schema>>,
    min_items: Option<u64>,
    max_items: Option<u64>,
    enumeration: Option<Vec<Value>>,
    constant: Option<Value>,
    minimum: Option<f64>,
    maximum: Option<f64>,
    exclusive_minimum: Option<f64>,
    exclusive_maximum: Option<f64>,
    min_length: Option<u64>,
    max_length: Option<u64>,
    pattern: Option<Regex>,
}

/// A problem with a schema: the path inside it and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaIssue {
    pub path: String,
    pub message: String,
}

impl Schema {
    /// Compiles a schema value.
    pub fn compile(value: &Value) -> Result<Schema, SchemaIssue> {
        compile_at(value, "", 0)
    }

    /// The violations of a value, at most ten, each `path: message` (`/a/0: expected string`).
    pub fn violations(&self, value: &Value) -> Vec<String> {
        let mut out = Vec::new();
        self.check(value, "", &mut out);
        out
    }

    fn check(&self, value: &Value, at: &str, out: &mut Vec<String>) {
        if out.len() >= MAX_ERRORS {
            return;
        }
        let mut fail = |message: String| {
            if out.len() < MAX_ERRORS {
                let at = if at.is_empty() { "/" } else { at };
                out.push(format!("{at}: {message}"));
            }
        };
        if self.never {
            fail("no value is allowed here".into());
            return;
        }
        if let Some(types) = &self.types {
            if !types.iter().any(|t| has_type(value, t)) {
                fail(format!(
                    "expected {}, got {}",
                    types.join(" or "),
                    type_name(value)
                ));
                return;
            }
        }
        if let Some(allowed) = &self.enumeration {
            if !allowed.iter().any(|a| json_eq(a, value)) {
                fail(format!("{value} is not one of the allowed values"));
            }
        }
        if let Some(c) = &self.constant {
            if !json_eq(c, value) {
                fail(format!("expected {c}"));
            }
        }
        match value {
            Value::Number(n) => {
                let x = n.as_f64().unwrap_or(f64::NAN);
                if self.minimum.is_some_and(|m| x < m) {
                    fail(format!("{n} is less than the minimum"));
                }
                if self.maximum.is_some_and(|m| x > m) {
                    fail(format!("{n} is greater than the maximum"));
                }
                if self.exclusive_minimum.is_some_and(|m| x <= m) {
                    fail(format!("{n} is not greater than the exclusive minimum"));
                }
                if self.exclusive_maximum.is_some_and(|m| x >= m) {
                    fail(format!("{n} is not less than the exclusive maximum"));
                }
            }
            Value::String(s) => {
                let len = s.chars().count() as u64;
                if self.min_length.is_some_and(|m| len < m) {
                    fail(format!(
                        "shorter than {} characters",
                        self.min_length.unwrap_or(0)
                    ));
                }
                if self.max_length.is_some_and(|m| len > m) {
                    fail(format!(
                        "longer than {} characters",
                        self.max_length.unwrap_or(0)
                    ));
                }
                if let Some(p) = &self.pattern {
                    if !p.is_match(s) {
                        fail(format!("does not match the pattern {}", p.as_str()));
                    }
                }
            }
            Value::Array(items) => {
                let n = items.len() as u64;
                if self.min_items.is_some_and(|m| n < m) {
                    fail(format!("fewer than {} items", self.min_items.unwrap_or(0)));
                }
                if self.max_items.is_some_and(|m| n > m) {
                    fail(format!("more than {} items", self.max_items.unwrap_or(0)));
                }
                if let Some(schema) = &self.items {
                    for (i, item) in items.iter().enumerate() {
                        schema.check(item, &format!("{at}/{i}"), out);
                    }
                }
            }
            Value::Object(map) => {
                for key in &self.required {
                    if !map.contains_key(key) {
                        fail(format!("missing required property {key:?}"));
                    }
                }
                for (key, item) in map {
                    let path = format!("{at}/{}", escape(key));
                    match (self.properties.get(key), &self.additional) {
                        (Some(schema), _) => schema.check(item, &path, out),
                        (None, Some(schema)) => schema.check(item, &path, out),
                        (None, None) => {}
                    }
                }
            }
            Value::Null | Value::Bool(_) => {}
        }
    }
}

fn compile_at(value: &Value, at: &str, depth: usize) -> Result<Schema, SchemaIssue> {
    let issue = |path: &str, message: String| SchemaIssue {
        path: path.to_owned(),
        message,
    };
    if depth > MAX_DEPTH {
        return Err(issue(at, format!("schemas nest at most {MAX_DEPTH} deep")));
    }
    let map = match value {
        Value::Bool(true) => return Ok(Schema::default()),
        Value::Bool(false) => {
            return Ok(Schema {
                never: true,
                ..Schema::default()
            })
        }
        Value::Object(map) => map,
        _ => return Err(issue(at, "a schema is an object or a boolean".into())),
    };
    let field = |key: &str| join(at, key);
    let mut schema = Schema::default();
    for (key, v) in map {
        let path = field(key);
        match key.as_str() {
            k if IGNORED.contains(&k) => {}
            "type" => schema.types = Some(types(v, &path)?),
            "properties" => {
                let Value::Object(props) = v else {
                    return Err(issue(&path, "must be an object of schemas".into()));
                };
                for (name, sub) in props {
                    let sub = compile_at(sub, &join(&path, name), depth + 1)?;
                    schema.properties.insert(name.clone(), sub);
                }
            }
            "required" => schema.required = strings(v, &path)?,
            "additionalProperties" => {
                schema.additional = match v {
                    Value::Bool(true) => None,
                    other => Some(Box::new(compile_at(other, &path, depth + 1)?)),
                }
            }
            "items" => schema.items = Some(Box::new(compile_at(v, &path, depth + 1)?)),
            "minItems" => schema.min_items = Some(count(v, &path)?),
            "maxItems" => schema.max_items = Some(count(v, &path)?),
            "minLength" => schema.min_length = Some(count(v, &path)?),
            "maxLength" => schema.max_length = Some(count(v, &path)?),
            "minimum" => schema.minimum = Some(number(v, &path)?),
            "maximum" => schema.maximum = Some(number(v, &path)?),
            "exclusiveMinimum" => schema.exclusive_minimum = Some(number(v, &path)?),
            "exclusiveMaximum" => schema.exclusive_maximum = Some(number(v, &path)?),
            "enum" => match v {
                Value::Array(values) if !values.is_empty() => {
                    schema.enumeration = Some(values.clone())
                }
                _ => return Err(issue(&path, "must be a non-empty list".into())),
            },
            "const" => schema.constant = Some(v.clone()),
            "pattern" => {
                let Value::String(source) = v else {
                    return Err(issue(&path, "must be a string".into()));
                };
                schema.pattern = Some(compile(source).map_err(|m| issue(&path, m))?);
            }
            other => {
                return Err(issue(
                    &path,
                    format!(
                        "the keyword {other:?} is not supported; supported keywords: {}",
                        SUPPORTED.join(", ")
                    ),
                ))
            }
        }
    }
    Ok(schema)
}

fn join(at: &str, key: &str) -> String {
    if at.is_empty() {
        key.to_owned()
    } else {
        format!("{at}.{key}")
    }
}

fn types(v: &Value, path: &str) -> Result<Vec<String>, SchemaIssue> {
    let names = match v {
        Value::String(s) => vec![s.clone()],
        Value::Array(_) => strings(v, path)?,
        _ => Vec::new(),
    };
    if names.is_empty() || names.iter().any(|n| !TYPES.contains(&n.as_str())) {
        return Err(SchemaIssue {
            path: path.to_owned(),
            message: format!("must be one of {} or a list of them", TYPES.join(", ")),
        });
    }
    Ok(names)
}

fn strings(v: &Value, path: &str) -> Result<Vec<String>, SchemaIssue> {
    let list = v.as_array().and_then(|items| {
        items
            .iter()
            .map(|i| i.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
    });
    list.ok_or_else(|| SchemaIssue {
        path: path.to_owned(),
        message: "must be a list of strings".into(),
    })
}

fn count(v: &Value, path: &str) -> Result<u64, SchemaIssue> {
    v.as_u64().ok_or_else(|| SchemaIssue {
        path: path.to_owned(),
        message: "must be a whole number of at least 0".into(),
    })
}

fn number(v: &Value, path: &str) -> Result<f64, SchemaIssue> {
    v.as_f64().ok_or_else(|| SchemaIssue {
        path: path.to_owned(),
        message: "must be a number".into(),
    })
}

fn has_type(value: &Value, name: &str) -> bool {
    match name {
        "null" => value.is_null(),
        "boolean" => value.is_boolean(),
        "object" => value.is_object(),
        "array" => value.is_array(),
        "number" => value.is_number(),
        "integer" => value.as_i64().is_some() || value.as_u64().is_some() || is_whole(value),
        "string" => value.is_string(),
        _ => false,
    }
}

/// `1.0` is an integer in JSON Schema.
fn is_whole(value: &Value) -> bool {
    value
        .as_f64()
        .is_some_and(|x| x.is_finite() && x.fract() == 0.0)
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Equality where numbers compare by value (`1` equals `1.0`).
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| json_eq(a, b))
        }
        (Value::Object(x), Value::Object(y)) => objects_eq(x, y),
        _ => a == b,
    }
}

fn objects_eq(x: &Map<String, Value>, y: &Map<String, Value>) -> bool {
    x.len() == y.len()
        && x.iter()
            .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
}

/// A key as a JSON pointer token.
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema(v: Value) -> Schema {
        Schema::compile(&v).unwrap()
    }

    #[test]
    fn objects_properties_required_additional() {
        let s = schema(json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 2, "pattern": "^[A-Z]"},
                "age": {"type": "integer", "minimum": 0, "exclusiveMaximum": 150},
                "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}
            },
            "required": ["name", "age"],
            "additionalProperties": false
        }));
        assert!(s
            .violations(&json!({"name": "Al", "age": 3, "tags": ["a"]}))
            .is_empty());
        assert!(s.violations(&json!({"name": "Al", "age": 3.0})).is_empty());
        let v = s.violations(&json!({"name": "al", "age": 150, "tags": ["c", "a", "b"], "x": 1}));
        assert!(
            v.iter().any(|e| e.starts_with("/name: does not match")),
            "{v:?}"
        );
        assert!(v.iter().any(|e| e.starts_with("/age: ")), "{v:?}");
        assert!(
            v.iter().any(|e| e.starts_with("/tags: more than 2")),
            "{v:?}"
        );
        assert!(v.iter().any(|e| e.starts_with("/tags/0: ")), "{v:?}");
        assert!(v.iter().any(|e| e.starts_with("/x: no value")), "{v:?}");
        let v = s.violations(&json!({"age": 1.5}));
        assert!(
            v.iter()
                .any(|e| e.contains("missing required property \"name\"")),
            "{v:?}"
        );
        assert!(v.iter().any(|e| e.contains("expected integer")), "{v:?}");
        assert_eq!(
            s.violations(&json!([1])),
            vec!["/: expected object, got array"]
        );
    }

    #[test]
    fn type_lists_const_and_boolean_schemas() {
        let s = schema(json!({"type": ["string", "null"], "maxLength": 3}));
        assert!(s.violations(&Value::Null).is_empty());
        assert!(!s.violations(&json!("abcd")).is_empty());
        assert!(schema(json!({"const": 1}))
            .violations(&json!(1.0))
            .is_empty());
        assert!(schema(json!(true)).violations(&json!({"a": 1})).is_empty());
        assert!(!schema(json!(false)).violations(&json!(1)).is_empty());
        let s = schema(json!({"additionalProperties": {"type": "number"}}));
        assert!(s.violations(&json!({"a": 1})).is_empty());
        assert_eq!(
            s.violations(&json!({"a/b": "x"})),
            vec!["/a~1b: expected number, got string"]
        );
    }

    #[test]
    fn unsupported_and_malformed_keywords_are_refused_with_their_path() {
        let e = Schema::compile(&json!({"properties": {"a": {"$ref": "#/x"}}})).unwrap_err();
        assert_eq!(e.path, "properties.a.$ref");
        assert!(e.message.contains("not supported"), "{}", e.message);
        let e = Schema::compile(&json!({"type": "text"})).unwrap_err();
        assert_eq!(e.path, "type");
        let e = Schema::compile(&json!({"minLength": -1})).unwrap_err();
        assert_eq!(e.path, "minLength");
        let e = Schema::compile(&json!({"pattern": "("})).unwrap_err();
        assert_eq!(e.path, "pattern");
        assert!(Schema::compile(&json!("object")).is_err());
        let mut deep = json!({});
        for _ in 0..40 {
            deep = json!({"items": deep});
        }
        assert!(Schema::compile(&deep).is_err());
        assert!(Schema::compile(&json!({"title": "t", "format": "email"})).is_ok());
    }

    #[test]
    fn at_most_ten_violations() {
        let s = schema(json!({"items": {"type": "string"}}));
        let many: Vec<_> = (0..50).collect();
        assert_eq!(s.violations(&json!(many)).len(), 10);
    }
}
