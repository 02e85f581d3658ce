//! Input checks shared by the endpoints: JSON bodies and queries (unknown fields refused,
//! every problem named by its path), lengths, ids, times, and the reference's shared
//! sub-objects `rate_limits` and `usage_limits`.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{AdminError, Result};
use crate::time::{self, Timestamp};

/// Longest `name`.
pub const MAX_NAME: usize = 255;
/// Longest `description`.
pub const MAX_DESCRIPTION: usize = 1024;
/// Largest `page_size` of a list.
pub const MAX_PAGE_SIZE: i64 = 100;
/// `page_size` when none is given.
pub const DEFAULT_PAGE_SIZE: i64 = 50;

/// Parses a JSON body into `T`; an empty body reads as `{}`.
pub fn json<T: DeserializeOwned>(body: &[u8]) -> Result<T> {
    let body: &[u8] = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        body
    };
    // Every body of the control plane is an object; serde would read `[]` as a struct with
    // every field absent.
    if body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
        return Err(AdminError::validation(
            "invalid type: the body must be a JSON object, not a list".to_owned(),
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            AdminError::validation(format!("the body is not valid JSON: {inner}"))
        } else if path == "." || path.is_empty() {
            AdminError::validation(strip_position(&inner.to_string()))
        } else {
            AdminError::field(&path, strip_position(&inner.to_string()))
        }
    })?;
    de.end()
        .map_err(|e| AdminError::validation(format!("the body is not valid JSON: {e}")))?;
    Ok(value)
}

/// serde_json ends messages with "at line 1 column 42": useless once the path is named.
fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(i) => message[..i].to_owned(),
        None => message.to_owned(),
    }
}

/// Parses a query string into `T`.
pub fn query<T: DeserializeOwned>(uri: &http::Uri) -> Result<T> {
    axum::extract::Query::<T>::try_from_uri(uri)
        .map(|q| q.0)
        .map_err(|e| {
            let text = e.body_text();
            let text = text
                .strip_prefix("Failed to deserialize query string: ")
                .unwrap_or(&text);
            AdminError::validation(format!("invalid query: {text}"))
        })
}

/// A required, non-blank name of at most 255 characters.
pub fn name(field: &str, value: &str) -> Result<String> {
    let trimmed = value.trim();
    if trimmed.is_empty() {
        return Err(AdminError::field(field, "must not be empty"));
    }
    max_len(field, trimmed, MAX_NAME)?;
    Ok(trimmed.to_owned())
}

pub fn max_len(field: &str, value: &str, max: usize) -> Result<()> {
    let n = value.chars().count();
    if n > max {
        return Err(AdminError::field(
            field,
            format!("must be at most {max} characters, got {n}"),
        ));
    }
    Ok(())
}

pub fn description(value: Option<String>) -> Result<Option<String>> {
    if let Some(d) = &value {
        max_len("description", d, MAX_DESCRIPTION)?;
    }
    Ok(value)
}

/// A UUID, returned in its canonical lowercase form.
pub fn uuid(field: &str, value: &str) -> Result<String> {
    uuid::Uuid::parse_str(value)
        .map(|u| u.to_string())
        .map_err(|_| AdminError::field(field, format!("must be a UUID, got {value:?}")))
}

pub fn is_uuid(value: &str) -> bool {
    uuid::Uuid::parse_str(value).is_ok()
}

/// An RFC 3339 time.
pub fn timestamp(field: &str, value: &str) -> Result<Timestamp> {
    time::parse(value).ok_or_else(|| {
        AdminError::field(
            field,
            format!("must be an RFC 3339 time like 2026-01-31T12:00:00Z, got {value:?}"),
        )
    })
}

/// A plausible e-mail address: one `@` between non-empty parts, no spaces, at most 320 characters.
pub fn email(field: &str, value: &str) -> Result<String> {
    let ok = value.len() <= 320
        && !value.chars().any(char::is_whitespace)
        && matches!(value.split_once('@'), Some((a, b)) if !a.is_empty() && b.contains('.') && !b.contains('@') && !b.starts_with('.') && !b.ends_with('.'));
    if !ok {
        return Err(AdminError::field(
            field,
            format!("{value:?} is not an e-mail address"),
        ));
    }
    Ok(value.to_owned())
}

/// `page_size` and `current_page` (0-based), both >= 0, `page_size` at most 100.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Page {
    pub size: i64,
    pub number: i64,
}

impl Page {
    pub fn new(size: Option<i64>, number: Option<i64>) -> Result<Page> {
        let size = size.unwrap_or(DEFAULT_PAGE_SIZE);
        if !(0..=MAX_PAGE_SIZE).contains(&size) {
            return Err(AdminError::field(
                "page_size",
                format!("must be between 0 and {MAX_PAGE_SIZE}, got {size}"),
            ));
        }
        let number = number.unwrap_or(0);
        if number < 0 {
            return Err(AdminError::field(
                "current_page",
                format!("must be >= 0, got {number}"),
            ));
        }
        Ok(Page { size, number })
    }

