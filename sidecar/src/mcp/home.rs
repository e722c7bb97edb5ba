//! The pod a value was made on, as session ids, sealed task ids and sealed `requestState`s carry
//! it ([`HomeToken`], `docs/design/architecture.md#sessions`): a leaf every one of them reads.

use sha2::{Digest, Sha256};

/// Length of a home token, in bytes.
pub(crate) const HOME_LEN: usize = 8;

/// The pod a session was created on, as carried inside its id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct HomeToken(pub [u8; HOME_LEN]);

impl HomeToken {
    /// The home token of the pod with this UID: the first 8 bytes of SHA-256(`tether/home/v1` ‖
    /// UID).
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
