//! Criterion micro-benchmarks of the gateway's per-request work; see `benches/pipeline.rs`.
//! Run with `cargo bench -p micro-benches`.
