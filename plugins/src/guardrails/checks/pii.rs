//! `default.pii` `{categories = all, redact = false}`: finds personal data by pattern.
//!
//! Categories: `EMAIL_ADDRESS`, `PHONE_NUMBER`, `CREDIT_CARD` (13 to 19 digits, spaces or
//! dashes allowed, that pass the Luhn check), `IP_ADDRESS` (IPv4 and IPv6), `SSN` (US social
//! security numbers written `123-45-6789`). They are looked for in that order, each match
//! replaced by its placeholder before the next category is searched, so a card number is not
//! also counted as a phone number.
//!
//! Without `redact`, the check fails when it finds any. With `redact: true` it rewrites every
//! text of the request (all messages) or answer (all choices), each match becoming
//! `[EMAIL_ADDRESS]`, `[PHONE_NUMBER]`..., and passes: what goes on is clean; its hook reports
//! `transformed: true`. Where nothing can be rewritten (a streamed answer, whose text is already
//! on its way, or an `async` hook) a redacting check fails when it finds any, like a detecting
//! one.
//!
//! Phone numbers are the loosest pattern: 7 to 15 digits in groups, written with a leading
//! `+`, parentheses, separators, or at least 10 digits; dates (`2024-01-31`) are not phones.

use std::net::Ipv6Addr;
use std::sync::OnceLock;

use regex::Regex;
use serde::Deserialize;
use serde_json::{json, Value};

use plugin_sdk::ConfigIssue;

use super::{params, Outcome};

/// A kind of personal data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Category {
    #[serde(rename = "EMAIL_ADDRESS")]
    Email,
    #[serde(rename = "CREDIT_CARD")]
    Card,
    #[serde(rename = "SSN")]
    Ssn,
    #[serde(rename = "IP_ADDRESS")]
    Ip,
    #[serde(rename = "PHONE_NUMBER")]
    Phone,
}

/// The order categories are searched in.
const ORDER: [Category; 5] = [
    Category::Email,
    Category::Card,
    Category::Ssn,
    Category::Ip,
    Category::Phone,
];

impl Category {
    pub fn name(self) -> &'static str {
        match self {
            Category::Email => "EMAIL_ADDRESS",
            Category::Card => "CREDIT_CARD",
            Category::Ssn => "SSN",
            Category::Ip => "IP_ADDRESS",
            Category::Phone => "PHONE_NUMBER",
        }
    }

    fn placeholder(self) -> String {
        format!("[{}]", self.name())
    }

    fn regex(self) -> &'static Regex {
        static REGEXES: OnceLock<[Regex; 5]> = OnceLock::new();
        let all = REGEXES.get_or_init(|| {
            [
                r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}",
                r"\b\d(?:[ -]?\d){12,18}\b",
                r"\b\d{3}-\d{2}-\d{4}\b",
                r"(?i)\b(?:\d{1,3}\.){3}\d{1,3}\b|(?:[0-9a-f]{0,4}:){2,7}(?:[0-9a-f]{1,4}|:)?",
                r"(?:\+\d{1,3}[ .-]?)?(?:\(\d{1,5}\)[ .-]?)?\d{2,5}(?:[ .-]?\d{2,5}){1,4}",
            ]
            .map(|source| Regex::new(source).unwrap_or_else(|e| panic!("{source}: {e}")))
        });
        &all[ORDER.iter().position(|c| *c == self).unwrap_or(0)]
    }

    /// Whether a match of the pattern really is of this category.
    fn accepts(self, text: &str, start: usize, found: &str) -> bool {
        match self {
            Category::Email | Category::Ssn => true,
            Category::Card => luhn(found),
            Category::Ip => valid_ip(text, start, found),
            Category::Phone => phone_like(text, start, found),
        }
    }
}

