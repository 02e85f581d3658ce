//! Passthrough: any other provider path under `/v1`. Only the headers are read and rewritten;
//! the body streams both ways untouched through Pingora, and the answer is returned exactly as
//! the provider gave it (less hop-by-hop headers).

use std::time::Instant;

use pingora::http::RequestHeader;

use plugin_sdk::{Flow, GatewayError, PluginResponse, RequestCx};

use crate::routing;
use crate::server::Gateway;
use crate::upstream::Endpoint;

/// Where a passthrough request goes, decided in `request_filter`.
#[derive(Debug)]
pub struct PassthroughTarget {
    pub endpoint: std::sync::Arc<Endpoint>,
    pub path_and_query: String,
    /// The provider's credential header.
    pub auth: Option<(&'static str, String)>,
    /// Headers the provider needs, added when the client did not send them.
    pub defaults: &'static [(&'static str, &'static str)],
    /// When the request was handed to the upstream, for upstream latency.
    pub sent_at: Option<Instant>,
}

/// Reads what a passthrough answer says of its model and usage (`/v1/responses`,
/// `/v1/completions` and any other JSON or event-stream answer in OpenAI's shapes) without
/// holding the answer: its first [`HEAD_BYTES`] (where the model is named) and its last
/// [`TAIL_BYTES`] (where usage comes, in a whole answer and in a stream's last events).
#[derive(Debug, Default)]
pub struct AnswerSummary {
    head: Vec<u8>,
    tail: Vec<u8>,
}

const HEAD_BYTES: usize = 16 * 1024;
const TAIL_BYTES: usize = 64 * 1024;

impl AnswerSummary {
    /// Whether an answer with these headers can report usage: a 2xx JSON or event stream,
    /// not compressed.
    pub fn wanted(header: &pingora::http::ResponseHeader) -> bool {
        let content_type = header
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        // A compressed answer passes as it is; its usage is not read (the estimate is charged).
        let encoded = header
            .headers
            .get(http::header::CONTENT_ENCODING)
            .is_some_and(|v| v.as_bytes() != b"identity");
        header.status.is_success()
            && !encoded
            && (content_type.starts_with("application/json")
                || content_type.starts_with("text/event-stream"))
    }

    pub fn push(&mut self, data: &[u8]) {
        if self.head.len() < HEAD_BYTES {
            let take = (HEAD_BYTES - self.head.len()).min(data.len());
            self.head.extend_from_slice(&data[..take]);
        }
        if data.len() >= TAIL_BYTES {
            self.tail.clear();
            self.tail
                .extend_from_slice(&data[data.len() - TAIL_BYTES..]);
        } else {
            self.tail.extend_from_slice(data);
            // Trimmed in steps, so each byte is moved a bounded number of times.
            if self.tail.len() > 2 * TAIL_BYTES {
                self.tail.drain(..self.tail.len() - TAIL_BYTES);
            }
        }
    }

    /// The usage the answer reports: over every `"usage"` object in its tail, the largest
    /// `input_tokens` / `prompt_tokens` and the largest `output_tokens` /
    /// `completion_tokens` (Anthropic's streams report the two in different events; a
    /// client's own metadata named `usage` can only make the charge larger).
    pub fn usage(&self) -> Option<plugin_sdk::Usage> {
        // Exactly the answer's last TAIL_BYTES, however it was cut into reads.
        let tail = &self.tail[self.tail.len().saturating_sub(TAIL_BYTES)..];
        let mut found: Option<plugin_sdk::Usage> = None;
        for at in memchr::memmem::find_iter(tail, b"\"usage\"") {
            let Some(rest) = value_after_key(&tail[at + b"\"usage\"".len()..]) else {
                continue;
            };
            let Some(Ok(value)) = serde_json::Deserializer::from_slice(rest)
                .into_iter::<serde_json::Value>()
                .next()
            else {
                continue;
            };
            let count = |names: [&str; 2]| {
                names
                    .iter()
                    .find_map(|n| value.get(*n).and_then(serde_json::Value::as_u64))
            };
            let (prompt, completion) = (
                count(["input_tokens", "prompt_tokens"]),
                count(["output_tokens", "completion_tokens"]),
            );
            if prompt.is_none() && completion.is_none() {
                continue;
            }
            let u = found.get_or_insert_with(Default::default);
            u.prompt_tokens = u.prompt_tokens.max(prompt.unwrap_or(0));
            u.completion_tokens = u.completion_tokens.max(completion.unwrap_or(0));
        }
        found
    }

