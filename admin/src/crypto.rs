//! Secrets at rest: provider keys and other credentials of integrations, and the secrets inside
//! saved configs ([`crate::store::config_secrets`]), are stored encrypted with AES-256-GCM
//! (`ring::aead`), a fresh random 96-bit nonce per value, and the row and field they belong to
//! as associated data (a ciphertext copied to another row or field does not open).
//!
//! The key (32 bytes) comes from `GW_SECRET_KEY` (base64). Without it, a SQLite database keeps
//! a generated key in a file beside the database file (`<file>.key`, mode 0600); a PostgreSQL
//! database, shared by several gateways, needs `GW_SECRET_KEY` (the control plane refuses to
//! start without it).

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};

use base64::Engine;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};

use crate::error::{AdminError, Result};

/// The environment variable holding the key.
pub const SECRET_KEY_VAR: &str = "GW_SECRET_KEY";

/// The prefix of stored ciphertexts: the format's version.
const PREFIX: &str = "v1:";

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// A 256-bit key. Its `Debug` form never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretKey([u8; 32]);

impl fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretKey(<redacted>)")
    }
}

impl SecretKey {
    /// A new random key.
    pub fn generate() -> SecretKey {
        let mut bytes = [0u8; 32];
        SystemRandom::new()
            .fill(&mut bytes)
            .expect("the system random source works");
        SecretKey(bytes)
    }

    /// A key from its base64 form (standard or URL-safe alphabet, padded or not): exactly 32
    /// bytes.
    pub fn from_base64(text: &str) -> Result<SecretKey> {
        use base64::engine::general_purpose::{
            STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD,
        };
        let text = text.trim();
        let bytes = [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD]
            .iter()
            .find_map(|engine| engine.decode(text).ok())
            .ok_or_else(|| {
                AdminError::validation(format!(
                    "{SECRET_KEY_VAR} must be base64 (e.g. the output of `openssl rand -base64 32`)"
                ))
            })?;
        let bytes: [u8; 32] = bytes.try_into().map_err(|b: Vec<u8>| {
            AdminError::validation(format!(
                "{SECRET_KEY_VAR} must be 32 bytes in base64, got {} bytes",
                b.len()
            ))
        })?;
        Ok(SecretKey(bytes))
    }

    pub fn to_base64(&self) -> String {
        B64.encode(self.0)
    }
}

/// Encrypts and decrypts stored secrets with one key.
pub struct Cipher {
    key: LessSafeKey,
    rng: SystemRandom,
}

impl fmt::Debug for Cipher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Cipher(<key redacted>)")
    }
}

impl Cipher {
    pub fn new(key: &SecretKey) -> Cipher {
        let unbound = UnboundKey::new(&AES_256_GCM, &key.0).expect("a 32-byte AES-256 key");
        Cipher {
            key: LessSafeKey::new(unbound),
            rng: SystemRandom::new(),
        }
    }

    /// `plaintext` sealed for `context` (the row and field it is stored in), as text:
    /// `v1:` + base64(nonce | ciphertext | tag).
    pub fn encrypt(&self, plaintext: &str, context: &str) -> String {
        let mut nonce = [0u8; NONCE_LEN];
        self.rng
            .fill(&mut nonce)
            .expect("the system random source works");
        let mut sealed = plaintext.as_bytes().to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(context.as_bytes()),
                &mut sealed,
            )
            .expect("AES-GCM seals any input below 64 GiB");
        let mut out = Vec::with_capacity(NONCE_LEN + sealed.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        format!("{PREFIX}{}", B64.encode(out))
    }

    /// The plaintext of a value made by [`Cipher::encrypt`] for the same `context`; an error
    /// when the key is another one, the context differs or the value was altered.
    pub fn decrypt(&self, stored: &str, context: &str) -> Result<String> {
        let fail = || AdminError::internal(format!("cannot decrypt the stored {context}"));
        let data = stored
            .strip_prefix(PREFIX)
            .and_then(|b| B64.decode(b).ok())
            .ok_or_else(fail)?;
        if data.len() < NONCE_LEN {
            return Err(fail());
        }
        let (nonce, sealed) = data.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| fail())?;
        let mut sealed = sealed.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(context.as_bytes()), &mut sealed)
            .map_err(|_| fail())?;
        String::from_utf8(plain.to_vec()).map_err(|_| fail())
    }
}

