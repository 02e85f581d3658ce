//! What a plugin phase returns.

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};

/// The outcome of a plugin phase.
#[derive(Debug)]
pub enum Flow {
    /// Go on with the next plugin, then the next phase.
    Continue,
    /// Answer the client now with this response; later plugins of the phase and the upstream call
    /// are skipped. The `on_log` phase still runs.
    Respond(PluginResponse),
}

/// A complete response produced by a plugin (a cache hit, a refusal, `/metrics`...).
#[derive(Debug, Clone)]
pub struct PluginResponse {
    pub status: StatusCode,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: Bytes,
}

impl PluginResponse {
    /// A JSON response with `content-type: application/json`.
    pub fn json(status: StatusCode, body: &serde_json::Value) -> Self {
        PluginResponse {
            status,
            headers: vec![(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body: Bytes::from(body.to_string()),
        }
    }

    /// Adds a header; values that are not valid header values are dropped.
    pub fn with_header(mut self, name: HeaderName, value: &str) -> Self {
        if let Ok(value) = HeaderValue::from_str(value) {
            self.headers.push((name, value));
        }
        self
    }
}
