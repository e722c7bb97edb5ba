//! Values of the MCP server that tether hands to clients sealed (`docs/design/tasks.md`,
//! `docs/design/routing.md#multi-round-trip-requests`): the server's value is encrypted and the
//! pod whose server issued it named, so that any pod routes a request carrying it to that pod
//! and the issuer alone learns the server's value back. No table: the sealed value is the
//! mapping. Two [`Purpose`]s use it: task ids of the tasks extension ([`TASK_ID`]) and the
//! `requestState` of multi round-trip requests ([`REQUEST_STATE`]).
//!
//! `base64url` without padding (visible ASCII) of:
//!
//! | bytes | field |
//! |---|---|
//! | 1 | format version of the purpose (task ids `1`, request states `2`) |
//! | 4 | id of the key that sealed it ([`KeyId`]) |
//! | 8 | home token of the issuing pod ([`HomeToken`]) |
//! | 12 | nonce: HMAC-SHA256(key, home ‖ owner length ‖ owner ‖ server value), truncated (a synthetic nonce) |
//! | n | the MCP server's value, ChaCha20-Poly1305-encrypted (n ≤ the purpose's `max_plain`) |
//! | 16 | the AEAD tag over the ciphertext, the 13 bytes before the nonce and the owner |
//!
//! The owner ([`Owner`]: who the value was sealed for) is in no byte of it: it is
//! authenticated, so a sealed value opens only for a request presenting the same owner, and any
//! other caller gets what a forged value gets.
//!
//! The nonce derives from what is sealed, so one server value on one pod always gives the same
//! client value (`tasks/get` answers and status notifications name the task the client holds),
//! and two different values never share a nonce. The keys come from the endpoint's key ring
//! (each purpose has its own domains, [`crate::keys`]); a value sealed with a key the ring no
//! longer holds, forged, altered or of another purpose does not open ([`SealError`]).

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};

use super::home::HomeToken;
use super::principal::Owner;
use crate::keys::{
    DOMAIN_REQUEST_STATE_NONCE, DOMAIN_REQUEST_STATE_SEAL, DOMAIN_TASK_ID_NONCE,
    DOMAIN_TASK_ID_SEAL, Key, KeyId, KeyRing,
};

const KEY_ID_LEN: usize = 4;
const HOME_LEN: usize = 8;
const TAG_LEN: usize = 16;
/// Bytes before the nonce: version, key id, home (the AEAD's associated data).
const HEADER_LEN: usize = 1 + KEY_ID_LEN + HOME_LEN;
/// Longest MCP server task id tether seals, in bytes (SDKs use UUIDs: 36). A longer one is
/// answered as an upstream error ([`SealError::TooLong`]).
pub(crate) const MAX_UPSTREAM_TASK_ID: usize = 256;
/// Longest `requestState` tether seals, in bytes: servers encode what they need to go on
/// (SDK codecs: a few hundred bytes); a longer one is answered as an upstream error.
pub(crate) const MAX_UPSTREAM_REQUEST_STATE: usize = 64 * 1024;

/// What a sealed value is: its format version, its key domains and its longest server value.
#[derive(Debug)]
pub(crate) struct Purpose {
    version: u8,
    seal: &'static [u8],
    nonce: &'static [u8],
    max_plain: usize,
}

/// Task ids of the tasks extension (`docs/design/tasks.md`).
pub(crate) const TASK_ID: Purpose = Purpose {
    version: 1,
    seal: DOMAIN_TASK_ID_SEAL,
    nonce: DOMAIN_TASK_ID_NONCE,
    max_plain: MAX_UPSTREAM_TASK_ID,
};

/// The `requestState` of a multi round-trip request's `InputRequiredResult`.
pub(crate) const REQUEST_STATE: Purpose = Purpose {
    version: 2,
    seal: DOMAIN_REQUEST_STATE_SEAL,
    nonce: DOMAIN_REQUEST_STATE_NONCE,
    max_plain: MAX_UPSTREAM_REQUEST_STATE,
};

/// Why a value cannot be sealed or opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SealError {
    /// Not base64url, too short or too long, or another purpose's format version.
    #[error("not a value tether sealed")]
    Malformed,
    /// The seal does not open: forged, altered, of another endpoint, or sealed with a key the
    /// ring no longer holds.
    #[error("seal mismatch")]
    BadSeal,
    /// The MCP server's value is longer than its purpose allows.
    #[error("the MCP server's value is too long to seal")]
    TooLong,
}

/// An opened value: the pod whose MCP server issued it and the server's value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Opened {
    /// The pod whose MCP server issued the value (holds the task).
    pub(crate) home: HomeToken,
    /// The MCP server's value.
    pub(crate) upstream: String,
}

/// Seals and opens the values of one purpose for one pod.
#[derive(Clone, Debug)]
pub(crate) struct Sealer {
    keys: KeyRing,
    home: HomeToken,
    purpose: &'static Purpose,
}

impl Sealer {
    /// Values of `purpose` issued by the pod whose home token is `home`, sealed with `keys`'
    /// current key.
    pub(crate) fn new(keys: KeyRing, home: HomeToken, purpose: &'static Purpose) -> Self {
        Self {
            keys,
            home,
            purpose,
        }
    }

