//! The cache's canonical request body: the same JSON written another way (key order,
//! whitespace) gives the same cache key.
#![no_main]
use libfuzzer_sys::fuzz_target;
use plugins::cache::key::canonical_body;
use serde_json::{Map, Value};

fuzz_target!(|input: &[u8]| {
    let Ok(first) = canonical_body(input, &Map::new()) else {
        return;
    };
    let Ok(value) = serde_json::from_slice::<Value>(input) else {
        return;
    };
    let rewritten = serde_json::to_vec_pretty(&reversed(value)).unwrap();
    let second = canonical_body(&rewritten, &Map::new()).expect("the same JSON");
    assert_eq!(first, second);
});

/// The same value with every object's keys written in reverse order.
fn reversed(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            entries.reverse();
            Value::Object(entries.into_iter().map(|(k, v)| (k, reversed(v))).collect::<Map<_, _>>())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(reversed).collect()),
        other => other,
    }
}
