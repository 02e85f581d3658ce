//! What the rate and usage limit plugins share: which policies govern a request and which of
//! their counters it is charged to ([`matching`]), sliding-window arithmetic ([`window`]), the
//! connection to the Redis server that holds counters shared by several gateway instances
//! ([`redis`]), shared mode's one-round-trip admission ([`admission`]) and its background
//! writes ([`batches`]).

pub mod admission;
pub mod batches;
pub mod matching;
pub mod redis;
pub mod window;
