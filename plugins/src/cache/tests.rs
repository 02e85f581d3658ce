//! Tests of the cache: the key, the framing, both backends, re-streaming, and the plugin's
//! phases driven with hand-made request contexts.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use serde_json::{json, Map, Value};

use plugin_sdk::access::{AuthMethod, KeyKind, Principal};
use plugin_sdk::llm::LlmRequest;
use plugin_sdk::{PluginDescriptor, RoutePlan};

use super::config::{CacheConfig, EvictionChoice};
use super::*;

// ---------------------------------------------------------------------------------------------
// Helpers

fn cx_for(route: Route, path: &str, body: &Value) -> RequestCx {
    let mut cx = RequestCx::new("t".into(), route, Method::POST, path.into());
    cx.body = Bytes::from(body.to_string());
    cx.request = LlmRequest::decode(route, &cx.body).expect("a valid request");
    cx.plan = Some(RoutePlan::Single(Target::default()));
    cx
}

fn chat_body(content: &str) -> Value {
    json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": content}]})
}

fn chat_cx(body: &Value) -> RequestCx {
    cx_for(Route::ChatCompletions, "/v1/chat/completions", body)
}

fn openai() -> Target {
    Target {
        provider: "openai".into(),
        api_key: Some("sk-secret".into()),
        ..Target::default()
    }
}

fn key_of(cx: &RequestCx, target: &Target) -> CacheKey {
    key::key_for(cx, target).expect("a key")
}

fn principal(workspace: &str) -> Principal {
    Principal {
        method: AuthMethod::ApiKey(KeyKind::WorkspaceService),
        organisation_id: Some("org".into()),
        workspace_id: Some(workspace.into()),
        api_key_id: Some("key-1".into()),
        user_id: None,
        scopes: vec!["completions.write".into()],
        rate_limits: Vec::new(),
        budgets: Vec::new(),
    }
}

fn completion(content: &str) -> Value {
    json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1_700_000_000,
        "model": "gpt-4o-mini-2024", "system_fingerprint": "fp_1",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                     "logprobs": null, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    })
}

fn whole(status: u16, body: &Value) -> ResponseParts {
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    ResponseParts {
        status: StatusCode::from_u16(status).unwrap(),
        headers,
        body: Bytes::from(body.to_string()),
    }
}

/// The `data:` payloads of a stream, `[DONE]` included as a string.
fn data_of(sse: &[u8]) -> Vec<String> {
    replay::events(sse)
        .into_iter()
        .filter_map(|e| e.data)
        .collect()
}

fn json_chunks(sse: &[u8]) -> Vec<Value> {
    data_of(sse)
        .into_iter()
        .filter(|d| d != "[DONE]")
        .map(|d| serde_json::from_str(&d).expect("every event is JSON"))
        .collect()
}

fn entry(body: &str) -> Entry {
    Entry {
        status: 200,
        content_type: "application/json".into(),
        sse: false,
        usage_chunk: false,
        stored_at_ms: now_ms(),
        provider: Some("openai".into()),
        model: Some("m".into()),
        body: Bytes::from(body.to_owned()),
    }
}

fn build(config: Value) -> (Arc<dyn Plugin>, prometheus::Registry) {
    build_with(config, BuildCx::standalone())
}

fn build_with(config: Value, cx: BuildCx) -> (Arc<dyn Plugin>, prometheus::Registry) {
    let registry = cx.metrics.clone();
    let plugin = PluginDescriptor::find("cache")
        .expect("registered")
        .build(&config, &cx)
        .unwrap_or_else(|e| panic!("{e:?}"));
    (plugin, registry)
}

/// A plugin over a memory store the test can reach.
fn with_memory(config: Value) -> (CachePlugin, Arc<MemoryStore>, prometheus::Registry) {
    let config: CacheConfig = serde_json::from_value(config).unwrap();
    let registry = prometheus::Registry::new();
    let metrics = CacheMetrics::register(&registry).unwrap();
    let store = Arc::new(MemoryStore::new(config.max_bytes, config.eviction));
    registry.register(store.size_metric().unwrap()).unwrap();
    let plugin = CachePlugin::new(&config, store.clone(), metrics);
    (plugin, store, registry)
}

fn metric(registry: &prometheus::Registry, name: &str, label: Option<(&str, &str)>) -> f64 {
    for family in registry.gather() {
        if family.name() != name {
            continue;
        }
        for m in family.get_metric() {
            let matches = match label {
                None => true,
                Some((k, v)) => m
                    .get_label()
                    .iter()
                    .any(|l| l.name() == k && l.value() == v),
            };
            if matches {
                if name.ends_with("_total") {
                    return m.get_counter().get_value();
                }
                return m.get_gauge().get_value();
            }
        }
    }
    0.0
}

async fn route(plugin: &dyn Plugin, cx: &mut RequestCx, target: &Target) -> Option<PluginResponse> {
    let mut target = target.clone();
    match plugin.on_route(cx, &mut target).await.expect("on_route") {
        Flow::Continue => None,
        Flow::Respond(r) => Some(r),
    }
}

fn header<'a>(r: &'a PluginResponse, name: &str) -> Option<&'a str> {
    r.headers
        .iter()
        .find(|(n, _)| n.as_str() == name)
        .and_then(|(_, v)| v.to_str().ok())
}

/// A cached target, as a config node with `cache: {mode: simple}` gives it.
fn cached(mode: CacheMode, max_age: Option<u64>) -> Target {
    Target {
        cache: Some(CacheSettings {
            mode,
            max_age_secs: max_age,
        }),
        ..openai()
    }
}

/// Runs a stream through `on_chunk` (status 200), event by event.
fn relay(plugin: &dyn Plugin, cx: &mut RequestCx, events: &[&str]) {
    cx.response.status = Some(200);
    cx.response.streamed = true;
    for e in events {
        let mut chunk = Chunk {
            data: Bytes::from(e.to_string()),
        };
        assert!(matches!(
            plugin.on_chunk(cx, &mut chunk).unwrap(),
            Flow::Continue
        ));
    }
}

const STREAM: [&str; 4] = [
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi there\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
    "data: [DONE]\n\n",
];

const USAGE_EVENT: &str = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5}}\n\n";

