//! Bearer tokens for an upstream that requires them (`tether-example-server --auth-key FILE`):
//! HS256 JWTs with `iss`, `sub` and `exp`, as an OAuth authorization server would issue them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{EncodingKey, Header};
use serde::Serialize;

use crate::{HarnessError, Result};

/// The issuer of tokens the example server accepts: its key, and the file that holds it.
pub struct Issuer {
    key: EncodingKey,
    file: tempfile::NamedTempFile,
}

#[derive(Serialize)]
struct Claims<'a> {
    iss: &'a str,
    sub: &'a str,
    /// Seconds since the Unix epoch.
    exp: u64,
}

impl Issuer {
    /// An issuer with a fresh random key, written to a temporary file for `--auth-key`.
    ///
    /// # Errors
    /// [`HarnessError::Io`] when the file cannot be written.
    pub fn new() -> Result<Self> {
        let key: Vec<u8> = (0..32).map(|_| rand::random_range(b'a'..=b'z')).collect();
        let file = tempfile::NamedTempFile::new().map_err(HarnessError::Io)?;
        std::fs::write(file.path(), &key).map_err(HarnessError::Io)?;
        let key = EncodingKey::from_secret(&key)
            .map_err(|e| HarnessError::Protocol(format!("HS256 key: {e}")))?;
        Ok(Self { key, file })
    }

    /// `--auth-key <file>`, as example-server arguments.
    pub fn server_args(&self) -> Vec<String> {
        vec!["--auth-key".into(), self.file.path().display().to_string()]
    }

    /// A token of `sub` from issuer `iss`, valid for `ttl` (expired already for a zero `ttl`).
    pub fn token(&self, iss: &str, sub: &str, ttl: Duration) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let exp = if ttl.is_zero() {
            now.as_secs().saturating_sub(60)
        } else {
            (now + ttl).as_secs()
        };
        let claims = Claims { iss, sub, exp };
        // HS256 over serialisable claims does not fail; an empty token would get a 401.
        jsonwebtoken::encode(&Header::default(), &claims, &self.key).unwrap_or_default()
    }

    /// `Bearer <token>` of `sub` from `iss`, valid for `ttl`.
    pub fn bearer(&self, iss: &str, sub: &str, ttl: Duration) -> String {
        format!("Bearer {}", self.token(iss, sub, ttl))
    }
}
