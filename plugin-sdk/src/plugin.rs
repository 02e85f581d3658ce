//! The plugin trait and its phases.

use async_trait::async_trait;
use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};

use crate::context::RequestCx;
use crate::error::GatewayError;
use crate::flow::Flow;
use crate::target::Target;

/// The request about to be sent upstream, already encoded in the target's wire format.
#[derive(Debug, Clone)]
pub struct UpstreamRequest {
    pub method: Method,
    /// Absolute URL.
    pub url: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// A complete (not streamed) response in the client's wire format, before it is written.
#[derive(Debug, Clone)]
pub struct ResponseParts {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// One piece of a streamed response in the client's wire format: always whole server-sent events
/// (an event split across network reads is held back until it is complete).
#[derive(Debug, Clone)]
pub struct Chunk {
    pub data: Bytes,
}

/// A set of the request phases of [`Plugin`]: the ones a plugin implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Phases(u8);

impl Phases {
    pub const REQUEST: Phases = Phases(1);
    pub const ROUTE: Phases = Phases(1 << 1);
    pub const UPSTREAM_REQUEST: Phases = Phases(1 << 2);
    pub const RESPONSE: Phases = Phases(1 << 3);
    pub const CHUNK: Phases = Phases(1 << 4);
    pub const LOG: Phases = Phases(1 << 5);
    pub const ALL: Phases = Phases((1 << 6) - 1);

    /// Whether every phase of `other` is in this set.
    pub const fn contains(self, other: Phases) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Phases {
    type Output = Phases;

    fn bitor(self, other: Phases) -> Phases {
        Phases(self.0 | other.0)
    }
}

/// A step of the gateway's request pipeline.
///
/// The gateway calls the phases in this order for each request on an LLM route:
///
/// 1. [`on_request`](Plugin::on_request) — once, in pipeline order, after the body has been read,
///    decoded and validated (except for the plugins at the head of the pipeline whose
///    [`reads_body`](Plugin::reads_body) is false: they run before the body is read).
///    Authentication, provider selection, limits, cache lookups and input guardrails live here.
/// 2. [`on_route`](Plugin::on_route) — in pipeline order, once per upstream attempt, after the
///    router chose a target and before the body is encoded for it.
/// 3. [`on_upstream_request`](Plugin::on_upstream_request) — in pipeline order, once per attempt,
///    with the encoded request just before it is sent.
/// 4. [`on_response`](Plugin::on_response) — in reverse pipeline order, once, with the complete
///    response in the client's format, before it is written (not called for streams).
/// 5. [`on_chunk`](Plugin::on_chunk) — in reverse pipeline order, for each piece of a streamed
///    response before it is written. Synchronous: it runs inside the body filter.
/// 6. [`on_log`](Plugin::on_log) — in reverse pipeline order, always, once the response is done
///    or the request failed, even if an earlier phase answered. Must not block.
///
/// Passthrough requests (any other provider path) run `on_request` (with an empty body) and
/// `on_log` only: their bodies stream through untouched.
///
/// Every phase has a default that does nothing and continues, so a plugin implements only the
/// phases it needs. A phase that returns `Flow::Respond` answers the client and skips the
/// remaining plugins of that phase and every later phase except `on_log`; one that returns an
/// error answers with the error's status and body.
#[async_trait]
pub trait Plugin: Send + Sync + 'static {
    /// The kind this plugin was built from, as written in the YAML (`request_log`...).
    fn kind(&self) -> &'static str;

    /// The phases this plugin implements; the pipeline calls only those (every call of an
    /// async phase allocates its future, even a default one). Read once, when the pipeline is
    /// built. Default: all of them, which is always correct; a plugin that narrows it must
    /// list every phase it overrides, or the ones left out are never called.
    fn phases(&self) -> Phases {
        Phases::ALL
    }

    /// Whether this plugin's `on_request` takes over a check an earlier plugin deferred
    /// ([`RequestCx::deferred`], see [`crate::deferred`]) to finish it with its own work in one
    /// round trip. Read once, when the pipeline is built. Default: false, and the pipeline
    /// completes the deferred check before calling this plugin. A plugin that says true must
    /// complete the check (or defer it again) in every `on_request`.
    fn joins_deferred(&self) -> bool {
        false
    }

    /// Whether this plugin's `on_request` reads the request's body (`cx.body`, `cx.request`).
    /// Read once, when the pipeline is built. Default: true. The plugins at the head of the
    /// request phase that say false (authentication) run before an LLM route's body is read,
    /// so what they refuse is answered without reading it.
    fn reads_body(&self) -> bool {
        true
    }

    /// Runs once per request, in pipeline order, before anything is sent upstream.
    /// Default: continue.
    async fn on_request(&self, _cx: &mut RequestCx) -> Result<Flow, GatewayError> {
        Ok(Flow::Continue)
    }

    /// Runs for each upstream attempt after the target is chosen, before encoding.
    /// Default: continue.
    async fn on_route(
        &self,
        _cx: &mut RequestCx,
        _target: &mut Target,
    ) -> Result<Flow, GatewayError> {
        Ok(Flow::Continue)
    }

    /// Runs for each upstream attempt with the encoded request, just before it is sent.
    /// Default: continue.
    async fn on_upstream_request(
        &self,
        _cx: &mut RequestCx,
        _request: &mut UpstreamRequest,
    ) -> Result<Flow, GatewayError> {
        Ok(Flow::Continue)
    }

    /// Runs once with a complete response, in reverse pipeline order. Default: continue.
    async fn on_response(
        &self,
        _cx: &mut RequestCx,
        _response: &mut ResponseParts,
    ) -> Result<Flow, GatewayError> {
        Ok(Flow::Continue)
    }

    /// Runs for each piece of a stream, in reverse pipeline order. `Flow::Respond` ends the
    /// stream with the response body as a final event. Default: continue.
    fn on_chunk(&self, _cx: &mut RequestCx, _chunk: &mut Chunk) -> Result<Flow, GatewayError> {
        Ok(Flow::Continue)
    }

    /// Runs last for every request, in reverse pipeline order. Default: nothing.
    fn on_log(&self, _cx: &RequestCx) {}

    /// Runs when the operator asks the running gateway to reload (SIGHUP): a plugin that loads
    /// files at start (a wasm component...) loads them again. On an error the plugin keeps what
    /// it had. Not a request phase. Default: nothing to reload.
    fn reload(&self) -> Result<(), String> {
        Ok(())
    }
}
