//! The one `impl ProxyHttp`: each Pingora hook hands over to the gateway's own modules.
//!
//! - `request_filter` dispatches: `/health` and `/metrics` are answered here; control-plane
//!   paths go to [`crate::control_plane`] (the admin Router) and are answered there; LLM routes are
//!   handled to the end by [`crate::llm`] (the response is written there, so Pingora's own
//!   upstream phases are skipped); passthrough routes pick their target and continue.
//! - `upstream_peer`, `upstream_request_filter`, `response_filter`, `fail_to_proxy` serve
//!   passthrough requests only.
//! - `logging` runs the pipeline's `on_log` for every gateway request.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use http::StatusCode;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::HttpPeer;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};

use plugin_sdk::{ErrorKind, GatewayError, RequestCx, Route};

use crate::passthrough::{self, PassthroughTarget};
use crate::request::{self, Dispatch};
use crate::respond;
use crate::server::{Gateway, InFlight};

pub struct GatewayProxy {
    pub gw: Arc<Gateway>,
}

/// Per-request state kept by Pingora between hooks.
#[derive(Default)]
pub struct Ctx {
    cx: Option<Box<RequestCx>>,
    passthrough: Option<PassthroughTarget>,
    /// What a passthrough answer reports of its model and usage, read as it streams by.
    answer: Option<passthrough::AnswerSummary>,
    /// An error from our own hooks, so `fail_to_proxy` answers with it.
    failure: Option<GatewayError>,
    _in_flight: Option<InFlight>,
}

#[async_trait]
impl ProxyHttp for GatewayProxy {
    type CTX = Ctx;

