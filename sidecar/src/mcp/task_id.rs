//! Task ids minted by the sidecar (`docs/design/tasks.md`): the id a client sees for a task of
//! the tasks extension (SEP-2663) names the pod whose MCP server holds the task and carries the
//! server's own id sealed, so that any pod routes a request about the task to its holder and the
//! holder alone learns the server's id. No table: the id is the mapping.
//!
//! `base64url` without padding (visible ASCII) of:
//!
//! | bytes | field |
//! |---|---|
//! | 1 | format version, `1` |
//! | 4 | id of the key that sealed it ([`KeyId`]) |
//! | 8 | home token of the holding pod ([`HomeToken`]) |
//! | 12 | nonce: HMAC-SHA256(key, home ‖ owner length ‖ owner ‖ server id), truncated (a synthetic nonce) |
//! | n | the MCP server's task id, ChaCha20-Poly1305-encrypted (n ≤ [`MAX_UPSTREAM_TASK_ID`]) |
//! | 16 | the AEAD tag over the ciphertext, the 13 bytes before the nonce and the owner |
//!
//! The owner ([`TaskOwner`]: who the task's ids were minted for) is in no byte of the id: it is
//! authenticated, so an id opens only for a request presenting the same owner, and any other
//! caller gets not-found, as for an id never issued.
//!
//! The nonce derives from what is sealed, so one server id on one pod always gives the same
//! client id (`tasks/get` answers and status notifications name the task the client holds), and
//! two different ids never share a nonce. The keys come from the endpoint's key ring (domains
//! [`DOMAIN_TASK_ID_SEAL`], [`DOMAIN_TASK_ID_NONCE`]); an id sealed with a key the ring no longer
//! holds, forged or altered does not open ([`TaskIdError`]) and its request gets the spec's
//! not-found error (-32602).

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};

use super::principal::TaskOwner;
use super::session_id::HomeToken;
use crate::keys::{DOMAIN_TASK_ID_NONCE, DOMAIN_TASK_ID_SEAL, Key, KeyId, KeyRing};

/// Format version of sealed task ids.
const VERSION: u8 = 1;
const KEY_ID_LEN: usize = 4;
const HOME_LEN: usize = 8;
const TAG_LEN: usize = 16;
/// Bytes before the nonce: version, key id, home (the AEAD's associated data).
const HEADER_LEN: usize = 1 + KEY_ID_LEN + HOME_LEN;
/// Longest MCP server task id tether seals, in bytes (SDKs use UUIDs: 36). A longer one is
/// answered as an upstream error ([`TaskIdError::TooLong`]).
pub(crate) const MAX_UPSTREAM_TASK_ID: usize = 256;

/// Why a task id cannot be minted or opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TaskIdError {
    /// Not base64url, too short or too long, or an unknown format version.
    #[error("not a tether task id")]
    Malformed,
    /// The seal does not open: forged, altered, of another endpoint, or sealed with a key the
    /// ring no longer holds.
    #[error("task id seal mismatch")]
    BadSeal,
    /// The MCP server's id is longer than [`MAX_UPSTREAM_TASK_ID`] bytes.
    #[error("the MCP server's task id is longer than {MAX_UPSTREAM_TASK_ID} bytes")]
    TooLong,
}

/// An opened task id: the pod holding the task and the MCP server's id for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct OpenedTask {
    /// The pod whose MCP server holds the task.
    pub(crate) home: HomeToken,
    /// The MCP server's task id.
    pub(crate) upstream: String,
}

/// Seals and opens task ids for one pod.
#[derive(Clone, Debug)]
pub(crate) struct TaskIds {
    keys: KeyRing,
    home: HomeToken,
}

impl TaskIds {
    /// Task ids of the pod whose home token is `home`, sealed with `keys`' current key.
    pub(crate) fn new(keys: KeyRing, home: HomeToken) -> Self {
        Self { keys, home }
    }

    /// This pod's home token.
    pub(crate) fn home(&self) -> HomeToken {
        self.home
    }

