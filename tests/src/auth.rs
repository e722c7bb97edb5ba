//! Bearer tokens for an upstream that requires them (`tether-example-server --auth-key FILE`):
//! HS256 JWTs with `iss`, `sub` and `exp`, as an OAuth authorization server would issue them
//! ([`Issuer`]), and one user's short-lived tokens refreshed the way OAuth clients refresh them
//! ([`Tokens`]: before expiry, or after a 401).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
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
    /// The client the token was issued to (OpenID Connect's authorized party), if named.
    #[serde(skip_serializing_if = "Option::is_none")]
    azp: Option<&'a str>,
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
        self.token_of_client(iss, sub, None, ttl)
    }

    /// [`Issuer::token`] issued to client application `azp`, when one is named.
    pub fn token_of_client(
        &self,
        iss: &str,
        sub: &str,
        azp: Option<&str>,
        ttl: Duration,
    ) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let exp = if ttl.is_zero() {
            now.as_secs().saturating_sub(60)
        } else {
            (now + ttl).as_secs()
        };
        let claims = Claims { iss, sub, azp, exp };
        // HS256 over serialisable claims does not fail; an empty token would get a 401.
        jsonwebtoken::encode(&Header::default(), &claims, &self.key).unwrap_or_default()
    }

    /// `Bearer <token>` of `sub` from `iss`, valid for `ttl`.
    pub fn bearer(&self, iss: &str, sub: &str, ttl: Duration) -> String {
        format!("Bearer {}", self.token(iss, sub, ttl))
    }

    /// [`Issuer::bearer`] issued to client application `azp`.
    pub fn bearer_of_client(&self, iss: &str, sub: &str, azp: &str, ttl: Duration) -> String {
        format!("Bearer {}", self.token_of_client(iss, sub, Some(azp), ttl))
    }
}

/// When a client gets a new token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refresh {
    /// Once less than a quarter of the token's lifetime is left (and after a 401).
    BeforeExpiry,
    /// Only after a request was answered 401 (a client that does not track expiry).
    AfterRefusal,
}

/// One user's current bearer token, refreshed from its [`Issuer`] as [`Refresh`] says, with
/// counts of the refreshes. Shared by the requests of one client ([`crate::client::McpClient::with_tokens`]).
pub struct Tokens {
    issuer: Arc<Issuer>,
    iss: String,
    sub: String,
    ttl: Duration,
    refresh: Refresh,
    current: Mutex<Token>,
    before_expiry: AtomicU64,
    after_refusal: AtomicU64,
}

impl std::fmt::Debug for Tokens {
    /// The user and the policy, never a token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("iss", &self.iss)
            .field("sub", &self.sub)
            .field("ttl", &self.ttl)
            .field("refresh", &self.refresh)
            .finish_non_exhaustive()
    }
}

/// A token and when it expires.
struct Token {
    authorization: String,
    expires: SystemTime,
}

impl Tokens {
    /// Tokens of `sub` from `iss`, each valid for `ttl` (at least 1 s: a JWT's `exp` is in whole
    /// seconds), the first issued now.
    pub fn new(
        issuer: Arc<Issuer>,
        iss: &str,
        sub: &str,
        ttl: Duration,
        refresh: Refresh,
    ) -> Arc<Self> {
        let ttl = ttl.max(Duration::from_secs(1));
        let current = Mutex::new(Self::issue(&issuer, iss, sub, ttl));
        Arc::new(Self {
            issuer,
            iss: iss.to_owned(),
            sub: sub.to_owned(),
            ttl,
            refresh,
            current,
            before_expiry: AtomicU64::new(0),
            after_refusal: AtomicU64::new(0),
        })
    }

    fn issue(issuer: &Issuer, iss: &str, sub: &str, ttl: Duration) -> Token {
        Token {
            authorization: issuer.bearer(iss, sub, ttl),
            // `exp` is rounded down to a whole second.
            expires: SystemTime::now() + ttl - Duration::from_secs(1),
        }
    }

    /// The `Authorization` value to send now (a fresh token first, with
    /// [`Refresh::BeforeExpiry`], when the current one is in its last quarter).
    pub fn authorization(&self) -> String {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if self.refresh == Refresh::BeforeExpiry {
            let left = current
                .expires
                .duration_since(SystemTime::now())
                .unwrap_or_default();
            if left < self.ttl / 4 {
                *current = Self::issue(&self.issuer, &self.iss, &self.sub, self.ttl);
                self.before_expiry.fetch_add(1, Ordering::Relaxed);
            }
        }
        current.authorization.clone()
    }

    /// Notes that a request sent with `sent` was answered 401: a fresh token replaces it,
    /// unless another request refreshed it already. Returns the value to send the request with
    /// again.
    pub fn refused(&self, sent: &str) -> String {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if current.authorization == sent {
            *current = Self::issue(&self.issuer, &self.iss, &self.sub, self.ttl);
            self.after_refusal.fetch_add(1, Ordering::Relaxed);
        }
        current.authorization.clone()
    }

    /// Refreshes so far: (before expiry, after a 401).
    pub fn refreshes(&self) -> (u64, u64) {
        (
            self.before_expiry.load(Ordering::Relaxed),
            self.after_refusal.load(Ordering::Relaxed),
        )
    }
}