    fn new_ctx(&self) -> Ctx {
        Ctx::default()
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> pingora::Result<bool> {
        let req = session.req_header();
        let mut dispatch = request::dispatch(&req.method, req.uri.path());
        if matches!(dispatch, Dispatch::Admin) && !self.gw.config.admin_on_main_listener {
            // The control plane has a listener of its own: here its paths do not exist, and
            // nothing (not even a body-size answer) hints otherwise.
            dispatch = Dispatch::NotFound;
        }
        let route = match dispatch {
            Dispatch::Health => {
                let body = Bytes::from_static(br#"{"status":"ok"}"#);
                respond::simple(session, StatusCode::OK, "application/json", body).await;
                return Ok(true);
            }
            Dispatch::Metrics => {
                let body = Bytes::from(self.gw.render_metrics());
                respond::simple(session, StatusCode::OK, "text/plain; version=0.0.4", body).await;
                return Ok(true);
            }
            Dispatch::NotFound => {
                let err = GatewayError::new(
                    ErrorKind::NotFound,
                    format!("no route for {} {}", req.method, req.uri.path()),
                );
                session.set_keepalive(None);
                respond::error(session, None, &err).await;
                return Ok(true);
            }
            Dispatch::Admin => {
                ctx._in_flight = Some(self.gw.in_flight());
                Box::pin(crate::control_plane::handle(&self.gw, session)).await;
                return Ok(true);
            }
            Dispatch::Gateway(route) => route,
        };

        ctx._in_flight = Some(self.gw.in_flight());
        let (mut cx, headers_ok) = request::context(session, route);
        cx.response.reference_headers = self.gw.config.reference_response_headers;
        let cx = ctx.cx.insert(Box::new(cx));
        if let Err(e) = headers_ok {
            // The body was not read, so the connection cannot be reused.
            session.set_keepalive(None);
            respond::error(session, Some(cx), &e).await;
            return Ok(true);
        }
        if route != Route::Passthrough {
            // Boxed: the handler's state would otherwise be part of this future, which
            // Pingora boxes (and so copies) on every request.
            Box::pin(crate::llm::handle(&self.gw, session, cx)).await;
            return Ok(true);
        }
        match passthrough::prepare(&self.gw, cx).await {
            Ok(Ok(target)) => {
                ctx.passthrough = Some(target);
                Ok(false)
            }
            Ok(Err(response)) => {
                session.set_keepalive(None);
                respond::plugin(session, cx, response).await;
                Ok(true)
            }
            Err(e) => {
                session.set_keepalive(None);
                respond::error(session, Some(cx), &e).await;
                Ok(true)
            }
        }
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut Ctx,
    ) -> pingora::Result<Box<HttpPeer>> {
        let Some(target) = ctx.passthrough.as_ref() else {
            return Err(pingora::Error::explain(
                pingora::ErrorType::InternalError,
                "no passthrough target",
            ));
        };
        match self.gw.upstream.peer(&target.endpoint).await {
            Ok(mut peer) => {
                // `x-gw-request-timeout` bounds the wait for the provider: the connection and
                // each read get what is left of it (a stream already flowing keeps going as
                // long as each read arrives within that time).
                if let Some((ms, started)) = ctx
                    .cx
                    .as_deref()
                    .and_then(|cx| Some((cx.gw.request_timeout_ms?, cx.started)))
                {
                    let left = std::time::Duration::from_millis(ms)
                        .saturating_sub(started.elapsed())
                        .max(std::time::Duration::from_millis(1));
                    let o = &mut peer.options;
                    for t in [
                        &mut o.connection_timeout,
                        &mut o.total_connection_timeout,
                        &mut o.read_timeout,
                    ] {
                        *t = Some(t.map_or(left, |own| own.min(left)));
                    }
                }
                Ok(peer)
            }
            Err(e) => {
                let explain = e.message.clone();
                ctx.failure = Some(e);
                Err(pingora::Error::explain(
                    pingora::ErrorType::ConnectError,
                    explain,
                ))
            }
        }
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut Ctx,
    ) -> pingora::Result<()> {
        if let Some(target) = ctx.passthrough.as_mut() {
            passthrough::rewrite_request(target, upstream_request)?;
            target.sent_at = Some(Instant::now());
        }
        Ok(())
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut Ctx,
    ) -> pingora::Result<()> {
        if let Some(cx) = ctx.cx.as_deref_mut() {
            cx.response.status = Some(upstream_response.status.as_u16());
            if let Some(sent) = ctx.passthrough.as_ref().and_then(|t| t.sent_at) {
                cx.response.upstream_latency = Some(sent.elapsed());
            }
            if passthrough::AnswerSummary::wanted(upstream_response) {
                ctx.answer = Some(passthrough::AnswerSummary::default());
            }
            let mut ours = http::HeaderMap::new();
            respond::set_gateway_headers(&mut ours, cx);
            for (name, value) in ours {
                if let Some(name) = name {
                    upstream_response.insert_header(name, value)?;
                }
            }
        }
        Ok(())
    }

    fn response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<bytes::Bytes>,
        end_of_stream: bool,
        ctx: &mut Ctx,
    ) -> pingora::Result<Option<std::time::Duration>> {
        let Some(answer) = ctx.answer.as_mut() else {
            return Ok(None);
        };
        if let Some(data) = body {
            answer.push(data);
        }
        if end_of_stream {
            if let Some(cx) = ctx.cx.as_deref_mut() {
                cx.response.usage = answer.usage();
                if cx.response.model.is_none() {
                    cx.response.model = answer.model();
                }
            }
            ctx.answer = None;
        }
        Ok(None)
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &pingora::Error,
        ctx: &mut Ctx,
    ) -> FailToProxy {
        let timed_out = matches!(
            e.etype(),
            pingora::ErrorType::ReadTimedout
                | pingora::ErrorType::ConnectTimedout
                | pingora::ErrorType::TLSHandshakeTimedout
        );
        // A 408 when the request's own timeout ran out; the gateway's shorter read or connect
        // timeout firing first is its own 504.
        let request_timed_out = |cx: &RequestCx| {
            cx.gw
                .request_timeout_ms
                .filter(|ms| cx.started.elapsed() >= std::time::Duration::from_millis(*ms))
        };
        let err = ctx.failure.take().unwrap_or_else(|| {
            match ctx.cx.as_deref().and_then(request_timed_out) {
                Some(ms) if timed_out => crate::llm::request_timeout(ms),
                _ => pingora_failure(e),
            }
        });
        let code = err.status().as_u16();
        if session.response_written().is_none() {
            respond::error(session, ctx.cx.as_deref_mut(), &err).await;
        } else if let Some(cx) = ctx.cx.as_deref_mut() {
            cx.response.error = Some(err.message);
        }
        FailToProxy {
            error_code: code,
            can_reuse_downstream: false,
        }
    }

    async fn logging(&self, session: &mut Session, e: Option<&pingora::Error>, ctx: &mut Ctx) {
        let Some(cx) = ctx.cx.as_deref_mut() else {
            return;
        };
        if cx.response.status.is_none() {
            cx.response.status = session.response_written().map(|h| h.status.as_u16());
        }
        if let (Some(e), None) = (e, &cx.response.error) {
            cx.response.error = Some(e.to_string());
        }
        self.gw.pipeline.on_log(cx);
    }
}

/// A passthrough failure that happened inside Pingora.
fn pingora_failure(e: &pingora::Error) -> GatewayError {
    use pingora::ErrorType::*;
    let kind = match e.etype() {
        ConnectTimedout | ReadTimedout | WriteTimedout => ErrorKind::UpstreamTimeout,
        ConnectRefused | ConnectNoRoute | ConnectError | TLSHandshakeFailure => {
            ErrorKind::UpstreamUnreachable
        }
        _ if matches!(e.esource(), pingora::ErrorSource::Downstream) => ErrorKind::InvalidRequest,
        _ => ErrorKind::UpstreamBadResponse,
    };
    GatewayError::new(
        kind,
        format!("passthrough failed: {}", crate::upstream::describe(e)),
    )
}