fn streaming(mut body: Value, include_usage: bool) -> Value {
    body["stream"] = json!(true);
    if include_usage {
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

// ---------------------------------------------------------------------------------------------
// The key

#[test]
fn the_same_request_has_the_same_key_whatever_its_json_layout() {
    let a = chat_cx(&chat_body("hello"));
    let mut b = chat_cx(&chat_body("hello"));
    b.body = Bytes::from_static(
        b"{ \"messages\" : [ {\"content\":\"hello\", \"role\":\"user\"} ],\n \"model\":\"gpt-4o-mini\" }",
    );
    assert_eq!(key_of(&a, &openai()), key_of(&b, &openai()));
    assert_eq!(key_of(&a, &openai()).hex().len(), 64);
}

#[test]
fn stream_and_stream_options_are_not_in_the_key() {
    let plain = chat_cx(&chat_body("hello"));
    let streamed = chat_cx(&streaming(chat_body("hello"), true));
    assert_eq!(key_of(&plain, &openai()), key_of(&streamed, &openai()));
}

#[test]
fn what_changes_the_answer_changes_the_key() {
    let base_cx = chat_cx(&chat_body("hello"));
    let base = key_of(&base_cx, &openai());

    let mut other_model = chat_body("hello");
    other_model["model"] = json!("gpt-4o");
    let mut with_temperature = chat_body("hello");
    with_temperature["temperature"] = json!(0.5);
    for body in [chat_body("hello!"), other_model, with_temperature] {
        assert_ne!(key_of(&chat_cx(&body), &openai()), base, "{body}");
    }

    let mut ns = chat_cx(&chat_body("hello"));
    ns.gw.cache_namespace = Some("tenant-b".into());
    assert_ne!(key_of(&ns, &openai()), base);
    let mut ns2 = chat_cx(&chat_body("hello"));
    ns2.gw.cache_namespace = Some("tenant-c".into());
    assert_ne!(key_of(&ns2, &openai()), key_of(&ns, &openai()));

    let groq = Target {
        provider: "groq".into(),
        ..openai()
    };
    let slug = Target {
        slug: Some("team-openai".into()),
        ..openai()
    };
    let host = Target {
        custom_host: Some("http://127.0.0.1:9/v1".into()),
        ..openai()
    };
    let mut overrides = Map::new();
    overrides.insert("model".into(), json!("gpt-4o"));
    let overridden = Target {
        override_params: overrides,
        ..openai()
    };
    let mut deployment = openai();
    deployment
        .settings
        .push(("azure_deployment_id".into(), "d1".into()));
    for target in [groq, slug, host, overridden, deployment] {
        assert_ne!(key_of(&base_cx, &target), base, "{target:?}");
    }

    let mut embeddings_path = chat_cx(&chat_body("hello"));
    embeddings_path.path = "/v1/other".into();
    assert_ne!(key_of(&embeddings_path, &openai()), base);

    let mut strict = chat_cx(&chat_body("hello"));
    strict.gw.strict_openai_compliance = Some(true);
    assert_ne!(key_of(&strict, &openai()), base);
}

#[test]
fn override_params_are_applied_before_hashing() {
    // Asking for gpt-4o directly, or through a target that overrides the model to gpt-4o, is
    // the same provider request.
    let mut direct = chat_body("hello");
    direct["model"] = json!("gpt-4o");
    let mut overrides = Map::new();
    overrides.insert("model".into(), json!("gpt-4o"));
    let overriding = Target {
        override_params: overrides,
        ..openai()
    };
    assert_eq!(
        key_of(&chat_cx(&chat_body("hello")), &overriding),
        key_of(&chat_cx(&direct), &openai())
    );
}

#[test]
fn metadata_credentials_and_secret_settings_are_not_in_the_key() {
    let base_cx = chat_cx(&chat_body("hello"));
    let base = key_of(&base_cx, &openai());

    let mut with_metadata = chat_cx(&chat_body("hello"));
    with_metadata
        .gw
        .metadata
        .insert("_user".into(), "ann".into());
    with_metadata.gw.api_key = Some("gw-key".into());
    with_metadata.trace_id = "another".into();
    with_metadata
        .headers
        .insert("x-custom", HeaderValue::from_static("1"));
    assert_eq!(key_of(&with_metadata, &openai()), base);

    let other_credential = Target {
        api_key: Some("sk-other".into()),
        ..openai()
    };
    assert_eq!(key_of(&base_cx, &other_credential), base);

    let mut secret_header = chat_cx(&chat_body("hello"));
    secret_header
        .gw
        .provider_settings
        .0
        .push(("aws_secret_access_key".into(), "s3cr3t".into()));
    assert_eq!(key_of(&secret_header, &openai()), base);

    // A non-secret setting sent as a header counts, like the target's own.
    let mut region = chat_cx(&chat_body("hello"));
    region
        .gw
        .provider_settings
        .0
        .push(("aws_region".into(), "eu-west-1".into()));
    assert_ne!(key_of(&region, &openai()), base);
    let mut own = openai();
    own.settings.push(("aws_region".into(), "eu-west-1".into()));
    assert_eq!(key_of(&base_cx, &own), key_of(&region, &openai()));
    // ...and the target's own value wins over the header's.
    let mut both = chat_cx(&chat_body("hello"));
    both.gw
        .provider_settings
        .0
        .push(("aws_region".into(), "us-east-1".into()));
    assert_eq!(key_of(&both, &own), key_of(&region, &openai()));
}

#[test]
fn workspaces_never_share_entries() {
    let mut a = chat_cx(&chat_body("hello"));
    a.extensions.insert(principal("ws-a"));
    let mut a2 = chat_cx(&chat_body("hello"));
    a2.extensions.insert(principal("ws-a"));
    let mut b = chat_cx(&chat_body("hello"));
    b.extensions.insert(principal("ws-b"));
    let anonymous = chat_cx(&chat_body("hello"));
    assert_eq!(key_of(&a, &openai()), key_of(&a2, &openai()));
    assert_ne!(key_of(&a, &openai()), key_of(&b, &openai()));
    assert_ne!(key_of(&a, &openai()), key_of(&anonymous, &openai()));
}

#[test]
fn the_canonical_body_sorts_keys_and_drops_stream_fields() {
    let body = br#"{"stream": true, "b": {"d": [1, {"f": 4, "e": "x\"y"}], "c": 2.5}, "a": null,
        "stream_options": {"include_usage": true}}"#;
    let mut overrides = Map::new();
    overrides.insert("z".into(), json!(false));
    let out = key::canonical_body(body, &overrides).unwrap();
    assert_eq!(
        String::from_utf8(out).unwrap(),
        r#"{"a":null,"b":{"c":2.5,"d":[1,{"e":"x\"y","f":4}]},"z":false}"#
    );
    assert!(key::canonical_body(b"[1, 2]", &Map::new()).is_err());
    assert!(key::canonical_body(b"{", &Map::new()).is_err());
}

/// The canonical body as parsing into a `Value` gives it: what the streaming writer must match.
fn canonical_via_value(body: &[u8], overrides: &Map<String, Value>) -> Vec<u8> {
    let mut value: Value = serde_json::from_slice(body).expect("JSON");
    let map = value.as_object_mut().expect("an object");
    for (k, v) in overrides {
        map.insert(k.clone(), v.clone());
    }
    map.remove("stream");
    map.remove("stream_options");
    let mut out = Vec::new();
    key::write_canonical(&value, &mut out);
    out
}

#[test]
fn the_canonical_body_matches_the_value_reference_on_tricky_input() {
    let bodies: &[&str] = &[
        r#"{}"#,
        r#"{"b": 1, "a": 2, "b": 3}"#,
        r#"{"n": [0, -0, 1.0, -1.5e-7, 1e2, 2E-3, 18446744073709551615, -9223372036854775808]}"#,
        r#"{"big": 123456789012345678901234567890, "neg": -0.0, "f": 0.1}"#,
        r#"{"s": "tab\there \"q\" back\\slash \u00e9 \ud83d\ude00 \u0001 / \/ é😀"}"#,
        r#"{"\u0061": 1, "a": 2, "é": 3, "e\u0301": 4, "": 5}"#,
        r#"{"stream": true, "stream_options": {"x": 1}, "messages": [{"role": "user",
            "content": [{"type": "text", "text": "hi"}, {"type": "image_url",
            "image_url": {"url": "data:,x", "detail": "low"}}]}], "temperature": 0.7}"#,
        r#"{"a": [[], {}, [{}], null, true, false, "", [null]]}"#,
        r#"{"model": "m", "stream": false, "model": "n"}"#,
    ];
    let mut overrides = Map::new();
    overrides.insert("temperature".into(), json!(0.2));
    overrides.insert("zz".into(), json!({"b": [1, 2.5], "a": "\u{1}"}));
    for body in bodies {
        for o in [&Map::new(), &overrides] {
            assert_eq!(
                String::from_utf8(key::canonical_body(body.as_bytes(), o).unwrap()).unwrap(),
                String::from_utf8(canonical_via_value(body.as_bytes(), o)).unwrap(),
                "body {body}"
            );
        }
    }
}

