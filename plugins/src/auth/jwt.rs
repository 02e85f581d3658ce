//! JWT authentication: telling a token from an API key, verifying it against the JWKS
//! (signature, algorithm, `exp`/`nbf` with leeway, `iss`/`aud` when configured), and reading
//! the identity and limits its claims carry.
//!
//! **Each token is verified once.** Clients send the same token for every call until it
//! expires, and a signature check costs far more than the rest of a request. A verified token's
//! identity is kept ([`JwtAuth::check`]) under the SHA-256 of its bytes (never the token
//! itself), with its `exp` and `nbf` (checked again, with the leeway, on every use) and the
//! generation of the key set that verified it: once the set is replaced (a file reloaded, a URL
//! refreshed), a kept token is verified again against the new set, so a key that leaves takes
//! its tokens with it. Refused tokens are never kept. The cache holds at most
//! [`VERIFIED_CACHE_BYTES`] (by an estimate of each entry's size) and forgets an entry after
//! [`VERIFIED_CACHE_TTL`] at the latest; hits and misses are counted in
//! `gw_auth_jwt_cache_total{outcome}`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use jsonwebtoken::errors::ErrorKind as JwtErrorKind;
use jsonwebtoken::{Algorithm, Validation};
use serde_json::{Map, Value};

use plugin_sdk::access::{RateLimit, UsageLimit};
use plugin_sdk::sinks::SharedSink;

use super::background::{AuditQueue, Background, AUDIT_QUEUE};
use super::config::{ClaimsConfig, JwtConfig};
use super::jwks::{self, KeySet, Keys, Source};
use super::AuthMetrics;

/// The longest key id or algorithm name repeated in a message or an audit event (they come
/// from the client).
const MAX_ECHO: usize = 64;

/// How long a request with an unknown `kid` waits for the early JWKS fetch it started.
const EARLY_REFRESH_WAIT: Duration = Duration::from_secs(2);

/// The most memory the verified tokens may hold, by an estimate of each entry's size.
pub const VERIFIED_CACHE_BYTES: u64 = 16 << 20;

/// The longest a verified token is kept, whatever its `exp`.
pub const VERIFIED_CACHE_TTL: Duration = Duration::from_secs(3600);

/// Whether a credential has the shape of a JWT: three non-empty base64url segments.
pub fn looks_like_jwt(value: &str) -> bool {
    let mut segments = 0;
    for part in value.split('.') {
        segments += 1;
        if part.is_empty()
            || !part
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return false;
        }
    }
    segments == 3
}

/// Why a token was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Not a decodable JWT.
    Malformed,
    /// The header's algorithm is not among the accepted ones.
    Algorithm(String),
    /// No key of the JWKS has the token's `kid`, even after a refresh.
    UnknownKid(String),
    /// The key with the token's `kid` (or, without a `kid`, every key) cannot verify its
    /// algorithm.
    NoKeyFor(String),
    BadSignature,
    Expired,
    NotYetValid,
    WrongIssuer,
    WrongAudience,
    MissingClaim(String),
    BadClaim {
        claim: String,
        problem: String,
    },
    /// A valid token whose scopes do not allow calling the gateway (a 403, not a 401).
    MissingScope(String),
}

impl Failure {
    /// A short stable code, recorded in the audit event's details.
    pub fn code(&self) -> &'static str {
        match self {
            Failure::Malformed => "malformed",
            Failure::Algorithm(_) => "algorithm_not_accepted",
            Failure::UnknownKid(_) => "unknown_kid",
            Failure::NoKeyFor(_) => "no_key_for_algorithm",
            Failure::BadSignature => "bad_signature",
            Failure::Expired => "expired",
            Failure::NotYetValid => "not_yet_valid",
            Failure::WrongIssuer => "wrong_issuer",
            Failure::WrongAudience => "wrong_audience",
            Failure::MissingClaim(_) => "missing_claim",
            Failure::BadClaim { .. } => "bad_claim",
            Failure::MissingScope(_) => "missing_scope",
        }
    }

    /// The message the client gets (after `invalid JWT: `).
    pub fn message(&self) -> String {
        match self {
            Failure::Malformed => "the token is not a well-formed JWT".into(),
            Failure::Algorithm(alg) => format!("the token's algorithm {alg} is not accepted"),
            Failure::UnknownKid(kid) => format!("the token's key id {kid:?} is not in the JWKS"),
            Failure::NoKeyFor(alg) => format!("no key of the JWKS verifies {alg} for this token"),
            Failure::BadSignature => "bad signature".into(),
            Failure::Expired => "the token has expired (exp)".into(),
            Failure::NotYetValid => "the token is not valid yet (nbf)".into(),
            Failure::WrongIssuer => "wrong issuer (iss)".into(),
            Failure::WrongAudience => "wrong audience (aud)".into(),
            Failure::MissingClaim(c) => format!("the token lacks the claim {c}"),
            Failure::BadClaim { claim, problem } => format!("claim {claim}: {problem}"),
            Failure::MissingScope(scope) => {
                format!("the token lacks the scope {scope}, which calls to the gateway need")
            }
        }
    }
}

