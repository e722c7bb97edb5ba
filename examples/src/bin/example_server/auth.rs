//! `--auth-key FILE`: the example server as an authenticated MCP server, an OAuth 2.1 resource
//! server in small. Every MCP request needs `Authorization: Bearer <JWT>` signed with HS256 and
//! the key file's bytes (surrounding whitespace trimmed), with `sub` and `exp` claims; a missing,
//! malformed, wrongly signed or expired token gets 401 with `WWW-Authenticate: Bearer`. Sessions
//! are bound to the `sub` that initialized them, as SDK servers bind sessions to their user: a
//! request of another `sub` is answered like an unknown session (404).

use std::collections::HashMap;
use std::path::Path;

use http::HeaderMap;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use parking_lot::Mutex;
use serde::Deserialize;

/// The claims the server reads.
#[derive(Debug, Deserialize)]
struct Claims {
    sub: String,
}

/// Why a request is not authenticated (the `error_description` of the 401).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unauthenticated {
    /// No `Authorization: Bearer` header.
    Missing,
    /// Not a JWT signed with the key, expired, or without `sub` / `exp`.
    Invalid,
}

impl Unauthenticated {
    /// The `WWW-Authenticate` value (RFC 6750 §3).
    pub(crate) fn challenge(self) -> &'static str {
        match self {
            Unauthenticated::Missing => "Bearer realm=\"tether-example\"",
            Unauthenticated::Invalid => {
                "Bearer realm=\"tether-example\", error=\"invalid_token\", \
                 error_description=\"the token is invalid or expired\""
            }
        }
    }
}

/// The server's key and the `sub` each of its sessions belongs to.
pub(crate) struct Auth {
    key: DecodingKey,
    validation: Validation,
    /// Session id → the `sub` that initialized it.
    owners: Mutex<HashMap<String, String>>,
}

impl Auth {
    /// Reads the HS256 key from `path`.
    ///
    /// # Errors
    /// The file cannot be read, or holds only whitespace.
    pub(crate) fn load(path: &Path) -> std::io::Result<Self> {
        let bytes = std::fs::read(path)?;
        let key = bytes.trim_ascii();
        if key.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: the auth key is empty", path.display()),
            ));
        }
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_required_spec_claims(&["exp", "sub"]);
        validation.leeway = 0;
        let key = DecodingKey::from_secret(key)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
        Ok(Self {
            key,
            validation,
            owners: Mutex::default(),
        })
    }

    /// The `sub` of the request's bearer token.
    ///
    /// # Errors
    /// Why the request is not authenticated.
    pub(crate) fn caller(&self, headers: &HeaderMap) -> Result<String, Unauthenticated> {
        let token = headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or(Unauthenticated::Missing)?;
        jsonwebtoken::decode::<Claims>(token.trim(), &self.key, &self.validation)
            .map(|data| data.claims.sub)
            .map_err(|_| Unauthenticated::Invalid)
    }

    /// Binds session `id` to `sub` (the caller of its `initialize`).
    pub(crate) fn bind(&self, id: &str, sub: &str) {
        self.owners.lock().insert(id.to_owned(), sub.to_owned());
    }

    /// Whether `sub` may use session `id`: it initialized it, or the session is not known here.
    pub(crate) fn may_use(&self, id: &str, sub: &str) -> bool {
        self.owners.lock().get(id).is_none_or(|owner| owner == sub)
    }

    /// Forgets session `id` (deleted).
    pub(crate) fn forget(&self, id: &str) {
        self.owners.lock().remove(id);
    }
}