#[test]
fn the_canonical_body_matches_the_value_reference_on_generated_input() {
    // A small deterministic generator: nested objects with shuffled and repeated keys, odd
    // whitespace, escapes and numbers of every kind.
    struct Gen(u64);
    impl Gen {
        fn next(&mut self, n: u64) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 33) % n
        }
        fn space(&mut self, out: &mut String) {
            out.push_str([" ", "", "\n ", "\t", ""][self.next(5) as usize]);
        }
        fn string(&mut self, out: &mut String) {
            const PIECES: &[&str] = &[
                "a",
                "b",
                "stream",
                "model",
                "\\\"",
                "\\n",
                "\\u00e9",
                "é",
                "\\ud83d\\ude00",
                "\\u0000",
                "z",
                "\\/",
                "0",
            ];
            out.push('"');
            for _ in 0..self.next(4) {
                out.push_str(PIECES[self.next(PIECES.len() as u64) as usize]);
            }
            out.push('"');
        }
        fn value(&mut self, depth: u32, out: &mut String) {
            let kinds = if depth >= 4 { 6 } else { 8 };
            match self.next(kinds) {
                0 => out.push_str("null"),
                1 => out.push_str(["true", "false"][self.next(2) as usize]),
                2 => {
                    const NUMBERS: &[&str] = &[
                        "0",
                        "-0",
                        "7",
                        "-42",
                        "3.25",
                        "1e3",
                        "-2.5E-4",
                        "0.1",
                        "18446744073709551615",
                        "18446744073709551616",
                        "-9223372036854775809",
                        "1.0",
                        "100000000000000000000000",
                    ];
                    out.push_str(NUMBERS[self.next(NUMBERS.len() as u64) as usize]);
                }
                3..=5 => self.string(out),
                6 => {
                    out.push('[');
                    for i in 0..self.next(4) {
                        if i > 0 {
                            out.push(',');
                        }
                        self.space(out);
                        self.value(depth + 1, out);
                    }
                    out.push(']');
                }
                _ => self.object(depth + 1, out),
            }
        }
        fn object(&mut self, depth: u32, out: &mut String) {
            out.push('{');
            for i in 0..self.next(6) {
                if i > 0 {
                    out.push(',');
                }
                self.space(out);
                self.string(out);
                self.space(out);
                out.push(':');
                self.value(depth, out);
            }
            self.space(out);
            out.push('}');
        }
    }
    let mut generator = Gen(7);
    let mut overrides = Map::new();
    overrides.insert("model".into(), json!("forced"));
    for round in 0..2000 {
        let mut body = String::new();
        generator.object(0, &mut body);
        let o = if round % 3 == 0 {
            &overrides
        } else {
            &Map::new()
        };
        assert_eq!(
            key::canonical_body(body.as_bytes(), o).unwrap(),
            canonical_via_value(body.as_bytes(), o),
            "body {body}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Framing

#[test]
fn entries_round_trip_through_their_framing() {
    let mut e = entry("{\"a\":1}");
    e.sse = true;
    e.usage_chunk = true;
    e.provider = None;
    e.model = Some("modèle".into());
    e.status = 246;
    let bytes = e.encode();
    assert_eq!(&bytes[..4], b"GWC1");
    assert_eq!(Entry::decode(bytes).unwrap(), e);

    let plain = entry("");
    assert_eq!(Entry::decode(plain.encode()).unwrap(), plain);
}

#[test]
fn corrupt_entries_are_errors_not_panics() {
    let good = entry("body").encode();
    for bad in [
        Bytes::from_static(b""),
        Bytes::from_static(b"GWC2\0\0\xc8\0\0\0\0\0\0\0\0\0\0"),
        good.slice(..16),
        good.slice(..20),
    ] {
        assert!(Entry::decode(bad.clone()).is_err(), "{bad:?}");
    }
    let mut error_status = entry("x");
    error_status.status = 500;
    assert!(Entry::decode(error_status.encode()).is_err());
}

// ---------------------------------------------------------------------------------------------
// Memory backend

fn k(n: u8) -> CacheKey {
    CacheKey([n; 32])
}

#[tokio::test]
async fn memory_entries_expire_after_their_ttl() {
    let store = MemoryStore::new(1 << 20, EvictionChoice::TinyLfu);
    store
        .put(&k(1), entry("short"), Duration::from_millis(100))
        .await
        .unwrap();
    store
        .put(&k(2), entry("long"), Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(store.get(&k(1)).await.unwrap().unwrap().body, "short");
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(store.get(&k(1)).await.unwrap(), None);
    assert_eq!(store.get(&k(2)).await.unwrap().unwrap().body, "long");

    // Storing again replaces the value and its time to live.
    store
        .put(&k(2), entry("newer"), Duration::from_millis(100))
        .await
        .unwrap();
    assert_eq!(store.get(&k(2)).await.unwrap().unwrap().body, "newer");
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(store.get(&k(2)).await.unwrap(), None);
}

#[tokio::test]
async fn memory_stays_within_its_byte_bound() {
    let max = 20_000;
    let store = MemoryStore::new(max, EvictionChoice::TinyLfu);
    let registry = prometheus::Registry::new();
    registry.register(store.size_metric().unwrap()).unwrap();
    let body = "x".repeat(1000);
    for n in 0..60 {
        store
            .put(&k(n), entry(&body), Duration::from_secs(60))
            .await
            .unwrap();
    }
    store.sync();
    assert!(store.bytes() <= max, "{} bytes kept", store.bytes());
    assert!(store.bytes() > 0);
    assert!(store.entry_count() < 60 && store.entry_count() > 0);
    assert_eq!(
        metric(&registry, "gw_cache_bytes", None) as u64,
        store.bytes()
    );

    // An entry larger than the whole cache is refused.
    let huge = entry(&"y".repeat(30_000));
    assert!(store
        .put(&k(99), huge, Duration::from_secs(60))
        .await
        .is_err());
}

#[tokio::test]
async fn memory_lru_evicts_the_least_recently_used() {
    let weight = entry(&"x".repeat(1000)).weight() as u64;
    // Room for three entries, not four.
    let store = MemoryStore::new(weight * 3 + weight / 2, EvictionChoice::Lru);
    let ttl = Duration::from_secs(60);
    for n in 1..=3 {
        store
            .put(&k(n), entry(&"x".repeat(1000)), ttl)
            .await
            .unwrap();
        store.sync();
    }
    // Reading 1 makes 2 the least recently used.
    assert!(store.get(&k(1)).await.unwrap().is_some());
    store.sync();
    store
        .put(&k(4), entry(&"x".repeat(1000)), ttl)
        .await
        .unwrap();
    store.sync();
    assert_eq!(store.entry_count(), 3);
    assert!(store.get(&k(2)).await.unwrap().is_none(), "2 was evicted");
    for n in [1, 3, 4] {
        assert!(store.get(&k(n)).await.unwrap().is_some(), "{n} kept");
    }
}

// ---------------------------------------------------------------------------------------------
// Streams: watching and re-streaming

#[test]
fn events_are_split_with_their_fields() {
    let sse =
        b"event: a\r\ndata: {\"x\":1}\r\n\r\n: comment\n\ndata: one\ndata: two\n\ndata: [DONE]\n\n";
    let events = replay::events(sse);
    assert_eq!(events.len(), 4);
    assert_eq!(events[0].name, Some("a"));
    assert_eq!(events[0].data.as_deref(), Some("{\"x\":1}"));
    assert_eq!(events[0].raw, b"event: a\r\ndata: {\"x\":1}\r\n\r\n");
    assert_eq!(events[1].data, None);
    assert_eq!(events[2].data.as_deref(), Some("one\ntwo"));
    assert_eq!(events[3].data.as_deref(), Some("[DONE]"));
}

#[test]
fn the_end_and_errors_of_a_stream_are_seen() {
    assert_eq!(replay::watch(STREAM[1].as_bytes(), false), Signal::Continue);
    assert_eq!(replay::watch(STREAM[3].as_bytes(), false), Signal::End);
    let both = format!("{}{}", STREAM[2], STREAM[3]);
    assert_eq!(replay::watch(both.as_bytes(), false), Signal::End);
    // The word in the text is not an error event.
    let text = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"an \\\"error\\\" and error\"}}]}\n\n";
    assert_eq!(replay::watch(text.as_bytes(), false), Signal::Continue);
    let error = "data: {\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\"}}\n\n";
    assert_eq!(replay::watch(error.as_bytes(), false), Signal::Failed);

    let stop = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    assert_eq!(replay::watch(stop.as_bytes(), true), Signal::End);
    let failed =
        "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\n";
    assert_eq!(replay::watch(failed.as_bytes(), true), Signal::Failed);
    let delta = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n";
    assert_eq!(replay::watch(delta.as_bytes(), true), Signal::Continue);
}

#[test]
fn a_complete_answer_is_restreamed_as_openai_chunks() {
    let answer = completion("Hello there, friend");
    let sse = replay::restream_chat(answer.to_string().as_bytes(), true).unwrap();
    let text = std::str::from_utf8(&sse).unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert_eq!(text.matches("[DONE]").count(), 1);
    let chunks = json_chunks(&sse);
    // role, content, finish, usage
    assert_eq!(chunks.len(), 4, "{text}");
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["id"], "chatcmpl-1");
        assert_eq!(c["model"], "gpt-4o-mini-2024");
        assert_eq!(c["created"], 1_700_000_000);
        assert_eq!(c["system_fingerprint"], "fp_1");
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[0]["choices"][0]["finish_reason"], Value::Null);
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, "Hello there, friend");
    assert_eq!(chunks[2]["choices"][0]["finish_reason"], "stop");
    assert_eq!(chunks[2]["choices"][0]["delta"], json!({}));
    assert_eq!(chunks[3]["choices"], json!([]));
    assert_eq!(chunks[3]["usage"]["total_tokens"], 7);

    let without = replay::restream_chat(answer.to_string().as_bytes(), false).unwrap();
    let chunks = json_chunks(&without);
    assert_eq!(chunks.len(), 3);
    assert!(chunks.iter().all(|c| c.get("usage").is_none()));
}

