//! Client session ids minted by the sidecar (`docs/design/architecture.md#sessions`).
//!
//! 60 characters of `base64url` without padding (visible ASCII, spec S-02), over:
//!
//! | bytes | field |
//! |---|---|
//! | 1 | format version, `2` |
//! | 4 | id of the key that signed it ([`KeyId`]) |
//! | 16 | random (CSPRNG), makes the id unguessable (spec S-08) |
//! | 8 | home token: first 8 bytes of SHA-256(`tether/home/v1` ‖ pod UID) |
//! | 16 | HMAC-SHA256 over the bytes before it, truncated |
//!
//! An id names its key, so a verifier picks it from the ring
//! (`docs/design/peer-trust.md#the-key-ring`). A forged or foreign id fails the MAC and is
//! answered 404 at once (spec S-05), with no hop. (Version 1 was a format without the key id
//! that no released sidecar ever minted; it is refused like any unknown version.)

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::home::{HOME_LEN, HomeToken};
use super::sealed::{Purpose, Sealer};
use crate::keys::{DOMAIN_SESSION_ID, Key, KeyId, KeyRing};

/// Format version of the ids.
pub(crate) const ID_VERSION: u8 = 2;
const KEY_ID_LEN: usize = 4;
const RANDOM_LEN: usize = 16;
const MAC_LEN: usize = 16;
/// Bytes after the version and key id: random, home, MAC.
const BODY_LEN: usize = RANDOM_LEN + HOME_LEN + MAC_LEN;
/// Length of an encoded id, in characters.
pub(crate) const ENCODED_LEN: usize = 60;

/// Why a presented id is not one of ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum IdError {
    /// Wrong length or not base64url.
    #[error("not a tether session id")]
    Malformed,
    /// A format version this sidecar does not know.
    #[error("unknown session id version")]
    UnknownVersion,
    /// The MAC does not match: forged, minted for another endpoint, or with a key the ring no
    /// longer holds.
    #[error("session id MAC mismatch")]
    BadMac,
}

/// A genuine id: its home, and the key that minted it (which keys the session's digests).
#[derive(Clone, Debug)]
pub(crate) struct Verified {
    /// The pod that created the session.
    pub(crate) home: HomeToken,
    /// The key that signed the id.
    pub(crate) key: Arc<Key>,
}

/// Mints and verifies session ids for one pod.
#[derive(Clone, Debug)]
pub(crate) struct IdMinter {
    keys: KeyRing,
    home: HomeToken,
}

impl IdMinter {
    /// A minter for the pod whose home token is `home`, signing with `keys`' current key.
    pub(crate) fn new(keys: KeyRing, home: HomeToken) -> Self {
        Self { keys, home }
    }

    /// The sealer of this pod's values of `purpose`, with the same ring ([`Sealer`]).
    pub(crate) fn sealer(&self, purpose: &'static Purpose) -> Sealer {
        Sealer::new(self.keys.clone(), self.home, purpose)
    }

    /// A fresh session id homed on this pod, and the key that signed it.
    pub(crate) fn mint(&self) -> (String, Arc<Key>) {
        let key = self.keys.current();
        let mut raw = Vec::with_capacity(1 + KEY_ID_LEN + BODY_LEN);
        raw.push(ID_VERSION);
        raw.extend_from_slice(&key.id().0);
        let mut random = [0u8; RANDOM_LEN];
        rand::fill(&mut random);
        raw.extend_from_slice(&random);
        raw.extend_from_slice(&self.home.0);
        let mac = key.mac(DOMAIN_SESSION_ID, &raw);
        raw.extend_from_slice(&mac[..MAC_LEN]);
        (URL_SAFE_NO_PAD.encode(raw), key)
    }

    /// The keyed digest that stands for `id` in logs: with the key that minted it, else (an id
    /// that is not genuine) with the current key.
    pub(crate) fn log_digest(&self, id: &str) -> String {
        match self.verify(id) {
            Ok(v) => v.key.log_digest(id),
            Err(_) => self.keys.current().log_digest(id),
        }
    }

