//! Log redaction: any text goes through without a panic; a JSON document stays JSON, and the
//! value of every key that names a secret, at any depth, comes out as "[REDACTED]".
#![no_main]
use libfuzzer_sys::fuzz_target;
use plugins::log_store::redact::{is_secret_key, redact};
use serde_json::Value;

fuzz_target!(|input: &[u8]| {
    let Ok(text) = std::str::from_utf8(input) else {
        return;
    };
    let out = redact(text);
    if serde_json::from_str::<Value>(text).is_err() {
        return;
    }
    let parsed: Value = serde_json::from_str(&out).expect("redacted JSON stays JSON");
    check(&parsed);
});

fn check(value: &Value) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                if is_secret_key(k) {
                    assert_eq!(v, "[REDACTED]", "the secret under {k:?} survived");
                } else {
                    check(v);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(check),
        _ => {}
    }
}
