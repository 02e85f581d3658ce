//! `pii-redactor`: replaces email addresses and phone numbers with placeholders, in requests
//! (before the provider sees them), in answers, and in streamed answers.
//!
//! Config (all optional):
//! ```json
//! {"email": "[EMAIL]", "phone": "[PHONE]"}
//! ```
//!
//! What counts (a heuristic, not a validator):
//! - an email: `local@domain.tld`, the local part of letters, digits and `._%+-`, the domain of
//!   letters, digits, `-` and dots, ending in a label of two letters or more;
//! - a phone number: digits with spaces, `-` or parentheses between them, 9 to 15 digits (7 to
//!   15 when it starts with `+`), not glued to letters or other digits.
//!
//! In a stream, text is held back until a word boundary that cannot be inside an email or a
//! phone number, then released redacted; the rest is released when the stream ends.
//!
//! Counters: `emails_redacted`, `phones_redacted`.

use gateway_guardrail::{
    counter_add, export_guardrail, ChatRequest, Guardrail, Message, Stream, Verdict,
};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default = "email_placeholder")]
    email: String,
    #[serde(default = "phone_placeholder")]
    phone: String,
}

fn email_placeholder() -> String {
    "[EMAIL]".into()
}

fn phone_placeholder() -> String {
    "[PHONE]".into()
}

impl Default for Config {
    fn default() -> Self {
        Config {
            email: email_placeholder(),
            phone: phone_placeholder(),
        }
    }
}

#[derive(Default)]
struct PiiRedactor {
    config: Config,
}

impl Guardrail for PiiRedactor {
    fn init(&mut self, config: &str) -> Result<(), String> {
        self.config = serde_json::from_str(config).map_err(|e| e.to_string())?;
        Ok(())
    }

    fn check_request(&self, request: &ChatRequest) -> Verdict {
        let mut changed = false;
        let messages = request
            .messages
            .iter()
            .map(|m| {
                let content = self.redact(&m.content);
                changed |= content != m.content;
                Message {
                    content,
                    ..m.clone()
                }
            })
            .collect();
        if changed {
            Verdict::RewriteMessages(messages)
        } else {
            Verdict::Allow
        }
    }

    fn check_response(&self, _request: &ChatRequest, text: &str) -> Verdict {
        let redacted = self.redact(text);
        if redacted == text {
            Verdict::Allow
        } else {
            Verdict::RewriteText(redacted)
        }
    }

    fn check_stream_delta(&self, stream: &mut Stream, _delta: &str) -> Verdict {
        let pending = &stream.text[stream.cursor..];
        let Some(cut) = safe_cut(pending) else {
            return Verdict::RewriteText(String::new());
        };
        let released = self.redact(&pending[..cut]);
        stream.cursor += cut;
        Verdict::RewriteText(released)
    }

    fn check_stream_end(&self, stream: &mut Stream) -> Verdict {
        let rest = self.redact(&stream.text[stream.cursor..]);
        stream.cursor = stream.text.len();
        Verdict::RewriteText(rest)
    }
}

export_guardrail!(PiiRedactor);

/// The end of the longest prefix of `text` that ends in whitespace after a character that
/// cannot be inside a phone number. An email has no whitespace, so neither is cut in two.
fn safe_cut(text: &str) -> Option<usize> {
    let mut cut = None;
    let mut prev: Option<char> = None;
    for (i, c) in text.char_indices() {
        if c.is_whitespace() {
            if let Some(p) = prev {
                if !p.is_whitespace() && !p.is_ascii_digit() && !matches!(p, '(' | ')' | '-' | '+')
                {
                    cut = Some(i + c.len_utf8());
                }
            }
        }
        prev = Some(c);
    }
    cut
}

impl PiiRedactor {
    fn redact(&self, text: &str) -> String {
        let (text, emails) = redact_emails(text, &self.config.email);
        let (text, phones) = redact_phones(&text, &self.config.phone);
        if emails > 0 {
            counter_add("emails_redacted", emails);
        }
        if phones > 0 {
            counter_add("phones_redacted", phones);
        }
        text
    }
}

fn is_local_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '%' | '+' | '-')
}

fn is_domain_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '-')
}

/// Replaces each email address; the text and how many were replaced.
fn redact_emails(text: &str, placeholder: &str) -> (String, u64) {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut count = 0;
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'@' {
            i += 1;
            continue;
        }
        let mut start = i;
        while start > copied && is_local_char(bytes[start - 1] as char) {
            start -= 1;
        }
        let mut end = i + 1;
        while end < bytes.len() && is_domain_char(bytes[end] as char) {
            end += 1;
        }
        // A sentence's full stop is not part of the domain.
        while end > i + 1 && matches!(bytes[end - 1], b'.' | b'-') {
            end -= 1;
        }
        let domain = &text[i + 1..end];
        let tld_ok = domain.rsplit_once('.').is_some_and(|(host, tld)| {
            !host.is_empty() && tld.len() >= 2 && tld.chars().all(|c| c.is_ascii_alphabetic())
        });
        if start < i && tld_ok {
            out.push_str(&text[copied..start]);
            out.push_str(placeholder);
            copied = end;
            count += 1;
            i = end;
        } else {
            i += 1;
        }
    }
    out.push_str(&text[copied..]);
    (out, count)
}

/// Replaces each phone number; the text and how many were replaced.
fn redact_phones(text: &str, placeholder: &str) -> (String, u64) {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut count = 0;
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let starts = (c == b'+' || c == b'(' || c.is_ascii_digit())
            && (i == 0 || !(bytes[i - 1] as char).is_ascii_alphanumeric());
        if !starts {
            i += 1;
            continue;
        }
        let mut end = i + usize::from(c == b'+');
        let mut digits = 0;
        while end < bytes.len() {
            match bytes[end] {
                b'0'..=b'9' => digits += 1,
                b' ' | b'-' | b'(' | b')' => {}
                _ => break,
            }
            end += 1;
        }
        // Trailing separators are not part of the number.
        while end > i && !bytes[end - 1].is_ascii_digit() {
            end -= 1;
        }
        let glued = end < bytes.len() && (bytes[end] as char).is_ascii_alphanumeric();
        let min = if c == b'+' { 7 } else { 9 };
        if !glued && (min..=15).contains(&digits) {
            out.push_str(&text[copied..i]);
            out.push_str(placeholder);
            copied = end;
            count += 1;
            i = end;
        } else {
            i = end.max(i + 1);
        }
    }
    out.push_str(&text[copied..]);
    (out, count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emails_and_phones_are_found() {
        let (t, n) = redact_emails("mail jane.doe+x@example.co.uk. or a@b", "[E]");
        assert_eq!((t.as_str(), n), ("mail [E]. or a@b", 1));
        let (t, n) = redact_phones("call +1 (555) 123-4567, not 2024-01-01 or 12", "[P]");
        assert_eq!((t.as_str(), n), ("call [P], not 2024-01-01 or 12", 1));
        assert_eq!(safe_cut("write to a@b.com now "), Some(21));
        assert_eq!(safe_cut("call 555 123"), Some(5));
    }
}
