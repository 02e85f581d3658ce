//! What a gateway plugin author sees.
//!
//! A plugin is a value implementing [`Plugin`]; the gateway runs the plugins of its pipeline in
//! the order the YAML lists them, one phase at a time (see [`Plugin`] for the phases and when each
//! runs). A built-in plugin describes itself with a [`PluginFactory`] and registers with
//! [`register_plugin!`], which is how `gateway plugins list` and the YAML loader find it.
//!
//! The context a plugin reads and writes is [`RequestCx`]; errors that end a request are
//! [`GatewayError`], mapped to an HTTP status and JSON body in exactly one place
//! ([`GatewayError::status`] and [`GatewayError::body`]).

pub mod access;
pub mod context;
pub mod deferred;
pub mod egress;
pub mod error;
pub mod flow;
pub mod headers;
pub mod llm;
pub mod plugin;
pub mod registry;
pub mod sinks;
pub mod store;
pub mod target;
pub mod testing;
pub mod time;

/// The hash state of lookup tables consulted on every request (providers by slug, prices,
/// budget and rate counters, cached answers): foldhash. On the short string keys these tables
/// hold it costs a fraction of std's SipHash, which showed up in every request's profile. It
/// is seeded per process from addresses that address-space randomisation moves (foldhash is
/// built without its `std` feature here), so clients cannot aim keys at one bucket from outside;
/// it is not a keyed cryptographic hash, and no table relies on it being one.
pub type FastState = foldhash::fast::RandomState;

/// A `HashMap` with [`FastState`]; make one with `FastMap::default()`.
pub type FastMap<K, V> = std::collections::HashMap<K, V, FastState>;

pub use access::{AccessStore, Principal};
pub use context::{RequestCx, ResponseInfo, Route, Usage};
pub use deferred::Deferred;
pub use error::{ErrorKind, GatewayError, ProviderFailure};
pub use flow::{Flow, PluginResponse};
pub use plugin::{Chunk, Phases, Plugin};
pub use registry::{BuildCx, ConfigIssue, PluginDescriptor, PluginFactory};
pub use store::{ProviderRecord, ProviderStore};
pub use target::{RoutePlan, Target};

// Re-exported so that `register_plugin!` works in crates that do not depend on inventory.
#[doc(hidden)]
pub use inventory;
