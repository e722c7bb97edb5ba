//! What is left of a request a session answered and then forgot (`docs/design/buffering.md#retries`):
//! a keyed 64-bit digest of its id, until `buffer.ttl` after it was forgotten. A retry of that
//! id then gets a JSON-RPC error saying its result is no longer available, never a second
//! dispatch upstream.
//!
//! A tombstone takes [`TOMBSTONE_BYTES`]; a session holds them in the order they were made, so
//! expiring them costs what expires.

use std::collections::{HashSet, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::sync::OnceLock;
use std::time::Instant;

use crate::mcp::jsonrpc::RequestKey;

/// Bytes one tombstone takes (its digest in the set and in the queue, its expiry, table slack),
/// for `tether_retained_bytes{kind="tombstones"}`.
pub(crate) const TOMBSTONE_BYTES: u64 = 40;

/// The tombstones of one session.
#[derive(Debug, Default)]
pub(crate) struct Tombstones {
    ids: HashSet<u64>,
    /// Digests with their expiry, oldest first.
    order: VecDeque<(u64, Instant)>,
}

/// The keyed digest of a request id: random per process, so no client can aim collisions.
fn digest(id: &RequestKey) -> u64 {
    static KEY: OnceLock<RandomState> = OnceLock::new();
    KEY.get_or_init(RandomState::new).hash_one(id.as_json())
}

impl Tombstones {
    /// Remembers that request `id` was answered, until `until`.
    pub(crate) fn insert(&mut self, id: &RequestKey, until: Instant) {
        let digest = digest(id);
        if self.ids.insert(digest) {
            self.order.push_back((digest, until));
        }
    }

    /// Whether request `id` was answered and forgotten.
    pub(crate) fn contains(&self, id: &RequestKey) -> bool {
        self.ids.contains(&digest(id))
    }

    /// Forgets the tombstones expired at `now`; returns how many.
    pub(crate) fn expire(&mut self, now: Instant) -> usize {
        let mut n = 0;
        while let Some(&(digest, until)) = self.order.front() {
            if until > now {
                break;
            }
            self.order.pop_front();
            self.ids.remove(&digest);
            n += 1;
        }
        n
    }

    /// Bytes held ([`TOMBSTONE_BYTES`] each).
    pub(crate) fn bytes(&self) -> u64 {
        self.order.len() as u64 * TOMBSTONE_BYTES
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use std::time::Duration;

    #[test]
    fn a_tombstone_answers_for_its_id_until_it_expires() {
        let now = Instant::now();
        let mut t = Tombstones::default();
        let (one, two) = (
            RequestKey::of(&Value::from(1)),
            RequestKey::of(&Value::from("2")),
        );
        t.insert(&one, now + Duration::from_secs(1));
        t.insert(&two, now + Duration::from_secs(2));
        t.insert(&one, now + Duration::from_secs(9));
        assert!(t.contains(&one) && t.contains(&two));
        assert!(
            !t.contains(&RequestKey::of(&Value::from(2))),
            "2 is not \"2\""
        );
        assert_eq!(t.bytes(), 2 * TOMBSTONE_BYTES, "one tombstone per id");
        assert_eq!(t.expire(now + Duration::from_millis(1_500)), 1);
        assert!(!t.contains(&one) && t.contains(&two));
        assert_eq!(t.expire(now + Duration::from_secs(2)), 1);
        assert_eq!(t.bytes(), 0);
    }
}
