//! What is left of a request a session answered and then forgot (`docs/design/buffering.md#retries`):
//! its id, until `buffer.ttl` after it was forgotten. A retry of that id then gets a JSON-RPC
//! error saying its result is no longer available, never a second dispatch upstream.
//!
//! Clients number their requests 1, 2, 3…: integer ids are kept as ranges, so a session's
//! forgotten ids take a range or a few whatever their count ([`RANGE_BYTES`] each; a range
//! expires with its newest id). Other ids are kept as keyed 64-bit digests
//! ([`TOMBSTONE_BYTES`] each) in the order they were made, so expiring them costs what expires.
//! The key is the session's, drawn at random when it first buries such an id and never shown
//! to its clients: a pod the session moves to, or whose replica of it is promoted, takes the
//! tombstones with the key ([`Buried`]) and tells the same ids.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::mcp::jsonrpc::RequestKey;

/// Bytes one tombstone of a non-integer id takes (its digest in the set and in the queue, its
/// expiry, table slack), for `tether_retained_bytes{kind="tombstones"}`.
pub(crate) const TOMBSTONE_BYTES: u64 = 40;

/// Bytes one range of integer ids takes (its bounds and expiry in a tree node, with slack).
pub(crate) const RANGE_BYTES: u64 = 48;

/// The tombstones of one session: nothing but a pointer until it buries a request (most
/// sessions never leave their retry window).
#[derive(Debug, Default)]
pub(crate) struct Tombstones(Option<Box<Stones>>);

impl Tombstones {
    /// Buries request `id` until `until`.
    pub(crate) fn insert(&mut self, id: &RequestKey, until: Instant) {
        self.0.get_or_insert_default().insert(id, until);
    }

    /// Whether `id` is buried.
    pub(crate) fn contains(&self, id: &RequestKey) -> bool {
        self.0.as_ref().is_some_and(|s| s.contains(id))
    }

    /// Forgets the tombstones expired at `now`; returns how many (a range counts one).
    pub(crate) fn expire(&mut self, now: Instant) -> usize {
        let Some(stones) = &mut self.0 else {
            return 0;
        };
        let n = stones.expire(now);
        if stones.bytes() == 0 {
            self.0 = None;
        }
        n
    }

    /// When the first tombstone expires.
    pub(crate) fn first_expiry(&self) -> Option<Instant> {
        self.0.as_ref().and_then(|s| s.first_expiry())
    }

    /// Bytes they take, as counted ([`RANGE_BYTES`], [`TOMBSTONE_BYTES`]).
    pub(crate) fn bytes(&self) -> u64 {
        self.0.as_ref().map_or(0, |s| s.bytes())
    }

    /// The tombstones not expired at `now`, to take to another pod: the `max` ranges and the
    /// `max` digests that expire last.
    pub(crate) fn buried(&self, now: Instant, max: usize) -> Option<Buried> {
        let stones = self.0.as_ref()?;
        let left = |until: Instant| until.saturating_duration_since(now);
        let mut ranges: Vec<(i64, i64, Duration)> = stones
            .ranges
            .iter()
            .filter(|(_, (_, until))| *until > now)
            .map(|(&first, &(last, until))| (first, last, left(until)))
            .collect();
        if ranges.len() > max {
            ranges.sort_unstable_by_key(|&(first, _, left)| (std::cmp::Reverse(left), first));
            ranges.truncate(max);
            ranges.sort_unstable();
        }
        let buried = Buried {
            key: stones.key,
            reuses_ids: false,
            ranges,
            ids: stones
                .order
                .iter()
                .skip(stones.order.len().saturating_sub(max))
                .filter(|(_, until)| *until > now)
                .map(|&(digest, until)| (digest, left(until)))
                .collect(),
        };
        (!buried.ranges.is_empty() || !buried.ids.is_empty()).then_some(buried)
    }

    /// Takes the tombstones another pod sent (as of `now`, each for at most `ttl`), into a
    /// session that buried nothing yet (one just taken over): the digests keep the key they
    /// were made with. Ranges that overlap one before them are left out.
    pub(crate) fn adopt(&mut self, buried: &Buried, now: Instant, ttl: Duration) {
        if self.0.is_some() {
            return;
        }
        let mut stones = Stones {
            key: buried.key,
            ..Stones::default()
        };
        let mut ranges = buried.ranges.clone();
        ranges.sort_unstable();
        let mut after = None;
        for (first, last, left) in ranges {
            if first <= last && after.is_none_or(|a: i64| first > a) {
                stones.ranges.insert(first, (last, now + left.min(ttl)));
                after = Some(last);
            }
        }
        let mut ids = buried.ids.clone();
        ids.sort_unstable_by_key(|&(digest, left)| (left, digest));
        for (digest, left) in ids {
            if stones.ids.insert(digest) {
                stones.order.push_back((digest, now + left.min(ttl)));
            }
        }
        if stones.bytes() > 0 {
            self.0 = Some(Box::new(stones));
        }
    }
}