    /// The client's id for the MCP server's task id `upstream`, held on this pod, for `owner`.
    ///
    /// # Errors
    /// [`TaskIdError::TooLong`].
    pub(crate) fn mint(&self, upstream: &str, owner: &TaskOwner) -> Result<String, TaskIdError> {
        if upstream.len() > MAX_UPSTREAM_TASK_ID {
            return Err(TaskIdError::TooLong);
        }
        let key = self.keys.current();
        let mut raw = Vec::with_capacity(HEADER_LEN + NONCE_LEN + upstream.len() + TAG_LEN);
        raw.push(VERSION);
        raw.extend_from_slice(&key.id().0);
        raw.extend_from_slice(&self.home.0);
        let owner = owner.as_bytes();
        let mut named = Vec::with_capacity(HOME_LEN + 4 + owner.len() + upstream.len());
        named.extend_from_slice(&self.home.0);
        named.extend_from_slice(&(owner.len() as u32).to_be_bytes());
        named.extend_from_slice(owner);
        named.extend_from_slice(upstream.as_bytes());
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&key.mac(DOMAIN_TASK_ID_NONCE, &named)[..NONCE_LEN]);
        let mut sealed = upstream.as_bytes().to_vec();
        let tag = sealing_key(&key)
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(associated(&raw[..HEADER_LEN], owner)),
                &mut sealed,
            )
            .map_err(|_| TaskIdError::TooLong)?;
        raw.extend_from_slice(&nonce);
        raw.extend_from_slice(&sealed);
        raw.extend_from_slice(tag.as_ref());
        Ok(URL_SAFE_NO_PAD.encode(raw))
    }

    /// Opens a client's task id, for a request presenting `owner`.
    ///
    /// # Errors
    /// [`TaskIdError::Malformed`], or [`TaskIdError::BadSeal`] (another owner's id too).
    pub(crate) fn open(&self, id: &str, owner: &TaskOwner) -> Result<OpenedTask, TaskIdError> {
        let longest = HEADER_LEN + NONCE_LEN + MAX_UPSTREAM_TASK_ID + TAG_LEN;
        if id.len() > longest.div_ceil(3) * 4 {
            return Err(TaskIdError::Malformed);
        }
        let mut raw = URL_SAFE_NO_PAD
            .decode(id)
            .map_err(|_| TaskIdError::Malformed)?;
        if raw.len() < HEADER_LEN + NONCE_LEN + TAG_LEN || raw[0] != VERSION {
            return Err(TaskIdError::Malformed);
        }
        let named = KeyId(
            raw[1..=KEY_ID_LEN]
                .try_into()
                .map_err(|_| TaskIdError::Malformed)?,
        );
        let key = self.keys.get(named).ok_or(TaskIdError::BadSeal)?;
        let mut home = [0u8; HOME_LEN];
        home.copy_from_slice(&raw[1 + KEY_ID_LEN..HEADER_LEN]);
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&raw[HEADER_LEN..HEADER_LEN + NONCE_LEN]);
        let (head, sealed) = raw.split_at_mut(HEADER_LEN + NONCE_LEN);
        let plain = sealing_key(&key)
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(associated(&head[..HEADER_LEN], owner.as_bytes())),
                sealed,
            )
            .map_err(|_| TaskIdError::BadSeal)?;
        let upstream = String::from_utf8(plain.to_vec()).map_err(|_| TaskIdError::BadSeal)?;
        Ok(OpenedTask {
            home: HomeToken(home),
            upstream,
        })
    }
}

/// The AEAD's associated data: the id's header, then the owner.
fn associated(header: &[u8], owner: &[u8]) -> Vec<u8> {
    [header, owner].concat()
}

/// The AEAD key `key` derives for task ids.
fn sealing_key(key: &Key) -> LessSafeKey {
    let bytes = key.mac(DOMAIN_TASK_ID_SEAL, b"chacha20-poly1305");
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
    const ANON: TaskOwner = TaskOwner::ANONYMOUS;

    fn ids(secret: &[u8], pod: &str) -> TaskIds {
        TaskIds::new(
            KeyRing::from_bytes(secret.to_vec()),
            HomeToken::for_pod(pod),
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
        assert_eq!(a.open("t-1", &ANON), Err(TaskIdError::Malformed));
        assert_eq!(a.open("not base64!", &ANON), Err(TaskIdError::Malformed));
        assert_eq!(
            a.open(&"A".repeat(2000), &ANON),
            Err(TaskIdError::Malformed)
        );
        let mut raw = URL_SAFE_NO_PAD.decode(&id).unwrap();
        // Another home with the same seal: the home is authenticated.
        raw[HEADER_LEN - 1] ^= 1;
        assert_eq!(
            a.open(&URL_SAFE_NO_PAD.encode(&raw), &ANON),
            Err(TaskIdError::BadSeal)
        );
        let other_endpoint = ids(b"fedcba9876543210", "a");
        assert!(other_endpoint.open(&id, &ANON).is_err());
    }

    #[test]
    fn ids_sealed_before_a_rotation_open_while_the_ring_holds_their_key() {
        let (old, new) = (b"0123456789abcdef", b"fedcba9876543210");
        let ring = |keys: Ring| TaskIds::new(KeyRing::fixed(keys), HomeToken::for_pod("a"));
        let id = ring(Ring::single(Key::new(old.to_vec())))
            .mint("t-1", &ANON)
            .unwrap();
        let rotated = ring(Ring::rotated(
            Key::new(new.to_vec()),
            Some(Key::new(old.to_vec())),
        ));
        assert_eq!(rotated.open(&id, &ANON).unwrap().upstream, "t-1");
        let retired = ring(Ring::single(Key::new(new.to_vec())));
        assert_eq!(retired.open(&id, &ANON), Err(TaskIdError::BadSeal));
    }

    /// An id opens only for the owner it was minted for; any other gets what a forged id
    /// gets, and one server id gives each owner its own client id.
    #[test]
    fn an_id_opens_only_for_its_owner() {
        let a = ids(b"0123456789abcdef", "a");
        let (alice, bob) = (
            TaskOwner::from_bytes(b"alice"),
            TaskOwner::from_bytes(b"bob"),
        );
        let id = a.mint("t-1", &alice).unwrap();
        assert_eq!(a.open(&id, &alice).unwrap().upstream, "t-1");
        for other in [&bob, &ANON, &TaskOwner::from_bytes(b"alic")] {
            assert_eq!(a.open(&id, other), Err(TaskIdError::BadSeal), "{other:?}");
        }
        assert_ne!(id, a.mint("t-1", &bob).unwrap());
        assert_ne!(id, a.mint("t-1", &ANON).unwrap());
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
            Err(TaskIdError::TooLong)
        );
    }
}
