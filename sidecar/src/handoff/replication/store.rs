//! The replicas a pod keeps for its peers (`docs/design/replication.md#keeping-a-replica-current`):
//! one per session, the latest its holder sent, in parts of JSON text — the session's head (its
//! image without streams and retry records), each stream and each retry record — so that a
//! change replaces, adds or drops parts without reading the rest (a replica is written far more
//! often than it is read, and read at most once: when it is promoted or claimed back). Each is
//! counted in the pod's budget (`tether_retained_bytes{kind="replicas"}`); one that does not
//! fit is refused.
//!
//! ```text
//!            whole (epoch ≥ the kept one's)         drop (holder's word) · expiry
//!   absent ───────────────────────────▶ kept ──────────────────────────────▶ absent
//!                                      │  ▲ │
//!                   change (its base)  └──┘ │ take (promotion here, or the holder's claim)
//!                                           ▼
//!                                      absent (the session is held: here, or by the claimer)
//! ```
//!
//! A change applies only to the copy it was computed against — the same holder and epoch, at
//! the change's base mark — otherwise it is refused `behind` and the holder sends the replica
//! whole.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::mcp::cursor::StreamKey;
use crate::mcp::jsonrpc::RequestKey;
use crate::peer::wire::{ReplicaOutcome, ReplicaUpdate, RequestImage, SessionImage, StreamImage};
use crate::retained::{Charge, Kind, Retained};

/// Bytes a kept replica takes besides its parts (its entry, the holder's UID, table slack).
pub(crate) const ENTRY_BYTES: u64 = 160;
/// Bytes a stream or retry record of a replica takes besides its text (its table entry, key
/// and place in the order).
const PART_BYTES: u64 = 48;

/// One stream or retry record of a replica: its JSON text, and its place in the session's
/// order (the holder's: oldest first).
#[derive(Debug)]
struct Part {
    order: u64,
    text: Box<[u8]>,
}

/// The parts of one kind (streams, retry records) of a replica, by key.
#[derive(Debug)]
struct Parts<K> {
    by_key: HashMap<K, Part>,
    /// The order of the next part added.
    next: u64,
    /// Bytes of every part, [`PART_BYTES`] included.
    bytes: u64,
}

impl<K: std::hash::Hash + Eq> Parts<K> {
    fn new() -> Self {
        Self {
            by_key: HashMap::new(),
            next: 0,
            bytes: 0,
        }
    }

    /// Bytes of the part under `key`, if there is one.
    fn bytes_of(&self, key: &K) -> u64 {
        self.by_key.get(key).map_or(0, |p| part_bytes(&p.text))
    }

    /// Bytes once `forgotten` are dropped and `put` added or replaced (the part a key had is
    /// counted out once).
    fn bytes_after(&self, forgotten: &[K], put: &[(K, Box<[u8]>)]) -> u64 {
        let replaced = |key: &K| put.iter().any(|(k, _)| k == key);
        let gone: u64 = forgotten
            .iter()
            .filter(|k| !replaced(k))
            .chain(put.iter().map(|(k, _)| k))
            .map(|k| self.bytes_of(k))
            .sum();
        let new: u64 = put.iter().map(|(_, text)| part_bytes(text)).sum();
        (self.bytes + new).saturating_sub(gone)
    }

    /// Drops `forgotten`, then adds each of `put`, or replaces the part of its key in its
    /// place.
    fn apply(&mut self, forgotten: &[K], put: Vec<(K, Box<[u8]>)>) {
        for key in forgotten {
            if let Some(old) = self.by_key.remove(key) {
                self.bytes -= part_bytes(&old.text);
            }
        }
        for (key, text) in put {
            self.bytes += part_bytes(&text);
            let order = match self.by_key.remove(&key) {
                Some(old) => {
                    self.bytes -= part_bytes(&old.text);
                    old.order
                }
                None => {
                    self.next += 1;
                    self.next
                }
            };
            self.by_key.insert(key, Part { order, text });
        }
    }

    /// Every part read back, in order.
    fn read<T: DeserializeOwned>(&self) -> Option<Vec<T>> {
        let mut parts: Vec<&Part> = self.by_key.values().collect();
        parts.sort_unstable_by_key(|p| p.order);
        parts
            .into_iter()
            .map(|p| serde_json::from_slice(&p.text).ok())
            .collect()
    }
}

