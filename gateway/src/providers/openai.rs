//! OpenAI wire format: the client's own format, so requests pass through without a re-encode
//! unless a target overrides body fields; usage is read from the answer for logs and metrics.

use std::sync::LazyLock;

use bytes::Bytes;
use memchr::memmem;
use serde::Deserialize;
use serde_json::{Map, Value};

use plugin_sdk::llm::LlmRequest;
use plugin_sdk::{GatewayError, Usage};

use super::{Encoded, Outgoing, WireFormat};

/// `api-version` for Azure OpenAI when the client sends no `x-gw-azure-api-version`.
pub const AZURE_DEFAULT_API_VERSION: &str = "2024-10-21";

/// The request for an OpenAI-format provider: the client's bytes (with overrides) to the client's
/// path. Azure OpenAI addresses a deployment instead: `/deployments/{id}<path>?api-version=...`.
pub fn encode(out: &Outgoing<'_>) -> Result<Encoded, GatewayError> {
    let body = if adds_stream_usage(out) {
        with_stream_usage(out.raw)
    } else {
        out.raw.clone()
    };
    if out.spec.id != "azure-openai" {
        return Ok(Encoded::new(body, out.suffix, WireFormat::OpenAi));
    }
    let deployment = out.target.setting("azure_deployment_id").ok_or_else(|| {
        GatewayError::invalid_param(
            "x-gw-azure-deployment-id",
            "azure-openai needs the deployment: send x-gw-azure-deployment-id",
        )
    })?;
    let version = out
        .target
        .setting("azure_api_version")
        .unwrap_or(AZURE_DEFAULT_API_VERSION);
    let mut encoded = Encoded::new(
        body,
        format!("/deployments/{}{}", path_segment(deployment), out.suffix),
        WireFormat::OpenAi,
    );
    encoded.query = Some(format!("api-version={}", path_segment(version)));
    Ok(encoded)
}

/// Whether the gateway asks the provider for the usage of a chat stream the client did not
/// ask it for (`stream_options.include_usage`), so that budgets are charged what was spent
/// (also when the client turned it off, which would otherwise let it choose its charge):
/// OpenAI, and Azure OpenAI from API version 2024-09-01 (older versions refuse the option).
/// The chunk is taken out again before the client sees it ([`without_usage_chunks`]).
pub fn adds_stream_usage(out: &Outgoing<'_>) -> bool {
    let takes_option = match out.spec.id {
        "openai" => true,
        "azure-openai" => {
            let version = out
                .target
                .setting("azure_api_version")
                .unwrap_or(AZURE_DEFAULT_API_VERSION);
            version.get(..10).is_some_and(|date| date >= "2024-09-01")
        }
        _ => false,
    };
    takes_option
        && matches!(out.request, LlmRequest::Chat(c) if c.stream == Some(true) && !c.wants_stream_usage())
}

/// The body with `stream_options.include_usage` true: inserted as the first field when the
/// body has no `stream_options` (no re-encoding), else set in the decoded body.
fn with_stream_usage(raw: &Bytes) -> Bytes {
    const OPTION: &[u8] = b"\"stream_options\":{\"include_usage\":true}";
    if memmem::find(raw, b"\"stream_options\"").is_some() {
        let Ok(mut body) = serde_json::from_slice::<Map<String, Value>>(raw) else {
            return raw.clone();
        };
        let mut options = match body.remove("stream_options") {
            Some(Value::Object(o)) => o,
            _ => Map::new(),
        };
        options.insert("include_usage".into(), Value::Bool(true));
        body.insert("stream_options".into(), Value::Object(options));
        return serde_json::to_vec(&body).map_or_else(|_| raw.clone(), Bytes::from);
    }
    let Some(open) = raw.iter().position(|b| *b == b'{') else {
        return raw.clone();
    };
    let empty = raw[open + 1..]
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|b| *b == b'}');
    let mut body = Vec::with_capacity(raw.len() + OPTION.len() + 1);
    body.extend_from_slice(&raw[..=open]);
    body.extend_from_slice(OPTION);
    if !empty {
        body.push(b',');
    }
    body.extend_from_slice(&raw[open + 1..]);
    Bytes::from(body)
}