fn echo(s: &str) -> String {
    s.chars().take(MAX_ECHO).collect()
}

/// A verified token's claims, with its key id.
#[derive(Debug)]
pub struct Verified {
    pub claims: Map<String, Value>,
    pub kid: Option<String>,
    /// The generation of the key set that verified it.
    pub generation: u64,
}

/// A token verified and read: what its claims say, and its key id.
#[derive(Debug, Clone)]
pub struct Checked {
    pub identity: Arc<Identity>,
    pub kid: Option<String>,
}

/// What the cache keeps of a verified token.
struct Kept {
    checked: Checked,
    generation: u64,
    exp: i64,
    nbf: Option<i64>,
}

impl Kept {
    /// An estimate of the entry's memory, for the cache's bound.
    fn weight(&self) -> u32 {
        let i = &self.checked.identity;
        let strings = [
            &i.workspace_id,
            &i.organisation_id,
            &i.user,
            &self.checked.kid,
        ]
        .iter()
        .map(|s| s.as_ref().map_or(0, String::len))
        .sum::<usize>();
        let scopes: usize = i.scopes.iter().map(|s| s.len() + 24).sum();
        let limits = (i.rate_limits.len() + i.usage_limits.len()) * 96;
        (256 + strings + scopes + limits).min(u32::MAX as usize) as u32
    }
}

/// The cache's hit and miss counters.
struct CacheCounters {
    hit: prometheus::IntCounter,
    miss: prometheus::IntCounter,
}

/// What the token says about its bearer.
#[derive(Debug, Default, PartialEq)]
pub struct Identity {
    pub workspace_id: Option<String>,
    pub organisation_id: Option<String>,
    pub user: Option<String>,
    pub scopes: Vec<String>,
    pub rate_limits: Vec<RateLimit>,
    pub usage_limits: Vec<UsageLimit>,
}

/// Early refreshes of a URL's JWKS when a token names an unknown key id.
struct EarlyRefresh {
    client: reqwest::Client,
    url: String,
    min_interval: Duration,
    /// When the last early refresh started. Held across the fetch so that concurrent requests
    /// with the new key id wait for one fetch instead of starting their own.
    last: tokio::sync::Mutex<Option<Instant>>,
}

/// The JWT side of the plugin.
pub struct JwtAuth {
    /// One validation per accepted algorithm: jsonwebtoken refuses a validation that lists
    /// algorithms of another family than the key's.
    validations: Vec<(Algorithm, Validation)>,
    claims: ClaimsConfig,
    default_scopes: Vec<String>,
    keys: Keys,
    source: Source,
    early: Option<EarlyRefresh>,
    audit: AuditQueue,
    background: Arc<Background>,
    leeway: i64,
    verified: moka::sync::Cache<[u8; 32], Arc<Kept>>,
    counters: CacheCounters,
}

impl JwtAuth {
    /// Loads the keys (a failure refuses the build), starts the refresh loop of a URL and the
    /// audit writer.
    pub fn build(
        config: &JwtConfig,
        sink: SharedSink,
        metrics: &AuthMetrics,
    ) -> Result<JwtAuth, String> {
        JwtAuth::build_with_cache(config, sink, metrics, VERIFIED_CACHE_BYTES)
    }

