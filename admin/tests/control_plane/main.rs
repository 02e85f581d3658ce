//! The control plane's tests. Each runs on SQLite, and again on PostgreSQL when
//! `GW_TEST_POSTGRES_URL` is set (each test in a schema of its own, dropped at the end).

mod common;

mod access_snapshot;
mod api_keys;
mod audit;
mod authorisation;
mod authz_matrix;
mod bootstrap;
mod bulk;
mod config_secrets;
mod configs;
mod deployments;
mod guardrails;
mod incremental_snapshot;
mod integration_models;
mod integrations;
mod key_rotation;
mod logs;
mod members;
mod openapi;
mod policies;
mod providers;
mod role_climbing;
mod settings;
mod sink;
mod users;
mod workspaces;
