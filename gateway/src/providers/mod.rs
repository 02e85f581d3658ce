//! Providers: the table of what the gateway can talk to, and one module per wire format.
//!
//! Canonical request types live in `plugin_sdk::llm`; each wire-format module turns them into the
//! provider's request and the provider's answer back into the client's format. With one format
//! per module, N formats need N codecs.

pub mod anthropic;
pub mod openai;
pub mod table;

pub use table::{AuthStyle, ProviderSpec, WireFormat};