    /// This pod's home token.
    pub(crate) fn home(&self) -> HomeToken {
        self.home
    }

    /// The client's value for the MCP server's `upstream`, issued on this pod, for `owner`.
    ///
    /// # Errors
    /// [`SealError::TooLong`].
    pub(crate) fn mint(&self, upstream: &str, owner: &Owner) -> Result<String, SealError> {
        if upstream.len() > self.purpose.max_plain {
            return Err(SealError::TooLong);
        }
        let key = self.keys.current();
        let mut raw = Vec::with_capacity(HEADER_LEN + NONCE_LEN + upstream.len() + TAG_LEN);
        raw.push(self.purpose.version);
        raw.extend_from_slice(&key.id().0);
        raw.extend_from_slice(&self.home.0);
        let owner = owner.as_bytes();
        let mut named = Vec::with_capacity(HOME_LEN + 4 + owner.len() + upstream.len());
        named.extend_from_slice(&self.home.0);
        named.extend_from_slice(&(owner.len() as u32).to_be_bytes());
        named.extend_from_slice(owner);
        named.extend_from_slice(upstream.as_bytes());
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&key.mac(self.purpose.nonce, &named)[..NONCE_LEN]);
        let mut sealed = upstream.as_bytes().to_vec();
        let tag = sealing_key(&key, self.purpose)
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(associated(&raw[..HEADER_LEN], owner)),
                &mut sealed,
            )
            .map_err(|_| SealError::TooLong)?;
        raw.extend_from_slice(&nonce);
        raw.extend_from_slice(&sealed);
        raw.extend_from_slice(tag.as_ref());
        Ok(URL_SAFE_NO_PAD.encode(raw))
    }

    /// Opens a client's value, for a request presenting `owner`.
    ///
    /// # Errors
    /// [`SealError::Malformed`], or [`SealError::BadSeal`] (another owner's value too).
    pub(crate) fn open(&self, id: &str, owner: &Owner) -> Result<Opened, SealError> {
        let longest = HEADER_LEN + NONCE_LEN + self.purpose.max_plain + TAG_LEN;
        if id.len() > longest.div_ceil(3) * 4 {
            return Err(SealError::Malformed);
        }
        let mut raw = URL_SAFE_NO_PAD
            .decode(id)
            .map_err(|_| SealError::Malformed)?;
        if raw.len() < HEADER_LEN + NONCE_LEN + TAG_LEN || raw[0] != self.purpose.version {
            return Err(SealError::Malformed);
        }
        let named = KeyId(
            raw[1..=KEY_ID_LEN]
                .try_into()
                .map_err(|_| SealError::Malformed)?,
        );
        let key = self.keys.get(named).ok_or(SealError::BadSeal)?;
        let mut home = [0u8; HOME_LEN];
        home.copy_from_slice(&raw[1 + KEY_ID_LEN..HEADER_LEN]);
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&raw[HEADER_LEN..HEADER_LEN + NONCE_LEN]);
        let (head, sealed) = raw.split_at_mut(HEADER_LEN + NONCE_LEN);
        let plain = sealing_key(&key, self.purpose)
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(associated(&head[..HEADER_LEN], owner.as_bytes())),
                sealed,
            )
            .map_err(|_| SealError::BadSeal)?;
        let upstream = String::from_utf8(plain.to_vec()).map_err(|_| SealError::BadSeal)?;
        Ok(Opened {
            home: HomeToken(home),
            upstream,
        })
    }
}

/// The AEAD's associated data: the id's header, then the owner.
fn associated(header: &[u8], owner: &[u8]) -> Vec<u8> {
    [header, owner].concat()
}