    /// [`JwtAuth::build`] with another bound on the verified tokens' memory.
    pub fn build_with_cache(
        config: &JwtConfig,
        sink: SharedSink,
        metrics: &AuthMetrics,
        cache_bytes: u64,
    ) -> Result<JwtAuth, String> {
        super::ring_verify::install();
        let background = Arc::new(Background::start()?);
        let mut validation = Validation::new(Algorithm::RS256);
        validation.leeway = config.leeway_secs;
        validation.validate_nbf = true;
        let mut required = vec!["exp"];
        if let Some(iss) = &config.issuer {
            validation.set_issuer(iss);
            required.push("iss");
        }
        match &config.audience {
            Some(aud) => {
                validation.set_audience(aud);
                required.push("aud");
            }
            // Then the issuer is (the config requires one of the two); jsonwebtoken would
            // refuse every token carrying an `aud` without an expected value.
            None => validation.validate_aud = false,
        }
        validation.set_required_spec_claims(&required);
        let validations = config
            .algorithms
            .iter()
            .map(|a| {
                let mut v = validation.clone();
                v.algorithms = vec![a.algorithm()];
                (a.algorithm(), v)
            })
            .collect();

        let (source, initial, early) = match (&config.jwks_url, &config.jwks_file) {
            (Some(url), _) => {
                let client = reqwest::Client::builder()
                    .timeout(jwks::FETCH_TIMEOUT)
                    .build()
                    .map_err(|e| format!("cannot build an HTTP client: {e}"))?;
                let fetch_client = client.clone();
                let fetch_url = url.clone();
                let initial = background
                    .run_blocking(jwks::FETCH_TIMEOUT + Duration::from_secs(2), async move {
                        jwks::fetch(&fetch_client, &fetch_url).await
                    })
                    .unwrap_or_else(|| Err(format!("fetching {url} timed out")))
                    .map_err(|e| format!("jwt.jwks_url: {e}"))?;
                let early = EarlyRefresh {
                    client,
                    url: url.clone(),
                    min_interval: Duration::from_secs(config.min_refresh_secs),
                    last: tokio::sync::Mutex::new(None),
                };
                (Source::Url(url.clone()), initial, Some(early))
            }
            (None, Some(path)) => {
                let initial = jwks::read_file(path).map_err(|e| format!("jwt.jwks_file: {e}"))?;
                (Source::File(path.clone()), initial, None)
            }
            (None, None) => return Err("jwt needs jwks_url or jwks_file".into()),
        };
        let keys = Keys::new(initial, metrics.jwks_refresh.clone());
        keys.refreshes.with_label_values(&["ok"]).inc();
        if let Some(early) = &early {
            background.handle().spawn(refresh_loop(
                keys.clone(),
                source.clone(),
                early.client.clone(),
                early.url.clone(),
                Duration::from_secs(config.refresh_secs),
            ));
        }
        let audit = AuditQueue::start(&background, sink, metrics.audit.clone(), AUDIT_QUEUE);
        let verified = moka::sync::Cache::builder()
            .max_capacity(cache_bytes)
            .weigher(|_key: &[u8; 32], kept: &Arc<Kept>| kept.weight())
            .time_to_live(VERIFIED_CACHE_TTL)
            .build();
        Ok(JwtAuth {
            validations,
            claims: config.claims.clone(),
            default_scopes: config.default_scopes.clone(),
            keys,
            source,
            early,
            audit,
            background,
            leeway: i64::try_from(config.leeway_secs).unwrap_or(i64::MAX),
            verified,
            counters: CacheCounters {
                hit: metrics.jwt_cache.with_label_values(&["hit"]),
                miss: metrics.jwt_cache.with_label_values(&["miss"]),
            },
        })
    }

    pub fn audit(&self) -> &AuditQueue {
        &self.audit
    }

    /// Rereads a JWKS file (a URL's set is fetched again in the background). On an error the
    /// keys in use stay.
    pub fn reload(&self) -> Result<(), String> {
        match &self.source {
            Source::File(path) => self.keys.install(&self.source, jwks::read_file(path)),
            Source::Url(_) => {
                if let Some(early) = &self.early {
                    let (keys, source) = (self.keys.clone(), self.source.clone());
                    let (client, url) = (early.client.clone(), early.url.clone());
                    self.background.handle().spawn(async move {
                        let _ = keys.install(&source, jwks::fetch(&client, &url).await);
                    });
                }
                Ok(())
            }
        }
    }

