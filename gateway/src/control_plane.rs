//! Control-plane requests: the body is read (at most [`admin::MAX_BODY_BYTES`], else a 413),
//! the request is handed to the `admin` crate's Router as an `http::Request`, and its answer is
//! written back through the Pingora session.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use http::header;
use pingora::proxy::Session;
use prometheus::core::Collector;
use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts};

use admin::{AdminError, ClientAddr, ErrorKind};

use crate::request;
use crate::respond;
use crate::server::Gateway;

/// Answers one control-plane request.
pub async fn handle(gw: &Gateway, session: &mut Session) {
    let resp = match read(session).await {
        Ok(req) => gw.control_plane.handle(req).await,
        Err(e) => {
            // The body was not read to its end: the connection cannot be reused.
            session.set_keepalive(None);
            e.to_http()
        }
    };
    if let Err(e) = write(session, resp).await {
        tracing::debug!(error = %e, "could not write the control-plane answer; the client is gone");
    }
}

/// The request as the Router takes it, with the client's address.
async fn read(session: &mut Session) -> Result<http::Request<Bytes>, AdminError> {
    let body = request::read_body(session, admin::MAX_BODY_BYTES)
        .await
        .map_err(|e| match e.kind {
            plugin_sdk::ErrorKind::PayloadTooLarge => {
                AdminError::new(ErrorKind::PayloadTooLarge, e.message)
            }
            _ => AdminError::validation(e.message),
        })?;
    let head = session.req_header();
    let mut req = http::Request::new(body);
    *req.method_mut() = head.method.clone();
    *req.uri_mut() = head.uri.clone();
    *req.headers_mut() = head.headers.clone();
    let client = session
        .client_addr()
        .and_then(|a| a.as_inet())
        .map(|a| a.ip());
    req.extensions_mut().insert(ClientAddr(client));
    Ok(req)
}

async fn write(session: &mut Session, resp: http::Response<Bytes>) -> pingora::Result<()> {
    let (parts, body) = resp.into_parts();
    let mut h = respond::header(parts.status, None)?;
    for (name, value) in &parts.headers {
        if name != header::CONTENT_LENGTH {
            h.append_header(name.clone(), value.clone())?;
        }
    }
    respond::complete(session, h, body).await
}

/// The snapshot's metrics, read from the control plane's counters when Prometheus scrapes:
/// `gw_snapshot_version` (the data-plane version this instance serves),
/// `gw_snapshot_refreshes_total{how="applied"|"rebuilt"}` (changes applied from the log, or
/// every row read again) and `gw_snapshot_check_differences_total` (periodic checks that found
/// the snapshot different from the database: a defect, corrected by the check).
pub struct SnapshotMetrics {
    published: admin::store::Published,
    descs: Vec<prometheus::core::Desc>,
}

impl SnapshotMetrics {
    pub fn new(published: admin::store::Published) -> SnapshotMetrics {
        let (version, refreshes, differences) = Self::metrics();
        let descs = [version.desc(), refreshes.desc(), differences.desc()]
            .into_iter()
            .flatten()
            .cloned()
            .collect();
        SnapshotMetrics { published, descs }
    }

    fn metrics() -> (IntGauge, IntCounterVec, IntCounter) {
        (
            IntGauge::new(
                "gw_snapshot_version",
                "The control plane's data-plane version this instance serves",
            )
            .expect("a valid metric"),
            IntCounterVec::new(
                Opts::new(
                    "gw_snapshot_refreshes_total",
                    "Snapshot refreshes: changes applied from the log, or every row read again",
                ),
                &["how"],
            )
            .expect("a valid metric"),
            IntCounter::new(
                "gw_snapshot_check_differences_total",
                "Consistency checks that found the snapshot different from the database",
            )
            .expect("a valid metric"),
        )
    }
}

impl Collector for SnapshotMetrics {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        let (version, refreshes, differences) = Self::metrics();
        let stats = self.published.stats();
        version.set(self.published.version());
        refreshes
            .with_label_values(&["applied"])
            .inc_by(stats.applied.load(Ordering::Relaxed));
        refreshes
            .with_label_values(&["rebuilt"])
            .inc_by(stats.rebuilt.load(Ordering::Relaxed));
        differences.inc_by(stats.differed.load(Ordering::Relaxed));
        let mut out = version.collect();
        out.extend(refreshes.collect());
        out.extend(differences.collect());
        out
    }
}