/// A session's tombstones as another pod takes them: the key of the digests, the ranges of
/// integer ids (first, last) and the digests of the others, each with how long it has left;
/// and whether the session reuses ids (then a buried id is a new request).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Buried {
    pub(crate) key: [u8; 16],
    pub(crate) reuses_ids: bool,
    pub(crate) ranges: Vec<(i64, i64, Duration)>,
    pub(crate) ids: Vec<(u64, Duration)>,
}

/// The tombstones of a session that buried some.
#[derive(Debug)]
struct Stones {
    /// The key of the digests.
    key: [u8; 16],
    /// Integer ids: first → (last, expiry of the newest).
    ranges: BTreeMap<i64, (i64, Instant)>,
    /// Digests of other ids.
    ids: HashSet<u64>,
    /// Those digests with their expiry, oldest first.
    order: VecDeque<(u64, Instant)>,
}

/// The id as an integer, when it is one (`RequestKey` writes integral ids as integers).
fn integer(id: &RequestKey) -> Option<i64> {
    id.as_json().parse().ok()
}

impl Default for Stones {
    fn default() -> Self {
        Self {
            key: rand::random(),
            ranges: BTreeMap::new(),
            ids: HashSet::new(),
            order: VecDeque::new(),
        }
    }
}

impl Stones {
    /// The keyed digest of a request id: the key is the session's secret, so no client can
    /// aim collisions.
    fn digest(&self, id: &RequestKey) -> u64 {
        let digest = Sha256::new()
            .chain_update(self.key)
            .chain_update(id.as_json())
            .finalize();
        let mut first = [0; 8];
        first.copy_from_slice(&digest[..8]);
        u64::from_le_bytes(first)
    }

    /// Remembers that request `id` was answered, until `until`.
    fn insert(&mut self, id: &RequestKey, until: Instant) {
        if let Some(n) = integer(id) {
            self.insert_integer(n, until);
            return;
        }
        let digest = self.digest(id);
        if self.ids.insert(digest) {
            self.order.push_back((digest, until));
        }
    }

    /// Adds `n` to the ranges: into the one it extends (merging it with the next one when it
    /// closes the gap between them), or as a range of its own.
    fn insert_integer(&mut self, n: i64, until: Instant) {
        let below = self
            .ranges
            .range(..=n)
            .next_back()
            .map(|(&first, &(last, at))| (first, last, at));
        let next = n.checked_add(1).and_then(|m| self.ranges.get(&m).copied());
        match below {
            Some((_, last, _)) if n <= last => {}
            Some((first, last, at)) if last.checked_add(1) == Some(n) => {
                let (last, until) = match next {
                    Some((next_last, next_at)) => {
                        self.ranges.remove(&(n + 1));
                        (next_last, until.max(next_at))
                    }
                    None => (n, until),
                };
                self.ranges.insert(first, (last, until.max(at)));
            }
            _ => {
                let value = match next {
                    Some((next_last, next_at)) => {
                        self.ranges.remove(&(n + 1));
                        (next_last, until.max(next_at))
                    }
                    None => (n, until),
                };
                self.ranges.insert(n, value);
            }
        }
    }

    /// Whether request `id` was answered and forgotten.
    fn contains(&self, id: &RequestKey) -> bool {
        match integer(id) {
            Some(n) => self
                .ranges
                .range(..=n)
                .next_back()
                .is_some_and(|(_, &(last, _))| n <= last),
            None => self.ids.contains(&self.digest(id)),
        }
    }

