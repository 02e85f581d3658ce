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

/// The categories whose pattern can match somewhere in `text`, found before any pattern runs:
/// most texts hold no `@`, no two colons a few hex digits apart and no run of digits long
/// enough for a card, an SSN, an address or a phone number, and then no pattern runs at all.
///
/// Each test is a necessary condition of its pattern and of what [`Category::accepts`] keeps:
/// an e-mail address holds `@`; an IPv6 address two colons with at most four hex digits
/// between them; a card number is a run of digits, spaces and dashes with 13 or more digits;
/// an SSN a run of digits and dashes with 9; an IPv4 address a run of digits and dots with 4
/// digits and 3 dots; a phone number a run of digits, spaces, dots, dashes, parentheses and `+`
/// with 7 digits. No match of those four holds more than two non-digits in a row, so 64 bytes
/// without a digit end every run: such blocks are skipped whole. Replacing a match by its
/// placeholder (letters, `_` and brackets) only cuts runs, so a category that cannot match the
/// original text cannot match it after the earlier categories' replacements either.
fn possible(text: &str, categories: &[Category]) -> Vec<Category> {
    let wanted = |c: Category| categories.contains(&c);
    let bytes = text.as_bytes();
    let mut found = Vec::with_capacity(categories.len());
    if wanted(Category::Email) && memchr::memchr(b'@', bytes).is_some() {
        found.push(Category::Email);
    }
    let ipv6 = wanted(Category::Ip) && near_colons(bytes);
    let (card, ssn, ipv4, phone) = digit_runs(bytes);
    for (category, possible) in [
        (Category::Card, card),
        (Category::Ssn, ssn),
        (Category::Ip, ipv4 || ipv6),
        (Category::Phone, phone),
    ] {
        if possible && wanted(category) {
            found.push(category);
        }
    }
    found
}

/// Two colons with at most four hex digits between them.
fn near_colons(bytes: &[u8]) -> bool {
    let mut previous: Option<usize> = None;
    for at in memchr::memchr_iter(b':', bytes) {
        if let Some(p) = previous {
            if at - p <= 5 && bytes[p + 1..at].iter().all(u8::is_ascii_hexdigit) {
                return true;
            }
        }
        previous = Some(at);
    }
    false
}

/// Whether `bytes` hold a run long enough for a card number, an SSN, an IPv4 address and a
/// phone number (see [`possible`]).
///
/// The runs are those of phone-number characters (digits, space, dot, dash, parentheses,
/// `+`), which hold the runs of each of the four: a card needs 13 digits in one, an SSN 9, a
/// phone number 7, an IPv4 address 4 digits and 3 dots. Bytes are taken 64 at a time as bit
/// masks (digit, run character, dot), and only the runs that hold a digit are looked at: in
/// prose that is a few per block.
fn digit_runs(bytes: &[u8]) -> (bool, bool, bool, bool) {
    let mut most = 0; // the most digits in one run
    let mut dotted = false; // a run with 4 digits and 3 dots
                            // The digits and dots of the run that reached the end of the previous block.
    let (mut carried_digits, mut carried_dots) = (0, 0);
    for block in bytes.chunks(64) {
        let [digit, class, dot] = block_masks(block);
        if digit == 0 {
            // No match holds more than two non-digits in a row: 64 end every run.
            (carried_digits, carried_dots) = (0, 0);
            continue;
        }
        // The run holding bit `at`, as a mask, with the carried counts when it starts the block.
        let run = |at: u32| -> (u64, u32, u32) {
            let end = at + (class >> at).trailing_ones();
            let outside = !class & ((1u64 << at) - 1);
            let start = 64 - outside.leading_zeros();
            let upto = if end >= 64 {
                u64::MAX
            } else {
                (1u64 << end) - 1
            };
            let mask = upto & !((1u64 << start) - 1);
            let (d, p) = if start == 0 {
                (carried_digits, carried_dots)
            } else {
                (0, 0)
            };
            (
                mask,
                d + (digit & mask).count_ones(),
                p + (dot & mask).count_ones(),
            )
        };
        let mut pending = digit;
        while pending != 0 {
            let (mask, digits, dots) = run(pending.trailing_zeros());
            most = most.max(digits);
            dotted |= digits >= 4 && dots >= 3;
            pending &= !mask;
        }
        let last = block.len() as u32 - 1;
        (carried_digits, carried_dots) = if class >> last & 1 == 1 {
            let (_, digits, dots) = run(last);
            (digits, dots)
        } else {
            (0, 0)
        };
    }
    (most >= 13, most >= 9, dotted, most >= 7)
}

