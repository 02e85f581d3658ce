//! One JWT signature check (the cost of a token's first use), with ring (what the `auth`
//! plugin installs) and with jsonwebtoken's pure-Rust backend (what it used before), for the
//! plugin's two algorithms: RS256 with a 2048-bit key and ES256 on P-256.
//!
//! cargo bench -p micro-benches --bench jwt

use criterion::{criterion_group, criterion_main, Criterion};
use jsonwebtoken::crypto::rust_crypto;
use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header};

const RSA: &[u8] = include_bytes!("../../../plugins/src/auth/testdata/rsa_a.pem");
const EC: &[u8] = include_bytes!("../../../plugins/src/auth/testdata/ec_a.pem");

fn verification(c: &mut Criterion) {
    let mut group = c.benchmark_group("jwt_verify");
    for (name, key, alg) in [
        (
            "rs256",
            EncodingKey::from_rsa_pem(RSA).unwrap(),
            Algorithm::RS256,
        ),
        (
            "es256",
            EncodingKey::from_ec_pem(EC).unwrap(),
            Algorithm::ES256,
        ),
    ] {
        let claims = serde_json::json!({"sub": "ann", "exp": 4_000_000_000u64, "scope": "completions.write"});
        let token = jsonwebtoken::encode(&Header::new(alg), &claims, &key).unwrap();
        let (input, sig) = token.rsplit_once('.').unwrap();
        let sig =
            base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, sig).unwrap();
        let public = DecodingKey::from_jwk(&Jwk::from_encoding_key(&key, alg).unwrap()).unwrap();
        let ring = plugins::auth::ring_verify::verifier(&alg, &public).unwrap();
        let pure = (rust_crypto::DEFAULT_PROVIDER.verifier_factory)(&alg, &public).unwrap();
        group.bench_function(format!("{name}_ring"), |b| {
            b.iter(|| ring.verify(input.as_bytes(), &sig).unwrap())
        });
        group.bench_function(format!("{name}_rust_crypto"), |b| {
            b.iter(|| pure.verify(input.as_bytes(), &sig).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, verification);
criterion_main!(benches);
