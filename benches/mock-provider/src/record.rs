//! Request recording, independent of any wire format.

use std::sync::{Mutex, MutexGuard};

use bytes::Bytes;
use http::HeaderMap;

/// One request as the mock received it.
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    /// Method, e.g. `"POST"`.
    pub method: String,
    /// Path as received, without the query (fault prefixes included).
    pub path: String,
    /// Raw query string without the `?`, if any.
    pub query: Option<String>,
    /// Headers in arrival order with lower-case names; non-UTF-8 values are
    /// converted lossily.
    pub headers: Vec<(String, String)>,
    /// The full request body.
    pub body: Bytes,
}

impl RecordedRequest {
    /// Value of the first header called `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body parsed as JSON, or `None` if it is not valid JSON.
    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.body).ok()
    }

    pub(crate) fn new(
        method: &http::Method,
        uri: &http::Uri,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Self {
        RecordedRequest {
            method: method.as_str().to_owned(),
            path: uri.path().to_owned(),
            query: uri.query().map(str::to_owned),
            headers: headers
                .iter()
                .map(|(name, value)| {
                    // `HeaderName` is always stored lower-case.
                    (
                        name.as_str().to_owned(),
                        String::from_utf8_lossy(value.as_bytes()).into_owned(),
                    )
                })
                .collect(),
            body,
        }
    }
}

/// Append-only log of requests; a no-op when disabled so benchmarks pay
/// nothing for it.
pub(crate) struct RequestLog {
    enabled: bool,
    entries: Mutex<Vec<RecordedRequest>>,
}

impl RequestLog {
    pub(crate) fn new(enabled: bool) -> Self {
        RequestLog {
            enabled,
            entries: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    pub(crate) fn push(&self, request: RecordedRequest) {
        if self.enabled {
            self.lock().push(request);
        }
    }

    pub(crate) fn snapshot(&self) -> Vec<RecordedRequest> {
        self.lock().clone()
    }

    pub(crate) fn clear(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> MutexGuard<'_, Vec<RecordedRequest>> {
        // A panic elsewhere while holding the lock leaves the Vec intact.
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
