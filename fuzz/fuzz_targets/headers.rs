//! The gateway's own headers (`x-gw-*`): any values give a parsed set or a 400 naming the
//! header.
#![no_main]
use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use plugin_sdk::headers::GwHeaders;

const NAMES: &[&str] = &[
    "x-gw-config",
    "x-gw-provider",
    "x-gw-metadata",
    "x-gw-request-timeout",
    "x-gw-forward-headers",
    "x-gw-custom-host",
    "x-gw-virtual-key",
    "x-gw-cache-namespace",
    "x-gw-cache-force-refresh",
    "x-gw-trace-id",
    "x-gw-span-id",
    "x-gw-strict-open-ai-compliance",
    "x-gw-aws-region",
    "x-gw-azure-deployment-id",
    "x-portkey-config",
    "x-portkey-metadata",
];

fuzz_target!(|input: &[u8]| {
    let mut headers = HeaderMap::new();
    // Each line: one byte naming the header, then its value.
    for line in input.split(|b| *b == b'\n') {
        let Some((&which, value)) = line.split_first() else {
            continue;
        };
        let name = HeaderName::from_static(NAMES[usize::from(which) % NAMES.len()]);
        if let Ok(value) = HeaderValue::from_bytes(value) {
            headers.append(name, value);
        }
    }
    if let Err(e) = GwHeaders::parse(&headers) {
        assert_eq!(e.status().as_u16(), 400, "{}", e.message);
    }
});