    /// The first `"model"` string of the answer's head.
    pub fn model(&self) -> Option<String> {
        memchr::memmem::find_iter(&self.head, b"\"model\"").find_map(|at| {
            let rest = value_after_key(&self.head[at + b"\"model\"".len()..])?;
            let rest = rest.strip_prefix(b"\"")?;
            let end = memchr::memchr(b'"', rest)?;
            let model = std::str::from_utf8(&rest[..end]).ok()?;
            (!model.is_empty() && !model.contains('\\')).then(|| model.to_owned())
        })
    }
}

/// What follows a JSON key: the bytes after its colon and the spaces around it; `None` when
/// no colon follows (the text was a value, not a key).
fn value_after_key(rest: &[u8]) -> Option<&[u8]> {
    let rest = rest.trim_ascii_start().strip_prefix(b":")?;
    Some(rest.trim_ascii_start())
}

/// Runs the request phase and picks the target; a plugin may answer instead.
pub async fn prepare(
    gw: &Gateway,
    cx: &mut RequestCx,
) -> Result<Result<PassthroughTarget, PluginResponse>, GatewayError> {
    if let Flow::Respond(r) = gw.pipeline.on_request(cx).await? {
        return Ok(Err(r));
    }
    let plan = cx.plan.clone().ok_or_else(|| {
        GatewayError::internal("no provider was selected: the pipeline needs provider_select")
    })?;
    let params = serde_json::Value::Null;
    let facts = crate::routing::strategy::RequestFacts {
        metadata: &cx.gw.metadata,
        params: &params,
        pathname: &cx.path,
    };
    let config_key = crate::llm::config_fingerprint_of(&plan);
    let is_open = |node: &crate::routing::config::Node| {
        gw.breakers.is_open(
            &crate::llm::breaker_key(&config_key, node),
            std::time::Instant::now(),
        )
    };
    let (mut target, option_index) = routing::select_target(
        &plan,
        gw.providers.as_ref(),
        cx.extensions.get::<plugin_sdk::Principal>(),
        &facts,
        &is_open,
    )?;
    cx.response.option_index = option_index;
    if let Flow::Respond(r) = gw.pipeline.on_route(cx, &mut target).await? {
        return Ok(Err(r));
    }
    target.fill_settings(&cx.gw.provider_settings.0);
    let resolved = routing::resolve(target, &gw.endpoints)?;
    cx.response.provider = Some(resolved.spec.id.to_owned());
    if resolved.spec.auth == crate::providers::AuthStyle::SigV4 {
        // A signature covers the body's hash, and passthrough bodies stream through unread.
        return Err(plugin_sdk::GatewayError::invalid(format!(
            "{} signs every request over its body, which passthrough does not read; \
             use the chat completions or embeddings routes",
            resolved.spec.id
        )));
    }
    let suffix = provider_suffix(cx.path.strip_prefix("/v1").unwrap_or(&cx.path))?;
    Ok(Ok(PassthroughTarget {
        path_and_query: resolved
            .endpoint
            .path_and_query(&suffix, cx.query.as_deref()),
        auth: resolved.auth_header(),
        defaults: match resolved.spec.format {
            crate::providers::WireFormat::Anthropic => &[(
                "anthropic-version",
                crate::providers::anthropic::DEFAULT_VERSION,
            )],
            _ => &[],
        },
        endpoint: resolved.endpoint,
        sent_at: None,
    }))
}

/// The client's path below `/v1` as the provider gets it, below the provider's base path: `.`
/// and `..` segments (also percent-encoded) are resolved within it, so no path leaves the
/// base path (an excess `..` stays at it); an encoded slash or a backslash, which a provider
/// might decode into a separator after that, is a 400.
fn provider_suffix(path: &str) -> Result<String, GatewayError> {
    // Most paths hold no dot segment, escape or backslash: they pass as they are.
    if !path.contains(['.', '%', '\\']) {
        return Ok(path.to_owned());
    }
    let mut kept: Vec<&str> = Vec::new();
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    let last = segments.len().saturating_sub(1);
    for (i, segment) in segments.iter().enumerate() {
        let lower = segment.to_ascii_lowercase();
        if lower.contains("%2f") || lower.contains("%5c") || segment.contains('\\') {
            return Err(GatewayError::invalid_param(
                "path",
                format!("the path {path:?} holds an encoded slash or a backslash"),
            ));
        }
        let dots = lower.replace("%2e", ".");
        let is_dot_segment = matches!(dots.as_str(), "." | "..");
        match dots.as_str() {
            "." => {}
            ".." => {
                kept.pop();
            }
            _ => kept.push(segment),
        }
        // A path ending in a dot segment still names a folder.
        if i == last && is_dot_segment {
            kept.push("");
        }
    }
    let mut out = String::with_capacity(path.len());
    for segment in kept {
        out.push('/');
        out.push_str(segment);
    }
    Ok(out)
}

/// Rewrites the client's request header for the provider: path, host, credential; the
/// gateway's own headers and hop-by-hop headers are removed.
pub fn rewrite_request(target: &PassthroughTarget, req: &mut RequestHeader) -> pingora::Result<()> {
    let uri: http::Uri = target.path_and_query.parse().map_err(|e| {
        pingora::Error::explain(
            pingora::ErrorType::InternalError,
            format!("bad upstream path {:?}: {e}", target.path_and_query),
        )
    })?;
    req.set_uri(uri);
    let drop: Vec<http::HeaderName> = req
        .headers
        .keys()
        .filter(|n| {
            plugin_sdk::headers::is_gateway_header(n)
                || crate::respond::is_hop_by_hop(n)
                || *n == http::header::AUTHORIZATION
        })
        .cloned()
        .collect();
    for name in drop {
        req.remove_header(&name);
    }
    req.insert_header(http::header::HOST, target.endpoint.authority())?;
    // A POST's answer is read for its usage on the way: it must come uncompressed.
    if req.method == http::Method::POST {
        req.insert_header(http::header::ACCEPT_ENCODING, "identity")?;
    }
    if let Some((name, value)) = &target.auth {
        req.insert_header(*name, value.as_str())?;
    }
    for (name, value) in target.defaults {
        if req.headers.get(*name).is_none() {
            req.insert_header(*name, *value)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{provider_suffix, AnswerSummary};

    #[test]
    fn an_answers_model_and_usage_are_read_from_its_ends() {
        // A Responses API answer, whole.
        let mut whole = AnswerSummary::default();
        whole.push(br#"{"id":"resp_1","object":"response","model":"gpt-4.1-mini","output":[{"#);
        whole.push(&vec![b' '; 300 * 1024]);
        whole.push(br#"}],"usage":{"input_tokens":12,"output_tokens":30,"total_tokens":42}}"#);
        assert_eq!(whole.model().as_deref(), Some("gpt-4.1-mini"));
        let usage = whole.usage().unwrap();
        assert_eq!((usage.prompt_tokens, usage.completion_tokens), (12, 30));
        assert!(whole.tail.len() <= 2 * super::TAIL_BYTES);
        // A completions stream with usage in its last chunk, cut anywhere.
        let stream = b"data: {\"model\":\"gpt-3.5-turbo-instruct\",\"choices\":[{\"text\":\"usage\"}]}\n\n\
                       data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":7}}\n\ndata: [DONE]\n\n";
        for cut in 0..stream.len() {
            let mut s = AnswerSummary::default();
            s.push(&stream[..cut]);
            s.push(&stream[cut..]);
            let usage = s.usage().unwrap();
            assert_eq!((usage.prompt_tokens, usage.completion_tokens), (5, 7));
            assert_eq!(s.model().as_deref(), Some("gpt-3.5-turbo-instruct"));
        }
        // Nothing to read: no usage.
        let mut none = AnswerSummary::default();
        none.push(br#"{"data":[{"url":"https://x/usage"}],"usage":null}"#);
        assert!(none.usage().is_none());
        // Spaced JSON; a client's metadata named usage after the real one; Anthropic's two
        // usage events.
        let mut spaced = AnswerSummary::default();
        spaced.push(
            br#"{"model" : "gpt-4.1", "usage": {"input_tokens": 9, "output_tokens": 2}, "metadata": {"usage": "x"}}"#,
        );
        assert_eq!(spaced.model().as_deref(), Some("gpt-4.1"));
        let u = spaced.usage().unwrap();
        assert_eq!((u.prompt_tokens, u.completion_tokens), (9, 2));
        let mut split = AnswerSummary::default();
        split.push(b"data: {\"type\":\"message_start\",\"message\":{\"model\":\"claude\",\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n\
                     data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":40}}\n\n");
        let u = split.usage().unwrap();
        assert_eq!((u.prompt_tokens, u.completion_tokens), (25, 40));
    }

    #[test]
    fn dot_segments_stay_below_the_base_path() {
        for (path, want) in [
            ("/files", "/files"),
            ("/files/abc/content", "/files/abc/content"),
            ("/a/./b", "/a/b"),
            ("/a/../b", "/b"),
            ("/../../admin", "/admin"),
            ("/%2e%2e/%2E%2E/secret", "/secret"),
            ("/a/b/..", "/a/"),
            ("", ""),
            ("/", "/"),
        ] {
            assert_eq!(provider_suffix(path).unwrap(), want, "{path}");
        }
        for bad in ["/a%2f..%2fb", "/a%5C..", "/a\\..\\b"] {
            let err = provider_suffix(bad).unwrap_err();
            assert_eq!(err.param.as_deref(), Some("path"), "{bad}");
        }
    }
}
