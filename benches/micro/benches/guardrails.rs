//! Each built-in guardrail check that runs without the network, on 1 KB and 10 KB of checked
//! text: the figures of the README's per-KB table. The text is English prose with the digits a
//! chat turn carries (a counter, a year), and no personal data, so a PII check scans the whole of
//! it and finds nothing, as on most requests.
//!
//! The JSON checks (`jsonSchema`, `jsonKeys`) are left out: they parse the text as JSON, and
//! prose is not.
//!
//! cargo bench -p micro-benches --bench guardrails

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use serde_json::{json, Value};

use plugins::guardrails::checks::{Check, Input};
use plugins::guardrails::results::Side;

/// About `bytes` of prose: sentences with a number in each, no personal data.
fn prose(bytes: usize) -> String {
    let mut text = String::with_capacity(bytes + 64);
    let mut n = 0;
    while text.len() < bytes {
        n += 1;
        text.push_str(&format!(
            "Item {n} of the 2024 report: the quick brown fox jumps over the lazy dog. "
        ));
    }
    text.truncate(bytes - 1);
    text.push('.');
    text
}

fn checks() -> Vec<(&'static str, Check)> {
    let parse = |id: &str, p: Value| Check::parse(id, &p).unwrap();
    vec![
        (
            "regexMatch (not)",
            parse(
                "default.regexMatch",
                json!({"rule": "(?i)ignore (all )?previous instructions", "not": true}),
            ),
        ),
        (
            "contains (none, 2 words)",
            parse(
                "default.contains",
                json!({"operator": "none", "words": ["password", "secret"]}),
            ),
        ),
        (
            "endsWith",
            parse("default.endsWith", json!({"suffix": "."})),
        ),
        (
            "wordCount",
            parse("default.wordCount", json!({"maxWords": 100000})),
        ),
        (
            "sentenceCount",
            parse("default.sentenceCount", json!({"maxSentences": 100000})),
        ),
        (
            "characterCount",
            parse("default.characterCount", json!({"maxCharacters": 1000000})),
        ),
        (
            "containsCode (SQL, not)",
            parse(
                "default.containsCode",
                json!({"format": "SQL", "not": true}),
            ),
        ),
        (
            "modelWhitelist",
            parse("default.modelWhitelist", json!({"models": ["gpt-bench"]})),
        ),
        (
            "pii (detect, all categories)",
            parse("default.pii", json!({})),
        ),
        (
            "pii (redact, all categories)",
            parse("default.pii", json!({"redact": true})),
        ),
    ]
}

fn per_kb(c: &mut Criterion) {
    let mut group = c.benchmark_group("guardrail_check");
    for kb in [1usize, 10] {
        let text = prose(kb * 1024);
        let segments = [text.clone()];
        let input = Input {
            side: Side::Input,
            text: &text,
            segments: &segments,
            model: Some("gpt-bench"),
            can_rewrite: true,
            request: &Value::Null,
            response: None,
        };
        group.throughput(Throughput::Bytes(text.len() as u64));
        for (name, check) in checks() {
            assert!(
                check.run_local(&input).verdict,
                "{name} passes on the benchmark's text"
            );
            group.bench_with_input(
                BenchmarkId::new(name, format!("{kb}KB")),
                &input,
                |b, input| b.iter(|| check.run_local(input)),
            );
        }
    }
    group.finish();
}

criterion_group!(benches, per_kb);
criterion_main!(benches);
