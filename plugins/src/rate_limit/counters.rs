//! The counter backends' one interface: check and charge all of a request's rate limits at
//! once, and charge token usage after the response.

use std::fmt;

use async_trait::async_trait;

/// One sliding-window counter a request is checked against.
#[derive(Debug, Clone, PartialEq)]
pub struct CounterSpec {
    /// The counter's stable id (`api_key:<id>:0`, `policy:<id>:<value key>`...). The ids of
    /// one call must differ.
    pub id: String,
    /// The window length in seconds (60, 3600 or 86400).
    pub window_secs: u64,
    /// At most this many requests (or tokens) in any sliding window.
    pub limit: f64,
    /// Added now when allowed: 1 for a request limit; 0 for a token limit, which is only
    /// checked here and charged after the response ([`Counters::charge`]).
    pub cost: u64,
}

impl CounterSpec {
    pub fn window_ms(&self) -> u64 {
        self.window_secs.saturating_mul(1000).max(1)
    }
}

/// The outcome of [`Counters::check_and_charge`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Every counter allowed its cost, and each was charged.
    Allowed,
    /// At least one counter refused, and none was charged. `spec` is the index of the refused
    /// counter whose window frees last; `retry_after_secs` (at least 1) is when all of them
    /// allow the request again if nothing else is counted meanwhile.
    Limited { spec: usize, retry_after_secs: u64 },
    /// The in-process store holds `max_counters` live counters and this request needs new
    /// ones: it is refused (a store an attacker can fill must not stop counting), and nothing
    /// was charged.
    Full { max_counters: usize },
}

/// The backend could not answer (Redis unreachable, memory bound reached). The message holds
/// no secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterError(pub String);

impl fmt::Display for CounterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CounterError {}

/// Where the sliding-window counters live: in process ([`super::memory::MemoryCounters`]) or in
/// Redis, shared by every gateway instance ([`super::redis::RedisCounters`]).
///
/// `now_ms` is the gateway's clock (milliseconds since the Unix epoch), passed in so that the
/// backends and their tests agree on time; instances sharing Redis agree within their clocks'
/// skew.
#[async_trait]
pub trait Counters: Send + Sync + 'static {
    /// The backend's name for logs (`memory`, `redis`).
    fn name(&self) -> &'static str;

    /// The Redis backend, whose check joins shared mode's one-round-trip admission
    /// ([`crate::limits::admission`]); `None` for the others.
    fn redis(&self) -> Option<&super::redis::RedisCounters> {
        None
    }

    /// Checks every counter and, only if all of them allow their cost, charges each: all or
    /// nothing, atomically with respect to other calls (of every instance, for Redis).
    async fn check_and_charge(
        &self,
        specs: &[CounterSpec],
        now_ms: u64,
    ) -> Result<Decision, CounterError>;

    /// Adds `amount` to a counter without checking it (tokens reported after a response).
    async fn charge(
        &self,
        id: &str,
        window_secs: u64,
        amount: u64,
        now_ms: u64,
    ) -> Result<(), CounterError>;
}

/// The refusal to report among several: the one that frees last.
pub(crate) fn latest_refusal(refusals: impl IntoIterator<Item = (usize, u64)>) -> Option<Decision> {
    refusals
        .into_iter()
        .max_by_key(|&(i, secs)| (secs, std::cmp::Reverse(i)))
        .map(|(spec, retry_after_secs)| Decision::Limited {
            spec,
            retry_after_secs,
        })
}
