//! Providers: the table of what the gateway can talk to, and one module per wire format.
//!
//! Hub and spoke: canonical request types live in `plugin_sdk::llm` (OpenAI's shapes, which
//! clients speak); each wire-format module encodes them into the provider's request and decodes
//! the provider's answer — whole or as a stream — back into OpenAI's shapes. N formats need N
//! codecs. When the provider speaks OpenAI's format the client's bytes go through untouched.
//!
//! A codec module offers three functions, dispatched here by [`WireFormat`]:
//! - `encode(&Outgoing) -> Result<Encoded, GatewayError>`: the body, path and extra headers;
//! - `decode(&CallInfo, &[u8]) -> Result<Decoded, GatewayError>`: a whole 2xx answer;
//! - `stream(&CallInfo) -> Box<dyn StreamDecoder>`: a 2xx answer stream, read by read.
//!
//! Provider errors (non-2xx) of every format are translated by [`error::from_provider`].

pub mod anthropic;
pub mod bedrock;
pub mod chunks;
pub mod cohere;
pub mod error;
pub mod gemini;
pub mod openai;
mod request;
pub mod table;
#[cfg(test)]
mod testing;

use bytes::Bytes;

use plugin_sdk::llm::LlmRequest;
use plugin_sdk::{GatewayError, Route, Target, Usage};

use crate::sse::{self, EventSplitter};

pub use table::{AuthStyle, ProviderSpec, WireFormat};

/// One request on its way to one target, for a codec to encode.
pub struct Outgoing<'a> {
    pub spec: &'static ProviderSpec,
    pub route: Route,
    /// The client's path after `/v1` (`/chat/completions`), for formats that keep it.
    pub suffix: &'a str,
    /// The client's body as received, with the target's `override_params` merged in.
    pub raw: &'a Bytes,
    /// The decoded body (with `override_params` applied).
    pub request: &'a LlmRequest,
    /// Credentials and provider settings (`azure_deployment_id`, `aws_region`...).
    pub target: &'a Target,
    /// `x-gw-strict-open-ai-compliance`: answer in OpenAI's shapes only (no `content_blocks`).
    pub strict: bool,
}

impl Outgoing<'_> {
    /// The model of the request (after overrides), or "" when it names none.
    pub fn model(&self) -> &str {
        self.request.model().unwrap_or_default()
    }

    /// Whether the client asked for a stream.
    pub fn stream(&self) -> bool {
        self.request.is_stream()
    }

    /// The call facts that decoding the answer needs.
    pub fn call_info(&self, format: WireFormat) -> CallInfo {
        CallInfo {
            provider: self.spec.id,
            format,
            route: self.route,
            model: self.model().to_owned(),
            include_usage: matches!(self.request, LlmRequest::Chat(c) if c.wants_stream_usage()),
            hidden_usage: format == WireFormat::OpenAi && openai::adds_stream_usage(self),
            base64_embeddings: matches!(self.request,
                LlmRequest::Embeddings(e) if e.encoding_format.as_deref() == Some("base64")),
            strict: self.strict,
            waive_provisioned_cost: self.target.setting("skipPtuCostAttribution") == Some("true"),
        }
    }
}

