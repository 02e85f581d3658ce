//! Text patterns: `default.regexMatch`, `default.contains`, `default.endsWith`.
//!
//! - `default.regexMatch` `{rule, not = false}`: passes when the regex matches the text (with
//!   `not`, when it does not). The regex syntax is Rust's `regex` crate (no look-around, no
//!   back-references), compiled once, at most 4096 characters and 1 MiB compiled.
//! - `default.contains` `{words, operator = any}`: passes when the text contains `any`, `all`
//!   or `none` of the words or phrases (case-sensitive substring match, as the reference does).
//! - `default.endsWith` `{suffix, not = false}`: passes when the text, trailing whitespace
//!   ignored, ends with the suffix.

use regex::{Regex, RegexBuilder};
use serde::Deserialize;
use serde_json::json;

use plugin_sdk::ConfigIssue;

use super::{excerpt, params, Outcome};

/// The longest regex source accepted.
pub const MAX_PATTERN_LEN: usize = 4096;
/// The most memory a compiled regex may take.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// Compiles a regex from a config, bounded in size.
pub fn compile(source: &str) -> Result<Regex, String> {
    if source.len() > MAX_PATTERN_LEN {
        return Err(format!(
            "the regex is {} characters long; at most {MAX_PATTERN_LEN} are accepted",
            source.len()
        ));
    }
    RegexBuilder::new(source)
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(2 * REGEX_SIZE_LIMIT)
        .build()
        .map_err(|e| format!("not a valid regex: {e}"))
}

#[derive(Debug)]
pub struct RegexMatch {
    regex: Regex,
    not: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RegexParams {
    rule: String,
    #[serde(default)]
    not: bool,
}

impl RegexMatch {
    pub fn parse(p: &serde_json::Value) -> Result<Self, ConfigIssue> {
        let p: RegexParams = params(p)?;
        if p.rule.is_empty() {
            return Err(ConfigIssue::new("rule", "must not be empty"));
        }
        let regex = compile(&p.rule).map_err(|m| ConfigIssue::new("rule", m))?;
        Ok(RegexMatch { regex, not: p.not })
    }

    pub fn run(&self, text: &str) -> Outcome {
        let found = self.regex.find(text);
        let verdict = found.is_some() != self.not;
        Outcome::of(
            verdict,
            json!({
                "regexPattern": self.regex.as_str(),
                "not": self.not,
                "matched": found.is_some(),
                "matchedText": found.map(|m| excerpt(m.as_str(), 200)),
                "explanation": match (found.is_some(), self.not) {
                    (true, false) => "the pattern matched the text",
                    (false, false) => "the pattern did not match the text",
                    (true, true) => "the pattern matched the text, which it must not",
                    (false, true) => "the pattern did not match the text, as required",
                },
            }),
        )
    }

    /// With `not`, a match in the beginning of a text is final.
    pub fn run_partial(&self, text: &str) -> Option<Outcome> {
        (self.not && self.regex.is_match(text)).then(|| self.run(text))
    }
}

/// `any`, `all` or `none`.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Operator {
    #[default]
    Any,
    All,
    None,
}

impl Operator {
    pub fn as_str(self) -> &'static str {
        match self {
            Operator::Any => "any",
            Operator::All => "all",
            Operator::None => "none",
        }
    }

    /// The verdict given how many of `total` items were found.
    pub fn verdict(self, found: usize, total: usize) -> bool {
        match self {
            Operator::Any => found > 0,
            Operator::All => found == total,
            Operator::None => found == 0,
        }
    }
}

#[derive(Debug)]
pub struct Contains {
    words: Vec<String>,
    operator: Operator,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ContainsParams {
    words: Vec<String>,
    #[serde(default)]
    operator: Operator,
}

impl Contains {
    pub fn parse(p: &serde_json::Value) -> Result<Self, ConfigIssue> {
        let p: ContainsParams = params(p)?;
        if p.words.is_empty() {
            return Err(ConfigIssue::new("words", "must hold at least one word"));
        }
        if let Some(i) = p.words.iter().position(String::is_empty) {
            return Err(ConfigIssue::new(format!("words[{i}]"), "must not be empty"));
        }
        Ok(Contains {
            words: p.words,
            operator: p.operator,
        })
    }

    pub fn run(&self, text: &str) -> Outcome {
        let (found, missing): (Vec<&String>, Vec<&String>) =
            self.words.iter().partition(|w| text.contains(w.as_str()));
        Outcome::of(
            self.operator.verdict(found.len(), self.words.len()),
            json!({
                "operator": self.operator.as_str(),
                "foundWords": found,
                "missingWords": missing,
            }),
        )
    }

