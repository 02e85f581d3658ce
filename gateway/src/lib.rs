//! The gateway: a Pingora proxy in front of many model providers, with a plugin pipeline.
//!
//! Layout: [`proxy`] is the Pingora hook implementation; [`request`] classifies and reads
//! requests; [`llm`] handles the LLM routes and [`passthrough`] every other provider path;
//! [`pipeline`] runs the plugins; [`routing`] turns a plan into targets; [`providers`] holds
//! the provider table and wire formats; [`upstream`] talks to providers; [`config`] loads and
//! validates the YAML; [`respond`] writes every response the gateway itself produces;
//! [`control_plane`] hands control-plane requests to the `admin` crate's Router.

pub mod config;
pub mod control_plane;
pub mod llm;
pub mod logging;
pub mod passthrough;
pub mod pipeline;
pub mod providers;
pub mod proxy;
pub mod request;
pub mod respond;
pub mod routing;
pub mod server;
pub mod sse;
pub mod stores;
pub mod tokens;
pub mod upstream;

pub use config::{GatewayConfig, Overrides};
pub use server::{spawn, Gateway, RunningGateway};