    /// Verifies a token: its algorithm, a key of the JWKS that signed it (fetching the set
    /// early, at most once per `min_refresh_secs`, when the `kid` is unknown), and its claims.
    pub async fn verify(&self, token: &str) -> Result<Verified, (Failure, Option<String>)> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| (Failure::Malformed, None))?;
        let kid = header.kid.as_deref().map(echo);
        let fail = |f: Failure| (f, kid.clone());
        let Some((_, validation)) = self.validations.iter().find(|(a, _)| *a == header.alg) else {
            return Err(fail(Failure::Algorithm(format!("{:?}", header.alg))));
        };
        let mut keys = self.keys.current.load_full();
        if let Some(k) = header.kid.as_deref() {
            if !keys.has_kid(k) {
                self.refresh_early().await;
                keys = self.keys.current.load_full();
                if !keys.has_kid(k) {
                    return Err(fail(Failure::UnknownKid(echo(k))));
                }
            }
        }
        verify_with(&keys, token, header.kid.as_deref(), header.alg, validation)
            .map(|claims| Verified {
                claims,
                kid: kid.clone(),
                generation: keys.generation,
            })
            .map_err(fail)
    }

    /// Verifies a token and reads its identity, once per token and key set (see the module's
    /// notes): a token seen before is only checked for `exp` and `nbf`.
    pub async fn check(&self, token: &str) -> Result<Checked, (Failure, Option<String>)> {
        let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
        let mut key = [0u8; 32];
        key.copy_from_slice(digest.as_ref());
        let generation = self.keys.current.load().generation;
        if let Some(kept) = self.verified.get(&key) {
            if kept.generation == generation {
                self.counters.hit.inc();
                return match self.in_time(kept.exp, kept.nbf) {
                    Ok(()) => Ok(kept.checked.clone()),
                    Err(failure) => {
                        self.verified.invalidate(&key);
                        Err((failure, kept.checked.kid.clone()))
                    }
                };
            }
        }
        self.counters.miss.inc();
        let verified = self.verify(token).await?;
        let identity = self
            .identity(&verified.claims)
            .map_err(|f| (f, verified.kid.clone()))?;
        let checked = Checked {
            identity: Arc::new(identity),
            kid: verified.kid,
        };
        // `exp` is required and was validated as a number; `nbf` when present.
        let seconds = |name: &str| verified.claims.get(name).and_then(Value::as_f64);
        if let Some(exp) = seconds("exp") {
            let kept = Kept {
                checked: checked.clone(),
                generation: verified.generation,
                exp: exp as i64,
                nbf: seconds("nbf").map(|n| n as i64),
            };
            self.verified.insert(key, Arc::new(kept));
        }
        Ok(checked)
    }

    /// `exp` and `nbf` against the clock, with the leeway, as the first verification did.
    fn in_time(&self, exp: i64, nbf: Option<i64>) -> Result<(), Failure> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        if exp < now.saturating_sub(self.leeway) {
            return Err(Failure::Expired);
        }
        if nbf.is_some_and(|nbf| nbf > now.saturating_add(self.leeway)) {
            return Err(Failure::NotYetValid);
        }
        Ok(())
    }

    /// How many verified tokens are kept, and their estimated bytes (after pending evictions).
    pub fn cache_usage(&self) -> (u64, u64) {
        self.verified.run_pending_tasks();
        (self.verified.entry_count(), self.verified.weighted_size())
    }

    /// Fetches a URL's JWKS now unless an early fetch started within `min_refresh_secs`
    /// (then the caller looks at whatever that one brought).
    async fn refresh_early(&self) {
        let Some(early) = &self.early else {
            return;
        };
        let mut last = early.last.lock().await;
        if last.is_some_and(|t| t.elapsed() < early.min_interval) {
            return;
        }
        *last = Some(Instant::now());
        let (keys, source) = (self.keys.clone(), self.source.clone());
        let (client, url) = (early.client.clone(), early.url.clone());
        let job = self.background.handle().spawn(async move {
            let _ = keys.install(&source, jwks::fetch(&client, &url).await);
        });
        // The request waits a little for the new keys, not for a slow identity provider: the
        // fetch goes on in the background and the keys serve the next requests.
        let _ = tokio::time::timeout(EARLY_REFRESH_WAIT, job).await;
    }

    /// The configured claim names.
    pub fn claim_names(&self) -> &ClaimsConfig {
        &self.claims
    }

    /// Reads the identity and limits from verified claims.
    pub fn identity(&self, claims: &Map<String, Value>) -> Result<Identity, Failure> {
        identity(claims, &self.claims, &self.default_scopes)
    }
}

async fn refresh_loop(
    keys: Keys,
    source: Source,
    client: reqwest::Client,
    url: String,
    every: Duration,
) {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let _ = keys.install(&source, jwks::fetch(&client, &url).await);
    }
}

