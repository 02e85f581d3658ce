//! Every provider's stream translator (Anthropic, Gemini, Bedrock, Cohere, and Bedrock's
//! Anthropic events for /v1/messages): arbitrary bytes in arbitrary pieces never panic, and
//! what comes out is whole server-sent events.
#![no_main]
use gateway::providers::{self, CallInfo, WireFormat};
use libfuzzer_sys::fuzz_target;
use plugin_sdk::Route;

const CALLS: [(WireFormat, Route); 5] = [
    (WireFormat::Anthropic, Route::ChatCompletions),
    (WireFormat::Gemini, Route::ChatCompletions),
    (WireFormat::Bedrock, Route::ChatCompletions),
    (WireFormat::Cohere, Route::ChatCompletions),
    (WireFormat::Bedrock, Route::Messages),
];

fuzz_target!(|input: &[u8]| {
    let [which, cut, flags, stream @ ..] = input else {
        return;
    };
    let (format, route) = CALLS[usize::from(*which) % CALLS.len()];
    let call = CallInfo {
        provider: "fuzz",
        format,
        route,
        model: "m".to_owned(),
        include_usage: flags & 1 == 1,
        hidden_usage: false,
        base64_embeddings: false,
        strict: flags & 2 == 2,
        waive_provisioned_cost: false,
    };
    let Some(mut decoder) = providers::stream(&call) else {
        return;
    };
    let mut out = Vec::new();
    for piece in stream.chunks(usize::from(*cut).max(1)) {
        out.extend_from_slice(&decoder.push(piece));
        if decoder.overflowed() {
            return;
        }
    }
    out.extend_from_slice(&decoder.finish());
    let _ = decoder.usage();
    let _ = decoder.model();
    assert!(out.is_empty() || out.ends_with(b"\n\n"), "a part of an event came out");
});