#[test]
fn tool_calls_and_several_choices_are_restreamed() {
    let answer = json!({
        "id": "c2", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
             "finish_reason": "tool_calls"},
            {"index": 1, "message": {"role": "assistant", "content": "second"},
             "finish_reason": "length"}
        ]
    });
    let sse = replay::restream_chat(answer.to_string().as_bytes(), false).unwrap();
    let chunks = json_chunks(&sse);
    let of = |i: u64| -> Vec<&Value> {
        chunks
            .iter()
            .filter(|c| c["choices"][0]["index"] == i)
            .collect()
    };
    let first = of(0);
    let call = first
        .iter()
        .find_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
        .expect("a tool call chunk");
    assert_eq!(call[0]["index"], 0);
    assert_eq!(call[0]["id"], "call_1");
    assert_eq!(call[0]["function"]["name"], "get_weather");
    assert_eq!(call[0]["function"]["arguments"], "{\"city\":\"Paris\"}");
    assert!(first.iter().all(|c| c["choices"][0]["delta"]["content"]
        .as_str()
        .unwrap_or("")
        .is_empty()));
    assert_eq!(
        first.last().unwrap()["choices"][0]["finish_reason"],
        "tool_calls"
    );
    let second = of(1);
    assert_eq!(second[1]["choices"][0]["delta"]["content"], "second");
    assert_eq!(
        second.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );

    assert!(replay::restream_chat(b"{\"object\":\"list\"}", false).is_none());
    assert!(replay::restream_chat(b"not json", false).is_none());
}

