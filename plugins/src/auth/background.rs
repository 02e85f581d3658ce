//! The JWT side's background work: a small runtime of the plugin's own (the plugin is built
//! before the server's runtimes exist), the JWKS refresh loop, and the audit writer that
//! takes refused tokens off the request path through a bounded queue.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus::IntCounterVec;
use tokio::sync::mpsc;

use plugin_sdk::sinks::{AuditEvent, SharedSink};

/// A current-thread runtime on a thread of its own. Dropping it stops the thread and cancels
/// every task on it.
pub struct Background {
    handle: tokio::runtime::Handle,
    /// Dropped with the plugin: the thread's `block_on` then returns and the runtime ends.
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Background {
    pub fn start() -> Result<Background, String> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("gw-auth".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(format!("cannot start a runtime: {e}")));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(runtime.handle().clone()));
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            })
            .map_err(|e| format!("cannot start the auth plugin's thread: {e}"))?;
        let handle = ready_rx
            .recv()
            .map_err(|_| "the auth plugin's thread ended at start".to_string())??;
        Ok(Background {
            handle,
            _stop: stop,
        })
    }

    pub fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }

    /// Runs `work` on the background runtime and waits for its result from a plain (non-async)
    /// caller, such as a plugin being built. `None` when it did not finish within `timeout`.
    pub fn run_blocking<T: Send + 'static>(
        &self,
        timeout: Duration,
        work: impl Future<Output = T> + Send + 'static,
    ) -> Option<T> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.handle.spawn(async move {
            let _ = tx.send(work.await);
        });
        rx.recv_timeout(timeout).ok()
    }
}

/// How many refused tokens may wait for the audit writer; more are dropped and counted.
pub const AUDIT_QUEUE: usize = 1024;

/// The most audit events written in one call to the sink.
const AUDIT_BATCH: usize = 100;

/// The request path's end of the audit queue.
#[derive(Clone)]
pub struct AuditQueue {
    tx: mpsc::Sender<AuditEvent>,
    /// Events queued and not yet written: the process waits for them at exit.
    in_flight: Arc<AtomicUsize>,
    /// `gw_auth_audit_events_total{outcome}`: queued, written, failed, dropped.
    events: IntCounterVec,
}

impl AuditQueue {
    /// Starts the writer on `background`; it ends when every queue handle is dropped.
    pub fn start(
        background: &Background,
        sink: SharedSink,
        events: IntCounterVec,
        capacity: usize,
    ) -> AuditQueue {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        let in_flight = Arc::new(AtomicUsize::new(0));
        crate::limits::batches::track(&in_flight, None);
        background
            .handle()
            .spawn(write_audit(rx, sink, events.clone(), in_flight.clone()));
        AuditQueue {
            tx,
            in_flight,
            events,
        }
    }

    /// Queues an event without waiting; a full queue drops it (and counts the drop).
    pub fn send(&self, event: AuditEvent) {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        match self.tx.try_send(event) {
            Ok(()) => self.events.with_label_values(&["queued"]).inc(),
            Err(_) => {
                self.in_flight.fetch_sub(1, Ordering::SeqCst);
                self.events.with_label_values(&["dropped"]).inc();
                tracing::warn!(
                    target: "gateway::auth",
                    "the audit queue is full; a refused JWT was not recorded"
                );
            }
        }
    }
}

async fn write_audit(
    mut rx: mpsc::Receiver<AuditEvent>,
    sink: SharedSink,
    events: IntCounterVec,
    in_flight: Arc<AtomicUsize>,
) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < AUDIT_BATCH {
            match rx.try_recv() {
                Ok(e) => batch.push(e),
                Err(_) => break,
            }
        }
        let n = batch.len() as u64;
        let written = sink.audit(batch).await;
        in_flight.fetch_sub(n as usize, Ordering::SeqCst);
        match written {
            Ok(()) => events.with_label_values(&["written"]).inc_by(n),
            Err(e) => {
                events.with_label_values(&["failed"]).inc_by(n);
                tracing::warn!(
                    target: "gateway::auth",
                    error = %e,
                    events = n,
                    "could not record refused JWTs in the audit log"
                );
            }
        }
    }
}