    /// Forgets the tombstones expired at `now`; returns how many (ranges count one each).
    /// Ranges are walked whole: a session has few of them unless its client numbers its
    /// requests with gaps, and their bytes count against its budget either way.
    fn expire(&mut self, now: Instant) -> usize {
        let ranges = self.ranges.len();
        self.ranges.retain(|_, &mut (_, until)| until > now);
        let mut n = ranges - self.ranges.len();
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

    /// When the first tombstone expires, if any.
    fn first_expiry(&self) -> Option<Instant> {
        let ranges = self.ranges.values().map(|&(_, until)| until).min();
        let ids = self.order.front().map(|&(_, until)| until);
        ranges.into_iter().chain(ids).min()
    }

    /// Bytes held ([`RANGE_BYTES`] a range, [`TOMBSTONE_BYTES`] a digest).
    fn bytes(&self) -> u64 {
        self.ranges.len() as u64 * RANGE_BYTES + self.order.len() as u64 * TOMBSTONE_BYTES
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
            RequestKey::of(&Value::from("1")),
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

    #[test]
    fn integer_ids_are_ranges_whatever_their_count_and_order() {
        let now = Instant::now();
        let mut t = Tombstones::default();
        let key = |n: i64| RequestKey::of(&Value::from(n));
        // 10,000 ids forgotten a little out of order (concurrent requests), one range left.
        for chunk in (1..=10_000i64).collect::<Vec<_>>().chunks(7) {
            for &n in chunk.iter().rev() {
                t.insert(&key(n), now + Duration::from_secs(1));
            }
        }
        assert_eq!(t.bytes(), RANGE_BYTES);
        assert!((1..=10_000).all(|n| t.contains(&key(n))));
        assert!(!t.contains(&key(0)) && !t.contains(&key(10_001)));
        // A gap, then the id that closes it: the two ranges become one.
        t.insert(&key(10_002), now + Duration::from_secs(5));
        assert_eq!(t.bytes(), 2 * RANGE_BYTES);
        t.insert(&key(10_001), now + Duration::from_secs(1));
        assert_eq!(t.bytes(), RANGE_BYTES);
        t.insert(&key(i64::MAX), now);
        t.insert(&key(i64::MIN), now);
        assert!(t.contains(&key(i64::MAX)) && t.contains(&key(i64::MIN)));
        assert_eq!(t.expire(now), 2, "the two lone ones");
        assert_eq!(
            t.expire(now + Duration::from_secs(2)),
            0,
            "a range expires with its newest id"
        );
        assert_eq!(t.expire(now + Duration::from_secs(5)), 1);
        assert_eq!(t.bytes(), 0);
    }

    #[test]
    fn tombstones_taken_to_another_pod_tell_the_same_ids_for_the_time_they_had_left() {
        let now = Instant::now();
        let mut here = Tombstones::default();
        let (text, number) = (
            RequestKey::of(&Value::from("x")),
            RequestKey::of(&Value::from(3)),
        );
        here.insert(&text, now + Duration::from_secs(5));
        here.insert(&number, now + Duration::from_secs(9));
        here.insert(
            &RequestKey::of(&Value::from(4)),
            now + Duration::from_secs(1),
        );
        assert!(here.buried(now, 0).is_none(), "none carried");
        let newest = here.buried(now, 1).expect("the newest of each");
        assert_eq!(newest.ids.len(), 1);
        assert_eq!(newest.ranges, [(3, 4, Duration::from_secs(9))]);
        let mut buried = here.buried(now, usize::MAX).expect("some");
        assert_eq!(buried.ranges, [(3, 4, Duration::from_secs(9))]);
        // A lying peer's overlapping range is left out.
        buried.ranges.push((4, 100, Duration::from_secs(9)));
        let later = now + Duration::from_secs(1);
        let mut there = Tombstones::default();
        there.adopt(&buried, later, Duration::from_secs(60));
        assert!(there.contains(&text) && there.contains(&number));
        assert!(!there.contains(&RequestKey::of(&Value::from(50))));
        assert_eq!(there.first_expiry(), Some(later + Duration::from_secs(5)));
        // A session that buried ids of its own keeps them, and its key.
        let mut own = Tombstones::default();
        own.insert(
            &RequestKey::of(&Value::from("y")),
            now + Duration::from_secs(5),
        );
        own.adopt(&buried, later, Duration::from_secs(60));
        assert!(!own.contains(&text));
        assert!(
            here.buried(now + Duration::from_secs(10), usize::MAX)
                .is_none(),
            "all expired"
        );
    }

    #[test]
    fn a_session_that_buried_nothing_or_saw_it_all_expire_holds_no_box() {
        let mut t = Tombstones::default();
        assert!(t.0.is_none() && t.bytes() == 0 && t.first_expiry().is_none());
        let now = Instant::now();
        t.insert(
            &RequestKey::of(&Value::from(7)),
            now + Duration::from_secs(1),
        );
        t.insert(
            &RequestKey::of(&Value::from("x")),
            now + Duration::from_secs(2),
        );
        assert!(t.0.is_some());
        assert_eq!(t.expire(now + Duration::from_secs(1)), 1);
        assert!(t.0.is_some(), "one left");
        assert_eq!(t.expire(now + Duration::from_secs(2)), 1);
        assert!(t.0.is_none(), "all expired: the box is given back");
    }
}
