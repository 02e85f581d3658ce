//! API keys: the digest the snapshot is keyed by, the constant-time comparison, and what makes
//! a known key unusable (expiry) or insufficient (scopes).

use std::time::SystemTime;

use plugin_sdk::access::{ApiKeyRecord, KeyKind, KeyStatus};

/// The scope a call to the gateway (LLM routes and passthrough) needs.
pub const GATEWAY_SCOPE: &str = "completions.write";

/// The SHA-256 digest of a raw key, as the control plane stores it.
pub fn digest(raw: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, raw.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// Compares two digests in time that does not depend on where they differ: a manual XOR fold
/// over every byte (ring's `constant_time` module is deprecated), with `black_box` so that the
/// optimiser cannot turn the fold into an early-exit comparison.
pub fn digests_equal(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b.iter()) {
        diff |= std::hint::black_box(x ^ y);
    }
    std::hint::black_box(diff) == 0
}

/// Whether the key has expired: its status says so, or its `expires_at` has passed (the
/// control plane's expiry worker may not have run yet).
pub fn is_expired(key: &ApiKeyRecord, now: SystemTime) -> bool {
    key.status == KeyStatus::Expired || key.expires_at.is_some_and(|at| at <= now)
}

/// Whether a key created without scopes may call the gateway: the rights of its kind.
pub fn kind_calls_gateway(kind: KeyKind) -> bool {
    // Every kind may: admin keys act on the whole organisation, service and user keys on
    // their workspace. Spelled out so that a new kind has to decide.
    match kind {
        KeyKind::OrganisationService | KeyKind::WorkspaceService | KeyKind::WorkspaceUser => true,
    }
}

/// Whether `scopes` (empty: the default rights of `kind`, when a key) grant `scope`.
pub fn grants(scopes: &[String], default_allows: bool, scope: &str) -> bool {
    if scopes.is_empty() {
        default_allows
    } else {
        scopes.iter().any(|s| s == scope)
    }
}
