//! A map that keeps at most a fixed number of entries and forgets the oldest first: the bound
//! of every per-session and per-pod record (retry records, ended and moved sessions).
//!
//! The entries sit in a ring, oldest first, that grows by an eighth, and a hash table of their
//! 8-byte positions finds them by key: an entry costs its ring slot (plus up to ⅛ room) and 9
//! to 18 bytes of table, where a table of whole entries stands half empty after each doubling
//! (`docs/design/buffering.md#what-a-request-costs`).

use std::borrow::Borrow;
use std::collections::VecDeque;
use std::hash::{BuildHasher, Hash, RandomState};

use hashbrown::HashTable;

/// Holes a map keeps beyond as many as it has entries before it closes them.
const MAX_HOLES: usize = 16;

/// At most `cap` entries; inserting one more forgets the oldest.
#[derive(Debug)]
pub(crate) struct Bounded<K, V> {
    /// The entries, oldest first; `None` where one was forgotten out of turn (a hole, dropped
    /// once it reaches the front or when holes outnumber entries).
    slots: VecDeque<Option<(K, V)>>,
    /// The position of `slots[0]`. Positions only grow while the holes are kept.
    front: u64,
    /// The position of every entry, found by its key's hash (keyed: keys come from clients).
    index: HashTable<u64>,
    hasher: RandomState,
    cap: usize,
}

impl<K: Eq + Hash, V> Bounded<K, V> {
    /// An empty map holding at most `cap` entries.
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            slots: VecDeque::new(),
            front: 0,
            index: HashTable::new(),
            hasher: RandomState::new(),
            cap,
        }
    }

    /// Sets `key` to `value`. A new key is the newest entry; a known one keeps its place.
    /// Returns the key forgotten to stay within the cap, if any.
    pub(crate) fn insert(&mut self, key: K, value: V) -> Option<K> {
        let hash = self.hasher.hash_one(&key);
        if let Some(i) = self.find_hashed(hash, &key) {
            if let Some((_, old)) = &mut self.slots[i] {
                *old = value;
            }
            return None;
        }
        let position = self.front + self.slots.len() as u64;
        if self.slots.len() == self.slots.capacity() {
            // Grow by an eighth, not double: a window that just filled stays nearly full.
            self.slots.reserve_exact(self.slots.len() / 8 + 4);
        }
        self.slots.push_back(Some((key, value)));
        self.index_position(hash, position);
        if self.index.len() <= self.cap {
            return None;
        }
        let oldest = self.slots.iter().position(Option::is_some)?;
        let (key, _) = self.take(oldest)?;
        self.tidy();
        Some(key)
    }

    /// Sets `key` to `value` as the newest entry, whether it was known or not. Returns the key
    /// forgotten to stay within the cap, if any.
    pub(crate) fn insert_newest(&mut self, key: K, value: V) -> Option<K> {
        if let Some(i) = self.find(&key) {
            self.take(i);
            self.tidy();
        }
        self.insert(key, value)
    }

    /// The value of `key`.
    pub(crate) fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let i = self.find(key)?;
        self.slots[i].as_ref().map(|(_, v)| v)
    }

    /// Whether `key` is held.
    pub(crate) fn contains(&self, key: &K) -> bool {
        self.find(key).is_some()
    }

    /// Walks the entries oldest first and forgets each one `forget` says to.
    pub(crate) fn forget_where(&mut self, mut forget: impl FnMut(&K, &V) -> bool) {
        for i in 0..self.slots.len() {
            if matches!(&self.slots[i], Some((k, v)) if forget(k, v)) {
                self.take(i);
            }
        }
        self.tidy();
    }

    /// Forgets the oldest entries `forget` says to until at most `keep` are left, walking from
    /// the oldest and stepping over the ones it keeps (so the walk costs what it forgets plus
    /// what it steps over); returns the keys forgotten.
    pub(crate) fn forget_oldest_beyond(
        &mut self,
        keep: usize,
        mut forget: impl FnMut(&K, &V) -> bool,
    ) -> Vec<K> {
        let mut forgotten = Vec::new();
        let mut i = 0;
        while self.index.len() > keep && i < self.slots.len() {
            if matches!(&self.slots[i], Some((k, v)) if forget(k, v))
                && let Some((key, _)) = self.take(i)
            {
                forgotten.push(key);
            }
            i += 1;
        }
        self.tidy();
        forgotten
    }

    /// How many entries it holds.
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    /// Every entry, oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.slots.iter().flatten().map(|(k, v)| (k, v))
    }

    /// The slot of `key`'s entry.
    fn find<Q>(&self, key: &Q) -> Option<usize>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.find_hashed(self.hasher.hash_one(key), key)
    }

    /// The slot of `key`'s entry, `hash` being the key's hash.
    fn find_hashed<Q>(&self, hash: u64, key: &Q) -> Option<usize>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let at = |p: u64| p.wrapping_sub(self.front) as usize;
        self.index
            .find(
                hash,
                |&p| matches!(self.slots.get(at(p)), Some(Some((k, _))) if k.borrow() == key),
            )
            .map(|&p| at(p))
    }

    /// Takes the entry out of slot `i`, leaving a hole.
    fn take(&mut self, i: usize) -> Option<(K, V)> {
        let entry = self.slots[i].take()?;
        let position = self.front + i as u64;
        if let Ok(found) = self
            .index
            .find_entry(self.hasher.hash_one(&entry.0), |&p| p == position)
        {
            found.remove();
        }
        Some(entry)
    }

    /// Drops the holes at the front, and all of them once they outnumber the entries (the
    /// entries then get new positions); gives back room a burst left.
    fn tidy(&mut self) {
        while let Some(None) = self.slots.front() {
            self.slots.pop_front();
            self.front += 1;
        }
        let len = self.slots.len();
        if self.slots.capacity() > 2 * len + 2 * MAX_HOLES {
            self.slots.shrink_to(len + len / 8);
        }
        if len <= 2 * self.index.len() + MAX_HOLES {
            return;
        }
        self.slots.retain(Option::is_some);
        self.index.clear();
        for i in 0..self.slots.len() {
            if let Some((key, _)) = &self.slots[i] {
                let hash = self.hasher.hash_one(key);
                self.index_position(hash, self.front + i as u64);
            }
        }
    }

    /// Puts `position`, the slot of an entry whose key hashes to `hash`, in the index.
    fn index_position(&mut self, hash: u64, position: u64) {
        let (slots, front, hasher) = (&self.slots, self.front, &self.hasher);
        self.index
            .insert_unique(hash, position, |&p| hash_at(slots, front, hasher, p));
    }
}