    pub fn offset(self) -> i64 {
        self.size.saturating_mul(self.number)
    }
}

/// `defaults.metadata` and the like: string values only.
pub type Metadata = BTreeMap<String, String>;

/// What a rate limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RateLimitType {
    Requests,
    Tokens,
}

/// Per minute, hour or day.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RateUnit {
    Rpm,
    Rph,
    Rpd,
}

/// The reference's `RateLimits`: `{type requests|tokens, unit rpm|rph|rpd, value int}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    #[serde(rename = "type")]
    pub kind: RateLimitType,
    pub unit: RateUnit,
    pub value: i64,
}

/// Checks a `rate_limits` list: each value >= 1, one limit per type and unit.
pub fn rate_limits(field: &str, limits: Vec<RateLimit>) -> Result<Vec<RateLimit>> {
    for (i, l) in limits.iter().enumerate() {
        if l.value < 1 {
            return Err(AdminError::field(
                &format!("{field}[{i}].value"),
                format!("must be >= 1, got {}", l.value),
            ));
        }
        if limits[..i]
            .iter()
            .any(|m| m.kind == l.kind && m.unit == l.unit)
        {
            return Err(AdminError::field(
                &format!("{field}[{i}]"),
                "repeats the type and unit of an earlier limit",
            ));
        }
    }
    Ok(limits)
}

/// What a usage limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UsageType {
    Cost,
    Tokens,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PeriodicReset {
    Weekly,
    Monthly,
}

/// The reference's `UsageLimits` as sent: `current_usage` is read-only (it may be sent back as
/// read, and is then ignored; `reset_usage` resets it).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageLimitsInput {
    pub credit_limit: i64,
    #[serde(rename = "type", default)]
    pub kind: Option<UsageType>,
    #[serde(default)]
    pub alert_threshold: Option<i64>,
    #[serde(default)]
    pub periodic_reset: Option<PeriodicReset>,
    #[serde(default)]
    pub periodic_reset_days: Option<i64>,
    #[serde(default)]
    pub next_usage_reset_at: Option<String>,
    #[serde(default)]
    pub current_usage: Option<f64>,
}

/// A checked `UsageLimits`, as stored (without `current_usage`, which is kept beside it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageLimits {
    pub credit_limit: i64,
    #[serde(rename = "type")]
    pub kind: UsageType,
    pub alert_threshold: Option<i64>,
    pub periodic_reset: Option<PeriodicReset>,
    pub periodic_reset_days: Option<i64>,
    pub next_usage_reset_at: Option<String>,
}

/// Checks a `UsageLimits`: `credit_limit` >= 1, `alert_threshold` in 1..credit_limit,
/// `periodic_reset_days` in 1..=365 and not with `periodic_reset`, times in RFC 3339.
pub fn usage_limits(field: &str, input: UsageLimitsInput) -> Result<UsageLimits> {
    let at = |name: &str| format!("{field}.{name}");
    if input.credit_limit < 1 {
        return Err(AdminError::field(
            &at("credit_limit"),
            format!("must be >= 1, got {}", input.credit_limit),
        ));
    }
    if let Some(t) = input.alert_threshold {
        if t < 1 || t >= input.credit_limit {
            return Err(AdminError::field(
                &at("alert_threshold"),
                format!(
                    "must be >= 1 and below credit_limit ({}), got {t}",
                    input.credit_limit
                ),
            ));
        }
    }
    if let Some(d) = input.periodic_reset_days {
        if !(1..=365).contains(&d) {
            return Err(AdminError::field(
                &at("periodic_reset_days"),
                format!("must be between 1 and 365, got {d}"),
            ));
        }
        if input.periodic_reset.is_some() {
            return Err(AdminError::field(
                &at("periodic_reset_days"),
                "cannot be set together with periodic_reset",
            ));
        }
    }
    let next_usage_reset_at = match &input.next_usage_reset_at {
        Some(t) => Some(time::format(timestamp(&at("next_usage_reset_at"), t)?)),
        None => None,
    };
    if let Some(u) = input.current_usage {
        if !u.is_finite() || u < 0.0 {
            return Err(AdminError::field(
                &at("current_usage"),
                format!("must be a number >= 0, got {u}"),
            ));
        }
    }
    Ok(UsageLimits {
        credit_limit: input.credit_limit,
        kind: input.kind.unwrap_or(UsageType::Cost),
        alert_threshold: input.alert_threshold,
        periodic_reset: input.periodic_reset,
        periodic_reset_days: input.periodic_reset_days,
        next_usage_reset_at,
    })
}