/// The key file of a SQLite database file: `<file>.key` beside it.
pub fn key_file_of(database_file: &Path) -> PathBuf {
    let mut name = database_file.as_os_str().to_owned();
    name.push(".key");
    PathBuf::from(name)
}

/// The key kept in `path`, made (random, mode 0600) when the file does not exist. Two gateways
/// starting together agree: only one creates the file, the other reads it.
pub fn load_or_create_key_file(path: &Path) -> Result<SecretKey> {
    let cannot = |what: &str, e: std::io::Error| {
        AdminError::internal(format!("cannot {what} {}: {e}", path.display()))
    };
    loop {
        match std::fs::read_to_string(path) {
            Ok(text) if !text.trim().is_empty() => {
                warn_if_readable_by_others(path);
                return SecretKey::from_base64(&text).map_err(|e| {
                    AdminError::internal(format!("the key file {}: {}", path.display(), e.message))
                });
            }
            // Being written by another instance that has just created it.
            Ok(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let key = SecretKey::generate();
                let mut options = std::fs::OpenOptions::new();
                options.write(true).create_new(true);
                #[cfg(unix)]
                {
                    use std::os::unix::fs::OpenOptionsExt;
                    options.mode(0o600);
                }
                match options.open(path) {
                    Ok(mut file) => {
                        file.write_all(format!("{}\n", key.to_base64()).as_bytes())
                            .and_then(|()| file.sync_all())
                            .map_err(|e| cannot("write", e))?;
                        tracing::info!(
                            file = %path.display(),
                            "generated the key that encrypts provider secrets; keep this file with the database (or set {SECRET_KEY_VAR})"
                        );
                        return Ok(key);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                    Err(e) => return Err(cannot("create", e)),
                }
            }
            Err(e) => return Err(cannot("read", e)),
        }
    }
}

#[cfg(unix)]
fn warn_if_readable_by_others(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(path) {
        if meta.permissions().mode() & 0o077 != 0 {
            tracing::warn!(
                file = %path.display(),
                "the secret key file can be read by other users; chmod 600 it"
            );
        }
    }
}

#[cfg(not(unix))]
fn warn_if_readable_by_others(_path: &Path) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_open_only_with_their_key_and_context() {
        let key = SecretKey::generate();
        let cipher = Cipher::new(&key);
        let a = cipher.encrypt("sk-secret", "integration:1:key");
        let b = cipher.encrypt("sk-secret", "integration:1:key");
        assert_ne!(a, b, "a fresh nonce per value");
        assert!(a.starts_with("v1:") && !a.contains("sk-secret"));
        assert_eq!(
            cipher.decrypt(&a, "integration:1:key").unwrap(),
            "sk-secret"
        );
        assert!(cipher.decrypt(&a, "integration:2:key").is_err());
        let other = Cipher::new(&SecretKey::generate());
        assert!(other.decrypt(&a, "integration:1:key").is_err());
        let mut bytes = B64.decode(&a[PREFIX.len()..]).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        let altered = format!("{PREFIX}{}", B64.encode(bytes));
        assert!(cipher.decrypt(&altered, "integration:1:key").is_err());
        assert!(cipher.decrypt("v1:", "x").is_err());
        assert!(cipher.decrypt("plain", "x").is_err());
        assert!(format!("{key:?}").contains("redacted"));
    }

    #[test]
    fn keys_are_32_bytes_of_base64() {
        let key = SecretKey::generate();
        assert_eq!(SecretKey::from_base64(&key.to_base64()).unwrap(), key);
        let url_safe = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(key.0);
        assert_eq!(SecretKey::from_base64(&url_safe).unwrap(), key);
        let short = B64.encode([1u8; 16]);
        assert!(SecretKey::from_base64(&short)
            .unwrap_err()
            .message
            .contains("got 16 bytes"));
        assert!(SecretKey::from_base64("not base64!").is_err());
    }

    #[test]
    fn the_key_file_is_made_once_and_private() {
        let dir = std::env::temp_dir().join(format!("gw-crypto-{}", crate::keys::random_hex(8)));
        std::fs::create_dir_all(&dir).unwrap();
        let path = key_file_of(&dir.join("gateway.db"));
        assert_eq!(path.file_name().unwrap(), "gateway.db.key");
        let first = load_or_create_key_file(&path).unwrap();
        let again = load_or_create_key_file(&path).unwrap();
        assert_eq!(first, again);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
