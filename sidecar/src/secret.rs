//! The endpoint's shared secret and the keyed MACs derived from it.
//!
//! Every sidecar of an endpoint reads the same secret (the operator's HMAC Secret in Kubernetes,
//! `--secret-file` locally). It keys the session-id MAC (`docs/design/architecture.md#sessions`)
//! and the digests that stand for session ids in logs
//! (`docs/design/architecture.md#observability`), and the MAC of forwarded hops
//! (`docs/design/routing.md#forwarding`). Each use has its own domain-separation label, so a value
//! computed for one purpose is never valid for another.

use std::path::Path;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// Shortest secret accepted, in bytes (128 bits).
pub(crate) const MIN_SECRET_BYTES: usize = 16;

/// Domain label of session-id MACs.
pub(crate) const DOMAIN_SESSION_ID: &[u8] = b"tether/session-id/v1";
/// Domain label of peer hop MACs (`Tether-Hop-Mac`).
pub(crate) const DOMAIN_HOP: &[u8] = b"tether/hop/v1";
/// Domain label of peer-protocol message MACs (`Tether-Peer-Mac`, `docs/design/handoff.md`).
pub(crate) const DOMAIN_PEER: &[u8] = b"tether/peer/v1";
/// Domain label of log digests.
pub(crate) const DOMAIN_LOG_DIGEST: &[u8] = b"tether/log-digest/v1";
/// Domain of the digest a session's principal is kept as (`mcp/principal.rs`).
pub(crate) const DOMAIN_PRINCIPAL: &[u8] = b"tether/principal/v1";

/// Why the secret could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The file could not be read.
    #[error("cannot read secret file {path}: {source}")]
    Read {
        /// The secret file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The secret is too short to key a MAC safely.
    #[error("secret file {path} holds {len} bytes; at least {MIN_SECRET_BYTES} are required")]
    TooShort {
        /// The secret file.
        path: String,
        /// Its length after trimming surrounding whitespace.
        len: usize,
    },
}

/// The endpoint's shared secret (at least [`MIN_SECRET_BYTES`] bytes).
#[derive(Clone)]
pub(crate) struct Secret {
    bytes: Vec<u8>,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl Secret {
    /// Reads the secret from `path`, trimming surrounding ASCII whitespace (a trailing newline
    /// from `echo` or a Secret volume is common).
    ///
    /// # Errors
    /// [`SecretError`] when the file cannot be read or holds fewer than 16 bytes.
    pub(crate) fn from_file(path: &Path) -> Result<Self, SecretError> {
        let raw = std::fs::read(path).map_err(|source| SecretError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let bytes = raw.trim_ascii().to_vec();
        if bytes.len() < MIN_SECRET_BYTES {
            return Err(SecretError::TooShort {
                path: path.display().to_string(),
                len: bytes.len(),
            });
        }
        Ok(Self { bytes })
    }

    /// A secret from raw bytes (tests and tools). Shorter inputs are accepted here; use
    /// [`Secret::from_file`] for configuration.
    #[cfg(any(test, fuzzing))]
    pub(crate) fn from_bytes(bytes: impl Into<Vec<u8>>) -> Self {
        Self {
            bytes: bytes.into(),
        }
    }

    /// HMAC-SHA256 over `domain` (length-prefixed) followed by `message`: 32 bytes.
    pub(crate) fn mac(&self, domain: &[u8], message: &[u8]) -> [u8; 32] {
        let mut mac = self.keyed(domain);
        mac.update(message);
        mac.finalize().into_bytes().into()
    }

    /// Checks in constant time that `tag` equals the leftmost `tag.len()` bytes of
    /// [`Secret::mac`]. Tags shorter than 16 bytes are refused.
    pub(crate) fn verify(&self, domain: &[u8], message: &[u8], tag: &[u8]) -> bool {
        if tag.len() < 16 {
            return false;
        }
        let mut mac = self.keyed(domain);
        mac.update(message);
        mac.verify_truncated_left(tag).is_ok()
    }

    /// A short keyed digest of `value` for logs and debugging: 12 hex characters. It identifies a
    /// session across log lines without revealing its id.
    pub(crate) fn log_digest(&self, value: &str) -> String {
        hex::encode(&self.mac(DOMAIN_LOG_DIGEST, value.as_bytes())[..6])
    }

    fn keyed(&self, domain: &[u8]) -> Hmac<Sha256> {
        // HMAC accepts keys of any length, so this cannot fail.
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.bytes)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        mac.update(&(domain.len() as u64).to_be_bytes());
        mac.update(domain);
        mac
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domains_separate_macs() {
        let s = Secret::from_bytes(b"0123456789abcdef".to_vec());
        assert_ne!(s.mac(b"a", b"m"), s.mac(b"b", b"m"));
        let tag = s.mac(DOMAIN_SESSION_ID, b"m");
        assert!(s.verify(DOMAIN_SESSION_ID, b"m", &tag[..16]));
        assert!(!s.verify(DOMAIN_LOG_DIGEST, b"m", &tag[..16]));
        assert!(
            !s.verify(DOMAIN_SESSION_ID, b"m", &tag[..8]),
            "short tags are refused"
        );
        let other = Secret::from_bytes(b"fedcba9876543210".to_vec());
        assert!(!other.verify(DOMAIN_SESSION_ID, b"m", &tag[..16]));
    }

    #[test]
    fn short_secret_files_are_refused() {
        let dir = std::env::temp_dir().join(format!("tether-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("short");
        std::fs::write(&path, "tooshort\n").unwrap();
        let err = Secret::from_file(&path).unwrap_err().to_string();
        assert!(err.contains("at least 16"), "{err}");
        std::fs::write(&path, "0123456789abcdef0123\n").unwrap();
        assert!(Secret::from_file(&path).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
