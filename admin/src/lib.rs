//! The control plane: organisations, workspaces, users, roles, API keys, policies, configs,
//! providers and integrations, audit logs, analytics, MCP servers — an axum Router over sqlx
//! (SQLite by default, PostgreSQL for shared deployments), mounted by the gateway under `/v1`.
//!
//! Its stores publish immutable snapshots that the data plane reads through the traits of
//! `plugin_sdk::store`; until they exist, the gateway reads providers and configs from its YAML.
