//! The metrics of wasm guardrails, shared by every guardrail of the process:
//!
//! - `gw_wasm_guardrail_calls_total{plugin, outcome}`: each check's outcome: `allow`, `deny`,
//!   `rewrite`, or an error (`timeout`, `memory`, `trap`, `bad_verdict`, `init_error`,
//!   `unavailable`);
//! - `gw_wasm_guardrail_counter_total{plugin, name}`: the guests' own counters (`counter-add`),
//!   at most 32 names per guardrail.
//!
//! `plugin` is the guardrail's `id` from the YAML, so both label sets stay bounded.

use std::sync::OnceLock;

use prometheus::{IntCounterVec, Opts, Registry};

struct Counters {
    calls: IntCounterVec,
    guest: IntCounterVec,
}

fn counters() -> Option<&'static Counters> {
    static COUNTERS: OnceLock<Option<Counters>> = OnceLock::new();
    COUNTERS
        .get_or_init(|| {
            let calls = IntCounterVec::new(
                Opts::new(
                    "gw_wasm_guardrail_calls_total",
                    "Checks run by wasm guardrails, by outcome",
                ),
                &["plugin", "outcome"],
            )
            .ok()?;
            let guest = IntCounterVec::new(
                Opts::new(
                    "gw_wasm_guardrail_counter_total",
                    "Counters kept by wasm guardrails themselves",
                ),
                &["plugin", "name"],
            )
            .ok()?;
            Some(Counters { calls, guest })
        })
        .as_ref()
}

/// Registers the counters in a gateway's registry (once per registry; a second wasm guardrail
/// finds them there).
pub fn register(registry: &Registry) -> Result<(), String> {
    let Some(c) = counters() else {
        return Err("cannot create the wasm guardrail metrics".into());
    };
    for collector in [c.calls.clone(), c.guest.clone()] {
        match registry.register(Box::new(collector)) {
            Ok(()) | Err(prometheus::Error::AlreadyReg) => {}
            Err(e) => return Err(format!("cannot register the wasm guardrail metrics: {e}")),
        }
    }
    Ok(())
}

/// Counts one check's outcome.
pub fn call(plugin: &str, outcome: &str) {
    if let Some(c) = counters() {
        c.calls.with_label_values(&[plugin, outcome]).inc();
    }
}

/// Adds to a guest's counter (the name is already bounded by the caller).
pub fn guest_counter(plugin: &str, name: &str, delta: u64) {
    if let Some(c) = counters() {
        c.guest.with_label_values(&[plugin, name]).inc_by(delta);
    }
}