#[test]
fn a_complete_message_is_restreamed_as_anthropic_events() {
    let message = json!({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
        "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "sig"},
            {"type": "text", "text": "Hello"},
            {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "x"}}
        ],
        "stop_reason": "tool_use", "stop_sequence": null,
        "usage": {"input_tokens": 10, "output_tokens": 4}
    });
    let sse = replay::restream_messages(message.to_string().as_bytes()).unwrap();
    let events = replay::events(&sse);
    let names: Vec<&str> = events.iter().map(|e| e.name.unwrap()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    let data: Vec<Value> = events
        .iter()
        .map(|e| serde_json::from_str(e.data.as_deref().unwrap()).unwrap())
        .collect();
    for (e, d) in events.iter().zip(&data) {
        assert_eq!(
            d["type"],
            e.name.unwrap(),
            "the data's type is the event's name"
        );
    }
    assert_eq!(data[0]["message"]["content"], json!([]));
    assert_eq!(data[0]["message"]["id"], "msg_1");
    assert_eq!(data[0]["message"]["usage"]["input_tokens"], 10);
    assert_eq!(data[0]["message"]["stop_reason"], Value::Null);
    assert_eq!(data[2]["delta"]["thinking"], "hmm");
    assert_eq!(data[3]["delta"]["signature"], "sig");
    assert_eq!(
        data[6]["delta"],
        json!({"type": "text_delta", "text": "Hello"})
    );
    assert_eq!(data[8]["content_block"]["name"], "lookup");
    let input: Value =
        serde_json::from_str(data[9]["delta"]["partial_json"].as_str().unwrap()).unwrap();
    assert_eq!(input, json!({"q": "x"}));
    assert_eq!(data[11]["delta"]["stop_reason"], "tool_use");
    assert_eq!(data[11]["usage"]["output_tokens"], 4);
}

#[test]
fn usage_chunks_are_found_and_removed() {
    let mut with = String::new();
    for e in &STREAM[..3] {
        with.push_str(e);
    }
    with.push_str(USAGE_EVENT);
    with.push_str(STREAM[3]);
    assert!(replay::has_usage_chunk(with.as_bytes()));
    let stripped = replay::strip_usage_chunk(with.as_bytes());
    assert!(!replay::has_usage_chunk(&stripped));
    assert_eq!(stripped, STREAM.concat());
}

// ---------------------------------------------------------------------------------------------
// The plugin

#[tokio::test]
async fn miss_then_hit_then_refresh() {
    let (plugin, registry) = build(json!({"default": {"mode": "simple"}}));
    let plugin = plugin.as_ref();

    let mut first = chat_cx(&chat_body("hello"));
    assert!(route(plugin, &mut first, &openai()).await.is_none());
    assert_eq!(first.response.cache_status, Some(MISS));
    first.response.provider = Some("openai".into());
    first.response.model = Some("gpt-4o-mini-2024".into());
    let mut answer = whole(200, &completion("one"));
    plugin.on_response(&mut first, &mut answer).await.unwrap();
    plugin.on_log(&first);

    let mut second = chat_cx(&chat_body("hello"));
    let hit = route(plugin, &mut second, &openai())
        .await
        .expect("answered from the cache");
    assert_eq!(second.response.cache_status, Some(HIT));
    assert_eq!(hit.status, StatusCode::OK);
    assert_eq!(hit.body, answer.body);
    assert_eq!(header(&hit, "content-type"), Some("application/json"));
    assert_eq!(header(&hit, "x-gw-cache-status"), Some("HIT"));
    assert_eq!(second.response.provider.as_deref(), Some("openai"));
    assert_eq!(second.response.model.as_deref(), Some("gpt-4o-mini-2024"));
    assert_eq!(second.response.usage, None, "a hit charges nothing");
    assert!(!second.response.streamed);
    plugin.on_log(&second);

    let mut refresh = chat_cx(&chat_body("hello"));
    refresh.gw.cache_force_refresh = true;
    assert!(route(plugin, &mut refresh, &openai()).await.is_none());
    assert_eq!(refresh.response.cache_status, Some(REFRESH));
    let mut newer = whole(200, &completion("two"));
    plugin.on_response(&mut refresh, &mut newer).await.unwrap();
    plugin.on_log(&refresh);

    let mut third = chat_cx(&chat_body("hello"));
    let hit = route(plugin, &mut third, &openai()).await.expect("a hit");
    assert_eq!(
        hit.body, newer.body,
        "the refreshed answer replaced the old one"
    );
    plugin.on_log(&third);

    // Another request is not answered from this one's entry.
    let mut other = chat_cx(&chat_body("goodbye"));
    assert!(route(plugin, &mut other, &openai()).await.is_none());
    assert_eq!(other.response.cache_status, Some(MISS));
    plugin.on_log(&other);

    let requests = |s| metric(&registry, "gw_cache_requests_total", Some(("status", s)));
    assert_eq!(requests("hit"), 2.0);
    assert_eq!(requests("miss"), 2.0);
    assert_eq!(requests("refresh"), 1.0);
    assert_eq!(metric(&registry, "gw_cache_stores_total", None), 2.0);
    assert!(metric(&registry, "gw_cache_bytes", None) > 0.0);
}

#[tokio::test]
async fn errors_are_never_stored() {
    let (plugin, registry) = build(json!({"default": {"mode": "simple"}}));
    let plugin = plugin.as_ref();
    for _ in 0..2 {
        let mut cx = chat_cx(&chat_body("fail"));
        assert!(route(plugin, &mut cx, &openai()).await.is_none());
        assert_eq!(cx.response.cache_status, Some(MISS));
        let mut failed = whole(500, &json!({"error": {"message": "boom"}}));
        plugin.on_response(&mut cx, &mut failed).await.unwrap();
        // A request that failed before any answer (on_response not called) stores nothing
        // either.
    }
    assert_eq!(metric(&registry, "gw_cache_stores_total", None), 0.0);
}

#[tokio::test]
async fn the_target_that_answers_owns_the_entry() {
    let (plugin, _) = build(json!({"default": {"mode": "simple"}}));
    let plugin = plugin.as_ref();
    let primary = openai();
    let fallback = Target {
        provider: "groq".into(),
        ..openai()
    };
    // The first attempt fails; the fallback's answer is stored under the fallback's key.
    let mut cx = chat_cx(&chat_body("hello"));
    assert!(route(plugin, &mut cx, &primary).await.is_none());
    assert!(route(plugin, &mut cx, &fallback).await.is_none());
    plugin
        .on_response(&mut cx, &mut whole(200, &completion("from groq")))
        .await
        .unwrap();

    let mut again = chat_cx(&chat_body("hello"));
    assert!(route(plugin, &mut again, &primary).await.is_none());
    let hit = route(plugin, &mut again, &fallback).await.expect("a hit");
    assert!(String::from_utf8_lossy(&hit.body).contains("from groq"));
}

#[tokio::test]
async fn caching_is_on_only_where_configured() {
    // No default: only targets whose config node has cache settings.
    let (plugin, registry) = build(json!({}));
    let plugin = plugin.as_ref();
    let mut plain = chat_cx(&chat_body("hello"));
    assert!(route(plugin, &mut plain, &openai()).await.is_none());
    assert_eq!(plain.response.cache_status, Some(DISABLED));
    plugin.on_log(&plain);
    assert_eq!(
        metric(
            &registry,
            "gw_cache_requests_total",
            Some(("status", "disabled"))
        ),
        1.0
    );

    let mut on = chat_cx(&chat_body("hello"));
    assert!(route(plugin, &mut on, &cached(CacheMode::Simple, Some(60)))
        .await
        .is_none());
    assert_eq!(on.response.cache_status, Some(MISS));

    // max_age 0: off.
    let mut zero = chat_cx(&chat_body("hello"));
    assert!(
        route(plugin, &mut zero, &cached(CacheMode::Simple, Some(0)))
            .await
            .is_none()
    );
    assert_eq!(zero.response.cache_status, Some(DISABLED));

    // Routes other than chat, embeddings and messages are not cached.
    let mut moderation = cx_for(
        Route::Moderations,
        "/v1/moderations",
        &json!({"input": "hello"}),
    );
    assert!(
        route(plugin, &mut moderation, &cached(CacheMode::Simple, None))
            .await
            .is_none()
    );
    assert_eq!(moderation.response.cache_status, Some(DISABLED));
}