/// The AEAD key `key` derives for the values of `purpose`.
fn sealing_key(key: &Key, purpose: &Purpose) -> LessSafeKey {
    let bytes = key.mac(purpose.seal, b"chacha20-poly1305");
    // A 32-byte key is what ChaCha20-Poly1305 takes: this cannot fail.
    let unbound = UnboundKey::new(&CHACHA20_POLY1305, &bytes)
        .unwrap_or_else(|_| unreachable!("ChaCha20-Poly1305 takes a 32-byte key"));
    LessSafeKey::new(unbound)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::Ring;

    /// Tasks of anonymous requests.
    const ANON: Owner = Owner::ANONYMOUS;

    fn ids(secret: &[u8], pod: &str) -> Sealer {
        Sealer::new(
            KeyRing::from_bytes(secret.to_vec()),
            HomeToken::for_pod(pod),
            &TASK_ID,
        )
    }

    #[test]
    fn a_minted_id_opens_to_its_holder_and_the_servers_id() {
        let a = ids(b"0123456789abcdef", "pod-a");
        let id = a
            .mint("0b9c5a44-7d4e-4a8e-9a43-2f1d7c0e5b11", &ANON)
            .unwrap();
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        );
        assert!(
            !id.contains("0b9c5a44"),
            "the server's id is never shown: {id}"
        );
        let opened = ids(b"0123456789abcdef", "pod-b").open(&id, &ANON).unwrap();
        assert_eq!(opened.home, HomeToken::for_pod("pod-a"));
        assert_eq!(opened.upstream, "0b9c5a44-7d4e-4a8e-9a43-2f1d7c0e5b11");
    }

    #[test]
    fn one_server_id_gives_one_client_id_per_pod() {
        let (a, b) = (ids(b"0123456789abcdef", "a"), ids(b"0123456789abcdef", "b"));
        assert_eq!(a.mint("t-1", &ANON).unwrap(), a.mint("t-1", &ANON).unwrap());
        assert_ne!(a.mint("t-1", &ANON).unwrap(), a.mint("t-2", &ANON).unwrap());
        assert_ne!(a.mint("t-1", &ANON).unwrap(), b.mint("t-1", &ANON).unwrap());
    }

    #[test]
    fn forged_altered_and_foreign_ids_do_not_open() {
        let a = ids(b"0123456789abcdef", "a");
        let id = a.mint("t-1", &ANON).unwrap();
        assert_eq!(a.open("t-1", &ANON), Err(SealError::Malformed));
        assert_eq!(a.open("not base64!", &ANON), Err(SealError::Malformed));
        assert_eq!(a.open(&"A".repeat(2000), &ANON), Err(SealError::Malformed));
        let mut raw = URL_SAFE_NO_PAD.decode(&id).unwrap();
        // Another home with the same seal: the home is authenticated.
        raw[HEADER_LEN - 1] ^= 1;
        assert_eq!(
            a.open(&URL_SAFE_NO_PAD.encode(&raw), &ANON),
            Err(SealError::BadSeal)
        );
        let other_endpoint = ids(b"fedcba9876543210", "a");
        assert!(other_endpoint.open(&id, &ANON).is_err());
    }

    #[test]
    fn ids_sealed_before_a_rotation_open_while_the_ring_holds_their_key() {
        let (old, new) = (b"0123456789abcdef", b"fedcba9876543210");
        let ring =
            |keys: Ring| Sealer::new(KeyRing::fixed(keys), HomeToken::for_pod("a"), &TASK_ID);
        let id = ring(Ring::single(Key::new(old.to_vec())))
            .mint("t-1", &ANON)
            .unwrap();
        let rotated = ring(Ring::rotated(
            Key::new(new.to_vec()),
            Some(Key::new(old.to_vec())),
        ));
        assert_eq!(rotated.open(&id, &ANON).unwrap().upstream, "t-1");
        let retired = ring(Ring::single(Key::new(new.to_vec())));
        assert_eq!(retired.open(&id, &ANON), Err(SealError::BadSeal));
    }

    /// An id opens only for the owner it was minted for; any other gets what a forged id
    /// gets, and one server id gives each owner its own client id.
    #[test]
    fn an_id_opens_only_for_its_owner() {
        let a = ids(b"0123456789abcdef", "a");
        let (alice, bob) = (Owner::from_bytes(b"alice"), Owner::from_bytes(b"bob"));
        let id = a.mint("t-1", &alice).unwrap();
        assert_eq!(a.open(&id, &alice).unwrap().upstream, "t-1");
        for other in [&bob, &ANON, &Owner::from_bytes(b"alic")] {
            assert_eq!(a.open(&id, other), Err(SealError::BadSeal), "{other:?}");
        }
        assert_ne!(id, a.mint("t-1", &bob).unwrap());
        assert_ne!(id, a.mint("t-1", &ANON).unwrap());
    }

    /// Each purpose has its own version and keys: a task id is no request state, and back.
    #[test]
    fn a_value_opens_only_as_its_own_purpose() {
        let keys = KeyRing::from_bytes(b"0123456789abcdef".to_vec());
        let home = HomeToken::for_pod("a");
        let tasks = Sealer::new(keys.clone(), home, &TASK_ID);
        let states = Sealer::new(keys, home, &REQUEST_STATE);
        let task = tasks.mint("t-1", &ANON).unwrap();
        let state = states.mint("t-1", &ANON).unwrap();
        assert_eq!(states.open(&state, &ANON).unwrap().upstream, "t-1");
        assert_eq!(states.open(&task, &ANON), Err(SealError::Malformed));
        assert_eq!(tasks.open(&state, &ANON), Err(SealError::Malformed));
        let mut raw = URL_SAFE_NO_PAD.decode(&task).unwrap();
        raw[0] = REQUEST_STATE.version;
        assert_eq!(
            states.open(&URL_SAFE_NO_PAD.encode(&raw), &ANON),
            Err(SealError::BadSeal),
            "the same bytes under the other purpose's keys"
        );
    }

    #[test]
    fn a_server_id_too_long_to_seal_is_refused() {
        let a = ids(b"0123456789abcdef", "a");
        let longest = "x".repeat(MAX_UPSTREAM_TASK_ID);
        assert_eq!(
            a.open(&a.mint(&longest, &ANON).unwrap(), &ANON)
                .unwrap()
                .upstream,
            longest
        );
        assert_eq!(
            a.mint(&format!("{longest}x"), &ANON),
            Err(SealError::TooLong)
        );
    }
}