/// Stream events without the usage chunk (`"choices":[]` with a `usage` object) the gateway
/// asked for on the client's behalf ([`adds_stream_usage`]); other events pass as they are.
pub fn without_usage_chunks(events: Bytes) -> Bytes {
    if memmem::find(&events, b"\"choices\":[]").is_none() {
        return events;
    }
    let mut kept = Vec::with_capacity(events.len());
    let mut rest = &events[..];
    while !rest.is_empty() {
        // One event: up to and including its blank line ("\n\n" or "\n\r\n", whichever
        // comes first, as the splitter cuts them).
        let lf = memmem::find(rest, b"\n\n").map(|i| i + 2);
        let crlf = memmem::find(rest, b"\n\r\n").map(|i| i + 3);
        let end = match (lf, crlf) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or(rest.len()),
        };
        let event = &rest[..end];
        let usage_only = memmem::find(event, b"\"choices\":[]").is_some()
            && memmem::find(event, b"\"usage\":{").is_some();
        if !usage_only {
            kept.extend_from_slice(event);
        }
        rest = &rest[end..];
    }
    Bytes::from(kept)
}

/// A value made safe as one path segment or query value: RFC 3986 unreserved characters stay,
/// everything else is percent-encoded.
pub fn path_segment(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The body to send: the client's bytes when nothing overrides them, else the body with the
/// target's `override_params` merged in (the target's values win).
pub fn encode_body(
    raw: &Bytes,
    override_params: &Map<String, Value>,
) -> Result<Bytes, GatewayError> {
    if override_params.is_empty() || raw.is_empty() {
        return Ok(raw.clone());
    }
    let mut body: Map<String, Value> = serde_json::from_slice(raw)
        .map_err(|e| GatewayError::invalid(format!("request body is not a JSON object: {e}")))?;
    for (k, v) in override_params {
        body.insert(k.clone(), v.clone());
    }
    serde_json::to_vec(&body)
        .map(Bytes::from)
        .map_err(|e| GatewayError::internal(format!("cannot encode request body: {e}")))
}

/// Just the fields of an answer the gateway records; everything else is skipped unparsed.
#[derive(Deserialize)]
struct AnswerSummary {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}

/// The model and usage of a complete JSON answer, when it has them.
///
/// Both are read where their keys stand (`model` near the start, `usage` near the end of an
/// answer whose choices may be long) and the whole answer is parsed only when that fails.
pub fn summarize_answer(body: &[u8]) -> (Option<String>, Option<Usage>) {
    // Built once: setting up a substring search costs more than the search in a short answer.
    static MODEL_KEY: LazyLock<memmem::Finder<'static>> =
        LazyLock::new(|| memmem::Finder::new(b"\"model\":"));
    static USAGE_KEY: LazyLock<memmem::FinderRev<'static>> =
        LazyLock::new(|| memmem::FinderRev::new(b"\"usage\":"));
    let model = MODEL_KEY.find(body).and_then(|at| {
        let key_len = MODEL_KEY.needle().len();
        plain_string_at(body, at, key_len).or_else(|| value_at::<String>(body, at, key_len))
    });
    let usage = USAGE_KEY.rfind(body).and_then(|at| {
        let key_len = USAGE_KEY.needle().len();
        plain_usage_at(body, at, key_len).or_else(|| value_at::<WireUsage>(body, at, key_len))
    });
    if let (Some(model), Some(usage)) = (model, usage) {
        return (
            Some(model),
            Some(Usage {
                prompt_tokens: usage.prompt_tokens,
                completion_tokens: usage.completion_tokens,
            }),
        );
    }
    full_summary(body)
}

/// The string after the key found at `at` (`key_len` bytes long) when it has no escapes (model
/// names never do): read without a parser. `None` sends the caller to [`value_at`].
fn plain_string_at(body: &[u8], at: usize, key_len: usize) -> Option<String> {
    if at > 0 && body[at - 1] == b'\\' {
        return None;
    }
    let rest = body[at + key_len..]
        .trim_ascii_start()
        .strip_prefix(b"\"")?;
    let end = memchr::memchr2(b'"', b'\\', rest)?;
    let text = &rest[..end];
    if rest[end] != b'"' || text.iter().any(|&b| b < 0x20) {
        return None;
    }
    std::str::from_utf8(text).ok().map(str::to_owned)
}

/// The usage object after the key found at `at` when it is flat up to its token counts, as
/// providers write it (`{"prompt_tokens":3,"completion_tokens":5,...}`): the two counts read
/// without a parser. Anything else (spaces, other keys first, a missing count) gives `None`,
/// which sends the caller to [`value_at`].
fn plain_usage_at(body: &[u8], at: usize, key_len: usize) -> Option<WireUsage> {
    if at > 0 && body[at - 1] == b'\\' {
        return None;
    }
    let rest = body[at + key_len..].strip_prefix(b"{\"prompt_tokens\":")?;
    let (prompt_tokens, rest) = leading_number(rest)?;
    let rest = rest.strip_prefix(b",\"completion_tokens\":")?;
    let (completion_tokens, rest) = leading_number(rest)?;
    matches!(rest.first(), Some(b',' | b'}')).then_some(WireUsage {
        prompt_tokens,
        completion_tokens,
    })
}

/// The decimal number at the start of `bytes`, and what follows it.
fn leading_number(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let digits = bytes.iter().take_while(|b| b.is_ascii_digit()).count();
    let number = std::str::from_utf8(&bytes[..digits]).ok()?.parse().ok()?;
    Some((number, &bytes[digits..]))
}

/// The JSON value after the key found at `at` (`key_len` bytes long), if it parses as `T`. A key
/// inside a string value cannot match: its quotes would be escaped.
fn value_at<T: serde::de::DeserializeOwned>(body: &[u8], at: usize, key_len: usize) -> Option<T> {
    if at > 0 && body[at - 1] == b'\\' {
        return None;
    }
    let rest = &body[at + key_len..];
    serde_json::Deserializer::from_slice(rest)
        .into_iter::<T>()
        .next()?
        .ok()
}

fn full_summary(body: &[u8]) -> (Option<String>, Option<Usage>) {
    match serde_json::from_slice::<AnswerSummary>(body) {
        Ok(s) => (
            s.model,
            s.usage.map(|u| Usage {
                prompt_tokens: u.prompt_tokens,
                completion_tokens: u.completion_tokens,
            }),
        ),
        Err(_) => (None, None),
    }
}

/// The model and usage carried by one stream event's data, if any.
pub fn summarize_chunk(data: &[u8]) -> (Option<String>, Option<Usage>) {
    if data == b"[DONE]" {
        return (None, None);
    }
    full_summary(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_usage_chunk_the_client_did_not_ask_for_is_asked_for_and_taken_out() {
        let raw = Bytes::from_static(br#"{"model":"a","stream":true}"#);
        let body: Value = serde_json::from_slice(&with_stream_usage(&raw)).unwrap();
        assert_eq!(
            body,
            json!({"stream_options": {"include_usage": true}, "model": "a", "stream": true})
        );
        let body: Value =
            serde_json::from_slice(&with_stream_usage(&Bytes::from_static(b" { } "))).unwrap();
        assert_eq!(body, json!({"stream_options": {"include_usage": true}}));
        // A client that turned it off, or sent null, does not choose its own charge.
        for sent in [json!({"include_usage": false}), Value::Null] {
            let raw = Bytes::from(json!({"model": "a", "stream_options": sent}).to_string());
            let body: Value = serde_json::from_slice(&with_stream_usage(&raw)).unwrap();
            assert_eq!(body["stream_options"]["include_usage"], true, "{sent}");
        }

        let events = Bytes::from_static(
            b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n\
              data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\n\n\
              data: [DONE]\n\n",
        );
        assert_eq!(
            &without_usage_chunks(events)[..],
            b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\ndata: [DONE]\n\n"
        );
        let plain = Bytes::from_static(b"data: {\"choices\":[{}]}\n\n");
        assert_eq!(without_usage_chunks(plain.clone()), plain);
    }

    #[test]
    fn passes_bytes_through_without_overrides() {
        let raw = Bytes::from_static(b"{\"model\":\"a\",  \"messages\":[]}");
        let out = encode_body(&raw, &Map::new()).unwrap();
        assert_eq!(out, raw);
    }

    #[test]
    fn override_params_win() {
        let raw = Bytes::from_static(br#"{"model":"a","temperature":1,"extra":{"x":1}}"#);
        let overrides = json!({"model": "b", "top_p": 0.5})
            .as_object()
            .unwrap()
            .clone();
        let out: Value = serde_json::from_slice(&encode_body(&raw, &overrides).unwrap()).unwrap();
        assert_eq!(
            out,
            json!({"model":"b","temperature":1,"top_p":0.5,"extra":{"x":1}})
        );
    }

    #[test]
    fn reads_usage_and_model() {
        let body = br#"{"id":"x","model":"gpt","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}}"#;
        let (model, usage) = summarize_answer(body);
        assert_eq!(model.as_deref(), Some("gpt"));
        assert_eq!(
            usage.unwrap(),
            Usage {
                prompt_tokens: 3,
                completion_tokens: 5
            }
        );
        assert_eq!(summarize_chunk(b"[DONE]"), (None, None));
        assert_eq!(summarize_answer(b"not json"), (None, None));
        // A key-like text inside content does not confuse it.
        let tricky = br#"{"model":"m","choices":[{"message":{"content":"say \"usage\": {}"}}],"usage":{"prompt_tokens":1,"completion_tokens":2}}"#;
        assert_eq!(
            summarize_answer(tricky).1.unwrap(),
            Usage {
                prompt_tokens: 1,
                completion_tokens: 2
            }
        );
        // The model as written: after spaces, with escapes, outside ASCII.
        for (body, want) in [
            (&br#"{"model":  "gpt-4o","usage":{}}"#[..], "gpt-4o"),
            (br#"{"model":"gpt\u002d4\"o","usage":{}}"#, "gpt-4\"o"),
            ("{\"model\":\"modèle\",\"usage\":{}}".as_bytes(), "modèle"),
        ] {
            assert_eq!(summarize_answer(body).0.as_deref(), Some(want));
        }
        // Usage written otherwise is still read, by the parser.
        for body in [
            &br#"{"model":"m","usage":{"completion_tokens":5,"prompt_tokens":3}}"#[..],
            br#"{"model":"m","usage": {"prompt_tokens": 3, "completion_tokens": 5}}"#,
            br#"{"model":"m","usage":{"prompt_tokens":3,"completion_tokens":5,"x":{"y":1}}}"#,
        ] {
            let usage = summarize_answer(body).1;
            assert_eq!(
                usage.map(|u| (u.prompt_tokens, u.completion_tokens)),
                Some((3, 5)),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        // A count that is not a whole number is not taken as one.
        assert_eq!(
            summarize_answer(
                br#"{"model":"m","usage":{"prompt_tokens":3.5,"completion_tokens":5}}"#
            )
            .1,
            None
        );
        // Without usage, the model still comes back.
        assert_eq!(
            summarize_answer(br#"{"model":"m","data":[]}"#),
            (Some("m".into()), None)
        );
    }
}
