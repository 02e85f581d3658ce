//! Criterion micro-benchmarks of the gateway's per-request work: `benches/pipeline.rs` (request
//! decoding, the pre-enforcement pipeline, answer summaries and stream splitting) and
//! `benches/plugins.rs` (each plugin of the default pipeline against a real control plane, and
//! the whole default pipeline). Run with `cargo bench -p micro-benches`; results are kept in
//! `benches/results/micro.md`.