/// A request in the provider's format.
#[derive(Debug, Clone)]
pub struct Encoded {
    pub body: Bytes,
    /// Appended to the endpoint's base path (`/messages`, `/models/m:generateContent`).
    pub path: String,
    /// A query string of the codec's own (`alt=sse`, `api-version=...`), without `?`. The
    /// client's query, if any, follows it.
    pub query: Option<String>,
    /// Headers of the format (`anthropic-version`...), besides the credential.
    pub headers: Vec<(&'static str, String)>,
    /// The format the answer comes back in (Vertex answers Claude models in Anthropic's).
    pub answer_format: WireFormat,
}

impl Encoded {
    /// A request whose answer comes back in `format`, with no query or extra headers.
    pub fn new(body: Bytes, path: impl Into<String>, format: WireFormat) -> Self {
        Encoded {
            body,
            path: path.into(),
            query: None,
            headers: Vec::new(),
            answer_format: format,
        }
    }
}

/// What decoding an answer needs to know about the call that produced it.
#[derive(Debug, Clone)]
pub struct CallInfo {
    /// The provider id, for messages (`gemini error: ...`).
    pub provider: &'static str,
    /// The format the answer is in.
    pub format: WireFormat,
    pub route: Route,
    /// The model the request named ("" when none); answers that do not report one use it.
    pub model: String,
    /// `stream_options.include_usage`: end the stream with a usage chunk.
    pub include_usage: bool,
    /// The gateway asked for a usage chunk the client did not ask for: it is read, then taken
    /// out of the stream ([`openai::adds_stream_usage`]).
    pub hidden_usage: bool,
    /// `encoding_format: "base64"`: embeddings as base64 of little-endian f32s, as OpenAI sends
    /// them (the OpenAI SDKs ask for this by default).
    pub base64_embeddings: bool,
    pub strict: bool,
    /// The saved provider's integration says `skipPtuCostAttribution`: an answer served from
    /// Provisioned Throughput costs nothing more.
    pub waive_provisioned_cost: bool,
}

impl CallInfo {
    /// The model the request named, `None` when it named none: for answers that do not report
    /// their model.
    pub fn named_model(&self) -> Option<String> {
        (!self.model.is_empty()).then(|| self.model.clone())
    }
}

/// A whole answer in OpenAI's shape.
#[derive(Debug)]
pub struct Decoded {
    pub body: Bytes,
    pub model: Option<String>,
    pub usage: Option<Usage>,
    /// Served from capacity reserved in advance (Vertex AI's Provisioned Throughput).
    pub provisioned: bool,
}

/// A provider's answer stream, translated into OpenAI's `chat.completion.chunk` events as it is
/// read. Network reads may split the provider's framing anywhere; a decoder holds partial
/// frames back, so any split of the same bytes yields the same output.
pub trait StreamDecoder: Send {
    /// Takes the next network read; returns the OpenAI SSE bytes it completes (maybe none).
    fn push(&mut self, read: &[u8]) -> Bytes;
    /// The provider's stream ended cleanly; returns what the client still needs (the finish
    /// chunk, the usage chunk when asked for, `data: [DONE]`) unless already sent.
    fn finish(&mut self) -> Bytes;
    /// The usage reported so far.
    fn usage(&self) -> Option<Usage>;
    /// The model the stream reported, if any.
    fn model(&self) -> Option<&str>;
    /// Whether the stream said it was served from reserved capacity. Default: no.
    fn provisioned(&self) -> bool {
        false
    }
    /// Whether the provider sent an event larger than the gateway holds
    /// ([`sse::MAX_EVENT_BYTES`]); the stream must then end. Default: no.
    fn overflowed(&self) -> bool {
        false
    }
}

/// Turns one server-sent event's `data` at a time into OpenAI SSE text. Formats whose streams
/// are server-sent events implement this and get a [`StreamDecoder`] from [`SseDecoder`].
pub trait EventTranslator: Send {
    /// One event's data payload; appends the OpenAI SSE events it yields to `out`.
    fn event(&mut self, data: &[u8], out: &mut String);
    /// The stream ended; appends whatever the client still needs (see [`StreamDecoder::finish`]).
    fn end(&mut self, out: &mut String);
    fn usage(&self) -> Option<Usage>;
    fn model(&self) -> Option<&str>;
    fn provisioned(&self) -> bool {
        false
    }
}

/// A [`StreamDecoder`] over server-sent events: whole events are cut from the reads and their
/// data handed to the translator.
pub struct SseDecoder<T> {
    splitter: EventSplitter,
    translator: T,
}

impl<T: EventTranslator> SseDecoder<T> {
    pub fn new(translator: T) -> Self {
        SseDecoder {
            splitter: EventSplitter::default(),
            translator,
        }
    }

    fn translate(&mut self, events: &[u8], out: &mut String) {
        for data in sse::event_data(events) {
            self.translator.event(&data, out);
        }
    }
}

impl<T: EventTranslator> StreamDecoder for SseDecoder<T> {
    fn overflowed(&self) -> bool {
        self.splitter.overflowed()
    }

    fn push(&mut self, read: &[u8]) -> Bytes {
        let events = self.splitter.push(read);
        let mut out = String::new();
        self.translate(&events, &mut out);
        Bytes::from(out)
    }

    fn finish(&mut self) -> Bytes {
        let mut rest = self.splitter.finish().to_vec();
        let mut out = String::new();
        if !rest.is_empty() {
            // An event cut short by the end of the stream still counts.
            rest.extend_from_slice(b"\n\n");
            self.translate(&rest, &mut out);
        }
        self.translator.end(&mut out);
        Bytes::from(out)
    }

    fn usage(&self) -> Option<Usage> {
        self.translator.usage()
    }

    fn model(&self) -> Option<&str> {
        self.translator.model()
    }