#[tokio::test]
async fn semantic_mode_is_a_miss_and_never_stored() {
    let (plugin, registry) = build(json!({}));
    let plugin = plugin.as_ref();
    let target = cached(CacheMode::Semantic, None);
    for _ in 0..2 {
        let mut cx = chat_cx(&chat_body("hello"));
        assert!(route(plugin, &mut cx, &target).await.is_none());
        assert_eq!(cx.response.cache_status, Some(MISS));
        plugin
            .on_response(&mut cx, &mut whole(200, &completion("x")))
            .await
            .unwrap();
    }
    assert_eq!(metric(&registry, "gw_cache_stores_total", None), 0.0);
}

#[tokio::test]
async fn an_entry_older_than_the_requests_max_age_is_not_served() {
    let (plugin, store, _) = with_memory(json!({}));
    let cx = chat_cx(&chat_body("hello"));
    let key = key_of(&cx, &openai());
    let mut old = entry(&completion("old").to_string());
    old.stored_at_ms = now_ms() - 30_000;
    store
        .put(&key, old, Duration::from_secs(600))
        .await
        .unwrap();

    let mut strict = chat_cx(&chat_body("hello"));
    assert!(
        route(&plugin, &mut strict, &cached(CacheMode::Simple, Some(10)))
            .await
            .is_none()
    );
    assert_eq!(strict.response.cache_status, Some(MISS));
    let mut lenient = chat_cx(&chat_body("hello"));
    assert!(
        route(&plugin, &mut lenient, &cached(CacheMode::Simple, Some(60)))
            .await
            .is_some()
    );
    assert_eq!(lenient.response.cache_status, Some(HIT));
}

#[tokio::test]
async fn a_node_max_age_is_the_entry_ttl() {
    let (plugin, store, _) = with_memory(json!({}));
    let target = cached(CacheMode::Simple, Some(1));
    let mut cx = chat_cx(&chat_body("hello"));
    assert!(route(&plugin, &mut cx, &target).await.is_none());
    plugin
        .on_response(&mut cx, &mut whole(200, &completion("x")))
        .await
        .unwrap();
    let key = key_of(&cx, &openai());
    assert!(store.get(&key).await.unwrap().is_some());
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert!(
        store.get(&key).await.unwrap().is_none(),
        "expired after max_age"
    );
}

#[tokio::test]
async fn streams_are_stored_and_served() {
    let (plugin, registry) = build(json!({"default": {"mode": "simple"}}));
    let plugin = plugin.as_ref();

    // A streamed miss is stored once [DONE] passes.
    let mut first = chat_cx(&streaming(chat_body("hello"), false));
    assert!(route(plugin, &mut first, &openai()).await.is_none());
    assert_eq!(first.response.cache_status, Some(MISS));
    relay(plugin, &mut first, &STREAM);
    assert_eq!(metric(&registry, "gw_cache_stores_total", None), 1.0);

    // A stream request gets the stored stream as it was.
    let mut second = chat_cx(&streaming(chat_body("hello"), false));
    let hit = route(plugin, &mut second, &openai()).await.expect("a hit");
    assert_eq!(hit.body, STREAM.concat());
    assert_eq!(header(&hit, "content-type"), Some("text/event-stream"));
    assert!(second.response.streamed);

    // A non-stream request cannot use a stream: a miss, and its answer replaces the stream.
    let mut plain = chat_cx(&chat_body("hello"));
    assert!(route(plugin, &mut plain, &openai()).await.is_none());
    assert_eq!(plain.response.cache_status, Some(MISS));
    plugin
        .on_response(&mut plain, &mut whole(200, &completion("whole answer")))
        .await
        .unwrap();

    // Now a stream request is answered by re-streaming the whole answer.
    let mut third = chat_cx(&streaming(chat_body("hello"), true));
    let hit = route(plugin, &mut third, &openai()).await.expect("a hit");
    assert_eq!(third.response.cache_status, Some(HIT));
    assert_eq!(header(&hit, "content-type"), Some("text/event-stream"));
    let chunks = json_chunks(&hit.body);
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, "whole answer");
    assert_eq!(chunks.last().unwrap()["usage"]["total_tokens"], 7);
    assert_eq!(
        data_of(&hit.body).last().map(String::as_str),
        Some("[DONE]")
    );

    // ...and a non-stream request by the whole answer.
    let mut fourth = chat_cx(&chat_body("hello"));
    let hit = route(plugin, &mut fourth, &openai()).await.expect("a hit");
    assert_eq!(
        serde_json::from_slice::<Value>(&hit.body).unwrap(),
        completion("whole answer")
    );
}

#[tokio::test]
async fn a_stored_stream_fits_the_clients_usage_choice() {
    let (plugin, _) = build(json!({"default": {"mode": "simple"}}));
    let plugin = plugin.as_ref();
    let mut with_usage: Vec<&str> = STREAM[..3].to_vec();
    with_usage.push(USAGE_EVENT);
    with_usage.push(STREAM[3]);

    let mut first = chat_cx(&streaming(chat_body("hello"), true));
    assert!(route(plugin, &mut first, &openai()).await.is_none());
    relay(plugin, &mut first, &with_usage);

    // Asked with usage: as stored.
    let mut same = chat_cx(&streaming(chat_body("hello"), true));
    let hit = route(plugin, &mut same, &openai()).await.expect("a hit");
    assert_eq!(hit.body, with_usage.concat());
    // Asked without: the usage chunk is removed.
    let mut without = chat_cx(&streaming(chat_body("hello"), false));
    let hit = route(plugin, &mut without, &openai()).await.expect("a hit");
    assert_eq!(hit.body, STREAM.concat());

    // A stored stream without usage cannot answer a client that wants it.
    let mut plain_first = chat_cx(&streaming(chat_body("other"), false));
    assert!(route(plugin, &mut plain_first, &openai()).await.is_none());
    relay(plugin, &mut plain_first, &STREAM);
    let mut wants = chat_cx(&streaming(chat_body("other"), true));
    assert!(route(plugin, &mut wants, &openai()).await.is_none());
    assert_eq!(wants.response.cache_status, Some(MISS));
}

