//! The replicas a pod keeps for its peers (`docs/design/replication.md#keeping-a-replica-current`):
//! one per session, the latest its holder sent, as the JSON text of its image (a replica is
//! written far more often than it is read, and read at most once: when it is promoted or
//! claimed back). Each is counted in the pod's budget (`tether_retained_bytes{kind="replicas"}`);
//! one that does not fit is refused.
//!
//! ```text
//!            keep (epoch ≥ the kept one's)       drop (holder's word) · expiry
//!   absent ───────────────────────────▶ kept ──────────────────────────────▶ absent
//!                                        │ take (promotion here, or the holder's claim)
//!                                        ▼
//!                                      absent (the session is held: here, or by the claimer)
//! ```

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::peer::wire::{ReplicaOutcome, SessionImage};
use crate::retained::{Charge, Kind, Retained};

/// Bytes a kept replica takes besides its text (its entry, the holder's UID, table slack).
pub(crate) const ENTRY_BYTES: u64 = 160;

/// A replica as kept.
#[derive(Debug)]
struct Replica {
    /// UID of the pod holding the session.
    holder: String,
    /// The session's epoch at its holder.
    epoch: u64,
    /// The image, as JSON text.
    text: Box<[u8]>,
    /// Its bytes in the pod's budget.
    charge: Charge,
    /// When the holder last sent it.
    updated: Instant,
}

/// A replica taken out of the store to serve its session.
#[derive(Debug)]
pub(crate) struct Taken {
    /// The pod that held the session.
    pub(crate) holder: String,
    /// The session's image.
    pub(crate) image: SessionImage,
}

/// The replicas kept on this pod, by session id.
#[derive(Debug)]
pub(crate) struct Replicas {
    kept: Mutex<HashMap<String, Replica>>,
    retained: Retained,
}

impl Replicas {
    /// An empty store counting in `retained`.
    pub(crate) fn new(retained: Retained) -> Self {
        Self {
            kept: Mutex::new(HashMap::new()),
            retained,
        }
    }

    /// Keeps `image`, sent by `holder`, in place of the replica of the same session unless
    /// that one is of a later epoch.
    pub(crate) fn keep(&self, holder: &str, image: &SessionImage, now: Instant) -> ReplicaOutcome {
        let Ok(text) = serde_json::to_vec(image) else {
            return ReplicaOutcome::Invalid;
        };
        let bytes = text.len() as u64 + ENTRY_BYTES + image.id.len() as u64;
        let mut kept = self.kept.lock();
        let before = kept.get(&image.id);
        if before.is_some_and(|r| r.epoch > image.epoch) {
            return ReplicaOutcome::StaleEpoch;
        }
        let freed = before.map_or(0, |r| r.charge.bytes());
        if self.retained.total() + bytes > self.retained.cap() + freed {
            return ReplicaOutcome::Full;
        }
        let mut charge = self.retained.charge(Kind::Replicas);
        charge.resize(bytes);
        kept.insert(
            image.id.clone(),
            Replica {
                holder: holder.to_owned(),
                epoch: image.epoch,
                text: text.into_boxed_slice(),
                charge,
                updated: now,
            },
        );
        ReplicaOutcome::Kept
    }

    /// Drops the replica of session `id` that `holder` sent, unless it is of a later epoch
    /// than `epoch` (another holder's since).
    pub(crate) fn drop_replica(&self, holder: &str, id: &str, epoch: u64) {
        let mut kept = self.kept.lock();
        if kept
            .get(id)
            .is_some_and(|r| r.holder == holder && r.epoch <= epoch)
        {
            kept.remove(id);
        }
    }

    /// The holder of the replica of session `id`, if one is kept.
    pub(crate) fn holder(&self, id: &str) -> Option<String> {
        self.kept.lock().get(id).map(|r| r.holder.clone())
    }

    /// Takes the replica of session `id` out, when `may` allows it for its holder: to promote
    /// it here, or to hand it back to its holder. A replica whose text no longer reads as an
    /// image (it always does: it was written from one) is dropped.
    pub(crate) fn take(&self, id: &str, may: impl FnOnce(&str) -> bool) -> Option<Taken> {
        let mut kept = self.kept.lock();
        if !may(&kept.get(id)?.holder) {
            return None;
        }
        let replica = kept.remove(id)?;
        drop(kept);
        let image = serde_json::from_slice(&replica.text).ok()?;
        Some(Taken {
            holder: replica.holder,
            image,
        })
    }

