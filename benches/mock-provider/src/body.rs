//! The response body type shared by every route.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};
use hyper::body::{Body, Frame, Incoming, SizeHint};

use crate::sse::SseBody;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Response body: a complete buffer, a timed SSE event stream, or a request
/// body streamed straight back (echo). An enum rather than a boxed trait
/// object keeps the common buffered case allocation-free and lets hyper see
/// the exact length.
pub(crate) enum MockBody {
    Full(Option<Bytes>),
    Sse(SseBody),
    Incoming(Incoming),
}

impl MockBody {
    pub(crate) fn full(bytes: impl Into<Bytes>) -> Self {
        let bytes = bytes.into();
        if bytes.is_empty() {
            MockBody::Full(None)
        } else {
            MockBody::Full(Some(bytes))
        }
    }

    pub(crate) fn is_stream(&self) -> bool {
        matches!(self, MockBody::Sse(_))
    }
}

impl Body for MockBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            MockBody::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            MockBody::Sse(sse) => Pin::new(sse).poll_frame(cx),
            MockBody::Incoming(incoming) => Pin::new(incoming)
                .poll_frame(cx)
                .map_err(|e| Box::new(e) as BoxError),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            MockBody::Full(bytes) => bytes.is_none(),
            MockBody::Sse(_) => false,
            MockBody::Incoming(incoming) => incoming.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            MockBody::Full(bytes) => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
            MockBody::Sse(_) => SizeHint::default(),
            MockBody::Incoming(incoming) => incoming.size_hint(),
        }
    }
}

/// A response with the given status, body and `content-type`.
pub(crate) fn response(
    status: StatusCode,
    content_type: &'static str,
    body: MockBody,
) -> Response<MockBody> {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

/// A JSON response from already serialized bytes.
pub(crate) fn json_bytes(status: StatusCode, json: impl Into<Bytes>) -> Response<MockBody> {
    response(status, "application/json", MockBody::full(json))
}

/// Serializes `value` into a JSON response.
pub(crate) fn json<T: serde::Serialize>(status: StatusCode, value: &T) -> Response<MockBody> {
    // Serializing our own plain structs cannot fail; fall back to an empty
    // object rather than panicking if it somehow does.
    let bytes = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    json_bytes(status, bytes)
}
