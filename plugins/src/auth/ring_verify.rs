//! JWT signatures checked with `ring`: jsonwebtoken's crypto provider with ring's verifiers for
//! the two algorithms the plugin accepts (RS256 with keys of 2048 bits or more, ES256 on P-256),
//! installed for the process when the first JWT verifier is built. Everything else (signing,
//! which only tests do, and key utilities) stays with jsonwebtoken's own backend.
//!
//! ring's verifiers are constant-time and several times faster than the pure-Rust ones: a
//! token's first use (before it is kept, see `jwt`) costs what a modern implementation costs.

use std::sync::OnceLock;

use jsonwebtoken::crypto::{rust_crypto, CryptoProvider, JwtVerifier};
use jsonwebtoken::errors::{Error, ErrorKind};
use jsonwebtoken::signature::{Error as SignatureError, Verifier};
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey, DecodingKeyKind};
use ring::signature::{
    RsaPublicKeyComponents, UnparsedPublicKey, ECDSA_P256_SHA256_FIXED, RSA_PKCS1_2048_8192_SHA256,
};

/// Installs the provider for the process (once; a provider already installed stays).
pub fn install() {
    static PROVIDER: OnceLock<CryptoProvider> = OnceLock::new();
    let provider = PROVIDER.get_or_init(|| CryptoProvider {
        verifier_factory: verifier,
        ..rust_crypto::DEFAULT_PROVIDER.clone()
    });
    let _ = provider.install_default();
}

/// A public key as ring reads it.
enum Key {
    /// Modulus and exponent, big-endian.
    RsaComponents { n: Vec<u8>, e: Vec<u8> },
    /// A PKCS#1 `RSAPublicKey`, DER.
    RsaDer(Vec<u8>),
    /// An uncompressed SEC1 point (`04 || x || y`).
    P256(Vec<u8>),
}

struct RingVerifier {
    algorithm: Algorithm,
    key: Key,
}

/// The verifier of `algorithm` with `key`: ring's for RS256 and ES256, jsonwebtoken's own for
/// others.
pub fn verifier(algorithm: &Algorithm, key: &DecodingKey) -> Result<Box<dyn JwtVerifier>, Error> {
    let key = match (algorithm, key.family(), key.kind()) {
        (Algorithm::RS256, AlgorithmFamily::Rsa, DecodingKeyKind::RsaModulusExponent { n, e }) => {
            Key::RsaComponents {
                n: n.clone(),
                e: e.clone(),
            }
        }
        (Algorithm::RS256, AlgorithmFamily::Rsa, DecodingKeyKind::SecretOrDer(der)) => {
            Key::RsaDer(der.clone())
        }
        (Algorithm::ES256, AlgorithmFamily::Ec, DecodingKeyKind::SecretOrDer(point)) => {
            Key::P256(point.clone())
        }
        // A key of another family for this algorithm (an algorithm confusion) is refused as
        // jsonwebtoken's own backend refuses it; other algorithms go to that backend.
        (Algorithm::RS256 | Algorithm::ES256, _, _) => {
            return Err(ErrorKind::InvalidKeyFormat.into())
        }
        _ => return (rust_crypto::DEFAULT_PROVIDER.verifier_factory)(algorithm, key),
    };
    Ok(Box::new(RingVerifier {
        algorithm: *algorithm,
        key,
    }))
}

impl Verifier<Vec<u8>> for RingVerifier {
    fn verify(&self, message: &[u8], sig: &Vec<u8>) -> Result<(), SignatureError> {
        let checked = match &self.key {
            Key::RsaComponents { n, e } => {
                RsaPublicKeyComponents { n, e }.verify(&RSA_PKCS1_2048_8192_SHA256, message, sig)
            }
            Key::RsaDer(der) => {
                UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, der).verify(message, sig)
            }
            Key::P256(point) => {
                UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, point).verify(message, sig)
            }
        };
        checked.map_err(|_| SignatureError::new())
    }
}

impl JwtVerifier for RingVerifier {
    fn algorithm(&self) -> Algorithm {
        self.algorithm
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::jwk::Jwk;
    use jsonwebtoken::EncodingKey;

    const RSA: &[u8] = include_bytes!("testdata/rsa_a.pem");
    const EC: &[u8] = include_bytes!("testdata/ec_a.pem");

    /// The signing input and signature of a token signed with `key`, and the public key.
    fn signed(key: &EncodingKey, alg: Algorithm) -> (Vec<u8>, Vec<u8>, DecodingKey) {
        let token = jsonwebtoken::encode(
            &jsonwebtoken::Header::new(alg),
            &serde_json::json!({"a": 1}),
            key,
        )
        .unwrap();
        let (input, sig) = token.rsplit_once('.').unwrap();
        let sig =
            base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, sig).unwrap();
        let public = DecodingKey::from_jwk(&Jwk::from_encoding_key(key, alg).unwrap()).unwrap();
        (input.as_bytes().to_vec(), sig, public)
    }

    #[test]
    fn ring_checks_rs256_and_es256_signatures() {
        let cases = [
            (EncodingKey::from_rsa_pem(RSA).unwrap(), Algorithm::RS256),
            (EncodingKey::from_ec_pem(EC).unwrap(), Algorithm::ES256),
        ];
        for (key, alg) in cases {
            let (input, sig, public) = signed(&key, alg);
            let v = verifier(&alg, &public).unwrap();
            assert!(v.verify(&input, &sig).is_ok(), "{alg:?}");
            let mut tampered = input.clone();
            tampered[0] ^= 1;
            assert!(v.verify(&tampered, &sig).is_err(), "{alg:?} tampered input");
            let mut bad = sig.clone();
            bad[5] ^= 1;
            assert!(
                v.verify(&input, &bad).is_err(),
                "{alg:?} tampered signature"
            );
        }
    }

    #[test]
    fn a_key_of_another_family_is_refused() {
        let (_, _, rsa) = signed(&EncodingKey::from_rsa_pem(RSA).unwrap(), Algorithm::RS256);
        let (_, _, ec) = signed(&EncodingKey::from_ec_pem(EC).unwrap(), Algorithm::ES256);
        assert!(verifier(&Algorithm::ES256, &rsa).is_err());
        assert!(verifier(&Algorithm::RS256, &ec).is_err());
        assert!(verifier(&Algorithm::RS256, &DecodingKey::from_secret(b"s")).is_err());
    }
}