/// Bytes a part of text `text` takes in the budget.
fn part_bytes(text: &[u8]) -> u64 {
    text.len() as u64 + PART_BYTES
}

/// An update's parts as JSON text, ready to apply.
struct Prepared {
    head: Box<[u8]>,
    streams: Vec<(StreamKey, Box<[u8]>)>,
    requests: Vec<(RequestKey, Box<[u8]>)>,
}

impl Prepared {
    /// The parts of `update`, its streams and retry records taken out of it.
    fn of(update: &mut ReplicaUpdate) -> Result<Self, serde_json::Error> {
        let streams = std::mem::take(&mut update.image.streams);
        let requests = std::mem::take(&mut update.image.requests);
        Ok(Self {
            head: text(&update.image)?,
            streams: streams
                .into_iter()
                .map(|s| Ok((s.key.clone(), text(&s)?)))
                .collect::<Result<_, serde_json::Error>>()?,
            requests: requests
                .into_iter()
                .map(|r| Ok((r.id.clone(), text(&r)?)))
                .collect::<Result<_, serde_json::Error>>()?,
        })
    }
}

fn text(value: &impl Serialize) -> Result<Box<[u8]>, serde_json::Error> {
    serde_json::to_vec(value).map(Vec::into_boxed_slice)
}

/// A replica as kept.
#[derive(Debug)]
struct Replica {
    /// UID of the pod holding the session.
    holder: String,
    /// The session's epoch at its holder.
    epoch: u64,
    /// The holder's mark of it: the base a change must name.
    mark: u64,
    /// The image without streams and retry records, as JSON text.
    head: Box<[u8]>,
    streams: Parts<StreamKey>,
    requests: Parts<RequestKey>,
    /// Its bytes in the pod's budget.
    charge: Charge,
    /// When the holder last sent it.
    updated: Instant,
}

impl Replica {
    /// A replica of `holder` with nothing in it yet, counted in `charge`.
    fn new(holder: &str, charge: Charge, now: Instant) -> Self {
        Self {
            holder: holder.to_owned(),
            epoch: 0,
            mark: 0,
            head: Box::default(),
            streams: Parts::new(),
            requests: Parts::new(),
            charge,
            updated: now,
        }
    }

    /// Its bytes in the budget, for session `id`, once `update` (`prepared`) is applied.
    fn bytes_after(&self, id: &str, update: &ReplicaUpdate, prepared: &Prepared) -> u64 {
        ENTRY_BYTES
            + id.len() as u64
            + prepared.head.len() as u64
            + self
                .streams
                .bytes_after(&update.forgotten_streams, &prepared.streams)
            + self
                .requests
                .bytes_after(&update.forgotten_requests, &prepared.requests)
    }

    fn apply(&mut self, id: &str, update: &ReplicaUpdate, prepared: Prepared, now: Instant) {
        self.head = prepared.head;
        self.streams
            .apply(&update.forgotten_streams, prepared.streams);
        self.requests
            .apply(&update.forgotten_requests, prepared.requests);
        self.epoch = update.image.epoch;
        self.mark = update.mark;
        self.updated = now;
        let bytes = ENTRY_BYTES
            + id.len() as u64
            + self.head.len() as u64
            + self.streams.bytes
            + self.requests.bytes;
        self.charge.resize(bytes);
    }

    /// The session's image, read back from its parts.
    fn image(&self) -> Option<SessionImage> {
        let head: SessionImage = serde_json::from_slice(&self.head).ok()?;
        Some(SessionImage {
            streams: self.streams.read::<StreamImage>()?,
            requests: self.requests.read::<RequestImage>()?,
            ..head
        })
    }
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
    /// Drawn at random for this store (this run of the sidecar), never 0: holders tell from it
    /// that the replicas they placed here are gone.
    incarnation: u64,
}

impl Replicas {
    /// An empty store counting in `retained`.
    pub(crate) fn new(retained: Retained) -> Self {
        Self {
            kept: Mutex::new(HashMap::new()),
            retained,
            incarnation: rand::random::<u64>().max(1),
        }
    }