/// Bit `i` of each mask tells whether byte `i` of a block of at most 64 is a digit, a
/// phone-number character, a dot. The comparisons are written byte by byte into arrays and
/// packed eight at a time, which compiles to vector instructions (about 0.3 ns a byte, against
/// 2 for setting bits one by one).
fn block_masks(block: &[u8]) -> [u64; 3] {
    let mut bytes = [0u8; 64];
    bytes[..block.len()].copy_from_slice(block);
    let (mut digit, mut class, mut dot) = ([0u8; 64], [0u8; 64], [0u8; 64]);
    for i in 0..64 {
        let b = bytes[i];
        let is_digit = b.wrapping_sub(b'0') < 10;
        let is_dot = b == b'.';
        digit[i] = u8::from(is_digit);
        dot[i] = u8::from(is_dot);
        class[i] = u8::from(
            is_digit | is_dot | (b == b' ') | (b == b'-') | (b == b'(') | (b == b')') | (b == b'+'),
        );
    }
    // Eight flags of 0 or 1, as the bytes of a word, become eight bits by one multiplication.
    let pack = |flags: &[u8; 64]| -> u64 {
        flags
            .chunks_exact(8)
            .enumerate()
            .map(|(k, eight)| {
                let word = u64::from_le_bytes(eight.try_into().unwrap_or_default());
                (word.wrapping_mul(0x0102_0408_1020_4080) >> 56) << (8 * k)
            })
            .fold(0, |mask, bits| mask | bits)
    };
    [pack(&digit), pack(&class), pack(&dot)]
}

/// What was found in a text: the text with placeholders (`None` when nothing was found), and
/// each category's matches.
fn scan(text: &str, categories: &[Category]) -> (Option<String>, Vec<(Category, String)>) {
    scan_for(text, &possible(text, categories))
}

/// [`scan`] for the patterns of `categories`, without looking first which can match.
fn scan_for(text: &str, categories: &[Category]) -> (Option<String>, Vec<(Category, String)>) {
    let mut found = Vec::new();
    let mut current: Option<String> = None;
    for category in ORDER.iter().filter(|c| categories.contains(c)) {
        let haystack = current.as_deref().unwrap_or(text);
        let regex = category.regex();
        let mut out = String::new();
        let mut last = 0;
        for m in regex.find_iter(haystack) {
            if m.as_str().is_empty() || !category.accepts(haystack, m.start(), m.as_str()) {
                continue;
            }
            if last == 0 {
                out.reserve(haystack.len());
            }
            out.push_str(&haystack[last..m.start()]);
            out.push_str(&category.placeholder());
            found.push((*category, m.as_str().to_owned()));
            last = m.end();
        }
        if last > 0 {
            out.push_str(&haystack[last..]);
            current = Some(out);
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
        let mut cleaned: Vec<Option<String>> = Vec::new();
        let mut found = Vec::new();
        for (i, text) in segments.iter().enumerate() {
            let (clean, hits) = scan(text, &self.categories);
            found.extend(hits);
            if let Some(clean) = clean {
                cleaned.resize(i + 1, None);
                cleaned[i] = Some(clean);
            }
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
        // Only a redaction copies the texts: each segment cleaned, or as it was.
        let rewritten = redacting.then(|| {
            cleaned.resize(segments.len(), None);
            cleaned
                .into_iter()
                .zip(segments)
                .map(|(clean, text)| clean.unwrap_or_else(|| text.clone()))
                .collect()
        });
        Outcome {
            verdict: found.is_empty() || redacting,
            data,
            error: None,
            rewritten,
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
        scan(text, &ORDER).0.unwrap_or_else(|| text.to_owned())
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
    fn looking_first_for_what_can_match_changes_no_result() {
        // Texts made of the characters the patterns care about, in every arrangement a small
        // generator reaches: what the prefilter lets through is what the patterns alone find.
        let alphabet: Vec<char> = "0123456789 -.:()+@abcfxyz_\n      ".chars().collect();
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        let samples = [
            "a@b.io",
            "4111 1111 1111 1111",
            "123-45-6789",
            "10.0.0.1",
            "fe80::1",
            "+1 (555) 123-4567",
            "call 555.123.4567",
        ];
        for _ in 0..20_000 {
            let mut text = String::new();
            for _ in 0..next(120) {
                if next(8) == 0 {
                    text.push_str(samples[next(samples.len())]);
                } else {
                    text.push(alphabet[next(alphabet.len())]);
                }
            }
            assert_eq!(scan(&text, &ORDER), scan_for(&text, &ORDER), "{text:?}");
        }
        // Prose with numbers in it runs no pattern at all.
        let prose = "Item 12 of the 2024 report: the quick brown fox, at 3.5 km/h. ";
        assert!(possible(&prose.repeat(20), &ORDER).is_empty());
    }

    #[test]
    fn block_masks_mark_each_byte() {
        let block = b"a1 .-(+)9x";
        let [digit, class, dot] = block_masks(block);
        assert_eq!(digit, 0b1_0000_0010);
        assert_eq!(class, 0b1_1111_1110);
        assert_eq!(dot, 0b1000);
        let full = [b'7'; 64];
        assert_eq!(block_masks(&full)[0], u64::MAX);
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