    /// With `none`, a word found in the beginning of a text is final.
    pub fn run_partial(&self, text: &str) -> Option<Outcome> {
        (self.operator == Operator::None && self.words.iter().any(|w| text.contains(w.as_str())))
            .then(|| self.run(text))
    }
}

#[derive(Debug)]
pub struct EndsWith {
    suffix: String,
    not: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EndsWithParams {
    suffix: String,
    #[serde(default)]
    not: bool,
}

impl EndsWith {
    pub fn parse(p: &serde_json::Value) -> Result<Self, ConfigIssue> {
        let p: EndsWithParams = params(p)?;
        if p.suffix.is_empty() {
            return Err(ConfigIssue::new("suffix", "must not be empty"));
        }
        Ok(EndsWith {
            suffix: p.suffix,
            not: p.not,
        })
    }

    pub fn run(&self, text: &str) -> Outcome {
        let ends = text.trim_end().ends_with(&self.suffix);
        Outcome::of(
            ends != self.not,
            json!({
                "suffix": self.suffix,
                "not": self.not,
                "endsWith": ends,
                "textEnd": excerpt_end(text, 50),
            }),
        )
    }
}

/// The last `max` characters of a text.
fn excerpt_end(text: &str, max: usize) -> String {
    let trimmed = text.trim_end();
    let count = trimmed.chars().count();
    trimmed.chars().skip(count.saturating_sub(max)).collect()
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use serde_json::json;

    #[test]
    fn regex_match_and_not() {
        let c = parse("default.regexMatch", json!({"rule": "\\d{3}-\\d{4}"}));
        let out = run(&c, "call 555-1234 now");
        assert!(out.verdict);
        assert_eq!(out.data["matchedText"], "555-1234");
        assert!(!run(&c, "no number").verdict);

        let c = parse(
            "default.regexMatch",
            json!({"rule": "(?i)secret", "not": true}),
        );
        assert!(!run(&c, "the SECRET is").verdict);
        assert!(run(&c, "nothing here").verdict);
        assert!(c.run_partial("a secret").is_some_and(|o| !o.verdict));
        assert!(c.run_partial("a secr").is_none());
        // Without `not`, a prefix that does not match yet decides nothing.
        let c = parse("default.regexMatch", json!({"rule": "x"}));
        assert!(c.run_partial("abc").is_none());
    }

    #[test]
    fn regex_parameters_are_checked() {
        assert_eq!(issue("default.regexMatch", json!({})).0, "rule");
        let (path, message) = issue("default.regexMatch", json!({"rule": "a("}));
        assert_eq!(path, "rule");
        assert!(message.contains("not a valid regex"), "{message}");
        assert_eq!(issue("default.regexMatch", json!({"rule": 5})).0, "rule");
        assert_eq!(
            issue("default.regexMatch", json!({"rule": "a", "nto": true})).0,
            "nto"
        );
        let huge = "a".repeat(5000);
        assert_eq!(issue("default.regexMatch", json!({"rule": huge})).0, "rule");
        // A small pattern that compiles to a huge program is refused too.
        let (path, _) = issue(
            "default.regexMatch",
            json!({"rule": "\\w{500}\\w{500}\\w{500}"}),
        );
        assert_eq!(path, "rule");
    }

    #[test]
    fn contains_any_all_none() {
        let any = parse("default.contains", json!({"words": ["apple", "pear"]}));
        assert!(run(&any, "an apple").verdict);
        assert!(!run(&any, "a plum").verdict);
        let all = parse(
            "default.contains",
            json!({"words": ["apple", "pear"], "operator": "all"}),
        );
        assert!(!run(&all, "an apple").verdict);
        let out = run(&all, "apple and pear");
        assert!(out.verdict);
        assert_eq!(out.data["foundWords"], json!(["apple", "pear"]));
        let none = parse(
            "default.contains",
            json!({"words": ["apple"], "operator": "none"}),
        );
        assert!(!run(&none, "an apple").verdict);
        assert!(run(&none, "an Apple").verdict, "case-sensitive");
        assert!(none.run_partial("an app").is_none());
        assert!(none.run_partial("an apple").is_some());
        assert!(any.run_partial("an apple").is_none());
    }

    #[test]
    fn contains_parameters_are_checked() {
        assert_eq!(issue("default.contains", json!({"words": []})).0, "words");
        assert_eq!(
            issue("default.contains", json!({"words": ["a", ""]})).0,
            "words[1]"
        );
        let (path, message) = issue(
            "default.contains",
            json!({"words": ["a"], "operator": "some"}),
        );
        assert_eq!(path, "operator");
        assert!(message.contains("any"), "{message}");
    }

    #[test]
    fn ends_with() {
        let c = parse("default.endsWith", json!({"suffix": "Thanks."}));
        assert!(run(&c, "Done. Thanks.\n").verdict);
        let out = run(&c, "Done.");
        assert!(!out.verdict);
        assert_eq!(out.data["textEnd"], "Done.");
        let c = parse("default.endsWith", json!({"suffix": "?", "not": true}));
        assert!(!run(&c, "why?").verdict);
        assert!(c.run_partial("why?").is_none());
        assert_eq!(issue("default.endsWith", json!({"suffix": ""})).0, "suffix");
        assert_eq!(issue("default.endsWith", json!({})).0, "suffix");
    }
}