    fn provisioned(&self) -> bool {
        self.translator.provisioned()
    }
}

/// Encodes a request for its target's wire format.
pub fn encode(out: &Outgoing<'_>) -> Result<Encoded, GatewayError> {
    if out.route == Route::Messages {
        return anthropic::encode_ingress(out);
    }
    match out.spec.format {
        WireFormat::OpenAi => openai::encode(out),
        WireFormat::Anthropic => anthropic::encode(out),
        WireFormat::Gemini => gemini::encode(out),
        WireFormat::Bedrock => bedrock::encode(out),
        WireFormat::Cohere => cohere::encode(out),
    }
}

/// Decodes a whole 2xx answer into OpenAI's shape.
pub fn decode(call: &CallInfo, body: Bytes) -> Result<Decoded, GatewayError> {
    if call.route == Route::Messages {
        // The client speaks Anthropic's format: its answer goes back as it came.
        let (model, usage) = anthropic::summarize(&body);
        return Ok(Decoded {
            provisioned: false,
            body,
            model,
            usage,
        });
    }
    let decoded = match call.format {
        WireFormat::OpenAi => {
            let (model, usage) = openai::summarize_answer(&body);
            return Ok(Decoded {
                provisioned: false,
                body,
                model,
                usage,
            });
        }
        WireFormat::Anthropic => anthropic::decode(call, &body),
        WireFormat::Gemini => gemini::decode(call, &body),
        WireFormat::Bedrock => bedrock::decode(call, &body),
        WireFormat::Cohere => cohere::decode(call, &body),
    }?;
    if call.route == Route::Embeddings && call.base64_embeddings {
        return Ok(Decoded {
            provisioned: false,
            body: chunks::embeddings_to_base64(&decoded.body)?,
            ..decoded
        });
    }
    Ok(decoded)
}

/// The translator of a 2xx answer stream; `None` when it is OpenAI's already.
pub fn stream(call: &CallInfo) -> Option<Box<dyn StreamDecoder>> {
    if call.route == Route::Messages {
        return match call.format {
            WireFormat::Bedrock => Some(bedrock::anthropic_events(call)),
            _ => None,
        };
    }
    match call.format {
        WireFormat::OpenAi => None,
        WireFormat::Anthropic => Some(anthropic::stream(call)),
        WireFormat::Gemini => Some(gemini::stream(call)),
        WireFormat::Bedrock => Some(bedrock::stream(call)),
        WireFormat::Cohere => Some(cohere::stream(call)),
    }
}

/// The Vertex AI location of a target as a path, `/projects/{project}/locations/{region}`, from
/// its `vertex_project_id` and `vertex_region` settings (`x-gw-vertex-project-id`,
/// `x-gw-vertex-region`). A missing setting, or one that could change the path, is a 400 naming
/// its header.
pub fn vertex_location(target: &Target) -> Result<String, GatewayError> {
    let get = |name: &str, header: &str| {
        let value = target
            .setting(name)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| {
                GatewayError::invalid_param(
                    header,
                    format!("vertex-ai needs the {name} setting (the {header} header)"),
                )
            })?;
        if !is_path_safe(value) {
            return Err(GatewayError::invalid_param(
                header,
                format!("{header} may hold only letters, digits, '-', '_' and '.', got {value:?}"),
            ));
        }
        Ok(value)
    };
    let project = get("vertex_project_id", "x-gw-vertex-project-id")?;
    let region = get("vertex_region", "x-gw-vertex-region")?;
    Ok(format!("/projects/{project}/locations/{region}"))
}

/// Whether a value from the client can stand as one path segment as it is: letters, digits,
/// '-', '_' and '.', and neither `.` nor `..`.
pub(crate) fn is_path_safe(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && s != "."
        && s != ".."
}

/// Whether a 2xx answer's content type is the stream framing of its format.
pub fn is_stream_content_type(format: WireFormat, content_type: &str) -> bool {
    match format {
        WireFormat::Bedrock => content_type.starts_with("application/vnd.amazon.eventstream"),
        _ => content_type.starts_with("text/event-stream"),
    }
}

/// The last step before a request leaves, over its final URL, headers and body: formats that
/// sign requests (Bedrock's SigV4) sign here, after every plugin has had its say.
pub fn finalize(
    spec: &ProviderSpec,
    target: &Target,
    request: &mut plugin_sdk::plugin::UpstreamRequest,
) -> Result<(), GatewayError> {
    match spec.auth {
        AuthStyle::SigV4 => bedrock::sign(target, request),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vertex_locations_are_checked_path_segments() {
        let at = |project: &str, region: &str| {
            vertex_location(&testing::target(
                "vertex-ai",
                &[("vertex_project_id", project), ("vertex_region", region)],
            ))
        };
        assert_eq!(
            at("example.com_proj-1", "us-central1").unwrap(),
            "/projects/example.com_proj-1/locations/us-central1"
        );
        for (project, region, header) in [
            ("..", "us-central1", "x-gw-vertex-project-id"),
            ("p", ".", "x-gw-vertex-region"),
            ("p/q", "r", "x-gw-vertex-project-id"),
            ("p", "r?x=1", "x-gw-vertex-region"),
            ("", "r", "x-gw-vertex-project-id"),
        ] {
            let err = at(project, region).unwrap_err();
            assert_eq!(err.status().as_u16(), 400);
            assert_eq!(err.param.as_deref(), Some(header), "{project:?} {region:?}");
        }
    }
}
