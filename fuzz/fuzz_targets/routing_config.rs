//! Routing configs (`x-gw-config` JSON): parsed, or refused with problems that name a field.
#![no_main]
use gateway::routing::config::RoutingConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(input) else {
        return;
    };
    let _ = RoutingConfig::parse(&value);
    if let Err(e) = RoutingConfig::parse_for_request(&value) {
        assert_eq!(e.status().as_u16(), 400, "{}", e.message);
    }
});
