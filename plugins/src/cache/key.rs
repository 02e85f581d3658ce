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

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::io::Write as _;
use std::ops::Range;

use ring::digest;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Number, Value};

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
/// removed, written canonically (sorted keys, no whitespace; of duplicate keys the last
/// counts, as when parsing into a map).
///
/// Written straight from the parser, without building a `Value` first: the body is parsed on
/// every cached request, and the tree of maps and strings cost more than the rest of the key.
/// The bytes are those of [`write_canonical`] over the parsed `Value`.
pub fn canonical_body(body: &[u8], overrides: &Map<String, Value>) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(body.len());
    let mut parser = serde_json::Deserializer::from_slice(body);
    let top = TopLevel {
        out: &mut out,
        overrides,
    };
    parser
        .deserialize_any(top)
        .and_then(|()| parser.end())
        .map_err(|e| match e.classify() {
            serde_json::error::Category::Data => "the request body is not a JSON object".to_owned(),
            _ => format!("the request body is not JSON: {e}"),
        })?;
    Ok(out)
}

/// An object key, borrowed from the body unless it holds escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object key")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v)))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

/// An object key as written: `plain` when it was borrowed from the body as it stands, so that
/// nothing in it needs escaping.
struct MemberKey<'k> {
    text: Cow<'k, str>,
    plain: bool,
}

/// An object's members as parsed: each key with where its canonical value lies in `values`.
struct Members<'k> {
    entries: Vec<(MemberKey<'k>, Range<usize>)>,
    values: Vec<u8>,
}

impl<'k> Members<'k> {
    fn new() -> Self {
        Members {
            entries: Vec::new(),
            values: Vec::new(),
        }
    }

    /// Reads an object's members from the parser, each value written canonically; a member
    /// whose key `skip` names is parsed and left out.
    fn read<'de, A: MapAccess<'de>>(
        mut map: A,
        skip: impl Fn(&str) -> bool,
    ) -> Result<Members<'de>, A::Error> {
        let mut members = Members::new();
        while let Some(Key(key)) = map.next_key()? {
            if skip(&key) {
                map.next_value::<de::IgnoredAny>()?;
                continue;
            }
            let start = members.values.len();
            map.next_value_seed(Canonical(&mut members.values))?;
            let plain = matches!(key, Cow::Borrowed(_));
            let range = start..members.values.len();
            members
                .entries
                .push((MemberKey { text: key, plain }, range));
        }
        Ok(members)
    }

    /// Adds a member that did not come from the body (an override).
    fn push_value(&mut self, key: &'k str, value: &Value) {
        let start = self.values.len();
        write_canonical(value, &mut self.values);
        let key = MemberKey {
            text: Cow::Borrowed(key),
            plain: false,
        };
        self.entries.push((key, start..self.values.len()));
    }

    /// Writes the object to `out`: keys in byte order, the last of equal keys.
    fn write(mut self, out: &mut Vec<u8>) {
        // Stable, so equal keys stay in the order they came and the last one is kept.
        self.entries.sort_by(|a, b| a.0.text.cmp(&b.0.text));
        out.push(b'{');
        let mut first = true;
        for (i, (key, range)) in self.entries.iter().enumerate() {
            if self
                .entries
                .get(i + 1)
                .is_some_and(|next| next.0.text == key.text)
            {
                continue;
            }
            if !first {
                out.push(b',');
            }
            first = false;
            if key.plain {
                write_plain_string(&key.text, out);
            } else {
                write_string(&key.text, out);
            }
            out.push(b':');
            out.extend_from_slice(&self.values[range.clone()]);
        }
        out.push(b'}');
    }
}

/// The top level: an object whose `stream` fields are dropped and `overrides` set.
struct TopLevel<'o> {
    out: &'o mut Vec<u8>,
    overrides: &'o Map<String, Value>,
}

impl<'de, 'o> Visitor<'de> for TopLevel<'o> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<(), A::Error> {
        let overrides = self.overrides;
        let mut members = Members::read(map, |key| {
            key == "stream" || key == "stream_options" || overrides.contains_key(key)
        })?;
        for (key, value) in overrides {
            members.push_value(key, value);
        }
        members.write(self.out);
        Ok(())
    }
}

/// Any JSON value, written canonically to the buffer it holds.
struct Canonical<'a>(&'a mut Vec<u8>);

impl<'de> DeserializeSeed<'de> for Canonical<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Canonical<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.0.extend_from_slice(b"null");
        Ok(())
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.0
            .extend_from_slice(if v { b"true" as &[u8] } else { b"false" });
        Ok(())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        write_number(&Number::from(v), self.0);
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        write_number(&Number::from(v), self.0);
        Ok(())
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        // As `Value` does: a number JSON cannot hold is null.
        match Number::from_f64(v) {
            Some(n) => write_number(&n, self.0),
            None => self.0.extend_from_slice(b"null"),
        }
        Ok(())
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<(), E> {
        write_plain_string(v, self.0);
        Ok(())
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        write_string(v, self.0);
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.0.push(b'[');
        let mut first = true;
        loop {
            let start = self.0.len();
            if !first {
                self.0.push(b',');
            }
            if seq.next_element_seed(Canonical(&mut *self.0))?.is_none() {
                self.0.truncate(start);
                break;
            }
            first = false;
        }
        self.0.push(b']');
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<(), A::Error> {
        Members::read(map, |_| false)?.write(self.0);
        Ok(())
    }
}

/// A string the parser borrowed from the body: it held no escapes, and JSON allows no
/// quote, backslash or control character unescaped, so it is written as it stands, which is
/// what [`write_string`] would write, without looking at each byte again.
fn write_plain_string(s: &str, out: &mut Vec<u8>) {
    out.reserve(s.len() + 2);
    out.push(b'"');
    out.extend_from_slice(s.as_bytes());
    out.push(b'"');
}

fn write_number(n: &Number, out: &mut Vec<u8>) {
    // Writing into a Vec cannot fail.
    let _ = write!(out, "{n}");
}

/// JSON with object keys in byte order whatever order the map keeps, and no whitespace.
pub(super) fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => write_number(n, out),
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

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The same request with its fields in another order, or spaced otherwise, has the
        /// same canonical body.
        #[test]
        fn canonical_bodies_do_not_depend_on_field_order(
            fields in proptest::collection::btree_map("[a-e]{1,3}", 0i64..4, 0..6),
            nested in proptest::collection::btree_map("[x-z]{1,2}", "[a-c]{0,3}", 0..4),
        ) {
            let object = |reverse: bool| {
                let mut parts: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                let mut inner: Vec<String> = nested.iter().map(|(k, v)| format!("\"{k}\": \"{v}\"")).collect();
                if reverse {
                    parts.reverse();
                    inner.reverse();
                }
                parts.push(format!("\"n\":{{{}}}", inner.join(" , ")));
                if reverse {
                    parts.rotate_left(1);
                }
                format!("{{ {} }}", parts.join(","))
            };
            let a = canonical_body(object(false).as_bytes(), &Map::new()).unwrap();
            let b = canonical_body(object(true).as_bytes(), &Map::new()).unwrap();
            proptest::prop_assert_eq!(a, b);
        }
    }
}
