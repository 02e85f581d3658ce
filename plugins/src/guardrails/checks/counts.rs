//! Length bounds: `default.wordCount` `{minWords, maxWords}`, `default.sentenceCount`
//! `{minSentences, maxSentences}`, `default.characterCount` `{minCharacters, maxCharacters}`,
//! each with `not = false`.
//!
//! Passes when `min <= count <= max` (a bound left out is open; at least one must be given);
//! with `not`, when the count is outside. Words are runs of non-whitespace; sentences are runs
//! of text ended by `.`, `!`, `?` (or the end of the text) that hold a letter or digit;
//! characters are Unicode scalar values.

use serde::Deserialize;
use serde_json::{json, Value};

use plugin_sdk::ConfigIssue;

use super::{params, Outcome};

/// What is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Words,
    Sentences,
    Characters,
}

impl Unit {
    /// The parameter names of the bounds.
    fn names(self) -> (&'static str, &'static str) {
        match self {
            Unit::Words => ("minWords", "maxWords"),
            Unit::Sentences => ("minSentences", "maxSentences"),
            Unit::Characters => ("minCharacters", "maxCharacters"),
        }
    }

    fn count(self, text: &str) -> u64 {
        let n = match self {
            Unit::Words => words(text),
            Unit::Sentences => sentences(text),
            Unit::Characters => text.chars().count(),
        };
        n as u64
    }
}

/// Words: runs of non-whitespace (Unicode's White_Space, as `str::split_whitespace`). ASCII
/// text, the common case, is counted byte by byte without decoding characters.
fn words(text: &str) -> usize {
    if !text.is_ascii() {
        return text.split_whitespace().count();
    }
    // `char::is_whitespace` on ASCII: tab, line feed, vertical tab, form feed, carriage
    // return, space.
    let space = |b: u8| (b == b' ') | (b.wrapping_sub(b'\t') < 5);
    let bytes = text.as_bytes();
    let first = bytes.first().is_some_and(|&b| !space(b));
    let Some(last) = bytes.len().checked_sub(1) else {
        return 0;
    };
    // A word starts at a non-space byte that begins the text or follows a space. Each pair of
    // neighbours is tested on its own, 255 at a time into a byte counter, so that the loop
    // runs on vectors.
    let (before, after) = (&bytes[..last], &bytes[1..]);
    let mut starts = 0;
    for (b, a) in before.chunks(255).zip(after.chunks(255)) {
        let mut n = 0u8;
        for i in 0..b.len() {
            n += u8::from(space(b[i]) & !space(a[i]));
        }
        starts += usize::from(n);
    }
    usize::from(first) + starts
}

/// Sentences: pieces ended by `.`, `!` or `?` that hold a letter or digit.
fn sentences(text: &str) -> usize {
    text.split(['.', '!', '?'])
        .filter(|s| s.chars().any(char::is_alphanumeric))
        .count()
}

#[derive(Debug)]
pub struct Count {
    unit: Unit,
    min: Option<u64>,
    max: Option<u64>,
    not: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CountParams {
    #[serde(
        default,
        alias = "minWords",
        alias = "minSentences",
        alias = "minCharacters"
    )]
    min: Option<u64>,
    #[serde(
        default,
        alias = "maxWords",
        alias = "maxSentences",
        alias = "maxCharacters"
    )]
    max: Option<u64>,
    #[serde(default)]
    not: bool,
}

impl Count {
    pub fn parse(unit: Unit, p: &Value) -> Result<Self, ConfigIssue> {
        let (min_name, max_name) = unit.names();
        // Only this unit's names are accepted (`maxWords` on a sentence count is a mistake).
        if let Value::Object(map) = p {
            for key in map.keys() {
                if key != min_name && key != max_name && key != "not" {
                    return Err(ConfigIssue::new(
                        key.clone(),
                        format!("unknown parameter; expected {min_name}, {max_name} or not"),
                    ));
                }
            }
        }
        let p: CountParams = params(p)?;
        if p.min.is_none() && p.max.is_none() {
            return Err(ConfigIssue::new(
                "",
                format!("give {min_name}, {max_name} or both"),
            ));
        }
        if let (Some(min), Some(max)) = (p.min, p.max) {
            if min > max {
                return Err(ConfigIssue::new(
                    min_name,
                    format!("{min_name} ({min}) is greater than {max_name} ({max})"),
                ));
            }
        }
        Ok(Count {
            unit,
            min: p.min,
            max: p.max,
            not: p.not,
        })
    }

