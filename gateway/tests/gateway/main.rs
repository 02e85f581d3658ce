//! Integration tests: the mock provider and the gateway on ephemeral ports, driven over HTTP.

mod admin_listener;
mod anthropic;
mod cli;
mod clouds;
mod common;
mod control_plane;
mod enforcement;
mod guardrails;
mod hostile;
mod integration_models;
mod jwt;
mod observability;
mod passthrough;
mod postgres_faults;
mod providers;
mod routes;
mod routing;
mod saved_providers;
mod selection;
mod shared_instances;
mod shutdown;
mod streaming;
mod tenancy;
mod validation;
mod wasm_guardrails;
