//! Secrets out of logged bodies, and bodies cut to size.
//!
//! The redaction is a single pass over the text that recognises JSON strings, keys and values
//! without building a document, so it also works on a body that was cut short (only a prefix
//! is kept), on a stream's concatenated server-sent events, and on text that is not JSON at all
//! (which comes out unchanged unless it holds a `"secret": ...` pair). The value of every key
//! that names a secret ([`is_secret_key`]), at any depth and of any type (a string, a number, a
//! whole object or array), becomes the string `"[REDACTED]"`. A secret value that the cut ends
//! in the middle of is replaced all the same: a partial secret is never kept.

/// What a secret value is replaced with (as a JSON string).
pub const REDACTED: &str = "\"[REDACTED]\"";

/// Appended to a body that was cut at `max_body_bytes` (counted inside the limit).
pub const TRUNCATED: &str = "...[truncated]";

/// Names (lower-case, letters and digits only) a secret key ends with: `api_key`, `x-api-key`,
/// `apiKey`, `Authorization`, `proxy-authorization`, `password`, `client_secret`, `token`,
/// `access_token`, `session_token`, `access_key`, `aws_secret_access_key`, `secret_key`,
/// `private_key`... while `max_tokens`, `prompt_tokens` or `tokenizer` are not secrets.
const SECRET_SUFFIXES: &[&str] = &[
    "apikey",
    "authorization",
    "password",
    "passwd",
    "secret",
    "token",
    "accesskey",
    "secretkey",
    "privatekey",
];

/// Whether a JSON key names a secret: compared without case and without the characters that
/// are not letters or digits (`api_key`, `API-Key` and `apiKey` are one name), the name is or
/// ends with one of `apikey`, `authorization`, `password`, `passwd`, `secret`, `token`,
/// `accesskey`, `secretkey`, `privatekey` (so `secret_access_key` and `session_token` are
/// secrets too).
pub fn is_secret_key(name: &str) -> bool {
    let normal: String = name
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    SECRET_SUFFIXES.iter().any(|s| normal.ends_with(s))
}

/// The text with the value of every secret key replaced by `"[REDACTED]"` (see the module
/// doc). Everything else, whitespace included, is kept as it was.
pub fn redact(text: &str) -> String {
    let b = text.as_bytes();
    let n = b.len();
    let mut out = String::with_capacity(n);
    let mut i = 0;
    while i < n {
        if b[i] != b'"' {
            // Copy up to the next string: structure outside strings is never rewritten.
            let next = text[i..].find('"').map_or(n, |p| i + p);
            out.push_str(&text[i..next]);
            i = next;
            continue;
        }
        let (end, closed) = string_end(b, i);
        let colon = skip_ws(b, end);
        if closed && colon < n && b[colon] == b':' && is_secret_key(&key_text(&text[i..end])) {
            let value = skip_ws(b, colon + 1);
            out.push_str(&text[i..value]);
            if value < n {
                out.push_str(REDACTED);
            }
            i = value_end(b, value);
        } else {
            out.push_str(&text[i..end]);
            i = end;
        }
    }
    out
}

/// A body as the log keeps it: the bytes (`raw`, which may be only a prefix of the body, as
/// `cut` says) read as UTF-8 (invalid sequences replaced), secrets redacted, and at most `max`
/// bytes long, ending with [`TRUNCATED`] when anything was left out.
pub fn render(raw: &[u8], cut: bool, max: usize) -> String {
    let text = utf8_prefix(raw, cut);
    let redacted = redact(&text);
    if !cut && redacted.len() <= max {
        return redacted;
    }
    let keep = floor_char_boundary(&redacted, max.saturating_sub(TRUNCATED.len()));
    let mut out = String::with_capacity(keep + TRUNCATED.len());
    out.push_str(&redacted[..keep]);
    out.push_str(TRUNCATED);
    out
}

