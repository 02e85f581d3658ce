//! A check a plugin starts in `on_request` and leaves for a later plugin to finish, so that the
//! work several plugins do against one store travels in one round trip: in shared mode the
//! rate limit's counters, the budgets' reservation and the cache's lookup are one Redis call.
//!
//! A plugin that defers puts its check in [`RequestCx::deferred`]. Before the pipeline calls a
//! plugin that does not [join](crate::Plugin::joins_deferred) it, and at the end of the request
//! phase, it [completes](Deferred::complete) the check alone; so every other plugin sees the
//! request as if the deferring plugin had finished, and a refusal still stops the request
//! before anything after it runs. A joining plugin takes the check ([`Deferred::into_any`]),
//! adds its own work when it knows the type, and completes the whole.

use std::any::Any;

use async_trait::async_trait;

use crate::{GatewayError, RequestCx};

/// A deferred check: see the module's documentation.
#[async_trait]
pub trait Deferred: Any + Send + Sync {
    /// Runs the check and applies its outcome to the request; a refusal is the error.
    async fn complete(self: Box<Self>, cx: &mut RequestCx) -> Result<(), GatewayError>;

    /// The check as `Any`, for a joining plugin to see whether it knows the type.
    fn as_any(&self) -> &(dyn Any + Send + Sync);

    /// The check as `Any`, for a joining plugin to take its concrete type back.
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send + Sync>;
}

impl RequestCx {
    /// Completes the deferred check, if any (see the module's documentation).
    pub async fn complete_deferred(&mut self) -> Result<(), GatewayError> {
        match self.deferred.take() {
            Some(check) => check.complete(self).await,
            None => Ok(()),
        }
    }

    /// Leaves `check` to a later plugin, completing first whatever was deferred before it.
    pub async fn defer(&mut self, check: Box<dyn Deferred>) -> Result<(), GatewayError> {
        self.complete_deferred().await?;
        self.deferred = Some(check);
        Ok(())
    }
}

impl std::fmt::Debug for dyn Deferred {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Deferred")
    }
}
