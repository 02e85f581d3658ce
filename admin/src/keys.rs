//! API key material: generation, the stored hash, and the masked form shown in lists.

use base64::Engine;
use ring::rand::{SecureRandom, SystemRandom};

/// Random bytes in a generated key (256 bits), base64url-encoded to 43 characters.
const KEY_BYTES: usize = 32;

/// The shortest key accepted from `GW_BOOTSTRAP_ADMIN_KEY`.
pub const MIN_SUPPLIED_KEY_LEN: usize = 16;

/// A new random key.
pub fn generate() -> String {
    let mut bytes = [0u8; KEY_BYTES];
    SystemRandom::new()
        .fill(&mut bytes)
        .expect("the system random source works");
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// Random lowercase hex of `n` characters (slugs).
pub fn random_hex(n: usize) -> String {
    let mut bytes = vec![0u8; n.div_ceil(2)];
    SystemRandom::new()
        .fill(&mut bytes)
        .expect("the system random source works");
    let mut s: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    s.truncate(n);
    s
}

/// The stored form of a key: SHA-256, hex. Keys are random and long, so a fast unsalted
/// hash is enough: it only has to make the stored value useless to whoever reads it.
pub fn hash(raw: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, raw.as_bytes());
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// The masked form shown in lists: the first and last two characters, `Xk*******S4`.
pub fn mask(raw: &str) -> String {
    let chars: Vec<char> = raw.chars().collect();
    if chars.len() < 8 {
        return "*".repeat(7);
    }
    let head: String = chars[..2].iter().collect();
    let tail: String = chars[chars.len() - 2..].iter().collect();
    format!("{head}*******{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_random_hashed_and_masked() {
        let a = generate();
        let b = generate();
        assert_eq!(a.len(), 43);
        assert_ne!(a, b);
        assert_eq!(hash("abc").len(), 64);
        assert_eq!(
            hash("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(mask("Xkabcdefghijklmnop-S4"), "Xk*******S4");
        assert_eq!(mask("short"), "*******");
        assert_eq!(random_hex(6).len(), 6);
    }
}