    /// Checks that `id` was minted by a sidecar of this endpoint with a key of the ring; returns
    /// its home token and that key.
    ///
    /// # Errors
    /// [`IdError`] for anything that is not a genuine id of this endpoint.
    pub(crate) fn verify(&self, id: &str) -> Result<Verified, IdError> {
        if id.len() != ENCODED_LEN {
            return Err(IdError::Malformed);
        }
        let raw = URL_SAFE_NO_PAD.decode(id).map_err(|_| IdError::Malformed)?;
        if raw.len() != 1 + KEY_ID_LEN + BODY_LEN {
            return Err(IdError::Malformed);
        }
        if raw[0] != ID_VERSION {
            return Err(IdError::UnknownVersion);
        }
        let (signed, mac) = raw.split_at(raw.len() - MAC_LEN);
        let named = KeyId(
            raw[1..=KEY_ID_LEN]
                .try_into()
                .map_err(|_| IdError::Malformed)?,
        );
        let key = self
            .keys
            .get(named)
            .filter(|k| k.verify(DOMAIN_SESSION_ID, signed, mac));
        let key = key.ok_or(IdError::BadMac)?;
        let home_at = 1 + KEY_ID_LEN + RANDOM_LEN;
        let mut home = [0; HOME_LEN];
        home.copy_from_slice(&raw[home_at..home_at + HOME_LEN]);
        Ok(Verified {
            home: HomeToken(home),
            key,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::Ring;
    use proptest::prelude::*;

    fn minter(secret: &[u8], pod: &str) -> IdMinter {
        IdMinter::new(
            KeyRing::from_bytes(secret.to_vec()),
            HomeToken::for_pod(pod),
        )
    }

    fn home(m: &IdMinter, id: &str) -> Result<HomeToken, IdError> {
        m.verify(id).map(|v| v.home)
    }

    #[test]
    fn s02_minted_ids_are_visible_ascii_and_verify() {
        let m = minter(b"0123456789abcdef", "pod-a");
        let (id, key) = m.mint();
        assert_eq!(id.len(), ENCODED_LEN);
        assert!(id.bytes().all(|b| (0x21..=0x7e).contains(&b)));
        assert_eq!(home(&m, &id), Ok(HomeToken::for_pod("pod-a")));
        assert_eq!(m.verify(&id).unwrap().key.id(), key.id());
        assert_ne!(m.mint().0, id, "ids are random");
    }

    #[test]
    fn s05_forged_and_foreign_ids_fail_the_mac() {
        let a = minter(b"0123456789abcdef", "pod-a");
        let other_endpoint = minter(b"fedcba9876543210", "pod-a");
        let (id, _) = other_endpoint.mint();
        assert_eq!(home(&a, &id), Err(IdError::BadMac));
        assert_eq!(home(&a, "not-an-id"), Err(IdError::Malformed));
        assert_eq!(
            home(&a, &"A".repeat(ENCODED_LEN)),
            Err(IdError::UnknownVersion)
        );
        // The 55-character format without a key id, which no released sidecar minted: 1, 16
        // random bytes, the home token, the MAC. It is refused even with a valid MAC.
        let mut unnamed = vec![1u8];
        unnamed.extend_from_slice(&[7; RANDOM_LEN]);
        unnamed.extend_from_slice(&HomeToken::for_pod("pod-a").0);
        let key = KeyRing::from_bytes(b"0123456789abcdef".to_vec()).current();
        let mac = key.mac(DOMAIN_SESSION_ID, &unnamed);
        unnamed.extend_from_slice(&mac[..MAC_LEN]);
        assert_eq!(
            home(&a, &URL_SAFE_NO_PAD.encode(unnamed)),
            Err(IdError::Malformed)
        );
        // A peer of the same endpoint mints ids this pod accepts, with the peer as home.
        let peer = minter(b"0123456789abcdef", "pod-b");
        assert_eq!(home(&a, &peer.mint().0), Ok(HomeToken::for_pod("pod-b")));
    }

    #[test]
    fn ids_of_the_previous_key_verify_until_it_leaves_the_ring() {
        let old = Key::new(b"old key 0123456789".to_vec());
        let new = Key::new(b"new key 0123456789".to_vec());
        let before = IdMinter::new(
            KeyRing::fixed(Ring::single(Key::new(b"old key 0123456789".to_vec()))),
            HomeToken::for_pod("pod-a"),
        );
        let (named, _) = before.mint();
        let rotated = IdMinter::new(
            KeyRing::fixed(Ring::rotated(new, Some(old))),
            HomeToken::for_pod("pod-b"),
        );
        let v = rotated.verify(&named).unwrap();
        assert_eq!(v.home, HomeToken::for_pod("pod-a"));
        assert_eq!(v.key.id(), KeyId::of(b"old key 0123456789"));
        assert_eq!(
            rotated.mint().1.id(),
            KeyId::of(b"new key 0123456789"),
            "new ids are signed with the current key"
        );
        let retired = minter(b"new key 0123456789", "pod-b");
        assert_eq!(home(&retired, &named), Err(IdError::BadMac));
    }

    proptest! {
        #[test]
        fn any_single_character_change_is_rejected(pos in 0..ENCODED_LEN, c in "[A-Za-z0-9_-]") {
            let m = minter(b"0123456789abcdef", "pod-a");
            let (id, _) = m.mint();
            let mut bytes = id.clone().into_bytes();
            let c = c.as_bytes()[0];
            prop_assume!(bytes[pos] != c);
            bytes[pos] = c;
            let tampered = String::from_utf8(bytes).unwrap();
            prop_assert!(m.verify(&tampered).is_err());
        }
    }
}