    /// Drops the replicas their holder did not send for `idle` (the session's idle timeout:
    /// a live holder sends its sessions again long before); returns how many.
    pub(crate) fn expire(&self, now: Instant, idle: Duration) -> usize {
        let mut kept = self.kept.lock();
        let before = kept.len();
        kept.retain(|_, r| now.saturating_duration_since(r.updated) < idle);
        before - kept.len()
    }

    /// Replicas kept.
    pub(crate) fn len(&self) -> usize {
        self.kept.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::peer::wire::JournalImage;

    fn image(id: &str, epoch: u64) -> SessionImage {
        SessionImage {
            id: id.into(),
            version: "2025-11-25".into(),
            journal: JournalImage {
                initialize: serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize"}),
                initialized: true,
                log_level: None,
                subscriptions: BTreeMap::new(),
            },
            requests: vec![],
            streams: vec![],
            standalone_unsupported: None,
            credentialed: true,
            binding: None,
            accepted: vec![],
            epoch,
        }
    }

    #[test]
    fn a_replica_is_replaced_by_its_holder_and_never_by_an_earlier_epoch() {
        let retained = Retained::new(1 << 20);
        let store = Replicas::new(retained.clone());
        let now = Instant::now();
        assert_eq!(store.keep("a", &image("s", 1), now), ReplicaOutcome::Kept);
        let one = retained.bytes(Kind::Replicas);
        assert!(one > ENTRY_BYTES, "counted in the budget: {one}");
        assert_eq!(store.keep("a", &image("s", 1), now), ReplicaOutcome::Kept);
        assert_eq!(retained.bytes(Kind::Replicas), one, "replaced, not added");
        assert_eq!(store.keep("b", &image("s", 2), now), ReplicaOutcome::Kept);
        assert_eq!(store.holder("s").as_deref(), Some("b"), "a later holder");
        assert_eq!(
            store.keep("a", &image("s", 1), now),
            ReplicaOutcome::StaleEpoch
        );
        assert_eq!(store.holder("s").as_deref(), Some("b"));
        // The earlier holder's drop does not remove the later holder's replica.
        store.drop_replica("a", "s", 1);
        assert_eq!(store.len(), 1);
        store.drop_replica("b", "s", 2);
        assert_eq!((store.len(), retained.bytes(Kind::Replicas)), (0, 0));
    }

    #[test]
    fn a_replica_that_does_not_fit_the_budget_is_refused() {
        let retained = Retained::new(600);
        let store = Replicas::new(retained.clone());
        let now = Instant::now();
        assert_eq!(store.keep("a", &image("s1", 0), now), ReplicaOutcome::Kept);
        assert_eq!(store.keep("a", &image("s2", 0), now), ReplicaOutcome::Full);
        // Its own replacement fits in what it frees.
        assert_eq!(store.keep("a", &image("s1", 0), now), ReplicaOutcome::Kept);
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn a_replica_is_taken_once_and_only_when_allowed() {
        let store = Replicas::new(Retained::new(1 << 20));
        let now = Instant::now();
        store.keep("a", &image("s", 3), now);
        assert!(store.take("s", |holder| holder == "b").is_none(), "not b's");
        let taken = store.take("s", |holder| holder == "a").expect("a's");
        assert_eq!((taken.holder.as_str(), taken.image), ("a", image("s", 3)));
        assert!(store.take("s", |_| true).is_none(), "taken once");
    }

    #[test]
    fn replicas_nobody_updated_expire() {
        let store = Replicas::new(Retained::new(1 << 20));
        let now = Instant::now();
        store.keep("a", &image("old", 0), now);
        store.keep("a", &image("new", 0), now + Duration::from_secs(50));
        assert_eq!(
            store.expire(now + Duration::from_secs(60), Duration::from_secs(30)),
            1
        );
        assert_eq!(store.holder("new").as_deref(), Some("a"));
    }
}
