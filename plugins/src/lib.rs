//! The gateway's built-in plugins, one module each. Each registers itself with
//! `plugin_sdk::register_plugin!`; the gateway binary links this crate so the registrations are
//! kept (see [`link`]).

pub mod auth;
pub mod cache;
pub mod guardrails;
pub mod limits;
pub mod log_store;
pub mod metrics;
pub mod pricing;
pub mod provider_select;
pub mod rate_limit;
pub mod request_log;
pub mod usage_limit;
pub mod wasm_guardrail;

/// Called by the gateway so that the linker keeps this crate, and with it every plugin
/// registration in it.
pub fn link() {}
