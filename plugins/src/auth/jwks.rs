//! The JWT signing keys: a JWKS parsed into decoding keys, held in an `ArcSwap` so that a
//! refresh replaces the whole set at once while requests read it without a lock.
//!
//! Sources: a file (read at build and on reload) or a URL (fetched at build, then every
//! `refresh_secs` on the plugin's background runtime, and early when a token names a key id
//! the set lacks). A failed read or fetch keeps the last good set.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use prometheus::IntCounterVec;
use serde_json::Value;

/// The largest JWKS document accepted.
const MAX_JWKS_BYTES: usize = 1024 * 1024;

/// How long one fetch of `jwks_url` may take.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// One usable verification key.
pub struct Key {
    pub kid: Option<String>,
    /// The JWK's `alg`, when it names one: the key is used for that algorithm only.
    pub alg: Option<Algorithm>,
    /// The algorithm family the key can verify: RS256 or ES256.
    pub fits: Algorithm,
    pub key: DecodingKey,
}

/// The keys of one JWKS, in document order.
#[derive(Default)]
pub struct KeySet {
    pub keys: Vec<Key>,
    /// Tells the sets installed in this process apart (tokens verified by an older set are
    /// verified again): given when the set is installed.
    pub generation: u64,
}

/// The next key-set generation of the process.
fn next_generation() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl KeySet {
    /// Parses a JWKS (`{"keys": [...]}`). Keys that cannot verify RS256 or ES256 (encryption
    /// keys, symmetric keys, other curves, unknown types) are skipped; a document without a
    /// single usable key is refused, since it would refuse every token.
    pub fn parse(bytes: &[u8]) -> Result<KeySet, String> {
        let doc: Value =
            serde_json::from_slice(bytes).map_err(|e| format!("not a JWKS (JSON): {e}"))?;
        let Some(entries) = doc.get("keys").and_then(Value::as_array) else {
            return Err("not a JWKS: no \"keys\" array".into());
        };
        let keys: Vec<Key> = entries.iter().filter_map(usable_key).collect();
        if keys.is_empty() {
            return Err(format!(
                "the JWKS holds no RS256 or ES256 signing key ({} keys, none usable)",
                entries.len()
            ));
        }
        Ok(KeySet {
            keys,
            generation: 0,
        })
    }

    /// Whether some key has this id.
    pub fn has_kid(&self, kid: &str) -> bool {
        self.keys.iter().any(|k| k.kid.as_deref() == Some(kid))
    }

    /// The keys that may have signed a token with this header: the ones with its `kid` (any
    /// key when the token names none) that fit its algorithm.
    pub fn candidates<'a>(
        &'a self,
        kid: Option<&'a str>,
        alg: Algorithm,
    ) -> impl Iterator<Item = &'a Key> + 'a {
        self.keys.iter().filter(move |k| {
            kid.is_none_or(|kid| k.kid.as_deref() == Some(kid))
                && k.fits == alg
                && k.alg.is_none_or(|a| a == alg)
        })
    }
}

fn usable_key(entry: &Value) -> Option<Key> {
    let jwk: Jwk = serde_json::from_value(entry.clone()).ok()?;
    if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
        return None;
    }
    let alg = match jwk.common.key_algorithm {
        None => None,
        Some(KeyAlgorithm::RS256) => Some(Algorithm::RS256),
        Some(KeyAlgorithm::ES256) => Some(Algorithm::ES256),
        // A key meant for another algorithm is never used for these two.
        Some(_) => return None,
    };
    let fits = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Algorithm::RS256,
        AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => Algorithm::ES256,
        _ => return None,
    };
    if alg.is_some_and(|a| a != fits) {
        return None;
    }
    let key = DecodingKey::from_jwk(&jwk).ok()?;
    Some(Key {
        kid: jwk.common.key_id.clone(),
        alg,
        fits,
        key,
    })
}

/// Where the keys come from.
#[derive(Debug, Clone)]
pub enum Source {
    File(PathBuf),
    Url(String),
}

impl Source {
    pub fn describe(&self) -> String {
        match self {
            Source::File(p) => format!("jwt.jwks_file {}", p.display()),
            Source::Url(u) => format!("jwt.jwks_url {u}"),
        }
    }
}

/// Reads a JWKS file.
pub fn read_file(path: &PathBuf) -> Result<KeySet, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    KeySet::parse(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// Fetches a JWKS over HTTP(S).
pub async fn fetch(client: &reqwest::Client, url: &str) -> Result<KeySet, String> {
    let mut response = client
        .get(url)
        .header(http::header::ACCEPT, "application/json")
        .send()
        .await
        .map_err(|e| format!("cannot fetch {url}: {e}"))?;
    if !response.status().is_success() {
        return Err(format!("{url} answered {}", response.status()));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| format!("cannot read {url}: {e}"))?
    {
        if body.len() + chunk.len() > MAX_JWKS_BYTES {
            return Err(format!(
                "{url}: the JWKS is larger than {MAX_JWKS_BYTES} bytes"
            ));
        }
        body.extend_from_slice(&chunk);
    }
    KeySet::parse(&body).map_err(|e| format!("{url}: {e}"))
}

/// The key set in use and how refreshes are counted.
#[derive(Clone)]
pub struct Keys {
    pub current: Arc<ArcSwap<KeySet>>,
    pub refreshes: IntCounterVec,
}

impl Keys {
    pub fn new(mut initial: KeySet, refreshes: IntCounterVec) -> Keys {
        initial.generation = next_generation();
        Keys {
            current: Arc::new(ArcSwap::from_pointee(initial)),
            refreshes,
        }
    }

    /// Installs the outcome of a read or fetch: a new set replaces the old one; a failure
    /// keeps the old one and is logged.
    pub fn install(&self, source: &Source, outcome: Result<KeySet, String>) -> Result<(), String> {
        match outcome {
            Ok(mut set) => {
                set.generation = next_generation();
                tracing::debug!(
                    target: "gateway::auth",
                    keys = set.keys.len(),
                    source = %source.describe(),
                    "JWKS loaded"
                );
                self.current.store(Arc::new(set));
                self.refreshes.with_label_values(&["ok"]).inc();
                Ok(())
            }
            Err(e) => {
                tracing::warn!(
                    target: "gateway::auth",
                    error = %e,
                    "could not refresh the JWKS; the last good key set stays in use"
                );
                self.refreshes.with_label_values(&["error"]).inc();
                Err(e)
            }
        }
    }
}