/// The hash of the key at position `p`, which the table rehashes with as it grows. Every
/// position in the table holds an entry ([`Bounded::take`] removes both); 0 for one that
/// does not.
fn hash_at<K: Hash, V>(
    slots: &VecDeque<Option<(K, V)>>,
    front: u64,
    hasher: &RandomState,
    p: u64,
) -> u64 {
    match slots.get(p.wrapping_sub(front) as usize) {
        Some(Some((key, _))) => hasher.hash_one(key),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_entries_are_forgotten_first() {
        let mut b = Bounded::new(2);
        b.insert("a", 1);
        b.insert("b", 2);
        b.insert("a", 3);
        assert_eq!(b.get("a"), Some(&3), "a known key takes the new value");
        b.insert("c", 4);
        assert!(!b.contains(&"a"), "the oldest goes first");
        assert_eq!(b.iter().collect::<Vec<_>>(), [(&"b", &2), (&"c", &4)]);
        b.forget_where(|k, _| *k == "b");
        assert!(!b.contains(&"b"), "forget_where forgets what it is told to");
        b.insert("b", 2);
        b.forget_where(|k, _| *k == "b");
        b.insert("d", 5);
        b.insert("e", 6);
        assert_eq!(
            b.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
            ["d", "e"],
            "a forgotten key no longer counts"
        );
    }

    #[test]
    fn the_oldest_beyond_a_count_are_forgotten_stepping_over_the_kept() {
        let mut b = Bounded::new(10);
        for (k, v) in [("a", 1), ("b", 2), ("c", 3), ("d", 4), ("e", 5)] {
            b.insert(k, v);
        }
        // Keep 2, but never "b" (a request still running).
        let forgotten = b.forget_oldest_beyond(2, |k, _| *k != "b");
        assert_eq!(forgotten, ["a", "c", "d"]);
        assert_eq!(b.iter().map(|(k, _)| *k).collect::<Vec<_>>(), ["b", "e"]);
    }

    proptest::proptest! {
        /// Any run of inserts (in place or as the newest) and forgets leaves what a plain list
        /// in insertion order would,
        /// and the ring never holds more holes than it closes.
        #[test]
        fn it_behaves_as_a_list_in_insertion_order(
            ops in proptest::collection::vec((0u8..5, 0u16..40), 1..400),
            cap in 1usize..24,
        ) {
            let mut b = Bounded::new(cap);
            let mut model: Vec<(u16, u32)> = Vec::new();
            for (n, (op, key)) in ops.into_iter().enumerate() {
                let value = n as u32;
                match op {
                    0 | 1 => {
                        let forgotten = b.insert(key, value);
                        let mut expected = None;
                        if let Some(e) = model.iter_mut().find(|(k, _)| *k == key) {
                            e.1 = value;
                        } else {
                            model.push((key, value));
                            if model.len() > cap {
                                expected = Some(model.remove(0).0);
                            }
                        }
                        proptest::prop_assert_eq!(forgotten, expected);
                    }
                    2 => {
                        let forgotten = b.insert_newest(key, value);
                        model.retain(|(k, _)| *k != key);
                        model.push((key, value));
                        let expected = (model.len() > cap).then(|| model.remove(0).0);
                        proptest::prop_assert_eq!(forgotten, expected);
                    }
                    3 => {
                        b.forget_where(|k, _| k % 7 == key % 7);
                        model.retain(|(k, _)| k % 7 != key % 7);
                    }
                    _ => {
                        let keep = usize::from(key) % (cap + 1);
                        let forgotten = b.forget_oldest_beyond(keep, |k, _| !k.is_multiple_of(3));
                        let mut expected = Vec::new();
                        let mut i = 0;
                        while model.len() > keep && i < model.len() {
                            if !model[i].0.is_multiple_of(3) {
                                expected.push(model.remove(i).0);
                            } else {
                                i += 1;
                            }
                        }
                        proptest::prop_assert_eq!(forgotten, expected);
                    }
                }
                let held: Vec<(u16, u32)> = b.iter().map(|(k, v)| (*k, *v)).collect();
                proptest::prop_assert_eq!(&held, &model);
                for k in 0..40u16 {
                    let expected = model.iter().find(|(m, _)| *m == k).map(|(_, v)| v);
                    proptest::prop_assert_eq!(b.get(&k), expected);
                }
                proptest::prop_assert!(b.slots.len() <= 2 * model.len() + MAX_HOLES + 1);
            }
        }
    }
}
