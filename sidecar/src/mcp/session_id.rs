//! Client session ids minted by the sidecar (`docs/design/architecture.md#sessions`).
//!
//! Wire format: `base64url(version ‖ 128 random bits ‖ home token ‖ MAC)` without padding, 55
//! characters of `[A-Za-z0-9_-]` (visible ASCII, spec S-02).
//!
//! | bytes | field |
//! |---|---|
//! | 1 | format version, [`ID_VERSION`] |
//! | 16 | random (CSPRNG), makes the id unguessable (spec S-08) |
//! | 8 | home token: first 8 bytes of SHA-256(`tether/home/v1` ‖ pod UID) |
//! | 16 | HMAC-SHA256 over the first 25 bytes, keyed by the endpoint secret, truncated |
//!
//! A forged or foreign id fails the MAC and is answered 404 at once (spec S-05), with no hop.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};

use crate::secret::{DOMAIN_SESSION_ID, Secret};

/// Format version carried in the first byte.
pub(crate) const ID_VERSION: u8 = 1;
const RANDOM_LEN: usize = 16;
const HOME_LEN: usize = 8;
const MAC_LEN: usize = 16;
const SIGNED_LEN: usize = 1 + RANDOM_LEN + HOME_LEN;
const RAW_LEN: usize = SIGNED_LEN + MAC_LEN;
/// Length of an encoded id in characters.
pub(crate) const ENCODED_LEN: usize = 55;

/// The pod a session was created on, as carried inside its id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct HomeToken(pub [u8; HOME_LEN]);

impl HomeToken {
    /// The home token of the pod with this UID.
    pub(crate) fn for_pod(pod_uid: &str) -> Self {
        let mut h = Sha256::new();
        h.update(b"tether/home/v1");
        h.update(pod_uid.as_bytes());
        let digest = h.finalize();
        let mut token = [0; HOME_LEN];
        token.copy_from_slice(&digest[..HOME_LEN]);
        Self(token)
    }
}

/// Why a presented id is not one of ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum IdError {
    /// Wrong length or not base64url.
    #[error("not a tether session id")]
    Malformed,
    /// A format version this sidecar does not know.
    #[error("unknown session id version")]
    UnknownVersion,
    /// The MAC does not match: forged, or minted for another endpoint.
    #[error("session id MAC mismatch")]
    BadMac,
}

/// Mints and verifies session ids for one pod.
#[derive(Clone, Debug)]
pub(crate) struct IdMinter {
    secret: Secret,
    home: HomeToken,
}

impl IdMinter {
    /// A minter for the pod whose home token is `home`.
    pub(crate) fn new(secret: Secret, home: HomeToken) -> Self {
        Self { secret, home }
    }

    /// A fresh session id homed on this pod.
    pub(crate) fn mint(&self) -> String {
        let mut raw = [0u8; RAW_LEN];
        raw[0] = ID_VERSION;
        rand::fill(&mut raw[1..1 + RANDOM_LEN]);
        raw[1 + RANDOM_LEN..SIGNED_LEN].copy_from_slice(&self.home.0);
        let mac = self.secret.mac(DOMAIN_SESSION_ID, &raw[..SIGNED_LEN]);
        raw[SIGNED_LEN..].copy_from_slice(&mac[..MAC_LEN]);
        URL_SAFE_NO_PAD.encode(raw)
    }

    /// Checks that `id` was minted by a sidecar of this endpoint; returns its home token.
    ///
    /// # Errors
    /// [`IdError`] for anything that is not a genuine id of this endpoint.
    pub(crate) fn verify(&self, id: &str) -> Result<HomeToken, IdError> {
        if id.len() != ENCODED_LEN {
            return Err(IdError::Malformed);
        }
        let raw = URL_SAFE_NO_PAD.decode(id).map_err(|_| IdError::Malformed)?;
        if raw.len() != RAW_LEN {
            return Err(IdError::Malformed);
        }
        if raw[0] != ID_VERSION {
            return Err(IdError::UnknownVersion);
        }
        if !self
            .secret
            .verify(DOMAIN_SESSION_ID, &raw[..SIGNED_LEN], &raw[SIGNED_LEN..])
        {
            return Err(IdError::BadMac);
        }
        let mut home = [0; HOME_LEN];
        home.copy_from_slice(&raw[1 + RANDOM_LEN..SIGNED_LEN]);
        Ok(HomeToken(home))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn minter(secret: &[u8], pod: &str) -> IdMinter {
        IdMinter::new(Secret::from_bytes(secret.to_vec()), HomeToken::for_pod(pod))
    }

    #[test]
    fn s02_minted_ids_are_visible_ascii_and_verify() {
        let m = minter(b"0123456789abcdef", "pod-a");
        let id = m.mint();
        assert_eq!(id.len(), ENCODED_LEN);
        assert!(id.bytes().all(|b| (0x21..=0x7e).contains(&b)));
        assert_eq!(m.verify(&id), Ok(HomeToken::for_pod("pod-a")));
        assert_ne!(m.mint(), id, "ids are random");
    }

    #[test]
    fn s05_forged_and_foreign_ids_fail_the_mac() {
        let a = minter(b"0123456789abcdef", "pod-a");
        let other_endpoint = minter(b"fedcba9876543210", "pod-a");
        let id = other_endpoint.mint();
        assert_eq!(a.verify(&id), Err(IdError::BadMac));
        assert_eq!(a.verify("not-an-id"), Err(IdError::Malformed));
        assert_eq!(
            a.verify(&"A".repeat(ENCODED_LEN)),
            Err(IdError::UnknownVersion)
        );
        // A peer of the same endpoint mints ids this pod accepts, with the peer as home.
        let peer = minter(b"0123456789abcdef", "pod-b");
        assert_eq!(a.verify(&peer.mint()), Ok(HomeToken::for_pod("pod-b")));
    }

    proptest! {
        #[test]
        fn any_single_character_change_is_rejected(pos in 0..ENCODED_LEN, c in "[A-Za-z0-9_-]") {
            let m = minter(b"0123456789abcdef", "pod-a");
            let id = m.mint();
            let mut bytes = id.clone().into_bytes();
            let c = c.as_bytes()[0];
            prop_assume!(bytes[pos] != c);
            bytes[pos] = c;
            let tampered = String::from_utf8(bytes).unwrap();
            prop_assert!(m.verify(&tampered).is_err());
        }
    }
}
