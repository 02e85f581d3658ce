//! Upstream URLs (`custom_host`, provider base URLs): parsed or refused, never a panic; a
//! parsed one builds request paths.
#![no_main]
use gateway::upstream::Endpoint;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Ok(text) = std::str::from_utf8(input) else {
        return;
    };
    if let Ok(endpoint) = Endpoint::parse(text) {
        let _ = endpoint.authority();
        let _ = endpoint.path_and_query("/chat/completions", Some("a=b"));
    }
});