#[tokio::test]
async fn incomplete_failed_and_oversized_streams_are_not_stored() {
    let (plugin, registry) = build(json!({"default": {"mode": "simple"}, "max_entry_bytes": 400}));
    let plugin = plugin.as_ref();
    let miss = |body: Value| async move {
        let mut cx = chat_cx(&body);
        assert!(route(plugin, &mut cx, &openai()).await.is_none());
        cx
    };

    // Cut short: no [DONE].
    let mut cut = miss(streaming(chat_body("a"), false)).await;
    relay(plugin, &mut cut, &STREAM[..2]);
    // An error event, even followed by [DONE].
    let mut failed = miss(streaming(chat_body("b"), false)).await;
    relay(
        plugin,
        &mut failed,
        &[
            STREAM[0],
            "data: {\"error\":{\"message\":\"overloaded\"}}\n\n",
            STREAM[3],
        ],
    );
    // Larger than max_entry_bytes.
    let mut big = miss(streaming(chat_body("c"), false)).await;
    let long = format!(
        "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{}\"}}}}]}}\n\n",
        "z".repeat(500)
    );
    relay(plugin, &mut big, &[STREAM[0], long.as_str(), STREAM[3]]);
    // An error status.
    let mut error = miss(streaming(chat_body("d"), false)).await;
    error.response.status = Some(503);
    for e in STREAM {
        let mut chunk = Chunk {
            data: Bytes::from_static(e.as_bytes()),
        };
        plugin.on_chunk(&mut error, &mut chunk).unwrap();
    }
    // An oversized whole answer.
    let mut whole_big = miss(chat_body("e")).await;
    plugin
        .on_response(
            &mut whole_big,
            &mut whole(200, &completion(&"w".repeat(500))),
        )
        .await
        .unwrap();

    assert_eq!(metric(&registry, "gw_cache_stores_total", None), 0.0);
    for c in ["a", "b", "c", "d"] {
        let mut again = chat_cx(&streaming(chat_body(c), false));
        assert!(route(plugin, &mut again, &openai()).await.is_none(), "{c}");
    }
}

#[tokio::test]
async fn messages_and_embeddings_are_cached() {
    let (plugin, _) = build(json!({"default": {"mode": "simple"}}));
    let plugin = plugin.as_ref();
    let request = json!({"model": "claude-x", "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}]});
    let message = json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
        "content": [{"type": "text", "text": "Hello!"}], "stop_reason": "end_turn",
        "stop_sequence": null, "usage": {"input_tokens": 3, "output_tokens": 2}});
    let mut first = cx_for(Route::Messages, "/v1/messages", &request);
    assert!(route(plugin, &mut first, &openai()).await.is_none());
    plugin
        .on_response(&mut first, &mut whole(200, &message))
        .await
        .unwrap();
    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    let mut second = cx_for(Route::Messages, "/v1/messages", &streamed);
    let hit = route(plugin, &mut second, &openai()).await.expect("a hit");
    assert_eq!(header(&hit, "content-type"), Some("text/event-stream"));
    let events = replay::events(&hit.body);
    assert_eq!(events.last().unwrap().name, Some("message_stop"));
    assert!(String::from_utf8_lossy(&hit.body).contains("\"text\":\"Hello!\""));

    // A streamed messages answer is stored at message_stop.
    let mut fresh = cx_for(Route::Messages, "/v1/messages", &{
        let mut r = streamed.clone();
        r["max_tokens"] = json!(11);
        r
    });
    assert!(route(plugin, &mut fresh, &openai()).await.is_none());
    relay(
        plugin,
        &mut fresh,
        &[
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        ],
    );
    let mut again = cx_for(Route::Messages, "/v1/messages", &{
        let mut r = streamed.clone();
        r["max_tokens"] = json!(11);
        r
    });
    assert!(route(plugin, &mut again, &openai()).await.is_some());

    let input = json!({"model": "text-embedding-3-small", "input": "hello"});
    let vectors = json!({"object": "list", "data": [{"object": "embedding", "index": 0,
        "embedding": [0.1, 0.2]}], "model": "text-embedding-3-small"});
    let mut e1 = cx_for(Route::Embeddings, "/v1/embeddings", &input);
    assert!(route(plugin, &mut e1, &openai()).await.is_none());
    plugin
        .on_response(&mut e1, &mut whole(200, &vectors))
        .await
        .unwrap();
    let mut e2 = cx_for(Route::Embeddings, "/v1/embeddings", &input);
    let hit = route(plugin, &mut e2, &openai()).await.expect("a hit");
    assert_eq!(serde_json::from_slice::<Value>(&hit.body).unwrap(), vectors);
}

#[tokio::test]
async fn a_backend_that_fails_is_a_miss_not_an_error() {
    // Nothing listens on port 1: every command fails at once.
    let cx = BuildCx {
        redis_url: Some("redis://127.0.0.1:1/".into()),
        ..BuildCx::standalone()
    };
    let (plugin, registry) = build_with(
        json!({"default": {"mode": "simple"}, "redis_timeout_ms": 300}),
        cx,
    );
    let plugin = plugin.as_ref();
    let started = std::time::Instant::now();
    let mut cx = chat_cx(&chat_body("hello"));
    assert!(route(plugin, &mut cx, &openai()).await.is_none());
    assert_eq!(cx.response.cache_status, Some(MISS));
    plugin
        .on_response(&mut cx, &mut whole(200, &completion("x")))
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "bounded by the timeout"
    );
    let errors = |op| metric(&registry, "gw_cache_backend_errors_total", Some(("op", op)));
    assert_eq!(errors("get"), 1.0);
    // The write (off the answer's path) is skipped: Redis failed a moment ago.
    eventually("the write's failure", || errors("set") == 1.0).await;
    assert_eq!(metric(&registry, "gw_cache_stores_total", None), 0.0);
}

