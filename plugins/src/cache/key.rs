//! The cache key: a SHA-256 of everything that decides what the provider answers.
//!
//! In the key, each as a separate length-prefixed field (so that no two different inputs can
//! run together into the same bytes):
//!
//! - the request path and query (`/v1/chat/completions`);
//! - the provider identity: the target's provider id, saved-provider slug and custom host, and
//!   its settings that are not secrets (Azure resource and deployment, Vertex project and
//!   region, AWS region...: the target's own, else the request's `x-gw-*` ones);
//! - the caller's workspace, when the auth plugin put a [`Principal`] in the request: one
//!   workspace is never answered from another's cache;
//! - `x-gw-cache-namespace`, when given;
//! - what changes the shape of the answer: `x-gw-strict-open-ai-compliance` and the
//!   `anthropic-version` / `anthropic-beta` headers;
//! - the canonical body: the client's JSON with the target's `override_params` set on it (as
//!   the router does), without `stream` and `stream_options` (a stream and a whole answer of
//!   the same request share one entry), written with object keys sorted and no whitespace.
//!
//! Not in the key, whether or not a namespace is given: metadata (`x-gw-metadata`), trace and
//! span ids, the gateway API key, provider credentials, and every other header (forwarded
//! headers included).

use std::collections::BTreeMap;
use std::fmt;

use ring::digest;
use serde_json::{Map, Value};

use plugin_sdk::{Principal, RequestCx, Target};

/// The SHA-256 that names a cached answer.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheKey(pub [u8; 32]);

impl CacheKey {
    /// Lower-case hex, as used in Redis keys.
    pub fn hex(&self) -> String {
        let mut s = String::with_capacity(64);
        for b in self.0 {
            s.push(char::from(HEX[usize::from(b >> 4)]));
            s.push(char::from(HEX[usize::from(b & 0xf)]));
        }
        s
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

impl fmt::Debug for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CacheKey({})", self.hex())
    }
}

/// Headers defined by providers that change what (or in which shape) they answer.
const SHAPE_HEADERS: &[&str] = &["anthropic-version", "anthropic-beta"];

/// Words that mark a provider setting as a secret, kept out of the key.
const SECRET_WORDS: &[&str] = &[
    "secret",
    "key",
    "token",
    "password",
    "credential",
    "account",
];

/// The key of this request for this target. Fails only when the body is not a JSON object,
/// which the gateway's decoding already refuses for every cached route.
pub fn key_for(cx: &RequestCx, target: &Target) -> Result<CacheKey, String> {
    let body = canonical_body(&cx.body, &target.override_params)?;
    let mut h = Fields(digest::Context::new(&digest::SHA256));
    h.text(b"gw-cache-v1");
    h.text(cx.path.as_bytes());
    h.opt(cx.query.as_deref());
    h.text(target.provider.as_bytes());
    h.opt(target.slug.as_deref());
    h.opt(target.custom_host.as_deref());
    let settings = identity_settings(cx, target);
    h.count(settings.len());
    for (name, value) in settings {
        h.text(name.as_bytes());
        h.text(value.as_bytes());
    }
    h.opt(
        cx.extensions
            .get::<Principal>()
            .and_then(|p| p.workspace_id.as_deref()),
    );
    h.opt(cx.gw.cache_namespace.as_deref());
    h.opt(
        cx.gw
            .strict_openai_compliance
            .map(|s| if s { "1" } else { "0" }),
    );
    for name in SHAPE_HEADERS {
        h.opt(cx.headers.get(*name).map(http::HeaderValue::as_bytes));
    }
    h.text(&body);
    let d = h.0.finish();
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    Ok(CacheKey(out))
}

/// The target's settings that are not secrets, by name: its own first, then the request's
/// (`x-gw-azure-deployment-id`...) for the names it lacks, as the router fills them.
fn identity_settings<'a>(cx: &'a RequestCx, target: &'a Target) -> BTreeMap<&'a str, &'a str> {
    let mut out = BTreeMap::new();
    for (k, v) in target.settings.iter().chain(&cx.gw.provider_settings.0) {
        let lower = k.to_ascii_lowercase();
        if SECRET_WORDS.iter().any(|w| lower.contains(w)) {
            continue;
        }
        out.entry(k.as_str()).or_insert(v.as_str());
    }
    out
}

/// The client's JSON with `overrides` set at the top level and `stream` / `stream_options`
/// removed, written canonically (sorted keys, no whitespace).
pub fn canonical_body(body: &[u8], overrides: &Map<String, Value>) -> Result<Vec<u8>, String> {
    let mut value: Value =
        serde_json::from_slice(body).map_err(|e| format!("the request body is not JSON: {e}"))?;
    let Value::Object(map) = &mut value else {
        return Err("the request body is not a JSON object".to_owned());
    };
    for (k, v) in overrides {
        map.insert(k.clone(), v.clone());
    }
    map.remove("stream");
    map.remove("stream_options");
    let mut out = Vec::with_capacity(body.len());
    write_canonical(&value, &mut out);
    Ok(out)
}

/// JSON with object keys in byte order whatever order the map keeps, and no whitespace.
fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => out.extend_from_slice(n.to_string().as_bytes()),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(k, out);
                out.push(b':');
                write_canonical(v, out);
            }
            out.push(b'}');
        }
    }
}

fn write_string(s: &str, out: &mut Vec<u8>) {
    // Serializing a string into a Vec cannot fail; the fallback keeps distinct strings distinct.
    if serde_json::to_writer(&mut *out, s).is_err() {
        out.extend_from_slice(s.as_bytes());
    }
}

/// Feeds fields into the hash, each prefixed so that field boundaries are unambiguous.
struct Fields(digest::Context);

impl Fields {
    fn text(&mut self, bytes: &[u8]) {
        self.0.update(&[1]);
        self.0.update(&(bytes.len() as u64).to_be_bytes());
        self.0.update(bytes);
    }

    fn opt(&mut self, value: Option<impl AsRef<[u8]>>) {
        match value {
            Some(v) => self.text(v.as_ref()),
            None => self.0.update(&[0]),
        }
    }

    fn count(&mut self, n: usize) {
        self.0.update(&[2]);
        self.0.update(&(n as u64).to_be_bytes());
    }
}