/// The Luhn checksum of the digits of a card number.
fn luhn(number: &str) -> bool {
    let digits: Vec<u32> = number.chars().filter_map(|c| c.to_digit(10)).collect();
    if !(13..=19).contains(&digits.len()) {
        return false;
    }
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &d)| {
            if i % 2 == 1 {
                let d = d * 2;
                if d > 9 {
                    d - 9
                } else {
                    d
                }
            } else {
                d
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

/// A valid address; an IPv6 one must hold a digit and stand apart from words, so that code
/// such as `std::vec` or `Foo::bar` is not taken for one.
fn valid_ip(text: &str, start: usize, found: &str) -> bool {
    if found.contains(':') {
        let glued = |c: char| c.is_alphanumeric() || c == '_' || c == ':';
        let before = text[..start].chars().next_back();
        let after = text[start + found.len()..].chars().next();
        !before.is_some_and(glued)
            && !after.is_some_and(glued)
            && found.chars().any(|c| c.is_ascii_digit())
            && found.parse::<Ipv6Addr>().is_ok()
    } else {
        found.split('.').all(|octet| octet.parse::<u8>().is_ok())
    }
}

/// Phone-shaped: 7 to 15 digits, not glued to letters or digits, not a date, and written like a
/// phone number (`+`, parentheses, separators, or at least 10 digits).
fn phone_like(text: &str, start: usize, found: &str) -> bool {
    let before = text[..start].chars().next_back();
    let after = text[start + found.len()..].chars().next();
    if before.is_some_and(|c| c.is_alphanumeric() || c == '+')
        || after.is_some_and(char::is_alphanumeric)
    {
        return false;
    }
    let digits = found.chars().filter(char::is_ascii_digit).count();
    if !(7..=15).contains(&digits) || is_date(found) {
        return false;
    }
    let punctuated =
        found.starts_with('+') || found.contains('(') || found.contains([' ', '.', '-']);
    punctuated || digits >= 10
}

fn is_date(s: &str) -> bool {
    static DATE: OnceLock<Regex> = OnceLock::new();
    DATE.get_or_init(|| {
        Regex::new(r"^(?:\d{4}[-./]\d{1,2}[-./]\d{1,2}|\d{1,2}[-./]\d{1,2}[-./]\d{4})$")
            .unwrap_or_else(|e| panic!("{e}"))
    })
    .is_match(s)
}

/// What was found in a text: the text with placeholders, and each category's matches.
fn scan(text: &str, categories: &[Category]) -> (String, Vec<(Category, String)>) {
    let mut current = text.to_owned();
    let mut found = Vec::new();
    for category in ORDER.iter().filter(|c| categories.contains(c)) {
        let regex = category.regex();
        let mut out = String::with_capacity(current.len());
        let mut last = 0;
        for m in regex.find_iter(&current) {
            if m.as_str().is_empty() || !category.accepts(&current, m.start(), m.as_str()) {
                continue;
            }
            out.push_str(&current[last..m.start()]);
            out.push_str(&category.placeholder());
            found.push((*category, m.as_str().to_owned()));
            last = m.end();
        }
        if last > 0 {
            out.push_str(&current[last..]);
            current = out;
        }
    }
    (current, found)
}

#[derive(Debug)]
pub struct Pii {
    categories: Vec<Category>,
    redact: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PiiParams {
    #[serde(default)]
    categories: Option<Vec<Category>>,
    #[serde(default)]
    redact: bool,
}

impl Pii {
    pub fn parse(p: &Value) -> Result<Self, ConfigIssue> {
        let p: PiiParams = params(p)?;
        let categories = match p.categories {
            Some(c) if c.is_empty() => {
                return Err(ConfigIssue::new(
                    "categories",
                    "must hold at least one category (leave it out for all)",
                ))
            }
            Some(c) => c,
            None => ORDER.to_vec(),
        };
        Ok(Pii {
            categories,
            redact: p.redact,
        })
    }

    pub fn redacts(&self) -> bool {
        self.redact
    }

    /// Scans (and with `redact` and `can_rewrite`, rewrites) every segment.
    pub fn run(&self, segments: &[String], can_rewrite: bool) -> Outcome {
        let mut rewritten = Vec::with_capacity(segments.len());
        let mut found = Vec::new();
        for text in segments {
            let (clean, hits) = scan(text, &self.categories);
            found.extend(hits);
            rewritten.push(clean);
        }
        let mut counts = serde_json::Map::new();
        for (category, _) in &found {
            let n = counts
                .get(category.name())
                .and_then(Value::as_u64)
                .unwrap_or(0);
            counts.insert(category.name().into(), json!(n + 1));
        }
        let redacting = self.redact && can_rewrite && !found.is_empty();
        let data = json!({
            "categories": self.categories.iter().map(|c| c.name()).collect::<Vec<_>>(),
            "found": counts,
            "redacted": redacting,
            "explanation": match (found.is_empty(), redacting, self.redact) {
                (true, _, _) => "no personal data was found",
                (false, true, _) => "personal data was found and redacted",
                (false, false, true) => "personal data was found; a streamed answer cannot be redacted",
                (false, false, false) => "personal data was found",
            },
        });
        Outcome {
            verdict: found.is_empty() || redacting,
            data,
            error: None,
            rewritten: redacting.then_some(rewritten),
        }
    }

    /// Personal data in the beginning of a text is final (a stream cannot be redacted).
    pub fn run_partial(&self, text: &str) -> Option<Outcome> {
        let out = self.run(&[text.to_owned()], false);
        (!out.verdict).then_some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    fn redacted(text: &str) -> String {
        scan(text, &ORDER).0
    }

    #[test]
    fn each_category_is_found_and_replaced() {
        assert_eq!(
            redacted("mail bob.smith+x@mail.example.co.uk now"),
            "mail [EMAIL_ADDRESS] now"
        );
        assert_eq!(redacted("card 4111 1111 1111 1111."), "card [CREDIT_CARD].");
        assert_eq!(redacted("card 4111-1111-1111-1111"), "card [CREDIT_CARD]");
        assert_eq!(redacted("ssn 123-45-6789"), "ssn [SSN]");
        assert_eq!(redacted("from 192.168.1.100:80"), "from [IP_ADDRESS]:80");
        assert_eq!(
            redacted("v6 2001:db8::8a2e:370:7334 ok"),
            "v6 [IP_ADDRESS] ok"
        );
        assert_eq!(redacted("call +1 (555) 123-4567"), "call [PHONE_NUMBER]");
        assert_eq!(
            redacted("call 555-123-4567 or 020 7946 0958"),
            "call [PHONE_NUMBER] or [PHONE_NUMBER]"
        );
    }

    #[test]
    fn look_alikes_are_left_alone() {
        for text in [
            "card 4111 1111 1111 1112",
            "on 2024-01-31 at 12:30:45",
            "version 1.2.3 and 300.1.1.1",
            "order 1234567",
            "id ABC1234567890",
            "it costs 12.50 dollars",
            "use std::vec::Vec; Foo::bar; a::b",
        ] {
            assert_eq!(redacted(text), text);
        }
    }

    #[test]
    fn detection_fails_redaction_passes_and_rewrites_every_segment() {
        let detect = parse("default.pii", json!({}));
        let out = run(&detect, "write to a@b.io");
        assert!(!out.verdict);
        assert_eq!(out.data["found"]["EMAIL_ADDRESS"], 1);
        assert!(out.rewritten.is_none());
        assert!(run(&detect, "nothing personal").verdict);

        let Check::Pii(redact) = parse(
            "default.pii",
            json!({"redact": true, "categories": ["EMAIL_ADDRESS"]}),
        ) else {
            unreachable!()
        };
        let segments = ["a@b.io and 555-123-4567".to_owned(), "c@d.io".to_owned()];
        let out = redact.run(&segments, true);
        assert!(out.verdict);
        assert_eq!(
            out.rewritten.unwrap(),
            vec!["[EMAIL_ADDRESS] and 555-123-4567", "[EMAIL_ADDRESS]"]
        );
        assert_eq!(out.data["found"]["EMAIL_ADDRESS"], 2);
        // A stream cannot be rewritten: the same check then fails.
        let out = redact.run(&segments, false);
        assert!(!out.verdict && out.rewritten.is_none());
        assert!(redact.run_partial("x a@b.io").is_some());
        assert!(redact.run_partial("x a@b").is_none());
    }

    #[test]
    fn categories_are_checked() {
        let (path, message) = issue("default.pii", json!({"categories": ["EMAIL"]}));
        assert_eq!(path, "categories[0]");
        assert!(message.contains("EMAIL_ADDRESS"), "{message}");
        assert_eq!(
            issue("default.pii", json!({"categories": []})).0,
            "categories"
        );
    }

    #[test]
    fn luhn_checks() {
        assert!(luhn("4111111111111111"));
        assert!(luhn("378282246310005"));
        assert!(!luhn("4111111111111112"));
        assert!(!luhn("123"));
    }

    use super::super::Check;
}