/// The number of items of a bulk call (`field`): 1 to `max`.
pub fn bulk_size(field: &str, len: usize, max: usize) -> Result<()> {
    if len == 0 || len > max {
        return Err(AdminError::field(
            field,
            format!("1 to {max} {field} per call; this has {len}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct AllOptional {
        #[serde(default)]
        #[allow(dead_code)]
        name: Option<String>,
    }

    #[test]
    fn a_list_is_not_an_empty_body() {
        let e = json::<AllOptional>(b" [] ").unwrap_err();
        assert!(e.to_string().contains("not a list") || format!("{e:?}").contains("not a list"));
        assert!(json::<AllOptional>(b"").is_ok());
        assert!(json::<AllOptional>(b"{}").is_ok());
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Body {
        name: String,
        #[serde(default)]
        usage_limits: Option<UsageLimitsInput>,
        #[serde(default)]
        rate_limits: Vec<RateLimit>,
    }

    fn err<T: std::fmt::Debug>(r: Result<T>) -> String {
        r.unwrap_err().message
    }

    #[test]
    fn bodies_name_the_bad_field() {
        assert_eq!(
            err(json::<Body>(br#"{"name": "a", "colour": 1}"#)),
            "colour: unknown field `colour`, expected one of `name`, `usage_limits`, `rate_limits`"
        );
        assert_eq!(err(json::<Body>(b"{}")), "missing field `name`");
        assert_eq!(
            err(json::<Body>(br#"{"name": "a", "rate_limits": [{"type": "requests", "unit": "rps", "value": 1}]}"#)),
            "rate_limits[0].unit: unknown variant `rps`, expected one of `rpm`, `rph`, `rpd`"
        );
        assert_eq!(
            err(json::<Body>(
                br#"{"name": "a", "usage_limits": {"credit_limit": 1.5}}"#
            )),
            "usage_limits.credit_limit: invalid type: floating point `1.5`, expected i64"
        );
        assert!(err(json::<Body>(b"{")).starts_with("the body is not valid JSON"));
        assert!(err(json::<Body>(br#"{"name": "a"} x"#)).starts_with("the body is not valid JSON"));
    }

    #[test]
    fn usage_limits_follow_the_reference() {
        let input =
            |v: serde_json::Value| -> UsageLimitsInput { serde_json::from_value(v).unwrap() };
        let ok = usage_limits(
            "usage_limits",
            input(serde_json::json!({"credit_limit": 100, "alert_threshold": 80, "periodic_reset": "monthly", "current_usage": 12.5})),
        )
        .unwrap();
        assert_eq!(ok.kind, UsageType::Cost);
        let bad = [
            (serde_json::json!({"credit_limit": 0}), "usage_limits.credit_limit: must be >= 1, got 0"),
            (serde_json::json!({"credit_limit": 10, "alert_threshold": 10}), "usage_limits.alert_threshold: must be >= 1 and below credit_limit (10), got 10"),
            (serde_json::json!({"credit_limit": 10, "periodic_reset_days": 366}), "usage_limits.periodic_reset_days: must be between 1 and 365, got 366"),
            (serde_json::json!({"credit_limit": 10, "periodic_reset_days": 7, "periodic_reset": "weekly"}), "usage_limits.periodic_reset_days: cannot be set together with periodic_reset"),
            (serde_json::json!({"credit_limit": 10, "next_usage_reset_at": "soon"}), "usage_limits.next_usage_reset_at: must be an RFC 3339 time like 2026-01-31T12:00:00Z, got \"soon\""),
            (serde_json::json!({"credit_limit": 10, "current_usage": -1}), "usage_limits.current_usage: must be a number >= 0, got -1"),
        ];
        for (v, want) in bad {
            assert_eq!(err(usage_limits("usage_limits", input(v))), want);
        }
    }

    #[test]
    fn rate_limits_and_small_checks() {
        let l = |value| RateLimit {
            kind: RateLimitType::Requests,
            unit: RateUnit::Rpm,
            value,
        };
        assert_eq!(
            err(rate_limits("rate_limits", vec![l(0)])),
            "rate_limits[0].value: must be >= 1, got 0"
        );
        assert_eq!(
            err(rate_limits("rate_limits", vec![l(1), l(2)])),
            "rate_limits[1]: repeats the type and unit of an earlier limit"
        );
        assert_eq!(name("name", "  a  ").unwrap(), "a");
        assert_eq!(err(name("name", " ")), "name: must not be empty");
        assert_eq!(
            err(name("name", &"x".repeat(256))),
            "name: must be at most 255 characters, got 256"
        );
        assert!(email("e", "a@b.co").is_ok());
        for bad in ["a", "a@b", "@b.co", "a b@c.d", "a@b@c.d"] {
            assert!(email("e", bad).is_err(), "{bad}");
        }
        assert_eq!(err(uuid("id", "x")), "id: must be a UUID, got \"x\"");
        assert_eq!(
            err(Page::new(Some(101), None)),
            "page_size: must be between 0 and 100, got 101"
        );
        assert_eq!(Page::new(Some(10), Some(2)).unwrap().offset(), 20);
    }
}