    /// This store's incarnation (see [`Replicas`]).
    pub(crate) fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// Keeps `update`, sent by `holder`: a whole replica in place of the one of the same
    /// session unless that one is of a later epoch; a change applied to the copy it was
    /// computed against (`behind` for any other).
    pub(crate) fn keep(
        &self,
        holder: &str,
        mut update: ReplicaUpdate,
        now: Instant,
    ) -> ReplicaOutcome {
        let Ok(prepared) = Prepared::of(&mut update) else {
            return ReplicaOutcome::Invalid;
        };
        let update = &update;
        let id = update.image.id.as_str();
        let mut kept = self.kept.lock();
        let before = kept.get(id);
        if before.is_some_and(|r| r.epoch > update.image.epoch) {
            return ReplicaOutcome::StaleEpoch;
        }
        let freed = before.map_or(0, |r| r.charge.bytes());
        // What the update applies to: the copy a change names, or a new replica.
        let mut fresh = None;
        let target = match (update.base, before) {
            (None, _) => &*fresh.insert(Replica::new(
                holder,
                self.retained.charge(Kind::Replicas),
                now,
            )),
            (Some(base), Some(r))
                if r.holder == holder && r.epoch == update.image.epoch && r.mark == base =>
            {
                r
            }
            (Some(_), _) => return ReplicaOutcome::Behind,
        };
        let bytes = target.bytes_after(id, update, &prepared);
        if self.retained.total() + bytes > self.retained.cap() + freed {
            return ReplicaOutcome::Full;
        }
        if let Some(fresh) = fresh {
            kept.insert(id.to_owned(), fresh);
        }
        if let Some(replica) = kept.get_mut(id) {
            replica.apply(id, update, prepared, now);
        }
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
    /// it here, or to hand it back to its holder. A replica whose parts no longer read as an
    /// image (they always do: they were written from one) is dropped.
    pub(crate) fn take(&self, id: &str, may: impl FnOnce(&str) -> bool) -> Option<Taken> {
        let mut kept = self.kept.lock();
        if !may(&kept.get(id)?.holder) {
            return None;
        }
        let replica = kept.remove(id)?;
        drop(kept);
        let image = replica.image()?;
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
    use crate::peer::wire::{JournalImage, KindImage};

    fn session(id: &str, epoch: u64) -> SessionImage {
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
            tombstones: None,
        }
    }

    /// Session `id` at `epoch`, whole.
    fn whole(id: &str, epoch: u64) -> ReplicaUpdate {
        ReplicaUpdate {
            mark: 0,
            base: None,
            image: session(id, epoch),
            forgotten_streams: vec![],
            forgotten_requests: vec![],
        }
    }

    fn stream(key: &StreamKey, complete: bool) -> StreamImage {
        StreamImage {
            key: key.clone(),
            kind: KindImage::Post,
            pending: vec![],
            complete,
            stored: None,
            sse: None,
            last_seq: 2,
            evicted_through: 2,
            events: vec![],
            withdrawn: false,
        }
    }

    fn record(n: i64, stream: &StreamKey) -> RequestImage {
        RequestImage {
            id: RequestKey::of(&serde_json::json!(n)),
            digest: "00".repeat(32),
            stream: stream.clone(),
        }
    }

    #[test]
    fn a_change_applies_to_the_copy_it_was_computed_against_and_counts_what_it_leaves() {
        let retained = Retained::new(1 << 20);
        let store = Replicas::new(retained.clone());
        let now = Instant::now();
        let keys: Vec<StreamKey> = (0..3).map(|_| StreamKey::random()).collect();
        let mut first = whole("s", 2);
        first.mark = 10;
        first.image.streams = vec![stream(&keys[0], true), stream(&keys[1], false)];
        first.image.requests = vec![record(1, &keys[0]), record(2, &keys[1])];
        assert_eq!(store.keep("a", first, now), ReplicaOutcome::Kept);

        // Stream 1 completed, stream 2 is new, stream 0 and its record were forgotten.
        let mut change = whole("s", 2);
        change.base = Some(10);
        change.mark = 11;
        change.image.streams = vec![stream(&keys[1], true), stream(&keys[2], false)];
        change.image.requests = vec![record(3, &keys[2])];
        change.forgotten_streams = vec![keys[0].clone()];
        change.forgotten_requests = vec![RequestKey::of(&serde_json::json!(1))];
        // Against another base, another holder's copy, or no copy: behind.
        for (holder, id, base) in [("a", "s", 9), ("b", "s", 10), ("a", "t", 10)] {
            let mut other = change.clone();
            other.base = Some(base);
            other.image.id = id.into();
            assert_eq!(
                store.keep(holder, other, now),
                ReplicaOutcome::Behind,
                "{holder} {id} {base}"
            );
        }
        assert_eq!(store.keep("a", change, now), ReplicaOutcome::Kept);
        let changed = retained.bytes(Kind::Replicas);

        // What it leaves is what the holder has: the same as that state sent whole, bytes too.
        let mut same = whole("s", 2);
        same.mark = 11;
        same.image.streams = vec![stream(&keys[1], true), stream(&keys[2], false)];
        same.image.requests = vec![record(2, &keys[1]), record(3, &keys[2])];
        let taken = store.take("s", |_| true).unwrap();
        assert_eq!(taken.image, same.image, "in the holder's order");
        assert_eq!(store.keep("a", same.clone(), now), ReplicaOutcome::Kept);
        assert_eq!(retained.bytes(Kind::Replicas), changed);

        // The next change names mark 11; a change that does not fit leaves the copy as it was.
        let mut big = whole("s", 2);
        big.base = Some(11);
        big.mark = 12;
        big.image.journal.initialize = serde_json::json!({"padding": "x".repeat(2 << 20)});
        assert_eq!(store.keep("a", big, now), ReplicaOutcome::Full);
        assert_eq!(retained.bytes(Kind::Replicas), changed);
        assert_eq!(store.take("s", |_| true).unwrap().image, same.image);
    }

    #[test]
    fn a_replica_is_replaced_by_its_holder_and_never_by_an_earlier_epoch() {
        let retained = Retained::new(1 << 20);
        let store = Replicas::new(retained.clone());
        let now = Instant::now();
        assert_eq!(store.keep("a", whole("s", 1), now), ReplicaOutcome::Kept);
        let one = retained.bytes(Kind::Replicas);
        assert!(one > ENTRY_BYTES, "counted in the budget: {one}");
        assert_eq!(store.keep("a", whole("s", 1), now), ReplicaOutcome::Kept);
        assert_eq!(retained.bytes(Kind::Replicas), one, "replaced, not added");
        assert_eq!(store.keep("b", whole("s", 2), now), ReplicaOutcome::Kept);
        assert_eq!(store.holder("s").as_deref(), Some("b"), "a later holder");
        assert_eq!(
            store.keep("a", whole("s", 1), now),
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
        assert_eq!(store.keep("a", whole("s1", 0), now), ReplicaOutcome::Kept);
        assert_eq!(store.keep("a", whole("s2", 0), now), ReplicaOutcome::Full);
        // Its own replacement fits in what it frees.
        assert_eq!(store.keep("a", whole("s1", 0), now), ReplicaOutcome::Kept);
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn a_replica_is_taken_once_and_only_when_allowed() {
        let store = Replicas::new(Retained::new(1 << 20));
        let now = Instant::now();
        store.keep("a", whole("s", 3), now);
        assert!(store.take("s", |holder| holder == "b").is_none(), "not b's");
        let taken = store.take("s", |holder| holder == "a").expect("a's");
        assert_eq!((taken.holder.as_str(), taken.image), ("a", session("s", 3)));
        assert!(store.take("s", |_| true).is_none(), "taken once");
    }

    #[test]
    fn replicas_nobody_updated_expire() {
        let store = Replicas::new(Retained::new(1 << 20));
        let now = Instant::now();
        store.keep("a", whole("old", 0), now);
        store.keep("a", whole("new", 0), now + Duration::from_secs(50));
        assert_eq!(
            store.expire(now + Duration::from_secs(60), Duration::from_secs(30)),
            1
        );
        assert_eq!(store.holder("new").as_deref(), Some("a"));
    }
}
