//! Authentication of the first peer protocol's messages, spoken to and accepted from sidecars of
//! that version while `--peer-min-protocol` is 1 (a rollout of tether itself,
//! `docs/design/peer-trust.md#protocol-versions`).
//!
//! Every request carries `Tether-Peer` (the sender's pod UID), `Tether-Peer-Time` (Unix time in
//! milliseconds) and `Tether-Peer-Mac`: base64url (no padding) of HMAC-SHA256, domain
//! `tether/peer/v1`, over `"{path}\n{uid}\n{time}\n"` followed by the SHA-256 of the body. The
//! receiver refuses a MAC that does not verify and a time more than [`MAX_SKEW`] away from its
//! own clock, which bounds how long a captured message could be replayed (a replayed push or
//! tail is idempotent anyway: known sessions and events are ignored).

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::{HeaderMap, HeaderName, HeaderValue};
use sha2::{Digest, Sha256};

use super::{TETHER_PEER, TETHER_PEER_MAC, TETHER_PEER_TIME, now_ms};
use crate::keys::{DOMAIN_PEER, KeyRing};

/// Largest accepted distance between the message time and the receiver's clock.
pub(crate) const MAX_SKEW: Duration = Duration::from_secs(60);

/// Why a message was refused (answered 401).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AuthError {
    /// A header is missing or malformed.
    #[error("missing or malformed {0} header")]
    Header(&'static str),
    /// The time is too far from the receiver's clock.
    #[error("message time is {0} ms away from this pod's clock")]
    Skew(u64),
    /// The MAC does not verify.
    #[error("the message MAC does not verify")]
    Mac,
}

fn message(path: &str, uid: &str, time: u64, body: &[u8]) -> Vec<u8> {
    let mut m = format!("{path}\n{uid}\n{time}\n").into_bytes();
    m.extend_from_slice(&Sha256::digest(body));
    m
}

/// The three authentication headers of a message from pod `uid` to `path` with `body`.
pub(crate) fn sign(
    secret: &KeyRing,
    path: &str,
    uid: &str,
    body: &[u8],
) -> [(HeaderName, HeaderValue); 3] {
    let time = now_ms();
    let mac = URL_SAFE_NO_PAD.encode(secret.mac(DOMAIN_PEER, &message(path, uid, time, body)));
    let value =
        |s: String| HeaderValue::from_str(&s).unwrap_or_else(|_| HeaderValue::from_static(""));
    [
        (TETHER_PEER, value(uid.to_owned())),
        (TETHER_PEER_TIME, value(time.to_string())),
        (TETHER_PEER_MAC, value(mac)),
    ]
}

/// Checks the authentication headers of a message to `path` with `body`; returns the sender's
/// UID.
///
/// # Errors
/// [`AuthError`] when a header is missing, the time is off by more than [`MAX_SKEW`], or the
/// MAC does not verify.
pub(crate) fn verify(
    secret: &KeyRing,
    path: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<String, AuthError> {
    let text = |name: &HeaderName, label| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .ok_or(AuthError::Header(label))
    };
    let uid = text(&TETHER_PEER, "Tether-Peer")?;
    let time: u64 = text(&TETHER_PEER_TIME, "Tether-Peer-Time")?
        .parse()
        .map_err(|_| AuthError::Header("Tether-Peer-Time"))?;
    let mac = URL_SAFE_NO_PAD
        .decode(text(&TETHER_PEER_MAC, "Tether-Peer-Mac")?)
        .map_err(|_| AuthError::Header("Tether-Peer-Mac"))?;
    let skew = now_ms().abs_diff(time);
    if skew > u64::try_from(MAX_SKEW.as_millis()).unwrap_or(u64::MAX) {
        return Err(AuthError::Skew(skew));
    }
    if mac.len() != 32
        || secret
            .verifying(DOMAIN_PEER, &message(path, uid, time, body), &mac)
            .is_none()
    {
        return Err(AuthError::Mac);
    }
    Ok(uid.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: [(HeaderName, HeaderValue); 3]) -> HeaderMap {
        pairs.into_iter().collect()
    }

    #[test]
    fn signed_messages_verify_and_tampering_is_refused() {
        let secret = KeyRing::from_bytes(*b"0123456789abcdef0123");
        let h = headers(sign(&secret, "/v1/sessions", "pod-a", b"{}"));
        assert_eq!(
            verify(&secret, "/v1/sessions", &h, b"{}"),
            Ok("pod-a".to_owned())
        );
        assert_eq!(verify(&secret, "/v1/tail", &h, b"{}"), Err(AuthError::Mac));
        assert_eq!(
            verify(&secret, "/v1/sessions", &h, b"{ }"),
            Err(AuthError::Mac)
        );
        let other = KeyRing::from_bytes(*b"another secret, 20by");
        assert_eq!(
            verify(&other, "/v1/sessions", &h, b"{}"),
            Err(AuthError::Mac)
        );
        let mut spoofed = h.clone();
        spoofed.insert(TETHER_PEER, HeaderValue::from_static("pod-b"));
        assert_eq!(
            verify(&secret, "/v1/sessions", &spoofed, b"{}"),
            Err(AuthError::Mac)
        );
        let mut old = h.clone();
        old.insert(TETHER_PEER_TIME, HeaderValue::from_static("1000"));
        assert!(matches!(
            verify(&secret, "/v1/sessions", &old, b"{}"),
            Err(AuthError::Skew(_))
        ));
        assert_eq!(
            verify(&secret, "/v1/sessions", &HeaderMap::new(), b"{}"),
            Err(AuthError::Header("Tether-Peer"))
        );
    }
}