    pub fn id(&self) -> &'static str {
        match self.unit {
            Unit::Words => "default.wordCount",
            Unit::Sentences => "default.sentenceCount",
            Unit::Characters => "default.characterCount",
        }
    }

    pub fn run(&self, text: &str) -> Outcome {
        let count = self.unit.count(text);
        let within =
            self.min.is_none_or(|min| count >= min) && self.max.is_none_or(|max| count <= max);
        let (min_name, max_name) = self.unit.names();
        Outcome::of(
            within != self.not,
            json!({
                "count": count,
                min_name: self.min,
                max_name: self.max,
                "not": self.not,
                "explanation": if within {
                    "the count is within the bounds"
                } else {
                    "the count is outside the bounds"
                },
            }),
        )
    }

    /// Counts only grow as a text goes on: a maximum exceeded is final (without `not`).
    pub fn run_partial(&self, text: &str) -> Option<Outcome> {
        let max = self.max.filter(|_| !self.not)?;
        (self.unit.count(text) > max).then(|| {
            let mut out = self.run(text);
            out.verdict = false;
            out
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn ascii_words_are_counted_as_split_whitespace_counts_them() {
        for text in [
            "",
            " ",
            "one",
            " one  two\nthree ",
            "a\u{b}b\u{c}c\rd\te",
            "x\u{1c}y",
            "tabs\t\tand\r\nlines\n",
        ] {
            assert_eq!(words(text), text.split_whitespace().count(), "{text:?}");
        }
        assert_eq!(words("no\u{a0}break here\u{3000}x"), 4);
    }

    #[test]
    fn words_sentences_characters() {
        let c = parse("default.wordCount", json!({"minWords": 2, "maxWords": 3}));
        assert!(!run(&c, "one").verdict);
        assert!(run(&c, " one  two\nthree ").verdict);
        let out = run(&c, "a b c d");
        assert!(!out.verdict);
        assert_eq!(out.data["count"], 4);
        assert_eq!(out.data["maxWords"], 3);

        let c = parse("default.sentenceCount", json!({"maxSentences": 2}));
        assert!(run(&c, "One. Two!").verdict);
        assert!(!run(&c, "One. Two! Three?").verdict);
        assert!(
            run(&c, "Wait... what?!").verdict,
            "runs of punctuation end one sentence"
        );

        let c = parse("default.characterCount", json!({"minCharacters": 3}));
        assert!(run(&c, "héé").verdict);
        assert!(!run(&c, "hé").verdict);

        let c = parse("default.wordCount", json!({"maxWords": 1, "not": true}));
        assert!(run(&c, "a b").verdict);
        assert!(!run(&c, "a").verdict);
    }

    #[test]
    fn an_exceeded_maximum_stops_a_stream_early() {
        let c = parse("default.wordCount", json!({"maxWords": 3}));
        assert!(c.run_partial("a b c").is_none());
        assert!(c.run_partial("a b c d").is_some_and(|o| !o.verdict));
        let min_only = parse("default.wordCount", json!({"minWords": 3}));
        assert!(min_only.run_partial("a").is_none());
        let negated = parse("default.wordCount", json!({"maxWords": 1, "not": true}));
        assert!(negated.run_partial("a b c").is_none());
    }

    #[test]
    fn bounds_are_checked() {
        assert_eq!(issue("default.wordCount", json!({})).0, "");
        assert_eq!(
            issue("default.wordCount", json!({"minWords": 5, "maxWords": 2})).0,
            "minWords"
        );
        assert_eq!(
            issue("default.wordCount", json!({"maxWords": -1})).0,
            "maxWords"
        );
        assert_eq!(
            issue("default.sentenceCount", json!({"maxWords": 3})).0,
            "maxWords"
        );
        assert_eq!(
            issue("default.characterCount", json!({"maxCharacters": "x"})).0,
            "maxCharacters"
        );
    }
}
