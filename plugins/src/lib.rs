//! The gateway's built-in plugins, one module each. Each registers itself with
//! `plugin_sdk::register_plugin!`; the gateway binary links this crate so the registrations are
//! kept (see [`link`]).

pub mod guardrails;
pub mod metrics;
pub mod provider_select;
pub mod request_log;
pub mod wasm_guardrail;

/// Called by the gateway so that the linker keeps this crate, and with it every plugin
/// registration in it.
pub fn link() {}