/// Tries the keys that may have signed the token; the first whose signature holds decides.
fn verify_with(
    keys: &KeySet,
    token: &str,
    kid: Option<&str>,
    alg: Algorithm,
    validation: &Validation,
) -> Result<Map<String, Value>, Failure> {
    let mut tried = false;
    for key in keys.candidates(kid, alg) {
        tried = true;
        match jsonwebtoken::decode::<Value>(token, &key.key, validation) {
            Ok(data) => {
                return match data.claims {
                    Value::Object(map) => Ok(map),
                    _ => Err(Failure::Malformed),
                }
            }
            Err(e) => match e.into_kind() {
                JwtErrorKind::ExpiredSignature => return Err(Failure::Expired),
                JwtErrorKind::ImmatureSignature => return Err(Failure::NotYetValid),
                JwtErrorKind::InvalidIssuer => return Err(Failure::WrongIssuer),
                JwtErrorKind::InvalidAudience => return Err(Failure::WrongAudience),
                JwtErrorKind::MissingRequiredClaim(c) => return Err(Failure::MissingClaim(c)),
                JwtErrorKind::InvalidClaimFormat(c) => {
                    return Err(Failure::BadClaim {
                        claim: c,
                        problem: "must be a number of seconds since 1970".into(),
                    })
                }
                JwtErrorKind::InvalidToken
                | JwtErrorKind::Base64(_)
                | JwtErrorKind::Json(_)
                | JwtErrorKind::Utf8(_) => return Err(Failure::Malformed),
                // A bad signature, or a key this token's signature cannot be checked with:
                // another key with the same id may still verify it.
                _ => continue,
            },
        }
    }
    if tried {
        Err(Failure::BadSignature)
    } else {
        Err(Failure::NoKeyFor(format!("{alg:?}")))
    }
}

/// Reads a string claim; numbers are taken as their text (some identity providers use numeric
/// subjects).
fn string_claim(claims: &Map<String, Value>, name: &str) -> Result<Option<String>, Failure> {
    match claims.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Number(n)) => Ok(Some(n.to_string())),
        Some(_) => Err(Failure::BadClaim {
            claim: name.to_owned(),
            problem: "must be a string".into(),
        }),
    }
}

/// Maps claims to an [`Identity`] by the configured claim names; a token without any scopes
/// claim gets `default_scopes` (none unless configured).
pub fn identity(
    claims: &Map<String, Value>,
    names: &ClaimsConfig,
    default_scopes: &[String],
) -> Result<Identity, Failure> {
    let bad = |claim: &str, problem: String| Failure::BadClaim {
        claim: claim.to_owned(),
        problem,
    };
    let mut scopes = default_scopes.to_vec();
    for name in &names.scopes {
        match claims.get(name) {
            None | Some(Value::Null) => continue,
            Some(Value::String(s)) => scopes = s.split_whitespace().map(str::to_owned).collect(),
            Some(Value::Array(items)) => {
                scopes = items
                    .iter()
                    .map(|v| v.as_str().map(str::to_owned))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| bad(name, "must be a list of strings".into()))?;
            }
            Some(_) => {
                return Err(bad(
                    name,
                    "must be a space-separated string or a list of strings".into(),
                ))
            }
        }
        break;
    }
    let rate_limits = match claims.get(&names.rate_limits) {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => {
            let limits: Vec<RateLimit> = serde_json::from_value(v.clone()).map_err(|e| {
                bad(
                    &names.rate_limits,
                    format!("must be a list of {{type, unit, value}}: {e}"),
                )
            })?;
            if let Some(i) = limits
                .iter()
                .position(|l| !(l.value.is_finite() && l.value > 0.0))
            {
                return Err(bad(
                    &names.rate_limits,
                    format!("item {i}: value must be a positive number"),
                ));
            }
            limits
        }
    };
    let usage_limits = match claims.get(&names.usage_limits) {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => {
            let parsed = if v.is_array() {
                serde_json::from_value::<Vec<UsageLimit>>(v.clone())
            } else {
                serde_json::from_value::<UsageLimit>(v.clone()).map(|l| vec![l])
            };
            let limits = parsed.map_err(|e| {
                bad(
                    &names.usage_limits,
                    format!("must be a usage limit object or a list of them: {e}"),
                )
            })?;
            if let Some(i) = limits
                .iter()
                .position(|l| !(l.credit_limit.is_finite() && l.credit_limit >= 0.0))
            {
                return Err(bad(
                    &names.usage_limits,
                    format!("item {i}: credit_limit must be a number of at least 0"),
                ));
            }
            limits
        }
    };
    let user = string_claim(claims, &names.user)?;
    if user.is_none() && !(rate_limits.is_empty() && usage_limits.is_empty()) {
        // The counters of a token's limits are named after its user.
        return Err(Failure::MissingClaim(names.user.clone()));
    }
    Ok(Identity {
        workspace_id: string_claim(claims, &names.workspace_id)?,
        organisation_id: string_claim(claims, &names.organisation_id)?,
        user,
        scopes,
        rate_limits,
        usage_limits,
    })
}