/// The text of `raw`; when the bytes were cut, a character split by the cut is left out
/// rather than shown as a replacement character.
fn utf8_prefix(raw: &[u8], cut: bool) -> std::borrow::Cow<'_, str> {
    if cut {
        if let Err(e) = std::str::from_utf8(raw) {
            if e.error_len().is_none() {
                return String::from_utf8_lossy(&raw[..e.valid_up_to()]);
            }
        }
    }
    String::from_utf8_lossy(raw)
}

fn floor_char_boundary(s: &str, mut at: usize) -> usize {
    if at >= s.len() {
        return s.len();
    }
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// The index after the string that starts with the quote at `start`, and whether it was
/// closed (an unclosed one runs to the end of the text).
fn string_end(b: &[u8], start: usize) -> (usize, bool) {
    let mut i = start + 1;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' => return (i + 1, true),
            _ => i += 1,
        }
    }
    (b.len(), false)
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

/// The index after the JSON value that starts at `start`: a string, an object or array (with
/// everything nested in it), or a scalar up to the next delimiter; the end of the text when
/// the value is cut short.
fn value_end(b: &[u8], start: usize) -> usize {
    let n = b.len();
    if start >= n {
        return n;
    }
    match b[start] {
        b'"' => string_end(b, start).0,
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut i = start;
            while i < n {
                match b[i] {
                    b'"' => {
                        i = string_end(b, i).0;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return i + 1;
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            n
        }
        _ => {
            let mut i = start;
            while i < n && !matches!(b[i], b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r') {
                i += 1;
            }
            i
        }
    }
}

/// The name a quoted key stands for, its escapes (`\u005f`...) decoded when it has any.
fn key_text(quoted: &str) -> std::borrow::Cow<'_, str> {
    let inner = &quoted[1..quoted.len() - 1];
    if !inner.contains('\\') {
        return std::borrow::Cow::Borrowed(inner);
    }
    match serde_json::from_str::<String>(quoted) {
        Ok(s) => std::borrow::Cow::Owned(s),
        Err(_) => std::borrow::Cow::Borrowed(inner),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    #[test]
    fn secret_names_in_any_spelling() {
        for name in [
            "api_key",
            "apikey",
            "apiKey",
            "API-KEY",
            "x-api-key",
            "Authorization",
            "proxy-authorization",
            "password",
            "PassWord",
            "secret",
            "client_secret",
            "token",
            "access_token",
            "refresh_token",
            "access_key",
            "secret_access_key",
            "aws_secret_access_key",
            "session_token",
            "aws_session_token",
            "secret_key",
            "private_key",
        ] {
            assert!(is_secret_key(name), "{name} should be a secret");
        }
        for name in [
            "max_tokens",
            "prompt_tokens",
            "completion_tokens",
            "total_tokens",
            "tokens",
            "tokenizer",
            "model",
            "key",
            "messages",
            "content",
            "secretary_name",
        ] {
            assert!(!is_secret_key(name), "{name} should not be a secret");
        }
    }

    #[test]
    fn secrets_at_any_depth_are_redacted_and_the_rest_is_kept() {
        let body = json!({
            "model": "gpt-4o",
            "max_tokens": 5,
            "API_KEY": "sk-top",
            "metadata": {"user": "alice", "Password": "hunter2", "deeper": {"session_token": 42}},
            "tools": [{"name": "t", "auth": {"access_key": "AKIA", "secret_access_key": "s3"}}],
            "authorization": {"scheme": "Bearer", "value": "abc"},
            "token": null,
            "apiKey": ["a", "b"],
            "messages": [{"role": "user", "content": "my password is hunter3"}]
        });
        let text = serde_json::to_string_pretty(&body).unwrap();
        let out = redact(&text);
        let v: Value = serde_json::from_str(&out).expect("still JSON");
        assert_eq!(v["model"], "gpt-4o");
        assert_eq!(v["max_tokens"], 5);
        assert_eq!(v["API_KEY"], "[REDACTED]");
        assert_eq!(v["metadata"]["user"], "alice");
        assert_eq!(v["metadata"]["Password"], "[REDACTED]");
        assert_eq!(v["metadata"]["deeper"]["session_token"], "[REDACTED]");
        assert_eq!(v["tools"][0]["name"], "t");
        assert_eq!(v["tools"][0]["auth"]["access_key"], "[REDACTED]");
        assert_eq!(v["tools"][0]["auth"]["secret_access_key"], "[REDACTED]");
        assert_eq!(v["authorization"], "[REDACTED]");
        assert_eq!(v["token"], "[REDACTED]");
        assert_eq!(v["apiKey"], "[REDACTED]");
        // Secrets in prose are not JSON fields: kept.
        assert_eq!(v["messages"][0]["content"], "my password is hunter3");
        for secret in ["sk-top", "hunter2", "AKIA", "\"s3\"", "abc", "42"] {
            assert!(!out.contains(secret), "{secret} leaked: {out}");
        }
    }

    #[test]
    fn escaped_quotes_and_braces_inside_strings_do_not_confuse_it() {
        let text = r#"{"note":"a \"token\": \"x\" {[","secret":"p\"q}]","n":1,"s":"\\"}"#;
        let out = redact(text);
        let v: Value = serde_json::from_str(&out).expect("still JSON");
        assert_eq!(v["note"], "a \"token\": \"x\" {[");
        assert_eq!(v["secret"], "[REDACTED]");
        assert_eq!(v["n"], 1);
        assert_eq!(v["s"], "\\");
    }

    #[test]
    fn escaped_key_names_are_decoded() {
        let out = redact(r#"{"api\u005fkey":"sk-1","ok":true}"#);
        assert_eq!(out, r#"{"api\u005fkey":"[REDACTED]","ok":true}"#);
    }

    #[test]
    fn a_secret_cut_short_is_never_kept() {
        assert_eq!(
            redact(r#"{"model":"m","password":"hunte"#),
            r#"{"model":"m","password":"[REDACTED]""#
        );
        assert_eq!(
            redact(r#"{"auth":{"token":{"a":["sk-"#),
            r#"{"auth":{"token":"[REDACTED]""#
        );
        // Cut right after the colon: nothing of the value to hide.
        assert_eq!(redact(r#"{"token": "#), r#"{"token": "#);
    }

    #[test]
    fn text_that_is_not_json_is_kept() {
        for text in [
            "plain text password=hunter2",
            "it's a \"quote without end",
            "",
            "key: value\nAuthorization: Bearer x",
        ] {
            assert_eq!(redact(text), text);
        }
    }

    #[test]
    fn server_sent_events_are_redacted_event_by_event() {
        let text = "data: {\"id\":\"1\",\"token\":\"t1\"}\n\ndata: {\"id\":\"2\",\"choices\":[]}\n\ndata: [DONE]\n\n";
        assert_eq!(
            redact(text),
            "data: {\"id\":\"1\",\"token\":\"[REDACTED]\"}\n\ndata: {\"id\":\"2\",\"choices\":[]}\n\ndata: [DONE]\n\n"
        );
    }

    #[test]
    fn render_keeps_a_short_body_whole() {
        assert_eq!(
            render(br#"{"api_key":"k","a":1}"#, false, 64),
            r#"{"api_key":"[REDACTED]","a":1}"#
        );
    }

    #[test]
    fn render_cuts_long_bodies_within_the_limit() {
        let body = format!("{{\"content\":\"{}\"}}", "x".repeat(500));
        let out = render(body.as_bytes(), false, 100);
        assert_eq!(out.len(), 100);
        assert!(out.starts_with("{\"content\":\"xxx"));
        assert!(out.ends_with(TRUNCATED));
    }

    #[test]
    fn render_marks_a_prefix_and_never_splits_a_character() {
        // "é" is two bytes: the prefix ends inside the last one.
        let raw = "ééééé".as_bytes();
        let out = render(&raw[..9], true, 64);
        assert_eq!(out, format!("éééé{TRUNCATED}"));
        let out = render("éééééééééééééééééééééééééééééééééééé".as_bytes(), false, 64);
        assert!(out.len() <= 64 && out.ends_with(TRUNCATED), "{out}");
        // Invalid UTF-8 in the middle is replaced, not dropped.
        assert_eq!(render(b"a\xffb", false, 64), "a\u{fffd}b");
    }
}
