//! RFC 3339 times (`expires_at`, `next_usage_reset_at`...): a time or `None`, never a panic;
//! a fraction of a second changes nothing.
#![no_main]
use libfuzzer_sys::fuzz_target;
use plugin_sdk::time::parse_rfc3339;

fuzz_target!(|input: &[u8]| {
    let Ok(text) = std::str::from_utf8(input) else {
        return;
    };
    let Some(secs) = parse_rfc3339(text) else {
        return;
    };
    if text.len() > 19 && !text[19..].starts_with('.') {
        let with_fraction = format!("{}.5{}", &text[..19], &text[19..]);
        assert_eq!(parse_rfc3339(&with_fraction), Some(secs), "{text:?}");
    }
});
