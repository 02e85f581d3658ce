//! The control plane's side of the data plane's background writers: audit events, settled
//! budget usage and request log batches, written to the control plane's database.
//!
//! The plugins call the sink from their own runtime (Pingora's); the database work runs on the
//! control plane's runtime, which owns the pool's connections: each call is spawned there and
//! its `JoinHandle` awaited. An `Err` means nothing of the call was stored (each call is one
//! transaction), so the caller may send it again.

use std::future::Future;
use std::pin::Pin;

use plugin_sdk::sinks::{AuditEvent, ControlPlaneSink, LogRecord, UsageCharge};

use crate::error::AdminError;
use crate::store::Store;

/// A [`ControlPlaneSink`] over a store, running its work on `runtime`.
#[derive(Clone)]
pub struct StoreSink {
    store: Store,
    runtime: tokio::runtime::Handle,
}

impl std::fmt::Debug for StoreSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreSink").finish_non_exhaustive()
    }
}

impl StoreSink {
    /// A sink whose database work runs on `runtime` (the one that owns `store`'s pool).
    pub fn new(store: Store, runtime: tokio::runtime::Handle) -> StoreSink {
        StoreSink { store, runtime }
    }

    /// Runs `work` on the control plane's runtime and waits for it from the caller's.
    async fn run<F>(&self, what: &'static str, work: F) -> Result<(), String>
    where
        F: Future<Output = Result<(), AdminError>> + Send + 'static,
    {
        match self.runtime.spawn(work).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "the control plane could not store {what}");
                Err(format!("cannot store {what}: {}", e.message))
            }
            Err(e) if e.is_cancelled() => Err(format!(
                "cannot store {what}: the control plane has stopped"
            )),
            Err(e) => {
                tracing::error!(error = %e, "storing {what} failed");
                Err(format!("cannot store {what}: the task failed"))
            }
        }
    }
}

type Answer<'a> = Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>>;

// Written out as `#[async_trait]` would expand it (the admin crate does not use the macro).
impl ControlPlaneSink for StoreSink {
    /// Inserts the events into the audit log (see [`Store::record_audit_events`]).
    fn audit<'life0, 'async_trait>(&'life0 self, events: Vec<AuditEvent>) -> Answer<'async_trait>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move {
            let store = self.store.clone();
            self.run("audit events", async move {
                store.record_audit_events(&events).await
            })
            .await
        })
    }

    /// Adds the usage to the stored budgets (see [`Store::apply_usage_charges`]).
    fn charge_usage<'life0, 'async_trait>(
        &'life0 self,
        charges: Vec<UsageCharge>,
    ) -> Answer<'async_trait>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move {
            let store = self.store.clone();
            self.run("usage charges", async move {
                store.apply_usage_charges(&charges).await.map(|_| ())
            })
            .await
        })
    }

    /// Writes the batch into `request_logs` (see [`Store::write_request_logs`]).
    fn write_logs<'life0, 'async_trait>(
        &'life0 self,
        records: Vec<LogRecord>,
    ) -> Answer<'async_trait>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move {
            let store = self.store.clone();
            self.run("request logs", async move {
                store.write_request_logs(&records).await.map(|_| ())
            })
            .await
        })
    }
}