#[tokio::test]
async fn an_unreachable_redis_is_skipped_for_a_moment() {
    let store = RedisStore::new("redis://127.0.0.1:1/", "p:", Duration::from_millis(300)).unwrap();
    let first = store.get(&k(1)).await.unwrap_err();
    assert!(!first.0.contains("skipped"), "{first}");
    let started = std::time::Instant::now();
    let second = store
        .put(&k(1), entry("x"), Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(second.0.contains("skipped"), "{second}");
    assert!(started.elapsed() < Duration::from_millis(50));
}

// ---------------------------------------------------------------------------------------------
// Config

fn issue_paths(config: Value) -> Vec<String> {
    PluginDescriptor::find("cache")
        .unwrap()
        .check(&config)
        .unwrap_err()
        .into_iter()
        .map(|i| i.path)
        .collect()
}

#[test]
fn config_errors_name_their_field() {
    assert!(PluginDescriptor::find("cache")
        .unwrap()
        .check(&json!({}))
        .is_ok());
    assert!(PluginDescriptor::find("cache")
        .unwrap()
        .check(
            &json!({"default": {"mode": "semantic", "max_age": 60}, "backend": "redis",
            "eviction": "lru", "key_prefix": "x:", "redis_timeout_ms": 100})
        )
        .is_ok());
    assert_eq!(
        issue_paths(json!({"default_max_age": 0})),
        ["default_max_age"]
    );
    assert_eq!(
        issue_paths(json!({"default": {"mode": "simple", "max_age": 0}})),
        ["default.max_age"]
    );
    assert_eq!(
        issue_paths(json!({"default": {"mode": "fuzzy"}})),
        ["default.mode"]
    );
    assert_eq!(
        issue_paths(json!({"default": {"mode": "simple", "ttl": 5}})),
        ["default.ttl"]
    );
    assert_eq!(issue_paths(json!({"max_bytes": 10})), ["max_bytes"]);
    assert_eq!(
        issue_paths(json!({"max_entry_bytes": 0})),
        ["max_entry_bytes"]
    );
    assert_eq!(
        issue_paths(json!({"backend": "memory", "max_bytes": 2048, "max_entry_bytes": 4096})),
        ["max_entry_bytes"]
    );
    assert_eq!(issue_paths(json!({"key_prefix": "a b"})), ["key_prefix"]);
    assert_eq!(
        issue_paths(json!({"redis_timeout_ms": 0})),
        ["redis_timeout_ms"]
    );
    assert_eq!(issue_paths(json!({"backend": "disk"})), ["backend"]);
    let unknown = PluginDescriptor::find("cache")
        .unwrap()
        .check(&json!({"max_age": 5}))
        .unwrap_err();
    assert!(
        unknown[0].message.contains("unknown field `max_age`"),
        "{unknown:?}"
    );
}

#[test]
fn build_refuses_redis_without_a_url_and_a_second_instance() {
    let cx = BuildCx::standalone();
    let descriptor = PluginDescriptor::find("cache").unwrap();
    let err = descriptor
        .build(&json!({"backend": "redis"}), &cx)
        .err()
        .expect("refused");
    assert!(err[0].message.contains("GW_REDIS_URL"), "{err:?}");

    assert!(descriptor.build(&json!({}), &cx).is_ok());
    let err = descriptor.build(&json!({}), &cx).err().expect("refused");
    assert!(err[0].message.contains("listed twice"), "{err:?}");

    let bad_url = BuildCx {
        redis_url: Some("nonsense://user:hunter2@host".into()),
        ..BuildCx::standalone()
    };
    let err = descriptor
        .build(&json!({}), &bad_url)
        .err()
        .expect("refused");
    assert!(
        !err[0].message.contains("hunter2"),
        "the URL's secret is not repeated"
    );
}

// ---------------------------------------------------------------------------------------------
// Redis (GW_TEST_REDIS_URL)

/// The test Redis URL, or `None` (the test is skipped) when unset. Panics when it is set but
/// Redis does not answer.
async fn test_redis() -> Option<String> {
    let Ok(url) = std::env::var("GW_TEST_REDIS_URL") else {
        eprintln!("skipped: GW_TEST_REDIS_URL is not set");
        return None;
    };
    let client = ::redis::Client::open(url.as_str()).expect("GW_TEST_REDIS_URL is a valid URL");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("GW_TEST_REDIS_URL is set but Redis is unreachable: {e}"));
    let pong: String = ::redis::cmd("PING")
        .query_async(&mut conn)
        .await
        .expect("Redis answers PING");
    assert_eq!(pong, "PONG");
    Some(url)
}

fn unique_prefix() -> String {
    format!("gw-test-cache:{}:", uuid::Uuid::new_v4())
}

#[tokio::test]
async fn redis_store_round_trips_and_expires() {
    let Some(url) = test_redis().await else {
        return;
    };
    let store = RedisStore::new(&url, &unique_prefix(), Duration::from_secs(2)).unwrap();
    let mut e = entry("{\"hello\":true}");
    e.sse = true;
    e.model = None;
    assert_eq!(store.get(&k(1)).await.unwrap(), None);
    store
        .put(&k(1), e.clone(), Duration::from_millis(300))
        .await
        .unwrap();
    assert_eq!(store.get(&k(1)).await.unwrap(), Some(e));

    let client = ::redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let pttl: i64 = ::redis::cmd("PTTL")
        .arg(store.redis_key(&k(1)))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(pttl > 0 && pttl <= 300, "PTTL {pttl}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(store.get(&k(1)).await.unwrap(), None);

    // A value that is not an entry is an error (counted as a miss by the plugin).
    let _: () = ::redis::cmd("SET")
        .arg(store.redis_key(&k(2)))
        .arg("garbage")
        .arg("PX")
        .arg(5000)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(store.get(&k(2)).await.is_err());
}

#[tokio::test]
async fn two_instances_share_one_redis_cache() {
    let Some(url) = test_redis().await else {
        return;
    };
    let config =
        json!({"default": {"mode": "simple", "max_age": 60}, "key_prefix": unique_prefix()});
    let instance = || {
        build_with(
            config.clone(),
            BuildCx {
                redis_url: Some(url.clone()),
                ..BuildCx::standalone()
            },
        )
    };
    let (a, a_metrics) = instance();
    let (b, b_metrics) = instance();

    let mut first = chat_cx(&chat_body("shared"));
    assert!(route(a.as_ref(), &mut first, &openai()).await.is_none());
    assert_eq!(first.response.cache_status, Some(MISS));
    first.response.provider = Some("openai".into());
    let answer = completion("from instance a");
    plugin_store(a.as_ref(), &mut first, &answer).await;
    // A Redis store writes off the answer's path, within a round trip.
    eventually("the answer is stored", || {
        metric(&a_metrics, "gw_cache_stores_total", None) == 1.0
    })
    .await;

    let mut second = chat_cx(&chat_body("shared"));
    let hit = route(b.as_ref(), &mut second, &openai())
        .await
        .expect("instance b finds instance a's answer");
    assert_eq!(serde_json::from_slice::<Value>(&hit.body).unwrap(), answer);
    assert_eq!(second.response.provider.as_deref(), Some("openai"));

    // A stream stored by b (in the background, from on_chunk) is found by a.
    let mut streamed = chat_cx(&streaming(chat_body("streamed"), false));
    assert!(route(b.as_ref(), &mut streamed, &openai()).await.is_none());
    relay(b.as_ref(), &mut streamed, &STREAM);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let mut cx = chat_cx(&streaming(chat_body("streamed"), false));
        if let Some(hit) = route(a.as_ref(), &mut cx, &openai()).await {
            assert_eq!(hit.body, STREAM.concat());
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the stream was never stored"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(metric(&b_metrics, "gw_cache_stores_total", None), 1.0);
    assert_eq!(
        metric(
            &a_metrics,
            "gw_cache_backend_errors_total",
            Some(("op", "get"))
        ),
        0.0
    );
}

/// Waits (5 s at most) until `check` holds.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !check() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn plugin_store(plugin: &dyn Plugin, cx: &mut RequestCx, answer: &Value) {
    plugin
        .on_response(cx, &mut whole(200, answer))
        .await
        .unwrap();
}
